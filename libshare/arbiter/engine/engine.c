/*
 * The arbiter's engine: the data path, in C, on its own thread.
 *
 * Design
 * ------
 * One thread loops over three steps, holding the engine's mutex for a step at a
 * time and never across a sleep or a call into Python:
 *
 *   retire   the oldest submissions whose fence has signalled: read their
 *            timestamps, post one completion per descriptor (and the fences,
 *            LS_OP_NOPs, that wait on it), release the objects they used;
 *   drain    pop each waiting client's descriptors (at most what its completion
 *            ring can still answer), check each against the client's object table
 *            (ls_desc_check ran on the private copy in ls_sq_pop; this is the rest
 *            of the one validator), look each valid one up in the client's
 *            recordings (below) and submit the pass's recordings in one pooled
 *            primary command buffer (vkCmdExecuteCommands) with one fence;
 *   wait     with work in flight, poll the oldest fence (and the rings, while
 *            another submission may go) if it holds a command or two, else sleep
 *            on it (in naps while another submission may go: polling through a
 *            longer one cost as much CPU as lavapipe spent running it); with none,
 *            watch the rings for spin_ns after work (a client that waits for each
 *            completion pushes its next descriptor microseconds later), then arm
 *            every ring (NEED_WAKEUP) and sleep in ppoll() on the engine's eventfd
 *            and every heard doorbell. A client with work in its ring and no free
 *            completion slot for its answer is not waiting (takeable): its ring is
 *            armed with LS_NEED_ROOM as well, and its next read of completions rings
 *            its doorbell (polled, such a ring kept a core busy for as long as its
 *            client chose not to read, and fairshare counted it as least served). Measured on lavapipe with 8 clients, most of
 *            the arbiter's time went to futex sleeps and wake-ups (61% in the
 *            kernel), so the steady state polls where a wait is short. Placed
 *            (ls_engine_place: the daemon has put this thread and the driver's on
 *            one core, _placement.py), every poll yields that core between looks,
 *            since what the engine waits for (lavapipe's queue thread running the
 *            submission) needs it; see "Cores" below.
 *
 * Recordings. Each client's descriptors are recorded once per distinct content
 * (everything but the ticket): bind, push descriptors, push constants, dispatch
 * or copy and one barrier, into a secondary command buffer with
 * SIMULTANEOUS_USE (so several submissions may run it at once), cached by a hash
 * of the content in the client's table of at most CACHE_MAX, least recently used
 * first out (never one still in flight: past CACHE_MAX with all in flight, a
 * recording is made for the one use). check_desc runs on every descriptor all the
 * same; a hit only saves the recording. Lavapipe copies every recorded command
 * into allocations of its own, freed at the next reset (10 or so mallocs and
 * frees per dispatch): popping, checking, recording and submitting took 0.8 us
 * of the engine's time per tiny dispatch, 0.2 us with hits. A recording names
 * its client's objects by the ids of its key, and ls_engine_drop (and removing
 * the client) forgets every recording that names the object, before its handle
 * can be destroyed; one still in flight is reused only once it retires.
 *
 * Lingering. On lavapipe the costs of a submission (vkQueueSubmit waking the
 * queue thread, its sleep after, the engine's sleep on the fence and its wake-up:
 * a timed futex sleep costs 10 to 20 us of CPU in this VM) are paid per
 * submission, and a client that pushes tiny dispatches one by one from Python
 * (one per 2.5 us) is slower than the device: each pass took the few that had
 * arrived, and the engine spent 1 to 2 us per dispatch submitting and waiting.
 * So when nothing runs and every command popped comes from a streaming client
 * (one with completions it has not read: it pushes without waiting for answers),
 * the open submission lingers up to LINGER_NS (200 us), while it holds fewer
 * than LINGER_BATCH commands, taking what arrives meanwhile: the engine sleeps
 * on the bells of every other client (their pushes end the wait, and their work
 * makes the submission urgent) and on its eventfd. A client that waits for each
 * answer (its completion ring read) is never delayed, nor is planned work (the
 * scheduler decides there), nor work while a fault is being handled; a
 * streaming client's work waits at most LINGER_NS more, when the device is idle.
 *
 * Policy. With policy.planned == 0 every waiting client gets all it has, in turn
 * (round robin start), in one submission. With planned == 1 the engine calls
 * ls_engine_plan_cb (Python, the scheduler) before a pass; it reads the
 * clients' counters and sets the pass's turns with ls_engine_set_plan, and the
 * engine pops exactly that, one submission per rank. A plan holds for later
 * passes while the same clients wait and as many submissions run, for at most
 * policy.plan_ns (1 ms): the scheduler's picture (device time decaying over
 * 250 ms, slices of 200 us) changes little within it, and a client that starts
 * waiting, a realtime one say, is planned for at once. An empty plan holds too:
 * asked again at every look, the scheduler (and the GIL) was called 50,000
 * times a second while one low-priority dispatch ran and the next one waited.
 * Nor is work that the plan keeps waiting work to wake for: while a submission
 * runs, the engine sleeps on its fence (work_waiting, new_only) until other clients
 * wait than those the last pass withheld. Looking again at once, the engine
 * polled at half a core while low-priority work waited behind a running one,
 * on the core where lavapipe's queue thread runs that work: in bench 2 of
 * test_scheduler_bench.py the queue thread waited 665 ms for the core in 1.5 s
 * (p99 1.9 ms a wait), and the realtime client's round trip took 400-490 us
 * (p50) where the low commands ahead of it ran 280 us each.
 * A pass submits each rank of its plan separately, so that a higher priority's
 * fence never waits for lower work, and the lower submission waits in the engine
 * until every higher one in flight has ended (deferred): submitted behind it, it
 * ran on lavapipe's queue thread as soon as the higher one ended, on the core the
 * engine shares with that thread, and the engine got the core back to answer the
 * higher priority's client only once it had run (180 us in bench 2, for a 2 us
 * realtime dispatch behind 75 us low ones). The device idles meanwhile for as
 * long as the engine takes to retire one submission and submit the next.
 * The control plane switches to planned only when clients differ (priorities,
 * compute shares, fairshare), so the common case never touches the GIL.
 *
 * Pieces. A device that cannot preempt makes a realtime dispatch that comes while
 * a low one runs wait for all that is left of it: in bench 2 of
 * test_scheduler_bench.py (240 us low commands) the realtime p99 was 2.6-3.2x its
 * p99 alone, and that floor alone lay above the 2x target in two runs of three.
 * So while a higher priority is active, the scheduler's turn for lower work
 * carries cut_us (50 us, or the top priority's own command length if longer:
 * _scheduler.py, _cut_ns) and takes one command, and a dispatch estimated (below)
 * at over CUT_OVER times cut_us runs in pieces: each a
 * vkCmdDispatchBase over a slice of its workgroups along its longest dimension,
 * recorded on its own and submitted alone, LS_ENGINE_MAX_PIECES at most. A piece
 * goes on the device only when nothing else is there: at once when no client of
 * a higher rank than the cut's waits (piece_now, without asking the scheduler,
 * whose turn holds for every piece of its command: asked between two pieces, it
 * kept the device idle meanwhile), else at the client's next turn. So a realtime
 * dispatch waits for one piece at most. One lower command in all holds across
 * the passes of a cut: while one is under way, a cut turn of its rank begins no
 * new command and goes to that cut instead (cut_under_way). Each realtime
 * arrival's plan gives the lower clients a turn, and another client's command
 * went in between two pieces at each (a third review: a cut client got 0.15 s
 * of device time a second against an uncut neighbour's 0.65, and two cut
 * clients split 2:1); with the turn merely refused, the plan's one lower turn
 * kept going to the refused client, never to the cut (7 low clients got no
 * device time in 4 s). The workgroups of a dispatch run in any
 * order and may not wait for each other, so the pieces compute what the whole
 * does, but for a shader that reads gl_NumWorkGroups (each piece sees its own
 * count): its program is not cuttable (_spirv.py finds the built-in). Pipelines
 * are made with VK_PIPELINE_CREATE_DISPATCH_BASE_BIT. The estimate is the most
 * device time per workgroup that a timed dispatch of the client has taken, all
 * its pieces together, whatever its program (untimed, nothing is cut); a client
 * with none yet has its dispatches run in as many pieces as may be. Each
 * narrower estimate was lied to by a hostile-tenant review: a recording's own
 * last run went uncut when a push constant changed at every dispatch (a
 * realtime p99 of 62 ms behind 60 ms dispatches, 1.1 ms when they were alike),
 * and a program's worst when each heavy dispatch came from a new program first
 * run on empty workgroups (every one of 98 ran whole). A client can only raise
 * the worst it has shown, which cuts its own work finer; a new session starts
 * over, so one heavy dispatch per session can run whole, as every dispatch did
 * before pieces. No cut splits a workgroup: the pieces of a dispatch whose
 * workgroups differ in cost are uneven, and one workgroup's run (which the
 * watchdog bounds) is the least a realtime dispatch may wait. The cut holds the
 * dispatch's objects until its last piece is in a flight; each piece's entry
 * holds them too, and only the last answers, with the device time of all (and
 * the first failure among them). A client closed or dropped mid-cut: the rest
 * never runs, and the ticket is answered (LS_ECANCELED, or the close's reason) as
 * the piece on the device retires; a hand-over (LS_EMOVED) runs the rest at once, in
 * one piece (what runs is finished); a fault answers LS_EFAULT. Bench 2, three
 * runs: realtime p99 1.25x, 1.19x and 1.13x its p99 alone (2.46x and 2.48x
 * whole, the same day); the low clients got 2.45-2.52 s of device time in 4 s
 * instead of 3.45 s, for the device idles between two pieces while the engine
 * retires one and records the next (about 24 us, by the counts), and their
 * dispatches ran in 7.9-8.9 pieces where about 5 would do (a client's worst
 * includes this VM's slow moments). A client whose worst is high has even its
 * cheap dispatches cut, 64 pieces at most: such a command costs the device up to
 * 64 of those gaps, as a dispatch of that length (about 1.5 ms) would. So a cut
 * command is billed (charged_ns_since) the time each piece's submission held the
 * device, gaps included, where its ticket says its device time: billed device
 * time alone, a review's four such clients took 37% of a fifth low client's
 * device time, and fairshare would take them for the least served. (Throughput
 * mode gives turns by command, so there they take what 1.5 ms dispatches would.)
 *
 * Cores. Lavapipe (Mesa 22.3 with LLVM 15 here) exposes one queue and runs a
 * whole dispatch on its queue thread: a 64-workgroup dispatch kept 0.99 of a
 * core busy with LP_NUM_THREADS at 2 or 4. So the engine does not run shaders
 * itself: its thread pops, checks, looks up, submits and answers while
 * lavapipe's queue thread runs the previous submission (two may be in flight),
 * which puts the arbiter on both cores of this machine, and the clients' own
 * work runs wherever the scheduler puts it. Shaders on both cores at once
 * would take one VkDevice per core, each client's objects on its device and
 * one engine each; not done, because it splits the scheduler's one view of the
 * device (priorities and shares would hold per device only). A GPU runs a
 * submission's work in parallel itself.
 *
 * Where the two threads run matters more than how many there are. On this
 * 2-core VM a wake-up across cores costs more than a tiny dispatch (a socket
 * ping-pong: 13 us on one core, 33 us across two), and a direct submit-and-wait
 * takes 19-25 us with lavapipe's thread on the caller's core against 84-112 us
 * across. So a daemon on a CPU device puts the engine and the driver's threads
 * on one core and its Python threads on the others (_placement.py), and the
 * engine's polls then yield that core at each look (poll_step): a poll that
 * kept it held off the queue thread it waited for. A yield can also hand the
 * core to an unrelated busy thread for a whole time slice, so one that lost the
 * core for over YIELD_LOST_NS stops the yields for YIELD_PAUSE_NS: the polls
 * keep the core meanwhile, as unplaced (a fence poll's loss stops every poll's
 * yields, a spin's only the spins': poll_step says why). Moving the engine off its core for that
 * time instead (to any of the arbiter's cores) was worse: with two busy
 * processes on the 2-core VM the round trip's p99 was 3.9-4.0 ms in three runs
 * of three moving, 0.15-2.8 ms staying (one busy process: 164-218 us against
 * 99-184 us). Measured on the 2-core VM, three rounds
 * alternating, the clients' waits yielding too (ring.c): eight Python clients
 * against eight private devices 0.93-1.12x placed and yielding, 0.88-0.98x
 * unplaced and yielding, 0.58-0.62x unplaced with polls that keep the core;
 * the tiny round trip 20.8-24.2 us, 18.8-49.0 us and 32-55 us. An embedded
 * arbiter is not placed (its process's other threads are the application's).
 *
 * Lifetime. Every command holds a count on the program and buffers it names;
 * ls_engine_drop of an object still counted marks it, and the last retirement
 * queues LS_EV_RELEASED so that the control plane destroys it then. A drop
 * while descriptors that the client published before it still wait in its ring
 * waits for them to be popped (defer_drop), as the plan pops them, so that they
 * find the object. A closing
 * client is drained of nothing more, and LS_EV_IDLE says when its last
 * descriptor has been answered.
 *
 * Doorbells.
 * Each client has a doorbell of its own, and a doorbell rings one way: it is a
 * datagram socket pair made at hello, of which the client gets one end, and
 * what it writes there arrives at the other end, which only the arbiter holds,
 * until the client is reclaimed. A client can ring nothing but its own bell,
 * and cannot read a ring at all: with one eventfd shared by everyone, a client
 * that read it in a loop swallowed the others' wake-ups, and each of their round
 * trips waited out the 2 s poll. Nor can it make the arbiter's read block
 * (O_NONBLOCK belongs to the open file, which an eventfd shares with the client).
 * A pipe would do as much, but a ring after the arbiter died would raise SIGPIPE
 * in the client (a C program embedding libshare dies of it); a socket refuses.
 * What a bell still costs the others is wake-ups, so they are budgeted. A wake-up
 * by a bell is charged to its client when its ring holds nothing and nothing was
 * popped from it since its last ring (a ring that raced a drain pass is not
 * charged, so an honest client, which rings only after a push, never is). A
 * client may cause 32 such wake-ups at once and 32 a second after that (a token
 * bucket); past that the arbiter stops listening to its bell for 1 s (a line in
 * the log the 1st, 2nd, 4th, 8th... time). Its work is still picked up, on the
 * slow path: by every wake-up something else brings, and at least every 20 ms
 * (the poll timeout while any bell is muted). A client ringing in a tight loop
 * thus costs the arbiter about 32 short wake-ups and 50 slow looks a second
 * instead of a core, and the others nothing they can measure; it waits up to
 * 20 ms for its own work while it is not heard.
 */
#define _GNU_SOURCE
#include "engine.h"
#include "ring.h"
#include "sync.h"

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>

#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define NFLIGHT 8                       /* submission slots */
#define PROGRESS_OFFSET (8 * (LS_ENGINE_MAX_BATCH + 1))  /* the progress word, past the timestamps */
#define IDLE_NS 2000000000LL            /* sleep on the bells this long when idle */
#define MUTED_NS 20000000LL             /* ... while a doorbell is muted */
#define LINGER_NS 200000LL              /* hold a small submission of streaming clients this long */
#define LINGER_BATCH 128                /* ... while it has fewer commands than this */
#define FENCE_SLICE_NS 20000000LL       /* wait on the oldest fence this long, then look again */
#define FENCE_NAP_NS 25000LL            /* ... at least this long while another submission may go */
#define FENCE_SPIN_COMMANDS 2           /* poll the fence of a submission of at most this many commands */
#define YIELD_LOST_NS 500000LL          /* a yield that lost the core this long ... */
#define YIELD_PAUSE_NS 50000000LL       /* ... stops the polls' yields this long */
#define BELL_CREDIT 32.0
#define BELL_REFILL 32.0                /* credits per second */
#define BELL_PENALTY_NS 1000000000LL
#define BELL_READS 256
#define NO_FENCE (-1)
#define CACHE_MAX 64                    /* recordings a client keeps */
#define CACHE_BUCKETS 128
#define PIECE 1                         /* entry.piece */
#define LAST_PIECE 2
#define CUT_OVER 1.5                    /* a dispatch runs in pieces past this many cut_us */
#define UNRANKED INT32_MAX

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* ------------------------------------------------------------------ objects */

struct object {
    uint32_t id, kind;
    uint32_t in_flight;                 /* commands submitted and not retired */
    uint32_t freed;                     /* dropped by the control plane */
    uint64_t handle, layout, size;      /* VkBuffer + size, or VkPipeline + layout */
    uint32_t bindings, push_size;
    uint32_t client;
    uint32_t cuttable;                  /* a program whose dispatches may run in pieces (LS_ENGINE_CUTTABLE) */
};

/* Open addressing, keyed by (kind, id), with linear probes. A removed slot holds the table's
 * own address (a tombstone), so probes go on past it. Live entries and tombstones together
 * never fill more than half the slots, so every probe ends at an empty one. When they would,
 * the table is rebuilt without its tombstones at the size its live entries need: a client that
 * allocates and frees for ever keeps a table of constant size.
 *
 * The ids are the client's to choose (a reattaching session names them, any increasing ids up
 * to 2^31), so the hash is keyed: each rebuild draws two random words, and the id passes through
 * murmur3's finaliser twice with a word mixed in before each. Unkeyed, a client that inverted
 * the finaliser picked 4,096 ids of one probe run, and every lookup of its dispatches walked it
 * (the engine's CPU per descriptor went from 3.7 to 28 us, for every client). A put that still
 * probes past PROBE_LIMIT draws new words and rebuilds. */
#define PROBE_LIMIT 64

struct table {
    struct object **slots;
    uint32_t cap, used, live;           /* used: live entries and tombstones */
    uint32_t longest;                   /* the most slots a put has probed (ls_engine_stats) */
    uint32_t key[2];
};

static uint32_t fmix32(uint32_t h)
{
    h ^= h >> 16, h *= 0x85ebca6bu;
    h ^= h >> 13, h *= 0xc2b2ae35u;
    return h ^ (h >> 16);
}

static uint32_t hash_key(const struct table *t, uint32_t kind, uint32_t id)
{
    return fmix32(fmix32(id ^ t->key[0]) ^ t->key[1] ^ kind);
}

static int is_taken(const struct table *t, const struct object *o) { return o && o != (const struct object *)t; }

static struct object **table_find(struct table *t, uint32_t kind, uint32_t id)
{
    if (!t->cap)
        return NULL;
    for (uint32_t i = hash_key(t, kind, id) & (t->cap - 1);; i = (i + 1) & (t->cap - 1)) {
        struct object *o = t->slots[i];
        if (!o)
            return NULL;
        if (is_taken(t, o) && o->id == id && o->kind == kind)
            return &t->slots[i];
    }
}

/* Where o goes: the first free slot (or tombstone) of its probe run; *probes: the slots looked at. */
static uint32_t table_slot(const struct table *t, const struct object *o, uint32_t *probes)
{
    uint32_t i = hash_key(t, o->kind, o->id) & (t->cap - 1);
    for (*probes = 1; is_taken(t, t->slots[i]); ++*probes)
        i = (i + 1) & (t->cap - 1);
    return i;
}

/* Rebuild with room for live entries to double before the next rebuild, tombstones gone, and a
 * new key. */
static int table_rebuild(struct table *t, uint32_t live)
{
    uint32_t cap = 16, probes;
    while (cap < 4 * live)
        cap *= 2;
    struct object **old = t->slots, **slots = calloc(cap, sizeof *slots);
    if (!slots)
        return -ENOMEM;
    uint32_t old_cap = t->cap;
    if (getrandom(t->key, sizeof t->key, 0) != sizeof t->key)
        t->key[0] += 0x9e3779b9u, t->key[1] ^= (uint32_t)now_ns();  /* no entropy: a new key all the same */
    t->slots = slots, t->cap = cap, t->used = t->live = 0;
    for (uint32_t k = 0; k < old_cap; k++) {
        if (!is_taken(t, old[k]))
            continue;
        slots[table_slot(t, old[k], &probes)] = old[k];
        t->used++, t->live++;
    }
    free(old);
    return 0;
}

/* Add o, whose (kind, id) the table does not hold. */
static int table_put(struct table *t, struct object *o)
{
    if (2 * (t->used + 1) > t->cap) {
        int rc = table_rebuild(t, t->live + 1);
        if (rc < 0)
            return rc;
    }
    uint32_t probes, i = table_slot(t, o, &probes);
    if (probes > PROBE_LIMIT && table_rebuild(t, t->live + 1) == 0)
        i = table_slot(t, o, &probes);
    t->longest = probes > t->longest ? probes : t->longest;
    t->used += !t->slots[i];            /* a tombstone reused was counted already */
    t->live++;
    t->slots[i] = o;
    return 0;
}

static void table_remove(struct table *t, struct object **slot)
{
    *slot = (struct object *)t;
    t->live--;
}

/* ------------------------------------------------------------------ recordings */

/* A descriptor's command and barrier, recorded once into a secondary command buffer and
 * run by every later descriptor of its client with the same content (see "Recordings"). */
struct recording {
    struct recording *next;             /* in its client's bucket, or in the engine's spare list */
    VkCommandBuffer cb;                 /* secondary, SIMULTANEOUS_USE: several flights may run it */
    uint64_t hash;
    uint64_t last;                      /* the engine's count of lookups at its last use (LRU) */
    uint32_t uses;                      /* flight entries that run it, not yet retired */
    uint32_t cached;                    /* in its client's table; else spare once unused */
    struct object *objects[LS_MAX_BUFFERS + 1];
    uint32_t nobjects;
    struct ls_desc key;                 /* the descriptor it records, ticket 0 */
};

/* ------------------------------------------------------------------ clients and flights */

struct entry {
    uint32_t client;
    uint64_t ticket;
    struct recording *recording;
    uint32_t groups;                    /* its dispatch's workgroups, on the entry that answers (0: a copy) */
    uint32_t piece;                     /* PIECE: answers nothing; LAST_PIECE: answers for every piece */
    struct object *users[LS_MAX_BUFFERS + 1];
    uint32_t nusers;
    int32_t fences;                     /* first fence node answered after it, or NO_FENCE */
    int32_t fences_tail;
};

struct fence_node {
    uint64_t ticket;
    int32_t next;
};

/* A dispatch running in pieces (see "Pieces"): its objects are held until its last piece is in a flight. */
struct cut {
    uint32_t active;
    uint32_t dim, next, end, step;      /* pieces run groups next..end-1 along dim, step at a time */
    int32_t rank;                       /* its turn's */
    int64_t waited_from;                /* when its last piece went in (or it began): piece_now's order */
    struct ls_desc desc;
    struct object *users[LS_MAX_BUFFERS + 1];
    uint32_t nusers;
    struct entry *tail;                 /* its piece on the device, or NULL */
};

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
    uint64_t cut_charge;                /* ... the time they held the device, gaps included (see "Pieces") */
    int32_t cut_status;                 /* ... and the first failure among them */
    int32_t rank;                       /* its rank in the last plan that named it (UNRANKED: none yet) */
    double ns_per_group;                /* its most device time per workgroup in a timed dispatch (0: none) */
};

/* A free that waits for the descriptors its client published before it (ls_engine_drop). */
struct pending_drop {
    struct pending_drop *next;
    uint32_t kind, id, nmarks;
    uint32_t marks[];                   /* the lanes' tails at the free (ls_sq_marks) */
};

struct flight {
    VkCommandBuffer cb;                 /* primary: runs the entries' recordings, at submit */
    VkFence fence;
    VkQueryPool queries;
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
    int32_t rank;                       /* its plan turn's rank (0 unplanned): see deferred() */
};

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
    int32_t tid;                        /* the thread's id, once it runs (for _placement.py) */
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
    int32_t waiting_rank;               /* the highest rank of the clients waiting at the last look, cuts aside */
    struct ls_desc descs[LS_ENGINE_POP];
    struct ls_cqe post_buf[LS_ENGINE_POP];
    uint32_t post_count, post_client;
    struct pollfd *pollfds;
    uint32_t *poll_clients;
};

/* Put an unused recording (out of every table, in no flight) on the spare list: re-recorded next. */
static void spare_recording(ls_engine *e, struct recording *r)
{
    r->next = e->spare;
    e->spare = r;
}

/* ------------------------------------------------------------------ events */

static void emit(ls_engine *e, uint32_t type, uint32_t client, int32_t code, uint32_t kind, uint64_t a, uint64_t b)
{
    if (e->nevents == e->events_cap) {
        uint32_t cap = e->events_cap ? 2 * e->events_cap : 64;
        struct ls_engine_event *grown = realloc(e->events, cap * sizeof *grown);
        if (!grown)
            return;                     /* out of memory: the event is lost, the engine goes on */
        e->events = grown, e->events_cap = cap;
    }
    e->events[e->nevents++] = (struct ls_engine_event){type, client, code, kind, a, b};
    if (e->nevents == 1 && e->cfg.event_fd >= 0) {
        uint64_t one = 1;
        ssize_t written = write(e->cfg.event_fd, &one, sizeof one);
        (void)written;                  /* a saturated eventfd is readable already */
    }
}

int ls_engine_events(ls_engine *e, struct ls_engine_event *out, uint32_t max)
{
    pthread_mutex_lock(&e->lock);
    uint32_t n = e->nevents < max ? e->nevents : max;
    memcpy(out, e->events, n * sizeof *out);
    memmove(e->events, e->events + n, (e->nevents - n) * sizeof *out);
    e->nevents -= n;
    pthread_mutex_unlock(&e->lock);
    return (int)n;
}

/* ------------------------------------------------------------------ answers */

static void flush_posts(ls_engine *e);
static void end_cut(ls_engine *e, uint32_t slot, int32_t status);

/* Close a client's ring as corrupt (LS_EV_DROPPED), and drain nothing more of it. */
static void drop_client(ls_engine *e, uint32_t slot, int code)
{
    struct client *c = &e->clients[slot];
    if (c->closing)
        return;
    c->closing = 1;
    __atomic_store_n(&c->dropped, 1, __ATOMIC_RELEASE);  /* read by ls_engine_dropped, unlocked */
    ls_close_consumer(c->region, LS_ECORRUPT);
    emit(e, LS_EV_DROPPED, slot, code, 0, 0, 0);
    if (c->cut.active) {
        end_cut(e, slot, -LS_ECANCELED);
        flush_posts(e);                 /* an answer now says LS_EV_IDLE when it was the last */
    } else if (c->outstanding == 0) {
        emit(e, LS_EV_IDLE, slot, 0, 0, 0, 0);
    }
}

static void flush_posts(ls_engine *e)
{
    if (!e->post_count)
        return;
    struct client *c = &e->clients[e->post_client];
    uint32_t n = e->post_count;
    e->post_count = 0;
    c->outstanding -= n;
    if ((!c->closing || c->handed_over) && c->region) {
        int posted = ls_cq_post(c->region, (const char *)e->post_buf, n);
        if (posted != (int)n) {         /* the budget in take() makes a short post impossible */
            drop_client(e, e->post_client, posted < 0 ? posted : -LS_ECORRUPT);  /* and says when idle */
            return;
        }
    }
    if (c->closing && c->outstanding == 0 && c->region)
        emit(e, LS_EV_IDLE, e->post_client, 0, 0, 0, 0);
}

/* Queue one completion; consecutive ones of a client go out in one post. */
static void answer(ls_engine *e, uint32_t client, uint64_t ticket, int32_t status, uint64_t ns)
{
    if (e->post_count && (e->post_client != client || e->post_count == LS_ENGINE_POP))
        flush_posts(e);
    e->post_client = client;
    e->post_buf[e->post_count++] = (struct ls_cqe){.ticket = ticket, .status = status, .device_ns = ns};
    struct ls_engine_stats *s = &e->clients[client].stats;
    if (status == 0)
        s->completed++;
    else if (status != -LS_EFAULT && status != -LS_ECANCELED)
        s->errors++;
}

/* Put n objects in held[], each counted in use until a release() of it (a command or a cut holds them). */
static void hold_objects(struct object **held, struct object *const *objects, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        held[i] = objects[i];
        objects[i]->in_flight++;
    }
}

static void release(ls_engine *e, struct object *o)
{
    if (--o->in_flight == 0 && o->freed) {
        emit(e, LS_EV_RELEASED, o->client, 0, o->kind, o->id, 0);
        free(o);
    }
}

static void unuse(ls_engine *e, struct recording *r)
{
    if (--r->uses == 0 && !r->cached)
        spare_recording(e, r);
}

/* Book a retired piece of client c's cut dispatch, which held the device *charge ns; 1 when it is the
 * last, which answers for all of them (*status, *ns and *charge become theirs: the first failure, the
 * device time and the charge of all). */
static int book_piece(struct client *c, struct entry *en, int32_t *status, uint64_t *ns, uint64_t *charge)
{
    if (c->cut.tail == en)
        c->cut.tail = NULL;
    if (*status && !c->cut_status)
        c->cut_status = *status;
    c->cut_ns += *status ? 0 : *ns;
    c->cut_charge += *status ? 0 : *charge;
    if (en->piece != LAST_PIECE)
        return 0;
    *status = c->cut_status, *ns = c->cut_ns, *charge = c->cut_charge;
    c->cut_status = 0, c->cut_ns = 0, c->cut_charge = 0;
    return 1;
}

/* Answer one entry and the fences after it; with keep, its objects stay counted (abandoned work).
 * held_ns: its share of the time its submission held the device (0: not known). */
static void finish_entry(ls_engine *e, struct entry *en, int32_t status, uint64_t ns, uint64_t held_ns, int keep)
{
    struct client *c = &e->clients[en->client];
    uint64_t charge = held_ns > ns ? held_ns : ns;  /* a piece's: the gaps between pieces are its own */
    if (!en->piece || book_piece(c, en, &status, &ns, &charge)) {
        if (!status && ns && en->groups && (double)ns / en->groups > c->ns_per_group)
            c->ns_per_group = (double)ns / en->groups;  /* the estimate cuts go by (see "Pieces") */
        answer(e, en->client, en->ticket, status, ns);
        for (int32_t f = en->fences; f != NO_FENCE;) {
            struct fence_node *node = &e->fence_nodes[f];
            answer(e, en->client, node->ticket, status, 0);
            int32_t next = node->next;
            node->next = e->fence_free, e->fence_free = f;
            f = next;
        }
        en->fences = NO_FENCE;
        if (c->last == en)
            c->last = NULL;
        if (status == 0) {
            c->stats.device_ns += ns;
            c->stats.charged_since++;
            c->stats.charged_ns_since += en->piece ? charge : ns;
        }
    }
    if (keep)
        return;
    for (uint32_t k = 0; k < en->nusers; k++)
        release(e, en->users[k]);
    unuse(e, en->recording);
}

static int add_fence(ls_engine *e, struct entry *en, uint64_t ticket)
{
    if (e->fence_free == NO_FENCE) {
        uint32_t cap = e->fence_cap ? 2 * e->fence_cap : 256;
        struct fence_node *grown = realloc(e->fence_nodes, cap * sizeof *grown);
        if (!grown)
            return -ENOMEM;
        for (uint32_t i = e->fence_cap; i < cap; i++)
            grown[i].next = i + 1 < cap ? (int32_t)(i + 1) : e->fence_free;
        e->fence_free = (int32_t)e->fence_cap;
        e->fence_nodes = grown, e->fence_cap = cap;
    }
    int32_t f = e->fence_free;
    e->fence_free = e->fence_nodes[f].next;
    e->fence_nodes[f] = (struct fence_node){ticket, NO_FENCE};
    if (en->fences == NO_FENCE)
        en->fences = f;
    else
        e->fence_nodes[en->fences_tail].next = f;
    en->fences_tail = f;
    return 0;
}

/* ------------------------------------------------------------------ recording */

static struct flight *flight_at(ls_engine *e, uint32_t k) { return &e->flights[(e->head + k) % NFLIGHT]; }

/* The flight taking entries (opened on first use), or NULL when every slot is in flight. */
static struct flight *open_flight(ls_engine *e)
{
    if (e->nflights >= NFLIGHT)
        return NULL;
    struct flight *f = flight_at(e, e->nflights);
    if (!f->open) {
        f->open = 1;
        f->urgent = 0;
        f->opened = now_ns();
        f->count = 0;
        f->reported = 0;
        f->head_since = 0;
        f->progress_seen = 0;
        f->progress_at = 0;
        f->timed = e->policy.timed && e->cfg.timestamp_mask && f->queries;
        f->rank = e->pass_rank;
    }
    return f;
}

static void record_barrier(ls_engine *e, VkCommandBuffer cb)
{
    VkMemoryBarrier barrier = {VK_STRUCTURE_TYPE_MEMORY_BARRIER, NULL,
                               VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                               VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_SHADER_READ_BIT |
                                   VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_HOST_READ_BIT};
    VkPipelineStageFlags work = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
    e->vk.CmdPipelineBarrier(cb, work, work | VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &barrier, 0, NULL, 0, NULL);
}

/* Record dispatch d; with base, only its groups base..base+count-1 (a piece: see "Pieces"). */
static void record_dispatch(ls_engine *e, VkCommandBuffer cb, const struct ls_desc *d, struct object *program,
                            struct object **buffers, const uint32_t *base, const uint32_t *count)
{
    e->vk.CmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, (VkPipeline)program->handle);
    if (d->nbuffers) {
        VkDescriptorBufferInfo infos[LS_MAX_BUFFERS];
        VkWriteDescriptorSet writes[LS_MAX_BUFFERS];
        for (uint32_t k = 0; k < d->nbuffers; k++) {
            uint64_t range = buffers[k]->size - d->offset[k];
            infos[k] = (VkDescriptorBufferInfo){(VkBuffer)buffers[k]->handle, d->offset[k],
                                                range < e->cfg.max_storage_range ? range : e->cfg.max_storage_range};
            writes[k] = (VkWriteDescriptorSet){VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, NULL, VK_NULL_HANDLE, k, 0, 1,
                                               VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, NULL, &infos[k], NULL};
        }
        e->vk.CmdPushDescriptorSetKHR(cb, VK_PIPELINE_BIND_POINT_COMPUTE, (VkPipelineLayout)program->layout, 0,
                                      d->nbuffers, writes);
    }
    if (program->push_size) {
        /* Every byte the program declares, zeros past the client's own: push constants keep what the last
         * push left, and a kernel reading bytes its dispatch did not push read another client's. */
        uint8_t push[LS_MAX_PUSH] = {0};
        memcpy(push, d->push, d->push_size);
        e->vk.CmdPushConstants(cb, (VkPipelineLayout)program->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0,
                               program->push_size, push);
    }
    if (base)
        e->vk.CmdDispatchBase(cb, base[0], base[1], base[2], count[0], count[1], count[2]);
    else
        e->vk.CmdDispatch(cb, d->groups[0], d->groups[1], d->groups[2]);
}

static void record_copy(ls_engine *e, VkCommandBuffer cb, const struct ls_desc *d, struct object **buffers)
{
    VkBufferCopy region = {d->offset[0], d->offset[1], d->offset[2]};
    e->vk.CmdCopyBuffer(cb, (VkBuffer)buffers[0]->handle, (VkBuffer)buffers[1]->handle, 1, &region);
}

/* The descriptor's content past its ticket, hashed a word at a time. */
static uint64_t hash_desc(const struct ls_desc *d)
{
    const unsigned char *p = (const unsigned char *)d + sizeof d->ticket;
    uint64_t h = 0x9e3779b97f4a7c15ull, w;
    for (size_t k = 0; k + 8 <= sizeof *d - sizeof d->ticket; k += 8) {
        memcpy(&w, p + k, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
    }
    return h ^ (h >> 32);
}

static void unlink_recording(ls_engine *e, struct client *c, struct recording *r)
{
    struct recording **at = &c->buckets[r->hash % CACHE_BUCKETS];
    while (*at != r)
        at = &(*at)->next;
    *at = r->next;
    c->nrecordings--;
    r->cached = 0;
    if (!r->uses)
        spare_recording(e, r);
}

/* Forget every recording of client c that names object o (every one, with o NULL): its
 * handles are about to be destroyed. One still run by a flight is spare once it retires. */
static void forget_recordings(ls_engine *e, struct client *c, const struct object *o)
{
    for (uint32_t b = 0; c->buckets && b < CACHE_BUCKETS; b++)
        for (struct recording *r = c->buckets[b], *next; r; r = next) {
            next = r->next;
            int names = !o;
            for (uint32_t k = 0; k < r->nobjects && !names; k++)
                names = r->objects[k] == o;
            if (names)
                unlink_recording(e, c, r);
        }
}

/* A recording to reuse: spare, new, or (the client's cache full) its least recently used idle one. */
static struct recording *free_recording(ls_engine *e, struct client *c)
{
    if (c->nrecordings >= CACHE_MAX) {
        struct recording *oldest = NULL;
        for (uint32_t b = 0; b < CACHE_BUCKETS; b++)
            for (struct recording *r = c->buckets[b]; r; r = r->next)
                if (!r->uses && (!oldest || r->last < oldest->last))
                    oldest = r;
        if (oldest)
            unlink_recording(e, c, oldest);   /* idle: onto the spare list, taken below */
    }
    struct recording *r = e->spare;
    if (r) {
        e->spare = r->next;
        return r;
    }
    r = calloc(1, sizeof *r);
    VkCommandBufferAllocateInfo info = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, NULL, e->pool,
                                        VK_COMMAND_BUFFER_LEVEL_SECONDARY, 1};
    if (r && e->vk.AllocateCommandBuffers(e->device, &info, &r->cb) != VK_SUCCESS) {
        free(r);
        r = NULL;
    }
    return r;
}

/* A new recording, uncached, of checked descriptor d of client c (with base and count, of those groups
 * of the dispatch only); NULL when Vulkan cannot record it. */
static struct recording *record(ls_engine *e, struct client *c, const struct ls_desc *d, struct object **users,
                                uint32_t nusers, const uint32_t *base, const uint32_t *count)
{
    struct recording *r = free_recording(e, c);
    if (!r)
        return NULL;
    VkCommandBufferInheritanceInfo inherit = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_INHERITANCE_INFO};
    VkCommandBufferBeginInfo begin = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, NULL,
                                      VK_COMMAND_BUFFER_USAGE_SIMULTANEOUS_USE_BIT, &inherit};
    if (e->vk.BeginCommandBuffer(r->cb, &begin) != VK_SUCCESS) {   /* resets it (the pool allows) */
        spare_recording(e, r);
        return NULL;
    }
    if (d->opcode == LS_OP_DISPATCH)
        record_dispatch(e, r->cb, d, users[nusers - 1], users, base, count);
    else
        record_copy(e, r->cb, d, users);
    record_barrier(e, r->cb);
    if (e->vk.EndCommandBuffer(r->cb) != VK_SUCCESS) {
        spare_recording(e, r);
        return NULL;
    }
    r->uses = 0;
    r->cached = 0;
    r->nobjects = nusers;
    memcpy(r->objects, users, nusers * sizeof *users);
    return r;
}

/*
 * The recording of a checked descriptor d of client c, whose objects check_desc put in users[]:
 * the cached one with the same content, or a new one (cached unless every recording the client
 * has is in flight). NULL when Vulkan cannot record it. Lookups are by content within the
 * client, whose ids name the same objects for as long as a recording lives (forget_recordings).
 */
static struct recording *recording_for(ls_engine *e, struct client *c, const struct ls_desc *d,
                                       struct object **users, uint32_t nusers)
{
    struct ls_desc key = *d;
    key.ticket = 0;
    uint64_t hash = hash_desc(&key);
    e->lookups++;
    if (!c->buckets && !(c->buckets = calloc(CACHE_BUCKETS, sizeof *c->buckets)))
        return NULL;
    for (struct recording *r = c->buckets[hash % CACHE_BUCKETS]; r; r = r->next)
        if (r->hash == hash && !memcmp(&r->key, &key, sizeof key)) {
            r->last = e->lookups;
            return r;
        }
    struct recording *r = record(e, c, d, users, nusers, NULL, NULL);
    if (!r)
        return NULL;
    r->key = key;
    r->hash = hash;
    r->last = e->lookups;
    r->cached = c->nrecordings < CACHE_MAX;
    if (r->cached) {
        struct recording **bucket = &c->buckets[hash % CACHE_BUCKETS];
        r->next = *bucket, *bucket = r;
        c->nrecordings++;
    }
    return r;
}

/* ------------------------------------------------------------------ the validator */

/*
 * 0 when the descriptor (a private copy, ls_desc_check already applied by ls_sq_pop) may run
 * for client c, with its objects in users[] (program last); else the negative LS_E* status.
 */
static int check_desc(ls_engine *e, struct client *c, const struct ls_desc *d, struct object **users,
                      uint32_t *nusers)
{
    if (d->opcode == LS_OP_BAD || d->flags)
        return -LS_EBADSLOT;
    for (uint32_t k = 0; k < d->nbuffers; k++) {
        struct object **slot = table_find(&c->objects, LS_KIND_BUFFER, d->buffer[k]);
        if (!slot)
            return -LS_ENOBUFFER;
        users[k] = *slot;
    }
    *nusers = d->nbuffers;
    if (d->opcode == LS_OP_COPY) {
        if (d->nbuffers != 2)
            return -LS_EBINDINGS;
        uint64_t src = d->offset[0], dst = d->offset[1], size = d->offset[2];
        if (size == 0 || size > users[0]->size || src > users[0]->size - size || size > users[1]->size ||
            dst > users[1]->size - size)
            return -LS_ERANGE;
        if (users[0] == users[1] && (src > dst ? src - dst : dst - src) < size)
            return -LS_ERANGE;
        return 0;
    }
    if (d->opcode != LS_OP_DISPATCH)
        return -LS_EBADSLOT;
    struct object **slot = table_find(&c->objects, LS_KIND_PROGRAM, d->program);
    if (!slot)
        return -LS_ENOPROGRAM;
    struct object *program = *slot;
    if (d->nbuffers != program->bindings)
        return -LS_EBINDINGS;
    if (d->push_size > program->push_size || d->push_size % 4)
        return -LS_EPUSH;
    for (uint32_t k = 0; k < d->nbuffers; k++)
        if (d->offset[k] >= users[k]->size || d->offset[k] % e->cfg.offset_alignment)
            return -LS_ERANGE;
    for (int k = 0; k < 3; k++)
        if (d->groups[k] < 1 || d->groups[k] > e->cfg.max_groups[k])
            return -LS_EGROUPS;
    /* lavapipe counts the workgroups of a dispatch in 32 bits: past that it ran the product's remainder
     * and reported success (65535^3 ran 196,607 of 2.8e14) */
    if ((uint64_t)d->groups[0] * d->groups[1] * d->groups[2] > UINT32_MAX)
        return -LS_EGROUPS;
    users[(*nusers)++] = program;
    return 0;
}

/* ------------------------------------------------------------------ drain */

/* Have the device write ``ended`` into flight f's progress word, after the command before it (each
 * recording ends with a barrier whose second scope holds transfers, and the next one's makes the
 * write visible to the host): the watchdog's measure of a batch, see check_watchdog. */
/* Whether flight f carries progress marks: a batch, with the mapped word to mark. */
static int marked_batch(const struct flight *f) { return f->progress && f->count > 1; }

static void mark_progress(ls_engine *e, struct flight *f, uint32_t ended)
{
    e->vk.CmdFillBuffer(f->cb, f->results, PROGRESS_OFFSET, sizeof(uint32_t), ended);
}

static int submit(ls_engine *e)
{
    if (e->nflights >= NFLIGHT)
        return 0;
    struct flight *f = flight_at(e, e->nflights);
    if (!f->open)
        return 0;
    f->open = 0;
    if (!f->count)
        return 0;
    VkCommandBufferBeginInfo begin = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, NULL,
                                      VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT, NULL};
    VkResult result = e->vk.BeginCommandBuffer(f->cb, &begin);
    int marked = marked_batch(f);
    if (marked)
        *f->progress = 0;
    if (result == VK_SUCCESS && !f->timed && !marked) {
        e->vk.CmdExecuteCommands(f->cb, f->count, f->secondaries);  /* nothing goes between them */
    } else if (result == VK_SUCCESS) {  /* one recording at a time, each followed by its marks */
        if (f->timed) {  /* a timestamp before the first recording and after each */
            e->vk.CmdResetQueryPool(f->cb, f->queries, 0, LS_ENGINE_MAX_BATCH + 1);
            e->vk.CmdWriteTimestamp(f->cb, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, f->queries, 0);
        }
        for (uint32_t k = 0; k < f->count; k++) {
            e->vk.CmdExecuteCommands(f->cb, 1, &f->secondaries[k]);
            if (f->timed)
                e->vk.CmdWriteTimestamp(f->cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, f->queries, k + 1);
            if (marked)
                mark_progress(e, f, k + 1);
        }
        if (f->timed) {
            e->vk.CmdCopyQueryPoolResults(f->cb, f->queries, 0, f->count + 1, f->results, 0, 8,
                                          VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
            VkMemoryBarrier barrier = {VK_STRUCTURE_TYPE_MEMORY_BARRIER, NULL, VK_ACCESS_TRANSFER_WRITE_BIT,
                                       VK_ACCESS_HOST_READ_BIT};
            e->vk.CmdPipelineBarrier(f->cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &barrier,
                                     0, NULL, 0, NULL);
        }
    }
    if (result == VK_SUCCESS)
        result = e->vk.EndCommandBuffer(f->cb);
    if (result == VK_SUCCESS) {
        VkSubmitInfo info = {VK_STRUCTURE_TYPE_SUBMIT_INFO, NULL, 0, NULL, NULL, 1, &f->cb, 0, NULL};
        pthread_mutex_lock(&e->queue_lock);
        result = e->vk.QueueSubmit(e->queue, 1, &info, f->fence);
        pthread_mutex_unlock(&e->queue_lock);
    }
    if (result != VK_SUCCESS) {         /* lost device, or out of memory: fail this work, tell Python */
        for (uint32_t k = 0; k < f->count; k++)
            finish_entry(e, &f->entries[k], -LS_EFAULT, 0, 0, 0);
        flush_posts(e);
        f->count = 0;
        emit(e, LS_EV_DEVICE, 0, result, 0, 0, 0);
        e->device_lost = 1;
        return 0;
    }
    if (e->nflights == 0)
        f->head_since = now_ns();
    e->nflights++;
    return 1;
}

/* The flight taking entries, with room for one more (a full one is submitted first); NULL when every
 * slot is in flight. */
static struct flight *flight_with_room(ls_engine *e)
{
    struct flight *f = open_flight(e);
    if (f && f->count == LS_ENGINE_MAX_BATCH) {
        submit(e);
        f = open_flight(e);
    }
    return f;
}

/* Whether client c has completions it has not read yet (space: its free completion slots): it
 * pushes work without waiting for the answers to what it pushed before. */
static int streams(struct client *c, int space)
{
    if ((uint32_t)space > c->cq_size)
        c->cq_size = (uint32_t)space;
    return (uint32_t)space < c->cq_size;
}

/* Whether the open submission lingers (see "Lingering"): nothing runs, the policy is unplanned,
 * no fault, and it holds fewer than LINGER_BATCH commands, all of streaming clients, opened less
 * than LINGER_NS ago. run() submits it once this no longer holds; shutdown_engine at once. */
static int hold(ls_engine *e)
{
    if (e->nflights || e->policy.planned || e->faulted || e->device_lost)
        return 0;
    struct flight *f = flight_at(e, 0);
    return f->open && f->count && !f->urgent && f->count < LINGER_BATCH && now_ns() - f->opened < LINGER_NS;
}

/* Whether the open submission waits for a higher rank's in flight (see "Policy"). */
static int deferred(ls_engine *e)
{
    if (!e->policy.planned || !e->nflights || e->nflights >= NFLIGHT)
        return 0;
    struct flight *open = flight_at(e, e->nflights);
    if (!open->open || !open->count)
        return 0;
    for (uint32_t k = 0; k < e->nflights; k++)
        if (flight_at(e, k)->rank > open->rank)
            return 1;
    return 0;
}

/* Commands the free flight slots can still take: popping more would leave some without one. */
static int64_t room(ls_engine *e)
{
    if (e->nflights >= NFLIGHT)
        return 0;
    struct flight *f = flight_at(e, e->nflights);
    int64_t open = f->open ? LS_ENGINE_MAX_BATCH - f->count : LS_ENGINE_MAX_BATCH;
    return open + (int64_t)LS_ENGINE_MAX_BATCH * (NFLIGHT - 1 - e->nflights);
}

/* Forget object (kind, id) of client slot: destroyed now (0) or by its last command's
 * retirement (1: LS_EV_RELEASED then); with emit_idle, one that is idle is announced by
 * LS_EV_RELEASED too (a deferred drop, whose caller was told 1 long ago). -ENOENT if unknown. */
static int drop_now(ls_engine *e, uint32_t slot, uint32_t kind, uint32_t id, int emit_idle)
{
    struct client *c = &e->clients[slot];
    struct object **found = table_find(&c->objects, kind, id);
    if (!found)
        return -ENOENT;
    struct object *o = *found;
    table_remove(&c->objects, found);
    forget_recordings(e, c, o);
    if (o->in_flight) {
        o->freed = 1;
        return 1;
    }
    if (emit_idle)
        emit(e, LS_EV_RELEASED, slot, 0, kind, id, 0);
    free(o);
    return 0;
}

/* Carry out the drops of client slot whose descriptors published before the free are all
 * popped now (all of them, once it closes: nothing more is popped then). */
static void settle_drops(ls_engine *e, uint32_t slot)
{
    struct client *c = &e->clients[slot];
    for (struct pending_drop **p = &c->drops; *p;) {
        struct pending_drop *d = *p;
        if (!c->closing && c->region && !ls_sq_passed(c->region, d->marks, d->nmarks)) {
            p = &d->next;
            continue;
        }
        *p = d->next;
        drop_now(e, slot, d->kind, d->id, 1);
        free(d);
    }
}

/* ------------------------------------------------------------------ pieces */

/* How many pieces dispatch d of client c (checked, its program last in users[]) runs in for a turn cut at
 * cut_us, along the dimension put in *dim; 0: it runs whole (see "Pieces"). */
static uint32_t pieces_for(ls_engine *e, const struct client *c, const struct ls_desc *d, struct object **users,
                           uint32_t nusers, uint32_t cut_us, uint32_t *dim)
{
    if (!cut_us || d->opcode != LS_OP_DISPATCH || !users[nusers - 1]->cuttable || !e->vk.CmdDispatchBase ||
        !e->policy.timed || !e->cfg.timestamp_mask)
        return 0;
    double groups = (double)d->groups[0] * d->groups[1] * d->groups[2], piece_ns = cut_us * 1000.0;
    double estimate = c->ns_per_group * groups;  /* none yet: as many pieces as may be */
    if (c->ns_per_group && estimate <= CUT_OVER * piece_ns)
        return 0;
    *dim = d->groups[1] > d->groups[0] ? 1 : 0;
    if (d->groups[2] > d->groups[*dim])
        *dim = 2;
    double wanted = c->ns_per_group ? estimate / piece_ns : LS_ENGINE_MAX_PIECES;
    uint32_t pieces = wanted < LS_ENGINE_MAX_PIECES ? (uint32_t)wanted + (wanted > (uint32_t)wanted)
                                                    : LS_ENGINE_MAX_PIECES;  /* wanted, rounded up */
    if (pieces > d->groups[*dim])
        pieces = d->groups[*dim];
    return pieces > 1 ? pieces : 0;
}

/* Start running client slot's dispatch d in pieces along dim: the cut holds its objects until its last
 * piece is in a flight. */
static void start_cut(ls_engine *e, uint32_t slot, const struct ls_desc *d, struct object **users, uint32_t nusers,
                      uint32_t dim, uint32_t pieces)
{
    struct client *c = &e->clients[slot];
    struct cut *k = &c->cut;
    *k = (struct cut){.active = 1, .dim = dim, .end = d->groups[dim], .step = (d->groups[dim] + pieces - 1) / pieces,
                      .rank = e->pass_rank, .waited_from = now_ns(), .desc = *d, .nusers = nusers};
    hold_objects(k->users, users, nusers);
    e->cuts++;
    c->stats.cut++;
}

/* Let go of the cut's holds: its last piece is in a flight (which holds them now), or it ended. */
static void close_cut(ls_engine *e, struct client *c)
{
    struct cut *k = &c->cut;
    for (uint32_t i = 0; i < k->nusers; i++)
        release(e, k->users[i]);
    k->active = 0;
    k->tail = NULL;
    e->cuts--;
}

/* End client slot's cut before its last piece: the piece on the device answers its ticket with status
 * as it retires (with none on the device, it is answered now; the caller flushes). The rest never runs. */
static void end_cut(ls_engine *e, uint32_t slot, int32_t status)
{
    struct client *c = &e->clients[slot];
    if (!c->cut.active)
        return;
    if (!c->cut_status)
        c->cut_status = status;
    if (c->cut.tail) {
        c->cut.tail->piece = LAST_PIECE;
        c->last = c->cut.tail;
    } else {
        answer(e, slot, c->cut.desc.ticket, c->cut_status, 0);
        c->cut_status = 0, c->cut_ns = 0, c->cut_charge = 0;
    }
    close_cut(e, c);
}

/* Open the flight for work of rank: one of another rank, open with work, is submitted first (see "Policy"). */
static void at_rank(ls_engine *e, int32_t rank)
{
    struct flight *open = e->nflights < NFLIGHT ? flight_at(e, e->nflights) : NULL;
    if (open && open->open && open->count && open->rank != rank)
        submit(e);
    e->pass_rank = rank;
}

/* Put the next piece of client slot's cut in the open flight (with rest, all that is left of it): 1 when it
 * went in (or the cut ended: Vulkan could not record it), 0 when no flight has room. The last piece answers. */
static int add_piece(ls_engine *e, uint32_t slot, int rest)
{
    struct client *c = &e->clients[slot];
    struct cut *k = &c->cut;
    struct flight *f = flight_with_room(e);
    if (!f)
        return 0;
    uint32_t base[3] = {0, 0, 0}, count[3] = {k->desc.groups[0], k->desc.groups[1], k->desc.groups[2]};
    uint32_t left = k->end - k->next;
    base[k->dim] = k->next;
    count[k->dim] = rest || left < k->step ? left : k->step;
    volatile uint32_t *busy = __atomic_load_n(&e->busy, __ATOMIC_ACQUIRE);
    uint32_t was = busy ? *busy : 0;
    if (busy)
        *busy = slot + 1;               /* as in take(): a crash recording it is this client's */
    struct recording *r = record(e, c, &k->desc, k->users, k->nusers, base, count);
    if (busy)
        *busy = was;
    if (!r) {
        end_cut(e, slot, -LS_EFAULT);
        flush_posts(e);
        return 1;
    }
    k->next += count[k->dim];
    k->waited_from = now_ns();
    r->uses++;
    f->urgent = 1;
    f->secondaries[f->count] = r->cb;
    struct entry *en = &f->entries[f->count++];
    int last = k->next >= k->end;
    uint32_t groups = k->desc.groups[0] * k->desc.groups[1] * k->desc.groups[2];
    *en = (struct entry){.client = slot, .ticket = k->desc.ticket, .recording = r, .groups = last ? groups : 0,
                         .piece = last ? LAST_PIECE : PIECE, .nusers = k->nusers, .fences = NO_FENCE};
    hold_objects(en->users, k->users, k->nusers);
    c->stats.pieces++;
    if (en->piece == LAST_PIECE) {
        c->last = en;                   /* fences popped after it wait for it */
        close_cut(e, c);
    } else {
        k->tail = en;
    }
    return 1;
}

/* The slot of a client whose cut of rank or higher is under way, or -1. A cut turn of that rank then
 * begins no new command, for it would overtake that one at every pass its pieces leave free (one lower
 * command in all, as the scheduler says: a review's cut client got 0.15 s of device time a second
 * against an uncut neighbour's 0.65, and two cut clients split 2:1); the turn goes to that cut. */
static int64_t cut_under_way(ls_engine *e, int32_t rank)
{
    for (uint32_t i = 0; i < e->nactive && e->cuts; i++) {
        const struct cut *k = &e->clients[e->active[i]].cut;
        if (k->active && k->rank >= rank)
            return e->active[i];
    }
    return -1;
}

/* The next piece of a cut into a flight now, without asking the scheduler, when nothing runs or waits to
 * be submitted and no client of a higher rank than the cut's waits: the turn that began the cut holds
 * for all its pieces. (Asked between two pieces, the scheduler would keep the device idle meanwhile.) */
static int piece_now(ls_engine *e)
{
    if (!e->cuts || !e->policy.planned || e->nflights || (flight_at(e, 0)->open && flight_at(e, 0)->count))
        return 0;
    uint32_t best = UINT32_MAX;         /* the highest rank's, the longest waiting of them */
    for (uint32_t i = 0; i < e->nactive; i++) {
        uint32_t slot = e->active[i];
        struct client *c = &e->clients[slot];
        if (!c->cut.active || c->cut.tail || c->closing)
            continue;
        struct cut *b = best == UINT32_MAX ? NULL : &e->clients[best].cut;
        if (!b || c->cut.rank > b->rank || (c->cut.rank == b->rank && c->cut.waited_from < b->waited_from))
            best = slot;
    }
    if (best == UINT32_MAX || e->clients[best].cut.rank < e->waiting_rank)
        return 0;
    at_rank(e, e->clients[best].cut.rank);
    return add_piece(e, best, 0);
}

/* Put all that is left of client slot's cut into a flight now, in one piece, behind its piece on the
 * device if one is: what runs is finished (a hand-over, a stop). With no flight free, it ends LS_ECANCELED. */
static int finish_cut(ls_engine *e, uint32_t slot)
{
    at_rank(e, e->clients[slot].cut.rank);
    if (add_piece(e, slot, 1))
        return 1;
    end_cut(e, slot, -LS_ECANCELED);
    return 0;
}

/* The cuts that go on outside their client's turns: a faulted engine ends each (LS_EFAULT), and a client
 * handed over (closed LS_EMOVED; any other close ended its cut) finishes its cut at once (finish_cut).
 * 1 when a piece went into a flight. */
static int continue_cuts(ls_engine *e)
{
    int added = 0;
    for (uint32_t i = 0; i < e->nactive && e->cuts; i++) {
        uint32_t slot = e->active[i];
        struct client *c = &e->clients[slot];
        if (!c->cut.active)
            continue;
        if (e->faulted || e->device_lost)
            end_cut(e, slot, -LS_EFAULT);
        else if (c->closing)
            added |= finish_cut(e, slot);
    }
    flush_posts(e);
    return added;
}

/* Pop up to limit of a client's descriptors; record the good ones, answer the rest. Returns how
 * many were popped. May submit (a full batch) and open a new flight on the way. */
static int take(ls_engine *e, uint32_t slot, uint32_t limit, uint32_t cut_us)
{
    struct client *c = &e->clients[slot];
    if (!c->region || c->closing)
        return 0;
    if (c->cut.active)                  /* its cut's next piece first: what it pushed after waits for it */
        return c->cut.tail ? 0 : add_piece(e, slot, 0);
    int space = ls_cq_space(c->region);
    if (space < 0) {
        drop_client(e, slot, space);
        return 0;
    }
    int64_t budget = (int64_t)space - c->outstanding;
    if (budget > limit)
        budget = limit;
    if (cut_us && budget > 1)
        budget = 1;                     /* a cut turn takes one command */
    int64_t owner = cut_us && e->cuts ? cut_under_way(e, e->pass_rank) : -1;
    if (owner >= 0) {                   /* the turn is the cut's under way (its own turn may never come) */
        struct client *o = &e->clients[owner];
        int goes = !o->cut.tail && !o->closing && o->cut.rank == e->pass_rank;
        return goes ? add_piece(e, (uint32_t)owner, 0) : 0;
    }
    if (budget > LS_ENGINE_POP)
        budget = LS_ENGINE_POP;
    if (budget > room(e))
        budget = room(e);
    if (budget <= 0)
        return 0;
    int streaming = streams(c, space);
    int n = ls_sq_pop(c->region, (char *)e->descs, (uint32_t)budget);
    if (n < 0) {
        drop_client(e, slot, n);
        return 0;
    }
    if (n == 0)
        return 0;
    c->outstanding += n;
    c->stats.submitted += n;
    c->stats.popped_since += n;
    c->popped = e->popped = 1;
    volatile uint32_t *busy = __atomic_load_n(&e->busy, __ATOMIC_ACQUIRE);
    if (busy)
        *busy = slot + 1;               /* a crash from here on is this client's descriptor's */
    for (int i = 0; i < n; i++) {
        const struct ls_desc *d = &e->descs[i];
        if (d->opcode == LS_OP_NOP && !d->flags) {  /* a fence */
            if (!c->last || add_fence(e, c->last, d->ticket))
                answer(e, slot, d->ticket, 0, 0);
            continue;
        }
        struct object *users[LS_MAX_BUFFERS + 1];
        uint32_t nusers = 0;
        int status = check_desc(e, c, d, users, &nusers);
        struct flight *f = status ? NULL : flight_with_room(e);
        uint32_t dim = 0, pieces = f ? pieces_for(e, c, d, users, nusers, cut_us, &dim) : 0;
        if (pieces) {
            start_cut(e, slot, d, users, nusers, dim, pieces);
            add_piece(e, slot, 0);
            continue;
        }
        struct recording *r = f ? recording_for(e, c, d, users, nusers) : NULL;
        if (!r) {
            answer(e, slot, d->ticket, status ? status : -LS_EFAULT, 0);
            continue;
        }
        r->uses++;
        f->urgent |= !streaming;
        f->secondaries[f->count] = r->cb;
        struct entry *en = &f->entries[f->count++];
        en->client = slot;
        en->ticket = d->ticket;
        en->recording = r;
        en->groups = d->opcode == LS_OP_DISPATCH ? d->groups[0] * d->groups[1] * d->groups[2] : 0;
        en->piece = 0;
        en->nusers = nusers;
        en->fences = NO_FENCE;
        hold_objects(en->users, users, nusers);
        c->last = en;
    }
    if (busy)
        *busy = 0;
    flush_posts(e);
    settle_drops(e, slot);
    return n;
}

/* Descriptors of client c that the engine can pop now: those waiting in its ring, but none while
 * its completion ring has no free slot past the answers it still owes (the client has not read
 * its completions, and popping more would leave answers nowhere to go). Such a client is not
 * waiting: it is woken for when it reads (sleep_on_bells). Negative: its ring failed validation. */
static int takeable(struct client *c)
{
    int pending = ls_sq_pending(c->region);
    if (pending <= 0)
        return pending;
    int space = ls_cq_space(c->region);
    if (space < 0)
        return space;
    return (int64_t)space > (int64_t)c->outstanding ? pending : 0;
}

/* What client c waits to have taken: the next piece of its cut once the last has retired, else its ring's. */
static int waits(struct client *c)
{
    return c->cut.active ? !c->cut.tail : takeable(c);
}

/* Read every takeable client's pending count into its stats; how many clients wait. */
static uint32_t look(ls_engine *e)
{
    uint32_t waiting = 0;
    int32_t top = INT32_MIN;
    uint64_t sig = e->nflights;
    for (uint32_t i = 0; i < e->nactive; i++) {
        uint32_t slot = e->active[i];
        struct client *c = &e->clients[slot];
        if (c->closing) {
            c->stats.pending = 0;
            continue;
        }
        int pending = waits(c);
        if (pending < 0) {
            drop_client(e, slot, pending);
            pending = 0;
        }
        c->stats.pending = (uint32_t)pending;
        waiting += pending > 0;
        if (pending > 0)
            sig += (uint64_t)(slot + 1) * 0x9e3779b97f4a7c15ull;
        if (pending > 0 && !c->cut.active && c->rank > top)
            top = c->rank;
    }
    e->waiting_sig = sig;
    e->waiting_rank = top;
    return waiting;
}

static int drain(ls_engine *e)
{
    int popped = 0;
    if (e->policy.planned) {
        for (uint32_t t = 0; t < e->nplan; t++) {
            struct ls_engine_turn turn = e->plan[t];
            if (turn.client >= e->cfg.max_clients)
                continue;
            at_rank(e, turn.rank);      /* a higher priority's fence must not wait for lower work */
            popped |= take(e, turn.client, turn.budget, turn.cut_us) > 0;
        }
    } else {
        e->pass_rank = 0;
        uint32_t n = e->nactive, start = n ? e->rotate++ % n : 0;
        for (uint32_t i = 0; i < n; i++) {
            uint32_t slot = e->active[(start + i) % n];
            if (e->clients[slot].stats.pending)
                popped |= take(e, slot, LS_ENGINE_POP, 0) > 0;
        }
    }
    if (!hold(e) && !deferred(e))
        submit(e);
    return popped;
}

/* ------------------------------------------------------------------ retire */

static void read_times(ls_engine *e, struct flight *f, uint64_t *ns)
{
    for (uint32_t k = 0; k < f->count; k++)
        ns[k] = f->timed ? (uint64_t)((double)((f->stamps[k + 1] - f->stamps[k]) & e->cfg.timestamp_mask) *
                                      e->cfg.timestamp_period_ns)
                         : 0;
}

static void retire_head(ls_engine *e, int32_t status, int keep)
{
    struct flight *f = flight_at(e, 0);
    static uint64_t ns[LS_ENGINE_MAX_BATCH];  /* the engine thread's, or a stopped engine's caller */
    read_times(e, f, ns);
    uint64_t held = f->count && f->head_since ? (uint64_t)(now_ns() - f->head_since) / f->count : 0;
    for (uint32_t k = 0; k < f->count; k++)
        finish_entry(e, &f->entries[k], status, status ? 0 : ns[k], held, keep);
    flush_posts(e);
    f->count = 0;
    e->vk.ResetFences(e->device, 1, &f->fence);
    e->head = (e->head + 1) % NFLIGHT;
    e->nflights--;
    if (e->nflights)
        flight_at(e, 0)->head_since = now_ns();
}

static int retire(ls_engine *e)
{
    int retired = 0;
    while (e->nflights) {
        VkResult result = e->vk.GetFenceStatus(e->device, flight_at(e, 0)->fence);
        if (result == VK_NOT_READY)
            break;
        if (result != VK_SUCCESS && !e->device_lost) {
            e->device_lost = 1;
            emit(e, LS_EV_DEVICE, 0, result, 0, 0, 0);
        }
        retire_head(e, result == VK_SUCCESS && !e->faulted ? 0 : -LS_EFAULT, 0);
        retired = 1;
    }
    return retired;
}

/* The id of the one program that client slot's dispatches in flight f run, or 0 when they run none or
 * several (then which of them ran away cannot be told). A dispatch's program is its last user. */
static uint64_t flight_program(const struct flight *f, uint32_t slot)
{
    uint64_t program = 0;
    for (uint32_t k = 0; k < f->count; k++) {
        const struct entry *en = &f->entries[k];
        const struct object *o = en->nusers ? en->users[en->nusers - 1] : NULL;
        if (en->client != slot || !o || o->kind != LS_KIND_PROGRAM)
            continue;
        if (program && program != o->id)
            return 0;
        program = o->id;
    }
    return program;
}

/* The watchdog: the head submission's current command has run past the limit. A single command is
 * timed from when its submission reached the head of the queue. A batch carries a progress marker
 * after each command (mark_progress), so its clock restarts whenever the marker moves: a command is
 * caught within twice the watchdog (it may have started up to one watchdog before the marker was
 * last seen to move), and a batch of legal commands runs as long as they take (timed from the head
 * alone, 256 dispatches of a second each faulted the server for everyone). A batch without the
 * marker (no mapped buffer could be made) has twice the watchdog in all. */
static void check_watchdog(ls_engine *e)
{
    if (!e->nflights || !e->policy.watchdog_ns || e->faulted)
        return;
    struct flight *f = flight_at(e, 0);
    int64_t now = now_ns(), limit = (int64_t)e->policy.watchdog_ns, since = f->head_since;
    int marked = marked_batch(f);
    if (marked) {
        uint32_t ended = *f->progress;
        if (ended != f->progress_seen) {
            f->progress_seen = ended;
            f->progress_at = now;
        }
        if (f->progress_at > since)
            since = f->progress_at;
    } else if (f->count > 1) {
        limit *= 2;
    }
    int64_t running = now - since;
    if (f->reported || running <= limit)
        return;
    f->reported = 1;
    emit(e, LS_EV_WATCHDOG, 0, 0, marked, f->count, (uint64_t)running);
    for (uint32_t k = 0; k < f->count; k++) {
        uint32_t slot = f->entries[k].client, seen = 0;
        for (uint32_t j = 0; j < k && !seen; j++)
            seen = f->entries[j].client == slot;
        if (!seen) {
            uint64_t program = flight_program(f, slot);
            emit(e, LS_EV_SUSPECT, slot, 0, program ? LS_KIND_PROGRAM : 0, program, 0);
        }
    }
}

/* ------------------------------------------------------------------ sleeping */

static void rang(ls_engine *e, uint32_t slot, int64_t now)
{
    struct client *c = &e->clients[slot];
    char sink[8];
    for (int k = 0; k < BELL_READS && recv(c->doorbell_fd, sink, sizeof sink, MSG_DONTWAIT) >= 0; k++)
        ;
    int pending = takeable(c);          /* work it cannot be given yet makes the ring an empty one */
    if (pending < 0) {
        drop_client(e, slot, pending);
        return;
    }
    if (pending || c->popped) {
        c->popped = 0;
        return;
    }
    c->empty++;
    c->credit = c->refilled ? c->credit + (double)(now - c->refilled) / 1e9 * BELL_REFILL : BELL_CREDIT;
    if (c->credit > BELL_CREDIT)
        c->credit = BELL_CREDIT;
    c->refilled = now;
    c->credit -= 1;
    if (c->credit >= 0)
        return;
    c->muted_until = now + BELL_PENALTY_NS;
    c->mutes++;
    if (!(c->mutes & (c->mutes - 1)))
        emit(e, LS_EV_MUTED, slot, 0, 0, c->empty, c->mutes);
}

/* A look at the rings (and at stop, and with events_too at queued events) under the lock. With
 * new_only, the very clients that the last pass's plan withheld, waiting still while as many
 * submissions run, are not work: a pass would pop nothing again (see "Policy"). */
static int work_waiting(ls_engine *e, int events_too, int new_only)
{
    pthread_mutex_lock(&e->lock);
    int waiting = look(e) > 0 && !(new_only && e->withheld && e->waiting_sig == e->withheld_sig);
    int found = waiting || e->stopping || (events_too && e->nevents);
    pthread_mutex_unlock(&e->lock);
    return found;
}

/* One step of a poll. Placed (ls_engine_place), yield the core: the thread the engine waits for
 * shares it. Otherwise spin in place. Runs on the engine thread only.
 *
 * A yield that lost the core for long (another busy thread took a whole time slice) stops the
 * yields of such polls for YIELD_PAUSE_NS, and they keep the core meanwhile. Two kinds of poll
 * pause apart. A fence poll waits for a submission, which the driver's thread on this core runs;
 * a loss there stops the yields of both kinds (a busy process beside the engine would take a
 * slice at every yield: 4 ms round trips). A spin waits for a client's next descriptor, nothing
 * on this core; a loss there stops the spins' yields only. It stopped both before: another
 * arbiter's engine and queue thread, busy on the same core, took the yield of this one's spin
 * after each of its blocks of round trips, and the pause kept this engine's fence polls from
 * yielding to its own queue thread through its next block (R3 of bench/test_restart_bench.py:
 * 17% of round trips over 60 us, 0.2-0.5% once the arbiters had not run for 0.3 s). A fence
 * poll's yield that comes back at once ends a spins' pause: nothing busy shares the core. (The
 * spins' pause alone left the arbiter that lost the yields with a median round trip of 19-21 us
 * against the other's 16-17 us: a spin that keeps the core holds off the queue thread's own
 * work after a submission.) */
static void poll_step(ls_engine *e, int fence)
{
    int64_t now = now_ns();
    int paused = now < e->fence_yields_paused_until || (!fence && now < e->spin_yields_paused_until);
    if (!__atomic_load_n(&e->placed, __ATOMIC_ACQUIRE) || paused) {
        for (int k = 0; k < 64; k++)
            ls_cpu_relax();
        return;
    }
    sched_yield();
    int64_t after = now_ns();
    if (after - now > YIELD_LOST_NS)
        *(fence ? &e->fence_yields_paused_until : &e->spin_yields_paused_until) = after + YIELD_PAUSE_NS;
    else if (fence)
        e->spin_yields_paused_until = 0;
}

/* Watch the rings for spin_ns after popped work; 1 when work (or a task) arrived. */
static int spin(ls_engine *e)
{
    if (!e->popped || !e->nactive || e->nactive > e->policy.spin_clients)
        return 0;
    e->popped = 0;
    int64_t deadline = now_ns() + (int64_t)e->policy.spin_ns;
    do {
        if (work_waiting(e, 1, 0))
            return 1;
        poll_step(e, 0);
    } while (now_ns() < deadline);
    return 0;
}

/* Arm every ring and sleep on the engine's eventfd and the heard doorbells (IDLE_NS, MUTED_NS
 * while one is muted). With linger_ns, for at most that long, and the rings of streaming
 * clients stay unarmed: their pushes are what the lingering submission waits to take. */
static void sleep_on_bells(ls_engine *e, int64_t linger_ns)
{
    pthread_mutex_lock(&e->lock);
    int64_t now = now_ns();
    uint32_t nfds = 1, muted = 0, armed = 0, work = 0;
    e->pollfds[0] = (struct pollfd){e->wake_fd, POLLIN, 0};
    for (; armed < e->nactive; armed++) {
        uint32_t slot = e->active[armed];
        struct client *c = &e->clients[slot];
        if (c->closing)
            continue;
        if (linger_ns) {                /* the streaming clients it lingers for ring no bell */
            int space = ls_cq_space(c->region);
            if (space < 0 || streams(c, space))
                continue;
        }
        int pending = ls_sq_arm(c->region);
        if (pending > 0) {              /* it may have work it has no completion slot for */
            int space = ls_sq_arm_room(c->region);
            pending = space < 0 ? space : (int64_t)space > (int64_t)c->outstanding;
        }
        if (pending < 0) {
            drop_client(e, slot, pending);
            continue;
        }
        if (pending > 0) {
            work = 1;
            armed++;
            break;
        }
        if (now < c->muted_until) {
            muted = 1;
            continue;
        }
        e->pollfds[nfds] = (struct pollfd){c->doorbell_fd, POLLIN, 0};
        e->poll_clients[nfds++] = slot;
    }
    int stop = e->stopping;
    pthread_mutex_unlock(&e->lock);
    int64_t timeout = muted ? MUTED_NS : IDLE_NS;
    if (linger_ns && linger_ns < timeout)
        timeout = linger_ns;
    struct timespec ts = {timeout / 1000000000LL, timeout % 1000000000LL};
    if (!work && !stop && ppoll(e->pollfds, nfds, &ts, NULL) > 0) {
        uint64_t count;
        if (e->pollfds[0].revents && read(e->wake_fd, &count, sizeof count) < 0)
            count = 0;                  /* nothing to read: someone read it first */
        pthread_mutex_lock(&e->lock);
        now = now_ns();
        for (uint32_t k = 1; k < nfds; k++) {
            uint32_t slot = e->poll_clients[k];
            struct client *c = &e->clients[slot];
            if (e->pollfds[k].revents && c->region && !c->closing && c->doorbell_fd == e->pollfds[k].fd)
                rang(e, slot, now);
        }
        pthread_mutex_unlock(&e->lock);
    }
    pthread_mutex_lock(&e->lock);
    for (uint32_t i = 0; i < e->nactive && i < armed; i++) {
        struct client *c = &e->clients[e->active[i]];
        if (!c->closing)
            ls_sq_disarm(c->region);
    }
    pthread_mutex_unlock(&e->lock);
}

/* Poll the oldest fence (and, while another submission fits, the rings) before sleeping in
 * vkWaitForFences: a submission of a command or two ends within microseconds, and a futex sleep
 * and wake-up of this thread would cost more than it, so its fence is polled until it has run
 * for spin_ns (each look followed by poll_step: placed, lavapipe's queue thread, which runs the
 * submission, shares this thread's core).
 * A longer one, or one that has run longer, is looked at once and slept on: polling it cost as
 * much CPU as it ran, and placed, the polls took half the core the submission ran on (a
 * dispatch of 2.6 s alone took 5.0 s placed). While another submission may go, the sleep
 * is a nap, after which the loop pops what came meanwhile: a quarter of the time the head has
 * run, at least FENCE_NAP_NS and at most FENCE_SLICE_NS (the fence ends the nap as soon as it
 * signals, so the device never waits on a nap; what arrives waits at most the nap to be
 * popped, behind work that has run four times as long); else a FENCE_SLICE_NS slice.
 *
 * The naps grow, and the slice is long (20 ms), for a reason of the kernel's as much as of
 * CPU. Placed, this thread and lavapipe's queue thread are pinned to one core; a thread that
 * sleeps and wakes every 25-500 us there, beside a pinned thread that runs, starved a process
 * of another session (another autogroup) that pinned itself to that core while the machine was
 * otherwise busy: for the whole of the submission, seconds. Mesa pins every process that loads
 * lavapipe to each core in turn (it reads each AMD core's APIC id), so a vetting compiler
 * child, or a client opening a private device, waited for another client's long dispatch to
 * end (test_clients_raise_soon_when_the_arbiter_is_killed failed so). Reproduced outside
 * libshare on this VM (kernel 6.18) with two pinned threads of one process, one busy and one
 * in a nanosleep loop, and two busy processes: a new session's process pinned to that core
 * waited over 8 s with naps of 25 us to 1 ms, not at all with 2 ms or more, nor with the
 * napper unpinned. */
static void wait_for_fence(ls_engine *e)
{
    pthread_mutex_lock(&e->lock);
    struct flight *f = flight_at(e, 0);
    VkFence fence = f->fence;
    int more = e->nflights < e->policy.max_in_flight && !deferred(e);
    int64_t ran = now_ns() - f->head_since;
    int64_t spin = f->count > FENCE_SPIN_COMMANDS || ran >= (int64_t)e->policy.spin_ns
                       ? 0 : (int64_t)e->policy.spin_ns - ran;  /* 0: one look, then sleep */
    int64_t nap = ran / 4 < FENCE_NAP_NS ? FENCE_NAP_NS : ran / 4 > FENCE_SLICE_NS ? FENCE_SLICE_NS : ran / 4;
    pthread_mutex_unlock(&e->lock);
    int64_t deadline = now_ns() + spin;
    do {
        if (e->vk.GetFenceStatus(e->device, fence) != VK_NOT_READY)
            return;
        if (more && work_waiting(e, 0, 1))
            return;
        poll_step(e, 1);
    } while (now_ns() < deadline);
    e->vk.WaitForFences(e->device, 1, &fence, VK_TRUE, more ? (uint64_t)nap : FENCE_SLICE_NS);
}

static void wait_for_work(ls_engine *e)
{
    if (e->nflights) {
        wait_for_fence(e);
        return;
    }
    if (!spin(e))
        sleep_on_bells(e, 0);
}

/* ------------------------------------------------------------------ the loop */

static void cancel_queued(ls_engine *e, uint32_t slot, int32_t status)
{
    struct client *c = &e->clients[slot];
    for (;;) {
        int space = ls_cq_space(c->region);
        int64_t budget = (int64_t)space - c->outstanding;
        if (space < 0 || budget <= 0)
            return;
        int n = ls_sq_pop(c->region, (char *)e->descs, budget < LS_ENGINE_POP ? (uint32_t)budget : LS_ENGINE_POP);
        if (n <= 0)
            return;
        c->outstanding += n;
        c->stats.submitted += n;
        for (int i = 0; i < n; i++)
            answer(e, slot, e->descs[i].ticket, status, 0);
        flush_posts(e);
    }
}

static void shutdown_engine(ls_engine *e)
{
    pthread_mutex_lock(&e->lock);
    submit(e);                          /* a lingering submission: answered below like the rest */
    for (uint32_t i = 0; i < e->nactive; i++) {
        uint32_t slot = e->active[i];
        if (!e->clients[slot].closing)
            cancel_queued(e, slot, -LS_ECANCELED);
        if (e->clients[slot].cut.active && (e->faulted || e->device_lost))
            end_cut(e, slot, -LS_EFAULT);
        else if (e->clients[slot].cut.active)
            finish_cut(e, slot);        /* it runs: it gets the time running work gets */
    }
    flush_posts(e);
    submit(e);
    pthread_mutex_unlock(&e->lock);
    int64_t deadline = now_ns() + e->stop_timeout_ns;
    for (uint32_t k = 0; k < e->nflights; k++) {
        int64_t left = deadline - now_ns();
        VkFence fence = flight_at(e, k)->fence;
        if (e->vk.WaitForFences(e->device, 1, &fence, VK_TRUE, left > 0 ? (uint64_t)left : 0) != VK_SUCCESS)
            break;
    }
    pthread_mutex_lock(&e->lock);
    retire(e);
    e->abandoned = (int)e->nflights;
    int32_t status = e->faulted ? -LS_EFAULT : -LS_ECANCELED;
    while (e->nflights) {               /* answered, never released: it still runs on the device */
        struct flight *f = flight_at(e, 0);
        for (uint32_t k = 0; k < f->count; k++)
            finish_entry(e, &f->entries[k], status, 0, 0, 1);
        flush_posts(e);
        f->count = 0;
        e->head = (e->head + 1) % NFLIGHT;
        e->nflights--;
    }
    pthread_mutex_unlock(&e->lock);
}

static void *run(void *arg)
{
    ls_engine *e = arg;
    pthread_setname_np(pthread_self(), "libshare-engine");  /* for ps -L, top -H and the tests */
    __atomic_store_n(&e->tid, (int32_t)gettid(), __ATOMIC_RELEASE);
    for (;;) {
        pthread_mutex_lock(&e->lock);
        if (e->stopping) {
            pthread_mutex_unlock(&e->lock);
            break;
        }
        int busy = retire(e);
        check_watchdog(e);
        int can_pop = !e->faulted && !e->device_lost && e->nflights < e->policy.max_in_flight && !deferred(e);
        uint32_t waiting = can_pop ? look(e) : 0;
        int planned = e->policy.planned;
        int piece = can_pop && piece_now(e);  /* a cut goes on: the turn that began it holds */
        /* The same clients wait as when the plan was made, and it is recent: it still holds. */
        int replan = !piece && planned && waiting && (e->waiting_sig != e->plan_sig || e->plan_stale ||
                                                      now_ns() - e->planned_at > (int64_t)e->policy.plan_ns);
        if (replan)
            e->plan_stale = 0;          /* a policy set from here on asks again */
        uint64_t sig = e->waiting_sig;
        pthread_mutex_unlock(&e->lock);
        if (replan) {
            ls_engine_plan_cb(e);       /* Python sets the turns; no lock held */
            pthread_mutex_lock(&e->lock);
            e->plan_sig = sig;
            e->planned_at = now_ns();
            pthread_mutex_unlock(&e->lock);
        }
        pthread_mutex_lock(&e->lock);
        e->withheld = 0;
        if (!piece && waiting && e->policy.planned == (uint32_t)planned && !e->faulted) {
            int popped = drain(e);
            busy |= popped;
            e->withheld = !popped;      /* the plan keeps them waiting: sleep on the fence (work_waiting) */
            e->withheld_sig = sig;
        }
        busy |= piece;
        if (e->cuts)
            busy |= continue_cuts(e);
        int64_t linger = hold(e) ? LINGER_NS - (now_ns() - flight_at(e, 0)->opened) : 0;
        if (linger <= 0 && !deferred(e))
            submit(e);                  /* a lingering submission's time is up (or none is open) */
        pthread_mutex_unlock(&e->lock);
        if (linger > 0)
            sleep_on_bells(e, linger);
        else if (!busy)
            wait_for_work(e);
    }
    shutdown_engine(e);
    return NULL;
}

/* ------------------------------------------------------------------ setup */

static int load_vulkan(ls_engine *e)
{
    void *loader = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!loader)
        loader = dlopen("libvulkan.so.1", RTLD_NOW);
    if (!loader)
        return -ENOENT;
    PFN_vkGetDeviceProcAddr get = (PFN_vkGetDeviceProcAddr)dlsym(loader, "vkGetDeviceProcAddr");
    if (!get)
        return -ENOENT;
#define LOAD(name)                                                                 \
    if (!(e->vk.name = (PFN_vk##name)get(e->device, "vk" #name)))                  \
        return -ENOSYS;
    LOAD(QueueSubmit) LOAD(GetFenceStatus) LOAD(WaitForFences) LOAD(ResetFences) LOAD(CreateFence)
    LOAD(DestroyFence) LOAD(CreateCommandPool) LOAD(DestroyCommandPool) LOAD(AllocateCommandBuffers)
    LOAD(BeginCommandBuffer) LOAD(EndCommandBuffer) LOAD(CmdBindPipeline) LOAD(CmdPushDescriptorSetKHR)
    LOAD(CmdPushConstants) LOAD(CmdDispatch) LOAD(CmdCopyBuffer) LOAD(CmdPipelineBarrier) LOAD(CmdExecuteCommands)
    LOAD(CreateQueryPool)
    LOAD(DestroyQueryPool) LOAD(CmdResetQueryPool) LOAD(CmdWriteTimestamp) LOAD(CmdCopyQueryPoolResults)
    LOAD(CmdFillBuffer)
    LOAD(CreateBuffer) LOAD(DestroyBuffer) LOAD(GetBufferMemoryRequirements) LOAD(AllocateMemory) LOAD(FreeMemory)
    LOAD(BindBufferMemory) LOAD(MapMemory)
#undef LOAD
    e->vk.CmdDispatchBase = (PFN_vkCmdDispatchBase)get(e->device, "vkCmdDispatchBase");  /* 1.1: pieces */
    return 0;
}

/* A query pool and a mapped buffer for a flight's timestamps; without them the flight is untimed. */
static void create_timing(ls_engine *e, struct flight *f)
{
    uint32_t count = LS_ENGINE_MAX_BATCH + 1;
    VkQueryPoolCreateInfo qinfo = {VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO, NULL, 0, VK_QUERY_TYPE_TIMESTAMP, count,
                                   0};
    VkBufferCreateInfo binfo = {VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, NULL, 0, PROGRESS_OFFSET + 8,
                                VK_BUFFER_USAGE_TRANSFER_DST_BIT, VK_SHARING_MODE_EXCLUSIVE, 0, NULL};
    if (e->vk.CreateQueryPool(e->device, &qinfo, NULL, &f->queries) != VK_SUCCESS) {
        f->queries = VK_NULL_HANDLE;
        return;
    }
    VkMemoryRequirements req;
    void *mapped = NULL;
    if (e->vk.CreateBuffer(e->device, &binfo, NULL, &f->results) == VK_SUCCESS) {
        e->vk.GetBufferMemoryRequirements(e->device, f->results, &req);
        VkMemoryAllocateInfo ainfo = {VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, NULL, req.size,
                                      e->cfg.host_memory_type};
        if ((req.memoryTypeBits >> e->cfg.host_memory_type & 1) &&
            e->vk.AllocateMemory(e->device, &ainfo, NULL, &f->results_memory) == VK_SUCCESS &&
            e->vk.BindBufferMemory(e->device, f->results, f->results_memory, 0) == VK_SUCCESS &&
            e->vk.MapMemory(e->device, f->results_memory, 0, VK_WHOLE_SIZE, 0, &mapped) == VK_SUCCESS) {
            f->stamps = mapped;
            f->progress = (volatile uint32_t *)((char *)mapped + PROGRESS_OFFSET);
            return;
        }
    }
    e->vk.DestroyQueryPool(e->device, f->queries, NULL);  /* untimed: the rest is freed by destroy */
    f->queries = VK_NULL_HANDLE;
}

int ls_engine_create(const struct ls_engine_config *config, ls_engine **out)
{
    if (!config->max_clients || config->max_clients > (1u << 20) || !config->offset_alignment)
        return -EINVAL;
    ls_engine *e = calloc(1, sizeof *e);
    if (!e)
        return -ENOMEM;
    e->cfg = *config;
    e->device = (VkDevice)(uintptr_t)config->device;
    e->queue = (VkQueue)(uintptr_t)config->queue;
    e->policy = (struct ls_engine_policy){0, 1, 0, 50000, 16, 2, 1000000};
    e->fence_free = NO_FENCE;
    e->plan_stale = 1;
    e->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    e->clients = calloc(config->max_clients, sizeof *e->clients);
    e->active = calloc(config->max_clients, sizeof *e->active);
    e->pollfds = calloc(config->max_clients + 1, sizeof *e->pollfds);
    e->poll_clients = calloc(config->max_clients + 1, sizeof *e->poll_clients);
    pthread_mutex_init(&e->lock, NULL);
    pthread_mutex_init(&e->queue_lock, NULL);
    int rc = e->wake_fd < 0 ? -errno : 0;
    if (!rc && (!e->clients || !e->active || !e->pollfds || !e->poll_clients))
        rc = -ENOMEM;
    if (!rc)
        rc = load_vulkan(e);
    VkCommandPoolCreateInfo pinfo = {VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, NULL,
                                     VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, config->family};
    if (!rc && e->vk.CreateCommandPool(e->device, &pinfo, NULL, &e->pool) != VK_SUCCESS)
        rc = -ENOMEM;
    for (int k = 0; !rc && k < NFLIGHT; k++) {
        struct flight *f = &e->flights[k];
        VkCommandBufferAllocateInfo ainfo = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, NULL, e->pool,
                                             VK_COMMAND_BUFFER_LEVEL_PRIMARY, 1};
        VkFenceCreateInfo finfo = {VK_STRUCTURE_TYPE_FENCE_CREATE_INFO, NULL, 0};
        if (e->vk.AllocateCommandBuffers(e->device, &ainfo, &f->cb) != VK_SUCCESS ||
            e->vk.CreateFence(e->device, &finfo, NULL, &f->fence) != VK_SUCCESS)
            rc = -ENOMEM;
        else if (config->timestamp_mask)
            create_timing(e, f);
    }
    if (rc) {
        ls_engine_destroy(e);
        return rc;
    }
    *out = e;
    return 0;
}

int ls_engine_start(ls_engine *e)
{
    if (e->started)
        return -EALREADY;
    int rc = pthread_create(&e->thread, NULL, run, e);
    if (rc)
        return -rc;
    e->started = 1;
    while (!__atomic_load_n(&e->tid, __ATOMIC_ACQUIRE))  /* set first thing: ls_engine_thread_id */
        sched_yield();
    return 0;
}

int32_t ls_engine_thread_id(ls_engine *e)
{
    return e->started ? __atomic_load_n(&e->tid, __ATOMIC_ACQUIRE) : -ESRCH;
}

int ls_engine_place(ls_engine *e, int32_t core)
{
    if (!e->started)
        return -ESRCH;
    if (core >= CPU_SETSIZE)
        return -EINVAL;
    if (core >= 0) {
        cpu_set_t only;
        CPU_ZERO(&only);
        CPU_SET(core, &only);
        int rc = pthread_setaffinity_np(e->thread, sizeof only, &only);
        if (rc)
            return -rc;
    }
    __atomic_store_n(&e->placed, core >= 0, __ATOMIC_RELEASE);
    return 0;
}

void ls_engine_wake(ls_engine *e)
{
    uint64_t one = 1;
    ssize_t written = write(e->wake_fd, &one, sizeof one);
    (void)written;                      /* saturated: the engine is awake anyway */
}

int ls_engine_stop(ls_engine *e, int64_t timeout_ns)
{
    if (!e->started)
        return 0;
    pthread_mutex_lock(&e->lock);
    e->stopping = 1;
    e->stop_timeout_ns = timeout_ns;
    pthread_mutex_unlock(&e->lock);
    ls_engine_wake(e);
    pthread_join(e->thread, NULL);
    e->started = 0;
    __atomic_store_n(&e->tid, 0, __ATOMIC_RELEASE);  /* a later start publishes its own */
    return e->abandoned;
}

int ls_engine_destroy(ls_engine *e)
{
    if (!e)
        return 0;
    if (e->started || e->abandoned || e->nflights)
        return -EBUSY;                  /* its command buffers and fences may still be in use */
    if (e->vk.DestroyFence) {
        for (int k = 0; k < NFLIGHT; k++) {
            struct flight *f = &e->flights[k];
            if (f->fence)
                e->vk.DestroyFence(e->device, f->fence, NULL);
            if (f->queries)
                e->vk.DestroyQueryPool(e->device, f->queries, NULL);
            if (f->results)
                e->vk.DestroyBuffer(e->device, f->results, NULL);
            if (f->results_memory)
                e->vk.FreeMemory(e->device, f->results_memory, NULL);  /* unmaps it */
        }
        if (e->pool)
            e->vk.DestroyCommandPool(e->device, e->pool, NULL);
    }
    for (uint32_t i = 0; e->clients && i < e->cfg.max_clients; i++)
        if (e->clients[i].region)
            ls_engine_remove_client(e, i);
    for (struct recording *r = e->spare, *next; r; r = next) {  /* their command buffers go with the pool */
        next = r->next;
        free(r);
    }
    if (e->wake_fd >= 0)
        close(e->wake_fd);
    free(e->clients), free(e->active), free(e->pollfds), free(e->poll_clients);
    free(e->fence_nodes), free(e->events), free(e->plan);
    pthread_mutex_destroy(&e->lock);
    pthread_mutex_destroy(&e->queue_lock);
    free(e);
    return 0;
}

void ls_engine_set_policy(ls_engine *e, const struct ls_engine_policy *policy)
{
    pthread_mutex_lock(&e->lock);
    e->policy = *policy;
    if (e->policy.max_in_flight < 1 || e->policy.max_in_flight > NFLIGHT - 1)
        e->policy.max_in_flight = 2;
    e->nplan = 0;                       /* made under the old policy: ask again */
    e->plan_stale = 1;
    pthread_mutex_unlock(&e->lock);
    ls_engine_wake(e);
}

int32_t ls_engine_queue_submit(ls_engine *e, uint64_t submit_info, uint64_t fence)
{
    pthread_mutex_lock(&e->queue_lock);
    VkResult result = e->vk.QueueSubmit(e->queue, 1, (const VkSubmitInfo *)(uintptr_t)submit_info,
                                        (VkFence)(uintptr_t)fence);
    pthread_mutex_unlock(&e->queue_lock);
    return result;
}

/* ------------------------------------------------------------------ clients */

static struct client *client_at(ls_engine *e, uint32_t slot)
{
    return slot < e->cfg.max_clients && e->clients[slot].region ? &e->clients[slot] : NULL;
}

int ls_engine_add_client(ls_engine *e, uint32_t slot, uint64_t region, int32_t doorbell_fd)
{
    if (slot >= e->cfg.max_clients || !region)
        return -EINVAL;
    pthread_mutex_lock(&e->lock);
    struct client *c = &e->clients[slot];
    int rc = c->region ? -EEXIST : 0;
    if (!rc) {
        memset(c, 0, sizeof *c);
        c->region = (ls_region *)(uintptr_t)region;
        c->doorbell_fd = doorbell_fd;
        c->active_index = e->nactive;
        c->rank = UNRANKED;
        e->active[e->nactive++] = slot;
    }
    pthread_mutex_unlock(&e->lock);
    ls_engine_wake(e);                  /* arm its ring */
    return rc;
}

int ls_engine_close_client(ls_engine *e, uint32_t slot, uint32_t reason)
{
    pthread_mutex_lock(&e->lock);
    struct client *c = client_at(e, slot);
    int rc = -ENOENT;
    if (c) {
        if (reason && !c->closing) {
            ls_close_consumer(c->region, reason);
            cancel_queued(e, slot, -(int32_t)reason);
            c->handed_over = reason == LS_EMOVED;  /* its session waits for what runs, then moves it */
        }
        c->closing = 1;
        if (!c->handed_over)            /* a cut stops at its piece on the device (handed over: continue_cuts) */
            end_cut(e, slot, -(int32_t)(reason ? reason : LS_ECANCELED));
        flush_posts(e);
        settle_drops(e, slot);
        rc = (int)c->outstanding;
    }
    int rest = c && c->cut.active;
    pthread_mutex_unlock(&e->lock);
    if (rest)
        ls_engine_wake(e);              /* to run the rest of its cut */
    return rc;
}

int ls_engine_remove_client(ls_engine *e, uint32_t slot)
{
    int locked = e->started;
    if (locked)
        pthread_mutex_lock(&e->lock);
    struct client *c = client_at(e, slot);
    int rc = c ? 0 : -ENOENT;
    if (c) {
        c->closing = 1;
        if (c->cut.active)
            close_cut(e, c);            /* a stopped engine's: abandoned with its flights */
        settle_drops(e, slot);
        forget_recordings(e, c, NULL);
        free(c->buckets);
        for (uint32_t i = 0; i < c->objects.cap; i++) {
            struct object *o = c->objects.slots[i];
            if (is_taken(&c->objects, o)) {
                if (o->in_flight)
                    o->freed = 1, o->client = slot;  /* abandoned work still names it: leak, never free */
                else
                    free(o);
            }
        }
        free(c->objects.slots);
        uint32_t last = e->active[--e->nactive];
        e->active[c->active_index] = last;
        e->clients[last].active_index = c->active_index;
        memset(c, 0, sizeof *c);
    }
    if (locked)
        pthread_mutex_unlock(&e->lock);
    if (locked)
        ls_engine_wake(e);
    return rc;
}

int ls_engine_stats(ls_engine *e, uint32_t slot, struct ls_engine_stats *out)
{
    pthread_mutex_lock(&e->lock);
    struct client *c = client_at(e, slot);
    if (c) {
        *out = c->stats;
        out->outstanding = c->outstanding;
        out->closing = c->closing;
        out->muted = now_ns() < c->muted_until;
        out->table_slots = c->objects.cap;
        out->table_probes = c->objects.longest;
    }
    pthread_mutex_unlock(&e->lock);
    return c ? 0 : -ENOENT;
}

/* Without the lock: asked before each control request, which must not wait for a drain pass.
 * The slot is the asking client's own, added before its first request and removed after its
 * last; drop_client stores the flag before it closes the ring. */
int ls_engine_dropped(ls_engine *e, uint32_t slot)
{
    if (slot >= e->cfg.max_clients)
        return -ENOENT;
    return (int)__atomic_load_n(&e->clients[slot].dropped, __ATOMIC_ACQUIRE);
}

int ls_engine_take_usage(ls_engine *e, uint32_t slot, struct ls_engine_stats *out)
{
    pthread_mutex_lock(&e->lock);
    struct client *c = client_at(e, slot);
    if (c) {
        int pending = c->closing ? 0 : waits(c);  /* now: the plan is made now */
        c->stats.pending = pending > 0 ? (uint32_t)pending : 0;   /* a corrupt ring: the next look drops it */
        *out = c->stats;
        out->outstanding = c->outstanding;
        out->table_slots = c->objects.cap;
        out->table_probes = c->objects.longest;
        c->stats.popped_since = c->stats.charged_since = c->stats.charged_ns_since = 0;
    }
    pthread_mutex_unlock(&e->lock);
    return c ? 0 : -ENOENT;
}

/* ------------------------------------------------------------------ objects */

static int put_object(ls_engine *e, uint32_t slot, struct object *o)
{
    pthread_mutex_lock(&e->lock);
    struct client *c = client_at(e, slot);
    int rc = !c ? -ENOENT : table_find(&c->objects, o->kind, o->id) ? -EEXIST : table_put(&c->objects, o);
    pthread_mutex_unlock(&e->lock);
    if (rc)
        free(o);
    return rc;
}

int ls_engine_put_program(ls_engine *e, uint32_t slot, uint32_t id, uint64_t pipeline, uint64_t layout,
                          uint32_t bindings, uint32_t push_size, uint32_t flags)
{
    if (!pipeline || !layout || bindings > LS_MAX_BUFFERS || push_size > LS_MAX_PUSH || (flags & ~LS_ENGINE_CUTTABLE))
        return -EINVAL;
    struct object *o = calloc(1, sizeof *o);
    if (!o)
        return -ENOMEM;
    *o = (struct object){.id = id, .kind = LS_KIND_PROGRAM, .handle = pipeline, .layout = layout,
                         .bindings = bindings, .push_size = push_size, .client = slot,
                         .cuttable = flags & LS_ENGINE_CUTTABLE};
    return put_object(e, slot, o);
}

int ls_engine_put_buffer(ls_engine *e, uint32_t slot, uint32_t id, uint64_t buffer, uint64_t size)
{
    if (!buffer || !size)
        return -EINVAL;
    struct object *o = calloc(1, sizeof *o);
    if (!o)
        return -ENOMEM;
    *o = (struct object){.id = id, .kind = LS_KIND_BUFFER, .handle = buffer, .size = size, .client = slot};
    return put_object(e, slot, o);
}

/* A drop waits, the object still in the table, while descriptors that the client published
 * before it wait in its ring: they were pushed before the free and must still find the object.
 * (The control plane popped and submitted them at once instead, whatever the plan said: a low
 * client that sent a free, even a refused one, after queueing heavy work made a realtime
 * client's round trip take 660-740 ms, 90 times one of its own dispatches.) Descriptors it
 * publishes after the free may find the object too, until the drop is carried out: the client's
 * own object, which still counts against its limits (Client.held). */
static int defer_drop(ls_engine *e, uint32_t slot, uint32_t kind, uint32_t id)
{
    struct client *c = &e->clients[slot];
    if (c->closing || !c->region || ls_sq_pending(c->region) <= 0)  /* (a corrupt ring: dropped at the next look) */
        return drop_now(e, slot, kind, id, 0);
    struct pending_drop *d = malloc(sizeof *d + LS_MAX_LANES * sizeof(uint32_t));
    int lanes = d ? ls_sq_marks(c->region, d->marks, LS_MAX_LANES) : -ENOMEM;
    if (lanes < 0) {
        free(d);
        return drop_now(e, slot, kind, id, 0);
    }
    d->kind = kind, d->id = id, d->nmarks = (uint32_t)lanes;
    d->next = c->drops;
    c->drops = d;
    return 1;
}

int ls_engine_drop(ls_engine *e, uint32_t slot, uint32_t kind, uint32_t id)
{
    pthread_mutex_lock(&e->lock);
    struct client *c = client_at(e, slot);
    int rc = c && table_find(&c->objects, kind, id) ? defer_drop(e, slot, kind, id) : -ENOENT;
    pthread_mutex_unlock(&e->lock);
    return rc;
}

/* ------------------------------------------------------------------ faults and plans */

void ls_engine_set_busy_word(ls_engine *e, uint64_t word_address)
{
    __atomic_store_n(&e->busy, (volatile uint32_t *)(uintptr_t)word_address, __ATOMIC_RELEASE);
}

void ls_engine_set_fault(ls_engine *e, uint32_t faulted)
{
    pthread_mutex_lock(&e->lock);
    e->faulted = faulted != 0;
    if (e->started)
        retire(e);                      /* finished work: answered LS_EFAULT now */
    pthread_mutex_unlock(&e->lock);
    ls_engine_wake(e);
}

int ls_engine_in_flight(ls_engine *e)
{
    pthread_mutex_lock(&e->lock);
    int n = (int)e->nflights;
    pthread_mutex_unlock(&e->lock);
    return n;
}

int ls_engine_in_flight_clients(ls_engine *e, uint32_t *out, uint32_t max)
{
    pthread_mutex_lock(&e->lock);
    uint32_t n = 0;
    for (uint32_t k = 0; k < e->nflights; k++) {
        struct flight *f = flight_at(e, k);
        for (uint32_t j = 0; j < f->count && n < max; j++) {
            uint32_t slot = f->entries[j].client, seen = 0;
            for (uint32_t i = 0; i < n && !seen; i++)
                seen = out[i] == slot;
            if (!seen)
                out[n++] = slot;
        }
    }
    pthread_mutex_unlock(&e->lock);
    return (int)n;
}

int ls_engine_set_plan(ls_engine *e, const struct ls_engine_turn *turns, uint32_t count)
{
    pthread_mutex_lock(&e->lock);
    int rc = 0;
    if (count > e->plan_cap) {
        struct ls_engine_turn *grown = realloc(e->plan, count * sizeof *grown);
        if (grown)
            e->plan = grown, e->plan_cap = count;
        else
            rc = -ENOMEM;
    }
    if (!rc) {
        memcpy(e->plan, turns, count * sizeof *turns);
        e->nplan = count;
        for (uint32_t t = 0; t < count; t++)    /* piece_now's view of who outranks a cut */
            if (turns[t].client < e->cfg.max_clients)
                e->clients[turns[t].client].rank = turns[t].rank;
    }
    pthread_mutex_unlock(&e->lock);
    return rc;
}
