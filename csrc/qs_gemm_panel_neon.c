/* Prefill GEMM weight-row decoders (qs_gemm.h), ARM64 NEON (level 1, ARMv8.0): Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and
 * Q6_K rows into the common code / lane-scale / group-min form. Each qs_gemm_panel_<t>_neon is bit-identical to its
 * scalar reference qs_gemm_panel_<t>_scalar (qs_gemm_panel.c): the same codes, the same float products in the same
 * order (no contraction: qs_arch.h), the padding zeroed by the same qs_gemm_zero_tail. The AVX2 decoders
 * (qs_gemm_avx2.c) are the x86 counterparts. */
#include "qs_arch.h"
#if QS_ARCH_ARM64
#include <arm_neon.h>
#include <string.h>

#include "qs.h"
#include "qs_gemm.h"
#include "qs_nn_neon.h"
#include "qs_quant_internal.h"

/* A block's fp16 scale as the scalar h2f reads it: one FCVT (exact), except for Inf/NaN, where the reference's
 * qs_fp16_to_fp32 keeps a signalling NaN signalling (FCVT would quiet it). */
static inline float f16_exact(const uint8_t *p) {
    const uint16_t h = qs_load_u16(p);
    if (__builtin_expect((h & 0x7C00u) == 0x7C00u, 0)) return qs_fp16_to_fp32(h);
    __fp16 x;
    memcpy(&x, &h, 2);
    return (float)x;
}

/* 16 bytes -> 32 codes: low nibbles (elements 0..15), then high nibbles (16..31) */
static inline void nibbles_32(const uint8_t *p, uint8_t *c) {
    const uint8x16_t t = vld1q_u8(p);
    vst1q_u8(c, vandq_u8(t, vdupq_n_u8(0x0F)));
    vst1q_u8(c + 16, vshrq_n_u8(t, 4));
}

/* One 32-element block's 8 lane scales, all s */
static inline void set_lanes8(float *ws, float s) {
    const float32x4_t v = vdupq_n_f32(s);
    vst1q_f32(ws, v);
    vst1q_f32(ws + 4, v);
}

/* Reference: qs_gemm_panel_q4_0_scalar. c = q, s = d, m = 8d. */
void qs_gemm_panel_q4_0_neon(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
    for (int64_t b = 0; b < d->k / 32; ++b, w += 18) {
        nibbles_32(w + 2, c + 32 * b);
        const float s = f16_exact(w);
        set_lanes8(ws + 8 * b, s);
        mrow[b] = 8.0f * s;
    }
    qs_gemm_zero_tail(d, c, ws, mrow);
}

/* Reference: qs_gemm_panel_q4_1_scalar. c = q, s = d, m = -min. */
void qs_gemm_panel_q4_1_neon(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
    for (int64_t b = 0; b < d->k / 32; ++b, w += 20) {
        nibbles_32(w + 4, c + 32 * b);
        set_lanes8(ws + 8 * b, f16_exact(w));
        mrow[b] = -f16_exact(w + 2);
    }
    qs_gemm_zero_tail(d, c, ws, mrow);
}

/* Reference: qs_gemm_panel_q5_0_scalar. c = low nibble | bit j of qh << 4, s = d, m = 16d. The 32 high bits are
 * spread to bytes (TBL: byte j takes qh's byte j/8), tested against each byte's bit j%8 (CMTST) and inserted
 * above the nibble (SLI). */
void qs_gemm_panel_q5_0_neon(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
    static const uint8_t pick_lo[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
    static const uint8_t pick_hi[16] = {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
    static const uint8_t bits[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t plo = vld1q_u8(pick_lo), phi = vld1q_u8(pick_hi), bit = vld1q_u8(bits), one = vdupq_n_u8(1);
    for (int64_t b = 0; b < d->k / 32; ++b, w += 22) {
        const uint8x16_t qh = vreinterpretq_u8_u32(vdupq_n_u32(qs_load_u32(w + 2)));
        const uint8x16_t h0 = vandq_u8(vtstq_u8(vqtbl1q_u8(qh, plo), bit), one); /* 0 or 1 per element */
        const uint8x16_t h1 = vandq_u8(vtstq_u8(vqtbl1q_u8(qh, phi), bit), one);
        const uint8x16_t t = vld1q_u8(w + 6);
        vst1q_u8(c + 32 * b, vsliq_n_u8(t, h0, 4));                 /* (h0 << 4) | (t & 15) */
        vst1q_u8(c + 32 * b + 16, vsliq_n_u8(vshrq_n_u8(t, 4), h1, 4));
        const float s = f16_exact(w);
        set_lanes8(ws + 8 * b, s);
        mrow[b] = 16.0f * s;
    }
    qs_gemm_zero_tail(d, c, ws, mrow);
}

/* Reference: qs_gemm_panel_q8_0_scalar. c = q + 128 (the sign bit flipped), s = d, m = 128d. */
void qs_gemm_panel_q8_0_neon(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
    const uint8x16_t flip = vdupq_n_u8(0x80);
    for (int64_t b = 0; b < d->k / 32; ++b, w += 34) {
        vst1q_u8(c + 32 * b, veorq_u8(vld1q_u8(w + 2), flip));
        vst1q_u8(c + 32 * b + 16, veorq_u8(vld1q_u8(w + 18), flip));
        const float s = f16_exact(w);
        set_lanes8(ws + 8 * b, s);
        mrow[b] = 128.0f * s;
    }
    qs_gemm_zero_tail(d, c, ws, mrow);
}

/* Reference: qs_gemm_panel_q4_K_scalar. Per 256-element super-block: 8 groups of 32 with s = d*sc (8 lanes each)
 * and m = dmin*mn; codes = the low nibbles of each 32 bytes, then their high nibbles. The 6-bit scales and mins
 * widen exactly to float; each product is the scalar's one multiplication. */
void qs_gemm_panel_q4_K_neon(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    for (int64_t i = 0; i < d->k / 256; ++i, w += 144) {
        uint32_t u[4];
        k4_scales_mins(w + 4, u); /* bytes: sc0..7, m0..7 */
        const uint8x16_t sm = vld1q_u8((const uint8_t *)u);
        const uint16x8_t sc16 = vmovl_u8(vget_low_u8(sm)), mn16 = vmovl_u8(vget_high_u8(sm));
        const float dd = f16_exact(w), dm = f16_exact(w + 2);
        const float32x4_t s0 = vmulq_n_f32(vcvtq_f32_u32(vmovl_u16(vget_low_u16(sc16))), dd);
        const float32x4_t s1 = vmulq_n_f32(vcvtq_f32_u32(vmovl_u16(vget_high_u16(sc16))), dd);
        float *wsb = ws + 64 * i;
#define QS_LANES8(g, v, l)                                                                                         \
    do {                                                                                                           \
        const float32x4_t r = vdupq_laneq_f32(v, l);                                                               \
        vst1q_f32(wsb + 8 * (g), r);                                                                               \
        vst1q_f32(wsb + 8 * (g) + 4, r);                                                                           \
    } while (0)
        QS_LANES8(0, s0, 0);
        QS_LANES8(1, s0, 1);
        QS_LANES8(2, s0, 2);
        QS_LANES8(3, s0, 3);
        QS_LANES8(4, s1, 0);
        QS_LANES8(5, s1, 1);
        QS_LANES8(6, s1, 2);
        QS_LANES8(7, s1, 3);
#undef QS_LANES8
        vst1q_f32(mrow + 8 * i, vmulq_n_f32(vcvtq_f32_u32(vmovl_u16(vget_low_u16(mn16))), dm));
        vst1q_f32(mrow + 8 * i + 4, vmulq_n_f32(vcvtq_f32_u32(vmovl_u16(vget_high_u16(mn16))), dm));
        for (int q = 0; q < 4; ++q) {
            const uint8x16_t b0 = vld1q_u8(w + 16 + 32 * q), b1 = vld1q_u8(w + 32 + 32 * q);
            uint8_t *o = c + 256 * i + 64 * q;
            vst1q_u8(o, vandq_u8(b0, m4));
            vst1q_u8(o + 16, vandq_u8(b1, m4));
            vst1q_u8(o + 32, vshrq_n_u8(b0, 4));
            vst1q_u8(o + 48, vshrq_n_u8(b1, 4));
        }
    }
    qs_gemm_zero_tail(d, c, ws, mrow);
}

/* Q6_K: half h's 32 bytes of high bits and 64 of low nibbles -> 128 six-bit codes, element order 32j + l
 * (SLI puts the 2 high bits above each nibble) */
static inline void q6k_half(const uint8_t *ql, const uint8_t *qh, uint8_t *o) {
    const uint8x16_t m2 = vdupq_n_u8(3);
    for (int p = 0; p < 2; ++p) { /* bytes l = 16p .. 16p + 15 */
        const uint8x16_t h = vld1q_u8(qh + 16 * p), l0 = vld1q_u8(ql + 16 * p), l1 = vld1q_u8(ql + 32 + 16 * p);
        vst1q_u8(o + 16 * p, vsliq_n_u8(l0, vandq_u8(h, m2), 4));
        vst1q_u8(o + 32 + 16 * p, vsliq_n_u8(l1, vandq_u8(vshrq_n_u8(h, 2), m2), 4));
        vst1q_u8(o + 64 + 16 * p, vsliq_n_u8(vshrq_n_u8(l0, 4), vandq_u8(vshrq_n_u8(h, 4), m2), 4));
        vst1q_u8(o + 96 + 16 * p, vsliq_n_u8(vshrq_n_u8(l1, 4), vshrq_n_u8(h, 6), 4));
    }
}

/* Reference: qs_gemm_panel_q6_K_scalar. 16 groups of 16 with s = d*sc (int8 scales, widened exactly) over 4
 * lanes each, m = 32*s. */
void qs_gemm_panel_q6_K_neon(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
    for (int64_t i = 0; i < d->k / 256; ++i, w += 210) {
        const float dd = f16_exact(w + 208);
        const int8x16_t sc = vld1q_s8((const int8_t *)(w + 192));
        const int16x8_t lo = vmovl_s8(vget_low_s8(sc)), hi = vmovl_s8(vget_high_s8(sc));
        float32x4_t s[4];
        s[0] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), dd);
        s[1] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo))), dd);
        s[2] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), dd);
        s[3] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi))), dd);
        float *wsb = ws + 64 * i;
        for (int q = 0; q < 4; ++q) {
            vst1q_f32(wsb + 16 * q, vdupq_laneq_f32(s[q], 0));
            vst1q_f32(wsb + 16 * q + 4, vdupq_laneq_f32(s[q], 1));
            vst1q_f32(wsb + 16 * q + 8, vdupq_laneq_f32(s[q], 2));
            vst1q_f32(wsb + 16 * q + 12, vdupq_laneq_f32(s[q], 3));
            vst1q_f32(mrow + 16 * i + 4 * q, vmulq_n_f32(s[q], 32.0f)); /* the scalar's 32.0f * s */
        }
        q6k_half(w, w + 128, c + 256 * i);
        q6k_half(w + 64, w + 160, c + 256 * i + 128);
    }
    qs_gemm_zero_tail(d, c, ws, mrow);
}

#endif /* QS_ARCH_ARM64 */
