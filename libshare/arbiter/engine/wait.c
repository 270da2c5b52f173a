/*
 * How the engine's loop waits (loop.c, the third step): polling the oldest fence or sleeping
 * on it in naps, spinning on the rings after work, sleeping in ppoll() on the doorbells, and
 * the doorbells' budget.
 *
 * Cores. Lavapipe (Mesa 22.3 with LLVM 15 here) exposes one queue and runs a
 * whole dispatch on its queue thread: a 64-workgroup dispatch keeps 0.99 of a
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
 * on one core and its Python threads on the others (policy/placement.py), and the
 * engine's polls then yield that core at each look (poll_step): a poll that
 * keeps it holds off the queue thread it waits for. A yield can also hand the
 * core to an unrelated busy thread for a whole time slice, so one that lost the
 * core for over YIELD_LOST_NS stops the yields for YIELD_PAUSE_NS: the polls
 * keep the core meanwhile, as unplaced (a fence poll's loss stops every poll's
 * yields, a spin's only the spins': poll_step says why). Moving the engine off
 * its core for that time instead (to any of the arbiter's cores) is worse: with
 * two busy processes on the 2-core VM the round trip's p99 is 3.9-4.0 ms in three
 * runs of three moving, 0.15-2.8 ms staying (one busy process: 164-218 us against
 * 99-184 us). On the 2-core VM, three rounds alternating, the clients' waits
 * yielding too (ring.c): eight Python clients against eight private devices run
 * 0.93-1.12x placed and yielding, 0.88-0.98x unplaced and yielding, 0.58-0.62x
 * unplaced with polls that keep the core; the tiny round trip takes 20.8-24.2 us,
 * 18.8-49.0 us and 32-55 us. An embedded arbiter is not placed (its process's
 * other threads are the application's).
 *
 * Doorbells.
 * Each client has a doorbell of its own, and a doorbell rings one way: it is a
 * datagram socket pair made at hello, of which the client gets one end, and
 * what it writes there arrives at the other end, which only the arbiter holds,
 * until the client is reclaimed. A client can ring nothing but its own bell,
 * and cannot read a ring at all: with one eventfd shared by everyone, a client
 * that read it in a loop would swallow the others' wake-ups, and each of their
 * round trips would wait out the 2 s poll. Nor can it make the arbiter's read block
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
#include "internal.h"

#include <sched.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define IDLE_NS 2000000000LL            /* sleep on the bells this long when idle */
#define MUTED_NS 20000000LL             /* ... while a doorbell is muted */
#define FENCE_SLICE_NS 20000000LL       /* wait on the oldest fence this long, then look again */
#define FENCE_NAP_NS 25000LL            /* ... at least this long while another submission may go */
#define FENCE_SPIN_COMMANDS 2           /* poll the fence of a submission of at most this many commands */
#define YIELD_LOST_NS 500000LL          /* a yield that lost the core this long ... */
#define YIELD_PAUSE_NS 50000000LL       /* ... stops the polls' yields this long */
#define BELL_CREDIT 32.0                /* empty wake-ups a client may cause at once */
#define BELL_REFILL 32.0                /* credits per second */
#define BELL_PENALTY_NS 1000000000LL    /* a bell past its budget is not listened to this long */
#define BELL_READS 256                  /* datagrams read off a bell at a ring, at most */

/* ------------------------------------------------------------------ doorbells */

/* Client slot's doorbell rang: empty it, and charge the wake-up to the client's budget when it
 * brought no work (see "Doorbells"); past the budget, the bell is muted for BELL_PENALTY_NS. */
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

/* ------------------------------------------------------------------ polls */

/* A look at the rings (and at stop, and with events_too at queued events) under the lock. With
 * new_only, the very clients that the last pass's plan withheld, waiting still while as many
 * submissions run, are not work: a pass would pop nothing again (engine_policy.c, "Policy"). */
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
 * on this core; a loss there stops the spins' yields only. Were it to stop both, another
 * arbiter's engine and queue thread, busy on the same core, would take the yield of this one's
 * spin after each of its blocks of round trips, and the pause would keep this engine's fence
 * polls from yielding to its own queue thread through its next block (R3 of
 * bench/test_restart_bench.py: 17% of round trips over 60 us so, against 0.2-0.5%). A fence
 * poll's yield that comes back at once ends a spins' pause: nothing busy shares the core. (With
 * the spins' pause left to run out, the arbiter that lost the yields has a median round trip of
 * 19-21 us against the other's 16-17 us: a spin that keeps the core holds off the queue
 * thread's own work after a submission.) */
static void poll_step(ls_engine *e, int fence)
{
    int64_t now = ls_now_ns();
    int paused = now < e->fence_yields_paused_until || (!fence && now < e->spin_yields_paused_until);
    if (!ls_load_acquire(&e->placed) || paused) {  /* pairs with ls_engine_place's ls_store_release */
        for (int k = 0; k < 64; k++)
            ls_cpu_relax();
        return;
    }
    sched_yield();
    int64_t after = ls_now_ns();
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
    int64_t deadline = ls_now_ns() + (int64_t)e->policy.spin_ns;
    do {
        if (work_waiting(e, 1, 0))
            return 1;
        poll_step(e, 0);
    } while (ls_now_ns() < deadline);
    return 0;
}

/* ------------------------------------------------------------------ sleeping */

/* Arm every ring and sleep on the engine's eventfd and the heard doorbells (IDLE_NS, MUTED_NS
 * while one is muted). With linger_ns, for at most that long, and the rings of streaming
 * clients stay unarmed: their pushes are what the lingering submission waits to take. */
void sleep_on_bells(ls_engine *e, int64_t linger_ns)
{
    pthread_mutex_lock(&e->lock);
    int64_t now = ls_now_ns();
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
        now = ls_now_ns();
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
 * A longer one, or one that has run longer, is looked at once and slept on: polling it would
 * cost as much CPU as it runs, and placed, the polls would take half the core the submission
 * runs on (a dispatch of 2.6 s alone takes 5.0 s so). While another submission may go, the sleep
 * is a nap, after which the loop pops what came meanwhile: a quarter of the time the head has
 * run, at least FENCE_NAP_NS and at most FENCE_SLICE_NS (the fence ends the nap as soon as it
 * signals, so the device never waits on a nap; what arrives waits at most the nap to be
 * popped, behind work that has run four times as long); else a FENCE_SLICE_NS slice.
 *
 * The naps grow, and the slice is long (20 ms), for a reason of the kernel's as much as of
 * CPU. Placed, this thread and lavapipe's queue thread are pinned to one core; a thread that
 * sleeps and wakes every 25-500 us there, beside a pinned thread that runs, starves a process
 * of another session (another autogroup) that pins itself to that core while the machine is
 * otherwise busy: for the whole of the submission, seconds. Mesa pins every process that loads
 * lavapipe to each core in turn (it reads each AMD core's APIC id), so a vetting compiler
 * child, or a client opening a private device, would wait for another client's long dispatch
 * to end. Outside libshare on this VM (kernel 6.18), with two pinned threads of one process,
 * one busy and one in a nanosleep loop, and two busy processes, a new session's process pinned
 * to that core waits over 8 s with naps of 25 us to 1 ms, not at all with 2 ms or more, nor
 * with the napper unpinned. */
static void wait_for_fence(ls_engine *e)
{
    pthread_mutex_lock(&e->lock);
    struct flight *f = flight_at(e, 0);
    VkFence fence = f->fence;
    int more = e->nflights < e->policy.max_in_flight && !deferred(e);
    int64_t ran = ls_now_ns() - f->head_since;
    int64_t spin = f->count > FENCE_SPIN_COMMANDS || ran >= (int64_t)e->policy.spin_ns
                       ? 0 : (int64_t)e->policy.spin_ns - ran;  /* 0: one look, then sleep */
    int64_t nap = ran / 4 < FENCE_NAP_NS ? FENCE_NAP_NS : ran / 4 > FENCE_SLICE_NS ? FENCE_SLICE_NS : ran / 4;
    pthread_mutex_unlock(&e->lock);
    int64_t deadline = ls_now_ns() + spin;
    do {
        if (e->vk.GetFenceStatus(e->device, fence) != VK_NOT_READY)
            return;
        if (more && work_waiting(e, 0, 1))
            return;
        poll_step(e, 1);
    } while (ls_now_ns() < deadline);
    e->vk.WaitForFences(e->device, 1, &fence, VK_TRUE, more ? (uint64_t)nap : FENCE_SLICE_NS);
}

/* The loop's wait when it has nothing to do now: on the oldest fence, else a spin, then the bells. */
void wait_for_work(ls_engine *e)
{
    if (e->nflights) {
        wait_for_fence(e);
        return;
    }
    if (!spin(e))
        sleep_on_bells(e, 0);
}
