/* The data path: the device session's ring, its tickets, the submissions in flight and the waits.
 *
 * vkCreateDevice opens the ring its session's welcome carried, as the C API does (bindings/c/
 * capi.c's open_ring): the memfd mapped whole, ls_region_open (which checks the arbiter's header),
 * the doorbell as the region's wake descriptor, a pidfd of the arbiter (the welcome's arbiter_pid)
 * so that a wait notices its death, one submission lane (ls_producer_open) and a ticket book
 * (libshare/ring/tickets.c). vkDestroyDevice closes all of it; the driver starts no thread.
 *
 * A submission (submit.c reads and checks it) is queued in order. It is pushed at once, unless it
 * waits for a timeline value that no earlier submission signals and the host has not reached, or
 * an earlier one is held: then it is held, not pushed, until vkSignalSemaphore reaches the value
 * (ls_icd_path_release pushes the held ones in order). Pushed, each command buffer's lists become
 * one LS_OP_LIST descriptor each (program: the list id), in order; a submission without lists
 * that signals a fence or semaphore is one LS_OP_NOP, answered once everything before it is. Each
 * descriptor is a ticket of the device's numbering, recorded in the book by the push itself, so
 * a submission's tickets are the range [first, end).
 *
 * Answers are read from the completion ring by one reader at a time (cq_lock): a waiter that
 * finds work pending sleeps on the ring (ls_tickets_wait: the ring's LS_SPIN_NS spin, then the
 * futex, in slices of SLICE_NS so that the deadline and the arbiter's death are looked at), other
 * waiters sleep on the condition ``changed``, which the reader broadcasts once it filed what it
 * read. A submission whose every ticket is answered retires: its fence is signaled, its timeline
 * semaphores reach their values, its command buffers are handed to ls_icd_command_buffer_done.
 * An answer that is an error (an LS_E* status: the arbiter refused or cancelled the work, as
 * terminate_client does), a ring that fails (the arbiter closed the session or died: -LS_EPEERDEAD)
 * or a push that fails makes the device lost: nothing more is retired (no fence of it signals),
 * the command buffers queued are handed back, and every later submission and wait answers
 * VK_ERROR_DEVICE_LOST. A submission, and a control request (control.c), first looks at the
 * arbiter's pidfd (ls_icd_path_survive; a wait does too, before each sleep, and a sleep on the ring
 * that the death or a hand-over ended leaves the decision to it; a hand-over, the ring closed
 * LS_EMOVED, is waited out until the old arbiter exits): when it died with everything it took
 * answered or answered LS_EMOVED (the answers it left are filed first), the device moves to the
 * arbiter a control daemon started in its place (reattach.c, which says hello and hands its objects
 * over, then ls_icd_path_reopen maps the new ring under cq_lock: the same queue, a new book, the
 * numbering goes on), the descriptors it never ran (answered LS_EMOVED, or never taken: the lane's
 * unconsumed ones, ls_producer_unconsumed, the last ones pushed) are pushed there again under their
 * tickets, rebuilt from the queued submissions, and new work goes there too; a death met with work
 * it took unanswered (that work may have run, wholly or in part), or with no successor, makes the
 * device lost (docs/icd.md, "Surviving a restart"). vkDeviceWaitIdle of VK_NULL_HANDLE (Taichi's
 * device destructor calls it when its device was never made) and vkQueueWaitIdle of one
 * answer LS_ICD_INVALID.
 *
 * The device's lock is held around everything here but the sleeps; cq_lock is taken after it,
 * never before (a reader sleeping on the ring holds cq_lock alone). */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "icd.h"
#include "reattach.h"
#include "ring.h"

#define SLICE_NS 50000000LL       /* the longest sleep between looks at a deadline (capi.c's LSX_SLICE_NS) */
#define FULL_WAIT_NS 1000000LL    /* a full lane waits this long for answers (capi.c's LSX_FULL_WAIT_NS) */
#define MOST_RING (1ull << 30)    /* bytes of a ring the driver maps at most */

struct ls_icd_path {
    void *base;                   /* the ring's mapping */
    uint64_t size;
    ls_region *region;
    ls_producer *producer;
    ls_tickets *book;
    int pidfd;                    /* the arbiter's, or -1 */
    pthread_mutex_t cq_lock;      /* held by the completion ring's one reader */
    pthread_cond_t changed;       /* answers filed, a semaphore signaled, or the device lost */
    int locks;                    /* 1 once cq_lock and changed exist */
    uint64_t next_ticket;
    struct ls_icd_submission *queued; /* in submission order: the pushed, then the held */
    uint32_t nqueued, capacity;
    int lost;
    int busy;                     /* retiring or surviving: a control request made meanwhile (a freed
                                   * command buffer's lists) does not look at the arbiter again */
};

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The ring's parts (its tickets, lane, region, mapping and the arbiter's pidfd) closed. */
static void close_ring(struct ls_icd_path *path)
{
    if (path->book)
        ls_tickets_free(path->book);
    if (path->producer)
        ls_producer_close(path->producer);
    if (path->region) {
        ls_set_client(path->region, (uint32_t)getpid(), LS_PEER_CLOSED);
        ls_region_close(path->region);
    }
    if (path->base)
        munmap(path->base, path->size);
    if (path->pidfd >= 0)
        close(path->pidfd);
    path->book = NULL;
    path->producer = NULL;
    path->region = NULL;
    path->base = NULL;
    path->pidfd = -1;
}

static void close_path(struct ls_icd_path *path)
{
    close_ring(path);
    if (path->locks) {
        pthread_mutex_destroy(&path->cq_lock);
        pthread_cond_destroy(&path->changed);
    }
    free(path->queued);
    free(path);
}

static int open_locks(struct ls_icd_path *path)
{
    pthread_condattr_t attr;
    int rc = pthread_condattr_init(&attr);
    if (rc == 0)
        rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(&path->changed, &attr);
    pthread_condattr_destroy(&attr);
    if (rc == 0 && pthread_mutex_init(&path->cq_lock, NULL) != 0) {
        pthread_cond_destroy(&path->changed);
        rc = -1;
    }
    path->locks = rc == 0;
    return rc == 0 ? 0 : -1;
}

/* The ring ``session``'s welcome carried, opened into ``path``: 0, or -1 (close_ring closes what was). */
static int open_ring(struct ls_icd_path *path, const struct ls_icd_session *session)
{
    struct stat st;
    if (fstat(session->ring_fd, &st) < 0 || st.st_size <= 0 || (uint64_t)st.st_size > MOST_RING)
        return -1;
    path->size = (uint64_t)st.st_size;
    path->base = mmap(NULL, path->size, PROT_READ | PROT_WRITE, MAP_SHARED, session->ring_fd, 0);
    if (path->base == MAP_FAILED) {
        path->base = NULL;
        return -1;
    }
    if (ls_region_open(path->base, path->size, &path->region) < 0)
        return -1;
    ls_set_wake_fd(path->region, session->bell_fd);
    if (session->arbiter_pid > 0 && session->arbiter_pid != getpid())
        path->pidfd = (int)syscall(SYS_pidfd_open, (pid_t)session->arbiter_pid, 0);
    if (path->pidfd >= 0)
        ls_set_peer_pidfd(path->region, path->pidfd);
    ls_set_client(path->region, (uint32_t)getpid(), LS_PEER_ALIVE);
    if (ls_producer_open(path->region, (uint32_t)syscall(SYS_gettid), (uint32_t)getpid(), &path->producer) < 0 ||
        ls_tickets_new(&path->book) < 0)
        return -1;
    return 0;
}

VkResult ls_icd_path_open(struct ls_icd_device *device)
{
    struct ls_icd_path *path = calloc(1, sizeof(*path));
    if (path == NULL)
        return VK_ERROR_OUT_OF_HOST_MEMORY;
    path->pidfd = -1;
    path->next_ticket = 1;
    if (open_ring(path, &device->session) < 0 || open_locks(path) < 0) {
        close_path(path);
        return VK_ERROR_INITIALIZATION_FAILED;
    }
    device->path = path;
    return VK_SUCCESS;
}

VkResult ls_icd_path_reopen(struct ls_icd_device *device)
{
    struct ls_icd_path *path = device->path;
    int rc;
    pthread_mutex_lock(&path->cq_lock); /* a waiter still sleeping on the old ring leaves it first */
    close_ring(path);
    rc = open_ring(path, &device->session);
    if (rc < 0)
        close_ring(path);
    pthread_mutex_unlock(&path->cq_lock);
    return rc < 0 ? VK_ERROR_INITIALIZATION_FAILED : VK_SUCCESS;
}

static void free_submission(struct ls_icd_submission *s)
{
    free(s->cbs);
    free(s->waits);
    free(s->signals);
}

/* A submission that will not run: its command buffers handed back, its arrays freed. */
static void give_back(struct ls_icd_submission *s)
{
    for (uint32_t c = 0; c < s->ncbs; c++)
        ls_icd_command_buffer_done(s->cbs[c].cb);
    free_submission(s);
}

/* Give back every queued submission. */
static void abandon(struct ls_icd_path *path)
{
    for (uint32_t i = 0; i < path->nqueued; i++)
        give_back(&path->queued[i]);
    path->nqueued = 0;
}

static void lose(struct ls_icd_path *path)
{
    if (!path->lost) {
        path->lost = 1;
        abandon(path);
        pthread_cond_broadcast(&path->changed);
    }
}

void ls_icd_path_close(struct ls_icd_device *device)
{
    if (device->path == NULL)
        return;
    abandon(device->path);
    close_path(device->path);
    device->path = NULL;
}

/* ---- pushing */

/* One descriptor as ticket ``ticket``; a full lane waits for answers. 0, or -1 (lost). */
static int push_ticket(struct ls_icd_path *path, uint64_t ticket, uint32_t opcode, uint32_t program)
{
    for (;;) {
        int rc = ls_tickets_push(path->book, path->producer, ticket, opcode, program, 0, 0, 0, 0, NULL, 0, NULL,
                                 NULL, 0);
        if (rc == 1)
            return 0;
        if (rc < 0)
            return -1;
        pthread_mutex_lock(&path->cq_lock); /* the lane is full: the arbiter waits for us to read answers */
        rc = ls_tickets_wait(path->book, path->region, 0, LS_SPIN_NS, FULL_WAIT_NS, NULL, NULL);
        pthread_mutex_unlock(&path->cq_lock);
        if (rc < 0)
            return -1;
    }
}

/* One descriptor as the next ticket. 0, or -1 (lost). */
static int push(struct ls_icd_path *path, uint32_t opcode, uint32_t program)
{
    if (push_ticket(path, path->next_ticket, opcode, program) < 0)
        return -1;
    path->next_ticket++;
    return 0;
}

static int push_submission(struct ls_icd_path *path, struct ls_icd_submission *s)
{
    uint32_t lists = 0;
    s->first = s->next = path->next_ticket;
    for (uint32_t c = 0; c < s->ncbs; c++)
        for (uint32_t l = 0; l < s->cbs[c].nlists; l++, lists++)
            if (push(path, LS_OP_LIST, s->cbs[c].lists[l]) < 0)
                return -1;
    if (lists == 0 && push(path, LS_OP_NOP, 0) < 0)
        return -1;
    s->end = path->next_ticket;
    s->pushed = 1;
    return 0;
}

/* VK_SUCCESS when every timeline value ``s`` waits for is reached or promised by an earlier
 * submission, VK_NOT_READY when one is not yet, LS_ICD_INVALID when a semaphore is gone. */
static VkResult reachable(struct ls_icd_device *device, const struct ls_icd_submission *s)
{
    for (uint32_t i = 0; i < s->nwaits; i++) {
        struct ls_icd_object *object = ls_icd_object_find(&device->objects, s->waits[i].semaphore, LS_ICD_SEMAPHORE);
        if (object == NULL)
            return LS_ICD_INVALID;
        if (object->u.semaphore.value < s->waits[i].value && object->u.semaphore.promised < s->waits[i].value)
            return VK_NOT_READY;
    }
    return VK_SUCCESS;
}

static void promise(struct ls_icd_device *device, const struct ls_icd_submission *s)
{
    for (uint32_t i = 0; i < s->nsignals; i++) {
        struct ls_icd_object *object = ls_icd_object_find(&device->objects, s->signals[i].semaphore, LS_ICD_SEMAPHORE);
        if (object != NULL && object->u.semaphore.timeline && object->u.semaphore.promised < s->signals[i].value)
            object->u.semaphore.promised = s->signals[i].value;
    }
}

/* The descriptor of ticket ``ticket`` of a pushed submission (push_submission's order: each command
 * buffer's lists, or one LS_OP_NOP): 0, or -1 when no pushed submission holds it. */
static int descriptor_of(const struct ls_icd_path *path, uint64_t ticket, uint32_t *opcode, uint32_t *program)
{
    for (uint32_t i = 0; i < path->nqueued; i++) {
        const struct ls_icd_submission *s = &path->queued[i];
        uint64_t k = ticket - s->first;
        if (!s->pushed || ticket < s->first || ticket >= s->end)
            continue;
        *opcode = LS_OP_NOP;
        *program = 0;
        for (uint32_t c = 0; c < s->ncbs && *opcode == LS_OP_NOP; c++) {
            if (k < s->cbs[c].nlists) {
                *opcode = LS_OP_LIST;
                *program = s->cbs[c].lists[k];
            }
            k -= s->cbs[c].nlists;
        }
        return 0;
    }
    return -1;
}

/* Whether ``ticket`` is in ``tickets`` (``n`` of them). */
static int listed(const uint64_t *tickets, uint32_t n, uint64_t ticket)
{
    for (uint32_t i = 0; i < n; i++)
        if (tickets[i] == ticket)
            return 1;
    return 0;
}

/* What the dead arbiter never ran, in ``moved`` (``*nmoved`` tickets it answered LS_EMOVED: handed
 * over, not run) and from ``*untaken`` on (the lane's unconsumed descriptors, the last ones pushed),
 * the answers it left filed first: 0, or -1 when some work it took is unanswered (it may have run,
 * wholly or in part), or when the book cannot be read (out of memory). ``*moved`` is the caller's
 * to free. */
static int never_ran(const struct ls_icd_path *path, uint64_t **moved, uint32_t *nmoved, uint64_t *untaken)
{
    int unconsumed = ls_producer_unconsumed(path->producer);
    uint32_t pending = ls_tickets_pending(path->book), n = 0;
    uint64_t *tickets = calloc(pending + 1, sizeof(*tickets));
    uint8_t *marks = calloc(pending + 1, 1);
    int rc = tickets && marks && unconsumed >= 0 && (uint64_t)unconsumed < path->next_ticket ? 0 : -1;
    if (rc == 0) {
        int listed_now = ls_tickets_list(path->book, tickets, marks, pending + 1);
        *untaken = path->next_ticket - (uint64_t)unconsumed;
        rc = listed_now < 0 || (uint32_t)listed_now > pending + 1 ? -1 : 0;
        pending = rc == 0 ? (uint32_t)listed_now : 0;
        for (uint32_t i = 0; i < pending && rc == 0; i++) {
            if (tickets[i] >= *untaken)
                continue;
            if (!(marks[i] & LS_TICKET_MOVED))
                rc = -1; /* taken and unanswered */
            tickets[n++] = tickets[i];
        }
    }
    free(marks);
    *moved = tickets;
    *nmoved = rc == 0 ? n : 0;
    return rc;
}

/* The tickets the dead arbiter never ran (never_ran's) pushed again, in order, on the new ring (the
 * lists keep their ids): 0, or -1. */
static int resend(struct ls_icd_path *path, const uint64_t *moved, uint32_t nmoved, uint64_t untaken)
{
    uint64_t first = untaken;
    for (uint32_t i = 0; i < nmoved; i++)
        first = moved[i] < first ? moved[i] : first;
    for (uint64_t ticket = first; ticket < path->next_ticket; ticket++) {
        uint32_t opcode, program;
        if (ticket < untaken && !listed(moved, nmoved, ticket))
            continue; /* answered */
        if (descriptor_of(path, ticket, &opcode, &program) < 0 || push_ticket(path, ticket, opcode, program) < 0)
            return -1;
    }
    return 0;
}

/* Whether the arbiter's pidfd says it died. */
static int arbiter_died(const struct ls_icd_path *path)
{
    struct pollfd gone = {.fd = path->pidfd, .events = POLLIN};
    return path->pidfd >= 0 && poll(&gone, 1, 0) == 1;
}

/* Whether the arbiter closed the ring handing over (``libshare-control restart``): it finishes what
 * it started, answers the rest LS_EMOVED, and exits. */
static int handing_over(const struct ls_icd_path *path)
{
    return path->pidfd >= 0 && ls_close_reason(path->region) == LS_EMOVED;
}

/* Before a push, a wait's sleep, and control.c's requests: when the arbiter died (its pidfd
 * readable), or is handing over (then its exit is waited for, up to LS_ICD_REPLY_MS), the answers
 * it left are filed; with all it took answered, the device moves to the arbiter that replaced it
 * (reattach.c) and what it never ran (never taken, or answered LS_EMOVED) is pushed there again
 * under the same tickets; else (work that may have run, no successor, a refusal) the device is lost. */
void ls_icd_path_survive(struct ls_icd_device *device)
{
    struct ls_icd_path *path = device->path;
    struct pollfd gone = {.fd = path->pidfd, .events = POLLIN};
    uint64_t *moved = NULL, untaken = 0;
    uint32_t nmoved = 0;
    if (path->busy || path->lost || path->pidfd < 0)
        return;
    if (handing_over(path))
        poll(&gone, 1, LS_ICD_REPLY_MS); /* (it finishes what it started first) */
    if (!arbiter_died(path))
        return;
    path->busy++;
    if (!ls_icd_path_poll(device)) {
        int rc = never_ran(path, &moved, &nmoved, &untaken);
        if (rc < 0)
            fprintf(stderr, "libshare Vulkan driver: the arbiter died with work it had taken unanswered "
                            "(it may have run): the device is lost\n");
        if (rc < 0 || ls_icd_reattach(device) != VK_SUCCESS || resend(path, moved, nmoved, untaken) < 0)
            lose(path);
    }
    free(moved);
    path->busy--;
}

VkResult ls_icd_path_submit(struct ls_icd_device *device, struct ls_icd_submission *s)
{
    struct ls_icd_path *path = device->path;
    int held;
    ls_icd_path_survive(device);
    ls_icd_settle_frees(device, s); /* what the application freed is gone before its lists run (control.c) */
    held = path->nqueued > 0 && !path->queued[path->nqueued - 1].pushed;
    if (path->lost) {
        give_back(s);
        return VK_ERROR_DEVICE_LOST;
    }
    if (path->nqueued == path->capacity) {
        uint32_t capacity = path->capacity ? path->capacity * 2 : 16;
        struct ls_icd_submission *grown = realloc(path->queued, capacity * sizeof(*grown));
        if (grown == NULL) {
            give_back(s);
            return VK_ERROR_OUT_OF_HOST_MEMORY;
        }
        path->queued = grown;
        path->capacity = capacity;
    }
    s->pushed = 0;
    if (!held && reachable(device, s) == VK_SUCCESS && push_submission(path, s) < 0) {
        give_back(s);
        lose(path);
        return VK_ERROR_DEVICE_LOST;
    }
    promise(device, s); /* the submissions behind it are ordered after it, held or not */
    path->queued[path->nqueued++] = *s;
    return VK_SUCCESS;
}

void ls_icd_path_release(struct ls_icd_device *device)
{
    struct ls_icd_path *path = device->path;
    ls_icd_settle_frees(device, NULL);
    for (uint32_t i = 0; i < path->nqueued && !path->lost; i++) {
        if (path->queued[i].pushed)
            continue;
        if (reachable(device, &path->queued[i]) == VK_NOT_READY)
            break;
        if (push_submission(path, &path->queued[i]) < 0)
            lose(path);
    }
    pthread_cond_broadcast(&path->changed);
}

/* ---- answers */

static void signal_done(struct ls_icd_device *device, const struct ls_icd_submission *s)
{
    struct ls_icd_object *fence = ls_icd_object_find(&device->objects, s->fence, LS_ICD_FENCE);
    if (fence != NULL) {
        fence->u.fence.signaled = 1;
        fence->u.fence.pending = 0;
    }
    for (uint32_t i = 0; i < s->nsignals; i++) {
        struct ls_icd_object *object = ls_icd_object_find(&device->objects, s->signals[i].semaphore, LS_ICD_SEMAPHORE);
        if (object != NULL && object->u.semaphore.timeline && object->u.semaphore.value < s->signals[i].value)
            object->u.semaphore.value = s->signals[i].value;
    }
    for (uint32_t c = 0; c < s->ncbs; c++)
        ls_icd_command_buffer_done(s->cbs[c].cb);
}

/* Take the answers filed in the book for the pushed submissions; retire those wholly answered. */
static void retire(struct ls_icd_device *device)
{
    struct ls_icd_path *path = device->path;
    uint32_t kept = 0;
    path->busy++;
    for (uint32_t i = 0; i < path->nqueued && !path->lost; i++) {
        struct ls_icd_submission *s = &path->queued[i];
        while (s->pushed && s->next < s->end) {
            int32_t status = 0;
            int state = ls_tickets_take(path->book, s->next, &status, NULL);
            if (state == LS_TICKET_PENDING)
                break;
            if (state != LS_TICKET_DONE || status < 0) { /* refused or cancelled: the device is lost */
                path->nqueued = kept + (path->nqueued - i); /* (what is left goes in lose's abandon) */
                memmove(path->queued + kept, path->queued + i, (path->nqueued - kept) * sizeof(*s));
                lose(path);
                path->busy--;
                return;
            }
            s->next++;
        }
        if (s->pushed && s->next == s->end) {
            signal_done(device, s);
            free_submission(s);
        } else {
            path->queued[kept++] = *s;
        }
    }
    if (!path->lost)
        path->nqueued = kept;
    path->busy--;
}

int ls_icd_path_poll(struct ls_icd_device *device)
{
    struct ls_icd_path *path = device->path;
    if (!path->lost && pthread_mutex_trylock(&path->cq_lock) == 0) {
        int rc = ls_tickets_collect(path->book, path->region);
        pthread_mutex_unlock(&path->cq_lock);
        if (rc < 0)
            lose(path);
        else if (rc > 0)
            pthread_cond_broadcast(&path->changed);
    }
    if (!path->lost)
        retire(device);
    return path->lost;
}

/* One sleep of a wait, up to ``deadline``: on the ring when work is pushed and no other waiter
 * reads it, else on ``changed``. */
static void sleep_once(struct ls_icd_device *device, int64_t deadline)
{
    struct ls_icd_path *path = device->path;
    int64_t now = now_ns();
    int64_t slice = deadline - now < SLICE_NS ? deadline - now : SLICE_NS;
    if (ls_tickets_pending(path->book) > 0 && pthread_mutex_trylock(&path->cq_lock) == 0) {
        int rc;
        pthread_mutex_unlock(&device->lock);
        rc = ls_tickets_wait(path->book, path->region, 0, LS_SPIN_NS, slice, NULL, NULL);
        pthread_mutex_unlock(&path->cq_lock);
        pthread_mutex_lock(&device->lock);
        if (rc < 0 && !arbiter_died(path) && !handing_over(path)) /* (else ls_icd_path_survive decides) */
            lose(path);
        pthread_cond_broadcast(&path->changed);
    } else {
        int64_t until = now + slice;
        struct timespec at = {.tv_sec = until / 1000000000, .tv_nsec = until % 1000000000};
        pthread_cond_timedwait(&path->changed, &device->lock, &at);
    }
}

VkResult ls_icd_path_wait(struct ls_icd_device *device, uint64_t timeout, ls_icd_ready ready, const void *arg)
{
    struct ls_icd_path *path = device->path;
    int64_t start = now_ns();
    int64_t deadline = timeout >= (uint64_t)(INT64_MAX - start) ? INT64_MAX : start + (int64_t)timeout;
    for (;;) {
        VkResult result;
        ls_icd_path_survive(device);
        if (ls_icd_path_poll(device))
            return VK_ERROR_DEVICE_LOST;
        result = ready(device, arg);
        if (result != VK_NOT_READY)
            return result;
        if (timeout == UINT64_MAX && path->nqueued == 0)
            return VK_TIMEOUT; /* nothing queued could end it: it would never return */
        if (now_ns() >= deadline)
            return VK_TIMEOUT;
        sleep_once(device, deadline);
    }
}

static VkResult idle(struct ls_icd_device *device, const void *arg)
{
    (void)arg;
    return device->path->nqueued == 0 ? VK_SUCCESS : VK_NOT_READY;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_DeviceWaitIdle(VkDevice handle)
{
    struct ls_icd_device *device = (struct ls_icd_device *)handle;
    VkResult result;
    if (device == NULL) /* Taichi's device destructor waits on a device it never made: no crash */
        return LS_ICD_INVALID;
    pthread_mutex_lock(&device->lock);
    result = ls_icd_path_wait(device, UINT64_MAX, idle, NULL);
    pthread_mutex_unlock(&device->lock);
    return result;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_QueueWaitIdle(VkQueue queue)
{
    if (queue == VK_NULL_HANDLE)
        return LS_ICD_INVALID;
    return ls_icd_DeviceWaitIdle((VkDevice)((struct ls_icd_queue *)queue)->device); /* the device's one queue */
}
