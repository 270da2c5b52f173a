/*
 * The peers of a region and how each wakes the other: liveness, doorbells, sleep and wake.
 *
 * Design
 * ------
 * Sleep and wake follow io_uring's SQPOLL. A consumer that finds nothing
 * spins for a bounded time (yielding its core at each look: on a machine with
 * fewer cores than busy threads, a spinner that kept its core would hold off
 * the very thread it waits for), then sets LS_NEED_WAKEUP in sq_flags, issues
 * a full barrier, looks once more, and sleeps on the sq_bell futex word. A
 * producer, after publishing its tail, issues a full barrier and reads
 * sq_flags; only when the flag is set does it take it (exchange to 0), bump
 * sq_bell and wake the consumer. So while the consumer polls, producers make
 * no system call. The arbiter's engine sleeps on many rings at once, in poll(),
 * so a client given a doorbell (ls_set_wake_fd: one end of a datagram socket
 * pair whose other end only the arbiter holds) writes 8 bytes there instead of
 * waking the futex. The completion ring works the same way in the other
 * direction: a client thread sleeps on the cq_bell futex (LS_NEED_WAKEUP), and
 * an event loop, which cannot block in a futex, asks for a byte on its end of
 * the doorbell instead (ls_cq_arm sets LS_NEED_WAKEUP_FD) and polls it; the
 * poster takes both flags at once and wakes each kind of waiter it finds.
 *
 * A consumer may also wait for the completion ring to drain: a client whose
 * ring holds work while every completion slot is taken cannot be given more
 * (its answers would have nowhere to go), and polling it would keep the
 * consumer's core busy for as long as the client chose not to read. So the
 * consumer sets LS_NEED_ROOM instead of LS_NEED_WAKEUP (ls_sq_arm_room: a
 * push could not be taken either, so it rings nothing), and ls_cq_pop, after
 * releasing slots, rings the consumer the same way a push does when it finds
 * that flag.
 *
 * Each side announces itself in the bells (its pid, alive or closed); the
 * consumer closes its side for a reason the client can read. Every sleep is
 * cut into slices of at most LS_SLICE_NS; between slices the sleeper checks
 * that its peer is alive (a pidfd, or the peer's state word), so a dead peer
 * is noticed within one slice.
 */
#include "region.h"

#include <poll.h>
#include <sys/socket.h>

#define LS_SPIN_OFF_FACTOR 20           /* no spin while waits average 20 spins (see ring_wait_for) */
#define LS_SLICE_NS 50000000LL          /* 50 ms: how long a dead peer can go unnoticed */

/* ------------------------------------------------------------------ peers */

/* A byte on the doorbell socket for an async waiter. Never blocks (MSG_DONTWAIT: a full socket
 * has its wake-up already) and never raises SIGPIPE. */
static void ring_bell(ls_region *r)
{
    char one = 1;
    if (r->wake_fd >= 0 && send(r->wake_fd, &one, 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
        return;                         /* full, or the client's end is gone: nothing to wake */
}

void ls_set_consumer(ls_region *r, uint32_t pid, uint32_t state)
{
    ls_store_relaxed(&r->bells->consumer_pid, pid);
    ls_store_release(&r->bells->consumer_state, state);
    if (state == LS_PEER_CLOSED) {      /* wake a client asleep on completions so it sees the close */
        ls_futex_wake_impl(&r->bells->cq_bell, INT_MAX);
        ring_bell(r);
    }
}

void ls_close_consumer(ls_region *r, uint32_t reason)
{
    /* The first reason stays: a ring closed for a reason (terminated, faulted, handed over) is
     * closed again, with 0, when the arbiter shuts down, and the client must still read why. */
    int closed_for_a_reason = ls_load_acquire(&r->bells->consumer_state) == LS_PEER_CLOSED &&
                              ls_load_acquire(&r->bells->close_reason) != 0;
    if (!closed_for_a_reason)
        ls_store_relaxed(&r->bells->close_reason, reason);
    ls_set_consumer(r, ls_load_acquire(&r->bells->consumer_pid), LS_PEER_CLOSED);
}

uint32_t ls_close_reason(const ls_region *r)
{
    if (ls_load_acquire(&r->bells->consumer_state) != LS_PEER_CLOSED)
        return 0;
    return ls_load_acquire(&r->bells->close_reason);
}

void ls_set_client(ls_region *r, uint32_t pid, uint32_t state)
{
    ls_store_relaxed(&r->bells->client_pid, pid);
    ls_store_release(&r->bells->client_state, state);
}

void ls_set_peer_pidfd(ls_region *r, int pidfd) { r->peer_pidfd = pidfd; }

void ls_set_wake_fd(ls_region *r, int doorbell_fd) { r->wake_fd = doorbell_fd; }

int ls_set_spin_mode(ls_region *r, uint32_t mode)
{
    if (mode > LS_SPIN_NONE)
        return -EINVAL;
    r->spin_mode = mode;
    return 0;
}

static int pidfd_exited(int pidfd)
{
    struct pollfd p = {.fd = pidfd, .events = POLLIN};
    return pidfd >= 0 && poll(&p, 1, 0) > 0;
}

static int peer_gone(ls_region *r, const uint32_t *state_word)
{
    return ls_load_acquire(state_word) == LS_PEER_CLOSED || pidfd_exited(r->peer_pidfd);
}

/* ------------------------------------------------------------------ wakers */

/* The first waker takes every flag, and the consumer arms again. */
void ring_notify_consumer(ls_region *r, uint32_t flag)
{
    struct ls_bells *b = r->bells;
    /* Pairs with the ls_smp_mb in ring_wait_for (ls_sq_wait), ls_sq_arm and ls_sq_arm_room after
     * they set their flags: either the consumer sees our tail (or head), or we see its flag. */
    ls_smp_mb();
    if (!(ls_load_relaxed(&b->sq_flags) & flag))
        return;
    if (!(ls_exchange(&b->sq_flags, 0) & flag))
        return;                         /* another producer took the wake */
    ls_fetch_add(&b->sq_bell, 1);
    if (r->wake_fd >= 0) {
        uint64_t one = 1;
        ssize_t written = write(r->wake_fd, &one, sizeof one);
        (void)written;                  /* a full doorbell already wakes its reader */
    } else {
        ls_futex_wake_impl(&b->sq_bell, 1);
    }
}

void ring_notify_client(ls_region *r)
{
    struct ls_bells *b = r->bells;
    /* Pairs with the ls_smp_mb in ring_wait_for (ls_cq_wait) and ls_cq_arm after they set their
     * flags: either the client sees the completions just published, or we see its flag. */
    ls_smp_mb();
    uint32_t wanted;
    if (ls_load_relaxed(&b->cq_flags) && (wanted = ls_exchange(&b->cq_flags, 0))) {
        if (wanted & LS_NEED_WAKEUP) {
            ls_fetch_add(&b->cq_bell, 1);
            ls_futex_wake_impl(&b->cq_bell, INT_MAX);
        }
        if (wanted & LS_NEED_WAKEUP_FD)
            ring_bell(r);
    }
}

/* ------------------------------------------------------------------ sleepers */

/*
 * The shared sleep: spin on ready() for spin_ns, then sleep on *bell with
 * NEED_WAKEUP set in *flags, in slices, until ready() > 0, the peer is gone,
 * or timeout_ns passes (a negative timeout waits forever, slice by slice).
 * Each step of the spin yields the core (ls_spin_step): a spinner that shares
 * its core with the thread it waits for lets it run at once. A yield may also
 * hand the core to an unrelated busy thread for a whole time slice, so each
 * view has a spin mode (ls_set_spin_mode, from the session's priority):
 *   LS_SPIN_YIELD  (normal, high) yield at each look, and keep spinning while
 *                  waits average up to LS_SPIN_OFF_FACTOR spins;
 *   LS_SPIN_KEEP   (realtime) keep the core, and spin only while waits end
 *                  within the spin on average: its spin must not hold a core
 *                  the arbiter needs to answer it;
 *   LS_SPIN_NONE   (low) sleep at once: background work does not poll.
 * Past the threshold only every 16th wait spins; one that ends within its spin
 * turns spinning back on (the average alone would not: waits that sleep are slow
 * because they sleep). The engine's own polls yield only where it is placed with
 * the driver's thread (engine/wait.c, "Cores").
 */
int ring_wait_for(ls_region *r, int (*ready)(ls_region *, uint32_t), uint32_t want, uint32_t *flags,
                  uint32_t *bell, const uint32_t *peer_state, int64_t spin_ns, int64_t timeout_ns)
{
    int64_t start = ls_now_ns();
    int64_t deadline = timeout_ns < 0 ? INT64_MAX : start + timeout_ns;
    int n;
    if (r->spin_mode == LS_SPIN_NONE)
        spin_ns = 0;
    int off = r->wait_ns > (r->spin_mode == LS_SPIN_KEEP ? 1 : LS_SPIN_OFF_FACTOR) * spin_ns;
    if (off && (r->waits & 15))
        spin_ns = 0;
    r->waits++;
    for (uint32_t iter = 0;; iter++) {
        if ((n = ready(r, want)) != 0) {
            int64_t took = ls_now_ns() - start;
            r->wait_ns = off ? took : r->wait_ns + (took - r->wait_ns) / 8;
            return n;
        }
        if ((iter & 7) == 0 && ls_now_ns() - start >= spin_ns)
            break;
        if (r->spin_mode == LS_SPIN_KEEP)
            ls_cpu_relax();
        else
            ls_spin_step();
    }
    for (;;) {
        uint32_t seen = ls_load_acquire(bell);
        ls_fetch_or(flags, LS_NEED_WAKEUP);  /* beside an async waiter's LS_NEED_WAKEUP_FD */
        /* Pairs with the waker's ls_smp_mb after it publishes (ring_notify_consumer,
         * ring_notify_client): either we see its entries below, or it sees NEED_WAKEUP and
         * bumps the bell. */
        ls_smp_mb();
        if ((n = ready(r, want)) != 0)
            break;
        if (peer_gone(r, peer_state)) {
            n = -LS_EPEERDEAD;
            break;
        }
        int64_t now = ls_now_ns();
        if (now >= deadline) {
            n = -ETIMEDOUT;
            break;
        }
        int64_t slice = deadline - now < LS_SLICE_NS ? deadline - now : LS_SLICE_NS;
        ls_futex_wait_impl(bell, seen, slice);
    }
    ls_fetch_and(flags, ~(uint32_t)LS_NEED_WAKEUP);
    if (n > 0)
        r->wait_ns += (ls_now_ns() - start - r->wait_ns) / 8;
    return n;
}

static int sq_ready(ls_region *r, uint32_t want)
{
    (void)want;
    return ls_sq_pending(r);
}

int ls_sq_wait(ls_region *r, int64_t spin_ns, int64_t timeout_ns)
{
    struct ls_bells *b = r->bells;
    return ring_wait_for(r, sq_ready, 1, &b->sq_flags, &b->sq_bell, &b->client_state, spin_ns,
                         timeout_ns);
}

int ls_sq_arm(ls_region *r)
{
    ls_store_relaxed(&r->bells->sq_flags, LS_NEED_WAKEUP);
    /* Pairs with the producer's ls_smp_mb in ring_notify_consumer: either the caller
     * sees the entries counted here, or the producer sees NEED_WAKEUP and rings. */
    ls_smp_mb();
    return ls_sq_pending(r);
}

int ls_sq_arm_room(ls_region *r)
{
    ls_store_relaxed(&r->bells->sq_flags, LS_NEED_ROOM);  /* a push could not be taken: it rings nothing */
    /* Pairs with the ls_smp_mb in ring_notify_consumer after ls_cq_pop releases slots. */
    ls_smp_mb();
    return ls_cq_space(r);
}

void ls_sq_disarm(ls_region *r) { ls_store_relaxed(&r->bells->sq_flags, 0); }

static int cq_ready_at_least(ls_region *r, uint32_t want)
{
    int ready = ls_cq_ready(r);
    return (ready < 0 || (uint32_t)ready >= want) ? ready : 0;
}

int ls_cq_arm(ls_region *r)
{
    ls_fetch_or(&r->bells->cq_flags, LS_NEED_WAKEUP_FD);
    /* Pairs with the ls_smp_mb in ring_notify_client after ls_cq_post publishes: either the caller
     * sees the completions counted here, or the poster sees LS_NEED_WAKEUP_FD and sends a byte. */
    ls_smp_mb();
    return ls_cq_ready(r);
}

int ls_cq_wait(ls_region *r, uint32_t min_ready, int64_t spin_ns, int64_t timeout_ns)
{
    struct ls_bells *b = r->bells;
    if (min_ready == 0 || min_ready > r->cq_entries)
        return -EINVAL;
    return ring_wait_for(r, cq_ready_at_least, min_ready, &b->cq_flags, &b->cq_bell,
                         &b->consumer_state, spin_ns, timeout_ns);
}

/* ------------------------------------------------------------------ futex */

/* Futex helpers for callers with words of their own (tests), over sync.h's. */
int ls_futex_wait(uint32_t *word, uint32_t expected, int64_t timeout_ns)
{
    return ls_futex_wait_impl(word, expected, timeout_ns);
}

int ls_futex_wake(uint32_t *word, int32_t count) { return ls_futex_wake_impl(word, count); }
