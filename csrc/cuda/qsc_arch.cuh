/* The per-element math of the dense architecture features, as __host__ __device__ functions: the device kernels
 * (qsc_kernels.cuh) call them, and the host build (qsc_host.cu, qsc_host_* entry points) runs the very same source
 * on the CPU, where tests/test_cuda_features.py checks it against the CPU block (csrc/qs_nn.c, qs_block.c).
 * Each function states the CPU formula it follows; the arithmetic (double where the CPU uses double, the order of
 * the float operations) is the CPU's. */
#pragma once

#include <cuda_runtime.h>
#include <math.h>

#ifndef HD
#define HD __host__ __device__ __forceinline__
#endif

/* The device's head sizes: any the CPU block takes (qs_block_forward: at most 1024). */
#define QSC_MAX_HEAD 1024

/* One layer's RoPE as the device applies it (the description's qs_rope_desc with 0 -> 1 for freq_scale and
 * mscale already resolved): ggml_rope_ext's angle, see qs_rope_ext. factors: NULL or dim/2 divisors. */
struct RopeP {
    int skip, dim, neox;
    float base, freq_scale, ext_factor, corr0, corr1, mscale;
    const float *factors;
};

/* YaRN's ramp between the correction dimensions (pair i): 1 below corr0, 0 above corr1 (qs_nn.c's yarn_ramp; the
 * numerator is a float difference there as here). */
HD double rope_yarn_ramp(float corr0, float corr1, int i) {
    double y = (i - corr0) / fmax(0.001, (double)corr1 - corr0);
    return 1.0 - fmin(1.0, fmax(0.0, y));
}

/* cos and sin (times the magnitude) of pair i at position p: inv = base^(-2i/dim) / factors[i]; theta =
 * freq_scale * p * inv, with YaRN (ext_factor != 0) mixing p * inv back in by ramp(i) * ext_factor and the
 * magnitude mscale * (1 + 0.1 ln(1 / freq_scale)); all in double, rounded to float at the end (qs_rope_scalar). */
HD void rope_cs(const RopeP &r, int p, int i, float *c, float *s) {
    double inv = pow((double)r.base, -2.0 * i / r.dim);
    if (r.factors) inv /= (double)r.factors[i];
    double mscale = r.mscale;
    if (r.ext_factor != 0.0f) mscale *= 1.0 + 0.1 * log(1.0 / r.freq_scale);
    const double extrap = (double)p * inv;
    double theta = r.freq_scale * extrap;
    if (r.ext_factor != 0.0f) {
        const double mix = rope_yarn_ramp(r.corr0, r.corr1, i) * r.ext_factor;
        theta = theta * (1.0 - mix) + extrap * mix;
    }
    *c = (float)(cos(theta) * mscale);
    *s = (float)(sin(theta) * mscale);
}

/* The rotation of one pair (a, b) of a head by (c, s). */
HD void rope_pair(float *v, int ia, int ib, float c, float s) {
    const float x0 = v[ia], x1 = v[ib];
    v[ia] = x0 * c - x1 * s;
    v[ib] = x0 * s + x1 * c;
}

/* The element indices of pair i: adjacent (2i, 2i+1), or NeoX halves (i, i + dim/2). */
HD int rope_ia(const RopeP &r, int i) { return r.neox ? i : 2 * i; }
HD int rope_ib(const RopeP &r, int i) { return r.neox ? i + r.dim / 2 : 2 * i + 1; }

/* Llama 4 / Ministral 3 query temperature at position p: 1 + scale * ln(floor(p / floor) + 1), in double. */
HD float temp_factor(int p, float scale, long long floor_) {
    return (float)(log(floor((double)p / (double)floor_) + 1.0) * scale + 1.0);
}

/* An attention score: dot * scale, soft-capped (gemma2: cap * tanh(s / cap); cap 0: none). */
HD float attn_score(float dot, float scale, float softcap) {
    const float s = dot * scale;
    return softcap > 0.0f ? softcap * tanhf(s / softcap) : s;
}

/* One key of an online softmax: running max m and sum l; returns the new key's weight p, and *alpha the factor the
 * accumulated values are rescaled by (the first key: exp(-inf) = 0). */
HD float softmax_step(float &m, float &l, float s, float *alpha) {
    const float mn = fmaxf(m, s);
    *alpha = expf(m - mn);
    const float p = expf(s - mn);
    l = l * *alpha + p;
    m = mn;
    return p;
}

/* The gated FFN unit of element (g, u): 0 SwiGLU g sigmoid(g) u, 1 GELU-tanh(g) u, 2 gpt-oss's clamped SwiGLU
 * (qs_swiglu_oai: g = min(g, 7), u = clamp(u, -7, 7), g sigmoid(1.702 g) (u + 1)). */
enum { GLU_SILU = 0, GLU_GELU = 1, GLU_OAI = 2 };
HD float glu_unit(float g, float u, int mode) {
    if (mode == GLU_GELU) {
        const float kA = 0.7978845608028654f; /* sqrt(2/pi) */
        return 0.5f * g * (1.0f + tanhf(kA * (g + 0.044715f * g * g * g))) * u;
    }
    if (mode == GLU_OAI) {
        const float gg = g < 7.0f ? g : 7.0f;
        const float uu = u < -7.0f ? -7.0f : u > 7.0f ? 7.0f : u;
        return gg / (1.0f + expf(-1.702f * gg)) * (uu + 1.0f);
    }
    return g / (1.0f + expf(-g)) * u;
}

/* A final logit: divided by granite's logit_scale (1: none), then soft-capped (gemma2: tanh(x / cap) * cap; 0:
 * none), as the CPU session's head. */
HD float logit_post(float x, float logit_scale, float cap) {
    if (logit_scale != 1.0f) x = x / logit_scale;
    return cap != 0.0f ? tanhf(x / cap) * cap : x;
}

/* The residual update of one element: x + rs * o (o already post-normed), then times the layer's output scale. */
HD float residual_add(float x, float o, float rs, float out_scale) { return (x + o * rs) * out_scale; }

/* ------------------------------------------------------------------------------------------------------------------
 * What the kernels of one layer read beyond their buffers (qsc_kernels.cuh; their host twins in qsc_emul.cuh). */

/* The previous branch's output as the next norm kernel adds it to the residual stream (o NULL: nothing to add):
 * x = (x + rs * [RMSNorm](o) * post_w) * out_scale, post_w NULL: o as it is (the CPU block's post norm, residual
 * scale and layer output scale, in its order). */
struct ResidIn {
    const float *o, *post_w;
    float post_eps, rs, out_scale;
};

/* What k_qk_post does to one token's q and k, per layer. q_norm / k_norm: RMSNorm weights of q and k (each NULL:
 * none; the CPU block has both or neither, or q's alone on a layer reading another's cache), per head (head_dim)
 * or, with qk_full, over the whole projection (olmo2). */
struct QKArgs {
    int H, KV, hd, qk_full;
    const float *q_norm, *k_norm;
    float eps;
    RopeP rope;
    float temp_scale;
    long long temp_floor;
    int v_norm; /* gemma4: V RMS-normalized per head (no weight) before it is stored */
};

/* What one attention launch reads beyond q, positions and the cache. */
struct AttnArgs {
    int H, KV, hd, window;
    float scale, softcap;
    const float *sinks;
};
