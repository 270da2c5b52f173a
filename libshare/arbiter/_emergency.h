/* Crash-time cleanup of the arbiter's socket and lock file (see _emergency.c). */
#ifndef LIBSHARE_EMERGENCY_H
#define LIBSHARE_EMERGENCY_H

/* cdef-begin */
/* Install handlers for SIGSEGV, SIGABRT, SIGBUS, SIGILL and SIGFPE that unlink both paths and
 * re-raise the signal. Returns 0, or -ENAMETOOLONG / -errno from sigaction. */
int ls_emergency_install(const char *socket_path, const char *lock_path);
/* Forget both paths (the handlers stay, and only re-raise): for after a clean shutdown, when the
 * paths may already belong to the next arbiter. */
void ls_emergency_disarm(void);
/* cdef-end */

#endif
