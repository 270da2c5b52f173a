/* The device session's control requests: one JSON frame (and a payload) sent, one reply read.
 *
 * Every request a device makes of the arbiter outside the data path (alloc and free of memory,
 * load_program, bind_group, load_list and their frees) goes through ls_icd_ask, with the device's
 * lock held, so requests and replies stay in step on the session's socket. A free (ls_icd_forget)
 * is sent without waiting for its reply, which carries nothing the driver needs: the session
 * counts it unread, and the next request, or the free that makes MOST_UNREAD of them, reads those
 * replies first (a refusal among them is written on stderr, as any). The arbiter answers a
 * session's requests in order, so what a free frees is gone before any later request is served; a
 * program that frees objects at every step (wgpu frees its pipelines, bind groups and command
 * buffers) waits for a reply only when it next asks for something. A submission reads them too
 * before it pushes (ls_icd_settle_frees, queue.c): the ring is not the socket, and a list pushed
 * behind a free the arbiter has not read yet would run on what the application freed, where it
 * must find it gone (the device lost). Only a command buffer whose recording ended before a free
 * can name what that free freed: one ended since had its lists loaded after the frees were read
 * (a load_list is a request), or found in the cache, which drops what names a freed object at the
 * free (cache.c), and recording refuses a destroyed object. So a submission settles only when one
 * of its command buffers ended before the last free (device->frees against cb->ended_after): the
 * program that frees at the end of a step and records anew the next does not wait. The bound
 * keeps the replies within the socket's buffers: an arbiter that blocks writing a reply reads no
 * further request, and a driver sending request after request would then block too. A reply is
 * waited for
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

#define MOST_UNREAD 64 /* replies to frees left unread at most (each under 100 bytes) */

/* The exchange is out of step: no later reply could be trusted to match its request. The socket is
 * shut, so every later request fails at once; ``rc`` says why, once. */
static void out_of_step(struct ls_icd_device *device, int rc)
{
    if (!device->told_unanswered) /* (said once: every later request fails the same way) */
        fprintf(stderr, "libshare Vulkan driver: the arbiter did not answer (%s)\n", strerror(-rc));
    device->told_unanswered = 1;
    shutdown(device->session.sock, SHUT_RDWR);
}

/* Read the replies to the frees sent since the last exchange: 0, or the failed read's code. */
static int read_unread(struct ls_icd_device *device)
{
    for (; device->session.unread > 0; device->session.unread--) {
        struct ls_icd_frame frame;
        cJSON *reply;
        int rc = ls_icd_recv(device->session.sock, &frame, 0, LS_ICD_REPLY_MS);
        if (rc < 0)
            return rc;
        reply = cJSON_ParseWithLength(frame.json, frame.json_len);
        if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(reply, "ok")))
            fprintf(stderr, "libshare Vulkan driver: the arbiter refused a free (%.300s)\n", frame.json);
        cJSON_Delete(reply);
        ls_icd_frame_free(&frame);
    }
    return 0;
}

/* Whether a command buffer of submission ``s`` ended its recording before the last free was sent. */
static int recorded_before_a_free(const struct ls_icd_device *device, const struct ls_icd_submission *s)
{
    for (uint32_t i = 0; i < s->ncbs; i++)
        if (s->cbs[i].cb->ended_after < device->frees)
            return 1;
    return 0;
}

/* Before a request: a dead arbiter's successor first (reattach.c), then, while more than ``most``
 * frees are unread, their replies: 0, or the failed read's code. */
static int before_request(struct ls_icd_device *device, int most)
{
    if (device->path != NULL)
        ls_icd_path_survive(device);
    return device->session.unread > most ? read_unread(device) : 0;
}

void ls_icd_settle_frees(struct ls_icd_device *device, const struct ls_icd_submission *s)
{
    int rc;
    if (device->session.unread == 0 || (s != NULL && !recorded_before_a_free(device, s)))
        return;
    rc = read_unread(device);
    if (rc < 0)
        out_of_step(device, rc);
}

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
    *reply = NULL;
    memset(frame, 0, sizeof(*frame));
    rc = before_request(device, 0);
    if (rc == 0)
        rc = ls_icd_send(device->session.sock, text, strlen(text), payload, payload_len);
    if (rc == 0)
        rc = ls_icd_recv(device->session.sock, frame, max_fds, reply_ms);
    if (rc < 0) {
        out_of_step(device, rc);
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
    int rc;
    ls_icd_unkeep(device, id);
    snprintf(text, sizeof(text), "{\"op\":\"free\",\"%s\":%lld}", field, (long long)id);
    rc = before_request(device, MOST_UNREAD - 1);
    if (rc == 0)
        rc = ls_icd_send(device->session.sock, text, strlen(text), NULL, 0);
    if (rc < 0)
        out_of_step(device, rc); /* (a free that is not made: the session's end frees it) */
    else
        device->session.unread++;
    device->frees++;
}
