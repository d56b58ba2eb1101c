/* The matvec / matmat drivers, dequantization, embedding rows and single dot products: every type through its
 * row of the type table (qs_traits.c), kernels picked for the active ISA; prompts of 4 or more columns go to the
 * code types' prefill (qs_repack.c), the GEMM (qs_gemm.c) or repacked weights where those apply. */
#include <stdlib.h>

#include "qs.h"
#include "qs_gemm.h"
#include "qs_guard.h"
#include "qs_quant_internal.h"
#include "qs_repack.h"
#include "qs_iquants_neon.h"
#include "qs_traits.h"

typedef float (*iq_dot_codes_fn)(const int8_t *codes, const float *mults, const int16_t *ls, int gs, int os, int q8k,
                                 int64_t k, const uint8_t *x);
static const iq_dot_codes_fn IQ_DOT_CODES[QS_TIERS] = SLOTS(iq_dot_codes, X1, A2);

static qs_deq_block_fn deq_fn(const qs_type_traits *t) { return QS_PICK_FN(t->deq, qs_isa_tier()); }
static qs_dot_fn dot_fn(const qs_type_traits *t) { return QS_PICK_FN(t->dot, qs_isa_tier()); }

/* ---------------------------------------------------------------- dequantization */
/* Dequantize n_blocks blocks (scalar types: elements) in parallel chunks. */
typedef struct {
    qs_deq_block_fn fn;
    qs_deq_row_fn row; /* plain types: a whole run at once, where the tier has one */
    const uint8_t *src;
    float *dst;
    int64_t n_blocks, per_task;
    int elems, bytes;
} deq_ctx;

static void deq_task(void *vctx, int64_t t) {
    deq_ctx *c = (deq_ctx *)vctx;
    int64_t a = t * c->per_task, b = a + c->per_task;
    if (b > c->n_blocks) b = c->n_blocks;
    if (c->row) {
        c->row(c->src + a * c->bytes, c->dst + a, b - a);
        return;
    }
    for (int64_t i = a; i < b; ++i) c->fn(c->src + i * c->bytes, c->dst + i * c->elems);
}

static int dequantize_unguarded(int type, const uint8_t *src, float *dst, int64_t n_blocks, int n_threads) {
    const qs_type_traits *tr = qs_traits(type);
    if (!tr->deq[0] || n_blocks < 0 || n_blocks > INT64_MAX / tr->bytes / tr->elems) return -1;
    deq_ctx c = {deq_fn(tr), QS_PICK_FN(tr->deq_row, qs_isa_tier()), src, dst, n_blocks, 0, tr->elems, tr->bytes};
    int64_t elems = n_blocks * tr->elems;
    int64_t per = (1 << 16) / tr->elems; /* ~64k elements per task */
    if (per < 1) per = 1;
    c.per_task = per;
    int64_t n_tasks = (n_blocks + per - 1) / per;
    qs_parallel_for(n_tasks, deq_task, &c, elems < (1 << 17) ? 1 : n_threads);
    return 0;
}

int qs_dequantize(int type, const uint8_t *src, float *dst, int64_t n_blocks, int n_threads) {
    int rc;
    QS_GUARDED(rc, dequantize_unguarded(type, src, dst, n_blocks, n_threads));
    return rc;
}

/* Embedding lookup: dequantize rows ids[0..n_ids) of a table of n_rows rows of row_len elements. */
typedef struct {
    qs_deq_block_fn fn;
    const uint8_t *table;
    const int64_t *ids;
    float *dst;
    int64_t row_len, row_bytes;
    int elems, bytes;
} rows_ctx;

static void rows_task(void *vctx, int64_t t) {
    rows_ctx *c = (rows_ctx *)vctx;
    const uint8_t *src = c->table + c->ids[t] * c->row_bytes;
    float *d = c->dst + t * c->row_len;
    for (int64_t i = 0; i < c->row_len / c->elems; ++i) c->fn(src + i * c->bytes, d + i * c->elems);
}

static int get_rows_unguarded(int type, const uint8_t *table, int64_t n_rows, int64_t row_len, const int64_t *ids,
                              int64_t n_ids, float *dst, int n_threads) {
    const qs_type_traits *tr = qs_traits(type);
    if (!tr->deq[0] || row_len <= 0 || row_len % tr->elems || n_ids < 0) return -1;
    for (int64_t i = 0; i < n_ids; ++i)
        if (ids[i] < 0 || ids[i] >= n_rows) return -1;
    rows_ctx c = {deq_fn(tr), table, ids, dst, row_len, row_len / tr->elems * tr->bytes, tr->elems, tr->bytes};
    qs_parallel_for(n_ids, rows_task, &c, n_ids * row_len < (1 << 17) ? 1 : n_threads);
    return 0;
}

int qs_get_rows(int type, const uint8_t *table, int64_t n_rows, int64_t row_len, const int64_t *ids, int64_t n_ids,
                float *dst, int n_threads) {
    int rc;
    QS_GUARDED(rc, get_rows_unguarded(type, table, n_rows, row_len, ids, n_ids, dst, n_threads));
    return rc;
}


/* ---------------------------------------------------------------- one dot product */
static int vec_dot_unguarded(int type, int64_t n, const uint8_t *w, const uint8_t *xq, float *out) {
    qs_dot_fn fn = dot_fn(qs_traits(type));
    if (!fn || n < 0) return -1;
    *out = fn(n, w, xq);
    return 0;
}

int qs_vec_dot(int type, int64_t n, const uint8_t *w, const uint8_t *xq, float *out) {
    int rc;
    QS_GUARDED(rc, vec_dot_unguarded(type, n, w, xq, out));
    return rc;
}

/* ---------------------------------------------------------------- matvec / matmat drivers */
typedef struct {
    const qs_type_traits *tr;
    qs_dot_fn dot;
    qs_deq_block_fn deq; /* fallback: dequantize row, float dot */
    const uint8_t *w;
    int64_t n_rows, k, row_bytes, rows_per_task;
    const uint8_t *xq; /* n_x activation rows, xq_stride bytes apart (quantized, or float for fallback) */
    int64_t xq_stride, n_x;
    float *y; /* [n_x][n_rows] */
    int elems, bytes;
    int failed;
} mm_ctx;

static void mm_task(void *vctx, int64_t t) {
    mm_ctx *c = (mm_ctx *)vctx;
    int64_t a = t * c->rows_per_task, b = a + c->rows_per_task;
    if (b > c->n_rows) b = c->n_rows;
    if (c->dot && c->n_x > 1 && c->tr->codes) {
        /* i-quant / ternary / FP4 rows: decoded to codes once, then dotted with every column (the same sums and
         * float operations as the one-column dot, so prefill and decode agree bit for bit) */
        int8_t *codes = (int8_t *)malloc((size_t)c->k);
        float *mults = (float *)malloc((size_t)(c->k / 16 + 1) * sizeof(float));
        int16_t *ls = (int16_t *)malloc((size_t)(c->k / 16 + 1) * sizeof(int16_t));
        if (!codes || !mults || !ls) {
            free(codes);
            free(mults);
            free(ls);
            c->failed = 1;
            return;
        }
        const int q8k = c->elems == 256, os = c->tr->code_outer;
        const iq_dot_codes_fn dot_codes = QS_PICK(IQ_DOT_CODES);
        for (int64_t r = a; r < b; ++r) {
            const int gs = qs_iq_row_codes(c->tr->codes, c->elems, c->bytes, c->w + r * c->row_bytes, c->k, codes, mults, ls);
            for (int64_t j = 0; j < c->n_x; ++j) {
                const uint8_t *x = c->xq + j * c->xq_stride;
                c->y[j * c->n_rows + r] = dot_codes(codes, mults, ls, gs, os, q8k, c->k, x);
            }
        }
        free(codes);
        free(mults);
        free(ls);
        return;
    }
    if (c->dot) {
        for (int64_t r = a; r < b; ++r) {
            const uint8_t *wr = c->w + r * c->row_bytes;
            for (int64_t j = 0; j < c->n_x; ++j) c->y[j * c->n_rows + r] = c->dot(c->k, wr, c->xq + j * c->xq_stride);
        }
        return;
    }
    float *row = (float *)malloc((size_t)c->k * sizeof(float));
    if (!row) { c->failed = 1; return; }
    qs_dot_fn fdot = dot_fn(qs_traits(QS_F32));
    for (int64_t r = a; r < b; ++r) {
        const uint8_t *wr = c->w + r * c->row_bytes;
        for (int64_t i = 0; i < c->k / c->elems; ++i) c->deq(wr + i * c->bytes, row + i * c->elems);
        for (int64_t j = 0; j < c->n_x; ++j)
            c->y[j * c->n_rows + r] = fdot(c->k, (const uint8_t *)row, c->xq + j * c->xq_stride);
    }
    free(row);
}

int64_t qs_weight_bytes(int type, int64_t rows, int64_t k) {
    if (type & QS_RP_FLAG) return qs_repack_bytes(type & ~QS_RP_FLAG, rows, k);
    const qs_type_traits *tr = qs_traits(type);
    int64_t b;
    if (!tr->deq[0] || tr->elems <= 0 || rows < 0 || k <= 0 || k % tr->elems ||
        __builtin_mul_overflow(rows, k / tr->elems * tr->bytes, &b))
        return -1;
    return b;
}

static int matmat_unguarded(int type, const uint8_t *w, int64_t n_rows, int64_t k, const float *x, int64_t n_x,
                            float *y, int n_threads) {
    if (type & QS_RP_FLAG) {
        if (k > INT64_MAX / 8 || n_x < 0 || n_x > INT64_MAX / 8 / (k > 0 ? k : 1) || n_rows > INT64_MAX / 8 / (n_x ? n_x : 1))
            return -1;
        return qs_rp_matmat(type, w, n_rows, k, x, n_x, y, n_threads);
    }
    const qs_type_traits *tr = qs_traits(type);
    if (!tr->deq[0] || tr->elems == 0 || k <= 0 || k % tr->elems || n_rows < 0 || n_x < 0) return -1;
    if (n_rows == 0 || n_x == 0) return 0;
    int64_t nbytes; /* the weights, the activations and the output must each be addressable */
    if (k > INT64_MAX / 8 || n_x > INT64_MAX / 4 || __builtin_mul_overflow(n_rows, k / tr->elems * tr->bytes, &nbytes) ||
        __builtin_mul_overflow(n_x, k * 8, &nbytes) || __builtin_mul_overflow(n_x * 4, n_rows, &nbytes))
        return -1;
    if (n_x >= 4 && qs_gemm_enabled()) {
        /* the code types: row groups decoded once into a repacked layout, the same bits as their row dots */
        if (qs_iq_prefill_usable(type, n_rows, k)) return qs_iq_prefill(type, w, n_rows, k, x, n_x, y, n_threads);
        int rc = qs_gemm(type, w, n_rows, k, k / tr->elems * tr->bytes, x, n_x, y, n_threads);
        if (rc <= 0) return rc;
    }
    mm_ctx c;
    memset(&c, 0, sizeof c);
    c.tr = tr;
    c.w = w;
    c.n_rows = n_rows;
    c.k = k;
    c.row_bytes = k / tr->elems * tr->bytes;
    c.n_x = n_x;
    c.y = y;
    c.elems = tr->elems;
    c.bytes = tr->bytes;
    c.dot = dot_fn(tr);
    uint8_t *xq = NULL;
    if (c.dot) {
        int64_t rb = qs_act_row_bytes(tr->act, k);
        xq = (uint8_t *)malloc((size_t)(rb * n_x) + 64);
        if (!xq) return -2;
        for (int64_t j = 0; j < n_x; ++j) qs_quantize_activation(tr->act, x + j * k, xq + j * rb, k);
        c.xq = xq;
        c.xq_stride = rb;
    } else {
        c.deq = deq_fn(tr);
        c.xq = (const uint8_t *)x;
        c.xq_stride = k * 4;
    }
    if (n_threads <= 0) n_threads = qs_threads_default();
    /* Few, contiguous chunks per thread: each thread streams long runs of rows (keeps the hardware prefetcher
     * on one stream) while 4 chunks per thread still balance uneven progress. */
    int64_t work;
    if (__builtin_mul_overflow(n_rows, k, &work) || __builtin_mul_overflow(work, n_x, &work)) work = INT64_MAX;
    if (work < (1 << 16)) n_threads = 1;
    int64_t per = (n_rows + 4 * (int64_t)n_threads - 1) / (4 * (int64_t)n_threads);
    if (per < 1) per = 1;
    c.rows_per_task = per;
    qs_parallel_for((n_rows + per - 1) / per, mm_task, &c, n_threads);
    free(xq);
    return c.failed ? -2 : 0;
}

int qs_matmat(int type, const uint8_t *w, int64_t n_rows, int64_t k, const float *x, int64_t n_x, float *y,
              int n_threads) {
    int rc;
    QS_GUARDED(rc, matmat_unguarded(type, w, n_rows, k, x, n_x, y, n_threads));
    return rc;
}

int qs_matvec(int type, const uint8_t *w, int64_t n_rows, int64_t k, const float *x, float *y, int n_threads) {
    return qs_matmat(type, w, n_rows, k, x, 1, y, n_threads);
}
