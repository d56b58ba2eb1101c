/* The operating-system seam of the native library (internal, not parsed by cffi): the ONE place that calls the OS.
 *
 * Threads, the clock, the CPU count, aligned allocation and anonymous page maps, each with a POSIX branch (Linux,
 * macOS, any pthreads system) and a Win32 branch (MinGW-w64, clang-cl), both in qs_os.c. Every other C file asks
 * here and includes no pthread.h, sys/mman.h, unistd.h, sched.h or windows.h of its own; the fault guard
 * (qs_guard.c) is the one other file with OS calls, its signal handling (POSIX only, see qs_guard.h).
 *
 * What differs per OS (docs/native.md, "Platforms"):
 *   - mutex / condition variable / once: pthreads; on Windows SRWLOCK, CONDITION_VARIABLE and INIT_ONCE, all three
 *     statically initialisable (all-zero), so QS_MUTEX_INIT etc. work on both.
 *   - qs_at_fork_child: pthread_atfork's child handler; Windows has no fork(): a no-op.
 *   - qs_map_anon(n, huge): mmap; with `huge`, 2 MiB aligned and MADV_HUGEPAGE where the system defines it (Linux
 *     THP; macOS has no such hint). Windows: VirtualAlloc, never large pages (they need SeLockMemoryPrivilege,
 *     which a desktop user's process does not hold).
 *   - qs_page_drop: MADV_DONTNEED (a file-mapped page is read again from the file; on macOS the kernel takes it as
 *     a hint). Windows: VirtualUnlock of unlocked pages, which removes them from the working set without
 *     discarding their contents (DiscardVirtualMemory / MEM_RESET only apply to private memory, not to a view of a
 *     file, the one thing this is used on).
 *   - qs_aligned_alloc: posix_memalign (macOS has aligned_alloc only from 10.15); Windows _aligned_malloc, whose
 *     blocks only _aligned_free may release: free every qs_aligned_alloc block with qs_aligned_free. */
#ifndef QS_OS_H
#define QS_OS_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define QS_OS_WIN32 1
/* Layout-compatible stand-ins for SRWLOCK, CONDITION_VARIABLE and INIT_ONCE (one pointer each, zero = initial),
 * so that this header does not bring windows.h into the kernels; qs_os.c checks the sizes. */
typedef struct {
    void *p;
} qs_mutex_t;
typedef struct {
    void *p;
} qs_cond_t;
typedef struct {
    void *p;
} qs_once_t;
#define QS_MUTEX_INIT {0}
#define QS_COND_INIT {0}
#define QS_ONCE_INIT {0}
#else
#define QS_OS_WIN32 0
#include <pthread.h> /* for the types and their static initialisers only: the calls are in qs_os.c */
typedef pthread_mutex_t qs_mutex_t;
typedef pthread_cond_t qs_cond_t;
typedef pthread_once_t qs_once_t;
#define QS_MUTEX_INIT PTHREAD_MUTEX_INITIALIZER
#define QS_COND_INIT PTHREAD_COND_INITIALIZER
#define QS_ONCE_INIT PTHREAD_ONCE_INIT
#endif

/* ---------------------------------------------------------------- threads */
void qs_mutex_init(qs_mutex_t *m); /* (re)initialise, e.g. in a forked child; static ones use QS_MUTEX_INIT */
void qs_mutex_lock(qs_mutex_t *m);
void qs_mutex_unlock(qs_mutex_t *m);
void qs_cond_init(qs_cond_t *c);
void qs_cond_wait(qs_cond_t *c, qs_mutex_t *m); /* m locked by the caller; may wake spuriously */
void qs_cond_broadcast(qs_cond_t *c);
void qs_once(qs_once_t *o, void (*fn)(void));

/* Start fn(arg) on a new detached thread. 0 on success; nonzero (and fn never runs) on failure. */
int qs_thread_start(void (*fn)(void *), void *arg);

/* Run fn in the child after fork() (pthread_atfork). 0 on success. Windows has no fork: does nothing, returns 0. */
int qs_at_fork_child(void (*fn)(void));

int qs_cpu_count(void); /* online logical processors (all processor groups on Windows), at least 1 */
void qs_yield(void);
void qs_sleep_us(unsigned us); /* at least us microseconds (Windows: whole milliseconds, rounded up) */
int64_t qs_now_ns(void);       /* monotonic clock, nanoseconds from an arbitrary origin */

/* ---------------------------------------------------------------- memory */
/* align: a power of two, at least sizeof(void *). Free with qs_aligned_free only (never free()). NULL on failure. */
void *qs_aligned_alloc(size_t align, size_t n);
void qs_aligned_free(void *p);

size_t qs_page_size(void);

/* n bytes (rounded up to whole pages) of zeroed, private, read-write memory, page aligned; with huge != 0 also
 * 2 MiB aligned and hinted for huge pages where the OS has such a hint. NULL on failure. Release with
 * qs_unmap_anon(p, the same n). */
void *qs_map_anon(size_t n, int huge);
void qs_unmap_anon(void *p, size_t n);

/* Release this process's pages wholly inside [p, p + n) of a file mapping (they are read again from the file when
 * touched). 0 on success (also when no whole page lies inside), -1 on failure. */
int qs_page_drop(const void *p, size_t n);

#endif
