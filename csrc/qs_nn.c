/* Float kernels of the inference engine: RMSNorm, RoPE, softmax, gated activations, attention.
 * Scalar reference implementations; the SIMD variants (x86: qs_nn_simd.c, ARM64: qs_nn_neon.c) are picked from
 * the per-ISA slots below (qs_slots.h). */
#include "qs.h"

#include <math.h>
#include <stdlib.h>

#include "qs_nn_internal.h"
#include "qs_nn_neon.h"
#include "qs_quant_internal.h"
#include "qs_quant_neon.h"
#include "qs_quantize_internal.h"
#include "qs_slots.h"

void qs_rmsnorm_scalar(const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps) {
    for (int64_t r = 0; r < n_rows; ++r) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        double ss = 0.0;
        for (int64_t i = 0; i < n; ++i) ss += (double)xr[i] * xr[i];
        float scale = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
        if (w)
            for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * scale * w[i];
        else
            for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * scale;
    }
}

/* YaRN's ramp between the correction dimensions (pair i): 1 below corr0 (extrapolate), 0 above corr1. */
static double yarn_ramp(float corr0, float corr1, int i) {
    double y = (i - corr0) / fmax(0.001, (double)corr1 - corr0);
    return 1.0 - fmin(1.0, fmax(0.0, y));
}

void qs_rope_scalar(float *x, int64_t n_tokens, int n_heads, int head_dim, int rot_dim, const int32_t *pos,
                    const qs_rope_params *rp) {
    int half = rot_dim / 2;
    double inv_freq[512]; /* rot_dim <= 1024: checked by qs_rope, the only caller */
    if (half > 512) half = 512;
    for (int i = 0; i < half; ++i) {
        inv_freq[i] = pow((double)rp->freq_base, -2.0 * i / rot_dim);
        if (rp->freq_factors) inv_freq[i] /= (double)rp->freq_factors[i]; /* Llama 3 / Phi-3 rope factors */
    }
    /* ggml_rope_ext: interpolated angle freq_scale * theta, with YaRN mixing the extrapolated one back in below the
     * correction dimensions and scaling the magnitude (docs/engine.md, "RoPE scaling") */
    double mscale = rp->mscale;
    if (rp->ext_factor != 0.0f) mscale *= 1.0 + 0.1 * log(1.0 / rp->freq_scale);
    for (int64_t t = 0; t < n_tokens; ++t) {
        for (int i = 0; i < half; ++i) {
            const double extrap = (double)pos[t] * inv_freq[i];
            double theta = rp->freq_scale * extrap;
            if (rp->ext_factor != 0.0f) {
                const double mix = yarn_ramp(rp->corr0, rp->corr1, i) * rp->ext_factor;
                theta = theta * (1.0 - mix) + extrap * mix;
            }
            float c = (float)(cos(theta) * mscale), s = (float)(sin(theta) * mscale);
            for (int h = 0; h < n_heads; ++h) {
                float *v = x + (t * n_heads + h) * (int64_t)head_dim;
                int a = rp->neox ? i : 2 * i;
                int b = rp->neox ? i + half : 2 * i + 1;
                float x0 = v[a], x1 = v[b];
                v[a] = x0 * c - x1 * s;
                v[b] = x0 * s + x1 * c;
            }
        }
    }
}

void qs_softmax_scalar(float *x, int64_t n_rows, int64_t n) {
    for (int64_t r = 0; r < n_rows; ++r) {
        float *v = x + r * n;
        float mx = -INFINITY;
        for (int64_t i = 0; i < n; ++i) mx = v[i] > mx ? v[i] : mx;
        if (mx == -INFINITY) { /* fully masked row: all zeros */
            for (int64_t i = 0; i < n; ++i) v[i] = 0.0f;
            continue;
        }
        double sum = 0.0;
        for (int64_t i = 0; i < n; ++i) {
            v[i] = expf(v[i] - mx);
            sum += v[i];
        }
        float inv = (float)(1.0 / sum);
        for (int64_t i = 0; i < n; ++i) v[i] *= inv;
    }
}

void qs_swiglu_scalar(const float *gate, const float *up, float *out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void qs_geglu_tanh_scalar(const float *gate, const float *up, float *out, int64_t n) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    for (int64_t i = 0; i < n; ++i) {
        float g = gate[i];
        out[i] = 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g))) * up[i];
    }
}

void qs_layernorm_scalar(const float *x, const float *w, const float *b, float *y, int64_t n_rows, int64_t n,
                         float eps) {
    for (int64_t r = 0; r < n_rows; ++r) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        double sum = 0.0;
        for (int64_t i = 0; i < n; ++i) sum += xr[i];
        const float mean = (float)(sum / (double)n);
        double ss = 0.0;
        for (int64_t i = 0; i < n; ++i) ss += (double)(xr[i] - mean) * (double)(xr[i] - mean);
        const float scale = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
        for (int64_t i = 0; i < n; ++i) {
            float v = (xr[i] - mean) * scale;
            if (w) v *= w[i];
            if (b) v += b[i];
            yr[i] = v;
        }
    }
}

void qs_gelu_tanh_scalar(const float *x, float *out, int64_t n) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    for (int64_t i = 0; i < n; ++i) {
        const float g = x[i];
        out[i] = 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g)));
    }
}

void qs_layernorm(const float *x, const float *w, const float *b, float *y, int64_t n_rows, int64_t n, float eps) {
    if (n_rows > 0 && n > 0) qs_layernorm_scalar(x, w, b, y, n_rows, n, eps);
}

void qs_gelu_tanh(const float *x, float *out, int64_t n) { qs_gelu_tanh_scalar(x, out, n); }

/* ---------------------------------------------------------------- dispatchers */
typedef void (*gated_fn)(const float *gate, const float *up, float *out, int64_t n);
static void (*const RMSNORM[QS_TIERS])(const float *, const float *, float *, int64_t, int64_t, float) =
    SLOTS(rmsnorm, X1, A1);
static const gated_fn SWIGLU[QS_TIERS] = SLOTS(swiglu, X1, A1);
static const gated_fn GEGLU_TANH[QS_TIERS] = SLOTS(geglu_tanh, X1, A1);
static float (*const FDOT_F32[QS_TIERS])(const float *, const float *, int) =
    BY_ARCH(({qs_fdot_f32_scalar, qs_dot_f32_avx2}), ({qs_fdot_f32_scalar, qs_dot_f32_neon}));
static float (*const FDOT_F16[QS_TIERS])(const float *, const uint16_t *, int) =
    BY_ARCH(({qs_fdot_f16_scalar, qs_dot_f32_f16_avx2}), ({qs_fdot_f16_scalar, qs_dot_f32_f16_neon}));
static void (*const AXPY_F32[QS_TIERS])(float, const float *, float *, int) = SLOTS(axpy_f32, X1, A1);
static void (*const AXPY_F16[QS_TIERS])(float, const uint16_t *, float *, int) = SLOTS(axpy_f16, X1, A1);
static const qs_gdn_step_fn GDN_STEP[QS_TIERS] = SLOTS(gdn_step, X1, A1);

qs_gdn_step_fn qs_gdn_step_kernel(void) { return QS_PICK(GDN_STEP); }

void qs_rmsnorm(const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps) {
    QS_PICK(RMSNORM)(x, w, y, n_rows, n, eps);
}

int qs_rope(float *x, int64_t n_tokens, int n_heads, int head_dim, int rot_dim, const int32_t *pos, float freq_base,
            float freq_scale, int neox, const float *freq_factors) {
    const qs_rope_params rp = {freq_base, freq_scale, neox, freq_factors, 0.0f, 0.0f, 0.0f, 1.0f};
    return qs_rope_ext(x, n_tokens, n_heads, head_dim, rot_dim, pos, &rp);
}

int qs_rope_ext(float *x, int64_t n_tokens, int n_heads, int head_dim, int rot_dim, const int32_t *pos,
                const qs_rope_params *rp) {
    if (!rp || n_tokens < 0 || n_heads < 0) return QS_ERR_SIZE;
    if (head_dim <= 0 || head_dim > 1024 || rot_dim <= 0 || rot_dim % 2 || rot_dim > head_dim) return QS_ERR_HEADS;
    if (!(rp->freq_base > 0.0f) || !isfinite(rp->freq_base) || !(rp->freq_scale > 0.0f) || !isfinite(rp->freq_scale) ||
        !isfinite(rp->ext_factor) || !isfinite(rp->corr0) || !isfinite(rp->corr1) || !isfinite(rp->mscale))
        return QS_ERR_SIZE;
    if (rp->freq_factors)
        for (int i = 0; i < rot_dim / 2; ++i)
            if (!(rp->freq_factors[i] > 0.0f) || !isfinite(rp->freq_factors[i])) return QS_ERR_SIZE;
    qs_rope_scalar(x, n_tokens, n_heads, head_dim, rot_dim, pos, rp);
    return QS_OK;
}

void qs_softmax(float *x, int64_t n_rows, int64_t n) { qs_softmax_scalar(x, n_rows, n); }

void qs_swiglu(const float *gate, const float *up, float *out, int64_t n) {
    QS_PICK(SWIGLU)(gate, up, out, n);
}

void qs_swiglu_oai(const float *gate, const float *up, float *out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        const float g = gate[i] < 7.0f ? gate[i] : 7.0f; /* fminf would keep a NaN gate's partner */
        const float u = up[i] < -7.0f ? -7.0f : up[i] > 7.0f ? 7.0f : up[i];
        out[i] = g / (1.0f + expf(-1.702f * g)) * (u + 1.0f);
    }
}

void qs_geglu_tanh(const float *gate, const float *up, float *out, int64_t n) {
    QS_PICK(GEGLU_TANH)(gate, up, out, n);
}

/* ---------------------------------------------------------------- attention */
/* The K dots of the block types read the query quantized as their activation (Q8_0 for Q8_0 / Q4_0, BF16 for BF16:
 * llama.cpp's flash attention does the same, vec_dot_type), with the type table's kernels. The table itself sits
 * above this file (tests/test_csrc_layers.py), so the slots are named here. */
static const qs_dot_fn KDOT_Q8_0[QS_TIERS] = SLOTS(dot_q8_0, X2, A2);
static const qs_dot_fn KDOT_Q4_0[QS_TIERS] = SLOTS(dot_q4_0, X2, A2);
static const qs_dot_fn KDOT_BF16[QS_TIERS] = SLOTS(dot_bf16, X1, A1);
typedef void (*vaxpy_fn)(float a, const uint8_t *x, float *y, int n);
static const vaxpy_fn AXPY_Q8_0[QS_TIERS] = SLOTS(axpy_q8_0, X1, A1);
static const vaxpy_fn AXPY_Q4_0[QS_TIERS] = SLOTS(axpy_q4_0, X1, A1);
static const vaxpy_fn AXPY_BF16[QS_TIERS] = SLOTS(axpy_bf16, X1, A1);

int64_t qs_kv_row_bytes(int type, int head_dim) {
    if (head_dim <= 0 || head_dim > (1 << 16)) return -1;
    switch (type) {
    case QS_KV_F32: return 4 * (int64_t)head_dim;
    case QS_KV_F16:
    case QS_KV_BF16: return 2 * (int64_t)head_dim;
    case QS_KV_Q8_0: return head_dim % 32 ? -1 : (int64_t)head_dim / 32 * 34;
    case QS_KV_Q4_0: return head_dim % 32 ? -1 : (int64_t)head_dim / 32 * 18;
    default: return -1;
    }
}

int qs_hadamard(float *x, int64_t n, int nrot) {
    if (!x || nrot < 1 || nrot & (nrot - 1) || n < 0 || n % nrot) return QS_ERR_SIZE;
    const float s = 1.0f / sqrtf((float)nrot);
    for (int64_t c = 0; c < n; c += nrot) {
        float *v = x + c;
        for (int h = 1; h < nrot; h *= 2) /* butterflies in natural order: Sylvester's H_2n = [[H, H], [H, -H]] */
            for (int i = 0; i < nrot; i += 2 * h)
                for (int j = i; j < i + h; ++j) {
                    const float a = v[j], b = v[j + h];
                    v[j] = a + b;
                    v[j + h] = a - b;
                }
        for (int j = 0; j < nrot; ++j) v[j] *= s;
    }
    return QS_OK;
}

int qs_kv_rotation(int type, int head_dim, int is_k) {
    if ((type != QS_KV_Q8_0 && type != QS_KV_Q4_0) || head_dim <= 0 || head_dim % 64) return 0;
    int nrot = 64;
    while (is_k && head_dim % (2 * nrot) == 0) nrot *= 2;
    return nrot;
}

int qs_kv_store(void *cache, int type, int64_t row0, const float *src, int64_t n_rows, int head_dim) {
    const int64_t rb = qs_kv_row_bytes(type, head_dim);
    if (rb < 0) return QS_ERR_HEADS;
    if (!cache || !src || row0 < 0 || n_rows < 0) return QS_ERR_SIZE;
    uint8_t *dst = (uint8_t *)cache + row0 * rb;
    const int64_t n = n_rows * head_dim;
    switch (type) {
    case QS_KV_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case QS_KV_F16:
        for (int64_t i = 0; i < n; ++i) ((uint16_t *)dst)[i] = qs_fp32_to_fp16(src[i]);
        break;
    case QS_KV_BF16:
        for (int64_t i = 0; i < n; ++i) ((uint16_t *)dst)[i] = qs_fp32_to_bf16(src[i]);
        break;
    case QS_KV_Q8_0: qs_quantize_q8_0(src, dst, n); break; /* ggml's quantize_row_q8_0_ref, to the byte */
    default: qs_qrow_q4_0(src, dst, n, NULL); break;       /* quantize_row_q4_0_ref */
    }
    return QS_OK;
}

void qs_axpy_q8_0_scalar(float a, const uint8_t *x, float *y, int n) {
    for (int b = 0; b < n / 32; ++b, x += 34, y += 32) {
        const float d = qs_fp16_to_fp32(qs_load_u16(x));
        for (int j = 0; j < 32; ++j) y[j] += a * (d * (float)(int8_t)x[2 + j]);
    }
}

void qs_axpy_q4_0_scalar(float a, const uint8_t *x, float *y, int n) {
    for (int b = 0; b < n / 32; ++b, x += 18, y += 32) {
        const float d = qs_fp16_to_fp32(qs_load_u16(x));
        for (int j = 0; j < 16; ++j) {
            y[j] += a * (d * (float)((x[2 + j] & 15) - 8));
            y[j + 16] += a * (d * (float)((x[2 + j] >> 4) - 8));
        }
    }
}

void qs_axpy_bf16_scalar(float a, const uint8_t *x, float *y, int n) {
    for (int d = 0; d < n; ++d) y[d] += a * qs_bf16_to_fp32(qs_load_u16(x + 2 * d));
}

int qs_kv_load(const void *cache, int type, int64_t row0, float *dst, int64_t n_rows, int head_dim) {
    const int64_t rb = qs_kv_row_bytes(type, head_dim);
    if (rb < 0) return QS_ERR_HEADS;
    if (!cache || !dst || row0 < 0 || n_rows < 0) return QS_ERR_SIZE;
    const uint8_t *src = (const uint8_t *)cache + row0 * rb;
    for (int64_t r = 0; r < n_rows; ++r, src += rb) {
        float *y = dst + r * head_dim;
        for (int d = 0; d < head_dim; ++d) y[d] = 0.0f;
        switch (type) {
        case QS_KV_F32: memcpy(y, src, (size_t)head_dim * sizeof(float)); break;
        case QS_KV_F16: qs_axpy_f16_scalar(1.0f, (const uint16_t *)src, y, head_dim); break;
        case QS_KV_BF16: qs_axpy_bf16_scalar(1.0f, src, y, head_dim); break;
        case QS_KV_Q8_0: qs_axpy_q8_0_scalar(1.0f, src, y, head_dim); break;
        default: qs_axpy_q4_0_scalar(1.0f, src, y, head_dim); break;
        }
    }
    return QS_OK;
}

typedef struct {
    const float *q;
    const int32_t *q_pos;
    int n_heads, head_dim, n_kv_heads;
    int k_type, v_type;       /* QS_KV_* */
    int64_t k_row, v_row;     /* bytes of one cache row (position, KV head) */
    int64_t q_row;            /* bytes of one query as the K dot reads it (0: the float query itself) */
    const void *k, *v;
    int64_t n_kv, window;
    float scale, softcap;
    const float *sinks;
    float *out;
    int failed;
    int split; /* tasks per KV head and query: the group's query heads are split this many ways */
    float *probs; /* qs_attention_probs: [n_q][n_heads][n_kv] weights written instead of out (v, out unused) */
    /* the active ISA's kernels, picked once per call: they run once per cached position and head */
    float (*dot_f32)(const float *, const float *, int);
    float (*dot_f16)(const float *, const uint16_t *, int);
    void (*axpy_f32)(float, const float *, float *, int);
    void (*axpy_f16)(float, const uint16_t *, float *, int);
    qs_dot_fn kdot;          /* the block types' K dot (against the quantized query) */
    int (*q_quantize)(const float *, uint8_t *, int64_t);
    vaxpy_fn vaxpy;          /* the block types' V rows */
} attn_ctx;

#define QS_ATTN_MAX_GROUP 64
#define QS_ATTN_TILE 256 /* cached positions per step of the online softmax */

float qs_fdot_f32_scalar(const float *a, const float *b, int n) {
    float s = 0.0f;
    for (int d = 0; d < n; ++d) s += a[d] * b[d];
    return s;
}

float qs_fdot_f16_scalar(const float *a, const uint16_t *b, int n) {
    float s = 0.0f;
    for (int d = 0; d < n; ++d) s += a[d] * qs_fp16_to_fp32(b[d]);
    return s;
}

void qs_axpy_f32_scalar(float a, const float *x, float *y, int n) {
    for (int d = 0; d < n; ++d) y[d] += a * x[d];
}

void qs_axpy_f16_scalar(float a, const uint16_t *x, float *y, int n) {
    for (int d = 0; d < n; ++d) y[d] += a * qs_fp16_to_fp32(x[d]);
}

/* The scaled (and soft-capped) score of a query against cached key p of KV head kvh: qv the float query, qq the
 * same query as the K type's dot reads it (block types only). */
static float kv_score(const attn_ctx *c, const float *qv, const uint8_t *qq, int64_t p, int kvh) {
    const uint8_t *row = (const uint8_t *)c->k + (p * c->n_kv_heads + kvh) * c->k_row;
    float s;
    if (c->k_type == QS_KV_F16) s = c->dot_f16(qv, (const uint16_t *)row, c->head_dim);
    else if (c->k_type == QS_KV_F32) s = c->dot_f32(qv, (const float *)row, c->head_dim);
    else s = c->kdot(c->head_dim, row, qq);
    s *= c->scale;
    if (c->softcap > 0.0f) s = c->softcap * tanhf(s / c->softcap); /* gemma2's logit soft-capping */
    return s;
}

static void kv_axpy(const attn_ctx *c, float a, int64_t p, int kvh, float *acc) {
    const uint8_t *row = (const uint8_t *)c->v + (p * c->n_kv_heads + kvh) * c->v_row;
    if (c->v_type == QS_KV_F16) c->axpy_f16(a, (const uint16_t *)row, acc, c->head_dim);
    else if (c->v_type == QS_KV_F32) c->axpy_f32(a, (const float *)row, acc, c->head_dim);
    else c->vaxpy(a, row, acc, c->head_dim);
}

/* One task's place: query qi and `per` of the query heads (from h0) that share KV head kvh (grouped-query
 * attention), so each K and V row is read once for all of them while it is in L1; keys lo..hi are visible. */
typedef struct {
    int64_t qi, lo, hi;
    int kvh, h0, per;
} attn_span;

static attn_span attn_place(const attn_ctx *c, int64_t task) {
    attn_span s;
    const int G = c->n_heads / c->n_kv_heads;
    s.per = G / c->split;
    s.qi = task / (c->n_kv_heads * (int64_t)c->split);
    const int rest = (int)(task % (c->n_kv_heads * (int64_t)c->split));
    s.kvh = rest / c->split;
    s.h0 = s.kvh * G + (rest % c->split) * s.per;
    const int64_t qp = c->q_pos[s.qi];
    s.hi = qp < c->n_kv - 1 ? qp : c->n_kv - 1; /* causal: keys 0..qp */
    s.lo = 0;
    if (c->window > 0 && qp - c->window + 1 > s.lo) s.lo = qp - c->window + 1;
    return s;
}

/* The task's queries as the K type's dot reads them (per x q_row bytes in qq); nothing for F32 / F16 keys. */
static void attn_quantize_queries(const attn_ctx *c, const attn_span *s, uint8_t *qq) {
    if (!c->q_row) return;
    for (int g = 0; g < s->per; ++g)
        c->q_quantize(c->q + (s->qi * c->n_heads + s->h0 + g) * (int64_t)c->head_dim, qq + g * c->q_row,
                      c->head_dim);
}

/* The probe's task: every visible key's weight, two passes over the scores (max, then exp and sum in position order)
 * into probs, the output it writes anyway. */
static void attn_probs_task(void *vctx, int64_t task) {
    attn_ctx *c = (attn_ctx *)vctx;
    const attn_span s = attn_place(c, task);
    const int per = s.per;
    for (int g = 0; g < per; ++g) {
        float *pr = c->probs + (s.qi * c->n_heads + s.h0 + g) * c->n_kv;
        for (int64_t p = 0; p < c->n_kv; ++p) pr[p] = 0.0f;
    }
    if (s.hi < s.lo) return;
    uint8_t *qq = c->q_row ? (uint8_t *)malloc((size_t)(per * c->q_row)) : NULL;
    if (c->q_row && !qq) { c->failed = 1; return; }
    attn_quantize_queries(c, &s, qq);
    for (int g = 0; g < per; ++g) {
        const int h = s.h0 + g;
        const float *qv = c->q + (s.qi * c->n_heads + h) * (int64_t)c->head_dim;
        float *pr = c->probs + (s.qi * c->n_heads + h) * c->n_kv;
        float mx = c->sinks ? c->sinks[h] : -INFINITY;
        for (int64_t p = s.lo; p <= s.hi; ++p) {
            pr[p] = kv_score(c, qv, qq ? qq + g * c->q_row : NULL, p, s.kvh);
            mx = pr[p] > mx ? pr[p] : mx;
        }
        double sum = c->sinks ? (double)expf(c->sinks[h] - mx) : 0.0; /* a sink: mass without a value */
        for (int64_t p = s.lo; p <= s.hi; ++p) {
            const float d = pr[p] - mx;
            pr[p] = d < -105.0f ? 0.0f : expf(d); /* expf is exactly 0 there; skips glibc's underflow path */
            sum += pr[p];
        }
        const float inv = (float)(1.0 / sum);
        for (int64_t p = s.lo; p <= s.hi; ++p) pr[p] *= inv;
    }
    free(qq);
}

/* The attention's task, flash attention's online softmax: the visible keys in tiles of QS_ATTN_TILE; per head a
 * running maximum m and sum l (of e^(s - m)) and the output accumulating e^(s - m) V, rescaled by e^(m_old - m_new)
 * when a tile raises the maximum, divided by l at the end. Memory is one tile of scores per head, whatever the
 * context; the result is the two-pass softmax's within float rounding. A span of one tile is the two-pass softmax
 * itself, to the bit (scores, max, exp and sum in position order, then the weighted V rows). */
static void attn_flash_task(void *vctx, int64_t task) {
    attn_ctx *c = (attn_ctx *)vctx;
    const attn_span s = attn_place(c, task);
    const int per = s.per, hd = c->head_dim;
    for (int g = 0; g < per; ++g) {
        float *o = c->out + (s.qi * c->n_heads + s.h0 + g) * (int64_t)hd;
        for (int d = 0; d < hd; ++d) o[d] = 0.0f;
    }
    if (s.hi < s.lo) return;
    const int one = s.hi - s.lo + 1 <= QS_ATTN_TILE; /* the whole span in one tile: weights normalized first */
    const int64_t tile = one ? s.hi - s.lo + 1 : QS_ATTN_TILE;
    float *sc = (float *)malloc((size_t)(per * tile) * sizeof(float) + (size_t)(per * c->q_row));
    if (!sc) { c->failed = 1; return; }
    uint8_t *qq = c->q_row ? (uint8_t *)(sc + per * tile) : NULL;
    attn_quantize_queries(c, &s, qq);
    float mx[QS_ATTN_MAX_GROUP], inv[QS_ATTN_MAX_GROUP];
    double sum[QS_ATTN_MAX_GROUP];
    for (int g = 0; g < per; ++g) { /* a sink: mass e^(sink - m) without a value */
        mx[g] = c->sinks ? c->sinks[s.h0 + g] : -INFINITY;
        sum[g] = c->sinks ? 1.0 : 0.0;
    }
    for (int64_t p0 = s.lo; p0 <= s.hi; p0 += tile) {
        const int64_t n = s.hi - p0 + 1 < tile ? s.hi - p0 + 1 : tile;
        for (int64_t i = 0; i < n; ++i)
            for (int g = 0; g < per; ++g) {
                const float *qv = c->q + (s.qi * c->n_heads + s.h0 + g) * (int64_t)hd;
                sc[g * tile + i] = kv_score(c, qv, qq ? qq + g * c->q_row : NULL, p0 + i, s.kvh);
            }
        for (int g = 0; g < per; ++g) {
            float *sg = sc + g * tile, m = mx[g];
            for (int64_t i = 0; i < n; ++i) m = sg[i] > m ? sg[i] : m;
            if (m == -INFINITY) { /* nothing seen yet outweighs nothing */
                for (int64_t i = 0; i < n; ++i) sg[i] = 0.0f;
                continue;
            }
            if (m > mx[g]) { /* a new maximum: what was summed so far shrinks by e^(m_old - m_new) */
                const float d = mx[g] - m;
                const float r = d < -105.0f ? 0.0f : expf(d);
                sum[g] *= r;
                float *o = c->out + (s.qi * c->n_heads + s.h0 + g) * (int64_t)hd;
                for (int k = 0; k < hd; ++k) o[k] *= r;
                mx[g] = m;
            }
            for (int64_t i = 0; i < n; ++i) {
                const float d = sg[i] - m;
                sg[i] = d < -105.0f ? 0.0f : expf(d); /* expf is exactly 0 there; skips glibc's underflow path */
                sum[g] += sg[i];
            }
            inv[g] = one ? (float)(1.0 / sum[g]) : 1.0f;
        }
        for (int64_t i = 0; i < n; ++i)
            for (int g = 0; g < per; ++g)
                kv_axpy(c, sc[g * tile + i] * inv[g], p0 + i, s.kvh,
                        c->out + (s.qi * c->n_heads + s.h0 + g) * (int64_t)hd);
    }
    for (int g = 0; !one && g < per; ++g) {
        float *o = c->out + (s.qi * c->n_heads + s.h0 + g) * (int64_t)hd;
        const float r = sum[g] > 0.0 ? (float)(1.0 / sum[g]) : 0.0f;
        for (int k = 0; k < hd; ++k) o[k] *= r;
    }
    free(sc);
}

int qs_attention(const float *q, int64_t n_q, const int32_t *q_pos, int n_heads, int head_dim, const void *k_cache,
                 const void *v_cache, int kv_type, int n_kv_heads, int64_t n_kv, int64_t n_ctx, int64_t window,
                 float scale, float *out, int n_threads) {
    return qs_attention_softcap(q, n_q, q_pos, n_heads, head_dim, k_cache, v_cache, kv_type, n_kv_heads, n_kv, n_ctx,
                                window, scale, 0.0f, out, n_threads);
}

int qs_attention_softcap(const float *q, int64_t n_q, const int32_t *q_pos, int n_heads, int head_dim,
                         const void *k_cache, const void *v_cache, int kv_type, int n_kv_heads, int64_t n_kv,
                         int64_t n_ctx, int64_t window, float scale, float softcap, float *out, int n_threads) {
    return qs_attention_sinks(q, n_q, q_pos, n_heads, head_dim, k_cache, v_cache, kv_type, n_kv_heads, n_kv, n_ctx,
                              window, scale, softcap, NULL, out, n_threads);
}

static int attention_run(const float *q, int64_t n_q, const int32_t *q_pos, int n_heads, int head_dim,
                         const void *k_cache, const void *v_cache, int k_type, int v_type, int n_kv_heads,
                         int64_t n_kv, int64_t n_ctx, int64_t window, float scale, float softcap, const float *sinks,
                         float *out, float *probs, int n_threads) {
    if (n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads || head_dim <= 0 || head_dim > (1 << 16))
        return QS_ERR_HEADS;
    const int64_t k_row = qs_kv_row_bytes(k_type, head_dim), v_row = probs ? 0 : qs_kv_row_bytes(v_type, head_dim);
    if (k_row < 0 || v_row < 0) return QS_ERR_HEADS;
    if (n_q < 0 || n_ctx < 0 || n_kv < 0 || n_kv > n_ctx || window < 0 || n_q > INT64_MAX / n_heads) return QS_ERR_SIZE;
    if (!(softcap >= 0.0f) || !isfinite(softcap)) return QS_ERR_SIZE;
    for (int h = 0; sinks && h < n_heads; ++h)
        if (!isfinite(sinks[h])) return QS_ERR_SIZE;
    for (int64_t i = 0; i < n_q; ++i)
        if (q_pos[i] < 0) return QS_ERR_POS;
    attn_ctx c = {0};
    c.q = q, c.q_pos = q_pos, c.n_heads = n_heads, c.head_dim = head_dim, c.n_kv_heads = n_kv_heads;
    c.k_type = k_type, c.v_type = v_type, c.k_row = k_row, c.v_row = v_row;
    c.k = k_cache, c.v = v_cache, c.n_kv = n_kv, c.window = window, c.scale = scale, c.softcap = softcap;
    c.sinks = sinks, c.out = out, c.split = 1, c.probs = probs;
    c.dot_f32 = QS_PICK(FDOT_F32), c.dot_f16 = QS_PICK(FDOT_F16);
    c.axpy_f32 = QS_PICK(AXPY_F32), c.axpy_f16 = QS_PICK(AXPY_F16);
    if (k_type == QS_KV_Q8_0 || k_type == QS_KV_Q4_0) {
        c.kdot = k_type == QS_KV_Q8_0 ? QS_PICK(KDOT_Q8_0) : QS_PICK(KDOT_Q4_0);
        c.q_quantize = qs_quantize_q8_0, c.q_row = (int64_t)head_dim / 32 * 34;
    } else if (k_type == QS_KV_BF16) {
        c.kdot = QS_PICK(KDOT_BF16), c.q_quantize = qs_quantize_bf16, c.q_row = 2 * (int64_t)head_dim;
    }
    c.vaxpy = v_type == QS_KV_Q8_0 ? QS_PICK(AXPY_Q8_0) : v_type == QS_KV_Q4_0 ? QS_PICK(AXPY_Q4_0)
                                                                               : QS_PICK(AXPY_BF16);
    /* split a group's heads (only) as far as needed for two tasks per thread, or to stay within the stack arrays */
    const int G = n_heads / n_kv_heads;
    if (n_threads <= 0) n_threads = qs_threads_default();
    while (c.split < G && (G / c.split > QS_ATTN_MAX_GROUP || n_q * n_kv_heads * c.split < 2 * (int64_t)n_threads)) {
        int d = c.split + 1;
        while (G % d) ++d;
        c.split = d;
    }
    qs_parallel_for(n_q * n_kv_heads * c.split, probs ? attn_probs_task : attn_flash_task, &c, n_threads);
    return c.failed ? -2 : 0;
}

int qs_attention_sinks(const float *q, int64_t n_q, const int32_t *q_pos, int n_heads, int head_dim,
                       const void *k_cache, const void *v_cache, int kv_type, int n_kv_heads, int64_t n_kv,
                       int64_t n_ctx, int64_t window, float scale, float softcap, const float *sinks, float *out,
                       int n_threads) {
    return attention_run(q, n_q, q_pos, n_heads, head_dim, k_cache, v_cache, kv_type, kv_type, n_kv_heads, n_kv, n_ctx,
                         window, scale, softcap, sinks, out, NULL, n_threads);
}

int qs_attention_kv(const float *q, int64_t n_q, const int32_t *q_pos, int n_heads, int head_dim,
                    const void *k_cache, const void *v_cache, int k_type, int v_type, int n_kv_heads, int64_t n_kv,
                    int64_t n_ctx, int64_t window, float scale, float softcap, const float *sinks, float *out,
                    int n_threads) {
    return attention_run(q, n_q, q_pos, n_heads, head_dim, k_cache, v_cache, k_type, v_type, n_kv_heads, n_kv, n_ctx,
                         window, scale, softcap, sinks, out, NULL, n_threads);
}

int qs_attention_probs(const float *q, int64_t n_q, const int32_t *q_pos, int n_heads, int head_dim,
                       const void *k_cache, int64_t k_cache_bytes, int k_type, int n_kv_heads, int64_t n_kv,
                       int64_t n_ctx, int64_t window, float scale, float softcap, const float *sinks, float *probs,
                       int64_t probs_len, int n_threads) {
    if (n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0 || head_dim > (1 << 16)) return QS_ERR_HEADS;
    const int64_t k_row = qs_kv_row_bytes(k_type, head_dim);
    if (k_row < 0) return QS_ERR_HEADS;
    if (n_q < 0 || n_kv < 0 || n_ctx < 0 || n_ctx > INT64_MAX / n_kv_heads / head_dim / 4) return QS_ERR_SIZE;
    if (!q || !q_pos || !k_cache || !probs || k_cache_bytes < n_ctx * n_kv_heads * k_row) return QS_ERR_CACHE;
    if (n_kv && n_q > INT64_MAX / n_heads / n_kv) return QS_ERR_SIZE;
    if (probs_len < n_q * n_heads * n_kv) return QS_ERR_SIZE;
    return attention_run(q, n_q, q_pos, n_heads, head_dim, k_cache, NULL, k_type, QS_KV_F32, n_kv_heads, n_kv, n_ctx,
                         window, scale, softcap, sinks, NULL, probs, n_threads);
}

void qs_gdn_step_scalar(int64_t S, float *st, const float *k, const float *q, const float *v, float decay, float beta,
                        float *o, float *sk) {
    for (int64_t i = 0; i < S; ++i) sk[i] = 0.0f;
    for (int64_t j = 0; j < S; ++j) {
        float *r = st + j * S;
        for (int64_t i = 0; i < S; ++i) {
            r[i] *= decay;
            sk[i] = fmaf(k[j], r[i], sk[i]);
        }
    }
    for (int64_t i = 0; i < S; ++i) {
        sk[i] = (v[i] - sk[i]) * beta; /* d */
        o[i] = 0.0f;
    }
    for (int64_t j = 0; j < S; ++j) {
        float *r = st + j * S;
        for (int64_t i = 0; i < S; ++i) {
            r[i] = fmaf(k[j], sk[i], r[i]);
            o[i] = fmaf(q[j], r[i], o[i]);
        }
    }
}

int qs_gdn_step(int64_t S, float *st, const float *k, const float *q, const float *v, float decay, float beta,
                float *o) {
    if (S <= 0 || S > 1024 || !st || !k || !q || !v || !o) return QS_ERR_SIZE;
    float sk[1024];
    QS_PICK(GDN_STEP)(S, st, k, q, v, decay, beta, o, sk);
    return QS_OK;
}
