/* Emergency cleanup for a crashing arbiter: unlink its socket and PID lock file, then die.
 *
 * A Python signal handler runs later, on the main thread, between bytecodes: after a
 * SIGSEGV there may be no later. This handler runs at once, in whichever thread faulted,
 * and calls only system calls that POSIX lists as async-signal-safe (unlink, raise, and for
 * the quarantine open, write, close, rename); it calls no allocator and takes no lock. The
 * paths are copied into static buffers at install time.
 * SA_RESETHAND restores the default action before the handler runs, so the re-raised
 * signal kills the process with its usual status (and core dump, where enabled).
 *
 * Quarantine. While the engine checks and records a client's descriptors it keeps that
 * client's slot (+ 1) in busy_slot. A crash then names that client: the handler writes the
 * record the arbiter prepared in memory when the client came (ls_emergency_prepare: whole JSON
 * made in advance, because formatting one here would not be async-signal-safe) to a journal
 * record (a temporary name, then action-PID-crashSLOT), which the next arbiter on the pipe
 * directory counts as a strike. The names are built with a hand-written itoa. A record lives
 * in a buffer of its slot's, made once and reused by the slot's next clients (never freed: the
 * handler may read it at any time), and its length is stored after its bytes, so the handler
 * sees a whole record or none (a slot is prepared again only once the engine has let its last
 * client go, so the busy word cannot name it meanwhile; a torn record would fail the next
 * arbiter's checks and be dropped).
 * Before, the arbiter wrote each client's record into a file as it came and renamed it as it
 * went: some 80 us of CPU per client on ext4, and disk writes on every hello.
 */

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "emergency.h"
#include "sync.h"

#define LS_PATH_BYTES 4096

static char socket_path[LS_PATH_BYTES];
static char lock_path[LS_PATH_BYTES];

static const int fatal_signals[] = {SIGSEGV, SIGABRT, SIGBUS, SIGILL, SIGFPE};

static volatile uint32_t busy_slot;     /* the engine's busy word: slot + 1, or 0 */
static char journal[LS_PATH_BYTES];     /* the quarantine directory, "" = none */
static char own_pid[16];                /* this process's pid, in decimal */

/* Append src, then the decimal digits of value, to dst (of LS_PATH_BYTES); 0, or -1 if too long. */
static int append(char *dst, const char *src, uint32_t value, int with_value)
{
    size_t len = strlen(dst), add = strlen(src);
    char digits[12];
    int n = 0;

    if (len + add + sizeof digits >= LS_PATH_BYTES)
        return -1;
    memcpy(dst + len, src, add + 1);
    if (!with_value)
        return 0;
    do
        digits[n++] = (char)('0' + value % 10);
    while ((value /= 10) && n < (int)sizeof digits);
    len += add;
    while (n)
        dst[len++] = digits[--n];
    dst[len] = '\0';
    return 0;
}

struct record {
    char *bytes;              /* LS_EMERGENCY_RECORD_BYTES, made on the slot's first record */
    volatile size_t length;   /* 0: no record */
};

static struct record records[LS_EMERGENCY_SLOTS];

/* Write all of bytes to fd; 0, or -1. */
static int write_all(int fd, const char *bytes, size_t length)
{
    while (length) {
        ssize_t n = write(fd, bytes, length);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        bytes += n;
        length -= (size_t)n;
    }
    return 0;
}

static void journal_crash(void)
{
    static char temporary[LS_PATH_BYTES], to[LS_PATH_BYTES];
    uint32_t slot = busy_slot;
    const struct record *record;
    size_t length;
    int fd, failed;

    if (!journal[0] || !slot || slot - 1 >= LS_EMERGENCY_SLOTS)
        return;
    record = &records[slot - 1];
    length = record->length;
    ls_fence_acquire();  /* the bytes stored before the length: pairs with the releases in ls_emergency_prepare */
    if (!length || !record->bytes)
        return;
    temporary[0] = to[0] = '\0';
    if (append(temporary, journal, 0, 0) || append(temporary, "/.tmp-crash-", 0, 0) ||
        append(temporary, own_pid, 0, 0) || append(temporary, "-", slot - 1, 1) ||
        append(to, journal, 0, 0) || append(to, "/action-", 0, 0) || append(to, own_pid, 0, 0) ||
        append(to, "-crash", slot - 1, 1))
        return;
    fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    failed = write_all(fd, record->bytes, length);
    if (close(fd) < 0)
        failed = -1;
    if (failed)
        unlink(temporary);  /* a next arbiter would remove it unread anyway */
    else
        rename(temporary, to);
}

static void emergency(int sig)
{
    int saved = errno;

    journal_crash();
    if (socket_path[0])
        unlink(socket_path);
    if (lock_path[0])
        unlink(lock_path);
    errno = saved;
    raise(sig);
}

static int copy_path(char *dst, const char *src)
{
    size_t len = strlen(src);

    if (len >= LS_PATH_BYTES)
        return -ENAMETOOLONG;
    memcpy(dst, src, len + 1);
    return 0;
}

int ls_emergency_install(const char *socket, const char *lock)
{
    struct sigaction action;
    size_t i;
    int rc;

    if ((rc = copy_path(socket_path, socket)) < 0 || (rc = copy_path(lock_path, lock)) < 0)
        return rc;
    memset(&action, 0, sizeof action);
    action.sa_handler = emergency;
    action.sa_flags = SA_RESETHAND | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    for (i = 0; i < sizeof fatal_signals / sizeof fatal_signals[0]; i++)
        if (sigaction(fatal_signals[i], &action, NULL) < 0)
            return -errno;
    return 0;
}

void ls_emergency_disarm(void)
{
    socket_path[0] = '\0';
    lock_path[0] = '\0';
}

uint64_t ls_emergency_busy_word(void)
{
    return (uint64_t)(uintptr_t)&busy_slot;
}

void ls_emergency_set_busy(uint32_t slot_plus_one)
{
    busy_slot = slot_plus_one;
}

int ls_emergency_journal(const char *directory)
{
    int rc = copy_path(journal, directory);

    if (rc < 0)
        journal[0] = '\0';
    snprintf(own_pid, sizeof own_pid, "%ld", (long)getpid());
    return rc;
}

int ls_emergency_prepare(uint32_t slot, const char *bytes, size_t length)
{
    struct record *record;

    if (slot >= LS_EMERGENCY_SLOTS)
        return -ERANGE;
    if (length > LS_EMERGENCY_RECORD_BYTES)
        return -E2BIG;
    record = &records[slot];
    record->length = 0;
    ls_fence_release();  /* the length is 0 before the bytes change: pairs with the acquire in journal_crash */
    if (!length)
        return 0;
    if (!record->bytes && !(record->bytes = malloc(LS_EMERGENCY_RECORD_BYTES)))
        return -ENOMEM;
    memcpy(record->bytes, bytes, length);
    ls_fence_release();  /* the bytes before the length: pairs with the acquire in journal_crash */
    record->length = length;
    return 0;
}
