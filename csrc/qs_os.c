/* The operating-system seam (qs_os.h): a POSIX branch and a Win32 branch of every call. */
#if !defined(_WIN32) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* MAP_ANONYMOUS and madvise's MADV_* under a strict -std=c11 build too */
#endif

#include "qs_os.h"

#include <stdlib.h>

#define QS_HUGE_ALIGN ((size_t)2 * 1024 * 1024)

typedef struct {
    void (*fn)(void *);
    void *arg;
} thread_start;

#if defined(__MINGW32__)
/* MinGW-w64's fmaf (libmingwex, linked statically) is not fused: it rounds the product, so about a quarter of its
 * results differ from a true fused multiply-add. The scalar kernels use fmaf where the SIMD code fuses and must get
 * the same bits, so this definition takes its place in every MinGW link of the library (UCRT's, used by clang-cl
 * builds, and glibc's and Apple's are correct; kernels with the fma target attribute inline the instruction).
 * The product of two floats is exact in double; the sum is rounded to odd (TwoSum's error decides the last bit),
 * and a double rounded to odd rounds to the correctly rounded float (53 >= 2 * 24 + 2 bits). */
#include <math.h>
#include <string.h>

float fmaf(float a, float b, float c) {
    const double p = (double)a * (double)b, cd = (double)c;
    double s = p + cd;
    if (!isfinite(s)) return (float)s;
    const double bb = s - p, e = (p - (s - bb)) + (cd - bb);
    uint64_t u;
    memcpy(&u, &s, sizeof u);
    if (e != 0 && !(u & 1)) {
        u += ((s > 0) == (e > 0)) ? 1 : (uint64_t)-1; /* one ulp toward the exact sum: now odd */
        memcpy(&s, &u, sizeof s);
    }
    return (float)s;
}
#endif

#if QS_OS_WIN32
/* ================================================================ Win32 (MinGW-w64, clang-cl) */
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#ifndef _WIN32_WINNT
#define _WIN32_WINNT 0x0601 /* Windows 7: GetActiveProcessorCount; SRW locks and INIT_ONCE are Vista */
#endif
#include <windows.h>
#include <malloc.h>
#include <process.h>
#include <string.h>

_Static_assert(sizeof(qs_mutex_t) == sizeof(SRWLOCK), "qs_mutex_t must be an SRWLOCK");
_Static_assert(sizeof(qs_cond_t) == sizeof(CONDITION_VARIABLE), "qs_cond_t must be a CONDITION_VARIABLE");
_Static_assert(sizeof(qs_once_t) == sizeof(INIT_ONCE), "qs_once_t must be an INIT_ONCE");

void qs_mutex_init(qs_mutex_t *m) { InitializeSRWLock((PSRWLOCK)m); }
void qs_mutex_lock(qs_mutex_t *m) { AcquireSRWLockExclusive((PSRWLOCK)m); }
void qs_mutex_unlock(qs_mutex_t *m) { ReleaseSRWLockExclusive((PSRWLOCK)m); }
void qs_cond_init(qs_cond_t *c) { InitializeConditionVariable((PCONDITION_VARIABLE)c); }
void qs_cond_wait(qs_cond_t *c, qs_mutex_t *m) {
    SleepConditionVariableSRW((PCONDITION_VARIABLE)c, (PSRWLOCK)m, INFINITE, 0);
}
void qs_cond_broadcast(qs_cond_t *c) { WakeAllConditionVariable((PCONDITION_VARIABLE)c); }

static BOOL CALLBACK once_call(PINIT_ONCE once, PVOID param, PVOID *ctx) {
    (void)once;
    (void)ctx;
    void (*fn)(void);
    memcpy(&fn, &param, sizeof fn); /* a function pointer carried through a data pointer: same size on Win64 */
    fn();
    return TRUE;
}

void qs_once(qs_once_t *o, void (*fn)(void)) {
    PVOID param;
    _Static_assert(sizeof param == sizeof fn, "function and data pointers differ in size");
    memcpy(&param, &fn, sizeof param);
    InitOnceExecuteOnce((PINIT_ONCE)o, once_call, param, NULL);
}

static unsigned __stdcall thread_main(void *varg) {
    thread_start s = *(thread_start *)varg;
    free(varg);
    s.fn(s.arg);
    return 0;
}

int qs_thread_start(void (*fn)(void *), void *arg) {
    thread_start *s = (thread_start *)malloc(sizeof *s);
    if (!s) return -1;
    s->fn = fn;
    s->arg = arg;
    /* _beginthreadex, not CreateThread: the thread uses the C runtime. Closing the handle detaches it. */
    uintptr_t h = _beginthreadex(NULL, 0, thread_main, s, 0, NULL);
    if (!h) {
        free(s);
        return -1;
    }
    CloseHandle((HANDLE)h);
    return 0;
}

int qs_at_fork_child(void (*fn)(void)) {
    (void)fn; /* no fork() on Windows */
    return 0;
}

int qs_cpu_count(void) {
    DWORD n = GetActiveProcessorCount(ALL_PROCESSOR_GROUPS);
    if (n == 0) {
        SYSTEM_INFO si;
        GetSystemInfo(&si);
        n = si.dwNumberOfProcessors;
    }
    return n < 1 ? 1 : (n > 0x7fffffff ? 0x7fffffff : (int)n);
}

void qs_yield(void) { SwitchToThread(); }

void qs_sleep_us(unsigned us) { Sleep((DWORD)((us + 999u) / 1000u)); }

int64_t qs_now_ns(void) {
    static LARGE_INTEGER freq; /* constant from boot: a benign race at worst writes the same value twice */
    LARGE_INTEGER c;
    if (freq.QuadPart == 0) QueryPerformanceFrequency(&freq);
    QueryPerformanceCounter(&c);
    const int64_t f = freq.QuadPart;
    return c.QuadPart / f * 1000000000 + c.QuadPart % f * 1000000000 / f;
}

void *qs_aligned_alloc(size_t align, size_t n) { return _aligned_malloc(n ? n : 1, align); }

void qs_aligned_free(void *p) { _aligned_free(p); }

size_t qs_page_size(void) {
    SYSTEM_INFO si;
    GetSystemInfo(&si);
    return si.dwPageSize;
}

void *qs_map_anon(size_t n, int huge) {
    /* Large pages would need SeLockMemoryPrivilege: `huge` asks for nothing here. VirtualAlloc's memory is zeroed
     * and aligned to the allocation granularity (64 KiB). */
    (void)huge;
    if (n == 0) return NULL;
    return VirtualAlloc(NULL, n, MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE);
}

void qs_unmap_anon(void *p, size_t n) {
    (void)n;
    if (p) VirtualFree(p, 0, MEM_RELEASE);
}

/* whole pages [a, a + len): see qs_page_drop below */
static int drop_pages(void *a, size_t len) {
    /* VirtualUnlock of pages that are not locked takes them out of the working set (documented) and fails with
     * ERROR_NOT_LOCKED, which is the expected outcome here. */
    if (VirtualUnlock((LPVOID)a, (SIZE_T)len)) return 0;
    return GetLastError() == ERROR_NOT_LOCKED ? 0 : -1;
}

#else
/* ================================================================ POSIX (Linux, macOS) */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#if !defined(MAP_ANONYMOUS) && defined(MAP_ANON)
#define MAP_ANONYMOUS MAP_ANON
#endif

void qs_mutex_init(qs_mutex_t *m) { pthread_mutex_init(m, NULL); }
void qs_mutex_lock(qs_mutex_t *m) { pthread_mutex_lock(m); }
void qs_mutex_unlock(qs_mutex_t *m) { pthread_mutex_unlock(m); }
void qs_cond_init(qs_cond_t *c) { pthread_cond_init(c, NULL); }
void qs_cond_wait(qs_cond_t *c, qs_mutex_t *m) { pthread_cond_wait(c, m); }
void qs_cond_broadcast(qs_cond_t *c) { pthread_cond_broadcast(c); }
void qs_once(qs_once_t *o, void (*fn)(void)) { pthread_once(o, fn); }

static void *thread_main(void *varg) {
    thread_start s = *(thread_start *)varg;
    free(varg);
    s.fn(s.arg);
    return NULL;
}

int qs_thread_start(void (*fn)(void *), void *arg) {
    thread_start *s = (thread_start *)malloc(sizeof *s);
    if (!s) return -1;
    s->fn = fn;
    s->arg = arg;
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&th, &attr, thread_main, s);
    pthread_attr_destroy(&attr);
    if (rc != 0) free(s);
    return rc;
}

int qs_at_fork_child(void (*fn)(void)) { return pthread_atfork(NULL, NULL, fn); }

int qs_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (n > 0x7fffffff ? 0x7fffffff : (int)n);
}

void qs_yield(void) { sched_yield(); }

void qs_sleep_us(unsigned us) {
    struct timespec ts = {(time_t)(us / 1000000u), (long)(us % 1000000u) * 1000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

int64_t qs_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + (int64_t)t.tv_nsec;
}

void *qs_aligned_alloc(size_t align, size_t n) {
    void *p = NULL;
    return posix_memalign(&p, align, n ? n : 1) == 0 ? p : NULL;
}

void qs_aligned_free(void *p) { free(p); }

size_t qs_page_size(void) {
    long pg = sysconf(_SC_PAGESIZE);
    return pg > 0 ? (size_t)pg : 4096;
}

static size_t round_pages(size_t n) {
    const size_t pg = qs_page_size();
    return n > SIZE_MAX - pg ? 0 : (n + pg - 1) & ~(pg - 1);
}

void *qs_map_anon(size_t bytes, int huge) {
    size_t n = round_pages(bytes);
    if (n == 0) return NULL;
    if (!huge) {
        void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    if (n > SIZE_MAX - QS_HUGE_ALIGN) return NULL;
    size_t total = n + QS_HUGE_ALIGN; /* map more, then unmap the ends around a 2 MiB aligned start */
    uint8_t *p = (uint8_t *)mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    uint8_t *a = (uint8_t *)(((uintptr_t)p + QS_HUGE_ALIGN - 1) & ~(uintptr_t)(QS_HUGE_ALIGN - 1));
    if (a > p) munmap(p, (size_t)(a - p));
    size_t tail = (size_t)(p + total - (a + n));
    if (tail) munmap(a + n, tail);
#ifdef MADV_HUGEPAGE
    madvise(a, n, MADV_HUGEPAGE); /* a hint: without THP the memory still works on small pages */
#endif
    return a;
}

void qs_unmap_anon(void *p, size_t n) {
    if (p && n) munmap(p, round_pages(n));
}

/* whole pages [a, a + len): see qs_page_drop below */
static int drop_pages(void *a, size_t len) { return madvise(a, len, MADV_DONTNEED) == 0 ? 0 : -1; }
#endif

/* ================================================================ both */

int qs_page_drop(const void *p, size_t n) {
    const uintptr_t pg = (uintptr_t)qs_page_size();
    if (!p || n == 0) return -1;
    uintptr_t a = ((uintptr_t)p + pg - 1) & ~(pg - 1);
    uintptr_t b = ((uintptr_t)p + n) & ~(pg - 1);
    return b <= a ? 0 : drop_pages((void *)a, (size_t)(b - a));
}
