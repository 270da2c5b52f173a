/*
 * The only place libshare touches memory ordering or futexes.
 *
 * Every cross-process word is a naturally aligned uint32_t in shared memory.
 * Producers publish with store-release and consumers read with load-acquire;
 * the one full barrier (ls_smp_mb) sits in the sleep/wake handshake, where
 * each side stores its own word and then loads the other side's (Dekker), so
 * that either the sleeper sees the new entries or the waker sees the
 * NEED_WAKEUP flag. Each call site names the barrier it pairs with.
 */
#ifndef LIBSHARE_SYNC_H
#define LIBSHARE_SYNC_H

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#define ls_load_acquire(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define ls_store_release(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define ls_load_relaxed(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define ls_store_relaxed(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define ls_exchange(p, v) __atomic_exchange_n((p), (v), __ATOMIC_ACQ_REL)
#define ls_fetch_add(p, v) __atomic_fetch_add((p), (v), __ATOMIC_ACQ_REL)
#define ls_fetch_or(p, v) __atomic_fetch_or((p), (v), __ATOMIC_ACQ_REL)
#define ls_fetch_and(p, v) __atomic_fetch_and((p), (v), __ATOMIC_ACQ_REL)
#define ls_cas(p, expected_ptr, desired) \
    __atomic_compare_exchange_n((p), (expected_ptr), (desired), 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)
#define ls_smp_mb() __atomic_thread_fence(__ATOMIC_SEQ_CST)
/* Fences for a plain word that publishes plain bytes (a signal handler's reader, which takes no lock). */
#define ls_fence_acquire() __atomic_thread_fence(__ATOMIC_ACQUIRE)
#define ls_fence_release() __atomic_thread_fence(__ATOMIC_RELEASE)

static inline void ls_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* One step of a spin that leaves the core to any other runnable thread on it (the peer the
 * spinner waits for, when the two share a core): sched_yield returns at once when none is. */
static inline void ls_spin_step(void)
{
    sched_yield();
}

static inline int64_t ls_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Shared (not FUTEX_PRIVATE) operations: the words live in memory mapped by several processes. */
static inline int ls_futex_wait_impl(uint32_t *word, uint32_t expected, int64_t timeout_ns)
{
    struct timespec ts;
    if (timeout_ns < 0)
        timeout_ns = 0;
    ts.tv_sec = timeout_ns / 1000000000;
    ts.tv_nsec = timeout_ns % 1000000000;
    if (syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, NULL, 0) == 0)
        return 0;
    return -errno;
}

static inline int ls_futex_wake_impl(uint32_t *word, int32_t count)
{
    long woken = syscall(SYS_futex, word, FUTEX_WAKE, count, NULL, NULL, 0);
    return woken < 0 ? -errno : (int)woken;
}

#endif
