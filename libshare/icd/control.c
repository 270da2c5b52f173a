/* The device session's control requests: one JSON frame (and a payload) sent, one reply read.
 *
 * Every request a device makes of the arbiter outside the data path (alloc and free of memory,
 * load_program, bind_group, load_list and their frees) goes through ls_icd_ask, with the device's
 * lock held, so requests and replies stay in step on the session's socket. A reply is waited for
 * LS_ICD_REPLY_MS (60 s), a load_program's as long as the welcome says the arbiter may take to vet
 * and compile a new module (ls_icd_ask_within, the session's load_ms). An exchange that
 * failed (no answer in time, a broken frame, the arbiter gone) shuts the socket: no later reply
 * could be trusted to match its request, so every later request fails at once. A reply is
 * parsed with cJSON and its fields read through ls_icd_whole_field, which checks type and
 * range; a refusal ({"ok": false, "error": NAME, "message": TEXT}) is answered with the
 * caller's ``refused`` result (VK_ERROR_OUT_OF_DEVICE_MEMORY for QuotaExceeded), and written on
 * stderr, one line, as the application cannot be told more through Vulkan. An answered request is
 * filed in the device's ledger and a free strikes it (reattach.c: what a new arbiter needs); a
 * request to an arbiter that died moves the device to its successor first (queue.c's
 * ls_icd_path_survive), or is made on the dead session and fails (the device is lost then). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "icd.h"
#include "reattach.h"

VkResult ls_icd_ask(struct ls_icd_device *device, const char *text, const void *payload, size_t payload_len,
                    struct ls_icd_frame *frame, int max_fds, cJSON **reply, VkResult refused)
{
    return ls_icd_ask_within(device, LS_ICD_REPLY_MS, text, payload, payload_len, frame, max_fds, reply, refused);
}

VkResult ls_icd_ask_within(struct ls_icd_device *device, int reply_ms, const char *text, const void *payload,
                           size_t payload_len, struct ls_icd_frame *frame, int max_fds, cJSON **reply,
                           VkResult refused)
{
    const cJSON *ok, *error;
    int rc;
    if (device->path != NULL)
        ls_icd_path_survive(device); /* a dead arbiter's successor first (reattach.c) */
    rc = ls_icd_send(device->session.sock, text, strlen(text), payload, payload_len);
    *reply = NULL;
    memset(frame, 0, sizeof(*frame));
    if (rc == 0)
        rc = ls_icd_recv(device->session.sock, frame, max_fds, reply_ms);
    if (rc < 0) { /* the exchange is out of step: no later reply could be trusted to match */
        if (!device->told_unanswered) /* (said once: every later request fails the same way) */
            fprintf(stderr, "libshare Vulkan driver: the arbiter did not answer (%s)\n", strerror(-rc));
        device->told_unanswered = 1;
        shutdown(device->session.sock, SHUT_RDWR);
        return refused;
    }
    *reply = cJSON_ParseWithLength(frame->json, frame->json_len);
    ok = cJSON_GetObjectItemCaseSensitive(*reply, "ok");
    if (cJSON_IsTrue(ok)) {
        ls_icd_keep(device, text, payload, payload_len, *reply, frame); /* what a new arbiter needs (reattach.c) */
        return VK_SUCCESS;
    }
    error = cJSON_GetObjectItemCaseSensitive(*reply, "error");
    if (cJSON_IsString(error) && strcmp(error->valuestring, "QuotaExceeded") == 0)
        return VK_ERROR_OUT_OF_DEVICE_MEMORY;
    fprintf(stderr, "libshare Vulkan driver: the arbiter refused a request (%.300s)\n", frame->json);
    return refused;
}

int64_t ls_icd_whole_field(const cJSON *reply, const char *name, double least, double most)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(reply, name);
    if (!cJSON_IsNumber(item) || !(item->valuedouble >= least) || item->valuedouble > most ||
        (double)(int64_t)item->valuedouble != item->valuedouble)
        return -EINVAL;
    return (int64_t)item->valuedouble;
}

void ls_icd_forget(struct ls_icd_device *device, const char *field, int64_t id)
{
    char text[96];
    struct ls_icd_frame frame;
    cJSON *reply;
    ls_icd_unkeep(device, id);
    snprintf(text, sizeof(text), "{\"op\":\"free\",\"%s\":%lld}", field, (long long)id);
    ls_icd_ask(device, text, NULL, 0, &frame, 0, &reply, LS_ICD_INVALID); /* a refusal: the session's end frees it */
    cJSON_Delete(reply);
    ls_icd_frame_free(&frame);
}
