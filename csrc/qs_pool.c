/* Persistent pthread pool behind qs_parallel_for (no OpenMP: safe across fork()). */
#include "qs.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#define QS_MAX_THREADS 64

typedef struct {
    pthread_mutex_t lock;       /* serialises callers */
    pthread_mutex_t m;
    pthread_cond_t start;
    pthread_cond_t done;
    int n_workers;              /* threads started (excluding callers) */
    uint64_t generation;
    int active_workers;         /* workers taking part in this job */
    int pending;                /* participating workers not finished yet */
    qs_task_fn fn;
    void *ctx;
    int64_t n_tasks;
    atomic_llong next;
} qs_pool;

static qs_pool pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
                       PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, NULL, NULL, 0, 0};
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void run_tasks(void) {
    for (;;) {
        int64_t t = atomic_fetch_add(&pool.next, 1);
        if (t >= pool.n_tasks) break;
        pool.fn(pool.ctx, t);
    }
}

static void *worker_main(void *arg) {
    int id = (int)(intptr_t)arg;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&pool.m);
        while (pool.generation == seen) pthread_cond_wait(&pool.start, &pool.m);
        seen = pool.generation;
        int take_part = id < pool.active_workers;
        pthread_mutex_unlock(&pool.m);
        if (!take_part) continue;
        run_tasks();
        pthread_mutex_lock(&pool.m);
        if (--pool.pending == 0) pthread_cond_signal(&pool.done);
        pthread_mutex_unlock(&pool.m);
    }
    return NULL;
}

static void child_after_fork(void) {
    /* The child has none of the parent's workers: start over. */
    pthread_mutex_init(&pool.lock, NULL);
    pthread_mutex_init(&pool.m, NULL);
    pthread_cond_init(&pool.start, NULL);
    pthread_cond_init(&pool.done, NULL);
    pool.n_workers = 0;
    pool.generation = 0;
    pool.active_workers = 0;
    pool.pending = 0;
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
    if (n_threads <= 1) {
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
        int rc = pthread_create(&th, &attr, worker_main, (void *)(intptr_t)pool.n_workers);
        pthread_attr_destroy(&attr);
        if (rc != 0) break;
        pool.n_workers++;
    }
    if (want > pool.n_workers) want = pool.n_workers;
    pthread_mutex_lock(&pool.m);
    pool.fn = fn;
    pool.ctx = ctx;
    pool.n_tasks = n_tasks;
    atomic_store(&pool.next, 0);
    pool.active_workers = want;
    pool.pending = want;
    pool.generation++;
    pthread_cond_broadcast(&pool.start);
    pthread_mutex_unlock(&pool.m);
    run_tasks();
    pthread_mutex_lock(&pool.m);
    while (pool.pending > 0) pthread_cond_wait(&pool.done, &pool.m);
    pthread_mutex_unlock(&pool.m);
    pthread_mutex_unlock(&pool.lock);
}
