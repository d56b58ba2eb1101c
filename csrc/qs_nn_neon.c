/* NEON (ARMv8.0, ISA level 1) variants of the float kernels: the ports of qs_nn_simd.c (AVX2). ARMv8.0 has fused
 * multiply-add, vector division and half <-> single conversion, so every AVX2 kernel maps one to one. */
#include "qs_arch.h"

#if QS_ARCH_ARM64
#include <arm_neon.h>
#include <math.h>

#include "qs.h"
#include "qs_nn_internal.h"
#include "qs_nn_neon.h"

/* 4 halves (little-endian uint16) -> 4 floats, exact (FCVTL). */
static inline float32x4_t f16x4(const uint16_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }

/* Reference: the f32 loop of kv_dot (qs_nn.c). 16 floats per step in 4 accumulators, then the tail. */
float qs_dot_f32_neon(const float *a, const float *b, int n) {
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = vfmaq_f32(acc0, vld1q_f32(a + i), vld1q_f32(b + i));
        acc1 = vfmaq_f32(acc1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
        acc2 = vfmaq_f32(acc2, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
        acc3 = vfmaq_f32(acc3, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
    }
    for (; i + 4 <= n; i += 4) acc0 = vfmaq_f32(acc0, vld1q_f32(a + i), vld1q_f32(b + i));
    float s = vaddvq_f32(vaddq_f32(vaddq_f32(acc0, acc1), vaddq_f32(acc2, acc3)));
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

/* Reference: the f16 loop of kv_dot (qs_nn.c). */
float qs_dot_f32_f16_neon(const float *a, const uint16_t *b, int n) {
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = vfmaq_f32(acc0, vld1q_f32(a + i), f16x4(b + i));
        acc1 = vfmaq_f32(acc1, vld1q_f32(a + i + 4), f16x4(b + i + 4));
        acc2 = vfmaq_f32(acc2, vld1q_f32(a + i + 8), f16x4(b + i + 8));
        acc3 = vfmaq_f32(acc3, vld1q_f32(a + i + 12), f16x4(b + i + 12));
    }
    for (; i + 4 <= n; i += 4) acc0 = vfmaq_f32(acc0, vld1q_f32(a + i), f16x4(b + i));
    float s = vaddvq_f32(vaddq_f32(vaddq_f32(acc0, acc1), vaddq_f32(acc2, acc3)));
    for (; i < n; ++i) s += a[i] * qs_fp16_to_fp32(b[i]);
    return s;
}

/* Reference: the f32 loop of kv_axpy (qs_nn.c): y += a x. */
void qs_axpy_f32_neon(float a, const float *x, float *y, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vld1q_f32(x + i), a));
        vst1q_f32(y + i + 4, vfmaq_n_f32(vld1q_f32(y + i + 4), vld1q_f32(x + i + 4), a));
    }
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vld1q_f32(x + i), a));
    for (; i < n; ++i) y[i] += a * x[i];
}

/* Reference: the f16 loop of kv_axpy (qs_nn.c). */
void qs_axpy_f16_neon(float a, const uint16_t *x, float *y, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(x + i));
        vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vcvt_f32_f16(vget_low_f16(h)), a));
        vst1q_f32(y + i + 4, vfmaq_n_f32(vld1q_f32(y + i + 4), vcvt_high_f32_f16(h), a));
    }
    for (; i < n; ++i) y[i] += a * qs_fp16_to_fp32(x[i]);
}

/* Reference: qs_axpy_q8_0_scalar, y += a * (d * q). */
void qs_axpy_q8_0_neon(float a, const uint8_t *x, float *y, int n) {
    for (int b = 0; b < n / 32; ++b, x += 34, y += 32) {
        const float d = qs_fp16_to_fp32(qs_load_u16(x));
        for (int j = 0; j < 32; j += 8) {
            const int16x8_t q = vmovl_s8(vld1_s8((const int8_t *)(x + 2 + j)));
            const float32x4_t v0 = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(q))), d);
            const float32x4_t v1 = vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(q)), d);
            vst1q_f32(y + j, vfmaq_n_f32(vld1q_f32(y + j), v0, a));
            vst1q_f32(y + j + 4, vfmaq_n_f32(vld1q_f32(y + j + 4), v1, a));
        }
    }
}

/* Reference: qs_axpy_q4_0_scalar: low nibbles are elements 0..15, high nibbles 16..31, each minus 8. */
void qs_axpy_q4_0_neon(float a, const uint8_t *x, float *y, int n) {
    for (int b = 0; b < n / 32; ++b, x += 18, y += 32) {
        const float d = qs_fp16_to_fp32(qs_load_u16(x));
        const uint8x16_t raw = vld1q_u8(x + 2);
        const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(15))), vdupq_n_s8(8));
        const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(raw, 4)), vdupq_n_s8(8));
        const int16x8_t part[4] = {vmovl_s8(vget_low_s8(lo)), vmovl_high_s8(lo), vmovl_s8(vget_low_s8(hi)),
                                   vmovl_high_s8(hi)};
        for (int j = 0; j < 4; ++j) {
            const float32x4_t v0 = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(part[j]))), d);
            const float32x4_t v1 = vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(part[j])), d);
            vst1q_f32(y + 8 * j, vfmaq_n_f32(vld1q_f32(y + 8 * j), v0, a));
            vst1q_f32(y + 8 * j + 4, vfmaq_n_f32(vld1q_f32(y + 8 * j + 4), v1, a));
        }
    }
}

/* Reference: qs_axpy_bf16_scalar (bf16 -> f32 is exact: the bits shifted up). */
void qs_axpy_bf16_neon(float a, const uint8_t *x, float *y, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t v = vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)(x + 2 * i)), 16));
        vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), v, a));
    }
    for (; i < n; ++i) y[i] += a * qs_bf16_to_fp32(qs_load_u16(x + 2 * i));
}

/* Reference: qs_rmsnorm_scalar. The squares are exact in double, as in the scalar loop; only the order of their
 * double additions differs (4 lanes). The scale and the products are computed exactly as the scalar does. */
void qs_rmsnorm_neon(const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps) {
    for (int64_t r = 0; r < n_rows; ++r) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        float64x2_t acc0 = vdupq_n_f64(0.0), acc1 = acc0;
        int64_t i = 0;
        for (; i + 4 <= n; i += 4) {
            const float32x4_t v = vld1q_f32(xr + i);
            const float64x2_t lo = vcvt_f64_f32(vget_low_f32(v)), hi = vcvt_high_f64_f32(v);
            acc0 = vfmaq_f64(acc0, lo, lo);
            acc1 = vfmaq_f64(acc1, hi, hi);
        }
        double ss = vaddvq_f64(vaddq_f64(acc0, acc1));
        for (; i < n; ++i) ss += (double)xr[i] * xr[i];
        const float scale = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
        i = 0;
        if (w) {
            for (; i + 4 <= n; i += 4)
                vst1q_f32(yr + i, vmulq_f32(vmulq_n_f32(vld1q_f32(xr + i), scale), vld1q_f32(w + i)));
            for (; i < n; ++i) yr[i] = xr[i] * scale * w[i];
        } else {
            for (; i + 4 <= n; i += 4) vst1q_f32(yr + i, vmulq_n_f32(vld1q_f32(xr + i), scale));
            for (; i < n; ++i) yr[i] = xr[i] * scale;
        }
    }
}

/* exp(x) for 4 floats, exp256 of qs_nn_simd.c step for step (the same bits): Cody-Waite range reduction
 * x = n*ln2 + r, degree-6 polynomial for e^r (|r| <= ln2/2), scaled by 2^n through the exponent bits; inputs clamped
 * to [-87.3, 88.7] (relative error ~2e-7). */
static inline float32x4_t exp_f32x4(float32x4_t x) {
    x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-87.3f)), vdupq_n_f32(88.7f));
    const float32x4_t n = vrndnq_f32(vmulq_n_f32(x, 1.44269504088896341f)); /* to nearest, ties to even */
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
    p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), p, vmulq_f32(r, r));
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23); /* n is integral */
    return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

/* Reference: qs_swiglu_scalar: out = gate * sigmoid(gate) * up. */
void qs_swiglu_neon(const float *gate, const float *up, float *out, int64_t n) {
    const float32x4_t one = vdupq_n_f32(1.0f);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t g = vld1q_f32(gate + i);
        const float32x4_t s = vdivq_f32(g, vaddq_f32(one, exp_f32x4(vnegq_f32(g))));
        vst1q_f32(out + i, vmulq_f32(s, vld1q_f32(up + i)));
    }
    for (; i < n; ++i) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

/* Reference: qs_geglu_tanh_scalar: out = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * up. */
void qs_geglu_tanh_neon(const float *gate, const float *up, float *out, int64_t n) {
    const float32x4_t one = vdupq_n_f32(1.0f), two = vdupq_n_f32(2.0f);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t g = vld1q_f32(gate + i);
        const float32x4_t y =
            vmulq_n_f32(vfmaq_f32(g, vmulq_n_f32(g, 0.044715f), vmulq_f32(g, g)), 0.7978845608028654f);
        /* tanh(y) = 1 - 2 / (exp(2y) + 1), exact limits at +-inf through the clamp in exp_f32x4 */
        const float32x4_t t = vsubq_f32(one, vdivq_f32(two, vaddq_f32(exp_f32x4(vmulq_f32(two, y)), one)));
        const float32x4_t v = vmulq_f32(vmulq_n_f32(g, 0.5f), vaddq_f32(one, t));
        vst1q_f32(out + i, vmulq_f32(v, vld1q_f32(up + i)));
    }
    const float ks = 0.7978845608028654f;
    for (; i < n; ++i) {
        const float g = gate[i];
        out[i] = 0.5f * g * (1.0f + tanhf(ks * (g + 0.044715f * g * g * g))) * up[i];
    }
}

/* Reference: qs_gdn_step_scalar, the same bits: per value lane i the same multiplies and fused multiply-adds over
 * the key index j in the same order, 4 lanes at a time (FMLA rounds once, as fmaf does). */
void qs_gdn_step_neon(int64_t S, float *st, const float *k, const float *q, const float *v, float decay, float beta,
                      float *o, float *sk) {
    const int64_t S4 = S & ~(int64_t)3;
    for (int64_t i = 0; i < S; ++i) sk[i] = 0.0f;
    /* st *= decay; sk = st^T k */
    for (int64_t j = 0; j < S; ++j) {
        float *r = st + j * S;
        const float kj = k[j];
        int64_t i = 0;
        for (; i < S4; i += 4) {
            const float32x4_t x = vmulq_n_f32(vld1q_f32(r + i), decay);
            vst1q_f32(r + i, x);
            vst1q_f32(sk + i, vfmaq_n_f32(vld1q_f32(sk + i), x, kj));
        }
        for (; i < S; ++i) {
            r[i] *= decay;
            sk[i] = fmaf(kj, r[i], sk[i]);
        }
    }
    /* d = beta (v - sk) */
    for (int64_t i = 0; i < S; ++i) {
        sk[i] = (v[i] - sk[i]) * beta;
        o[i] = 0.0f;
    }
    /* st += k d^T; o = st^T q */
    for (int64_t j = 0; j < S; ++j) {
        float *r = st + j * S;
        const float kj = k[j], qj = q[j];
        int64_t i = 0;
        for (; i < S4; i += 4) {
            const float32x4_t x = vfmaq_n_f32(vld1q_f32(r + i), vld1q_f32(sk + i), kj);
            vst1q_f32(r + i, x);
            vst1q_f32(o + i, vfmaq_n_f32(vld1q_f32(o + i), x, qj));
        }
        for (; i < S; ++i) {
            r[i] = fmaf(kj, sk[i], r[i]);
            o[i] = fmaf(qj, r[i], o[i]);
        }
    }
}
#endif
