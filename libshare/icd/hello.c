/* The hello that opens a session, and the physical device its welcome describes.
 *
 * ls_icd_hello dials the arbiter's socket (settings.c), says hello as libshare.connect() does
 * (name, group, priority, share, memory limit from the environment) with "device_info": true,
 * and reads the welcome: the ring's memfd and the doorbell (two descriptors, kept in the session
 * for the data path, queue.c) and the arbiter's pid (whose death the data path watches), and the physical device that libshare/arbiter/serve/device_info.py
 * describes: a JSON object (name, uuid, features, timestamp_valid_bits, memory, driver_id,
 * conformance, texel_formats, and the
 * Vulkan 1.1 subgroup_size, max_per_set_descriptors, max_memory_allocation_size, and
 * subgroup_sizes) and the real
 * device's VkPhysicalDeviceProperties as the payload. Everything is checked before it is used:
 * the payload's size, each field's type and range, the strings' lengths. A refusal (the
 * arbiter's {"ok": false, "error", "message"}) or anything malformed is
 * VK_ERROR_INITIALIZATION_FAILED, with the reason written into ``why``. ls_icd_hello_again is the
 * same hello with "reattach": true, for a device that moves to a new arbiter (reattach.c): the
 * arbiter refuses it (ClientTerminated) when its work ended the last arbiter. */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "icd.h"
#include "physical.h"

#define HELLO_VERSION 1 /* wire.py's VERSION */
#define MOST_LIMITS 16  /* the hello's mem_limit entries (hello.py's byte_counts) */
#define MOST_FEATURES 512

static VkResult refuse(char *why, size_t why_size, const char *what, const char *detail)
{
    snprintf(why, why_size, "%s%s%s", what, detail ? ": " : "", detail ? detail : "");
    return VK_ERROR_INITIALIZATION_FAILED;
}

/* LIBSHARE_DEVICE_MEM_LIMIT as the hello's {device: bytes}, read as settings.py's
 * parse_device_limits reads it: parts split at commas, each "SIZE" (key "") or "DEVICE=SIZE" (split
 * at its last "="; the key stripped, lowercase, without dashes). 0, or -EINVAL. */
static int add_limits(cJSON *hello, const char *text)
{
    cJSON *limits = cJSON_AddObjectToObject(hello, "mem_limit");
    int count = 0;
    if (limits == NULL)
        return -ENOMEM;
    for (const char *part = text;; part++) {
        const char *comma = strchr(part, ',');
        size_t length = comma ? (size_t)(comma - part) : strlen(part);
        char copy[256], key[65], number[24];
        char *equals, *from;
        size_t k = 0;
        uint64_t bytes;
        if (length >= sizeof(copy) || ++count > MOST_LIMITS)
            return -EINVAL;
        memcpy(copy, part, length);
        copy[length] = '\0';
        equals = strrchr(copy, '=');
        if (ls_icd_parse_size(equals ? equals + 1 : copy, &bytes) < 0)
            return -EINVAL;
        from = copy;
        while (equals && from < equals && isspace((unsigned char)*from))
            from++;
        while (equals && equals > from && isspace((unsigned char)equals[-1]))
            equals--;
        for (; equals && from < equals; from++) {
            if (*from == '-')
                continue;
            if (k + 1 >= sizeof(key))
                return -EINVAL;
            key[k++] = (char)tolower((unsigned char)*from);
        }
        key[k] = '\0';
        snprintf(number, sizeof(number), "%llu", (unsigned long long)bytes); /* exact: a double is not */
        if (cJSON_AddRawToObject(limits, key, number) == NULL)
            return -ENOMEM;
        if (comma == NULL)
            return 0;
        part = comma;
    }
}

static char *hello_text(const struct ls_icd_settings *settings, int reattach, char *why, size_t why_size)
{
    cJSON *hello = cJSON_CreateObject();
    char *text = NULL;
    if (hello == NULL)
        return NULL;
    if (cJSON_AddStringToObject(hello, "op", "hello") == NULL ||
        cJSON_AddStringToObject(hello, "name", settings->name ? settings->name : "") == NULL ||
        cJSON_AddNumberToObject(hello, "version", HELLO_VERSION) == NULL ||
        cJSON_AddBoolToObject(hello, "device_info", 1) == NULL ||
        (reattach && cJSON_AddBoolToObject(hello, "reattach", 1) == NULL) ||
        (settings->group && cJSON_AddStringToObject(hello, "group", settings->group) == NULL) ||
        (settings->priority && cJSON_AddStringToObject(hello, "priority", settings->priority) == NULL) ||
        (settings->share && cJSON_AddStringToObject(hello, "share", settings->share) == NULL))
        goto done;
    if (settings->mem_limit && add_limits(hello, settings->mem_limit) < 0) {
        refuse(why, why_size, "LIBSHARE_DEVICE_MEM_LIMIT is not a size (like 900M or 0=1G,UUID=512M)",
               settings->mem_limit);
        goto done;
    }
    text = cJSON_PrintUnformatted(hello);
done:
    cJSON_Delete(hello);
    return text;
}

/* A JSON number that is a whole number in [0, most]; -EINVAL otherwise. */
static int whole(const cJSON *item, double most, uint64_t *out)
{
    if (!cJSON_IsNumber(item) || !(item->valuedouble >= 0) || item->valuedouble > most ||
        floor(item->valuedouble) != item->valuedouble)
        return -EINVAL;
    *out = (uint64_t)item->valuedouble;
    return 0;
}

static int parse_uuid(const char *text, uint8_t uuid[VK_UUID_SIZE])
{
    int n = 0;
    for (const char *c = text; *c != '\0'; c++) {
        int digit = *c >= '0' && *c <= '9' ? *c - '0' : *c >= 'a' && *c <= 'f' ? *c - 'a' + 10 : -1;
        if (*c == '-')
            continue;
        if (digit < 0 || n >= (int)(2 * VK_UUID_SIZE))
            return -EINVAL;
        uuid[n / 2] = (uint8_t)(n % 2 ? uuid[n / 2] | digit : digit << 4);
        n++;
    }
    return n == (int)(2 * VK_UUID_SIZE) ? 0 : -EINVAL;
}

/* The welcome's subgroup_sizes ([min, max, most subgroups a workgroup holds]; absent or [0, 0, 0] where the
 * device cannot say) into ``physical``, and whether they are one size, ``subgroup``, into ``fixed``:
 * subgroup size control is offered only then, since a pipeline's required size is then the size every
 * pipeline runs at, and the arbiter is asked nothing more. NULL, or what was wrong. */
static const char *read_sizes(const cJSON *sizes, uint64_t subgroup, struct ls_icd_physical *physical, int *fixed)
{
    uint64_t least, most, per_workgroup;
    *fixed = 0;
    physical->workgroup_subgroups = 0;
    if (sizes == NULL)
        return NULL;
    if (!cJSON_IsArray(sizes) || cJSON_GetArraySize(sizes) != 3 ||
        whole(cJSON_GetArrayItem(sizes, 0), 4096, &least) < 0 || whole(cJSON_GetArrayItem(sizes, 1), 4096, &most) < 0 ||
        whole(cJSON_GetArrayItem(sizes, 2), 4294967295.0, &per_workgroup) < 0 || least > most)
        return "subgroup_sizes is not [min, max, most]";
    *fixed = least == subgroup && most == subgroup;
    physical->workgroup_subgroups = (uint32_t)per_workgroup;
    return NULL;
}

/* Whether ``name`` is a feature of subgroup size control (read_sizes). */
static int size_control_feature(const char *name)
{
    return strcmp(name, "subgroupSizeControl") == 0 || strcmp(name, "computeFullSubgroups") == 0;
}

/* The welcome's texel_formats ([name, VkFormat, bytes, uses] each) into ``physical``; NULL, or what was
 * wrong. None given: no format is reported (no buffer view can be made). */
static const char *read_texels(const cJSON *formats, struct ls_icd_physical *physical)
{
    const cJSON *item;
    physical->ntexels = 0;
    if (formats == NULL)
        return NULL;
    if (!cJSON_IsArray(formats) || cJSON_GetArraySize(formats) > LS_ICD_MOST_TEXEL_FORMATS)
        return "texel_formats is not a list of at most 16 formats";
    cJSON_ArrayForEach(item, formats) {
        struct ls_icd_texel_format *texel = &physical->texels[physical->ntexels];
        const cJSON *name = cJSON_GetArrayItem(item, 0);
        uint64_t format, bytes, uses;
        if (!cJSON_IsArray(item) || cJSON_GetArraySize(item) != 4 || !cJSON_IsString(name) ||
            strlen(name->valuestring) >= sizeof(texel->name) || whole(cJSON_GetArrayItem(item, 1), 2147483647.0,
                                                                       &format) < 0 ||
            whole(cJSON_GetArrayItem(item, 2), 16, &bytes) < 0 || bytes == 0 ||
            whole(cJSON_GetArrayItem(item, 3), LS_ICD_TEXEL_STORAGE | LS_ICD_TEXEL_UNIFORM, &uses) < 0 || uses == 0)
            return "a texel format is not [name, VkFormat, bytes 1-16, uses 1-3]";
        snprintf(texel->name, sizeof(texel->name), "%s", name->valuestring);
        texel->vk_format = (uint32_t)format;
        texel->texel_bytes = (uint32_t)bytes;
        texel->uses = (uint32_t)uses;
        physical->ntexels++;
    }
    return NULL;
}

/* The welcome's ``conformance``, [major, minor, subminor, patch] each 0 to 255, into ``out``; NULL,
 * or what was wrong. */
static const char *read_conformance(const cJSON *parts, VkConformanceVersion *out)
{
    uint64_t part[4];
    if (!cJSON_IsArray(parts) || cJSON_GetArraySize(parts) != 4)
        return "conformance is not [major, minor, subminor, patch]";
    for (int i = 0; i < 4; i++)
        if (whole(cJSON_GetArrayItem(parts, i), 255, &part[i]) < 0)
            return "conformance is not [major, minor, subminor, patch] of 0 to 255";
    *out = (VkConformanceVersion){(uint8_t)part[0], (uint8_t)part[1], (uint8_t)part[2], (uint8_t)part[3]};
    return NULL;
}

/* The welcome's physical device into ``physical``; NULL, or what was wrong. */
static const char *read_physical(const cJSON *described, const struct ls_icd_frame *frame,
                                 struct ls_icd_physical *physical)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(described, "name");
    const cJSON *uuid = cJSON_GetObjectItemCaseSensitive(described, "uuid");
    const cJSON *features = cJSON_GetObjectItemCaseSensitive(described, "features");
    const cJSON *feature;
    const char *wrong;
    uint64_t bits, memory, subgroup, per_set, allocation, driver;
    int count = 0, fixed;
    if (!cJSON_IsObject(described))
        return "the welcome has no physical_device object";
    if (frame->payload_len != sizeof(VkPhysicalDeviceProperties))
        return "the welcome's payload is not a VkPhysicalDeviceProperties";
    if (!cJSON_IsString(name) || strlen(name->valuestring) + sizeof(LS_ICD_DEVICE_PREFIX) >
                                     VK_MAX_PHYSICAL_DEVICE_NAME_SIZE)
        return "the device's name is not a string that fits";
    if (!cJSON_IsString(uuid) || parse_uuid(uuid->valuestring, physical->uuid) < 0)
        return "the device's uuid is not a UUID";
    if (whole(cJSON_GetObjectItemCaseSensitive(described, "timestamp_valid_bits"), 64, &bits) < 0)
        return "timestamp_valid_bits is not 0 to 64";
    if (whole(cJSON_GetObjectItemCaseSensitive(described, "memory"), 9007199254740992.0, &memory) < 0)
        return "memory is not a byte count";
    if (whole(cJSON_GetObjectItemCaseSensitive(described, "subgroup_size"), 4096, &subgroup) < 0 || subgroup == 0 ||
        (subgroup & (subgroup - 1)) != 0)
        return "subgroup_size is not a power of two up to 4096";
    if (whole(cJSON_GetObjectItemCaseSensitive(described, "max_per_set_descriptors"), 4294967295.0, &per_set) < 0)
        return "max_per_set_descriptors is not a count";
    if (whole(cJSON_GetObjectItemCaseSensitive(described, "max_memory_allocation_size"), 9007199254740992.0,
              &allocation) < 0)
        return "max_memory_allocation_size is not a byte count";
    if (whole(cJSON_GetObjectItemCaseSensitive(described, "driver_id"), 4294967295.0, &driver) < 0)
        return "driver_id is not a VkDriverId";
    if (!cJSON_IsArray(features) || cJSON_GetArraySize(features) > MOST_FEATURES)
        return "features is not a list of names";
    if ((wrong = read_conformance(cJSON_GetObjectItemCaseSensitive(described, "conformance"),
                                  &physical->conformance)) != NULL)
        return wrong;
    if ((wrong = read_texels(cJSON_GetObjectItemCaseSensitive(described, "texel_formats"), physical)) != NULL)
        return wrong;
    wrong = read_sizes(cJSON_GetObjectItemCaseSensitive(described, "subgroup_sizes"), subgroup, physical, &fixed);
    if (wrong != NULL)
        return wrong;
    memcpy(&physical->properties, frame->payload, sizeof(physical->properties));
    memset(&physical->features, 0, sizeof(physical->features));
    memset(physical->reported, 0, sizeof(physical->reported));
    ls_icd_fields_always(physical);
    physical->subgroup_operations = 0;
    cJSON_ArrayForEach(feature, features) {
        if (!cJSON_IsString(feature) || ++count > MOST_FEATURES)
            return "features is not a list of names";
        if (fixed || !size_control_feature(feature->valuestring))
            ls_icd_feature_set(physical, feature->valuestring); /* names the driver does not report: skipped */
    }
    physical->driver_id = (uint32_t)driver;
    physical->subgroup_size = (uint32_t)subgroup;
    physical->max_per_set_descriptors = (uint32_t)per_set;
    physical->max_allocation = allocation < memory ? allocation : memory;
    physical->features.robustBufferAccess = VK_TRUE; /* the arbiter's device always bounds access */
    physical->timestamp_valid_bits = (uint32_t)bits;
    physical->memory = memory;
    snprintf(physical->properties.deviceName, sizeof(physical->properties.deviceName), "%s%s",
             LS_ICD_DEVICE_PREFIX, name->valuestring);
    if (physical->properties.apiVersion > LS_ICD_API_VERSION)
        physical->properties.apiVersion = LS_ICD_API_VERSION;
    return NULL;
}

int ls_icd_load_ms(const cJSON *load_timeout)
{
    double seconds = cJSON_IsNumber(load_timeout) ? load_timeout->valuedouble : 0;
    if (!(seconds > 0 && seconds <= 1e6)) /* none, not a number, or past 1e6 s: not believed */
        return LS_ICD_LOAD_MS;
    if (seconds * 1000 + LS_ICD_LOAD_MARGIN_MS <= LS_ICD_LOAD_MS)
        return LS_ICD_LOAD_MS;
    return (int)(seconds * 1000) + LS_ICD_LOAD_MARGIN_MS;
}

static VkResult read_welcome(struct ls_icd_session *session, struct ls_icd_physical *physical,
                             struct ls_icd_frame *frame, char *why, size_t why_size)
{
    cJSON *welcome = cJSON_ParseWithLength(frame->json, frame->json_len);
    const cJSON *ok = cJSON_GetObjectItemCaseSensitive(welcome, "ok");
    const cJSON *client = cJSON_GetObjectItemCaseSensitive(welcome, "client_id");
    const cJSON *arbiter = cJSON_GetObjectItemCaseSensitive(welcome, "arbiter_pid");
    const cJSON *load = cJSON_GetObjectItemCaseSensitive(welcome, "load_timeout");
    const char *wrong = NULL;
    uint64_t id = 0, pid = 0;
    VkResult result = VK_SUCCESS;
    if (!cJSON_IsObject(welcome)) {
        result = refuse(why, why_size, "the arbiter's welcome is not a JSON object", NULL);
    } else if (!cJSON_IsTrue(ok)) {
        const cJSON *message = cJSON_GetObjectItemCaseSensitive(welcome, "message");
        result = refuse(why, why_size, "the arbiter refused the session",
                        cJSON_IsString(message) ? message->valuestring : "no reason given");
    } else if (frame->nfds != 2 || whole(client, 2147483647.0, &id) < 0 || whole(arbiter, 4194304.0, &pid) < 0) {
        result = refuse(why, why_size, "the arbiter's welcome did not carry a client id, its pid, ring and doorbell",
                        NULL);
    } else if ((wrong = read_physical(cJSON_GetObjectItemCaseSensitive(welcome, "physical_device"), frame,
                                      physical)) != NULL) {
        result = refuse(why, why_size, "the arbiter's welcome described no usable device", wrong);
    } else {
        session->ring_fd = frame->fds[0];
        session->bell_fd = frame->fds[1];
        session->client_id = (int64_t)id;
        session->arbiter_pid = (int64_t)pid;
        session->load_ms = ls_icd_load_ms(load);
        frame->nfds = 0; /* the session keeps them */
    }
    cJSON_Delete(welcome);
    return result;
}

static VkResult hello(struct ls_icd_session *session, struct ls_icd_physical *physical, int reattach, char *why,
                      size_t why_size)
{
    struct ls_icd_settings settings;
    struct ls_icd_frame frame;
    char *text;
    int rc;
    VkResult result;
    session->sock = session->ring_fd = session->bell_fd = -1;
    session->unread = 0;
    if (ls_icd_read_settings(&settings) < 0)
        return refuse(why, why_size, "the pipe directory's path is too long", NULL);
    text = hello_text(&settings, reattach, why, why_size);
    if (text == NULL)
        return why[0] ? VK_ERROR_INITIALIZATION_FAILED : VK_ERROR_OUT_OF_HOST_MEMORY;
    session->sock = ls_icd_dial(settings.socket_path, settings.supervisor_lock, LS_ICD_DIAL_MS);
    if (session->sock < 0) {
        char detail[4200];
        snprintf(detail, sizeof(detail), "%s (%s)", settings.socket_path, strerror(-session->sock));
        free(text);
        session->sock = -1;
        return refuse(why, why_size, "no arbiter answers (start one with libshare-control -d, or use libshare-run)", detail);
    }
    rc = ls_icd_send(session->sock, text, strlen(text), NULL, 0);
    free(text);
    if (rc == 0)
        rc = ls_icd_recv(session->sock, &frame, 2, LS_ICD_REPLY_MS);
    if (rc < 0) {
        ls_icd_session_close(session);
        return refuse(why, why_size, "the arbiter did not answer hello", strerror(-rc));
    }
    result = read_welcome(session, physical, &frame, why, why_size);
    ls_icd_frame_free(&frame);
    if (result != VK_SUCCESS)
        ls_icd_session_close(session);
    return result;
}

VkResult ls_icd_hello(struct ls_icd_session *session, struct ls_icd_physical *physical, char *why, size_t why_size)
{
    return hello(session, physical, 0, why, why_size);
}

VkResult ls_icd_hello_again(struct ls_icd_session *session, struct ls_icd_physical *physical, char *why,
                            size_t why_size)
{
    return hello(session, physical, 1, why, why_size);
}

void ls_icd_session_close(struct ls_icd_session *session)
{
    int *fds[] = {&session->sock, &session->ring_fd, &session->bell_fd};
    for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++) {
        if (*fds[i] >= 0)
            close(*fds[i]);
        *fds[i] = -1;
    }
}
