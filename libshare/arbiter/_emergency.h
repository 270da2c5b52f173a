/* Crash-time cleanup of the arbiter's socket and lock file (see _emergency.c). */
#ifndef LIBSHARE_EMERGENCY_H
#define LIBSHARE_EMERGENCY_H

#include <stdint.h>

/* cdef-begin */
/* Install handlers for SIGSEGV, SIGABRT, SIGBUS, SIGILL and SIGFPE that unlink both paths and
 * re-raise the signal. Returns 0, or -ENAMETOOLONG / -errno from sigaction. */
int ls_emergency_install(const char *socket_path, const char *lock_path);
/* Forget both paths (the handlers stay, and only re-raise): for after a clean shutdown, when the
 * paths may already belong to the next arbiter. */
void ls_emergency_disarm(void);
/* The word the engine sets to a client's slot + 1 while it processes that client's descriptors
 * (ls_engine_set_busy_word): its address, and a way to set it (a test hook). */
uint64_t ls_emergency_busy_word(void);
void ls_emergency_set_busy(uint32_t slot_plus_one);
/* The quarantine's journal directory ("" = none): on a crash while the busy word names a slot, the
 * handler renames DIRECTORY/.armed-PID-SLOT (the record the arbiter wrote when that client came)
 * to DIRECTORY/action-PID-crashSLOT, a record the next arbiter counts (_quarantine.py). */
int ls_emergency_journal(const char *directory);
/* cdef-end */

#endif
