/* Surviving the arbiter: a device that moves to the arbiter a control daemon started in place of a
 * dead one, as a Python session does (libshare/client/reattach.py).
 *
 * The ledger keeps, for every object the device's session made at the arbiter and has not freed,
 * what a new arbiter needs to make it again under the same id: ls_icd_ask files each answered
 * request (ls_icd_keep) and ls_icd_forget strikes it (ls_icd_unkeep). A shared buffer ("alloc",
 * kind "shared") keeps a duplicate of its sealed memfd and its rounded size (re-made as "import":
 * the same pages, so what the application wrote stays); a program ("load_program") its request
 * text (specialization constants) and SPIR-V; a list ("load_list") its descriptors; a bind group
 * ("bind_group") and a texel view ("view") its request text. A device-local buffer ("alloc", kind "device") is only noted:
 * its memory died with the arbiter. The arbiter gives ids in increasing order, so the ledger,
 * appended as they come, is in id order, which a new arbiter asks for (a kept id is above the ones
 * before it); a request that carries an "id" (a reload) is not filed again.
 *
 * ls_icd_reattach (queue.c calls it before a push, the device's lock held, once the arbiter's
 * pidfd fired and nothing pushed is unanswered) refuses at once, VK_ERROR_DEVICE_LOST, when no
 * control daemon supervises the pipe directory (no successor: no wait), when the device holds
 * device-local memory (it died: the device is lost, the simpler honest rule), or when the ledger
 * missed a request (out of host memory). Otherwise it says hello again (hello.c's
 * ls_icd_hello_again: "reattach": true, the same settings, so the same name, group and priority;
 * the dial waits up to LS_ICD_DIAL_MS while the daemon starts the new arbiter), checks that the
 * welcome comes from another arbiter, hands over the ledger in id order with "id" added (a
 * failed exchange, or a refusal of a buffer or a program: lost, the new session closed; a list or
 * a bind group naming what the application freed since is refused and left out, so a submission
 * of it is answered an error, as it would have been before), then swaps the sessions and maps
 * the new ring (queue.c's ls_icd_path_reopen). The costs: one descriptor a host-visible
 * allocation in the application (the arbiter's descriptor budget counts its own side, the same
 * before and after), and a copy of each program's SPIR-V and each list's descriptors in host
 * memory. docs/icd.md, "Surviving a restart". */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "icd.h"
#include "reattach.h"

struct ls_icd_kept {
    int64_t id;
    char *text;         /* the request to make it again, without its "id" */
    void *payload;      /* SPIR-V or descriptors, or NULL */
    size_t len;
    int fd;             /* a shared buffer's memfd (a duplicate), or -1 */
};

struct ls_icd_ledger {
    struct ls_icd_kept *items; /* in id order */
    uint32_t n, capacity;
    uint32_t device_local;     /* device-local buffers held: they do not survive */
    int missed;                /* a request could not be filed (out of host memory) */
};

static void kept_free(struct ls_icd_kept *kept)
{
    free(kept->text);
    free(kept->payload);
    if (kept->fd >= 0)
        close(kept->fd);
}

static const char *string_field(const cJSON *object, const char *name)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(object, name);
    return cJSON_IsString(item) ? item->valuestring : NULL;
}

/* The ledger's entry for one answered request: 0 filed (or nothing to file), -1 out of memory. */
static int file(struct ls_icd_ledger *ledger, const cJSON *request, const char *text, const void *payload,
               size_t len, const cJSON *reply, const struct ls_icd_frame *frame)
{
    const char *op = string_field(request, "op"), *kind = string_field(request, "kind");
    const char *field = NULL;
    struct ls_icd_kept kept = {.fd = -1};
    char import[96];
    if (op == NULL || cJSON_GetObjectItemCaseSensitive(request, "id") != NULL)
        return 0; /* (a reload: filed already) */
    if (strcmp(op, "alloc") == 0 && kind != NULL && strcmp(kind, "device") == 0) {
        field = "buffer_id"; /* (noted: counted in device_local once filed) */
    } else if (strcmp(op, "alloc") == 0) {
        int64_t size = ls_icd_whole_field(reply, "size", 1, 9007199254740991.0);
        if (frame->nfds != 1 || size < 0)
            return 0; /* (memory.c refuses the reply) */
        snprintf(import, sizeof(import), "{\"op\":\"import\",\"size\":%lld}", (long long)size);
        text = import;
        payload = NULL;
        len = 0;
        kept.fd = fcntl(frame->fds[0], F_DUPFD_CLOEXEC, 0);
        if (kept.fd < 0)
            return -1;
        field = "buffer_id";
    } else if (strcmp(op, "load_program") == 0) {
        field = "program_id";
    } else if (strcmp(op, "load_list") == 0) {
        field = "list_id";
    } else if (strcmp(op, "bind_group") == 0) {
        field = "group_id";
    } else if (strcmp(op, "view") == 0) {
        field = "view_id";
    } else {
        return 0;
    }
    kept.id = ls_icd_whole_field(reply, field, 0, 2147483647.0);
    if (kept.id < 0) {
        kept_free(&kept);
        return 0; /* (the caller refuses the reply) */
    }
    if (kind != NULL && strcmp(kind, "device") == 0)
        kept.text = NULL; /* a device-local buffer: noted, never made again */
    else if ((kept.text = strdup(text)) == NULL || (len && (kept.payload = malloc(len)) == NULL)) {
        kept_free(&kept);
        return -1;
    }
    if (len)
        memcpy(kept.payload, payload, len);
    kept.len = len;
    if (ledger->n == ledger->capacity) {
        uint32_t capacity = ledger->capacity ? ledger->capacity * 2 : 32;
        struct ls_icd_kept *grown = realloc(ledger->items, capacity * sizeof(*grown));
        if (grown == NULL) {
            kept_free(&kept);
            return -1;
        }
        ledger->items = grown;
        ledger->capacity = capacity;
    }
    ledger->items[ledger->n++] = kept;
    ledger->device_local += kept.text == NULL;
    return 0;
}

static struct ls_icd_ledger missed = {.missed = 1}; /* a device's whose ledger could not be made: never moves */

void ls_icd_keep(struct ls_icd_device *device, const char *text, const void *payload, size_t len, const cJSON *reply,
                 const struct ls_icd_frame *frame)
{
    cJSON *request;
    if (device->ledger == NULL && (device->ledger = calloc(1, sizeof(*device->ledger))) == NULL)
        device->ledger = &missed;
    if (device->ledger == &missed)
        return;
    request = cJSON_Parse(text);
    if (request == NULL || file(device->ledger, request, text, payload, len, reply, frame) < 0)
        device->ledger->missed = 1;
    cJSON_Delete(request);
}

void ls_icd_unkeep(struct ls_icd_device *device, int64_t id)
{
    struct ls_icd_ledger *ledger = device->ledger;
    for (uint32_t i = 0; ledger != NULL && i < ledger->n; i++) {
        if (ledger->items[i].id != id)
            continue;
        if (ledger->items[i].text == NULL)
            ledger->device_local--;
        kept_free(&ledger->items[i]);
        memmove(ledger->items + i, ledger->items + i + 1, (ledger->n - i - 1) * sizeof(*ledger->items));
        ledger->n--;
        return;
    }
}

void ls_icd_ledger_free(struct ls_icd_device *device)
{
    struct ls_icd_ledger *ledger = device->ledger;
    device->ledger = NULL;
    if (ledger == NULL || ledger == &missed)
        return;
    for (uint32_t i = 0; i < ledger->n; i++)
        kept_free(&ledger->items[i]);
    free(ledger->items);
    free(ledger);
}

/* Make ``kept`` again at the arbiter of ``sock`` under its id: 0, 1 (refused), or -1 (no answer). */
static int reload(int sock, const struct ls_icd_kept *kept)
{
    cJSON *request = cJSON_Parse(kept->text), *reply = NULL;
    struct ls_icd_frame frame = {0};
    char *text = NULL;
    int rc = -1;
    if (request != NULL && cJSON_AddNumberToObject(request, "id", (double)kept->id) != NULL)
        text = cJSON_PrintUnformatted(request);
    if (text != NULL && ls_icd_send_fds(sock, text, strlen(text), kept->payload, kept->len, &kept->fd,
                                        kept->fd >= 0 ? 1 : 0) == 0 &&
        ls_icd_recv(sock, &frame, 0, LS_ICD_REPLY_MS) == 0) {
        reply = cJSON_ParseWithLength(frame.json, frame.json_len);
        rc = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(reply, "ok")) ? 0 : 1;
        if (rc > 0)
            fprintf(stderr, "libshare Vulkan driver: the new arbiter refused object %lld (%.300s)\n",
                    (long long)kept->id, frame.json);
    }
    cJSON_Delete(reply);
    ls_icd_frame_free(&frame);
    free(text);
    cJSON_Delete(request);
    return rc;
}

/* Whether ``kept`` is a list or a bind group: made of other objects, which the application may have
 * freed since (a command buffer it keeps but will not submit again names freed memory). */
static int names_others(const struct ls_icd_kept *kept)
{
    return strstr(kept->text, "\"op\":\"load_list\"") != NULL || strstr(kept->text, "\"op\":\"bind_group\"") != NULL;
}

VkResult ls_icd_reattach(struct ls_icd_device *device)
{
    struct ls_icd_ledger empty = {0}, *ledger = device->ledger ? device->ledger : &empty;
    struct ls_icd_settings settings;
    struct ls_icd_session fresh;
    struct ls_icd_physical *seen;
    char why[LS_ICD_WHY];
    VkResult result;
    if (ls_icd_read_settings(&settings) < 0 || !ls_icd_supervised(settings.supervisor_lock))
        return VK_ERROR_DEVICE_LOST; /* no control daemon: no arbiter takes over */
    if (ledger->device_local > 0 || ledger->missed) {
        fprintf(stderr, "libshare Vulkan driver: the arbiter restarted; %s: the device is lost\n",
                ledger->missed ? "the driver could not keep what a new one needs"
                               : "device-local memory died with it");
        return VK_ERROR_DEVICE_LOST;
    }
    seen = calloc(1, sizeof(*seen));
    if (seen == NULL)
        return VK_ERROR_DEVICE_LOST;
    result = ls_icd_hello_again(&fresh, seen, why, sizeof(why));
    free(seen);
    if (result != VK_SUCCESS) {
        fprintf(stderr, "libshare Vulkan driver: no arbiter took over: %s\n", why);
        return VK_ERROR_DEVICE_LOST;
    }
    if (fresh.arbiter_pid == device->session.arbiter_pid)
        result = VK_ERROR_DEVICE_LOST; /* (the dead one's pid: not a new arbiter) */
    for (uint32_t i = 0; result == VK_SUCCESS && i < ledger->n; i++) {
        int rc = reload(fresh.sock, &ledger->items[i]);
        if (rc < 0 || (rc > 0 && !names_others(&ledger->items[i])))
            result = VK_ERROR_DEVICE_LOST;
    }
    if (result != VK_SUCCESS) {
        ls_icd_session_close(&fresh);
        return result;
    }
    ls_icd_session_close(&device->session);
    device->session = fresh;
    device->told_unanswered = 0; /* (control.c: a new session's silence is told again) */
    result = ls_icd_path_reopen(device);
    if (result == VK_SUCCESS)
        fprintf(stderr, "libshare Vulkan driver: the arbiter restarted; the device moved to pid %lld\n",
                (long long)fresh.arbiter_pid);
    return result == VK_SUCCESS ? VK_SUCCESS : VK_ERROR_DEVICE_LOST;
}
