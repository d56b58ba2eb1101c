/* Load-time repacking into the R16 layouts (qs_repack.h), activation preparation and the threaded matmul driver
 * for repacked weights; each type's layout, writer and kernels are its type-table row's rp (qs_traits.c), the
 * codecs in qs_repack_rows.c and qs_repack_avx*.c. Against ggml's row-by-row dot products the kernels differ only
 * in float summation order (docs/engine.md#repacked-weights). */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "qs.h"
#include "qs_guard.h"
#include "qs_os.h"
#include "qs_quant_internal.h"
#include "qs_repack.h"
#include "qs_traits.h"

static inline float h2f(const uint8_t *p) { return qs_fp16_to_fp32(qs_load_u16(p)); }

typedef qs_rp_layout rp_info;

/* the type's load-time layout, or NULL */
static const rp_info *rp_find(int type) {
    const rp_info *l = &qs_traits(type)->rp;
    return l->blk ? l : NULL;
}

/* the code types' prompt layout (qs_iq_prefill): never a load-time copy (2.5x the file's bytes), only a row
 * group decoded for the columns of one product; or NULL */
static const rp_info *rp_codes(int type) {
    const rp_info *l = &qs_traits(type)->rp_codes;
    return l->blk ? l : NULL;
}

int qs_repack_type(int type) { return rp_find(type) ? (QS_RP_FLAG | type) : -1; }

int64_t qs_repack_bytes(int type, int64_t rows, int64_t k) {
    const rp_info *ri = rp_find(type & ~QS_RP_FLAG);
    if (!ri || rows <= 0 || k <= 0 || rows % QS_RP_ROWS || k % ri->blk) return -1;
    int64_t units, bytes;
    if (__builtin_mul_overflow(rows / QS_RP_ROWS, k / ri->blk, &units) ||
        __builtin_mul_overflow(units, (int64_t)ri->unit, &bytes))
        return -1;
    return bytes;
}

typedef struct {
    const rp_info *ri;
    const uint8_t *src;
    int64_t row_bytes, nkb, g0;
    uint8_t *dst;
} repack_ctx;

static void repack_task(void *vctx, int64_t t) {
    repack_ctx *c = (repack_ctx *)vctx;
    int64_t g = c->g0 + t;
    const uint8_t *rows[QS_RP_ROWS];
    for (int r = 0; r < QS_RP_ROWS; ++r) rows[r] = c->src + (g * QS_RP_ROWS + r) * c->row_bytes;
    uint8_t *u = c->dst + g * c->nkb * c->ri->unit;
    qs_rp_unit_fn fn = c->ri->write;
    for (int64_t kb = 0; kb < c->nkb; ++kb, u += c->ri->unit) fn(rows, kb, u);
}

static int repack_unguarded(int type, const uint8_t *src, int64_t src_bytes, int64_t rows, int64_t k, uint8_t *dst,
                            int64_t dst_bytes, int64_t g0, int64_t g1, int n_threads) {
    const rp_info *ri = rp_find(type);
    int64_t need = qs_repack_bytes(type, rows, k);
    if (!ri || need < 0 || !src || !dst || dst_bytes < need) return QS_ERR_SIZE;
    int64_t row_bytes = k / qs_block_elems(type) * qs_block_bytes(type);
    if (src_bytes < 0 || rows > src_bytes / row_bytes) return QS_ERR_WEIGHT;
    if (g0 < 0 || g1 < g0 || g1 > rows / QS_RP_ROWS) return QS_ERR_SIZE;
    repack_ctx c = {ri, src, row_bytes, k / ri->blk, g0, dst};
    qs_parallel_for(g1 - g0, repack_task, &c, n_threads);
    return QS_OK;
}

int qs_repack(int type, const uint8_t *src, int64_t src_bytes, int64_t rows, int64_t k, uint8_t *dst,
              int64_t dst_bytes, int64_t g0, int64_t g1, int n_threads) {
    int rc;
    QS_GUARDED(rc, repack_unguarded(type, src, src_bytes, rows, k, dst, dst_bytes, g0, g1, n_threads));
    return rc;
}

/* ---------------------------------------------------------------- anonymous memory for repacked copies */
#define QS_HUGE (2 * 1024 * 1024)

/* 2 MiB aligned and hinted for huge pages where the OS has the hint (qs_os.h: Linux THP; none on macOS, Windows) */
void *qs_alloc_huge(int64_t bytes) {
    if (bytes <= 0 || bytes > INT64_MAX / 2 - QS_HUGE) return NULL;
    return qs_map_anon((size_t)bytes, 1);
}

void qs_free_huge(void *p, int64_t bytes) {
    if (p && bytes > 0) qs_unmap_anon(p, (size_t)bytes);
}

int qs_drop_pages(const uint8_t *p, int64_t n) {
    if (!p || n <= 0) return -1;
    return qs_page_drop(p, (size_t)n);
}

/* ---------------------------------------------------------------- activations */
typedef struct {
    const rp_info *ri;
    const float *x;
    int64_t k, n_x;
    uint8_t *xq;
    int64_t xq_stride;
    int32_t *ia;
    int64_t ia_stride;
    float *fa, *fb;
    int64_t f_stride;
} prep_ctx;

void qs_rp_bf16_act_scalar(const float *x, uint8_t *dst, int64_t n) { qs_quantize_bf16(x, dst, n); }
typedef void (*bf16_act_fn)(const float *x, uint8_t *dst, int64_t n);
static const bf16_act_fn BF16_ACT[QS_TIERS] = SLOTS(rp_bf16_act, X2, A0);

/* Column j: ggml's quantized blocks, then per block its scale (fa), Q8_1's s (fb) and the integer offsets (ia):
 * Q4_K, Q5_K: per 256, four int16 pairs (sums of sub-blocks 2p, 2p+1); Q6_K: per 256, 32 x the 16 sums of 16;
 * Q2_K: per 256, the 16 sums of 16; Q3_K: 4 x them; IQ4_XS: per 256, 128 x the 8 sums of 32; Q4_0 / Q5_0 / Q8_0, IQ4_NL: per 32, 8 / 16 / 128 x the block's sum. */
static void prep_task(void *vctx, int64_t j) {
    prep_ctx *p = (prep_ctx *)vctx;
    const rp_info *ri = p->ri;
    uint8_t *xq = p->xq + j * p->xq_stride;
    int32_t *ia = p->ia + j * p->ia_stride;
    float *fa = p->fa + j * p->f_stride, *fb = p->fb + j * p->f_stride;
    if (ri->act == QS_BF16) { /* the values alone */
        QS_PICK(BF16_ACT)(p->x + j * p->k, xq, p->k);
        return;
    }
    qs_quantize_activation(ri->act, p->x + j * p->k, xq, p->k);
    int64_t nab = p->k / ri->act_elems;
    for (int64_t b = 0; b < nab; ++b) {
        const uint8_t *blk = xq + b * ri->act_bytes;
        if (ri->act == QS_Q8_K) {
            int16_t bs[16];
            memcpy(bs, blk + 260, 32);
            fa[b] = qs_load_f32(blk);
            if (ri->ia == QS_RP_IA_K45) {
                for (int q = 0; q < 4; ++q) {
                    int32_t s0 = bs[4 * q] + bs[4 * q + 1], s1 = bs[4 * q + 2] + bs[4 * q + 3];
                    ia[4 * b + q] = (int32_t)(((uint32_t)(uint16_t)(int16_t)s0) | ((uint32_t)(uint16_t)(int16_t)s1 << 16));
                }
            } else if (ri->ia == QS_RP_IA_CODES) { /* the code types' prompt layout: 64 x each scale group's sum */
                const int ng = ri->ia_per, per = 16 / ng;
                for (int g = 0; g < ng; ++g) {
                    int32_t t = 0;
                    for (int e = 0; e < per; ++e) t += bs[per * g + e];
                    ia[ng * b + g] = 64 * t;
                }
            } else if (ri->ia == QS_RP_IA_SUM32) {
                for (int s = 0; s < 8; ++s) ia[8 * b + s] = ri->ia_mul * (bs[2 * s] + bs[2 * s + 1]);
            } else { /* QS_RP_IA_SUM16 */
                for (int s = 0; s < 16; ++s) ia[16 * b + s] = ri->ia_mul * bs[s];
            }
        } else {
            fa[b] = h2f(blk);
            if (ri->act == QS_Q8_1) {
                fb[b] = h2f(blk + 2);
            } else {
                int32_t s = 0;
                for (int e = 0; e < 32; ++e) s += (int8_t)blk[2 + e];
                ia[b] = ri->ia_mul * s;
            }
        }
    }
}

/* ---------------------------------------------------------------- driver */
/* Activations prepared for one layout: the buffer behind a qs_rp_x. */
typedef struct {
    const rp_info *ri;
    uint8_t *buf;
    qs_rp_x x;
    int64_t per_col; /* bytes of one column's prepared activations */
} rp_act;

static int act_prepare(rp_act *a, const rp_info *ri, const float *x, int64_t k, int64_t n_x, int n_threads) {
    prep_ctx p;
    a->ri = ri;
    if (ri->act == QS_F32) { /* float layouts read the activations where they are */
        a->buf = NULL;
        a->per_col = k * 4;
        a->x = (qs_rp_x){(const uint8_t *)x, k * 4, NULL, 0, NULL, NULL, 0};
        return QS_OK;
    }
    const int64_t nab = k / ri->act_elems;
    p.ri = ri;
    p.x = x;
    p.k = k;
    p.n_x = n_x;
    p.xq_stride = (nab * ri->act_bytes + 63) / 64 * 64;
    const int plain = ri->act == QS_BF16; /* the values alone: no offsets, no scales */
    p.ia_stride = plain ? 0 : (nab * (ri->ia_per ? ri->ia_per : 1) + 15) / 16 * 16;
    p.f_stride = plain ? 0 : (nab + 15) / 16 * 16;
    a->per_col = p.xq_stride + p.ia_stride * 4 + p.f_stride * 8;
    size_t bytes = (size_t)n_x * (size_t)a->per_col;
    a->buf = (uint8_t *)qs_aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!a->buf) return QS_ERR_NOMEM;
    p.xq = a->buf;
    p.ia = (int32_t *)(a->buf + n_x * p.xq_stride);
    p.fa = (float *)(p.ia + n_x * p.ia_stride);
    p.fb = p.fa + n_x * p.f_stride;
    qs_parallel_for(n_x, prep_task, &p, n_x * k < (1 << 16) ? 1 : n_threads);
    a->ri = ri;
    a->x = (qs_rp_x){p.xq, p.xq_stride, p.ia, p.ia_stride, p.fa, p.fb, p.f_stride};
    return QS_OK;
}

/* One product of a job: its weights, prepared activations and output. */
typedef struct {
    const rp_info *ri;
    qs_rp_kernel scalar;
    const uint8_t *w;
    int64_t n_groups, nkb, n_rows, col_block;
    const qs_rp_x *x;
    float *y;
} mm_mat;

/* Products of the same input (q/k/v, gate/up) in one pool job: their row groups form one sequence that the
 * threads take in contiguous chunks, so a layer waits at one barrier instead of three and the threads finish
 * together. Decode chunks shrink as the work runs out (guided: remaining / (2 x threads), at least ~32 KiB of
 * weights), which keeps each thread's stream long at first and the wait at the end short. The prefill GEMM
 * takes one long run per thread (its activations are reused across a run's groups). */
#define RP_MAX_MATS 32 /* a decode step's selected experts' gate and up matrices go in one job */
typedef struct {
    int n, tier, n_threads; /* tier: the ISA slot of the layouts' kernels (0: the scalar references) */
    int64_t n_x, total, min_chunk, fixed_chunk;
    int64_t g_end[RP_MAX_MATS]; /* cumulative group counts */
    mm_mat m[RP_MAX_MATS];
    atomic_llong next;
} mm_job;

static void mm_run(const mm_mat *c, int tier, int64_t n_x, int64_t g0, int64_t g1) {
    const int64_t gbytes = c->nkb * c->ri->unit;
    const int wide = c->ri->cols;
    const qs_rp_kernel kw = c->ri->wide[QS_PICK_AT(c->ri->wide, tier)];
    const qs_rp_kernel k1 = tier ? QS_PICK_FN(c->ri->one, tier) : c->scalar;
    float out[8 * 16] __attribute__((aligned(64)));
    for (int64_t cb = 0; cb < n_x; cb += c->col_block) {
        int64_t ce = cb + c->col_block < n_x ? cb + c->col_block : n_x;
        for (int64_t g = g0; g < g1; ++g) {
            const uint8_t *gp = c->w + g * gbytes;
            for (int64_t j = cb; j < ce;) {
                int nc;
                if (kw && ce - j >= wide) {
                    kw(gp, c->nkb, c->x, j, out);
                    nc = wide;
                } else {
                    k1(gp, c->nkb, c->x, j, out);
                    nc = 1;
                }
                for (int q = 0; q < nc; ++q) memcpy(c->y + (j + q) * c->n_rows + g * 16, out + 16 * q, 16 * sizeof(float));
                j += nc;
            }
        }
    }
}

static void mm_task(void *vctx, int64_t t) {
    (void)t;
    mm_job *job = (mm_job *)vctx;
    for (;;) {
        long long cur = atomic_load_explicit(&job->next, memory_order_relaxed), size;
        do {
            if (cur >= job->total) return;
            const int64_t rem = job->total - cur;
            size = job->fixed_chunk ? job->fixed_chunk : rem / (2 * job->n_threads);
            if (size < job->min_chunk) size = job->min_chunk;
            if (size > rem) size = rem;
        } while (!atomic_compare_exchange_weak_explicit(&job->next, &cur, cur + size, memory_order_relaxed,
                                                        memory_order_relaxed));
        const int64_t a = cur, b = cur + size;
        int64_t base = 0;
        for (int i = 0; i < job->n; base = job->g_end[i], ++i) {
            const int64_t lo = a > base ? a : base, hi = b < job->g_end[i] ? b : job->g_end[i];
            if (lo < hi) mm_run(&job->m[i], job->tier, job->n_x, lo - base, hi - base);
        }
    }
}

static int matmat_multi(int n, const int *rtype, const uint8_t *const *w, const int64_t *n_rows, int64_t k,
                        const float *x, const float *const *xs, int64_t n_x, float *const *y, int n_threads) {
    if (!rtype || !w || !n_rows || !y || n < 1 || n > RP_MAX_MATS || n_x < 0 || (!x && !xs)) return QS_ERR_SIZE;
    for (int i = 0; xs && i < n; ++i)
        if (!xs[i]) return QS_ERR_SIZE;
    const rp_info *ri[RP_MAX_MATS];
    for (int i = 0; i < n; ++i) {
        ri[i] = (rtype[i] & QS_RP_FLAG) ? rp_find(rtype[i] & ~QS_RP_FLAG) : NULL;
        if (!ri[i] || !w[i] || !y[i] || qs_repack_bytes(rtype[i], n_rows[i], k) < 0) return QS_ERR_SIZE;
    }
    if (n_x == 0) return QS_OK;
    if (n_threads <= 0) n_threads = qs_threads_default();
    rp_act acts[RP_MAX_MATS];
    const float *act_x[RP_MAX_MATS];
    int n_acts = 0, rc = QS_OK;
    mm_job job;
    memset(&job, 0, sizeof job);
    job.n = n;
    job.tier = qs_isa_tier();
    job.n_x = n_x;
    int64_t work = 0, bytes = 0;
    for (int i = 0; i < n && !rc; ++i) {
        const float *xi = xs ? xs[i] : x;
        int a = 0;
        while (a < n_acts && !(acts[a].ri == ri[i] && act_x[a] == xi)) ++a; /* one preparation per layout and input */
        if (a == n_acts) {
            rc = act_prepare(&acts[a], ri[i], xi, k, n_x, n_threads);
            if (rc) break;
            act_x[a] = xi;
            ++n_acts;
        }
        mm_mat *m = &job.m[i];
        m->ri = ri[i];
        m->scalar = ri[i]->one[0];
        m->w = w[i];
        m->n_groups = n_rows[i] / QS_RP_ROWS;
        m->nkb = k / ri[i]->blk;
        m->n_rows = n_rows[i];
        m->x = &acts[a].x;
        m->y = y[i];
        /* columns per pass over a run of groups: their activations stay in L2 (~256 KiB) while weights stream */
        m->col_block = (256 * 1024 / acts[a].per_col) / 8 * 8;
        if (m->col_block < 8) m->col_block = 8;
        job.total += m->n_groups;
        job.g_end[i] = job.total;
        work += n_rows[i] * k * n_x;
        bytes += qs_repack_bytes(rtype[i], n_rows[i], k);
    }
    if (!rc) {
        if (work < (1 << 16)) n_threads = 1;
        job.n_threads = n_threads;
        job.min_chunk = (32 * 1024 * job.total + bytes - 1) / (bytes > 0 ? bytes : 1);
        if (job.min_chunk < 1) job.min_chunk = 1;
        if (n_x > 1) job.fixed_chunk = (job.total + n_threads - 1) / n_threads;
        atomic_init(&job.next, 0);
        qs_parallel_for(n_threads, mm_task, &job, n_threads);
    }
    for (int a = 0; a < n_acts; ++a) qs_aligned_free(acts[a].buf);
    return rc;
}

int qs_rp_matmat_multi(int n, const int *rtype, const uint8_t *const *w, const int64_t *n_rows, int64_t k,
                       const float *x, int64_t n_x, float *const *y, int n_threads) {
    int rc;
    QS_GUARDED(rc, matmat_multi(n, rtype, w, n_rows, k, x, NULL, n_x, y, n_threads));
    return rc;
}

int qs_rp_matmat_multi_x(int n, const int *rtype, const uint8_t *const *w, const int64_t *n_rows, int64_t k,
                         const float *const *x, int64_t n_x, float *const *y, int n_threads) {
    int rc;
    QS_GUARDED(rc, matmat_multi(n, rtype, w, n_rows, k, NULL, x, n_x, y, n_threads));
    return rc;
}

int qs_rp_matmat(int rtype, const uint8_t *w, int64_t n_rows, int64_t k, const float *x, int64_t n_x, float *y,
                 int n_threads) {
    return matmat_multi(1, &rtype, &w, &n_rows, k, x, NULL, n_x, &y, n_threads);
}

/* ---------------------------------------------------------------- prompts of the code types */
/* The i-quants, IQ1 and TQ against many columns: each 16-row group decoded once (the type's codes function, AVX2
 * where the CPU has it) into its prompt layout (rp_codes) in a buffer of the task's own, then the repacked 4-column
 * kernels over every column. Per row the integer sums and the one float multiply-add per block are the one-column dot's
 * (qs_iq_dot_codes_scalar), so a prompt gives the same bits as token-by-token decoding. */
typedef struct {
    const rp_info *ri;
    int type;
    qs_rp_kernel kw, k1; /* the layout's wide and one-column kernels at the active ISA slot */
    const uint8_t *w;
    int64_t row_bytes, nkb, n_rows, n_x;
    const qs_rp_x *x;
    float *y;
    atomic_int failed;
} cp_ctx;

static void codes_unit(qs_codes_fn codes, const uint8_t *b, int r, uint8_t *u) {
    int8_t code[256];
    float mult[16];
    int16_t ls[16];
    const int gs = codes(b, code, mult, ls);
    memcpy(u + 4 * r, &mult[0], 4);
    for (int g = 0; g < 256 / gs; ++g) u[64 + 16 * g + r] = (uint8_t)(int8_t)ls[g];
    for (int c = 0; c < 64; ++c)
        for (int j = 0; j < 4; ++j) u[320 + 64 * c + 4 * r + j] = (uint8_t)(code[4 * c + j] + 64);
}

static void cp_task(void *vctx, int64_t g) {
    cp_ctx *c = (cp_ctx *)vctx;
    const int64_t unit = c->ri->unit;
    uint8_t *buf = (uint8_t *)qs_aligned_alloc(64, (size_t)(c->nkb * unit));
    if (!buf) {
        atomic_store(&c->failed, 1);
        return;
    }
    memset(buf, 0, (size_t)(c->nkb * unit));
    const int bytes = qs_block_bytes(c->type);
    for (int r = 0; r < QS_RP_ROWS; ++r) {
        const uint8_t *row = c->w + (g * QS_RP_ROWS + r) * c->row_bytes;
        for (int64_t kb = 0; kb < c->nkb; ++kb) codes_unit(qs_traits(c->type)->codes, row + kb * bytes, r, buf + kb * unit);
    }
    float out[4 * 16] __attribute__((aligned(64)));
    for (int64_t j = 0; j < c->n_x;) {
        int nc = 1;
        if (c->n_x - j >= 4) {
            c->kw(buf, c->nkb, c->x, j, out);
            nc = 4;
        } else {
            c->k1(buf, c->nkb, c->x, j, out);
        }
        for (int q = 0; q < nc; ++q) memcpy(c->y + (j + q) * c->n_rows + g * 16, out + 16 * q, 16 * sizeof(float));
        j += nc;
    }
    qs_aligned_free(buf);
}

int qs_iq_prefill_usable(int type, int64_t n_rows, int64_t k) {
    const rp_info *ri = rp_codes(type);
    return ri && ri->wide[QS_PICK_AT(ri->wide, qs_isa_tier())] && n_rows > 0 && n_rows % QS_RP_ROWS == 0 && k > 0 &&
           k % 256 == 0 && k <= (1 << 22);
}

static int iq_prefill_unguarded(int type, const uint8_t *w, int64_t n_rows, int64_t k, const float *x, int64_t n_x,
                                float *y, int n_threads) {
    if (!qs_iq_prefill_usable(type, n_rows, k) || !w || !x || !y || n_x < 1 || n_x > (1 << 20)) return QS_ERR_SIZE;
    cp_ctx c;
    memset(&c, 0, sizeof c);
    c.ri = rp_codes(type);
    c.type = type;
    c.kw = c.ri->wide[QS_PICK_AT(c.ri->wide, qs_isa_tier())];
    c.k1 = QS_PICK_FN(c.ri->one, qs_isa_tier());
    c.w = w;
    c.row_bytes = k / 256 * qs_block_bytes(type);
    c.nkb = k / 256;
    c.n_rows = n_rows;
    c.n_x = n_x;
    c.y = y;
    atomic_init(&c.failed, 0);
    if (n_threads <= 0) n_threads = qs_threads_default();
    rp_act a;
    int rc = act_prepare(&a, c.ri, x, k, n_x, n_threads);
    if (rc) return rc;
    c.x = &a.x;
    qs_parallel_for(n_rows / QS_RP_ROWS, cp_task, &c, n_threads);
    qs_aligned_free(a.buf);
    return atomic_load(&c.failed) ? QS_ERR_NOMEM : QS_OK;
}

int qs_iq_prefill(int type, const uint8_t *w, int64_t n_rows, int64_t k, const float *x, int64_t n_x, float *y,
                  int n_threads) {
    int rc;
    QS_GUARDED(rc, iq_prefill_unguarded(type, w, n_rows, k, x, n_x, y, n_threads));
    return rc;
}
