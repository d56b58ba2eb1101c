/* ARM64 NEON dot products of the lattice i-quants against Q8_K (docs/quant-formats.md, "I-quants"), the ARM
 * counterparts of qs_iquants_avx2.c. Per 32-element chunk the code-book rows (64-bit for IQ2/IQ1, 32-bit for IQ3)
 * are loaded into two vectors, their signs applied to the coordinates (so the activations stay as stored; a
 * coordinate is at most 62, its product with any int8 fits int16), and the chunk's integer Σ code · q, times the
 * group's integer scale, is added to an int32 accumulator: by widening multiplies (level 1, ARMv8.0) or SDOT
 * (level 2). The float work is the scalar reference's (qs_iq_dot_codes_scalar): s = fma(mult · d_x, isum, s) block
 * after block, so the results are the same bits. Also here: the lattice types' block codes (the GEMM panels' and
 * the many-column path's decoder) and the many-column codes dot.
 *
 * Each kernel's block function is written once and takes the level's product function (dot32_* / dot16x2_*) as a
 * constant argument; it is always inlined, so the product inlines into each level's kernel. */
#include "qs_arch.h"

#if QS_ARCH_ARM64
#include <arm_neon.h>
#include <math.h>

#include "qs.h"
#include "qs_iq_grids.h"
#include "qs_iquants_neon.h"
#include "qs_quant_internal.h"

#define AI __attribute__((always_inline)) static inline
#if QS_HAVE_DOTPROD
#define TD QS_TARGET_DOTPROD
#endif

/* binary16 -> binary32 (FCVT: exact, as qs_fp16_to_fp32 for every non-NaN value) */
AI float f16_bits(uint16_t h) { return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0); }
AI float f16(const uint8_t *p) { return f16_bits(qs_load_u16(p)); }

/* ---------------------------------------------------------------- the products of one 32-element chunk */
/* acc + ls · Σ c · q over 32 elements (one scale); acc + l0 · Σ over the first 16 + l1 · Σ over the second 16.
 * Level 1: int16 products (|c| <= 62, |q| <= 128: four per lane stay below 2^15), widened by the scale multiply. */
typedef int32x4_t (*dot32_fn)(int32x4_t acc, int8x16_t c0, int8x16_t c1, int8x16_t q0, int8x16_t q1, int ls);
typedef int32x4_t (*dot16x2_fn)(int32x4_t acc, int8x16_t c0, int8x16_t c1, int8x16_t q0, int8x16_t q1, int l0, int l1);

AI int16x8_t mul16(int8x16_t c, int8x16_t q) { /* pairwise products: lane j = c[j]·q[j] + c[8+j]·q[8+j] */
    return vmlal_high_s8(vmull_s8(vget_low_s8(c), vget_low_s8(q)), c, q);
}

AI int32x4_t dot32_neon(int32x4_t acc, int8x16_t c0, int8x16_t c1, int8x16_t q0, int8x16_t q1, int ls) {
    const int16x8_t p = vaddq_s16(mul16(c0, q0), mul16(c1, q1)); /* 4 products < 2^15 */
    return vmlal_high_n_s16(vmlal_n_s16(acc, vget_low_s16(p), (int16_t)ls), p, (int16_t)ls);
}

AI int32x4_t dot16x2_neon(int32x4_t acc, int8x16_t c0, int8x16_t c1, int8x16_t q0, int8x16_t q1, int l0, int l1) {
    const int16x8_t p0 = mul16(c0, q0), p1 = mul16(c1, q1);
    acc = vmlal_high_n_s16(vmlal_n_s16(acc, vget_low_s16(p0), (int16_t)l0), p0, (int16_t)l0);
    return vmlal_high_n_s16(vmlal_n_s16(acc, vget_low_s16(p1), (int16_t)l1), p1, (int16_t)l1);
}

#if QS_HAVE_DOTPROD
TD AI int32x4_t dot32_dp(int32x4_t acc, int8x16_t c0, int8x16_t c1, int8x16_t q0, int8x16_t q1, int ls) {
    const int32x4_t t = vdotq_s32(vdotq_s32(vdupq_n_s32(0), c0, q0), c1, q1);
    return vmlaq_n_s32(acc, t, ls);
}

TD AI int32x4_t dot16x2_dp(int32x4_t acc, int8x16_t c0, int8x16_t c1, int8x16_t q0, int8x16_t q1, int l0, int l1) {
    const int32x4_t z = vdupq_n_s32(0);
    acc = vmlaq_n_s32(acc, vdotq_s32(z, c0, q0), l0);
    return vmlaq_n_s32(acc, vdotq_s32(z, c1, q1), l1);
}
#endif

/* ---------------------------------------------------------------- decoding: signed codes of a 32-element chunk */
/* ggml's 7-bit sign words (the eighth bit by parity, qs_ksign) as 8 bytes of ±1, multiplied onto the coordinates */
static int8_t KSIGN_PM1[128][8];

__attribute__((constructor)) static void ksign_pm1_init(void) {
    for (uint32_t i = 0; i < 128; ++i)
        for (int b = 0; b < 8; ++b) KSIGN_PM1[i][b] = (int8_t)(qs_ksign(i) >> b & 1 ? -1 : 1);
}

AI int8x16_t rows64x2(const uint8_t *p0, const uint8_t *p1) { /* two 8-byte code-book rows */
    return vreinterpretq_s8_u8(vcombine_u8(vld1_u8(p0), vld1_u8(p1)));
}

/* four 4-byte rows, paired in general registers (four independent loads, not a chain of lane inserts) */
AI int8x16_t rows32x4(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2, const uint8_t *p3) {
    const uint64_t lo = qs_load_u32(p0) | (uint64_t)qs_load_u32(p1) << 32;
    const uint64_t hi = qs_load_u32(p2) | (uint64_t)qs_load_u32(p3) << 32;
    return vreinterpretq_s8_u64(vcombine_u64(vcreate_u64(lo), vcreate_u64(hi)));
}

AI int8x16_t ksigns2(uint32_t a, uint32_t b) { /* the ±1 bytes of the sign words a & 127, b & 127 */
    return vcombine_s8(vld1_s8(KSIGN_PM1[a & 127]), vld1_s8(KSIGN_PM1[b & 127]));
}

/* the coordinates negated where the chunk's 32 sign bits are set (4 bytes at p; bit j of byte k: element 8k + j) */
AI void apply_sign_bits(const uint8_t *p, int8x16_t *c0, int8x16_t *c1) {
    const uint8x16_t s4 = vreinterpretq_u8_u32(vdupq_n_u32(qs_load_u32(p)));
    const uint8x16_t bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040201008040201ULL));
    const uint8x16_t pick0 = vcombine_u8(vdup_n_u8(0), vdup_n_u8(1)), pick1 = vcombine_u8(vdup_n_u8(2), vdup_n_u8(3));
    const int8x16_t m0 = vreinterpretq_s8_u8(vtstq_u8(vqtbl1q_u8(s4, pick0), bit));
    const int8x16_t m1 = vreinterpretq_s8_u8(vtstq_u8(vqtbl1q_u8(s4, pick1), bit));
    *c0 = vsubq_s8(veorq_s8(*c0, m0), m0); /* m = -1: ~c + 1 = -c */
    *c1 = vsubq_s8(veorq_s8(*c1, m1), m1);
}

/* Index fields are cut from one 64-bit load rather than loaded one by one: the loads (rows, signs, activations)
 * are what these kernels are bound by. */
#define FIELD(v, k, bits) ((uint32_t)((v) >> ((k) * (bits))) & ((1u << (bits)) - 1))

/* IQ2_XXS (66 B: d, 8 × {4 index bytes, u32 of 4 sign words and the scale}); returns 2 sc + 1 */
AI int iq2_xxs_chunk(const uint8_t *w, int g, int8x16_t *c0, int8x16_t *c1) {
    const uint64_t e = qs_load_u64(w + 2 + 8 * g);
    const uint32_t aux = (uint32_t)(e >> 32);
    *c0 = vmulq_s8(rows64x2(QS_GRID_IQ2_XXS[FIELD(e, 0, 8)], QS_GRID_IQ2_XXS[FIELD(e, 1, 8)]), ksigns2(aux, aux >> 7));
    *c1 = vmulq_s8(rows64x2(QS_GRID_IQ2_XXS[FIELD(e, 2, 8)], QS_GRID_IQ2_XXS[FIELD(e, 3, 8)]),
                   ksigns2(aux >> 14, aux >> 21));
    return 2 * (int)(aux >> 28) + 1;
}

/* IQ2_XS (74 B: d, 32 × u16 {9-bit index, 7 sign bits}, 8 bytes of scale nibbles per 16): chunk c is entries
 * 4c..4c+3, one 64-bit load */
AI void iq2_xs_chunk(const uint8_t *w, int c, int8x16_t *c0, int8x16_t *c1) {
    const uint64_t e = qs_load_u64(w + 2 + 8 * c);
    *c0 = vmulq_s8(rows64x2(QS_GRID_IQ2_XS[FIELD(e, 0, 16) & 511], QS_GRID_IQ2_XS[FIELD(e, 1, 16) & 511]),
                   ksigns2(FIELD(e, 0, 16) >> 9, FIELD(e, 1, 16) >> 9));
    *c1 = vmulq_s8(rows64x2(QS_GRID_IQ2_XS[FIELD(e, 2, 16) & 511], QS_GRID_IQ2_XS[FIELD(e, 3, 16) & 511]),
                   ksigns2(FIELD(e, 2, 16) >> 9, FIELD(e, 3, 16) >> 9));
}

/* IQ2_S (82 B: d, 32 index bytes, 32 sign bytes, 8 qh bytes (2 high index bits per entry), 8 scale bytes): the
 * 10-bit indices built by vector: qh byte e/4 to each entry's lane, shifted right by 2·(e % 4), zipped above qs */
AI void iq2_s_prep(const uint8_t *w, uint16_t *ix) {
    const uint8x16_t t = vld1q_u8(w + 66); /* qh in bytes 0..7 */
    const int8x16_t shr = vreinterpretq_s8_u32(vdupq_n_u32(0xFAFCFE00u)); /* 0, -2, -4, -6 */
    const uint8x16_t pick = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3};
    for (int h = 0; h < 2; ++h) {
        const uint8x16_t hi = vandq_u8(vshlq_u8(vqtbl1q_u8(t, vaddq_u8(pick, vdupq_n_u8((uint8_t)(4 * h)))), shr),
                                       vdupq_n_u8(3));
        const uint8x16_t lo = vld1q_u8(w + 2 + 16 * h);
        vst1q_u8((uint8_t *)(ix + 16 * h), vzip1q_u8(lo, hi));
        vst1q_u8((uint8_t *)(ix + 16 * h + 8), vzip2q_u8(lo, hi));
    }
}

AI void iq2_s_chunk(const uint8_t *w, const uint16_t *ix, int c, int8x16_t *c0, int8x16_t *c1) {
    const uint64_t e = qs_load_u64((const uint8_t *)(ix + 4 * c));
    *c0 = rows64x2(QS_GRID_IQ2_S[FIELD(e, 0, 16)], QS_GRID_IQ2_S[FIELD(e, 1, 16)]);
    *c1 = rows64x2(QS_GRID_IQ2_S[FIELD(e, 2, 16)], QS_GRID_IQ2_S[FIELD(e, 3, 16)]);
    apply_sign_bits(w + 34 + 4 * c, c0, c1);
}

/* IQ3_XXS (98 B: d, 64 index bytes of 4-byte rows, 8 × u32 of 4 sign words and the scale); returns 2 sc + 1 */
#define ROWS3(G, e, k) rows32x4(G[FIELD(e, k, 8)], G[FIELD(e, k + 1, 8)], G[FIELD(e, k + 2, 8)], G[FIELD(e, k + 3, 8)])
AI int iq3_xxs_chunk(const uint8_t *w, int g, int8x16_t *c0, int8x16_t *c1) {
    const uint64_t e = qs_load_u64(w + 2 + 8 * g);
    const uint32_t aux = qs_load_u32(w + 66 + 4 * g);
    *c0 = vmulq_s8(ROWS3(QS_GRID_IQ3_XXS, e, 0), ksigns2(aux, aux >> 7));
    *c1 = vmulq_s8(ROWS3(QS_GRID_IQ3_XXS, e, 4), ksigns2(aux >> 14, aux >> 21));
    return 2 * (int)(aux >> 28) + 1;
}

/* IQ3_S (110 B: d, 64 index bytes, 8 qh bytes (the ninth index bit), 32 sign bytes, 4 scale bytes): the 9-bit
 * indices by vector, qh byte e/8 to each entry's lane shifted right by e % 8 */
AI void iq3_s_prep(const uint8_t *w, uint16_t *ix) {
    const uint8x16_t t = vld1q_u8(w + 66); /* qh in bytes 0..7 */
    const int8x16_t shr = vreinterpretq_s8_u64(vdupq_n_u64(0xF9FAFBFCFDFEFF00ULL)); /* 0, -1, ..., -7 */
    for (int h = 0; h < 4; ++h) {
        const uint8x16_t pick = vcombine_u8(vdup_n_u8((uint8_t)(2 * h)), vdup_n_u8((uint8_t)(2 * h + 1)));
        const uint8x16_t hi = vandq_u8(vshlq_u8(vqtbl1q_u8(t, pick), shr), vdupq_n_u8(1));
        const uint8x16_t lo = vld1q_u8(w + 2 + 16 * h);
        vst1q_u8((uint8_t *)(ix + 16 * h), vzip1q_u8(lo, hi));
        vst1q_u8((uint8_t *)(ix + 16 * h + 8), vzip2q_u8(lo, hi));
    }
}

AI void iq3_s_chunk(const uint8_t *w, const uint16_t *ix, int g, int8x16_t *c0, int8x16_t *c1) {
    const uint64_t e0 = qs_load_u64((const uint8_t *)(ix + 8 * g)), e1 = qs_load_u64((const uint8_t *)(ix + 8 * g + 4));
    *c0 = rows32x4(QS_GRID_IQ3_S[FIELD(e0, 0, 16)], QS_GRID_IQ3_S[FIELD(e0, 1, 16)], QS_GRID_IQ3_S[FIELD(e0, 2, 16)],
                   QS_GRID_IQ3_S[FIELD(e0, 3, 16)]);
    *c1 = rows32x4(QS_GRID_IQ3_S[FIELD(e1, 0, 16)], QS_GRID_IQ3_S[FIELD(e1, 1, 16)], QS_GRID_IQ3_S[FIELD(e1, 2, 16)],
                   QS_GRID_IQ3_S[FIELD(e1, 3, 16)]);
    apply_sign_bits(w + 74 + 4 * g, c0, c1);
}

/* the two per-16 scales 2 sc + 1 of chunk c (IQ2_XS / IQ2_S: nibbles, group 2c low, 2c + 1 high) */
#define SC_LO(v) (2 * ((v) & 15) + 1)
#define SC_HI(v) (2 * ((v) >> 4) + 1)

/* ---------------------------------------------------------------- the block sums and the dots */
#define QV(p) vld1q_s8(p), vld1q_s8((p) + 16) /* a chunk's 32 activations as the products' two arguments */

AI int32_t iq2_xxs_block(const uint8_t *w, const int8_t *q, dot32_fn dot) {
    int32x4_t acc = vdupq_n_s32(0);
    for (int g = 0; g < 8; ++g) {
        int8x16_t c0, c1;
        const int ls = iq2_xxs_chunk(w, g, &c0, &c1);
        acc = dot(acc, c0, c1, QV(q + 32 * g), ls);
    }
    return vaddvq_s32(acc);
}

AI int32_t iq2_xs_block(const uint8_t *w, const int8_t *q, dot16x2_fn dot) {
    int32x4_t acc = vdupq_n_s32(0);
    for (int c = 0; c < 8; ++c) {
        int8x16_t c0, c1;
        iq2_xs_chunk(w, c, &c0, &c1);
        acc = dot(acc, c0, c1, QV(q + 32 * c), SC_LO(w[66 + c]), SC_HI(w[66 + c]));
    }
    return vaddvq_s32(acc);
}

AI int32_t iq2_s_block(const uint8_t *w, const int8_t *q, dot16x2_fn dot) {
    uint16_t ix[32];
    iq2_s_prep(w, ix);
    int32x4_t acc = vdupq_n_s32(0);
    for (int c = 0; c < 8; ++c) {
        int8x16_t c0, c1;
        iq2_s_chunk(w, ix, c, &c0, &c1);
        acc = dot(acc, c0, c1, QV(q + 32 * c), SC_LO(w[74 + c]), SC_HI(w[74 + c]));
    }
    return vaddvq_s32(acc);
}

AI int32_t iq3_xxs_block(const uint8_t *w, const int8_t *q, dot32_fn dot) {
    int32x4_t acc = vdupq_n_s32(0);
    for (int g = 0; g < 8; ++g) {
        int8x16_t c0, c1;
        const int ls = iq3_xxs_chunk(w, g, &c0, &c1);
        acc = dot(acc, c0, c1, QV(q + 32 * g), ls);
    }
    return vaddvq_s32(acc);
}

AI int32_t iq3_s_block(const uint8_t *w, const int8_t *q, dot32_fn dot) {
    uint16_t ix[64];
    iq3_s_prep(w, ix);
    int32x4_t acc = vdupq_n_s32(0);
    for (int g = 0; g < 8; ++g) {
        int8x16_t c0, c1;
        iq3_s_chunk(w, ix, g, &c0, &c1);
        acc = dot(acc, c0, c1, QV(q + 32 * g), 2 * ((w[106 + g / 2] >> (4 * (g & 1))) & 15) + 1);
    }
    return vaddvq_s32(acc);
}

/* IQ1_S (50 B: d, 32 index bytes, 8 × u16 qh {4 × 3 high index bits, 3-bit scale, delta sign}): code = 8·G + δ
 * (G in {-1, 0, 1} from the code book, δ = ±1 per group), within ±9 */
AI int32_t iq1_s_block(const uint8_t *w, const int8_t *q, dot32_fn dot) {
    int32x4_t acc = vdupq_n_s32(0);
    for (int g = 0; g < 8; ++g) {
        const uint32_t qh = qs_load_u16(w + 34 + 2 * g);
        const uint8_t *qs = w + 2 + 4 * g;
        const int8x16_t dl = vdupq_n_s8(qh & 0x8000 ? -1 : 1);
        const int8x16_t g0 = rows64x2((const uint8_t *)QS_GRID_IQ1_S[qs[0] | (qh & 7) << 8],
                                      (const uint8_t *)QS_GRID_IQ1_S[qs[1] | (qh & 56) << 5]);
        const int8x16_t g1 = rows64x2((const uint8_t *)QS_GRID_IQ1_S[qs[2] | (qh & 448) << 2],
                                      (const uint8_t *)QS_GRID_IQ1_S[qs[3] | (qh & 3584) >> 1]);
        acc = dot(acc, vaddq_s8(vshlq_n_s8(g0, 3), dl), vaddq_s8(vshlq_n_s8(g1, 3), dl), QV(q + 32 * g),
                  2 * (int)((qh >> 12) & 7) + 1);
    }
    return vaddvq_s32(acc);
}

/* IQ1_M (56 B: 32 index bytes, 16 bytes of row nibbles {3 high index bits, δ sign}, 4 × u16 of 3-bit scales per 16
 * with d's 4 bits on top): code = 8·G + δ, δ = ±1 per row of 8 */
AI float iq1_m_mult(const uint8_t *w) { /* d / 8 (qs_codes_iq1_m) */
    uint16_t sw[4];
    for (int k = 0; k < 4; ++k) sw[k] = qs_load_u16(w + 48 + 2 * k);
    const uint16_t h = (uint16_t)((sw[0] >> 12) | ((sw[1] >> 8) & 0x00F0) | ((sw[2] >> 4) & 0x0F00) | (sw[3] & 0xF000));
    return f16_bits(h) * 0.125f;
}

AI int32_t iq1_m_block(const uint8_t *w, const int8_t *q, dot16x2_fn dot) {
    /* δ bytes of two rows: -1 where bit 3 (first row, low nibble) or bit 7 (second row) of their nibble byte is set */
    const uint8x16_t dbit = vcombine_u8(vdup_n_u8(0x08), vdup_n_u8(0x80));
    const int8x16_t one = vdupq_n_s8(1);
    const uint64_t sc = qs_load_u64(w + 48); /* scale of group s: bits 3 (s % 4) of word s / 4 */
    int32x4_t acc = vdupq_n_s32(0);
    for (int c = 0; c < 8; ++c) { /* rows 4c..4c+3, groups 2c, 2c + 1 */
        const uint32_t nb = qs_load_u16(w + 32 + 2 * c);
        const uint8_t *qs = w + 4 * c;
        const int8x16_t g0 = rows64x2((const uint8_t *)QS_GRID_IQ1_S[qs[0] | (nb & 7) << 8],
                                      (const uint8_t *)QS_GRID_IQ1_S[qs[1] | (nb & 0x70) << 4]);
        const int8x16_t g1 = rows64x2((const uint8_t *)QS_GRID_IQ1_S[qs[2] | (nb & 0x700)],
                                      (const uint8_t *)QS_GRID_IQ1_S[qs[3] | (nb & 0x7000) >> 4]);
        const int8x16_t d0 = vorrq_s8(vreinterpretq_s8_u8(vtstq_u8(vdupq_n_u8((uint8_t)nb), dbit)), one);
        const int8x16_t d1 = vorrq_s8(vreinterpretq_s8_u8(vtstq_u8(vdupq_n_u8((uint8_t)(nb >> 8)), dbit)), one);
        const uint32_t s2 = (uint32_t)(sc >> (16 * (c / 2) + 6 * (c & 1)));
        acc = dot(acc, vaddq_s8(vshlq_n_s8(g0, 3), d0), vaddq_s8(vshlq_n_s8(g1, 3), d1), QV(q + 32 * c),
                  2 * (int)(s2 & 7) + 1, 2 * (int)((s2 >> 3) & 7) + 1);
    }
    return vaddvq_s32(acc);
}

/* One fma per block in order (qs_iq_dot_codes_scalar's float operations): BLOCK(w, q, DOT) is the block's exact
 * integer sum, MULT(w) its multiplier (qs_codes_*'s mult). */
#define DOT_BLOCKS(BB, MULT, BLOCK, DOT)                                                                           \
    float s = 0.0f;                                                                                                \
    for (int64_t i = 0; i < n / 256; ++i, w += (BB), x += 292)                                                     \
        s = fmaf(MULT(w) * qs_load_f32(x), (float)BLOCK(w, (const int8_t *)(x + 4), DOT), s);                      \
    return s

#define MULT_8(w) (f16(w) * 0.125f)
#define MULT_4(w) (f16(w) * 0.25f)
#define MULT_1(w) f16(w)

/* references: qs_dot_<type>_scalar (qs_iquants.c) */
float qs_dot_iq2_xxs_neon(int64_t n, const uint8_t *w, const uint8_t *x) {
    DOT_BLOCKS(66, MULT_8, iq2_xxs_block, dot32_neon);
}
float qs_dot_iq2_xs_neon(int64_t n, const uint8_t *w, const uint8_t *x) {
    DOT_BLOCKS(74, MULT_8, iq2_xs_block, dot16x2_neon);
}
float qs_dot_iq2_s_neon(int64_t n, const uint8_t *w, const uint8_t *x) {
    DOT_BLOCKS(82, MULT_8, iq2_s_block, dot16x2_neon);
}
float qs_dot_iq3_xxs_neon(int64_t n, const uint8_t *w, const uint8_t *x) {
    DOT_BLOCKS(98, MULT_4, iq3_xxs_block, dot32_neon);
}
float qs_dot_iq3_s_neon(int64_t n, const uint8_t *w, const uint8_t *x) {
    DOT_BLOCKS(110, MULT_1, iq3_s_block, dot32_neon);
}
float qs_dot_iq1_s_neon(int64_t n, const uint8_t *w, const uint8_t *x) {
    DOT_BLOCKS(50, MULT_8, iq1_s_block, dot32_neon);
}
float qs_dot_iq1_m_neon(int64_t n, const uint8_t *w, const uint8_t *x) {
    DOT_BLOCKS(56, iq1_m_mult, iq1_m_block, dot16x2_neon);
}

#if QS_HAVE_DOTPROD
TD float qs_dot_iq2_xxs_dotprod(int64_t n, const uint8_t *w, const uint8_t *x) {
    DOT_BLOCKS(66, MULT_8, iq2_xxs_block, dot32_dp);
}
TD float qs_dot_iq2_xs_dotprod(int64_t n, const uint8_t *w, const uint8_t *x) {
    DOT_BLOCKS(74, MULT_8, iq2_xs_block, dot16x2_dp);
}
TD float qs_dot_iq2_s_dotprod(int64_t n, const uint8_t *w, const uint8_t *x) {
    DOT_BLOCKS(82, MULT_8, iq2_s_block, dot16x2_dp);
}
TD float qs_dot_iq3_xxs_dotprod(int64_t n, const uint8_t *w, const uint8_t *x) {
    DOT_BLOCKS(98, MULT_4, iq3_xxs_block, dot32_dp);
}
TD float qs_dot_iq3_s_dotprod(int64_t n, const uint8_t *w, const uint8_t *x) {
    DOT_BLOCKS(110, MULT_1, iq3_s_block, dot32_dp);
}
TD float qs_dot_iq1_s_dotprod(int64_t n, const uint8_t *w, const uint8_t *x) {
    DOT_BLOCKS(50, MULT_8, iq1_s_block, dot32_dp);
}
TD float qs_dot_iq1_m_dotprod(int64_t n, const uint8_t *w, const uint8_t *x) {
    DOT_BLOCKS(56, iq1_m_mult, iq1_m_block, dot16x2_dp);
}
#endif

/* ---------------------------------------------------------------- block codes and the many-column dot */
/* The 256 codes of an IQ2_XXS / IQ2_XS / IQ2_S / IQ3_XXS / IQ3_S block: the same bytes as the scalar decoding in
 * qs_codes_* (reference: lattice_codes in qs_iquants.c, qs_iq_lattice_codes_avx2) */
void qs_iq_lattice_codes_neon(int type, const uint8_t *b, int8_t *code) {
    uint16_t ix[64];
    if (type == QS_IQ2_S) iq2_s_prep(b, ix);
    else if (type == QS_IQ3_S) iq3_s_prep(b, ix);
    for (int c = 0; c < 8; ++c) {
        int8x16_t c0, c1;
        switch (type) {
        case QS_IQ2_XXS: iq2_xxs_chunk(b, c, &c0, &c1); break;
        case QS_IQ2_XS: iq2_xs_chunk(b, c, &c0, &c1); break;
        case QS_IQ2_S: iq2_s_chunk(b, ix, c, &c0, &c1); break;
        case QS_IQ3_XXS: iq3_xxs_chunk(b, c, &c0, &c1); break;
        default: iq3_s_chunk(b, ix, c, &c0, &c1); break;
        }
        vst1q_s8(code + 32 * c, c0);
        vst1q_s8(code + 32 * c + 16, c1);
    }
}

/* The codes of qs_iq_row_codes against Q8_K or Q8_0 activations (reference: qs_iq_dot_codes_scalar): per outer
 * group the exact integer Σ ls · Σ code · q, then the scalar reference's float operation. Every code is within ±63
 * (lattice ±62, IQ1 ±9, FP4 ±12, ternary ±1), so the level-1 int16 products hold. */
AI float dot_codes(const int8_t *codes, const float *mults, const int16_t *ls, int gs, int os, int q8k, int64_t k,
                   const uint8_t *x, dot32_fn dot32, dot16x2_fn dot16x2) {
    float s = 0.0f;
    for (int64_t o0 = 0; o0 < k; o0 += os) {
        float dx;
        const int8_t *q = qs_iq_act(x, o0, q8k, &dx);
        const int8_t *c0 = codes + o0;
        const int16_t *l0 = ls + o0 / gs;
        int32x4_t acc = vdupq_n_s32(0);
        if (os == 16) { /* NVFP4: one group of 16 (a zero second half adds nothing) */
            acc = dot16x2(acc, vld1q_s8(c0), vdupq_n_s8(0), vld1q_s8(q), vdupq_n_s8(0), l0[0], 0);
        } else if (gs == 16) {
            for (int j = 0; j < os; j += 32)
                acc = dot16x2(acc, vld1q_s8(c0 + j), vld1q_s8(c0 + j + 16), QV(q + j), l0[j / 16], l0[j / 16 + 1]);
        } else {
            for (int j = 0; j < os; j += 32)
                acc = dot32(acc, vld1q_s8(c0 + j), vld1q_s8(c0 + j + 16), QV(q + j), l0[j / gs]);
        }
        s = fmaf(mults[o0 / gs] * dx, (float)vaddvq_s32(acc), s);
    }
    return s;
}

float qs_iq_dot_codes_neon(const int8_t *codes, const float *mults, const int16_t *ls, int gs, int os, int q8k,
                           int64_t k, const uint8_t *x) {
    return dot_codes(codes, mults, ls, gs, os, q8k, k, x, dot32_neon, dot16x2_neon);
}

#if QS_HAVE_DOTPROD
TD float qs_iq_dot_codes_dotprod(const int8_t *codes, const float *mults, const int16_t *ls, int gs, int os, int q8k,
                                 int64_t k, const uint8_t *x) {
    return dot_codes(codes, mults, ls, gs, os, q8k, k, x, dot32_dp, dot16x2_dp);
}
#endif

#endif
