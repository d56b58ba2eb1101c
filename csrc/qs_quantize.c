/* Weight quantizers: the entry point, its size checks and the row split over the pool (docs/quantize.md); each
 * type's row quantizer is its type-table row's quantize_row (qs_traits.c). */
#include "qs.h"
#include "qs_quantize_internal.h"
#include "qs_traits.h"

int qs_can_quantize(int type) { return qs_traits(type)->quantize_row != NULL && qs_block_elems(type) > 0; }

typedef struct {
    qs_qrow_fn fn;
    const float *src;
    const float *qw;
    uint8_t *dst;
    int64_t n_rows, n, row_bytes, per_task;
    int bad; /* set when a row holds a NaN or an infinity */
} qz_ctx;

static int row_finite(const float *x, int64_t n) {
    uint32_t worst = 0;
    for (int64_t i = 0; i < n; ++i) {
        uint32_t u;
        memcpy(&u, x + i, 4);
        u &= 0x7F800000u;
        worst = u > worst ? u : worst;
    }
    return worst != 0x7F800000u;
}

static void qz_task(void *ctx, int64_t task) {
    qz_ctx *c = ctx;
    int64_t a = task * c->per_task, b = a + c->per_task;
    if (b > c->n_rows) b = c->n_rows;
    for (int64_t r = a; r < b; ++r) {
        const float *x = c->src + r * c->n;
        if (!row_finite(x, c->n)) { /* ggml's quantizers turn these into undefined conversions: refuse */
            __atomic_store_n(&c->bad, 1, __ATOMIC_RELAXED);
            memset(c->dst + r * c->row_bytes, 0, (size_t)c->row_bytes);
            continue;
        }
        c->fn(x, c->dst + r * c->row_bytes, c->n, c->qw);
    }
}

int64_t qs_quantize_rows(int type, const float *src, int64_t n_rows, int64_t n_per_row, const float *imatrix,
                         uint8_t *dst, int64_t dst_bytes, int n_threads) {
    const qs_type_traits *t = qs_traits(type);
    qs_qrow_fn fn = t->quantize_row;
    int64_t elems = t->elems, bytes = t->bytes;
    if (!fn || elems <= 0) return -1;
    if (n_rows < 0 || n_per_row < 0 || n_per_row % elems) return -2;
    int64_t row_bytes = n_per_row / elems * bytes;
    if (n_rows > 0 && row_bytes > INT64_MAX / n_rows) return -3;
    if (dst_bytes < n_rows * row_bytes) return -3;
    if (n_rows == 0 || n_per_row == 0) return 0;
    if (!src || !dst) return -3;
    if (n_threads <= 0) n_threads = qs_threads_default();
    /* tasks of about 64k values: a K-quant row search costs ~20 ns per value, a task ~1 ms */
    int64_t per = (1 << 16) / n_per_row;
    if (per < 1) per = 1;
    qz_ctx c = {fn, src, imatrix, dst, n_rows, n_per_row, row_bytes, per, 0};
    qs_parallel_for((n_rows + per - 1) / per, qz_task, &c, n_rows * n_per_row < (1 << 16) ? 1 : n_threads);
    return c.bad ? -4 : n_rows * row_bytes;
}
