/*
 * libshare engine: the arbiter's data path in C, on its own thread, without the GIL.
 *
 * The engine pops descriptors from the clients' rings, checks each against the
 * client's object table (the one validator), records the valid ones (once per
 * distinct content) and runs them from one command buffer per submission,
 * submits, polls fences, reads timestamps and posts completions.
 * Python keeps the control plane and talks to the engine through this header
 * only: object tables and policy in, counters and events out. Every call is
 * thread-safe (one mutex, held by the engine for one pass at most) and returns
 * a count, 0 or a negative code (-errno or -LS_E*), in the style of liburing.
 *
 * The block between the cdef markers is fed to cffi (libshare/arbiter/engine/binding.py).
 */
#ifndef LIBSHARE_ENGINE_H
#define LIBSHARE_ENGINE_H

#include <stdint.h>

/* cdef-begin */
#define LS_ENGINE_MAX_BATCH 1024        /* commands in one vkQueueSubmit */
#define LS_ENGINE_POP 1024              /* descriptors popped per client per pass */

#define LS_KIND_BUFFER 1
#define LS_KIND_PROGRAM 2
#define LS_KIND_LIST 3                  /* a command list (engine/lists.c) */
#define LS_ENGINE_MAX_LIST 1024         /* the most commands in one list */
#define LS_KIND_GROUP 4                 /* a bind group: a program layout's buffers, offsets and ranges (validate.c) */
#define LS_KIND_VIEW 5                  /* a texel view of a buffer of the client's (objects.c, "Views") */
#define LS_VIEW_STORAGE 1               /* a view's uses: in a storage texel buffer binding */
#define LS_VIEW_UNIFORM 2               /* ... in a uniform texel buffer binding */
#define LS_ENGINE_MAX_BINDINGS 32       /* the most buffers one program binds (more than LS_MAX_BUFFERS: through a group) */

#define LS_ENGINE_CUTTABLE 1            /* put_program flag: its dispatches may run in pieces (engine_policy.c, "Pieces") */
#define LS_ENGINE_MAX_PIECES 64         /* the most pieces one dispatch is cut into */

/* Events the engine queues for the control plane (it writes event_fd when it adds some). */
#define LS_EV_RELEASED 1                /* an object the client freed is idle: destroy it (kind, id) */
#define LS_EV_IDLE 2                    /* a closing client has nothing outstanding: reclaim it */
#define LS_EV_DROPPED 3                 /* its ring failed validation (code: the negative error); closed */
#define LS_EV_WATCHDOG 4                /* the head submission ran past its limit (a: commands, b: ns;
                                           kind 1: a marked batch, code: the commands it had ended) */
#define LS_EV_SUSPECT 5                 /* follows LS_EV_WATCHDOG once per client of that submission
                                           (kind LS_KIND_PROGRAM, a: the one program its dispatches
                                           there run; kind 0 when they run none or several) */
#define LS_EV_DEVICE 6                  /* a Vulkan call failed (code: the VkResult): the device is lost */
#define LS_EV_MUTED 7                   /* a doorbell is muted (a: empty wake-ups, b: times muted) */

struct ls_engine_config {
    uint64_t device;                    /* VkDevice */
    uint64_t queue;                     /* VkQueue: the engine submits on it under its queue lock */
    uint32_t family;                    /* the queue's family */
    uint32_t host_memory_type;          /* host-visible coherent type, for timestamp results */
    uint64_t timestamp_mask;            /* 0: the queue has no timestamps */
    double   timestamp_period_ns;
    uint64_t max_storage_range;
    uint64_t offset_alignment;
    uint64_t max_uniform_range;         /* a uniform buffer binding's most bytes */
    uint64_t uniform_offset_alignment;  /* and the alignment of its offset */
    uint32_t max_groups[3];
    uint32_t max_clients;               /* client slots 0 .. max_clients-1 */
    int32_t  event_fd;                  /* an eventfd the engine writes 1 to when it queues events */
    uint32_t stamp_at_top;              /* 1: the device ends each command before the next begins (lavapipe):
                                           a flight's timestamps at the top of the pipe (flights.c) */
    uint64_t clamp_pipeline;            /* VkPipeline of shaders/indirect_clamp.comp (0: no indirect dispatch) */
    uint64_t clamp_layout;              /* ... and its VkPipelineLayout */
};

/* The policy the control plane sets; the engine enforces it from its next pass on. */
struct ls_engine_policy {
    uint32_t planned;                   /* 0: every waiting client, all it has; 1: call ls_engine_plan_cb */
    uint32_t timed;                     /* 1: a timestamp after every command */
    uint64_t watchdog_ns;               /* a submission's limit at the head of the queue; 0: none */
    uint64_t spin_ns;                   /* look at the rings this long after popped work before sleeping */
    uint32_t spin_clients;              /* ... only with at most this many clients */
    uint32_t max_in_flight;             /* submissions on the device at once */
    uint64_t plan_ns;                   /* a plan is reused this long while the same clients wait */
};

/* One turn of a planned pass: pop at most budget descriptors of client; a change of
 * rank between turns starts a new submission. With cut_us, the turn takes one command, and a
 * dispatch of a cuttable program estimated at over 1.5 times cut_us (by the client's worst device
 * time per workgroup) runs in pieces of about cut_us each, one on the device at a time
 * (policy/engine_policy.c, "Pieces"). */
struct ls_engine_turn {
    uint32_t client;
    uint32_t budget;
    int32_t  rank;
    uint32_t cut_us;
};

struct ls_engine_event {
    uint32_t type;                      /* LS_EV_* */
    uint32_t client;
    int32_t  code;
    uint32_t kind;
    uint64_t a;
    uint64_t b;
};

/* A client's counters. The *_since fields count from the last ls_engine_take_usage. */
struct ls_engine_stats {
    uint64_t submitted;                 /* descriptors popped */
    uint64_t completed;                 /* answered with status 0 */
    uint64_t errors;                    /* answered with a refusal */
    uint64_t device_ns;
    uint64_t cut;                       /* dispatches run in pieces */
    uint64_t pieces;                    /* ... and the pieces they ran in */
    uint64_t listed;                    /* commands of command lists put in submissions */
    uint64_t popped_since;
    uint64_t charged_since;             /* commands retired */
    uint64_t charged_ns_since;          /* their device time (0 for each one untimed) */
    uint32_t outstanding;               /* popped and not yet answered */
    uint32_t pending;                   /* waiting in the ring at the last look (take_usage: now) */
    uint32_t closing;
    uint32_t muted;
    uint32_t table_slots;               /* the size of the client's object table */
    uint32_t table_probes;              /* the most slots one insertion into it has probed */
};

typedef struct ls_engine ls_engine;

int ls_engine_create(const struct ls_engine_config *config, ls_engine **out);
int ls_engine_start(ls_engine *e);
/* The engine thread's id (gettid), once started; -ESRCH before. */
int32_t ls_engine_thread_id(ls_engine *e);
/* Pin the engine thread to core, which it shares with the driver's threads (policy/placement.py): its
 * polls then yield that core (wait.c, "Cores"). core -1: unplaced (its polls keep their core;
 * its cores are the caller's to set). 0, -EINVAL or -errno. */
int ls_engine_place(ls_engine *e, int32_t core);
/* Cancel queued work (LS_ECANCELED), give running work timeout_ns, answer what still runs
 * (LS_EFAULT when faulted, else LS_ECANCELED) and abandon it; join the thread. Returns the
 * number of submissions abandoned. */
int ls_engine_stop(ls_engine *e, int64_t timeout_ns);
/* Free the engine's Vulkan objects. Only once stopped and with nothing in flight (else -EBUSY). */
int ls_engine_destroy(ls_engine *e);
void ls_engine_set_policy(ls_engine *e, const struct ls_engine_policy *policy);
/* vkQueueSubmit(queue, 1, info, fence) under the engine's queue lock: for the device layer. */
int32_t ls_engine_queue_submit(ls_engine *e, uint64_t submit_info, uint64_t fence);

/* Clients. region is the arbiter's ls_region* (from libshare.ring), doorbell_fd its end of the bell. */
int ls_engine_add_client(ls_engine *e, uint32_t client, uint64_t region, int32_t doorbell_fd);
/* Drain nothing more; with reason != 0, also close the ring for that reason and answer what
 * it still holds with -reason. What already runs is answered as it ends only for LS_EMOVED (a
 * hand-over: the session waits for it). Returns the client's outstanding count (0: reclaim it now). */
int ls_engine_close_client(ls_engine *e, uint32_t client, uint32_t reason);
int ls_engine_remove_client(ls_engine *e, uint32_t client);
int ls_engine_stats(ls_engine *e, uint32_t client, struct ls_engine_stats *out);
/* 1 when the engine closed the client's ring as corrupt (its LS_EV_DROPPED may still wait in the
 * event queue), 0 when it did not, -ENOENT for a slot past max_clients. Takes no lock. */
int ls_engine_dropped(ls_engine *e, uint32_t client);
int ls_engine_take_usage(ls_engine *e, uint32_t client, struct ls_engine_stats *out);

/* Object tables. A program's handles come from Pipeline.native, a buffer's from Buffer.native;
 * bindings: its bindings, 0..LS_ENGINE_MAX_BINDINGS (bit k of uniform_mask: binding k is uniform, a
 * uniform buffer or a uniform texel buffer; of array_mask: binding k is the next element of the array of
 * buffers that k - 1 is in); flags: LS_ENGINE_CUTTABLE or 0. formats (NULL: none) holds, for each binding
 * k that is a texel buffer, the mask of the view format codes it takes (libshare/protocol/texels.py; 0: a
 * buffer): its dispatches name a view (LS_KIND_VIEW) there. */
int ls_engine_put_program(ls_engine *e, uint32_t client, uint32_t id, uint64_t pipeline,
                          uint64_t layout, uint32_t bindings, uint32_t uniform_mask, uint32_t array_mask,
                          uint32_t push_size, uint32_t flags, const uint16_t *formats);
/* A bind group for the layout of program `program` (validate.c): count (its bindings) buffer ids (a view's
 * id at a texel binding) with their byte offsets and ranges (0: to the buffer's end; both 0 at a texel
 * binding, a view has its own range), each checked now as a dispatch checks it (and again at each dispatch
 * that names the group). 0, -LS_E* of the first bad entry (its index in *bad), -LS_ENOPROGRAM,
 * -LS_EBINDINGS (count is not the program's bindings), -EINVAL (count past LS_ENGINE_MAX_BINDINGS or a
 * NULL array), -EEXIST, -ENOENT or -ENOMEM. */
int ls_engine_put_group(ls_engine *e, uint32_t client, uint32_t id, uint32_t program, const uint32_t *buffers,
                        const uint64_t *offsets, const uint64_t *ranges, uint32_t count, uint32_t *bad);
int ls_engine_put_buffer(ls_engine *e, uint32_t client, uint32_t id, uint64_t buffer, uint64_t size);
/* A texel view (a VkBufferView from DeviceView.native) of range bytes from offset of the client's
 * buffer id buffer, in view format code format (below 16), for uses (LS_VIEW_*): it holds the
 * buffer until it is dropped and idle. -ENOENT (no such buffer), -ERANGE (past the buffer),
 * -EINVAL, -EEXIST or -ENOMEM. */
int ls_engine_put_view(ls_engine *e, uint32_t client, uint32_t id, uint32_t buffer, uint64_t view,
                       uint64_t offset, uint64_t range, uint32_t format, uint32_t uses);
/* A command list: count descriptors (struct ls_desc, 256 bytes each; any opcode but LS_OP_NOP and LS_OP_LIST),
 * each checked now as a popped one is (and again as it runs). 0, -LS_E* of the first bad command
 * (its index in *bad), -EINVAL (count 0 or past LS_ENGINE_MAX_LIST), -EEXIST, -ENOENT or -ENOMEM. */
int ls_engine_put_list(ls_engine *e, uint32_t client, uint32_t id, const char *commands, uint32_t count,
                       uint32_t *bad);
/* Forget an object: 0 when idle (destroy it now), 1 when commands still use it or descriptors
 * the client published before this call still wait in its ring (an LS_EV_RELEASED follows once
 * they are popped and the last command retires), -ENOENT when unknown. */
int ls_engine_drop(ls_engine *e, uint32_t client, uint32_t kind, uint32_t id);

/* Faults: stop popping, answer finished work LS_EFAULT; work still running stays in flight. */
void ls_engine_set_fault(ls_engine *e, uint32_t faulted);
/* A word (uint32_t, at word_address; 0: none) that the engine sets to a client's slot + 1 while it
 * checks and records that client's descriptors, and to 0 after: a crash handler reads it to name
 * the client whose descriptor was being processed (_emergency.c, _quarantine.py). */
void ls_engine_set_busy_word(ls_engine *e, uint64_t word_address);
int ls_engine_in_flight(ls_engine *e);
/* The clients with work in flight, at most max of them; returns how many were written. */
int ls_engine_in_flight_clients(ls_engine *e, uint32_t *out, uint32_t max);

int ls_engine_events(ls_engine *e, struct ls_engine_event *out, uint32_t max);
/* A planned pass's turns, set from inside ls_engine_plan_cb. */
int ls_engine_set_plan(ls_engine *e, const struct ls_engine_turn *turns, uint32_t count);
void ls_engine_wake(ls_engine *e);
/* cdef-end */

/* Implemented in Python (cffi's extern "Python+C", declared in _build.py): called on
 * the engine thread, without the engine's lock, before each planned pass. */
void ls_engine_plan_cb(void *engine);

#endif
