/* The device's bind groups and command lists, shared by content across its recordings.
 *
 * Applications record their command buffers anew each step (Taichi and ncnn do): the same
 * dispatches over the same buffers, recorded again into a reset or new command buffer. Every bind
 * group a recording names (dispatch.c) and every list it loads (commands.c) comes from here: a
 * group is found by its program and entries, a list by its descriptors, each by a 64-bit hash and
 * then compared whole, so a recording of what was recorded before costs no request to the
 * arbiter. Content alone decides: a group's entries are resolved arbiter buffers, offsets and
 * ranges, a list's descriptors name groups by id, and the arbiter never gives an id twice in a
 * session, so an entry that names something freed can never match again.
 *
 * An entry counts its holders: each recording holds every group and list it uses, once a use
 * (commands.c gives them back at reset, free or destroy; a primary holds the groups of the
 * secondaries it inlines). An entry no one holds stays at the arbiter, idle, for the next
 * recording of the same content; at most MOST_IDLE_GROUPS and MOST_IDLE_LISTS idle ones are kept,
 * the least recently held freed first ({"op":"free"}, ls_icd_forget: the reattach ledger forgets
 * it too). When the arbiter's quota refuses a new one (a session's 1024 lists, 65536 commands in
 * them or 4096 groups, serve/requests.py), the least recently held idle entry of that kind is freed and the request
 * made again, until none is idle. An entry that names something gone is dropped: vkFreeMemory
 * drops the groups and lists naming the buffer, vkDestroyPipeline those naming the program, and a
 * group freed for any reason the lists naming it. A dropped entry matches nothing again; idle, it
 * is freed at once, held, when given back. Freeing them matters beyond the quota: a new arbiter
 * after a restart refuses to make again a list or group naming what is gone (reattach.c).
 *
 * Removal marks first (mark: the entry and, for a group, the lists naming it) and frees after
 * (sweep), so no walk of the table frees an entry another walk is about to visit.
 *
 * The table is a fixed array of buckets chained through the entries, under the device's lock. A
 * list's entry keeps a copy of its descriptors (to compare), as the ledger does. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"

#define BUCKETS 1024u
#define MOST_IDLE_GROUPS 512u
#define MOST_IDLE_LISTS 32u

enum { GROUP, LIST };
static const char *const ID_FIELD[] = {"group_id", "list_id"};
static const uint32_t MOST_IDLE[] = {MOST_IDLE_GROUPS, MOST_IDLE_LISTS};

struct ls_icd_cached {
    struct ls_icd_cached *next; /* in its bucket */
    uint64_t hash;
    int64_t id;
    int kind;                   /* GROUP or LIST */
    int dropped;                /* names a freed buffer or program: freed when no one holds it */
    uint32_t holders;
    uint64_t held_at;           /* the cache's clock when last held: the least recent idle one goes first */
    int64_t program;            /* a group's program, else -1 */
    size_t len;
    uint64_t words[];           /* a group's entries, or a list's descriptors */
};

struct ls_icd_cache {
    struct ls_icd_cached *buckets[BUCKETS];
    uint32_t idle[2];           /* idle entries of each kind */
    uint64_t clock;
};

int64_t ls_icd_cached_id(const struct ls_icd_cached *cached)
{
    return cached->id;
}

static uint64_t hash_words(int kind, int64_t program, const uint64_t *words, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)kind ^ ((uint64_t)program << 8);
    for (size_t i = 0; i < n; i++) {
        h = (h ^ words[i]) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    return h;
}

static struct ls_icd_cache *cache_of(struct ls_icd_device *device)
{
    if (device->cache == NULL)
        device->cache = calloc(1, sizeof(*device->cache));
    return device->cache;
}

/* ``cached`` out of its bucket, freed at the arbiter and here. */
static void discard(struct ls_icd_device *device, struct ls_icd_cached *cached)
{
    struct ls_icd_cached **at = &device->cache->buckets[cached->hash % BUCKETS];
    while (*at != cached)
        at = &(*at)->next;
    *at = cached->next;
    if (cached->holders == 0)
        device->cache->idle[cached->kind]--;
    ls_icd_forget(device, ID_FIELD[cached->kind], cached->id);
    free(cached);
}

/* ``visit`` called on every entry (it may free the one it is given, and no other). */
static void each_entry(struct ls_icd_device *device, int64_t what,
                       void (*visit)(struct ls_icd_device *, struct ls_icd_cached *, int64_t))
{
    for (uint32_t b = 0; device->cache != NULL && b < BUCKETS; b++) {
        struct ls_icd_cached *c = device->cache->buckets[b], *next;
        for (; c != NULL; c = next) {
            next = c->next;
            visit(device, c, what);
        }
    }
}

/* Whether list ``list``'s descriptors name ``id``: a bind group (LS_DESC_GROUP), a buffer (copies,
 * fills, updates, timestamps, an indirect dispatch's counts) or a program. Ids of the three kinds are
 * one sequence at the arbiter, so one id is never two of them. */
static int list_names(const struct ls_icd_cached *list, int64_t id)
{
    const struct ls_desc *d = (const struct ls_desc *)list->words;
    size_t n = list->len * sizeof(uint64_t) / sizeof(*d);
    for (size_t k = 0; k < n; k++) {
        if ((d[k].flags & LS_DESC_GROUP ? d[k].buffer[0] == id : 0) || d[k].program == id ||
            (d[k].opcode == LS_OP_DISPATCH_INDIRECT && d[k].groups[0] == id))
            return 1;
        for (uint32_t i = 0; !(d[k].flags & LS_DESC_GROUP) && i < d[k].nbuffers && i < LS_MAX_BUFFERS; i++)
            if (d[k].buffer[i] == id)
                return 1;
    }
    return 0;
}

static void mark_list_naming(struct ls_icd_device *device, struct ls_icd_cached *c, int64_t id)
{
    (void)device;
    if (c->kind == LIST && list_names(c, id))
        c->dropped = 1;
}

/* ``cached`` marked dropped: it can never match again, nor, for a group, the lists naming it (a
 * new arbiter would refuse them). Marking frees nothing; sweep() does. */
static void mark(struct ls_icd_device *device, struct ls_icd_cached *cached)
{
    cached->dropped = 1;
    if (cached->kind == GROUP)
        each_entry(device, cached->id, mark_list_naming);
}

static void discard_if_dropped_idle(struct ls_icd_device *device, struct ls_icd_cached *c, int64_t unused)
{
    (void)unused;
    if (c->dropped && c->holders == 0)
        discard(device, c);
}

/* Every dropped entry no one holds freed (a held one is, when given back). */
static void sweep(struct ls_icd_device *device)
{
    each_entry(device, 0, discard_if_dropped_idle);
}

/* The least recently held idle entry of ``kind`` freed (with what names it): 1, or 0 when none is idle. */
static int discard_oldest(struct ls_icd_device *device, int kind)
{
    struct ls_icd_cached *oldest = NULL;
    for (uint32_t b = 0; b < BUCKETS; b++)
        for (struct ls_icd_cached *c = device->cache->buckets[b]; c != NULL; c = c->next)
            if (c->kind == kind && c->holders == 0 && (oldest == NULL || c->held_at < oldest->held_at))
                oldest = c;
    if (oldest == NULL)
        return 0;
    mark(device, oldest);
    sweep(device);
    return 1;
}

static void hold(struct ls_icd_cache *cache, struct ls_icd_cached *cached)
{
    if (cached->holders++ == 0)
        cache->idle[cached->kind]--;
    cached->held_at = ++cache->clock;
}

/* ``request`` made (payload ``payload`` of ``len`` bytes) and its reply's id field read; an idle entry
 * of ``kind`` freed and the request made again while the arbiter's quota refuses. */
static VkResult ask_for_id(struct ls_icd_device *device, int kind, const char *request, const void *payload,
                           size_t len, int64_t *id)
{
    VkResult result;
    do {
        struct ls_icd_frame frame;
        cJSON *reply;
        result = ls_icd_ask(device, request, payload, len, &frame, 0, &reply, LS_ICD_INVALID);
        *id = result == VK_SUCCESS ? ls_icd_whole_field(reply, ID_FIELD[kind], 0, 2147483647.0) : -1;
        cJSON_Delete(reply);
        ls_icd_frame_free(&frame);
        if (result == VK_SUCCESS && *id < 0) {
            fprintf(stderr, "libshare Vulkan driver: the arbiter's reply has no %s\n", ID_FIELD[kind]);
            result = LS_ICD_INVALID;
        }
    } while (result == VK_ERROR_OUT_OF_DEVICE_MEMORY && discard_oldest(device, kind));
    return result;
}

/* The entry of ``kind`` over ``words``: found, or made with ``request``; held for the caller. */
static VkResult find_or_make(struct ls_icd_device *device, int kind, int64_t program, const uint64_t *words,
                             size_t n, const char *request, const void *payload, size_t len,
                             struct ls_icd_cached **out)
{
    struct ls_icd_cache *cache = cache_of(device);
    uint64_t hash = hash_words(kind, program, words, n);
    struct ls_icd_cached *cached;
    int64_t id;
    VkResult result;
    if (cache == NULL)
        return VK_ERROR_OUT_OF_HOST_MEMORY;
    for (cached = cache->buckets[hash % BUCKETS]; cached != NULL; cached = cached->next) {
        if (cached->hash == hash && cached->kind == kind && cached->program == program && !cached->dropped &&
            cached->len == n && memcmp(cached->words, words, n * sizeof(*words)) == 0) {
            hold(cache, cached);
            *out = cached;
            return VK_SUCCESS;
        }
    }
    cached = malloc(sizeof(*cached) + n * sizeof(*words));
    if (cached == NULL)
        return VK_ERROR_OUT_OF_HOST_MEMORY;
    result = ask_for_id(device, kind, request, payload, len, &id);
    if (result != VK_SUCCESS) {
        free(cached);
        return result;
    }
    *cached = (struct ls_icd_cached){cache->buckets[hash % BUCKETS], hash, id, kind, 0, 1, ++cache->clock,
                                     program, n};
    memcpy(cached->words, words, n * sizeof(*words));
    cache->buckets[hash % BUCKETS] = cached;
    *out = cached;
    return VK_SUCCESS;
}

VkResult ls_icd_cache_group(struct ls_icd_device *device, int64_t program, const uint64_t *entries, uint32_t n,
                            struct ls_icd_cached **out)
{
    char request[96 + 3 * 32 * 22];
    size_t at;
    if (n > 32)
        return LS_ICD_INVALID;
    at = (size_t)snprintf(request, sizeof(request), "{\"op\":\"bind_group\",\"program_id\":%lld,\"buffers\":[",
                          (long long)program);
    for (uint32_t k = 0; k < n; k++)
        at += (size_t)snprintf(request + at, sizeof(request) - at, "%s[%llu,%llu,%llu]", k ? "," : "",
                               (unsigned long long)entries[3 * k], (unsigned long long)entries[3 * k + 1],
                               (unsigned long long)entries[3 * k + 2]);
    snprintf(request + at, sizeof(request) - at, "]}");
    return find_or_make(device, GROUP, program, entries, 3 * (size_t)n, request, NULL, 0, out);
}

VkResult ls_icd_cache_list(struct ls_icd_device *device, const struct ls_desc *commands, uint32_t n,
                           struct ls_icd_cached **out)
{
    size_t len = (size_t)n * sizeof(*commands);
    return find_or_make(device, LIST, -1, (const uint64_t *)commands, len / sizeof(uint64_t),
                        "{\"op\":\"load_list\"}", commands, len, out);
}

void ls_icd_cache_hold(struct ls_icd_cached *cached)
{
    cached->holders++;
}

void ls_icd_cache_release(struct ls_icd_device *device, struct ls_icd_cached *cached)
{
    struct ls_icd_cache *cache = device->cache;
    if (--cached->holders > 0)
        return;
    cache->idle[cached->kind]++;
    if (cached->dropped)
        discard(device, cached);
    else if (cache->idle[cached->kind] > MOST_IDLE[cached->kind])
        discard_oldest(device, cached->kind);
}

static void mark_group_naming_buffer(struct ls_icd_device *device, struct ls_icd_cached *c, int64_t buffer_id)
{
    for (size_t k = 0; c->kind == GROUP && k < c->len; k += 3) {
        if (c->words[k] == (uint64_t)buffer_id) {
            mark(device, c);
            return;
        }
    }
}

static void mark_group_of_program(struct ls_icd_device *device, struct ls_icd_cached *c, int64_t program_id)
{
    if (c->kind == GROUP && c->program == program_id)
        mark(device, c);
}

static void free_here(struct ls_icd_device *device, struct ls_icd_cached *c, int64_t unused)
{
    (void)device, (void)unused;
    free(c);
}

void ls_icd_cache_drop_buffer(struct ls_icd_device *device, int64_t buffer_id)
{
    each_entry(device, buffer_id, mark_group_naming_buffer);
    each_entry(device, buffer_id, mark_list_naming);
    sweep(device);
}

void ls_icd_cache_drop_program(struct ls_icd_device *device, int64_t program_id)
{
    each_entry(device, program_id, mark_group_of_program);
    each_entry(device, program_id, mark_list_naming);
    sweep(device);
}

void ls_icd_cache_free(struct ls_icd_device *device)
{
    each_entry(device, 0, free_here);
    free(device->cache);
    device->cache = NULL;
}
