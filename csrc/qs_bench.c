/* Memory read-bandwidth probe for `quantscope bench kernels`: the ceiling a memory-bound GEMV is measured against. */
#include <stdatomic.h>

#include "qs.h"
#include "qs_guard.h"
#include "qs_os.h"

#if QS_ARCH_X86
#include <immintrin.h>
#endif

typedef struct {
    const uint8_t *p;
    int64_t n, per;
    uint64_t sums[64];
} probe_ctx;

#if QS_ARCH_X86
QS_TARGET_AVX2 static uint64_t xor_wide(const uint8_t *p, int64_t n) {
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    int64_t i = 0;
    for (; i + 128 <= n; i += 128) {
        a = _mm256_xor_si256(a, _mm256_loadu_si256((const __m256i *)(p + i)));
        b = _mm256_xor_si256(b, _mm256_loadu_si256((const __m256i *)(p + i + 32)));
        c = _mm256_xor_si256(c, _mm256_loadu_si256((const __m256i *)(p + i + 64)));
        d = _mm256_xor_si256(d, _mm256_loadu_si256((const __m256i *)(p + i + 96)));
    }
    a = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
    uint64_t s = (uint64_t)_mm256_extract_epi64(a, 0) ^ (uint64_t)_mm256_extract_epi64(a, 1) ^
                 (uint64_t)_mm256_extract_epi64(a, 2) ^ (uint64_t)_mm256_extract_epi64(a, 3);
    for (; i < n; ++i) s ^= p[i];
    return s;
}

#else
/* Elsewhere four 16-byte accumulators (NEON on ARM64): wide enough to keep the loads in flight. */
typedef uint64_t qs_v2u64 __attribute__((vector_size(16)));
static uint64_t xor_wide(const uint8_t *p, int64_t n) {
    qs_v2u64 a = {0, 0}, b = a, c = a, d = a, v;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        memcpy(&v, p + i, 16), a ^= v;
        memcpy(&v, p + i + 16, 16), b ^= v;
        memcpy(&v, p + i + 32, 16), c ^= v;
        memcpy(&v, p + i + 48, 16), d ^= v;
    }
    a ^= b ^ c ^ d;
    uint64_t s = a[0] ^ a[1];
    for (; i < n; ++i) s ^= p[i];
    return s;
}
#endif

static uint64_t xor_scalar(const uint8_t *p, int64_t n) {
    uint64_t s = 0, w;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&w, p + i, 8);
        s ^= w;
    }
    for (; i < n; ++i) s ^= p[i];
    return s;
}

static void probe_task(void *vctx, int64_t t) {
    probe_ctx *c = (probe_ctx *)vctx;
    int64_t a = t * c->per, b = a + c->per;
    if (b > c->n) b = c->n;
    uint64_t s = qs_isa_get() > QS_ISA_SCALAR ? xor_wide(c->p + a, b - a) : xor_scalar(c->p + a, b - a);
    c->sums[t % 64] ^= s;
}

static int read_probe(const uint8_t *p, int64_t n, int n_threads, uint64_t *out) {
    if (n_threads <= 0) n_threads = qs_threads_default();
    probe_ctx c;
    memset(&c, 0, sizeof c);
    c.p = p;
    c.n = n;
    c.per = (n + 4 * (int64_t)n_threads - 1) / (4 * (int64_t)n_threads);
    if (c.per < 4096) c.per = 4096;
    qs_parallel_for((n + c.per - 1) / c.per, probe_task, &c, n_threads);
    uint64_t s = 0;
    for (int i = 0; i < 64; ++i) s ^= c.sums[i];
    *out = s;
    return 0;
}

uint64_t qs_read_probe(const uint8_t *p, int64_t n, int n_threads) {
    uint64_t s = 0;
    int rc;
    QS_GUARDED(rc, read_probe(p, n, n_threads, &s));
    if (rc) qs_guard_note_fault();
    return s;
}

/* Thread-pool cost per operation: `reps` back-to-back qs_parallel_for calls of n_threads empty tasks (the wake-up
 * of the spinning workers and the barrier at the end, what every engine op pays once). Mean ns per call. */
static void empty_task(void *vctx, int64_t t) {
    (void)t;
    atomic_fetch_add_explicit((atomic_int *)vctx, 1, memory_order_relaxed);
}

double qs_pool_op_ns(int n_threads, int reps) {
    if (n_threads <= 0) n_threads = qs_threads_default();
    if (reps <= 0) return -1.0;
    atomic_int count = 0;
    qs_parallel_for(n_threads, empty_task, &count, n_threads); /* start the workers */
    const int64_t t0 = qs_now_ns();
    for (int i = 0; i < reps; ++i) qs_parallel_for(n_threads, empty_task, &count, n_threads);
    const int64_t t1 = qs_now_ns();
    if (atomic_load(&count) != (reps + 1) * n_threads) return -1.0;
    return (double)(t1 - t0) / reps;
}
