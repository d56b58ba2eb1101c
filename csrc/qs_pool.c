/* Persistent thread pool behind qs_parallel_for (no OpenMP: safe across fork()); its threads, locks and clock come
 * from the OS seam (qs_os.h: pthreads, or Win32 threads and SRW locks).
 * Workers spin briefly on an atomic job counter before sleeping on a condition variable, so back-to-back
 * kernel calls (one per layer op in the engine) do not pay a futex wake-up each time. */
#include "qs.h"
#include "qs_guard.h"
#include "qs_os.h"

#include <stdatomic.h>
#include <stdlib.h>

#define QS_MAX_THREADS 64
#define QS_SPIN_ITERS 20000 /* ~0.1-0.5 ms of pause instructions before a worker sleeps */

typedef struct {
    qs_mutex_t lock; /* serialises callers */
    qs_mutex_t m;    /* protects sleeping workers */
    qs_cond_t wake;
    int n_workers;
    int n_sleeping;
    /* The job word: (generation << 8) | the number of workers that take part in that job. One atomic, so a worker
     * reads a job's number and its share in it together: read apart, a worker not taking part in job g that was
     * descheduled between the two reads could see the next job's count, run job g+1 early and then once more on
     * seeing g+1, counting itself off twice, and the caller returned (freeing its stack context) while another
     * worker still ran a task of it. */
    atomic_uint_fast64_t job;
    atomic_int pending;
    atomic_uint_fast64_t joined; /* bit i: worker i took part in the current job (a second time is a pool bug) */
    qs_task_fn fn;
    void *ctx;
    int64_t n_tasks;
    atomic_llong next;
    atomic_int faulted; /* a task of the current job hit SIGBUS (see qs_guard.h) */
} qs_pool;

static qs_pool pool = {QS_MUTEX_INIT, QS_MUTEX_INIT, QS_COND_INIT, 0, 0, 0, 0, 0, NULL, NULL, 0, 0, 0};
static atomic_long double_joins = 0; /* workers that took part in one job twice (read by qs_pool_selftest) */

/* Test hook (qs_pool_selftest): a worker pauses this many microseconds on every 4th job word it reads, widening
 * the window between reading a job and taking part in it, where descheduling on a busy machine lands. */
static atomic_int pause_us = 0;

#define JOB_GEN(j) ((uint64_t)(j) >> 8)
#define JOB_ACTIVE(j) ((int)((j) & 0xff))
static qs_once_t atfork_once = QS_ONCE_INIT;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    QS_CPU_RELAX();
#endif
}

/* Every task runs under its own guard (QS_GUARD_TASK: a plain sigsetjmp, savemask 0; nothing on Windows): a fault
 * ends that task, marks the job, and the loop goes on claiming (and, once faulted, skipping) tasks, so the job's
 * bookkeeping always completes. */
static void run_tasks(void) {
    for (;;) {
        int64_t t = atomic_fetch_add_explicit(&pool.next, 1, memory_order_relaxed);
        if (t >= pool.n_tasks) break;
        if (atomic_load_explicit(&pool.faulted, memory_order_relaxed)) continue;
        QS_GUARD_TASK(pool.fn(pool.ctx, t), atomic_store_explicit(&pool.faulted, 1, memory_order_relaxed));
    }
}

typedef struct {
    int id;
    uint64_t start_gen; /* generation current when the worker was created (before the job that needs it) */
} worker_arg;

static void worker_main(void *varg) {
    worker_arg a = *(worker_arg *)varg;
    free(varg);
    int id = a.id;
    uint64_t seen = a.start_gen;
    for (;;) {
        uint64_t j = 0;
        int fresh = 0;
        for (int i = 0; i < QS_SPIN_ITERS; ++i) {
            j = atomic_load_explicit(&pool.job, memory_order_acquire);
            if ((fresh = JOB_GEN(j) != seen)) break;
            cpu_relax();
        }
        if (!fresh) {
            qs_mutex_lock(&pool.m);
            pool.n_sleeping++;
            while (JOB_GEN(j = atomic_load_explicit(&pool.job, memory_order_acquire)) == seen)
                qs_cond_wait(&pool.wake, &pool.m);
            pool.n_sleeping--;
            qs_mutex_unlock(&pool.m);
        }
        seen = JOB_GEN(j);
        int pause = atomic_load_explicit(&pause_us, memory_order_relaxed);
        if (pause > 0 && (seen + (uint64_t)id) % 4 == 0) qs_sleep_us((unsigned)pause);
        if (id < JOB_ACTIVE(j)) { /* the caller waits for this worker, so job `seen` is still the current one */
            uint64_t bit = (uint64_t)1 << id; /* counted under the self-test only: off the kernels' hot path */
            if (pause > 0 && (atomic_fetch_or_explicit(&pool.joined, bit, memory_order_relaxed) & bit))
                atomic_fetch_add_explicit(&double_joins, 1, memory_order_relaxed);
            run_tasks();
            atomic_fetch_sub_explicit(&pool.pending, 1, memory_order_acq_rel);
        }
    }
}

static void child_after_fork(void) {
    /* The child has none of the parent's workers: start over. */
    qs_mutex_init(&pool.lock);
    qs_mutex_init(&pool.m);
    qs_cond_init(&pool.wake);
    pool.n_workers = 0;
    pool.n_sleeping = 0;
    atomic_store(&pool.pending, 0);
}

static void install_atfork(void) { qs_at_fork_child(child_after_fork); /* no fork (Windows): nothing to do */ }

int qs_threads_default(void) {
    int n = qs_cpu_count();
    return n > QS_MAX_THREADS ? QS_MAX_THREADS : n;
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
    qs_once(&atfork_once, install_atfork);
    qs_mutex_lock(&pool.lock);
    int want = n_threads - 1;
    while (pool.n_workers < want) {
        worker_arg *wa = (worker_arg *)malloc(sizeof *wa);
        if (!wa) break;
        wa->id = pool.n_workers;
        wa->start_gen = JOB_GEN(atomic_load_explicit(&pool.job, memory_order_relaxed));
        if (qs_thread_start(worker_main, wa) != 0) { /* detached */
            free(wa);
            break;
        }
        pool.n_workers++;
    }
    if (want > pool.n_workers) want = pool.n_workers;
    pool.fn = fn;
    pool.ctx = ctx;
    pool.n_tasks = n_tasks;
    atomic_store_explicit(&pool.next, 0, memory_order_relaxed);
    atomic_store_explicit(&pool.faulted, 0, memory_order_relaxed);
    atomic_store_explicit(&pool.pending, want, memory_order_relaxed);
    atomic_store_explicit(&pool.joined, 0, memory_order_relaxed);
    uint64_t gen = JOB_GEN(atomic_load_explicit(&pool.job, memory_order_relaxed)) + 1;
    atomic_store_explicit(&pool.job, (gen << 8) | (uint64_t)want, memory_order_release); /* want <= 63 */
    qs_mutex_lock(&pool.m);
    if (pool.n_sleeping) qs_cond_broadcast(&pool.wake);
    qs_mutex_unlock(&pool.m);
    run_tasks();
    for (int spins = 0; atomic_load_explicit(&pool.pending, memory_order_acquire) > 0; ++spins) {
        if (spins < QS_SPIN_ITERS) cpu_relax();
        else qs_yield();
    }
    int faulted = atomic_load_explicit(&pool.faulted, memory_order_relaxed);
    qs_mutex_unlock(&pool.lock);
    if (faulted) qs_guard_rethrow(); /* the job is over and the pool released: only now leave this frame */
}

/* ---------------------------------------------------------------- self-test */
typedef struct {
    atomic_int live;   /* 1 while the caller is inside qs_parallel_for */
    atomic_long done;  /* tasks finished */
    atomic_long stale; /* tasks that ran after their job had returned */
} selftest_ctx;

static void selftest_task(void *vctx, int64_t t) {
    selftest_ctx *c = (selftest_ctx *)vctx;
    for (volatile int64_t i = 0; i < (t % 3) * 20000; ++i) {
    }
    if (!atomic_load(&c->live)) atomic_fetch_add(&c->stale, 1);
    atomic_fetch_add(&c->done, 1);
}

int64_t qs_pool_selftest(int64_t jobs, int n_threads, int pause) {
    /* the call's jobs share one context, so a task of a job that has returned is counted, not a use after return */
    selftest_ctx *shared = (selftest_ctx *)calloc(1, sizeof *shared);
    if (!shared) return -1;
    atomic_store(&pause_us, pause > 0 ? pause : 0);
    int64_t bad = 0;
    atomic_store(&shared->stale, 0);
    for (int64_t i = 0; i < jobs; ++i) {
        int64_t n = 2 + (i * 7919) % n_threads; /* the number of workers taking part changes job by job */
        atomic_store(&shared->done, 0);
        atomic_store(&shared->live, 1);
        qs_parallel_for(n, selftest_task, shared, n_threads);
        atomic_store(&shared->live, 0);
        if (atomic_load(&shared->done) != n) bad++;
    }
    atomic_store(&pause_us, 0);
    bad += atomic_load(&shared->stale) + atomic_exchange(&double_joins, 0);
    free(shared);
    return bad;
}
