/* Prefill GEMM (see qs_gemm.h): activation column preparation and the threaded driver that runs the tile kernel
 * over panels of 4 weight rows, each decoded by its type's panel decoder (the type table, qs_traits.c). */
#include <stdlib.h>
#include <string.h>

#include "qs.h"
#include "qs_gemm.h"
#include "qs_quant_internal.h"
#include "qs_nn_neon.h"
#include "qs_os.h"
#include "qs_traits.h"

static inline float h2f(const uint8_t *p) { return qs_fp16_to_fp32(qs_load_u16(p)); }

static void gemm_dims(int type, int64_t k, qs_gemm_dims *d) {
    int group = qs_traits(type)->gemm_group;
    d->k = k;
    d->k64 = (k + 63) / 64 * 64;
    d->nl = d->k64 / 4;
    d->ng = group ? k / group : 0;
    d->ngp = (d->ng + 15) / 16 * 16;
    d->group = group;
}

int qs_gemm_decode_row(int type, const uint8_t *row, int64_t k, int simd, uint8_t *codes, float *ws, float *mrow) {
    qs_gemm_dims d;
    const qs_type_traits *t = qs_traits(type);
    if (!t->gemm_group || k % t->elems || k % qs_traits(t->act)->elems) return -1;
    if (simd && qs_isa_get() == QS_ISA_SCALAR) return 1;
    gemm_dims(type, k, &d);
    (simd ? QS_PICK_FN(t->panel, qs_isa_tier()) : t->panel[0])(row, &d, codes, ws, mrow);
    return 0;
}

void qs_gemm_prep_column(int act, const uint8_t *xq, const qs_gemm_dims *d, int8_t *codes, float *xs, float *bcol) {
    if (act == QS_Q8_K) {
        for (int64_t i = 0; i < d->k / 256; ++i, xq += 292) {
            float dx = qs_load_f32(xq);
            memcpy(codes + 256 * i, xq + 4, 256);
            for (int l = 0; l < 64; ++l) xs[64 * i + l] = dx;
            for (int g = 0; g < 16; ++g) {
                int16_t s;
                memcpy(&s, xq + 260 + 2 * g, 2);
                if (d->group == 16) bcol[16 * i + g] = dx * (float)s;
                else if (g % 2 == 0) bcol[8 * i + g / 2] = (float)s;
                else bcol[8 * i + g / 2] = dx * (bcol[8 * i + g / 2] + (float)s);
            }
        }
    } else {
        const int bytes = act == QS_Q8_1 ? 36 : 34, off = act == QS_Q8_1 ? 4 : 2;
        for (int64_t b = 0; b < d->k / 32; ++b, xq += bytes) {
            float dx = h2f(xq);
            memcpy(codes + 32 * b, xq + off, 32);
            for (int l = 0; l < 8; ++l) xs[8 * b + l] = dx;
            if (act == QS_Q8_1) {
                bcol[b] = h2f(xq + 2);
            } else if (d->group == 16) { /* NVFP4: a min per 16 elements */
                for (int h = 0; h < 2; ++h) {
                    int s = 0;
                    for (int j = 0; j < 16; ++j) s += (int8_t)xq[2 + 16 * h + j];
                    bcol[2 * b + h] = dx * (float)s;
                }
            } else {
                int s = 0;
                for (int j = 0; j < 32; ++j) s += (int8_t)xq[2 + j];
                bcol[b] = dx * (float)s;
            }
        }
    }
    memset(codes + d->k, 0, (size_t)(d->k64 - d->k));
    for (int64_t i = d->k / 4; i < d->nl; ++i) xs[i] = 0.0f;
    for (int64_t i = d->ng; i < d->ngp; ++i) bcol[i] = 0.0f;
}

/* ---------------------------------------------------------------- prepared activations */
static int gemm_on = 1;

int qs_gemm_set(int on) {
    int prev = gemm_on;
    if (on >= 0) gemm_on = on != 0;
    return prev;
}

int qs_gemm_enabled(void) { return gemm_on; }

/* Scalar tile: the numeric specification of the SIMD tiles (same decoded operands, same formula). */
void qs_gemm_tile_scalar(const qs_gemm_dims *d, const uint8_t *wc, const float *ws, const float *mrow,
                         const int8_t *xc, const float *xs, const float *bcol, int64_t n_c, int64_t n_valid, int n_r,
                         float *y, int64_t ldy) {
    (void)n_c;
    for (int64_t c = 0; c < n_valid; ++c) {
        const int8_t *x = xc + c * d->k64;
        const float *sx = xs + c * d->nl, *bc = bcol + c * d->ngp;
        for (int r = 0; r < n_r; ++r) {
            const uint8_t *w = wc + r * d->k64;
            const float *sw = ws + r * d->nl, *mr = mrow + r * d->ngp;
            float acc = 0.0f;
            for (int64_t l = 0; l < d->nl; ++l) {
                int32_t p = 0;
                for (int e = 0; e < 4; ++e) p += (int32_t)w[4 * l + e] * (int32_t)x[4 * l + e];
                acc += (float)p * (sw[l] * sx[l]);
            }
            for (int64_t g = 0; g < d->ngp; ++g) acc -= mr[g] * bc[g];
            y[c * ldy + r] = acc;
        }
    }
}

typedef void (*tile_fn)(const qs_gemm_dims *, const uint8_t *, const float *, const float *, const int8_t *,
                        const float *, const float *, int64_t, int64_t, int, float *, int64_t);
static const tile_fn TILE[QS_TIERS] = SLOTS(gemm_tile, X2, A3);
/* the tile of the same slot for the gemm_wide types (codes above 127): AVX2's vpmaddubsw would saturate (none: those
 * types take the row-by-row dots there); ARM's SDOT reads int8, so its wide tile offsets the codes by 128 */
static const tile_fn TILE_WIDE[QS_TIERS] =
    BY_ARCH(({qs_gemm_tile_scalar, NULL, qs_gemm_tile_avx512}),
            ({qs_gemm_tile_scalar, qs_gemm_tile_neon, QS_DOTPROD(qs_gemm_tile_dotprod_wide),
              QS_I8MM(qs_gemm_tile_i8mm)}));

int qs_gemm_usable(int type, int64_t k) {
    const qs_type_traits *t = qs_traits(type);
    if (!t->gemm_group) return 0;
    /* codes above 127 would saturate AVX2's vpmaddubsw, and are not int8 for ARM's SDOT */
    if (t->gemm_wide && !TILE_WIDE[QS_PICK_AT(TILE, qs_isa_tier())]) return 0;
    return k % qs_traits(t->act)->elems == 0 && k % t->gemm_group == 0;
}

typedef struct {
    qs_gemm_act *a;
    const float *x;
    int64_t per;
    int failed;
} prep_ctx;

static void prep_task(void *vctx, int64_t t) {
    prep_ctx *p = (prep_ctx *)vctx;
    qs_gemm_act *a = p->a;
    const qs_gemm_dims *d = &a->d;
    uint8_t *tmp = (uint8_t *)malloc((size_t)qs_act_row_bytes(a->act, d->k) + 64);
    if (!tmp) {
        p->failed = 1;
        return;
    }
    int64_t j1 = (t + 1) * p->per < a->n_c ? (t + 1) * p->per : a->n_c;
    for (int64_t j = t * p->per; j < j1; ++j) {
        int8_t *cj = a->xc + j * d->k64;
        float *sj = a->xs + j * d->nl, *bj = a->bcol + j * d->ngp;
        if (j < a->n_x) {
            qs_quantize_activation(a->act, p->x + j * d->k, tmp, d->k);
            qs_gemm_prep_column(a->act, tmp, d, cj, sj, bj);
        } else { /* padding column: all zero, its outputs are never stored */
            memset(cj, 0, (size_t)d->k64);
            memset(sj, 0, (size_t)d->nl * sizeof(float));
            memset(bj, 0, (size_t)d->ngp * sizeof(float));
        }
    }
    free(tmp);
}

int qs_gemm_act_prepare(qs_gemm_act *a, int type, const float *x, int64_t n_x, int64_t k, int n_threads) {
    memset(a, 0, sizeof *a);
    if (!qs_gemm_usable(type, k)) return 1;
    a->act = qs_traits(type)->act;
    gemm_dims(type, k, &a->d);
    a->n_x = n_x;
    a->n_c = (n_x + 3) / 4 * 4;
    size_t per_col = (size_t)a->d.k64 + (size_t)(a->d.nl + a->d.ngp) * sizeof(float);
    a->buf = (uint8_t *)qs_aligned_alloc(64, ((size_t)a->n_c * per_col + 63) & ~(size_t)63);
    if (!a->buf) return -2;
    a->xc = (int8_t *)a->buf;
    a->xs = (float *)(a->buf + a->n_c * a->d.k64);
    a->bcol = a->xs + a->n_c * a->d.nl;
    prep_ctx p = {a, x, 4, 0};
    if (n_threads <= 0) n_threads = qs_threads_default();
    qs_parallel_for((a->n_c + 3) / 4, prep_task, &p, a->n_c * k < (1 << 15) ? 1 : n_threads);
    if (p.failed) {
        qs_gemm_act_free(a);
        return -2;
    }
    return 0;
}

int qs_gemm_act_fits(const qs_gemm_act *a, int type, int64_t k) {
    return a->buf && qs_gemm_usable(type, k) && a->act == qs_traits(type)->act && a->d.group == qs_traits(type)->gemm_group &&
           a->d.k == k;
}

void qs_gemm_act_free(qs_gemm_act *a) {
    qs_aligned_free(a->buf);
    a->buf = NULL;
}

/* ---------------------------------------------------------------- driver */
typedef struct {
    const qs_gemm_act *a;
    qs_panel_fn panel;
    tile_fn tile;
    const uint8_t *w;
    int64_t row_bytes, n_rows, panels_per_task;
    float *y;
    int failed;
} gemm_ctx;

static void gemm_task(void *vctx, int64_t t) {
    gemm_ctx *g = (gemm_ctx *)vctx;
    const qs_gemm_act *a = g->a;
    const qs_gemm_dims *d = &a->d;
    size_t bytes = (size_t)(4 * d->k64) + (size_t)(4 * d->nl + 4 * d->ngp) * sizeof(float) + 64;
    uint8_t *buf = (uint8_t *)qs_aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!buf) {
        g->failed = 1;
        return;
    }
    uint8_t *wc = buf;
    float *ws = (float *)(buf + 4 * d->k64), *mrow = ws + 4 * d->nl;
    int64_t p0 = t * g->panels_per_task, p1 = p0 + g->panels_per_task;
    int64_t n_panels = (g->n_rows + 3) / 4;
    if (p1 > n_panels) p1 = n_panels;
    for (int64_t p = p0; p < p1; ++p) {
        int64_t r0 = 4 * p;
        int n_r = g->n_rows - r0 < 4 ? (int)(g->n_rows - r0) : 4;
        for (int r = 0; r < 4; ++r) {
            if (r < n_r) {
                g->panel(g->w + (r0 + r) * g->row_bytes, d, wc + r * d->k64, ws + r * d->nl, mrow + r * d->ngp);
            } else {
                memset(wc + r * d->k64, 0, (size_t)d->k64);
                memset(ws + r * d->nl, 0, (size_t)d->nl * sizeof(float));
                memset(mrow + r * d->ngp, 0, (size_t)d->ngp * sizeof(float));
            }
        }
        g->tile(d, wc, ws, mrow, a->xc, a->xs, a->bcol, a->n_c, a->n_x, n_r, g->y + r0, g->n_rows);
    }
    qs_aligned_free(buf);
}

int qs_gemm_run(int type, const uint8_t *w, int64_t n_rows, int64_t row_bytes, const qs_gemm_act *a, float *y,
                int n_threads) {
    gemm_ctx g;
    memset(&g, 0, sizeof g);
    g.a = a;
    g.panel = QS_PICK_FN(qs_traits(type)->panel, qs_isa_tier());
    g.tile = (qs_traits(type)->gemm_wide ? TILE_WIDE : TILE)[QS_PICK_AT(TILE, qs_isa_tier())];
    if (!g.tile) g.tile = qs_gemm_tile_scalar; /* callers ask qs_gemm_usable first: not reached */
    g.w = w;
    g.row_bytes = row_bytes;
    g.n_rows = n_rows;
    g.y = y;
    if (n_threads <= 0) n_threads = qs_threads_default();
    int64_t n_panels = (n_rows + 3) / 4;
    int64_t per = (n_panels + 4 * (int64_t)n_threads - 1) / (4 * (int64_t)n_threads);
    if (per < 1) per = 1;
    g.panels_per_task = per;
    qs_parallel_for((n_panels + per - 1) / per, gemm_task, &g, n_threads);
    return g.failed ? -2 : 0;
}

int qs_gemm(int type, const uint8_t *w, int64_t n_rows, int64_t k, int64_t row_bytes, const float *x, int64_t n_x,
            float *y, int n_threads) {
    qs_gemm_act a;
    int rc = qs_gemm_act_prepare(&a, type, x, n_x, k, n_threads);
    if (rc) return rc;
    rc = qs_gemm_run(type, w, n_rows, row_bytes, &a, y, n_threads);
    qs_gemm_act_free(&a);
    return rc;
}
