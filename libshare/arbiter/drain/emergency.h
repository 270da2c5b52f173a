/* Crash-time cleanup of the arbiter's socket and lock file (see emergency.c). */
#ifndef LIBSHARE_EMERGENCY_H
#define LIBSHARE_EMERGENCY_H

#include <stddef.h>
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
/* The most bytes of one client's crash record, and the most client slots that can hold one. */
#define LS_EMERGENCY_RECORD_BYTES 4096
#define LS_EMERGENCY_SLOTS 65536
/* The quarantine's journal directory ("" = none): on a crash while the busy word names a slot that
 * holds a record (ls_emergency_prepare), the handler writes that record to
 * DIRECTORY/action-PID-crashSLOT, a journal record the next arbiter counts (_quarantine.py).
 * Returns 0 or -ENAMETOOLONG. */
int ls_emergency_journal(const char *directory);
/* Hold RECORD (LENGTH bytes, whole JSON made in advance) as the crash record of client SLOT; a
 * LENGTH of 0 withdraws it. Returns 0, -ERANGE (slot >= LS_EMERGENCY_SLOTS), -E2BIG (LENGTH >
 * LS_EMERGENCY_RECORD_BYTES) or -ENOMEM. Called from one thread at a time (the control lock). */
int ls_emergency_prepare(uint32_t slot, const char *record, size_t length);
/* cdef-end */

#endif
