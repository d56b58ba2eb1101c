/* NEON (ARMv8.0, level 1) and dot-product (level 2) variants of the 32-element quantized kernels: the ports of
 * qs_quant_avx2.c and of the MXFP4 / NVFP4 kernels of qs_iquants_avx2.c (ggml's ARM strategy). Dot products are
 * exact in their integer parts; dequantization and the activation quantizers are bit-exact with the scalar
 * references (qs_quant.c, qs_act.c). */
#include "qs_arch.h"

#if QS_ARCH_ARM64
#include <arm_neon.h>
#include <math.h>

#include "qs.h"
#include "qs_quant_internal.h"
#include "qs_quant_neon.h"

#define AI __attribute__((always_inline)) static inline

/* binary16 -> binary32 (FCVT; exact for every non-NaN value) */
AI float h2f(const uint8_t *p) {
    __fp16 h;
    memcpy(&h, p, 2);
    return (float)h;
}

/* ---------------------------------------------------------------- integer products
 * One 32-element block of weight codes (a0: elements 0-15, a1: 16-31) times 32 int8 activations, summed into four
 * int32 lanes. ARMv8.0 has no byte dot product: SMULL / SMLAL2 put two products in each int16 lane and
 * SADALP adds the pairs into int32. Two products fit int16 while the codes stay within ±127 (every type but Q8_0,
 * whose -128 against a -128 would reach 32768: mac32_wide keeps one product per lane). */
AI int32x4_t mac32(int8x16_t a0, int8x16_t a1, const uint8_t *x) {
    const int8x16_t x0 = vld1q_s8((const int8_t *)x), x1 = vld1q_s8((const int8_t *)x + 16);
    const int16x8_t p0 = vmlal_high_s8(vmull_s8(vget_low_s8(a0), vget_low_s8(x0)), a0, x0);
    const int16x8_t p1 = vmlal_high_s8(vmull_s8(vget_low_s8(a1), vget_low_s8(x1)), a1, x1);
    return vpadalq_s16(vpaddlq_s16(p0), p1);
}

AI int32x4_t mac32_wide(int8x16_t a0, int8x16_t a1, const uint8_t *x) {
    const int8x16_t x0 = vld1q_s8((const int8_t *)x), x1 = vld1q_s8((const int8_t *)x + 16);
    int32x4_t acc = vpaddlq_s16(vmull_s8(vget_low_s8(a0), vget_low_s8(x0)));
    acc = vpadalq_s16(acc, vmull_high_s8(a0, x0));
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a1), vget_low_s8(x1)));
    return vpadalq_s16(acc, vmull_high_s8(a1, x1));
}

/* 16 codes (|c| ≤ 127) times 16 activations into four int32 lanes (NVFP4's 16-element groups) */
AI int32x4_t mac16(int8x16_t c, const uint8_t *x) {
    const int8x16_t v = vld1q_s8((const int8_t *)x);
    return vpaddlq_s16(vmlal_high_s8(vmull_s8(vget_low_s8(c), vget_low_s8(v)), c, v));
}

#if QS_HAVE_DOTPROD
/* SDOT: four byte products per int32 lane, any int8 values */
QS_TARGET_DOTPROD AI int32x4_t mac32_dot(int8x16_t a0, int8x16_t a1, const uint8_t *x) {
    const int32x4_t acc = vdotq_s32(vdupq_n_s32(0), a0, vld1q_s8((const int8_t *)x));
    return vdotq_s32(acc, a1, vld1q_s8((const int8_t *)x + 16));
}

QS_TARGET_DOTPROD AI int32x4_t mac16_dot(int8x16_t c, const uint8_t *x) {
    return vdotq_s32(vdupq_n_s32(0), c, vld1q_s8((const int8_t *)x));
}
#endif

/* ---------------------------------------------------------------- weight codes of one block, as int8 */
/* 16 bytes -> low nibbles (elements 0-15) and high nibbles (16-31) */
AI void nibbles(const uint8_t *p, uint8x16_t *lo, uint8x16_t *hi) {
    const uint8x16_t q = vld1q_u8(p);
    *lo = vandq_u8(q, vdupq_n_u8(0x0F));
    *hi = vshrq_n_u8(q, 4);
}

/* Q5's 32 high bits -> one byte per element, 0xFF where the bit is set (bit j: element j) */
AI void bits_to_bytes(const uint8_t *p, uint8x16_t *m0, uint8x16_t *m1) {
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    static const uint8_t pick[32] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                     2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
    const uint8x16_t qh = vreinterpretq_u8_u32(vdupq_n_u32(qs_load_u32(p))), b = vld1q_u8(bit);
    *m0 = vtstq_u8(vqtbl1q_u8(qh, vld1q_u8(pick)), b);
    *m1 = vtstq_u8(vqtbl1q_u8(qh, vld1q_u8(pick + 16)), b);
}

AI void codes_q4_0(const uint8_t *b, int8x16_t *c0, int8x16_t *c1) { /* q - 8 */
    uint8x16_t lo, hi;
    nibbles(b + 2, &lo, &hi);
    *c0 = vsubq_s8(vreinterpretq_s8_u8(lo), vdupq_n_s8(8));
    *c1 = vsubq_s8(vreinterpretq_s8_u8(hi), vdupq_n_s8(8));
}

AI void codes_q4_1(const uint8_t *b, int8x16_t *c0, int8x16_t *c1) { /* q, 0..15 */
    uint8x16_t lo, hi;
    nibbles(b + 4, &lo, &hi);
    *c0 = vreinterpretq_s8_u8(lo);
    *c1 = vreinterpretq_s8_u8(hi);
}

AI void codes_q5_0(const uint8_t *b, int8x16_t *c0, int8x16_t *c1) { /* q - 16: a clear high bit sets 0xF0 */
    uint8x16_t lo, hi, m0, m1;
    nibbles(b + 6, &lo, &hi);
    bits_to_bytes(b + 2, &m0, &m1);
    const uint8x16_t f0 = vdupq_n_u8(0xF0);
    *c0 = vreinterpretq_s8_u8(vorrq_u8(lo, vbicq_u8(f0, m0)));
    *c1 = vreinterpretq_s8_u8(vorrq_u8(hi, vbicq_u8(f0, m1)));
}

AI void codes_q5_1(const uint8_t *b, int8x16_t *c0, int8x16_t *c1) { /* q, 0..31 */
    uint8x16_t lo, hi, m0, m1;
    nibbles(b + 8, &lo, &hi);
    bits_to_bytes(b + 4, &m0, &m1);
    const uint8x16_t b16 = vdupq_n_u8(0x10);
    *c0 = vreinterpretq_s8_u8(vorrq_u8(lo, vandq_u8(m0, b16)));
    *c1 = vreinterpretq_s8_u8(vorrq_u8(hi, vandq_u8(m1, b16)));
}

AI void codes_q8_0(const uint8_t *b, int8x16_t *c0, int8x16_t *c1) {
    *c0 = vld1q_s8((const int8_t *)b + 2);
    *c1 = vld1q_s8((const int8_t *)b + 18);
}

AI void codes_iq4_nl(const uint8_t *b, int8x16_t *c0, int8x16_t *c1) { /* code-book values by one TBL each */
    uint8x16_t lo, hi;
    nibbles(b + 2, &lo, &hi);
    const int8x16_t book = vld1q_s8(QS_IQ4NL);
    *c0 = vqtbl1q_s8(book, lo);
    *c1 = vqtbl1q_s8(book, hi);
}

AI void codes_mxfp4(const uint8_t *b, int8x16_t *c0, int8x16_t *c1) { /* doubled E2M1 values (QS_FP4X2) */
    uint8x16_t lo, hi;
    nibbles(b + 1, &lo, &hi);
    const int8x16_t book = vld1q_s8(QS_FP4X2);
    *c0 = vqtbl1q_s8(book, lo);
    *c1 = vqtbl1q_s8(book, hi);
}

/* ---------------------------------------------------------------- dots against Q8_0 / Q8_1
 * Two blocks per step in two float accumulators: the block's four int32 lanes as floats, times d_w · d_x (ggml's
 * NEON loop). References: qs_dot_q4_0_scalar ... qs_dot_iq4_nl_scalar (qs_quant.c). */
#define DOT_Q8_0(name, sfx, ATTR, BYTES, MAC)                                                                          \
    ATTR float qs_dot_##name##_##sfx(int64_t n, const uint8_t *w, const uint8_t *x) {                                  \
        float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = acc0;                                                             \
        const int64_t nb = n / 32;                                                                                     \
        int64_t i = 0;                                                                                                 \
        int8x16_t a0, a1, b0, b1;                                                                                      \
        for (; i + 2 <= nb; i += 2, w += 2 * (BYTES), x += 68) {                                                       \
            codes_##name(w, &a0, &a1);                                                                                 \
            codes_##name(w + (BYTES), &b0, &b1);                                                                       \
            const int32x4_t s0 = MAC(a0, a1, x + 2);                                                                   \
            const int32x4_t s1 = MAC(b0, b1, x + 36);                                                                  \
            acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(s0), h2f(w) * h2f(x));                                              \
            acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(s1), h2f(w + (BYTES)) * h2f(x + 34));                               \
        }                                                                                                              \
        if (i < nb) {                                                                                                  \
            codes_##name(w, &a0, &a1);                                                                                 \
            acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(MAC(a0, a1, x + 2)), h2f(w) * h2f(x));                              \
        }                                                                                                              \
        return vaddvq_f32(vaddq_f32(acc0, acc1));                                                                      \
    }

/* Q4_1 / Q5_1 against Q8_1: as above plus Σ m_w · s_x (the activation block's d · Σ q, stored in the block) */
#define DOT_Q8_1(name, sfx, ATTR, BYTES, MAC)                                                                          \
    ATTR float qs_dot_##name##_##sfx(int64_t n, const uint8_t *w, const uint8_t *x) {                                  \
        float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = acc0;                                                             \
        float summs = 0.0f;                                                                                            \
        const int64_t nb = n / 32;                                                                                     \
        int64_t i = 0;                                                                                                 \
        int8x16_t a0, a1, b0, b1;                                                                                      \
        for (; i + 2 <= nb; i += 2, w += 2 * (BYTES), x += 72) {                                                       \
            codes_##name(w, &a0, &a1);                                                                                 \
            codes_##name(w + (BYTES), &b0, &b1);                                                                       \
            const int32x4_t s0 = MAC(a0, a1, x + 4);                                                                   \
            const int32x4_t s1 = MAC(b0, b1, x + 40);                                                                  \
            summs += h2f(w + 2) * h2f(x + 2) + h2f(w + (BYTES) + 2) * h2f(x + 38);                                     \
            acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(s0), h2f(w) * h2f(x));                                              \
            acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(s1), h2f(w + (BYTES)) * h2f(x + 36));                               \
        }                                                                                                              \
        if (i < nb) {                                                                                                  \
            codes_##name(w, &a0, &a1);                                                                                 \
            summs += h2f(w + 2) * h2f(x + 2);                                                                          \
            acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(MAC(a0, a1, x + 4)), h2f(w) * h2f(x));                              \
        }                                                                                                              \
        return vaddvq_f32(vaddq_f32(acc0, acc1)) + summs;                                                              \
    }

DOT_Q8_0(q4_0, neon, , 18, mac32)
DOT_Q8_0(q5_0, neon, , 22, mac32)
DOT_Q8_0(q8_0, neon, , 34, mac32_wide)
DOT_Q8_0(iq4_nl, neon, , 18, mac32)
DOT_Q8_1(q4_1, neon, , 20, mac32)
DOT_Q8_1(q5_1, neon, , 24, mac32)
#if QS_HAVE_DOTPROD
DOT_Q8_0(q4_0, dotprod, QS_TARGET_DOTPROD, 18, mac32_dot)
DOT_Q8_0(q5_0, dotprod, QS_TARGET_DOTPROD, 22, mac32_dot)
DOT_Q8_0(q8_0, dotprod, QS_TARGET_DOTPROD, 34, mac32_dot)
DOT_Q8_0(iq4_nl, dotprod, QS_TARGET_DOTPROD, 18, mac32_dot)
DOT_Q8_1(q4_1, dotprod, QS_TARGET_DOTPROD, 20, mac32_dot)
DOT_Q8_1(q5_1, dotprod, QS_TARGET_DOTPROD, 24, mac32_dot)
#endif

/* MXFP4 / NVFP4 x Q8_0, bit-identical to qs_dot_mxfp4_scalar / qs_dot_nvfp4_scalar (qs_iq_dot_codes_scalar): the
 * integer sums of four groups by one pairwise reduction, then the reference's fused multiply-adds in order. */
AI int32x4_t hsum4x4(int32x4_t a, int32x4_t b, int32x4_t c, int32x4_t d) { /* lane j: Σ of the j-th argument */
    return vpaddq_s32(vpaddq_s32(a, b), vpaddq_s32(c, d));
}

#define DOT_MXFP4(sfx, ATTR, MAC)                                                                                      \
    ATTR float qs_dot_mxfp4_##sfx(int64_t n, const uint8_t *w, const uint8_t *x) {                                     \
        float s = 0.0f;                                                                                                \
        const int64_t nb = n / 32;                                                                                     \
        int64_t i = 0;                                                                                                 \
        int8x16_t c0, c1;                                                                                              \
        int32x4_t p[4];                                                                                                \
        for (; i + 4 <= nb; i += 4, w += 4 * 17, x += 4 * 34) {                                                        \
            for (int j = 0; j < 4; ++j) {                                                                              \
                codes_mxfp4(w + 17 * j, &c0, &c1);                                                                     \
                p[j] = MAC(c0, c1, x + 34 * j + 2);                                                                    \
            }                                                                                                          \
            int32_t is[4];                                                                                             \
            vst1q_s32(is, hsum4x4(p[0], p[1], p[2], p[3]));                                                            \
            for (int j = 0; j < 4; ++j) s = fmaf(qs_e8m0_half(w[17 * j]) * h2f(x + 34 * j), (float)is[j], s);          \
        }                                                                                                              \
        for (; i < nb; ++i, w += 17, x += 34) {                                                                        \
            codes_mxfp4(w, &c0, &c1);                                                                                  \
            s = fmaf(qs_e8m0_half(w[0]) * h2f(x), (float)vaddvq_s32(MAC(c0, c1, x + 2)), s);                           \
        }                                                                                                              \
        return s;                                                                                                      \
    }

/* NVFP4: 64 elements per block, four 16-element groups with an E4M3 scale each (bytes 0-3); group g's codes are
 * bytes 4 + 8g .. 11 + 8g, low nibbles its elements 0-7, high nibbles 8-15; its activations the 16 of Q8_0 block
 * g / 2 from 16 · (g % 2). */
#define DOT_NVFP4(sfx, ATTR, MAC16)                                                                                    \
    ATTR float qs_dot_nvfp4_##sfx(int64_t n, const uint8_t *w, const uint8_t *x) {                                     \
        float s = 0.0f;                                                                                                \
        const int8x16_t book = vld1q_s8(QS_FP4X2);                                                                     \
        for (int64_t i = 0; i < n / 64; ++i, w += 36, x += 68) {                                                       \
            int32x4_t p[4];                                                                                            \
            for (int h = 0; h < 2; ++h) { /* groups 2h, 2h + 1 against Q8_0 block h */                                 \
                uint8x16_t lo, hi;                                                                                     \
                nibbles(w + 4 + 16 * h, &lo, &hi);                                                                     \
                const uint8x16_t g0 = vcombine_u8(vget_low_u8(lo), vget_low_u8(hi));                                   \
                const uint8x16_t g1 = vcombine_u8(vget_high_u8(lo), vget_high_u8(hi));                                 \
                p[2 * h] = MAC16(vqtbl1q_s8(book, g0), x + 34 * h + 2);                                                \
                p[2 * h + 1] = MAC16(vqtbl1q_s8(book, g1), x + 34 * h + 18);                                           \
            }                                                                                                          \
            int32_t is[4];                                                                                             \
            vst1q_s32(is, hsum4x4(p[0], p[1], p[2], p[3]));                                                            \
            const float d0 = h2f(x), d1 = h2f(x + 34);                                                                 \
            s = fmaf(qs_ue4m3_half(w[0]) * d0, (float)is[0], s);                                                       \
            s = fmaf(qs_ue4m3_half(w[1]) * d0, (float)is[1], s);                                                       \
            s = fmaf(qs_ue4m3_half(w[2]) * d1, (float)is[2], s);                                                       \
            s = fmaf(qs_ue4m3_half(w[3]) * d1, (float)is[3], s);                                                       \
        }                                                                                                              \
        return s;                                                                                                      \
    }

DOT_MXFP4(neon, , mac32)
DOT_NVFP4(neon, , mac16)
#if QS_HAVE_DOTPROD
DOT_MXFP4(dotprod, QS_TARGET_DOTPROD, mac32_dot)
DOT_NVFP4(dotprod, QS_TARGET_DOTPROD, mac16_dot)
#endif

/* ---------------------------------------------------------------- float dots (F16, BF16, F32 activations)
 * References: qs_dot_f16_scalar, qs_dot_bf16_scalar, qs_dot_f32_scalar (a float64 sum there; float FMAs in eight
 * accumulators here, as the AVX2 kernels). Loads go through bytes: the rows need no alignment. */
AI float16x8_t f16x8(const uint8_t *p) { return vreinterpretq_f16_u8(vld1q_u8(p)); }
AI float32x4_t bf16_lo(uint16x8_t v) { return vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(v), 16)); }
AI float32x4_t bf16_hi(uint16x8_t v) { return vreinterpretq_f32_u32(vshll_high_n_u16(v, 16)); }
AI uint16x8_t u16x8(const uint8_t *p) { return vreinterpretq_u16_u8(vld1q_u8(p)); }
AI float32x4_t f32x4(const uint8_t *p) { return vreinterpretq_f32_u8(vld1q_u8(p)); }

AI float sum8(const float32x4_t a[8]) {
    return vaddvq_f32(vaddq_f32(vaddq_f32(vaddq_f32(a[0], a[1]), vaddq_f32(a[2], a[3])),
                                vaddq_f32(vaddq_f32(a[4], a[5]), vaddq_f32(a[6], a[7]))));
}

float qs_dot_f16_neon(int64_t n, const uint8_t *w, const uint8_t *x) {
    float32x4_t a[8];
    for (int k = 0; k < 8; ++k) a[k] = vdupq_n_f32(0.0f);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        for (int k = 0; k < 4; ++k) {
            const float16x8_t wv = f16x8(w + 2 * i + 16 * k), xv = f16x8(x + 2 * i + 16 * k);
            a[2 * k] = vfmaq_f32(a[2 * k], vcvt_f32_f16(vget_low_f16(wv)), vcvt_f32_f16(vget_low_f16(xv)));
            a[2 * k + 1] = vfmaq_f32(a[2 * k + 1], vcvt_high_f32_f16(wv), vcvt_high_f32_f16(xv));
        }
    }
    for (; i + 4 <= n; i += 4)
        a[0] = vfmaq_f32(a[0], vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(w + 2 * i))),
                         vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(x + 2 * i))));
    float s = sum8(a);
    for (; i < n; ++i) s += h2f(w + 2 * i) * h2f(x + 2 * i);
    return s;
}

float qs_dot_bf16_neon(int64_t n, const uint8_t *w, const uint8_t *x) {
    float32x4_t a[8];
    for (int k = 0; k < 8; ++k) a[k] = vdupq_n_f32(0.0f);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        for (int k = 0; k < 4; ++k) {
            const uint16x8_t wv = u16x8(w + 2 * i + 16 * k), xv = u16x8(x + 2 * i + 16 * k);
            a[2 * k] = vfmaq_f32(a[2 * k], bf16_lo(wv), bf16_lo(xv));
            a[2 * k + 1] = vfmaq_f32(a[2 * k + 1], bf16_hi(wv), bf16_hi(xv));
        }
    }
    for (; i + 8 <= n; i += 8) {
        const uint16x8_t wv = u16x8(w + 2 * i), xv = u16x8(x + 2 * i);
        a[0] = vfmaq_f32(a[0], bf16_lo(wv), bf16_lo(xv));
        a[1] = vfmaq_f32(a[1], bf16_hi(wv), bf16_hi(xv));
    }
    float s = sum8(a);
    for (; i < n; ++i) s += qs_bf16_to_fp32(qs_load_u16(w + 2 * i)) * qs_bf16_to_fp32(qs_load_u16(x + 2 * i));
    return s;
}

/* F32 weights against the F32 activation row (qs_dot_f32_scalar; "_q": qs_dot_f32_neon is the float helper of
 * qs_nn_neon.c) */
float qs_dot_f32_neon_q(int64_t n, const uint8_t *w, const uint8_t *x) {
    float32x4_t a[8];
    for (int k = 0; k < 8; ++k) a[k] = vdupq_n_f32(0.0f);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 8; ++k) a[k] = vfmaq_f32(a[k], f32x4(w + 4 * i + 16 * k), f32x4(x + 4 * i + 16 * k));
    for (; i + 4 <= n; i += 4) a[0] = vfmaq_f32(a[0], f32x4(w + 4 * i), f32x4(x + 4 * i));
    float s = sum8(a);
    for (; i < n; ++i) s += qs_load_f32(w + 4 * i) * qs_load_f32(x + 4 * i);
    return s;
}

/* ---------------------------------------------------------------- dequantization (bit-exact: every product of a
 * code and an fp16 scale is exact in float32, so the one rounding is the reference's) */
AI void store_s8x16_scaled(int8x16_t q, float32x4_t d, float *y) {
    const int16x8_t l = vmovl_s8(vget_low_s8(q)), h = vmovl_high_s8(q);
    vst1q_f32(y, vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(l))), d));
    vst1q_f32(y + 4, vmulq_f32(vcvtq_f32_s32(vmovl_high_s16(l)), d));
    vst1q_f32(y + 8, vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(h))), d));
    vst1q_f32(y + 12, vmulq_f32(vcvtq_f32_s32(vmovl_high_s16(h)), d));
}

AI void store_u8x16_fma(uint8x16_t q, float32x4_t d, float32x4_t m, float *y) { /* y = q·d + m */
    const uint16x8_t l = vmovl_u8(vget_low_u8(q)), h = vmovl_high_u8(q);
    vst1q_f32(y, vfmaq_f32(m, vcvtq_f32_u32(vmovl_u16(vget_low_u16(l))), d));
    vst1q_f32(y + 4, vfmaq_f32(m, vcvtq_f32_u32(vmovl_high_u16(l)), d));
    vst1q_f32(y + 8, vfmaq_f32(m, vcvtq_f32_u32(vmovl_u16(vget_low_u16(h))), d));
    vst1q_f32(y + 12, vfmaq_f32(m, vcvtq_f32_u32(vmovl_high_u16(h)), d));
}

/* reference: qs_deq_q8_0 */
void qs_deq_q8_0_neon(const uint8_t *b, float *y) {
    const float32x4_t d = vdupq_n_f32(qs_fp16_to_fp32(qs_load_u16(b)));
    int8x16_t c0, c1;
    codes_q8_0(b, &c0, &c1);
    store_s8x16_scaled(c0, d, y);
    store_s8x16_scaled(c1, d, y + 16);
}

/* reference: qs_deq_q5_0 */
void qs_deq_q5_0_neon(const uint8_t *b, float *y) {
    const float32x4_t d = vdupq_n_f32(qs_fp16_to_fp32(qs_load_u16(b)));
    int8x16_t c0, c1;
    codes_q5_0(b, &c0, &c1);
    store_s8x16_scaled(c0, d, y);
    store_s8x16_scaled(c1, d, y + 16);
}

/* reference: qs_deq_q4_1 (q · d exact, so the fused multiply-add rounds as the reference's multiply then add) */
void qs_deq_q4_1_neon(const uint8_t *b, float *y) {
    const float32x4_t d = vdupq_n_f32(qs_fp16_to_fp32(qs_load_u16(b)));
    const float32x4_t m = vdupq_n_f32(qs_fp16_to_fp32(qs_load_u16(b + 2)));
    uint8x16_t lo, hi;
    nibbles(b + 4, &lo, &hi);
    store_u8x16_fma(lo, d, m, y);
    store_u8x16_fma(hi, d, m, y + 16);
}

/* n binary16 values -> binary32 (reference: qs_fp16_to_fp32). FCVTL is exact but quiets signalling NaNs, so a group
 * of 8 holding a NaN is redone by the scalar conversion, which keeps every payload bit. */
void qs_f16_row_neon(const uint8_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    const uint16x8_t absm = vdupq_n_u16(0x7FFF), inf = vdupq_n_u16(0x7C00);
    for (; i + 8 <= n; i += 8) {
        const uint16x8_t h = u16x8(src + 2 * i);
        if (vmaxvq_u16(vcgtq_u16(vandq_u16(h, absm), inf))) {
            for (int k = 0; k < 8; ++k) dst[i + k] = qs_fp16_to_fp32(qs_load_u16(src + 2 * (i + k)));
            continue;
        }
        const float16x8_t f = vreinterpretq_f16_u16(h);
        vst1q_f32(dst + i, vcvt_f32_f16(vget_low_f16(f)));
        vst1q_f32(dst + i + 4, vcvt_high_f32_f16(f));
    }
    for (; i < n; ++i) dst[i] = qs_fp16_to_fp32(qs_load_u16(src + 2 * i));
}

/* n bfloat16 values -> binary32 (reference: qs_bf16_to_fp32): a 16-bit left shift, exact */
void qs_bf16_row_neon(const uint8_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const uint16x8_t v = u16x8(src + 2 * i);
        vst1q_f32(dst + i, bf16_lo(v));
        vst1q_f32(dst + i + 4, bf16_hi(v));
    }
    for (; i < n; ++i) dst[i] = qs_bf16_to_fp32(qs_load_u16(src + 2 * i));
}

/* ---------------------------------------------------------------- activation quantizers, bit-identical to the
 * scalar loops of qs_act.c */
/* four vectors of int32 -> 16 bytes, truncated as the reference's (int8_t) casts */
AI int8x16_t narrow16(int32x4_t a, int32x4_t b, int32x4_t c, int32x4_t d) {
    const int16x8_t ab = vcombine_s16(vmovn_s32(a), vmovn_s32(b)), cd = vcombine_s16(vmovn_s32(c), vmovn_s32(d));
    return vcombine_s8(vmovn_s16(ab), vmovn_s16(cd));
}

/* one 32-element block (q8_block32 in qs_act.c): amax by FMAXNM (fmaxf's NaN rule), d = amax / 127, codes by
 * FCVTAS (round half away from zero, as roundf, saturating as the scalar conversion does); returns Σ codes */
static int q8_block32_neon(const float *v, int8_t *o, float *d_out) {
    float32x4_t a[8];
    float32x4_t m = vdupq_n_f32(0.0f);
    for (int j = 0; j < 8; ++j) {
        a[j] = vld1q_f32(v + 4 * j);
        m = vmaxnmq_f32(m, vabsq_f32(a[j]));
    }
    const float amax = vmaxnmvq_f32(m);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int32x4_t q[8];
    for (int j = 0; j < 8; ++j) q[j] = vcvtaq_s32_f32(vmulq_n_f32(a[j], id));
    const int8x16_t q0 = narrow16(q[0], q[1], q[2], q[3]), q1 = narrow16(q[4], q[5], q[6], q[7]);
    vst1q_s8(o, q0);
    vst1q_s8(o + 16, q1);
    *d_out = d;
    return vaddlvq_s16(vaddq_s16(vpaddlq_s8(q0), vpaddlq_s8(q1)));
}

/* reference: the scalar loop of qs_quantize_q8_0 */
void qs_quantize_q8_0_neon(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t i = 0; i < n / 32; ++i) {
        uint8_t *o = dst + 34 * i;
        float d;
        q8_block32_neon(x + 32 * i, (int8_t *)(o + 2), &d);
        const uint16_t dh = qs_fp32_to_fp16(d);
        memcpy(o, &dh, 2);
    }
}

/* reference: the scalar loop of qs_quantize_q8_1 */
void qs_quantize_q8_1_neon(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t i = 0; i < n / 32; ++i) {
        uint8_t *o = dst + 36 * i;
        float d;
        const int sum = q8_block32_neon(x + 32 * i, (int8_t *)(o + 4), &d);
        const uint16_t dh = qs_fp32_to_fp16(d), sh = qs_fp32_to_fp16((float)sum * d);
        memcpy(o, &dh, 2);
        memcpy(o + 2, &sh, 2);
    }
}

/* reference: the scalar loop of qs_quantize_q8_K. The signed max is the first element of greatest magnitude (NaNs
 * never win: FMAXNM); codes by ggml's nearest_int, replicated on the bits (x·iscale rounded to float, plus 1.5·2^23,
 * mantissa bits minus 2^22; ties to even), clamped above at 127 only; bsums of the stored bytes. */
void qs_quantize_q8_K_neon(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t i = 0; i < n / 256; ++i) {
        const float *v = x + 256 * i;
        uint8_t *o = dst + 292 * i;
        float32x4_t m0 = vdupq_n_f32(0.0f), m1 = m0;
        for (int j = 0; j < 256; j += 8) {
            m0 = vmaxnmq_f32(m0, vabsq_f32(vld1q_f32(v + j)));
            m1 = vmaxnmq_f32(m1, vabsq_f32(vld1q_f32(v + j + 4)));
        }
        const float amax = vmaxnmvq_f32(vmaxnmq_f32(m0, m1));
        if (amax == 0.0f) {
            memset(o, 0, 292);
            continue;
        }
        float max = 0.0f;
        const float32x4_t va = vdupq_n_f32(amax);
        for (int j = 0; j < 256; j += 4) {
            if (!vmaxvq_u32(vceqq_f32(vabsq_f32(vld1q_f32(v + j)), va))) continue;
            int k = j;
            while (fabsf(v[k]) != amax) ++k;
            max = v[k];
            break;
        }
        const float iscale = -127.0f / max;
        const float32x4_t is = vdupq_n_f32(iscale), magic = vdupq_n_f32(12582912.0f);
        const int32x4_t mant = vdupq_n_s32(0x007FFFFF), half = vdupq_n_s32(0x00400000), lim = vdupq_n_s32(127);
        for (int j = 0; j < 256; j += 16) {
            int32x4_t q[4];
            for (int t = 0; t < 4; ++t) {
                float32x4_t p = vmulq_f32(vld1q_f32(v + j + 4 * t), is);
                __asm__("" : "+w"(p)); /* the product is rounded before the add: no fused multiply-add */
                const int32x4_t bits = vreinterpretq_s32_f32(vaddq_f32(p, magic));
                q[t] = vminq_s32(vsubq_s32(vandq_s32(bits, mant), half), lim);
            }
            const int8x16_t q8 = narrow16(q[0], q[1], q[2], q[3]);
            vst1q_s8((int8_t *)(o + 4 + j), q8);
            const int16_t bs = vaddlvq_s8(q8);
            memcpy(o + 260 + j / 8, &bs, 2);
        }
        const float d = 1.0f / iscale;
        memcpy(o, &d, 4);
    }
}

#endif
