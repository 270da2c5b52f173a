/* Crash-time cleanup of the arbiter's socket and lock file (see _emergency.c). */
#ifndef LIBSHARE_EMERGENCY_H
#define LIBSHARE_EMERGENCY_H

/* cdef-begin */
/* Install handlers for SIGSEGV, SIGABRT, SIGBUS, SIGILL and SIGFPE that unlink both paths and
 * re-raise the signal. Returns 0, or -ENAMETOOLONG / -errno from sigaction. */
int ls_emergency_install(const char *socket_path, const char *lock_path);
/* cdef-end */

#endif
