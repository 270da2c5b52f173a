/*
 * The engine's private header: the structs its files share, a few inline helpers, and the
 * functions one file calls in another. engine.h is the public header (the cdef that cffi
 * reads); nothing here reaches Python.
 *
 * The engine's files, each opening with its part of the design:
 *   loop.c        run(): retire, drain, wait; take() pops, checks and records a client's work
 *   wait.c        how the loop waits: fence polls and naps, spins, ppoll on the doorbells
 *                 and their budget, yielding a shared core ("Cores", "Doorbells")
 *   validate.c    check_desc, the one descriptor validator; bind groups (check_group)
 *   recordings.c  descriptors recorded into secondary command buffers, each client's cache
 *   flights.c     submissions: opening, submitting, retiring, timestamps, the watchdog
 *   answers.c     completions and fences to clients, events to the control plane
 *   objects.c     each client's object table, objects held by commands, deferred drops, views
 *   lists.c       command lists: registered once, run command by command under one ticket
 *   api.c         the ls_engine_* entry points
 *   ../policy/engine_policy.c  the scheduling policy's C part: plans, ranks, lingering, pieces
 *
 * Every function declared here runs with the engine's mutex held, unless its comment says
 * otherwise. They have hidden visibility: the engine's module exports only what engine.h
 * declares.
 */
#ifndef LIBSHARE_ENGINE_INTERNAL_H
#define LIBSHARE_ENGINE_INTERNAL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "engine.h"
#include "ring.h"
#include "sync.h"

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NFLIGHT 8                       /* submission slots */
#define LINGER_NS 200000LL              /* hold a small submission of streaming clients this long */
#define NO_FENCE (-1)
#define PIECE 1                         /* entry.piece */
#define LAST_PIECE 2
#define LIST_COMMAND 1                  /* entry.listed: a command of a list, answers nothing */
#define LIST_LAST 2                     /* ... its last (or the one on the device when it ended): answers for all */
#define UNRANKED INT32_MAX
#define MOST_USERS (LS_ENGINE_MAX_BINDINGS + 3)  /* a command's objects: its buffers, its group, an indirect
                                                   dispatch's counts, its program */
/* In each flight's mapped results buffer, past its timestamps and progress word: one 16-byte slot per
 * entry for an indirect dispatch's clamped counts and verdict (recordings.c, "Indirect dispatches"),
 * at an offset any storage-buffer alignment divides (Vulkan's largest is 256). */
#define PROGRESS_OFFSET (8 * (LS_ENGINE_MAX_BATCH + 1))
#define SCRATCH_OFFSET ((PROGRESS_OFFSET + 8 + 255) / 256 * 256)
#define SCRATCH_SIZE (16 * LS_ENGINE_MAX_BATCH)
/* In each flight's query pool, past the LS_ENGINE_MAX_BATCH + 1 that time its entries: one query per entry
 * for an LS_OP_TIMESTAMP's stamp (recordings.c, "Timestamps"). */
#define STAMP_QUERY(k) (LS_ENGINE_MAX_BATCH + 1 + (k))
#define FLIGHT_QUERIES STAMP_QUERY(LS_ENGINE_MAX_BATCH)

/* A client's program, buffer, list, bind group or texel view, counted in use by the commands and cuts that hold
 * it (objects.c). */
struct object {
    uint32_t id, kind;
    uint32_t in_flight;                 /* commands submitted and not retired (and a buffer's views) */
    uint32_t freed;                     /* dropped by the control plane */
    uint64_t handle, layout, size;      /* VkBuffer + size, VkPipeline + layout, or VkBufferView + range */
    uint32_t bindings, push_size;
    uint32_t uniform_mask;              /* a program's (or group's) bindings that are uniform (bit k: binding k) */
    uint32_t array_mask;                /* ... that are the next element of an array of buffers (bit k: k - 1's) */
    uint32_t texel_mask;                /* ... that are texel buffers (their ids name views) */
    uint16_t formats[LS_ENGINE_MAX_BINDINGS];  /* ... each texel binding's view format codes (bit f: code f) */
    uint32_t format, uses;              /* a view's format code and its uses (LS_VIEW_*) */
    struct object *of;                  /* a view's buffer, held while the view lives */
    uint32_t client;
    uint32_t cuttable;                  /* a program whose dispatches may run in pieces (LS_ENGINE_CUTTABLE) */
    uint32_t count;                     /* a list's commands, stored after the object (list_commands) */
};

/* The commands of a list object (LS_KIND_LIST), allocated with it. */
static inline struct ls_desc *list_commands(struct object *o) { return (struct ls_desc *)(o + 1); }

/* One buffer of a bind group (LS_KIND_GROUP, validate.c): an id of its client's, its offset and range. */
struct group_entry {
    uint32_t buffer, pad;
    uint64_t offset, range;             /* range 0: to the buffer's end */
};

/* The entries of a group object, its `bindings` of them, allocated with it. */
static inline struct group_entry *group_entries(struct object *o) { return (struct group_entry *)(o + 1); }
/* Dispatch d's first workgroup along dimension k: 0, or with LS_DESC_BASE its buffer[1 + k] (ring.h) */
static inline uint32_t dispatch_base(const struct ls_desc *d, int k)
{
    return d->flags & LS_DESC_BASE ? d->buffer[1 + k] : 0;
}

/* A client's objects, by (kind, id): open addressing with linear probes and a keyed hash (objects.c). */
struct table {
    struct object **slots;
    uint32_t cap, used, live;           /* used: live entries and tombstones */
    uint32_t longest;                   /* the most slots a put has probed (ls_engine_stats) */
    uint32_t key[2];
};

/* A descriptor's command and barrier, recorded once into a secondary command buffer and
 * run by every later descriptor of its client with the same content (recordings.c). */
struct recording {
    struct recording *next;             /* in its client's bucket, or in the engine's spare list */
    VkCommandBuffer cb;                 /* secondary, SIMULTANEOUS_USE: several flights may run it */
    uint64_t hash;
    uint64_t last;                      /* the engine's count of lookups at its last use (LRU) */
    uint32_t uses;                      /* flight entries that run it, not yet retired */
    uint32_t cached;                    /* in its client's table; else spare once unused */
    struct object *objects[MOST_USERS];
    uint32_t nobjects;
    struct ls_desc key;                 /* the descriptor it records, ticket 0 */
};

/* A command in a flight: one recording, answered (with the fences after it) when the flight retires. */
struct entry {
    uint32_t client;
    uint64_t ticket;
    struct recording *recording;
    uint32_t groups;                    /* its dispatch's workgroups, on the entry that answers (0: a copy) */
    uint32_t piece;                     /* PIECE: answers nothing; LAST_PIECE: answers for every piece */
    uint32_t listed;                    /* LIST_COMMAND or LIST_LAST (lists.c); 0: not a list's */
    uint32_t indirect;                  /* an indirect dispatch: its verdict is read as it retires */
    int32_t list_status;                /* LIST_LAST: why its list ended early (0: it did not) */
    struct object *users[MOST_USERS];
    uint32_t nusers;
    int32_t fences;                     /* first fence node answered after it, or NO_FENCE */
    int32_t fences_tail;
};

/* A fence (an LS_OP_NOP) waiting for an entry, in a list of nodes that the engine reuses. */
struct fence_node {
    uint64_t ticket;
    int32_t next;
};

/* A dispatch running in pieces (engine_policy.c, "Pieces"): its objects are held until its last piece is
 * in a flight. */
struct cut {
    uint32_t active;
    uint32_t dim, next, end, step;      /* pieces run groups next..end-1 along dim, step at a time */
    int32_t rank;                       /* its turn's */
    int64_t waited_from;                /* when its last piece went in (or it began): piece_now's order */
    struct ls_desc desc;
    struct object *users[MOST_USERS];
    uint32_t nusers;
    uint32_t listed;                    /* a command of its client's run (lists.c): it answers into the list */
    struct entry *tail;                 /* its piece on the device, or NULL */
};

/* A command list running (lists.c): its commands go into flights a turn at a time. */
struct run {
    struct object *list;                /* held while it runs; NULL: none runs */
    uint32_t next, added;               /* its next command; those put in flights */
    uint64_t ticket;
    struct entry *tail;                 /* its latest command in a flight and not retired, or NULL */
    struct ls_desc args;                /* the LS_OP_LIST that submitted it: its parameters */
};

/* A client slot: its ring, doorbell, objects, recordings, counters and cut. */
struct client {
    ls_region *region;                  /* NULL: the slot is free */
    int doorbell_fd;
    uint32_t closing, dropped;
    uint32_t handed_over;               /* closed with LS_EMOVED: what runs is still answered */
    uint32_t outstanding;
    struct entry *last;                 /* its last command not yet answered (a fence waits on it) */
    struct table objects;
    struct recording **buckets;         /* CACHE_BUCKETS chains, allocated at its first recording */
    uint32_t nrecordings;
    uint32_t cq_size;                   /* the most completion slots seen free: all of them, once read */
    struct ls_engine_stats stats;
    /* doorbell budget */
    double credit;
    int64_t refilled, muted_until;
    uint64_t empty, mutes;
    int popped;                         /* popped since its bell last woke us */
    uint32_t active_index;
    struct pending_drop *drops;         /* objects freed while descriptors before the free still wait */
    struct cut cut;
    uint64_t cut_ns;                    /* device time of the pieces retired of its cut dispatch */
    uint64_t cut_charge;                /* ... the time they held the device, gaps included ("Pieces") */
    int32_t cut_status;                 /* ... and the first failure among them */
    struct run run;                     /* its command list running */
    struct ls_desc *after;              /* descriptors popped behind a list, waiting for it (lists.c) */
    uint32_t nafter, after_at;          /* ... how many, and the next one */
    uint64_t list_ns;                   /* device time of the retired commands of its list */
    int32_t list_status;                /* ... and the first failure among them */
    int32_t rank;                       /* its rank in the last plan that named it (UNRANKED: none yet) */
    double ns_per_group;                /* its most device time per workgroup in a timed dispatch (0: none) */
};

/* A free that waits for the descriptors its client published before it (ls_engine_drop). */
struct pending_drop {
    struct pending_drop *next;
    uint32_t kind, id, nmarks;
    uint32_t marks[];                   /* the lanes' tails at the free (ls_sq_marks) */
};

/* A submission: one primary command buffer and fence, with its entries (flights.c). */
struct flight {
    VkCommandBuffer cb;                 /* primary: runs the entries' recordings, at submit */
    VkFence fence;
    VkQueryPool queries;                /* FLIGHT_QUERIES timestamps: the entries' times, then their stamps */
    VkBuffer results;
    VkDeviceMemory results_memory;
    uint64_t *stamps;                   /* mapped results: count + 1 timestamps, then the progress word */
    volatile uint32_t *progress;        /* mapped: the commands of the batch the device has ended (markers) */
    uint32_t progress_seen;             /* its value at the watchdog's last look */
    int64_t progress_at;                /* when the watchdog last saw it move */
    struct entry entries[LS_ENGINE_MAX_BATCH];
    VkCommandBuffer secondaries[LS_ENGINE_MAX_BATCH];  /* the entries' recordings, in order */
    uint32_t count;
    int timed;
    int open;                           /* taking entries, not yet submitted */
    int urgent;                         /* holds work of a client that waits for it: no lingering */
    int64_t opened;
    int64_t head_since;
    int reported;                       /* the watchdog has fired for it */
    int32_t rank;                       /* its plan turn's rank (0 unplanned): see deferred(), engine_policy.c */
};

/* The Vulkan entry points the engine calls, from the device's own vkGetDeviceProcAddr (api.c). */
struct vk {
    PFN_vkQueueSubmit QueueSubmit;
    PFN_vkGetFenceStatus GetFenceStatus;
    PFN_vkWaitForFences WaitForFences;
    PFN_vkResetFences ResetFences;
    PFN_vkCreateFence CreateFence;
    PFN_vkDestroyFence DestroyFence;
    PFN_vkCreateCommandPool CreateCommandPool;
    PFN_vkDestroyCommandPool DestroyCommandPool;
    PFN_vkAllocateCommandBuffers AllocateCommandBuffers;
    PFN_vkBeginCommandBuffer BeginCommandBuffer;
    PFN_vkEndCommandBuffer EndCommandBuffer;
    PFN_vkCmdBindPipeline CmdBindPipeline;
    PFN_vkCmdPushDescriptorSetKHR CmdPushDescriptorSetKHR;
    PFN_vkCmdPushConstants CmdPushConstants;
    PFN_vkCmdDispatch CmdDispatch;
    PFN_vkCmdDispatchBase CmdDispatchBase;
    PFN_vkCmdDispatchIndirect CmdDispatchIndirect;
    PFN_vkCmdUpdateBuffer CmdUpdateBuffer;
    PFN_vkCmdCopyBuffer CmdCopyBuffer;
    PFN_vkCmdPipelineBarrier CmdPipelineBarrier;
    PFN_vkCmdExecuteCommands CmdExecuteCommands;
    PFN_vkCreateQueryPool CreateQueryPool;
    PFN_vkDestroyQueryPool DestroyQueryPool;
    PFN_vkCmdResetQueryPool CmdResetQueryPool;
    PFN_vkCmdWriteTimestamp CmdWriteTimestamp;
    PFN_vkCmdCopyQueryPoolResults CmdCopyQueryPoolResults;
    PFN_vkCmdFillBuffer CmdFillBuffer;
    PFN_vkCreateBuffer CreateBuffer;
    PFN_vkDestroyBuffer DestroyBuffer;
    PFN_vkGetBufferMemoryRequirements GetBufferMemoryRequirements;
    PFN_vkAllocateMemory AllocateMemory;
    PFN_vkFreeMemory FreeMemory;
    PFN_vkBindBufferMemory BindBufferMemory;
    PFN_vkMapMemory MapMemory;
};

struct ls_engine {
    struct ls_engine_config cfg;
    struct ls_engine_policy policy;
    struct vk vk;
    VkDevice device;
    VkQueue queue;
    VkCommandPool pool;
    volatile uint32_t *busy;            /* slot + 1 while take() handles that client (atomic pointer) */
    pthread_mutex_t lock;               /* everything below, but the flights' fences while waited on */
    pthread_mutex_t queue_lock;         /* the VkQueue */
    pthread_t thread;
    int32_t tid;                        /* the thread's id, once it runs (for policy/placement.py) */
    int placed;                         /* ls_engine_place pinned the thread: its polls yield */
    int64_t fence_yields_paused_until;  /* ... but not before this (poll_step) */
    int64_t spin_yields_paused_until;   /* ... nor, for a spin's polls, this */
    int started, stopping, faulted, device_lost;
    int64_t stop_timeout_ns;
    int abandoned;
    int wake_fd;
    struct client *clients;
    uint32_t *active;                   /* slots in use, dense */
    uint32_t nactive, rotate;
    struct flight flights[NFLIGHT];
    uint32_t head, nflights;            /* submitted flights: head .. head + nflights - 1 */
    struct recording *spare;            /* recordings out of every table and unused: re-recorded next */
    uint64_t lookups;
    struct fence_node *fence_nodes;
    uint32_t fence_cap;
    int32_t fence_free;
    struct ls_engine_event *events;
    uint32_t nevents, events_cap;
    struct ls_engine_turn *plan;
    uint32_t nplan, plan_cap;
    uint64_t waiting_sig, plan_sig;     /* which clients wait, and how many submissions run: at the last look, at the plan */
    uint64_t withheld_sig;              /* ... at a pass whose plan popped none of them (withheld set) */
    int32_t pass_rank;                  /* the rank of the turn being popped: its flights' */
    int withheld;
    int64_t planned_at;
    int plan_stale;                     /* the policy changed since the plan was made: ask again */
    int popped;                         /* popped since the last spin */
    uint32_t cuts;                      /* clients with a cut active */
    uint32_t runs;                      /* clients with a list running */
    int32_t waiting_rank;               /* the highest rank of the clients waiting at the last look, cuts aside */
    struct ls_desc descs[LS_ENGINE_POP];
    struct ls_cqe post_buf[LS_ENGINE_POP];
    uint32_t post_count, post_client;
    struct pollfd *pollfds;
    uint32_t *poll_clients;
};

/* The flight k places from the head: submitted for k < nflights, the open one at k == nflights. */
static inline struct flight *flight_at(ls_engine *e, uint32_t k) { return &e->flights[(e->head + k) % NFLIGHT]; }

static inline int is_taken(const struct table *t, const struct object *o)
{
    return o && o != (const struct object *)t;
}

#pragma GCC visibility push(hidden)

/* loop.c */
void *run(void *arg);
int takeable(struct client *c);
int waits(struct client *c);
uint32_t look(ls_engine *e);
void cancel_queued(ls_engine *e, uint32_t slot, int32_t status);

/* wait.c */
void sleep_on_bells(ls_engine *e, int64_t linger_ns);
void wait_for_work(ls_engine *e);

/* validate.c */
int check_desc(ls_engine *e, struct client *c, const struct ls_desc *d, struct object **users, uint32_t *nusers);
int check_group(ls_engine *e, struct client *c, const struct object *layout, const struct group_entry *entries,
                uint32_t count, struct object **buffers, uint32_t *bad);

/* recordings.c */
struct recording *record(ls_engine *e, struct client *c, const struct ls_desc *d, struct object **users,
                         uint32_t nusers, const uint32_t *base, const uint32_t *count);
struct recording *recording_for(ls_engine *e, struct client *c, const struct ls_desc *d, struct object **users,
                                uint32_t nusers);
struct recording *recording_in(ls_engine *e, struct client *c, const struct ls_desc *d, struct object **users,
                               uint32_t nusers, struct flight *f);
void forget_recordings(ls_engine *e, struct client *c, const struct object *o);
void unuse(ls_engine *e, struct recording *r);

/* flights.c */
struct flight *flight_with_room(ls_engine *e);
int submit(ls_engine *e);
int retire(ls_engine *e);
void check_watchdog(ls_engine *e);
void create_timing(ls_engine *e, struct flight *f);

/* answers.c */
void emit(ls_engine *e, uint32_t type, uint32_t client, int32_t code, uint32_t kind, uint64_t a, uint64_t b);
void answer(ls_engine *e, uint32_t client, uint64_t ticket, int32_t status, uint64_t ns);
void flush_posts(ls_engine *e);
void drop_client(ls_engine *e, uint32_t slot, int code);
void finish_entry(ls_engine *e, struct entry *en, int32_t status, uint64_t ns, uint64_t held_ns, int keep);
int add_fence(ls_engine *e, struct entry *en, uint64_t ticket);

/* objects.c */
struct object **table_find(struct table *t, uint32_t kind, uint32_t id);
int table_put(struct table *t, struct object *o);
void free_objects(struct table *t, uint32_t slot);
void hold_objects(struct object **held, struct object *const *objects, uint32_t n);
void release(ls_engine *e, struct object *o);
int defer_drop(ls_engine *e, uint32_t slot, uint32_t kind, uint32_t id);
void settle_drops(ls_engine *e, uint32_t slot);

/* lists.c */
struct object *new_list(const char *commands, uint32_t count);
int check_list(ls_engine *e, struct client *c, struct object *list, uint32_t *bad);
int check_args(struct client *c, const struct object *list, const struct ls_desc *d);
void start_run(ls_engine *e, uint32_t slot, struct object *list, const struct ls_desc *d);
int run_list(ls_engine *e, uint32_t slot, int64_t budget, uint32_t cut_us);
void end_run(ls_engine *e, uint32_t slot, int32_t status);
void close_run(ls_engine *e, struct client *c);
int continue_runs(ls_engine *e);
int book_list(struct client *c, struct entry *en, int32_t *status, uint64_t *ns);
int stash_after(struct client *c, const struct ls_desc *descs, uint32_t n);
void cancel_after(ls_engine *e, uint32_t slot, int32_t status);

/* ../policy/engine_policy.c */
int plan_due(ls_engine *e, int piece, uint32_t waiting);
int streams(struct client *c, int space);
int hold(ls_engine *e);
int deferred(ls_engine *e);
int64_t room(ls_engine *e);
void at_rank(ls_engine *e, int32_t rank);
uint32_t pieces_for(ls_engine *e, const struct client *c, const struct ls_desc *d, struct object **users,
                    uint32_t nusers, uint32_t cut_us, uint32_t *dim);
void start_cut(ls_engine *e, uint32_t slot, const struct ls_desc *d, struct object **users, uint32_t nusers,
               uint32_t dim, uint32_t pieces);
void close_cut(ls_engine *e, struct client *c);
void end_cut(ls_engine *e, uint32_t slot, int32_t status);
int add_piece(ls_engine *e, uint32_t slot, int rest);
int64_t cut_under_way(ls_engine *e, int32_t rank);
int piece_now(ls_engine *e);
int finish_cut(ls_engine *e, uint32_t slot);
int continue_cuts(ls_engine *e);
int book_piece(struct client *c, struct entry *en, int32_t *status, uint64_t *ns, uint64_t *charge);

#pragma GCC visibility pop

#endif
