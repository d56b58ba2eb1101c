/* Persistent pthread pool behind qs_parallel_for (no OpenMP: safe across fork()).
 * Workers spin briefly on an atomic job counter before sleeping on a condition variable, so back-to-back
 * kernel calls (one per layer op in the engine) do not pay a futex wake-up each time. */
#include "qs.h"
#include "qs_guard.h"

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#define QS_MAX_THREADS 64
#define QS_SPIN_ITERS 20000 /* ~0.1-0.5 ms of pause instructions before a worker sleeps */

typedef struct {
    pthread_mutex_t lock; /* serialises callers */
    pthread_mutex_t m;    /* protects sleeping workers */
    pthread_cond_t wake;
    int n_workers;
    int n_sleeping;
    atomic_uint_fast64_t generation;
    atomic_int pending;
    int active_workers;
    qs_task_fn fn;
    void *ctx;
    int64_t n_tasks;
    atomic_llong next;
    atomic_int faulted; /* a task of the current job hit SIGBUS (see qs_guard.h) */
} qs_pool;

static qs_pool pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, 0,
                       NULL, NULL, 0, 0, 0};
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
}

/* Every task runs under its own guard (a plain sigsetjmp, savemask 0): a fault ends that task, marks the job,
 * and the loop goes on claiming (and, once faulted, skipping) tasks, so the job's bookkeeping always completes. */
static void run_tasks(void) {
    sigjmp_buf jb;
    sigjmp_buf *prev = qs_guard_jb;
    for (;;) {
        int64_t t = atomic_fetch_add_explicit(&pool.next, 1, memory_order_relaxed);
        if (t >= pool.n_tasks) break;
        if (atomic_load_explicit(&pool.faulted, memory_order_relaxed)) continue;
        if (sigsetjmp(jb, 0) == 0) {
            qs_guard_jb = &jb;
            pool.fn(pool.ctx, t);
        } else {
            atomic_store_explicit(&pool.faulted, 1, memory_order_relaxed);
        }
        qs_guard_jb = prev;
    }
}

typedef struct {
    int id;
    uint64_t start_gen; /* generation current when the worker was created (before the job that needs it) */
} worker_arg;

static void *worker_main(void *varg) {
    worker_arg a = *(worker_arg *)varg;
    free(varg);
    int id = a.id;
    uint64_t seen = a.start_gen;
    for (;;) {
        uint64_t g = seen;
        for (int i = 0; i < QS_SPIN_ITERS; ++i) {
            g = atomic_load_explicit(&pool.generation, memory_order_acquire);
            if (g != seen) break;
            cpu_relax();
        }
        if (g == seen) {
            pthread_mutex_lock(&pool.m);
            pool.n_sleeping++;
            while ((g = atomic_load_explicit(&pool.generation, memory_order_acquire)) == seen)
                pthread_cond_wait(&pool.wake, &pool.m);
            pool.n_sleeping--;
            pthread_mutex_unlock(&pool.m);
        }
        seen = g;
        if (id < pool.active_workers) {
            run_tasks();
            atomic_fetch_sub_explicit(&pool.pending, 1, memory_order_acq_rel);
        }
    }
    return NULL;
}

static void child_after_fork(void) {
    /* The child has none of the parent's workers: start over. */
    pthread_mutex_init(&pool.lock, NULL);
    pthread_mutex_init(&pool.m, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pool.n_workers = 0;
    pool.n_sleeping = 0;
    atomic_store(&pool.pending, 0);
}

static void install_atfork(void) { pthread_atfork(NULL, NULL, child_after_fork); }

int qs_threads_default(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    if (n > QS_MAX_THREADS) n = QS_MAX_THREADS;
    return (int)n;
}

void qs_parallel_for(int64_t n_tasks, qs_task_fn fn, void *ctx, int n_threads) {
    if (n_tasks <= 0) return;
    if (n_threads <= 0) n_threads = qs_threads_default();
    if (n_threads > QS_MAX_THREADS) n_threads = QS_MAX_THREADS;
    if ((int64_t)n_threads > n_tasks) n_threads = (int)n_tasks;
    if (n_threads <= 1) { /* no pool state involved: a fault jumps straight to the caller's guard */
        for (int64_t t = 0; t < n_tasks; ++t) fn(ctx, t);
        return;
    }
    pthread_once(&atfork_once, install_atfork);
    pthread_mutex_lock(&pool.lock);
    int want = n_threads - 1;
    while (pool.n_workers < want) {
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        worker_arg *wa = (worker_arg *)malloc(sizeof *wa);
        if (!wa) break;
        wa->id = pool.n_workers;
        wa->start_gen = atomic_load_explicit(&pool.generation, memory_order_relaxed);
        int rc = pthread_create(&th, &attr, worker_main, wa);
        pthread_attr_destroy(&attr);
        if (rc != 0) {
            free(wa);
            break;
        }
        pool.n_workers++;
    }
    if (want > pool.n_workers) want = pool.n_workers;
    pool.fn = fn;
    pool.ctx = ctx;
    pool.n_tasks = n_tasks;
    pool.active_workers = want;
    atomic_store_explicit(&pool.next, 0, memory_order_relaxed);
    atomic_store_explicit(&pool.faulted, 0, memory_order_relaxed);
    atomic_store_explicit(&pool.pending, want, memory_order_relaxed);
    atomic_fetch_add_explicit(&pool.generation, 1, memory_order_release);
    pthread_mutex_lock(&pool.m);
    if (pool.n_sleeping) pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.m);
    run_tasks();
    for (int spins = 0; atomic_load_explicit(&pool.pending, memory_order_acquire) > 0; ++spins) {
        if (spins < QS_SPIN_ITERS) cpu_relax();
        else sched_yield();
    }
    int faulted = atomic_load_explicit(&pool.faulted, memory_order_relaxed);
    pthread_mutex_unlock(&pool.lock);
    if (faulted) qs_guard_rethrow(); /* the job is over and the pool released: only now leave this frame */
}
