/* Float kernels of the inference engine: RMSNorm, RoPE, softmax, gated activations, attention.
 * Scalar reference implementations; the SIMD variants (x86: qs_nn_simd.c, ARM64: qs_nn_neon.c) are picked from
 * the per-ISA slots below (qs_slots.h). */
#include "qs.h"

#include <math.h>
#include <stdlib.h>

#include "qs_nn_internal.h"
#include "qs_nn_neon.h"
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
typedef struct {
    const float *q;
    const int32_t *q_pos;
    int n_heads, head_dim, n_kv_heads, kv_f16;
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
} attn_ctx;

#define QS_ATTN_MAX_GROUP 64

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

static float kv_dot(const attn_ctx *c, const float *qv, int64_t p, int kvh) {
    int64_t base = (p * c->n_kv_heads + kvh) * (int64_t)c->head_dim;
    if (c->kv_f16) return c->dot_f16(qv, (const uint16_t *)c->k + base, c->head_dim);
    return c->dot_f32(qv, (const float *)c->k + base, c->head_dim);
}

static void kv_axpy(const attn_ctx *c, float a, int64_t p, int kvh, float *acc) {
    int64_t base = (p * c->n_kv_heads + kvh) * (int64_t)c->head_dim;
    if (c->kv_f16) c->axpy_f16(a, (const uint16_t *)c->v + base, acc, c->head_dim);
    else c->axpy_f32(a, (const float *)c->v + base, acc, c->head_dim);
}

/* One task: query qi and `per` of the query heads that share KV head kvh (grouped-query attention), so each K and
 * V row is read once for all of them while it is in L1. Per head the arithmetic is exactly the per-head loop:
 * scores, max, exp and sum in position order, then the weighted V rows. */
static void attn_task(void *vctx, int64_t task) {
    attn_ctx *c = (attn_ctx *)vctx;
    const int G = c->n_heads / c->n_kv_heads, per = G / c->split;
    const int64_t qi = task / (c->n_kv_heads * (int64_t)c->split);
    const int rest = (int)(task % (c->n_kv_heads * (int64_t)c->split));
    const int kvh = rest / c->split, h0 = kvh * G + (rest % c->split) * per;
    const int64_t qp = c->q_pos[qi];
    const int64_t hi = qp < c->n_kv - 1 ? qp : c->n_kv - 1; /* causal: keys 0..qp */
    int64_t lo = 0;
    if (c->window > 0 && qp - c->window + 1 > lo) lo = qp - c->window + 1;
    for (int g = 0; g < per; ++g) {
        if (c->probs) {
            float *pr = c->probs + (qi * c->n_heads + h0 + g) * c->n_kv;
            for (int64_t p = 0; p < c->n_kv; ++p) pr[p] = 0.0f;
            continue;
        }
        float *o = c->out + (qi * c->n_heads + h0 + g) * (int64_t)c->head_dim;
        for (int d = 0; d < c->head_dim; ++d) o[d] = 0.0f;
    }
    if (hi < lo) return;
    const int64_t n = hi - lo + 1;
    float *sc = (float *)malloc((size_t)n * (size_t)per * sizeof(float));
    if (!sc) { c->failed = 1; return; }
    float mx[QS_ATTN_MAX_GROUP], inv[QS_ATTN_MAX_GROUP];
    for (int g = 0; g < per; ++g) mx[g] = c->sinks ? c->sinks[h0 + g] : -INFINITY;
    for (int64_t p = lo; p <= hi; ++p)
        for (int g = 0; g < per; ++g) {
            const float *qv = c->q + (qi * c->n_heads + h0 + g) * (int64_t)c->head_dim;
            float s = kv_dot(c, qv, p, kvh) * c->scale;
            if (c->softcap > 0.0f) s = c->softcap * tanhf(s / c->softcap); /* gemma2's logit soft-capping */
            sc[g * n + p - lo] = s;
            mx[g] = s > mx[g] ? s : mx[g];
        }
    for (int g = 0; g < per; ++g) {
        double sum = c->sinks ? (double)expf(c->sinks[h0 + g] - mx[g]) : 0.0; /* a sink: mass without a value */
        float *sg = sc + g * n;
        for (int64_t i = 0; i < n; ++i) {
            const float d = sg[i] - mx[g];
            sg[i] = d < -105.0f ? 0.0f : expf(d); /* expf is exactly 0 there; skips glibc's underflow path */
            sum += sg[i];
        }
        inv[g] = (float)(1.0 / sum);
    }
    if (c->probs) { /* the probe: the very weights the V rows would get */
        for (int g = 0; g < per; ++g) {
            float *pr = c->probs + (qi * c->n_heads + h0 + g) * c->n_kv;
            for (int64_t p = lo; p <= hi; ++p) pr[p] = sc[g * n + p - lo] * inv[g];
        }
        free(sc);
        return;
    }
    for (int64_t p = lo; p <= hi; ++p)
        for (int g = 0; g < per; ++g) {
            float *o = c->out + (qi * c->n_heads + h0 + g) * (int64_t)c->head_dim;
            kv_axpy(c, sc[g * n + p - lo] * inv[g], p, kvh, o);
        }
    free(sc);
}

int qs_attention(const float *q, int64_t n_q, const int32_t *q_pos, int n_heads, int head_dim, const void *k_cache,
                 const void *v_cache, int kv_f16, int n_kv_heads, int64_t n_kv, int64_t n_ctx, int64_t window,
                 float scale, float *out, int n_threads) {
    return qs_attention_softcap(q, n_q, q_pos, n_heads, head_dim, k_cache, v_cache, kv_f16, n_kv_heads, n_kv, n_ctx,
                                window, scale, 0.0f, out, n_threads);
}

int qs_attention_softcap(const float *q, int64_t n_q, const int32_t *q_pos, int n_heads, int head_dim,
                         const void *k_cache, const void *v_cache, int kv_f16, int n_kv_heads, int64_t n_kv,
                         int64_t n_ctx, int64_t window, float scale, float softcap, float *out, int n_threads) {
    return qs_attention_sinks(q, n_q, q_pos, n_heads, head_dim, k_cache, v_cache, kv_f16, n_kv_heads, n_kv, n_ctx,
                              window, scale, softcap, NULL, out, n_threads);
}

static int attention_run(const float *q, int64_t n_q, const int32_t *q_pos, int n_heads, int head_dim,
                         const void *k_cache, const void *v_cache, int kv_f16, int n_kv_heads, int64_t n_kv,
                         int64_t n_ctx, int64_t window, float scale, float softcap, const float *sinks, float *out,
                         float *probs, int n_threads) {
    if (n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads || head_dim <= 0 || head_dim > (1 << 16))
        return QS_ERR_HEADS;
    if (n_q < 0 || n_ctx < 0 || n_kv < 0 || n_kv > n_ctx || window < 0 || n_q > INT64_MAX / n_heads) return QS_ERR_SIZE;
    if (!(softcap >= 0.0f) || !isfinite(softcap)) return QS_ERR_SIZE;
    for (int h = 0; sinks && h < n_heads; ++h)
        if (!isfinite(sinks[h])) return QS_ERR_SIZE;
    for (int64_t i = 0; i < n_q; ++i)
        if (q_pos[i] < 0) return QS_ERR_POS;
    attn_ctx c = {q,      q_pos, n_heads, head_dim, n_kv_heads, kv_f16, k_cache, v_cache, n_kv, window, scale,
                  softcap, sinks, out,   0,       1,          probs, QS_PICK(FDOT_F32), QS_PICK(FDOT_F16),
                  QS_PICK(AXPY_F32), QS_PICK(AXPY_F16)};
    /* split a group's heads (only) as far as needed for two tasks per thread, or to stay within the stack arrays */
    const int G = n_heads / n_kv_heads;
    if (n_threads <= 0) n_threads = qs_threads_default();
    while (c.split < G && (G / c.split > QS_ATTN_MAX_GROUP || n_q * n_kv_heads * c.split < 2 * (int64_t)n_threads)) {
        int d = c.split + 1;
        while (G % d) ++d;
        c.split = d;
    }
    qs_parallel_for(n_q * n_kv_heads * c.split, attn_task, &c, n_threads);
    return c.failed ? -2 : 0;
}

int qs_attention_sinks(const float *q, int64_t n_q, const int32_t *q_pos, int n_heads, int head_dim,
                       const void *k_cache, const void *v_cache, int kv_f16, int n_kv_heads, int64_t n_kv,
                       int64_t n_ctx, int64_t window, float scale, float softcap, const float *sinks, float *out,
                       int n_threads) {
    return attention_run(q, n_q, q_pos, n_heads, head_dim, k_cache, v_cache, kv_f16, n_kv_heads, n_kv, n_ctx, window,
                         scale, softcap, sinks, out, NULL, n_threads);
}

int qs_attention_probs(const float *q, int64_t n_q, const int32_t *q_pos, int n_heads, int head_dim,
                       const void *k_cache, int64_t k_cache_bytes, int kv_f16, int n_kv_heads, int64_t n_kv,
                       int64_t n_ctx, int64_t window, float scale, float softcap, const float *sinks, float *probs,
                       int64_t probs_len, int n_threads) {
    if (n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0 || head_dim > (1 << 16)) return QS_ERR_HEADS;
    if (n_q < 0 || n_kv < 0 || n_ctx < 0 || n_ctx > INT64_MAX / n_kv_heads / head_dim / 4) return QS_ERR_SIZE;
    if (!q || !q_pos || !k_cache || !probs || k_cache_bytes < n_ctx * n_kv_heads * (int64_t)head_dim * (kv_f16 ? 2 : 4))
        return QS_ERR_CACHE;
    if (n_kv && n_q > INT64_MAX / n_heads / n_kv) return QS_ERR_SIZE;
    if (probs_len < n_q * n_heads * n_kv) return QS_ERR_SIZE;
    return attention_run(q, n_q, q_pos, n_heads, head_dim, k_cache, NULL, kv_f16, n_kv_heads, n_kv, n_ctx, window,
                         scale, softcap, sinks, NULL, probs, n_threads);
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
