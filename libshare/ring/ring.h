/*
 * libshare ring ABI: the shared-memory region between one client and the arbiter.
 *
 * This header is the single declaration source. The block between the
 * "cdef-begin" and "cdef-end" markers is fed verbatim to cffi's cdef(), and
 * bindings/c/libshare.h is generated from it, so it holds only what cffi can
 * parse: fixed-width integers, plain structs, integer #defines and prototypes.
 *
 * Region layout (every offset is a multiple of 64, the cache line):
 *
 *   0                     struct ls_region_header   magic, version, geometry
 *   128                   struct ls_bells           doorbells, flags, liveness
 *   256                   lane 0: struct ls_lane + lane_entries x struct ls_desc
 *   ...                   lane 1 .. lane_count-1
 *   cq_offset             struct ls_cq + cq_entries x struct ls_cqe
 *
 * Every structure is an ABI: fixed-width fields, explicit padding, and sizes
 * checked by static assertions in ring.c.
 */
#ifndef LIBSHARE_RING_H
#define LIBSHARE_RING_H

#include <stdint.h>

/* cdef-begin */
#define LS_RING_MAGIC 0x3152534c        /* "LSR1" read as a little-endian u32 */
#define LS_RING_VERSION 1
#define LS_CACHELINE 64
#define LS_DESC_SIZE 256                /* one submission slot: four cache lines */
#define LS_CQE_SIZE 32                  /* one completion slot */
#define LS_MAX_BUFFERS 8
#define LS_MAX_PUSH 128
#define LS_MAX_LANES 64
#define LS_MAX_ENTRIES 65536

#define LS_OP_NOP 0                     /* completes at once: a fence for the client */
#define LS_OP_DISPATCH 1
#define LS_OP_COPY 2                    /* buffer[0] -> buffer[1], size in offset[2] */
#define LS_OP_LIST 3                    /* runs command list `program` (load_list): its commands, one answer */
#define LS_OP_FILL 4                    /* buffer[0] from offset[0], offset[1] bytes (multiples of 4): the
                                           32-bit value in push[0..4), push_size 4 (vkCmdFillBuffer) */
#define LS_OP_UPDATE 5                  /* push[0..push_size) written into buffer[0] at offset[0]; push_size a
                                           multiple of 4, 4..LS_MAX_PUSH (vkCmdUpdateBuffer) */
#define LS_OP_BARRIER 6                 /* no fields: in a list, a barrier (every command already ends with
                                           one: it costs nothing); alone, answered in order like a NOP */
#define LS_OP_DISPATCH_INDIRECT 7       /* a dispatch (program, buffer[], offset[], push[]) whose three uint32
                                           group counts the device reads at run time from buffer groups[0] at
                                           byte offset groups[1] | (uint64)groups[2] << 32, clamped by the
                                           engine (recordings.c, "Indirect dispatches") */
#define LS_OP_TIMESTAMP 8               /* the device's timestamp once the commands before it have ended, a
                                           uint64 into buffer[0] at offset[0] (a multiple of 8, 16 bytes inside
                                           the buffer), and its availability, a uint64 1, at offset[0] + 8
                                           (recordings.c, "Timestamps"); LS_EUNSUPPORTED without timestamps */
#define LS_OP_MAX 8
#define LS_OP_BAD 0xffff               /* set by the consumer on a slot that failed ls_desc_check */
#define LS_DESC_GROUP 1                 /* flags: a dispatch whose bindings come from bind group buffer[0]
                                           (nbuffers 0; engine/validate.c) */

#define LS_DESC_SUBMISSION_PUSH 2       /* flags: a list's dispatch takes the push constants of the LS_OP_LIST
                                           that submits it (its own push_size 0) */
#define LS_DESC_BASE 4                  /* flags, with LS_DESC_GROUP on an LS_OP_DISPATCH: its workgroups start
                                           at (buffer[1], buffer[2], buffer[3]), not 0 (vkCmdDispatchBase);
                                           each start plus its count at most the device's limit */
#define LS_LIST_ARG 0x80000000          /* a list command's buffer id LS_LIST_ARG | k: the buffer in slot k of the
                                           LS_OP_LIST that submits it (no object id has this bit) */

#define LS_SPIN_NS 50000                /* a waiter polls this long, yielding its core at each look,
                                           before it sleeps (see ring_wait_for in wake.c) */
#define LS_SPIN_YIELD 0                 /* spin modes (ls_set_spin_mode): yield the core at each look, */
#define LS_SPIN_KEEP 1                  /* keep it (and spin only while waits end within the spin), */
#define LS_SPIN_NONE 2                  /* or sleep at once */
#define LS_NEED_WAKEUP 1                /* in sq_flags / cq_flags: the sleeper wants a wake */
#define LS_NEED_WAKEUP_FD 2             /* in cq_flags: an async waiter wants a byte on its doorbell socket */
#define LS_NEED_ROOM 4                  /* in sq_flags: the consumer waits for the client to read completions */

#define LS_PEER_ALIVE 1                 /* in *_state */
#define LS_PEER_CLOSED 2

/* Errors returned as negative numbers, beside the usual -errno values. */
#define LS_ECORRUPT 1001                /* header or index failed validation */
#define LS_EPEERDEAD 1002               /* the other side died or closed */
#define LS_EBADSLOT 1003                /* a slot's fields are out of range */
/* Completion statuses the arbiter posts for a rejected or failed descriptor. */
#define LS_ENOPROGRAM 1004              /* program id unknown to this client */
#define LS_ENOBUFFER 1005               /* buffer id unknown to this client */
#define LS_EBINDINGS 1006               /* buffer count differs from the program's bindings */
#define LS_ERANGE 1007                  /* offset or size outside the buffer, or misaligned */
#define LS_EGROUPS 1008                 /* a group count is 0 or beyond the device limit, or their product
                                           is past 2^32 - 1 (an indirect dispatch's, read on the device: past
                                           the limit or the product; it ran nothing) */
#define LS_EPUSH 1009                   /* more push-constant bytes than the program declares */
#define LS_EFAULT 1010                  /* the device faulted while running it */
#define LS_ECANCELED 1011               /* cancelled: the client was terminated or closed */
#define LS_EMOVED 1012                  /* not run: the arbiter handed over; send it to the new one */
#define LS_EUNSUPPORTED 1013            /* the arbiter's device cannot run this operation (LS_OP_TIMESTAMP:
                                           its queue has no timestamps) */

/* A dispatch descriptor: one submission slot, 256 bytes. */
struct ls_desc {
    uint64_t ticket;                    /* client's cookie, echoed in the completion */
    uint32_t program;                   /* program id from load_program */
    uint16_t opcode;                    /* LS_OP_* */
    uint8_t  nbuffers;                  /* buffers used, 0..LS_MAX_BUFFERS */
    uint8_t  push_size;                 /* bytes of push[] used, 0..LS_MAX_PUSH */
    uint32_t groups[3];                 /* workgroup counts x, y, z (LS_OP_DISPATCH_INDIRECT: their buffer,
                                           and their byte offset's low and high words) */
    uint32_t flags;                     /* LS_DESC_* bits; 0 unless one says otherwise */
    uint32_t buffer[8];                 /* buffer ids */
    uint64_t offset[8];                 /* byte offset into each buffer */
    uint8_t  push[128];                 /* inline push constants */
};

/* A completion: one completion slot, 32 bytes. */
struct ls_cqe {
    uint64_t ticket;                    /* the descriptor's ticket */
    int32_t  status;                    /* 0 or a negative LS_E* / -errno code */
    uint32_t flags;                     /* reserved, 0 */
    uint64_t device_ns;                 /* device time the work took, 0 if unmeasured */
    uint64_t reserved;
};

/* Offset 0 of every region. Written once by the creator; never trusted after attach. */
struct ls_region_header {
    uint32_t magic;                     /* LS_RING_MAGIC */
    uint32_t version;                   /* LS_RING_VERSION */
    uint64_t region_size;               /* bytes mapped, page multiple */
    uint32_t lane_count;                /* submission lanes, 1..LS_MAX_LANES */
    uint32_t lane_entries;              /* slots per lane, power of two */
    uint32_t cq_entries;                /* completion slots, power of two */
    uint32_t desc_size;                 /* LS_DESC_SIZE */
    uint32_t cqe_size;                  /* LS_CQE_SIZE */
    uint32_t creator_pid;
    uint64_t lanes_offset;
    uint64_t lane_stride;               /* bytes from one lane to the next */
    uint64_t cq_offset;
    uint8_t  reserved[64];
};

/* Doorbells and liveness, one cache line per direction. */
struct ls_bells {
    uint32_t sq_flags;                  /* LS_NEED_WAKEUP: consumer is (about to be) asleep */
    uint32_t sq_bell;                   /* futex word the consumer sleeps on */
    uint32_t consumer_pid;
    uint32_t consumer_state;            /* LS_PEER_ALIVE / LS_PEER_CLOSED */
    uint32_t close_reason;              /* why the consumer closed: 0, LS_ECANCELED, LS_EFAULT or LS_EMOVED */
    uint8_t  pad0[44];
    uint32_t cq_flags;                  /* LS_NEED_WAKEUP: client is (about to be) asleep */
    uint32_t cq_bell;                   /* futex word the client sleeps on */
    uint32_t client_pid;
    uint32_t client_state;
    uint8_t  pad1[48];
};

/* One submission lane: a single-producer ring owned by one thread at a time. */
struct ls_lane {
    uint32_t tail;                      /* slots published; producer store-release */
    uint32_t reserved_tail;             /* tail + slots being written; == tail when idle */
    uint32_t owner_tid;                 /* 0 when free; claimed by compare-and-swap */
    uint32_t owner_pid;
    uint8_t  pad0[48];
    uint32_t head;                      /* slots consumed; consumer store-release */
    uint32_t unused;                    /* 0 */
    uint8_t  pad1[56];
};

/* The completion ring's indexes; cq_entries struct ls_cqe follow. */
struct ls_cq {
    uint32_t tail;                      /* completions posted; arbiter store-release */
    uint8_t  pad0[60];
    uint32_t head;                      /* completions seen; client store-release */
    uint8_t  pad1[60];
};

/* Why the consumer rejected a region: filled by ls_last_error(). */
struct ls_error_info {
    int32_t  code;                      /* the negative code last returned */
    uint32_t lane;                      /* lane involved, or 0xffffffff */
    uint32_t head;
    uint32_t tail;
    uint32_t capacity;
    uint32_t field;                     /* LS_EBADSLOT: which check failed, see ls_desc_check */
};

typedef struct ls_region ls_region;     /* process-private view of a mapped region */
typedef struct ls_producer ls_producer; /* one thread's claim on one lane */

/* Geometry. */
int64_t ls_region_size(uint32_t lane_count, uint32_t lane_entries, uint32_t cq_entries);
/* Write a new region's header and zero its indexes (not its slots: see ring.c). */
int ls_region_format(void *base, uint64_t size, uint32_t lane_count,
                     uint32_t lane_entries, uint32_t cq_entries, uint32_t creator_pid);

/* Attach to a mapped region: validates the header and copies its geometry. */
int ls_region_open(void *base, uint64_t mapped_size, ls_region **out);
void ls_region_close(ls_region *r);
struct ls_region_header *ls_region_header_of(ls_region *r);
struct ls_bells *ls_region_bells(ls_region *r);
void ls_last_error(ls_region *r, struct ls_error_info *out);

/* Liveness: each side announces itself; waiters check the other side's pidfd. */
void ls_set_consumer(ls_region *r, uint32_t pid, uint32_t state);
void ls_set_client(ls_region *r, uint32_t pid, uint32_t state);
/* Close the consumer side for a reason the client can read: 0 (shut down), LS_ECANCELED
 * (the operator terminated the client), LS_EFAULT (the device faulted) or LS_EMOVED (the
 * arbiter handed over to a new one). Wakes waiters. */
void ls_close_consumer(ls_region *r, uint32_t reason);
uint32_t ls_close_reason(const ls_region *r);
void ls_set_peer_pidfd(ls_region *r, int pidfd);
/* The doorbell socket: the client rings the consumer there (8 bytes instead of a futex wake), and the
 * consumer, given its own end, sends a byte there to wake an async waiter (LS_NEED_WAKEUP_FD). */
void ls_set_wake_fd(ls_region *r, int doorbell_fd);
/* How this view's waits spin before they sleep (see ring_wait_for in wake.c): LS_SPIN_YIELD, the
 * default, LS_SPIN_KEEP (a realtime session's) or LS_SPIN_NONE (a low-priority one's). */
int ls_set_spin_mode(ls_region *r, uint32_t mode);

/* Producer side (client threads): claim a lane once, then push through it. */
int ls_producer_open(ls_region *r, uint32_t tid, uint32_t pid, ls_producer **out);
void ls_producer_close(ls_producer *p);
int ls_producer_lane(ls_producer *p);
/* How many of the descriptors this producer published the consumer has not taken (the last ones it
 * pushed), or -LS_ECORRUPT: once the consumer is dead, the work that never ran. */
int ls_producer_unconsumed(ls_producer *p);
int ls_push(ls_producer *p, const char *descs, uint32_t count);
int ls_reserve(ls_producer *p, uint32_t count, struct ls_desc **slots);
int ls_commit(ls_producer *p, uint32_t count);
/* Encode one operation into the lane's next slot and publish it (the client's one encoder):
 * opcode, LS_OP_* in its low 16 bits and the descriptor's flags (LS_DESC_*) in its high 16 (with
 * LS_DESC_GROUP, nbuffers is 1 and buffers[0] the bind group's id: the slot's nbuffers is 0; with
 * LS_DESC_BASE too, nbuffers is 4, buffers[1..3] the first workgroup),
 * buffers[nbuffers] ids, offsets[noffsets] byte offsets (LS_OP_COPY: source, destination, size),
 * push[push_size] bytes; the rest of the slot is zeroed. Returns 1, 0 when the lane is full,
 * -LS_EBADSLOT (opcode, nbuffers, noffsets or push_size out of range), -EINVAL (a NULL array
 * with a count), -LS_EPEERDEAD (the consumer closed its side) or -LS_ECORRUPT. */
int ls_push_op(ls_producer *p, uint64_t ticket, uint32_t opcode, uint32_t program, uint32_t groups_x,
               uint32_t groups_y, uint32_t groups_z, uint32_t nbuffers, const uint32_t *buffers,
               uint32_t noffsets, const uint64_t *offsets, const void *push, uint32_t push_size);
int ls_space(ls_producer *p);
/* The same encoding and check into slot (LS_DESC_SIZE bytes, ticket 0) rather than a lane: a command
 * of a command list (the load_list request). Returns 1, -LS_EBADSLOT or -EINVAL (slot NULL, or a
 * NULL array with a count). */
int ls_encode_op(char *slot, uint32_t opcode, uint32_t program, uint32_t groups_x, uint32_t groups_y,
                 uint32_t groups_z, uint32_t nbuffers, const uint32_t *buffers, uint32_t noffsets,
                 const uint64_t *offsets, const void *push, uint32_t push_size);

/* Consumer side (arbiter). */
int ls_sq_pop(ls_region *r, char *out, uint32_t max);
int ls_sq_pending(ls_region *r);
/* The lanes' published tails now, into marks[max]: once the consumer has popped up to them
 * (ls_sq_passed), it has popped every descriptor published before this call. Returns the number
 * of lanes, -EINVAL when max is too small, or -LS_ECORRUPT. */
int ls_sq_marks(ls_region *r, uint32_t *marks, uint32_t max);
/* 1 once this consumer's heads have reached marks[n] (from ls_sq_marks) in every lane, else 0. */
int ls_sq_passed(ls_region *r, const uint32_t *marks, uint32_t n);
int ls_sq_wait(ls_region *r, int64_t spin_ns, int64_t timeout_ns);
int ls_sq_arm(ls_region *r);
/* Ask to be woken when the client reads a completion (LS_NEED_ROOM instead of LS_NEED_WAKEUP), then
 * look: the completion ring's free slots (ls_cq_space). For a consumer whose client has work
 * waiting but no free completion slot for its answer. */
int ls_sq_arm_room(ls_region *r);
void ls_sq_disarm(ls_region *r);
int ls_desc_check(const struct ls_desc *d);

/* Completion ring: the arbiter posts, the client peeks and waits. */
int ls_cq_post(ls_region *r, const char *cqes, uint32_t count);
int ls_cq_space(ls_region *r);
int ls_cq_pop(ls_region *r, char *out, uint32_t max);
int ls_cq_ready(ls_region *r);
int ls_cq_wait(ls_region *r, uint32_t min_ready, int64_t spin_ns, int64_t timeout_ns);
/* For a waiter that polls the doorbell socket (an event loop): ask the arbiter for a byte on it
 * with the next completion (LS_NEED_WAKEUP_FD), then look; how many completions are ready. */
int ls_cq_arm(ls_region *r);

/* The ticket book (tickets.c): a client's tickets in flight and what each came to, one per
 * session, shared by the C API and the Python session. The caller is the completion ring's one
 * consumer while it collects or waits; the book locks only itself. */
typedef struct ls_tickets ls_tickets;
#define LS_TICKET_NONE 0                /* no record: never pushed, taken already, forgotten or dropped */
#define LS_TICKET_PENDING 1
#define LS_TICKET_DONE 2
int ls_tickets_new(ls_tickets **out);
void ls_tickets_free(ls_tickets *t);
/* ls_push_op, and once it pushed (1), the ticket recorded pending in the same hold of the book's
 * lock; ls_push_op's result, -ENOMEM (no room for the record: nothing pushed) or -EEXIST. */
int ls_tickets_push(ls_tickets *t, ls_producer *p, uint64_t ticket, uint32_t opcode, uint32_t program,
                    uint32_t groups_x, uint32_t groups_y, uint32_t groups_z, uint32_t nbuffers,
                    const uint32_t *buffers, uint32_t noffsets, const uint64_t *offsets, const void *push,
                    uint32_t push_size);
/* Record a ticket pending without pushing (its descriptor went another way): 0, -ENOMEM, -EEXIST. */
int ls_tickets_add(ls_tickets *t, uint64_t ticket);
/* Pop every ready completion of r and file it; how many were popped, or the ring's error. */
int ls_tickets_collect(ls_tickets *t, ls_region *r);
/* One wait step: collect; if `ticket` (0: any ticket) is still pending, wait for the next completion
 * (spin_ns, then sleep) up to timeout_ns and collect. The ticket's LS_TICKET_* state (pending after a
 * timeout), or the ring's error (-LS_EPEERDEAD: the arbiter is gone). With `status` not NULL, a done
 * ticket's outcome is taken as by ls_tickets_take. */
int ls_tickets_wait(ls_tickets *t, ls_region *r, uint64_t ticket, int64_t spin_ns, int64_t timeout_ns,
                    int32_t *status, uint64_t *device_ns);
/* The ticket's state (0: LS_TICKET_PENDING while any is pending); no change. */
int ls_tickets_state(ls_tickets *t, uint64_t ticket);
/* The ticket's state; when done, its status and device time, and its record goes. */
int ls_tickets_take(ls_tickets *t, uint64_t ticket, int32_t *status, uint64_t *device_ns);
/* Nobody will ask for these: a done record goes, a pending one's completion is dropped when read. */
void ls_tickets_forget(ls_tickets *t, const uint64_t *tickets, uint32_t count);
/* File a completion read elsewhere for a pending ticket (-LS_EMOVED marks it moved, as a completion
 * would): 1, or 0 when it is not pending. */
int ls_tickets_settle(ls_tickets *t, uint64_t ticket, int32_t status, uint64_t device_ns);
/* Every pending ticket done with `status` (forgotten ones go); how many were pending. */
uint32_t ls_tickets_fail_pending(ls_tickets *t, int32_t status);
/* The record goes, whatever its state. */
void ls_tickets_drop(ls_tickets *t, uint64_t ticket);
/* The pending tickets (up to max of them, each with its LS_TICKET_MOVED and LS_TICKET_ORPHAN marks in
 * marks[], which may be NULL); how many are pending in all. */
#define LS_TICKET_MOVED 1               /* the arbiter answered -LS_EMOVED: handed over, not run */
#define LS_TICKET_ORPHAN 2              /* forgotten: its completion is dropped when read */
int ls_tickets_list(ls_tickets *t, uint64_t *tickets, uint8_t *marks, uint32_t max);
/* Clear every -LS_EMOVED mark: those tickets were sent to a new arbiter. */
void ls_tickets_resent(ls_tickets *t);
uint32_t ls_tickets_pending(ls_tickets *t);
/* The count of completions filed with -LS_ECANCELED so far (the arbiter ended the session), to
 * compare: the word itself, read by the completion ring's reader after its own collect. */
const uint64_t *ls_tickets_cancelled(ls_tickets *t);

/* Futex helpers, exposed for tests and for callers with their own words. */
int ls_futex_wait(uint32_t *word, uint32_t expected, int64_t timeout_ns);
int ls_futex_wake(uint32_t *word, int32_t count);
/* cdef-end */

#endif
