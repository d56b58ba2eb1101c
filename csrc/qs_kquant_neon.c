/* ARM64 NEON kernels of the k-quants (Q2_K..Q6_K), IQ4_XS and the ternary types (TQ1_0, TQ2_0): dot products
 * against Q8_K activations and the Q4_K / Q6_K dequantizations (docs/quant-formats.md; the AVX2 forms are in
 * qs_quant_avx2.c and qs_iquants_avx2.c).
 *
 * Every dot product decodes one 128-element half of a weight block at a time into eight int8x16 vectors of codes in
 * element order (the <type>_codes helpers, shared by both levels), multiplies them with the activations into int32
 * sums per 16- or 32-element group (the kq_sums* primitives, one per level: level 1 widens with SMULL/SMLAL2 and
 * adds pairwise with SADALP, level 2 uses SDOT), and weights the group sums with the block's integer scales. Codes
 * stored with an offset (Q3_K's + 4, Q6_K's + 32, the ternary types' + 1) are multiplied unshifted and the offset is
 * taken off through Q8_K's sums of 16 (bsums), as the AVX2 kernels do. The integer sums are exact, and each block's
 * float work is the scalar reference's expression, so the results differ from the reference at most by how the
 * compiler fuses those few float operations (the TQ types' fmaf chain is the reference's own: the same bits).
 *
 * Q8_K block (292 bytes): float d, 256 int8 codes, 16 int16 sums of 16 codes. */
#include "qs_arch.h"
#if QS_ARCH_ARM64
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "qs.h"
#include "qs_kquant_neon.h"
#include "qs_quant_internal.h"

#define KQ_AI __attribute__((always_inline)) static inline

KQ_AI float kq_f16(const uint8_t *p) { /* exact, one FCVT */
    __fp16 h;
    memcpy(&h, p, 2);
    return (float)h;
}

KQ_AI int16x8_t kq_bsums(const uint8_t *x, int half) { /* Q8_K's sums of groups 8·half .. 8·half + 7 */
    return vreinterpretq_s16_u8(vld1q_u8(x + 260 + 16 * half));
}

KQ_AI int8x16_t kq_s8(uint8x16_t v) { return vreinterpretq_s8_u8(v); }

/* lane k = the lane sum of p_k: four group sums in one vector */
KQ_AI int32x4_t kq_sum4(int32x4_t p0, int32x4_t p1, int32x4_t p2, int32x4_t p3) {
    return vpaddq_s32(vpaddq_s32(p0, p1), vpaddq_s32(p2, p3));
}

/* 16 int8 scales as four int32x4 (groups 0-3, 4-7, 8-11, 12-15) */
KQ_AI void kq_widen16(int8x16_t sc, int32x4_t out[4]) {
    const int16x8_t lo = vmovl_s8(vget_low_s8(sc)), hi = vmovl_high_s8(sc);
    out[0] = vmovl_s16(vget_low_s16(lo));
    out[1] = vmovl_high_s16(lo);
    out[2] = vmovl_s16(vget_low_s16(hi));
    out[3] = vmovl_high_s16(hi);
}

/* Σ_g sc_g · bsum_g over the 16 groups (int8 scales, int16 sums: exact in int32) */
KQ_AI int32_t kq_scaled_bsums(int8x16_t sc, const uint8_t *x) {
    const int16x8_t lo = vmovl_s8(vget_low_s8(sc)), hi = vmovl_high_s8(sc);
    const int16x8_t b0 = kq_bsums(x, 0), b1 = kq_bsums(x, 1);
    int32x4_t a = vmull_s16(vget_low_s16(lo), vget_low_s16(b0));
    a = vmlal_high_s16(a, lo, b0);
    a = vmlal_s16(a, vget_low_s16(hi), vget_low_s16(b1));
    return vaddvq_s32(vmlal_high_s16(a, hi, b1));
}

/* ---------------------------------------------------------------- the two levels' integer primitives
 * c: eight code vectors (128 elements in order), q: the matching 128 activation codes.
 * kq_sums16: the eight 16-element group sums, groups 0-3 in out[0], 4-7 in out[1] (lane k = group k);
 * kq_sums32: the four 32-element group sums, lane k = group k;
 * kq_sum128: all 128 products in the lanes of one vector (small codes: 0..3 times int8). */

/* Level 1: SMULL + SMLAL2 give 8 int16 sums of two products, SADDLP/SADALP widen them. No weight code here is
 * -128 (IQ4_XS's book is -127..113, the others are unsigned and small), so a pair is at most 2 · 127 · 128 < 2^15. */
KQ_AI int16x8_t kq_mul16_neon(int8x16_t a, int8x16_t b) {
    return vmlal_high_s8(vmull_s8(vget_low_s8(a), vget_low_s8(b)), a, b);
}

KQ_AI void kq_sums16_neon(const int8x16_t c[8], const int8_t *q, int32x4_t out[2]) {
    int32x4_t p[8];
    _Pragma("GCC unroll 8")
    for (int k = 0; k < 8; ++k) p[k] = vpaddlq_s16(kq_mul16_neon(c[k], vld1q_s8(q + 16 * k)));
    out[0] = kq_sum4(p[0], p[1], p[2], p[3]);
    out[1] = kq_sum4(p[4], p[5], p[6], p[7]);
}

KQ_AI int32x4_t kq_sums32_neon(const int8x16_t c[8], const int8_t *q) {
    int32x4_t p[4];
    _Pragma("GCC unroll 4")
    for (int k = 0; k < 4; ++k)
        p[k] = vpadalq_s16(vpaddlq_s16(kq_mul16_neon(c[2 * k], vld1q_s8(q + 32 * k))),
                           kq_mul16_neon(c[2 * k + 1], vld1q_s8(q + 32 * k + 16)));
    return kq_sum4(p[0], p[1], p[2], p[3]);
}

/* codes 0..3: 8 products of at most 3 · 128 per int16 lane stay far below 2^15 */
KQ_AI int32x4_t kq_sum128_neon(const int8x16_t c[8], const int8_t *q) {
    int16x8_t a = vdupq_n_s16(0), b = vdupq_n_s16(0);
    _Pragma("GCC unroll 8")
    for (int k = 0; k < 8; ++k) {
        const int8x16_t v = vld1q_s8(q + 16 * k);
        a = vmlal_s8(a, vget_low_s8(c[k]), vget_low_s8(v));
        b = vmlal_high_s8(b, c[k], v);
    }
    return vpadalq_s16(vpaddlq_s16(a), b);
}

#if QS_HAVE_DOTPROD
#define KQ_DP QS_TARGET_DOTPROD
/* Level 2: one SDOT per 16 elements */
KQ_DP KQ_AI void kq_sums16_dotprod(const int8x16_t c[8], const int8_t *q, int32x4_t out[2]) {
    int32x4_t p[8];
    _Pragma("GCC unroll 8")
    for (int k = 0; k < 8; ++k) p[k] = vdotq_s32(vdupq_n_s32(0), c[k], vld1q_s8(q + 16 * k));
    out[0] = kq_sum4(p[0], p[1], p[2], p[3]);
    out[1] = kq_sum4(p[4], p[5], p[6], p[7]);
}

KQ_DP KQ_AI int32x4_t kq_sums32_dotprod(const int8x16_t c[8], const int8_t *q) {
    int32x4_t p[4];
    _Pragma("GCC unroll 4")
    for (int k = 0; k < 4; ++k)
        p[k] = vdotq_s32(vdotq_s32(vdupq_n_s32(0), c[2 * k], vld1q_s8(q + 32 * k)), c[2 * k + 1],
                         vld1q_s8(q + 32 * k + 16));
    return kq_sum4(p[0], p[1], p[2], p[3]);
}

KQ_DP KQ_AI int32x4_t kq_sum128_dotprod(const int8x16_t c[8], const int8_t *q) {
    int32x4_t a = vdupq_n_s32(0), b = vdupq_n_s32(0); /* two chains */
    _Pragma("GCC unroll 4")
    for (int k = 0; k < 8; k += 2) {
        a = vdotq_s32(a, c[k], vld1q_s8(q + 16 * k));
        b = vdotq_s32(b, c[k + 1], vld1q_s8(q + 16 * k + 16));
    }
    return vaddq_s32(a, b);
}
#endif

/* A dot kernel at both levels: BODY(L) is the loop body of one block, written with kq_sums*_##L */
#define KQ_DOT_NEON(name, wbytes, BODY)                                                                           \
    float qs_dot_##name##_neon(int64_t n, const uint8_t *w, const uint8_t *x) {                                    \
        float s = 0.0f;                                                                                            \
        for (int64_t i = 0; i < n / 256; ++i, w += (wbytes), x += 292) BODY(neon)                                  \
        return s;                                                                                                  \
    }
#if QS_HAVE_DOTPROD
#define KQ_DOT_DOTPROD(name, wbytes, BODY)                                                                        \
    KQ_DP float qs_dot_##name##_dotprod(int64_t n, const uint8_t *w, const uint8_t *x) {                           \
        float s = 0.0f;                                                                                            \
        for (int64_t i = 0; i < n / 256; ++i, w += (wbytes), x += 292) BODY(dotprod)                               \
        return s;                                                                                                  \
    }
#else
#define KQ_DOT_DOTPROD(name, wbytes, BODY)
#endif
#define KQ_DOT(name, wbytes, BODY) KQ_DOT_NEON(name, wbytes, BODY) KQ_DOT_DOTPROD(name, wbytes, BODY)

/* ---------------------------------------------------------------- Q2_K (qs_dot_q2_K_scalar)
 * 84 bytes: 16 scale bytes (low nibble scale, high nibble min per 16 elements), 64 bytes of 2-bit codes, d, dmin.
 * Element 128h + 32j + l is bits 2j..2j+1 of byte 16 + 32h + l. */
KQ_AI void q2k_codes(const uint8_t *qs, int8x16_t c[8]) { /* qs: the half's 32 code bytes */
    const uint8x16_t m3 = vdupq_n_u8(3);
    uint8x16_t q0 = vld1q_u8(qs), q1 = vld1q_u8(qs + 16);
    _Pragma("GCC unroll 4")
    for (int j = 0; j < 4; ++j) {
        c[2 * j] = kq_s8(vandq_u8(q0, m3));
        c[2 * j + 1] = kq_s8(vandq_u8(q1, m3));
        q0 = vshrq_n_u8(q0, 2);
        q1 = vshrq_n_u8(q1, 2);
    }
}

#define Q2K_BLOCK(L)                                                                                               \
    {                                                                                                              \
        const uint8x16_t sm = vld1q_u8(w);                                                                         \
        int32x4_t sc[4], g[4];                                                                                     \
        kq_widen16(kq_s8(vandq_u8(sm, vdupq_n_u8(15))), sc);                                                       \
        const int32_t summs = kq_scaled_bsums(kq_s8(vshrq_n_u8(sm, 4)), x); /* the mins against the bsums */       \
        int8x16_t c[8];                                                                                            \
        q2k_codes(w + 16, c);                                                                                      \
        kq_sums16_##L(c, (const int8_t *)(x + 4), g);                                                              \
        q2k_codes(w + 48, c);                                                                                      \
        kq_sums16_##L(c, (const int8_t *)(x + 132), g + 2);                                                        \
        const int32x4_t a = vmlaq_s32(vmulq_s32(g[0], sc[0]), g[1], sc[1]);                                        \
        const int32_t isum = vaddvq_s32(vmlaq_s32(vmlaq_s32(a, g[2], sc[2]), g[3], sc[3]));                        \
        const float dx = qs_load_f32(x);                                                                           \
        s += dx * kq_f16(w + 80) * (float)isum - dx * kq_f16(w + 82) * (float)summs;                               \
    }
KQ_DOT(q2_K, 84, Q2K_BLOCK)

/* ---------------------------------------------------------------- Q3_K (qs_dot_q3_K_scalar)
 * 110 bytes: 32 bytes of high bits (hmask), 64 bytes of 2-bit codes, 12 bytes of 6-bit scales, d. Element
 * 128h + 32j + l: code bits from byte 32 + 32h + l as Q2_K, bit 2 = bit 4h + j of hmask byte l; value code - 4. */

/* the 16 scales - 32 (qs_q3k_scales): low 4 bits from bytes 0-7 (low nibbles: scales 0-7, high: 8-15), high 2 bits
 * from bytes 8-11 (bits 2k..2k+1 of byte 8 + b belong to scale 4k + b) */
KQ_AI int8x16_t q3k_scales(const uint8_t *s) {
    static const int32_t shifts[4] = {0, -2, -4, -6};
    const uint8x8_t l8 = vld1_u8(s);
    const uint8x16_t lo = vcombine_u8(vand_u8(l8, vdup_n_u8(15)), vshr_n_u8(l8, 4));
    const uint32x4_t h = vshlq_u32(vdupq_n_u32(qs_load_u32(s + 8)), vld1q_s32(shifts));
    const uint8x16_t hi = vandq_u8(vreinterpretq_u8_u32(h), vdupq_n_u8(3));
    return vsubq_s8(kq_s8(vorrq_u8(lo, vshlq_n_u8(hi, 4))), vdupq_n_s8(32));
}

/* hm: the two hmask vectors, shifted right by one per 32 elements (so bit 0 is the next row's high bit) */
KQ_AI void q3k_codes(const uint8_t *qs, uint8x16_t hm[2], int8x16_t c[8]) {
    const uint8x16_t m3 = vdupq_n_u8(3), b2 = vdupq_n_u8(4);
    uint8x16_t q0 = vld1q_u8(qs), q1 = vld1q_u8(qs + 16);
    _Pragma("GCC unroll 4")
    for (int j = 0; j < 4; ++j) {
        c[2 * j] = kq_s8(vorrq_u8(vandq_u8(q0, m3), vandq_u8(vshlq_n_u8(hm[0], 2), b2)));
        c[2 * j + 1] = kq_s8(vorrq_u8(vandq_u8(q1, m3), vandq_u8(vshlq_n_u8(hm[1], 2), b2)));
        q0 = vshrq_n_u8(q0, 2);
        q1 = vshrq_n_u8(q1, 2);
        hm[0] = vshrq_n_u8(hm[0], 1);
        hm[1] = vshrq_n_u8(hm[1], 1);
    }
}

#define Q3K_BLOCK(L)                                                                                               \
    {                                                                                                              \
        const int8x16_t sc8 = q3k_scales(w + 96);                                                                  \
        int32x4_t sc[4], g[4];                                                                                     \
        kq_widen16(sc8, sc);                                                                                       \
        uint8x16_t hm[2] = {vld1q_u8(w), vld1q_u8(w + 16)};                                                        \
        int8x16_t c[8];                                                                                            \
        q3k_codes(w + 32, hm, c);                                                                                  \
        kq_sums16_##L(c, (const int8_t *)(x + 4), g);                                                              \
        q3k_codes(w + 64, hm, c);                                                                                  \
        kq_sums16_##L(c, (const int8_t *)(x + 132), g + 2);                                                        \
        const int32x4_t a = vmlaq_s32(vmulq_s32(g[0], sc[0]), g[1], sc[1]);                                        \
        /* codes are stored + 4: Σ sc · (p − 4 · bsum) */                                                          \
        const int32_t isum = vaddvq_s32(vmlaq_s32(vmlaq_s32(a, g[2], sc[2]), g[3], sc[3])) -                       \
                             4 * kq_scaled_bsums(sc8, x);                                                          \
        s += qs_load_f32(x) * kq_f16(w + 108) * (float)isum;                                                       \
    }
KQ_DOT(q3_K, 110, Q3K_BLOCK)

/* ---------------------------------------------------------------- Q4_K / Q5_K (qs_dot_q4_K_scalar, _q5_K_)
 * Q4_K, 144 bytes: d, dmin, 12 bytes of 6-bit scales and mins (8 each), 128 bytes of nibbles: element 64c + l is
 * the low nibble of byte 16 + 32c + l, element 64c + 32 + l its high nibble. Q5_K (176 bytes) adds 32 bytes of
 * high bits after the scales: bit 2c of byte l for element 64c + l, bit 2c + 1 for 64c + 32 + l. */

/* 12 bytes -> bytes 0-7 the eight 6-bit scales, bytes 8-15 the eight 6-bit mins (ggml's masks, as
 * k4_scales_mins of the x86 kernels) */
KQ_AI uint8x16_t kq_k4_scales_mins(const uint8_t *s) {
    const uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
    const uint32_t u0 = qs_load_u32(s), u1 = qs_load_u32(s + 4), u2 = qs_load_u32(s + 8);
    const uint64_t sc = (u0 & k1) | (uint64_t)((u2 & k2) | (((u0 >> 6) & k3) << 4)) << 32;
    const uint64_t mn = (u1 & k1) | (uint64_t)(((u2 >> 4) & k2) | (((u1 >> 6) & k3) << 4)) << 32;
    return vcombine_u8(vcreate_u8(sc), vcreate_u8(mn));
}

/* the eight scales (two int32x4: groups 0-3, 4-7) and Σ_j min_j · (bsum_2j + bsum_2j+1), exact in int32 */
KQ_AI int32_t k4_scales_and_min_sum(const uint8_t *s, const uint8_t *x, int32x4_t sc[2]) {
    const uint8x16_t v = kq_k4_scales_mins(s);
    const int16x8_t s16 = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(v)));
    const int16x8_t m16 = vreinterpretq_s16_u16(vmovl_high_u8(v));
    sc[0] = vmovl_s16(vget_low_s16(s16));
    sc[1] = vmovl_high_s16(s16);
    const int32x4_t b0 = vpaddlq_s16(kq_bsums(x, 0)), b1 = vpaddlq_s16(kq_bsums(x, 1)); /* sums of 32 */
    return vaddvq_s32(vmlaq_s32(vmulq_s32(b0, vmovl_s16(vget_low_s16(m16))), b1, vmovl_high_s16(m16)));
}

KQ_AI void q4k_codes(const uint8_t *qs, int8x16_t c[8]) { /* qs: the half's 64 nibble bytes */
    const uint8x16_t m4 = vdupq_n_u8(15);
    _Pragma("GCC unroll 2")
    for (int k = 0; k < 2; ++k) {
        const uint8x16_t a = vld1q_u8(qs + 32 * k), b = vld1q_u8(qs + 32 * k + 16);
        c[4 * k] = kq_s8(vandq_u8(a, m4));
        c[4 * k + 1] = kq_s8(vandq_u8(b, m4));
        c[4 * k + 2] = kq_s8(vshrq_n_u8(a, 4));
        c[4 * k + 3] = kq_s8(vshrq_n_u8(b, 4));
    }
}

/* hb: the two high-bit vectors, shifted right by two per 64 elements (bit 0: low nibbles' bit 4, bit 1: high's) */
KQ_AI void q5k_codes(const uint8_t *qs, uint8x16_t hb[2], int8x16_t c[8]) {
    const uint8x16_t one = vdupq_n_u8(1), two = vdupq_n_u8(2);
    _Pragma("GCC unroll 2")
    for (int k = 0; k < 2; ++k) {
        const uint8x16_t a = vld1q_u8(qs + 32 * k), b = vld1q_u8(qs + 32 * k + 16);
        c[4 * k] = kq_s8(vsliq_n_u8(a, vandq_u8(hb[0], one), 4)); /* (a & 15) | bit << 4 */
        c[4 * k + 1] = kq_s8(vsliq_n_u8(b, vandq_u8(hb[1], one), 4));
        c[4 * k + 2] = kq_s8(vsriq_n_u8(vshlq_n_u8(vandq_u8(hb[0], two), 3), a, 4)); /* a >> 4 | bit << 4 */
        c[4 * k + 3] = kq_s8(vsriq_n_u8(vshlq_n_u8(vandq_u8(hb[1], two), 3), b, 4));
        hb[0] = vshrq_n_u8(hb[0], 2);
        hb[1] = vshrq_n_u8(hb[1], 2);
    }
}

#define K4_BLOCK_END                                                                                               \
    const int32_t sumi = vaddvq_s32(vmlaq_s32(vmulq_s32(g0, sc[0]), g1, sc[1]));                                   \
    const float d8 = qs_load_f32(x);                                                                               \
    s += kq_f16(w) * d8 * (float)sumi - kq_f16(w + 2) * d8 * (float)msum;

#define Q4K_BLOCK(L)                                                                                               \
    {                                                                                                              \
        int32x4_t sc[2];                                                                                           \
        const int32_t msum = k4_scales_and_min_sum(w + 4, x, sc);                                                  \
        int8x16_t c[8];                                                                                            \
        q4k_codes(w + 16, c);                                                                                      \
        const int32x4_t g0 = kq_sums32_##L(c, (const int8_t *)(x + 4));                                            \
        q4k_codes(w + 80, c);                                                                                      \
        const int32x4_t g1 = kq_sums32_##L(c, (const int8_t *)(x + 132));                                          \
        K4_BLOCK_END                                                                                               \
    }
KQ_DOT(q4_K, 144, Q4K_BLOCK)

#define Q5K_BLOCK(L)                                                                                               \
    {                                                                                                              \
        int32x4_t sc[2];                                                                                           \
        const int32_t msum = k4_scales_and_min_sum(w + 4, x, sc);                                                  \
        uint8x16_t hb[2] = {vld1q_u8(w + 16), vld1q_u8(w + 32)};                                                   \
        int8x16_t c[8];                                                                                            \
        q5k_codes(w + 48, hb, c);                                                                                  \
        const int32x4_t g0 = kq_sums32_##L(c, (const int8_t *)(x + 4));                                            \
        q5k_codes(w + 112, hb, c);                                                                                 \
        const int32x4_t g1 = kq_sums32_##L(c, (const int8_t *)(x + 132));                                          \
        K4_BLOCK_END                                                                                               \
    }
KQ_DOT(q5_K, 176, Q5K_BLOCK)

/* ---------------------------------------------------------------- Q6_K (qs_dot_q6_K_scalar)
 * 210 bytes: 128 bytes of low nibbles (ql), 64 bytes of 2-bit high parts (qh), 16 int8 scales (one per 16), d.
 * Half h, l < 32: elements 128h + l, + 32, + 64, + 96 take ql[64h + l] low, ql[64h + 32 + l] low, ql[64h + l] high,
 * ql[64h + 32 + l] high nibbles, with bits 0-1, 2-3, 4-5, 6-7 of qh[32h + l] as bits 4-5; value code - 32. */
KQ_AI void q6k_codes(const uint8_t *b, int h, int8x16_t c[8]) { /* codes 0..63 */
    const uint8x16_t m3 = vdupq_n_u8(3), m30 = vdupq_n_u8(0x30);
    const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
    _Pragma("GCC unroll 2")
    for (int k = 0; k < 2; ++k) { /* l in 16k .. 16k + 15 */
        const uint8x16_t l0 = vld1q_u8(ql + 16 * k), l1 = vld1q_u8(ql + 32 + 16 * k), hv = vld1q_u8(qh + 16 * k);
        const uint8x16_t h2 = vshrq_n_u8(hv, 2);
        c[k] = kq_s8(vsliq_n_u8(l0, vandq_u8(hv, m3), 4));
        c[2 + k] = kq_s8(vsliq_n_u8(l1, vandq_u8(h2, m3), 4));
        c[4 + k] = kq_s8(vsriq_n_u8(vandq_u8(hv, m30), l0, 4));
        c[6 + k] = kq_s8(vsriq_n_u8(vandq_u8(h2, m30), l1, 4));
    }
}

#define Q6K_BLOCK(L)                                                                                               \
    {                                                                                                              \
        const int8x16_t sc8 = vld1q_s8((const int8_t *)(w + 192));                                                 \
        int32x4_t sc[4], g[4];                                                                                     \
        kq_widen16(sc8, sc);                                                                                       \
        _Pragma("GCC unroll 2")                                                                                    \
        for (int h = 0; h < 2; ++h) {                                                                              \
            int8x16_t c[8];                                                                                        \
            q6k_codes(w, h, c);                                                                                    \
            kq_sums16_##L(c, (const int8_t *)(x + 4 + 128 * h), g + 2 * h);                                        \
        }                                                                                                          \
        const int32x4_t a = vmlaq_s32(vmulq_s32(g[0], sc[0]), g[1], sc[1]);                                        \
        /* codes are stored + 32: Σ sc · (p − 32 · bsum) */                                                        \
        const int32_t sumi = vaddvq_s32(vmlaq_s32(vmlaq_s32(a, g[2], sc[2]), g[3], sc[3])) -                       \
                             32 * kq_scaled_bsums(sc8, x);                                                         \
        s += kq_f16(w + 208) * qs_load_f32(x) * (float)sumi;                                                       \
    }
KQ_DOT(q6_K, 210, Q6K_BLOCK)

/* ---------------------------------------------------------------- IQ4_XS (qs_dot_iq4_xs_scalar)
 * 136 bytes: d, 16 bits of scale high parts, 4 bytes of scale low nibbles, 128 bytes of code-book indices: element
 * 32s + j is the low nibble of byte 8 + 16s + j, element 32s + 16 + j its high nibble; scale (6 bits) - 32. */
KQ_AI void iq4xs_codes(const uint8_t *qs, int8x16_t book, int8x16_t c[8]) { /* qs: the half's 64 bytes */
    const uint8x16_t m4 = vdupq_n_u8(15);
    _Pragma("GCC unroll 4")
    for (int k = 0; k < 4; ++k) {
        const uint8x16_t v = vld1q_u8(qs + 16 * k);
        c[2 * k] = vqtbl1q_s8(book, vandq_u8(v, m4));
        c[2 * k + 1] = vqtbl1q_s8(book, vshrq_n_u8(v, 4));
    }
}

KQ_AI void iq4xs_scales(const uint8_t *w, int32x4_t ls[2]) { /* sub-blocks 0-3, 4-7 */
    static const int32_t lsh[8] = {0, -4, -8, -12, -16, -20, -24, -28}, hsh[8] = {0, -2, -4, -6, -8, -10, -12, -14};
    const uint32x4_t lo = vdupq_n_u32(qs_load_u32(w + 4)), hi = vdupq_n_u32(qs_load_u16(w + 2));
    const uint32x4_t m4 = vdupq_n_u32(15), m3 = vdupq_n_u32(3);
    _Pragma("GCC unroll 2")
    for (int k = 0; k < 2; ++k) {
        const uint32x4_t l = vandq_u32(vshlq_u32(lo, vld1q_s32(lsh + 4 * k)), m4);
        const uint32x4_t h = vandq_u32(vshlq_u32(hi, vld1q_s32(hsh + 4 * k)), m3);
        ls[k] = vsubq_s32(vreinterpretq_s32_u32(vorrq_u32(l, vshlq_n_u32(h, 4))), vdupq_n_s32(32));
    }
}

#define IQ4XS_BLOCK(L)                                                                                             \
    {                                                                                                              \
        const int8x16_t book = vld1q_s8(QS_IQ4NL);                                                                 \
        int32x4_t ls[2];                                                                                           \
        iq4xs_scales(w, ls);                                                                                       \
        int8x16_t c[8];                                                                                            \
        iq4xs_codes(w + 8, book, c);                                                                               \
        const int32x4_t g0 = kq_sums32_##L(c, (const int8_t *)(x + 4));                                            \
        iq4xs_codes(w + 72, book, c);                                                                              \
        const int32x4_t g1 = kq_sums32_##L(c, (const int8_t *)(x + 132));                                          \
        const int32_t sumi = vaddvq_s32(vmlaq_s32(vmulq_s32(g0, ls[0]), g1, ls[1]));                               \
        s += (float)sumi * (kq_f16(w) * qs_load_f32(x));                                                           \
    }
KQ_DOT(iq4_xs, 136, IQ4XS_BLOCK)

/* ---------------------------------------------------------------- TQ1_0 / TQ2_0 (qs_dot_tq1_0_scalar, _tq2_0_)
 * Codes t in 0..2 (TQ2_0's 2-bit field may read 3), value t - 1: Σ (t − 1) · q = Σ t · q − Σ q, the last from the
 * bsums. The float step is the reference's (qs_iq_dot_codes_scalar): s = fmaf(d · d_x, isum, s), so the same bits. */
KQ_AI int32_t kq_bsum_total(const uint8_t *x) {
    return vaddlvq_s16(kq_bsums(x, 0)) + vaddlvq_s16(kq_bsums(x, 1));
}

/* TQ2_0, 66 bytes: 64 bytes of 2-bit codes, d. Element 128h + 32k + j: bits 2k..2k+1 of byte 32h + j (as Q2_K). */
#define TQ2_BLOCK(L)                                                                                               \
    {                                                                                                              \
        int8x16_t c[8];                                                                                            \
        q2k_codes(w, c);                                                                                           \
        int32x4_t acc = kq_sum128_##L(c, (const int8_t *)(x + 4));                                                 \
        q2k_codes(w + 32, c);                                                                                      \
        acc = vaddq_s32(acc, kq_sum128_##L(c, (const int8_t *)(x + 132)));                                         \
        s = fmaf(kq_f16(w + 64) * qs_load_f32(x), (float)(vaddvq_s32(acc) - kq_bsum_total(x)), s);                 \
    }
KQ_DOT(tq2_0, 66, TQ2_BLOCK)

/* TQ1_0, 54 bytes: 48 bytes of five base-3 digits, 4 bytes of four, d. Digit k of byte q is ((q · 3^k mod 256) · 3)
 * >> 8 (computed as ((m + (m >> 1)) >> 1) >> 6 with m = q · 3^k mod 256: the same for every byte). Elements:
 * 32k + j from byte j < 32 (k < 5), 160 + 16k + j from byte 32 + j (k < 5), 240 + 4k + j from byte 48 + j (k < 4). */
KQ_AI int8x16_t tq1_digit(uint8x16_t q, uint8x16_t pow3) {
    const uint8x16_t m = vmulq_u8(q, pow3);
    return kq_s8(vshrq_n_u8(vhaddq_u8(m, vshrq_n_u8(m, 1)), 6));
}

/* the block's codes: c[0..7] elements 0-127, d[0..7] elements 128-255 */
KQ_AI void tq1_codes(const uint8_t *w, int8x16_t c[8], int8x16_t d[8]) {
    static const uint8_t pow3_qh[16] = {1, 1, 1, 1, 3, 3, 3, 3, 9, 9, 9, 9, 27, 27, 27, 27};
    const uint8x16_t a0 = vld1q_u8(w), a1 = vld1q_u8(w + 16), b = vld1q_u8(w + 32);
    uint8_t p = 1;
    _Pragma("GCC unroll 4")
    for (int k = 0; k < 4; ++k, p = (uint8_t)(3 * p)) {
        c[2 * k] = tq1_digit(a0, vdupq_n_u8(p));
        c[2 * k + 1] = tq1_digit(a1, vdupq_n_u8(p));
    }
    d[0] = tq1_digit(a0, vdupq_n_u8(81));
    d[1] = tq1_digit(a1, vdupq_n_u8(81));
    p = 1;
    _Pragma("GCC unroll 5")
    for (int k = 0; k < 5; ++k, p = (uint8_t)(3 * p)) d[2 + k] = tq1_digit(b, vdupq_n_u8(p));
    d[7] = tq1_digit(vreinterpretq_u8_u32(vdupq_n_u32(qs_load_u32(w + 48))), vld1q_u8(pow3_qh));
}

#define TQ1_BLOCK(L)                                                                                               \
    {                                                                                                              \
        int8x16_t c[8], d[8];                                                                                      \
        tq1_codes(w, c, d);                                                                                        \
        const int32x4_t acc = vaddq_s32(kq_sum128_##L(c, (const int8_t *)(x + 4)),                                 \
                                        kq_sum128_##L(d, (const int8_t *)(x + 132)));                              \
        s = fmaf(kq_f16(w + 52) * qs_load_f32(x), (float)(vaddvq_s32(acc) - kq_bsum_total(x)), s);                 \
    }
KQ_DOT(tq1_0, 54, TQ1_BLOCK)

/* ---------------------------------------------------------------- dequantization, bit-exact
 * The scalar reference's products in the same order: every product is exact (an fp16 times a 6-bit, then a 4-bit
 * integer for Q4_K; an fp16 times an int8, then a 6-bit integer for Q6_K), so fused or not the result is the same. */

/* y[0..15] = d · q − m, q unsigned bytes */
KQ_AI void kq_store_affine16(uint8x16_t q, float32x4_t d, float32x4_t m, float *y) {
    const uint16x8_t lo = vmovl_u8(vget_low_u8(q)), hi = vmovl_high_u8(q);
    vst1q_f32(y, vsubq_f32(vmulq_f32(d, vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo)))), m));
    vst1q_f32(y + 4, vsubq_f32(vmulq_f32(d, vcvtq_f32_u32(vmovl_high_u16(lo))), m));
    vst1q_f32(y + 8, vsubq_f32(vmulq_f32(d, vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi)))), m));
    vst1q_f32(y + 12, vsubq_f32(vmulq_f32(d, vcvtq_f32_u32(vmovl_high_u16(hi))), m));
}

/* qs_deq_q4_K: y = (d · sc) · q − dmin · m per 32 elements */
void qs_deq_q4_K_neon(const uint8_t *b, float *y) {
    uint8_t sm[16]; /* scales 0-7, mins 8-15 */
    vst1q_u8(sm, kq_k4_scales_mins(b + 4));
    const float d = kq_f16(b), dmin = kq_f16(b + 2);
    const uint8x16_t m4 = vdupq_n_u8(15);
    for (int c = 0; c < 4; ++c) {
        const uint8x16_t a = vld1q_u8(b + 16 + 32 * c), a1 = vld1q_u8(b + 32 + 32 * c);
        const float32x4_t d0 = vdupq_n_f32(d * (float)sm[2 * c]), d1 = vdupq_n_f32(d * (float)sm[2 * c + 1]);
        const float32x4_t m0 = vdupq_n_f32(dmin * (float)sm[8 + 2 * c]), m1 = vdupq_n_f32(dmin * (float)sm[9 + 2 * c]);
        kq_store_affine16(vandq_u8(a, m4), d0, m0, y + 64 * c);
        kq_store_affine16(vandq_u8(a1, m4), d0, m0, y + 64 * c + 16);
        kq_store_affine16(vshrq_n_u8(a, 4), d1, m1, y + 64 * c + 32);
        kq_store_affine16(vshrq_n_u8(a1, 4), d1, m1, y + 64 * c + 48);
    }
}

/* qs_deq_q6_K: y = (d · sc) · (code − 32) per 16 elements */
void qs_deq_q6_K_neon(const uint8_t *b, float *y) {
    const int8_t *sc = (const int8_t *)(b + 192);
    const float d = kq_f16(b + 208);
    for (int h = 0; h < 2; ++h) {
        int8x16_t c[8];
        q6k_codes(b, h, c);
        for (int g = 0; g < 8; ++g) { /* elements 128h + 16g .. +15, scale 8h + g */
            const int8x16_t q = vsubq_s8(c[g], vdupq_n_s8(32));
            const int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_high_s8(q);
            const float32x4_t ds = vdupq_n_f32(d * (float)sc[8 * h + g]);
            float *yy = y + 128 * h + 16 * g;
            vst1q_f32(yy, vmulq_f32(ds, vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo)))));
            vst1q_f32(yy + 4, vmulq_f32(ds, vcvtq_f32_s32(vmovl_high_s16(lo))));
            vst1q_f32(yy + 8, vmulq_f32(ds, vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi)))));
            vst1q_f32(yy + 12, vmulq_f32(ds, vcvtq_f32_s32(vmovl_high_s16(hi))));
        }
    }
}

#endif /* QS_ARCH_ARM64 */
