/* Emergency cleanup for a crashing arbiter: unlink its socket and PID lock file, then die.
 *
 * A Python signal handler runs later, on the main thread, between bytecodes: after a
 * SIGSEGV there may be no later. This handler runs at once, in whichever thread faulted,
 * and calls only unlink() and raise(), which POSIX lists as async-signal-safe. The paths
 * are copied into static buffers at install time so the handler reads no heap memory.
 * SA_RESETHAND restores the default action before the handler runs, so the re-raised
 * signal kills the process with its usual status (and core dump, where enabled).
 */

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "_emergency.h"

#define LS_PATH_BYTES 4096

static char socket_path[LS_PATH_BYTES];
static char lock_path[LS_PATH_BYTES];

static const int fatal_signals[] = {SIGSEGV, SIGABRT, SIGBUS, SIGILL, SIGFPE};

static void emergency(int sig)
{
    int saved = errno;

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
