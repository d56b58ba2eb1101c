/* Quantscope native library: fault guard (internal, not parsed by cffi).
 *
 * Weights are read straight from the memory-mapped model file. When that file is truncated or replaced while a
 * kernel reads it, the kernel's next load from a page past the new end raises SIGBUS, which would kill the whole
 * process (the desktop app included). A guarded region turns that fault into an error code instead:
 *
 *   - qs_guard.c installs one SIGBUS handler (SA_SIGINFO | SA_NODEFER | SA_ONSTACK). When the faulting thread has
 *     an armed guard (a thread-local sigjmp_buf pointer) it siglongjmps there; otherwise it hands the signal to
 *     whatever handler was installed before it (Python's faulthandler, or the default action: the process dies
 *     with SIGBUS exactly as it would without us), or, when the CLI asked for it, prints one error line and exits.
 *   - Exported entry points that read caller-supplied memory run their body under QS_GUARDED (below) and return
 *     QS_ERR_MAPPED_FAULT on a fault. Guards nest: the innermost armed one catches.
 *   - The thread pool arms a guard around every task on every thread (sigsetjmp with savemask 0: no system call,
 *     a few nanoseconds per task). A faulted task marks the job; remaining tasks are skipped but still counted,
 *     so the pool never deadlocks; once the job has fully ended and the pool is released, qs_parallel_for
 *     re-raises the fault on the calling thread (qs_guard_rethrow), which lands in the caller's guard.
 *
 * SA_NODEFER leaves SIGBUS unblocked inside the handler, so jumping out with savemask 0 restores nothing and
 * costs nothing. Memory a faulted call had malloc'd is leaked (the jump skips its free): a few buffers per
 * faulted call, acceptable for an event that ends the use of that file.
 *
 * On Windows the guard compiles to nothing (QS_GUARD_ACTIVE 0: QS_GUARDED and QS_GUARD_TASK just run the call; the
 * API functions stay and do nothing, qs_guard_last_fault always says 0). A file that has a mapped view open cannot be
 * truncated there (SetEndOfFile fails with ERROR_USER_MAPPED_FILE) or replaced in place, so the fault this guard
 * exists for does not happen; what remains (a network share or removable disk failing under a view:
 * EXCEPTION_IN_PAGE_ERROR) ends the process as it would any Windows program. */
#ifndef QS_GUARD_H
#define QS_GUARD_H

/* Thread-local storage. On ELF targets __thread with the initial-exec model: no lazy allocation on first touch, so
 * the SIGBUS handler may read it. Elsewhere (Mach-O, MinGW-w64, clang-cl) C11's _Thread_local. */
#if defined(__ELF__)
#define QS_TLS __thread __attribute__((tls_model("initial-exec")))
#else
#define QS_TLS _Thread_local
#endif

#if defined(_WIN32)
#define QS_GUARD_ACTIVE 0
#else
#define QS_GUARD_ACTIVE 1
#include <setjmp.h>
#endif

/* Make sure our handler is the installed one (installs it on first use, re-installs it if something, e.g.
 * faulthandler.enable(), replaced it since: that handler then becomes the one unguarded faults go to). */
void qs_guard_install(void);

/* A fault happened on another thread on this thread's behalf: jump to this thread's guard, or, when none is
 * armed, treat it as an unguarded fault (raise SIGBUS). Does not return. */
void qs_guard_rethrow(void) __attribute__((noreturn));

/* Record a fault of a guarded call that has no error return (qs_read_probe, qs_utf8_invalid_at). */
void qs_guard_note_fault(void);

#if QS_GUARD_ACTIVE
extern QS_TLS sigjmp_buf *qs_guard_jb; /* innermost armed guard of this thread, NULL when none */

/* Run `call` (an int expression) under a guard; `rc` receives its value, or QS_ERR_MAPPED_FAULT on a fault. */
#define QS_GUARDED(rc, call)                                                                                        \
    do {                                                                                                            \
        sigjmp_buf qs_jb_;                                                                                          \
        sigjmp_buf *qs_prev_ = qs_guard_jb;                                                                         \
        if (!qs_prev_) qs_guard_install();                                                                          \
        if (sigsetjmp(qs_jb_, 0) == 0) {                                                                            \
            qs_guard_jb = &qs_jb_;                                                                                  \
            (rc) = (call);                                                                                          \
        } else {                                                                                                    \
            (rc) = QS_ERR_MAPPED_FAULT;                                                                             \
        }                                                                                                           \
        qs_guard_jb = qs_prev_;                                                                                     \
    } while (0)

/* One pool task under its own guard (the handler is installed by the caller's QS_GUARDED): run the statement
 * `call`; on a fault inside it, run `on_fault` instead of the rest of it. A plain sigsetjmp with savemask 0: no
 * system call, a few nanoseconds. */
#define QS_GUARD_TASK(call, on_fault)                                                                               \
    do {                                                                                                            \
        sigjmp_buf qs_tjb_;                                                                                         \
        sigjmp_buf *qs_tprev_ = qs_guard_jb;                                                                        \
        if (sigsetjmp(qs_tjb_, 0) == 0) {                                                                           \
            qs_guard_jb = &qs_tjb_;                                                                                 \
            call;                                                                                                   \
        } else {                                                                                                    \
            on_fault;                                                                                               \
        }                                                                                                           \
        qs_guard_jb = qs_tprev_;                                                                                    \
    } while (0)
#else
#define QS_GUARDED(rc, call)                                                                                        \
    do {                                                                                                            \
        (rc) = (call);                                                                                              \
    } while (0)
#define QS_GUARD_TASK(call, on_fault)                                                                               \
    do {                                                                                                            \
        call;                                                                                                       \
    } while (0)
#endif

#endif
