/* AVX2 dot products of the lattice i-quants against Q8_K (docs/quant-formats.md, "I-quants"): the code-book
 * points of a 32-element chunk are gathered as 64-bit (IQ2) or 32-bit (IQ3) rows into one vector of unsigned
 * coordinates, the sign bits are applied to the activations (negation where set), and vpmaddubsw + vpmaddwd (against
 * the groups' integer scales) give the block's exact integer sum. The float work is the scalar reference's
 * (qs_iq_dot_codes_scalar): s = fma(mult · d_x, isum, s) block after block, so the results are the same bits. */
#include "qs_arch.h"
#if QS_ARCH_X86
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "qs.h"
#include "qs_iq_grids.h"
#include "qs_quant_internal.h"

#define T QS_TARGET_AVX2
#define AI __attribute__((always_inline)) static inline


T AI float f16(const uint8_t *p) { return _cvtsh_ss(qs_load_u16(p)); }

T AI __m256i bytes_of_bits(uint32_t x32) { /* bit e set -> byte e = 0xFF */
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x32), shuf);
    bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}

/* four of ggml's 7-bit sign words (bits 0, 7, 14, 21 of aux) as 32 sign bits */
T AI uint32_t ksigns4(uint32_t aux) {
    return qs_ksign(aux) | (uint32_t)qs_ksign(aux >> 7) << 8 | (uint32_t)qs_ksign(aux >> 14) << 16 |
           (uint32_t)qs_ksign(aux >> 21) << 24;
}

/* ggml's 7-bit sign words (the eighth bit by parity) as byte masks, 0xFF where the element is negated: four of them
 * (one 32-element chunk) are four table loads instead of the bit arithmetic of ksigns4 and bytes_of_bits */
static uint64_t KSIGN_MASK[128];

__attribute__((constructor)) static void ksign_mask_init(void) {
    for (uint32_t i = 0; i < 128; ++i) {
        const uint32_t v = qs_ksign(i);
        uint64_t m = 0;
        for (int b = 0; b < 8; ++b)
            if (v >> b & 1) m |= 0xFFull << (8 * b);
        KSIGN_MASK[i] = m;
    }
}

T AI __m256i sign_masks4(uint32_t aux) {
    return _mm256_setr_epi64x((long long)KSIGN_MASK[aux & 127], (long long)KSIGN_MASK[(aux >> 7) & 127],
                              (long long)KSIGN_MASK[(aux >> 14) & 127], (long long)KSIGN_MASK[(aux >> 21) & 127]);
}

/* chunk_sums (below) with the signs as byte masks */
T AI __m256i chunk_sums_m(__m256i coords, const int8_t *q, __m256i m, __m256i sc) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)q);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(coords, _mm256_sub_epi8(_mm256_xor_si256(v, m), m)), sc);
}

/* 32 activation codes with the signs applied, times 32 unsigned coordinates, times the int16 scales sc: 8 int32
 * partial sums (pairs stay within int16: coordinates <= 62, so 2 · 62 · 127 < 32768) */
T AI __m256i chunk_sums(__m256i coords, const int8_t *q, uint32_t signs, __m256i sc) {
    const __m256i m = bytes_of_bits(signs), v = _mm256_loadu_si256((const __m256i *)q);
    const __m256i a = _mm256_sub_epi8(_mm256_xor_si256(v, m), m);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(coords, a), sc);
}

T AI int hsum4(__m128i s) {
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

T AI int hsum8(__m256i v) { return hsum4(_mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1))); }

/* Four 8-byte code-book rows as one vector, built in registers: through a stack array the 256-bit load waits on
 * four narrower stores it cannot forward from (a store-forwarding stall), which cost 3x in IQ3_S's dot. */
T AI __m256i rows64(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2, const uint8_t *p3) {
    return _mm256_setr_epi64x((long long)qs_load_u64(p0), (long long)qs_load_u64(p1), (long long)qs_load_u64(p2),
                              (long long)qs_load_u64(p3));
}

/* The 16 per-16 scales of an IQ2_XS / IQ2_S block (nibbles of 8 bytes, group 2c low, 2c+1 high), as 2 sc + 1 bytes */
T AI __m128i scales_of(__m128i b) {
    const __m128i m4 = _mm_set1_epi8(15);
    const __m128i v = _mm_unpacklo_epi8(_mm_and_si128(b, m4), _mm_and_si128(_mm_srli_epi16(b, 4), m4));
    return _mm_add_epi8(_mm_add_epi8(v, v), _mm_set1_epi8(1));
}
T AI __m128i scales16(const uint8_t *p) { return scales_of(_mm_loadl_epi64((const __m128i *)p)); }

/* chunk c's two scales (groups 2c, 2c+1) spread to the low and the high 8 int16 lanes */
T AI __m256i chunk_scales(__m128i sc16, int c) {
    const __m128i pick = _mm_add_epi8(_mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                      _mm_set1_epi8((char)(2 * c)));
    return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc16, pick));
}

/* unsigned byte scales g (pair sums 0-7) and g + 1 (8-15) of l8 as int16, by one byte shuffle */
T AI __m256i scales_pair_u8(__m128i l8, int g) {
    const __m128i pick = _mm_add_epi8(_mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), _mm_set1_epi8((char)g));
    return _mm256_cvtepu8_epi16(_mm_shuffle_epi8(l8, pick));
}

/* scale 2 sc + 1 for a whole chunk */
T AI __m256i scale1(int sc) { return _mm256_set1_epi16((short)(2 * sc + 1)); }

/* The block's exact integer Σ ls · Σ code · q, then one fused multiply-add with (mult · d_x), as the scalar
 * reference (qs_iq_dot_codes_scalar) and ggml's dots do; mult as qs_codes_* compute it. */
T AI float block_end(float s, float mult, const uint8_t *x, __m256i acc) {
    return fmaf(mult * qs_load_f32(x), (float)hsum8(acc), s);
}

/* Four blocks' integer sums at once, the same integers as four hsum8 (three horizontal adds instead of four
 * reductions): lane j of the result is the sum of v_j's eight lanes. */
T AI __m128i hsum8x4(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i t = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

/* s after the blocks i..i+3 whose integer sums are a[0..3] (block_end four times, the same operations) */
T AI float blocks_end4(float s, const uint8_t *w, int64_t wb, float wscale, const uint8_t *x, const __m256i *a) {
    int32_t is[4];
    _mm_storeu_si128((__m128i *)is, hsum8x4(a[0], a[1], a[2], a[3]));
    for (int j = 0; j < 4; ++j) s = fmaf(f16(w + wb * j) * wscale * qs_load_f32(x + 292 * j), (float)is[j], s);
    return s;
}

/* The body of a lattice dot: BLOCK(w, q) gives a block's integer lane sums (BB bytes per block, d scaled by
 * WSCALE); four blocks are reduced at once, then one fma per block in order, as the scalar reference does. */
#define DOT_BLOCKS4(BB, WSCALE, BLOCK)                                                                             \
    float s = 0.0f;                                                                                                \
    const int64_t nb = n / 256;                                                                                    \
    int64_t i = 0;                                                                                                 \
    for (; i + 4 <= nb; i += 4, w += 4 * (BB), x += 4 * 292) {                                                     \
        __m256i a[4];                                                                                              \
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; ++j) a[j] = BLOCK(w + (BB) * j, (const int8_t *)(x + 292 * j + 4)); \
        s = blocks_end4(s, w, (BB), (WSCALE), x, a);                                                               \
    }                                                                                                              \
    for (; i < nb; ++i, w += (BB), x += 292) s = block_end(s, f16(w) * (WSCALE), x, BLOCK(w, (const int8_t *)(x + 4))); \
    return s

T AI __m256i iq2_xxs_block(const uint8_t *w, const int8_t *q) {
    __m256i acc = _mm256_setzero_si256();
    _Pragma("GCC unroll 8")
    for (int g = 0; g < 8; ++g) {
        const uint8_t *b = w + 2 + 8 * g;
        const uint32_t aux = qs_load_u32(b + 4);
        const __m256i c = rows64(QS_GRID_IQ2_XXS[b[0]], QS_GRID_IQ2_XXS[b[1]], QS_GRID_IQ2_XXS[b[2]],
                                 QS_GRID_IQ2_XXS[b[3]]);
        acc = _mm256_add_epi32(acc, chunk_sums_m(c, q + 32 * g, sign_masks4(aux), scale1((int)(aux >> 28))));
    }
    return acc;
}

T float qs_dot_iq2_xxs_avx2(int64_t n, const uint8_t *w, const uint8_t *x) { DOT_BLOCKS4(66, 0.125f, iq2_xxs_block); }

/* IQ2_XS, 128 elements (16 entries of 9-bit index | 7 sign bits << 9) per step: the indices and the eighth (parity)
 * sign bits are computed for all 16 entries in one vector, the indices read back from a stack copy of that vector
 * (narrow loads inside one wide store forward fine), and each 32-element chunk's 4 sign bytes are spread to its 32
 * bytes by a byte shuffle. Two accumulators. */
T AI __m256i spread_signs(__m256i sb, __m256i pick) { /* 0xFF where the element's sign bit is set */
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(sb, pick), bit), bit);
}

T AI __m256i iq2_xs_block(const uint8_t *w, const int8_t *q) {
    /* bit 7 set where the 4-bit value has odd parity */
    const __m256i par = _mm256_setr_epi8(0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0,
                                         0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0);
    /* sign bytes of entries 0-3 (chunk 0 of a lane) / 4-7 (chunk 1), each to 8 bytes */
    const __m256i pick0 = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2, 4, 4, 4, 4, 4, 4, 4, 4,
                                           6, 6, 6, 6, 6, 6, 6, 6);
    const __m256i pick1 = _mm256_add_epi8(pick0, _mm256_set1_epi8(8));
    const __m256i m511 = _mm256_set1_epi16(511);
    uint16_t ix[16];
    const __m128i sc16 = scales16(w + 66);
    __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
    _Pragma("GCC unroll 2")
    for (int h = 0; h < 2; ++h) {
        const __m256i e = _mm256_loadu_si256((const __m256i *)(w + 2 + 32 * h));
        _mm256_storeu_si256((__m256i *)ix, _mm256_and_si256(e, m511));
        const __m256i s7 = _mm256_srli_epi16(e, 9);
        const __m256i sb = _mm256_or_si256(s7, _mm256_shuffle_epi8(par, _mm256_xor_si256(s7, _mm256_srli_epi16(s7, 4))));
        const __m256i lo = _mm256_permute2x128_si256(sb, sb, 0x00), hi = _mm256_permute2x128_si256(sb, sb, 0x11);
        const __m256i m[4] = {spread_signs(lo, pick0), spread_signs(lo, pick1), spread_signs(hi, pick0),
                              spread_signs(hi, pick1)};
        _Pragma("GCC unroll 4")
        for (int c = 0; c < 4; ++c) {
            const __m256i co = rows64(QS_GRID_IQ2_XS[ix[4 * c]], QS_GRID_IQ2_XS[ix[4 * c + 1]],
                                      QS_GRID_IQ2_XS[ix[4 * c + 2]], QS_GRID_IQ2_XS[ix[4 * c + 3]]);
            const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 128 * h + 32 * c));
            const __m256i a = _mm256_sub_epi8(_mm256_xor_si256(v, m[c]), m[c]);
            const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(co, a), chunk_scales(sc16, 4 * h + c));
            if (c & 1) acc1 = _mm256_add_epi32(acc1, p);
            else acc0 = _mm256_add_epi32(acc0, p);
        }
    }
    return _mm256_add_epi32(acc0, acc1);
}

T float qs_dot_iq2_xs_avx2(int64_t n, const uint8_t *w, const uint8_t *x) { DOT_BLOCKS4(74, 0.125f, iq2_xs_block); }

T AI __m256i iq2_s_block(const uint8_t *w, const int8_t *q) {
    const __m128i sc16 = scales16(w + 74);
    __m256i acc = _mm256_setzero_si256();
    _Pragma("GCC unroll 8")
    for (int c = 0; c < 8; ++c) {
        const uint32_t qh = w[66 + c];
        const uint8_t *qs = w + 2 + 4 * c;
        const __m256i co = rows64(QS_GRID_IQ2_S[qs[0] | (qh & 3) << 8], QS_GRID_IQ2_S[qs[1] | (qh & 12) << 6],
                                  QS_GRID_IQ2_S[qs[2] | (qh & 48) << 4], QS_GRID_IQ2_S[qs[3] | (qh & 192) << 2]);
        acc = _mm256_add_epi32(acc, chunk_sums(co, q + 32 * c, qs_load_u32(w + 34 + 4 * c), chunk_scales(sc16, c)));
    }
    return acc;
}

T float qs_dot_iq2_s_avx2(int64_t n, const uint8_t *w, const uint8_t *x) { DOT_BLOCKS4(82, 0.125f, iq2_s_block); }

T AI __m256i iq3_xxs_block(const uint8_t *w, const int8_t *q) {
    __m256i acc = _mm256_setzero_si256();
    _Pragma("GCC unroll 8")
    for (int g = 0; g < 8; ++g) {
        const uint32_t aux = qs_load_u32(w + 66 + 4 * g);
        const uint8_t *qs = w + 2 + 8 * g;
#define P3(k) (int)qs_load_u32(QS_GRID_IQ3_XXS[qs[k]])
        const __m256i co = _mm256_setr_epi32(P3(0), P3(1), P3(2), P3(3), P3(4), P3(5), P3(6), P3(7));
#undef P3
        acc = _mm256_add_epi32(acc, chunk_sums_m(co, q + 32 * g, sign_masks4(aux), scale1((int)(aux >> 28))));
    }
    return acc;
}

T float qs_dot_iq3_xxs_avx2(int64_t n, const uint8_t *w, const uint8_t *x) { DOT_BLOCKS4(98, 0.25f, iq3_xxs_block); }

/* IQ3_S, two 32-element groups per step: the 16 9-bit indices built in one vector (the ninth bits from the two qh
 * bytes by variable shifts), read back from its stack copy for the row inserts; two accumulators. */
T AI __m256i iq3_s_block(const uint8_t *w, const int8_t *q) {
    const __m256i shl = _mm256_setr_epi32(8, 7, 6, 5, 4, 3, 2, 1), b8 = _mm256_set1_epi32(256);
    uint32_t ix[16];
    const __m128i sc8 = scales_of(_mm_cvtsi32_si128((int)qs_load_u32(w + 106))); /* groups 0..7: 2 sc + 1 */
    __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
    _Pragma("GCC unroll 4")
    for (int g = 0; g < 8; g += 2) {
        const __m128i lo = _mm_loadu_si128((const __m128i *)(w + 2 + 8 * g));
        const __m256i i0 = _mm256_or_si256(_mm256_cvtepu8_epi32(lo), _mm256_and_si256(
            _mm256_sllv_epi32(_mm256_set1_epi32(w[66 + g]), shl), b8));
        const __m256i i1 = _mm256_or_si256(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)), _mm256_and_si256(
            _mm256_sllv_epi32(_mm256_set1_epi32(w[67 + g]), shl), b8));
        _mm256_storeu_si256((__m256i *)ix, i0);
        _mm256_storeu_si256((__m256i *)(ix + 8), i1);
        _Pragma("GCC unroll 2")
        for (int k = 0; k < 2; ++k) {
            const uint32_t *t = ix + 8 * k;
#define P3(j) (int)qs_load_u32(QS_GRID_IQ3_S[t[j]])
            const __m256i co = _mm256_setr_epi32(P3(0), P3(1), P3(2), P3(3), P3(4), P3(5), P3(6), P3(7));
#undef P3
            const __m256i p = chunk_sums(co, q + 32 * (g + k), qs_load_u32(w + 74 + 4 * (g + k)),
                                         _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, _mm_set1_epi8((char)(g + k)))));
            if (k) acc1 = _mm256_add_epi32(acc1, p);
            else acc0 = _mm256_add_epi32(acc0, p);
        }
    }
    return _mm256_add_epi32(acc0, acc1);
}

T float qs_dot_iq3_s_avx2(int64_t n, const uint8_t *w, const uint8_t *x) { DOT_BLOCKS4(110, 1.0f, iq3_s_block); }

/* Codes of a lattice block: per 32-element chunk the code-book rows (unsigned) and a sign mask, code = ±row */
T void qs_iq_lattice_codes_avx2(int type, const uint8_t *b, int8_t *code) {
    for (int c = 0; c < 8; ++c) {
        __m256i co;
        uint32_t sg;
        switch (type) {
        case QS_IQ2_XXS: {
            const uint8_t *p = b + 2 + 8 * c;
            const uint32_t aux = qs_load_u32(p + 4);
            sg = ksigns4(aux);
            co = rows64(QS_GRID_IQ2_XXS[p[0]], QS_GRID_IQ2_XXS[p[1]], QS_GRID_IQ2_XXS[p[2]], QS_GRID_IQ2_XXS[p[3]]);
            break;
        }
        case QS_IQ2_XS: {
            const uint64_t e = qs_load_u64(b + 2 + 8 * c);
            sg = qs_ksign((uint32_t)(e >> 9)) | (uint32_t)qs_ksign((uint32_t)(e >> 25)) << 8 |
                 (uint32_t)qs_ksign((uint32_t)(e >> 41)) << 16 | (uint32_t)qs_ksign((uint32_t)(e >> 57)) << 24;
            co = rows64(QS_GRID_IQ2_XS[e & 511], QS_GRID_IQ2_XS[(e >> 16) & 511], QS_GRID_IQ2_XS[(e >> 32) & 511],
                        QS_GRID_IQ2_XS[(e >> 48) & 511]);
            break;
        }
        case QS_IQ2_S: {
            const uint32_t qh = b[66 + c];
            const uint8_t *qs = b + 2 + 4 * c;
            sg = qs_load_u32(b + 34 + 4 * c);
            co = rows64(QS_GRID_IQ2_S[qs[0] | (qh & 3) << 8], QS_GRID_IQ2_S[qs[1] | (qh & 12) << 6],
                        QS_GRID_IQ2_S[qs[2] | (qh & 48) << 4], QS_GRID_IQ2_S[qs[3] | (qh & 192) << 2]);
            break;
        }
        case QS_IQ3_XXS: {
            const uint32_t aux = qs_load_u32(b + 66 + 4 * c);
            const uint8_t *qs = b + 2 + 8 * c;
            sg = ksigns4(aux);
#define P3(k) (int)qs_load_u32(QS_GRID_IQ3_XXS[qs[k]])
            co = _mm256_setr_epi32(P3(0), P3(1), P3(2), P3(3), P3(4), P3(5), P3(6), P3(7));
#undef P3
            break;
        }
        default: { /* IQ3_S */
            const uint32_t qh = b[66 + c];
            const uint8_t *qs = b + 2 + 8 * c;
            sg = qs_load_u32(b + 74 + 4 * c);
#define P3(k) (int)qs_load_u32(QS_GRID_IQ3_S[qs[k] | ((qh << (8 - (k))) & 256)])
            co = _mm256_setr_epi32(P3(0), P3(1), P3(2), P3(3), P3(4), P3(5), P3(6), P3(7));
#undef P3
            break;
        }
        }
        const __m256i m = bytes_of_bits(sg);
        _mm256_storeu_si256((__m256i *)(code + 32 * c), _mm256_sub_epi8(_mm256_xor_si256(co, m), m));
    }
}

/* IQ1_S: code = 8·G + δ with G in {-1, 0, 1}, so per group Σ code · q = 8 · Σ (G + 1) · q + (δ − 8) · Σ q: the
 * unsigned G + 1 goes through vpmaddubsw (weighted by 8 · ls in vpmaddwd), Σ q comes from Q8_K's sums of 16 */
T AI __m256i iq1_s_block(const uint8_t *w, const int8_t *q) {
    const __m256i one = _mm256_set1_epi8(1);
    /* per group g (the 16-bit qh of its 32 elements): ls = 2·((qh >> 12) & 7) + 1, δ = ±1 (bit 15) */
    const __m128i qh8 = _mm_loadu_si128((const __m128i *)(w + 34));
    const __m128i ls = _mm_add_epi16(_mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(qh8, 12), _mm_set1_epi16(7)), 1),
                                     _mm_set1_epi16(1));
    const __m128i dm8 = _mm_sub_epi16(_mm_set1_epi16(-7), _mm_and_si128(_mm_srai_epi16(qh8, 15), _mm_set1_epi16(2)));
    /* the offset term ls · (δ − 8) · Σ q of each group (Q8_K's two sums of 16), as lane sums of the block */
    const __m128i m = _mm_mullo_epi16(ls, dm8);
    __m256i acc = _mm256_madd_epi16(_mm256_setr_m128i(_mm_unpacklo_epi16(m, m), _mm_unpackhi_epi16(m, m)),
                                    _mm256_loadu_si256((const __m256i *)((const uint8_t *)q + 256)));
    const __m256i ls8 = _mm256_broadcastsi128_si256(_mm_slli_epi16(ls, 3)); /* 8 · ls, group g in int16 lane g */
    _Pragma("GCC unroll 8")
    for (int g = 0; g < 8; ++g) {
        const uint32_t qh = qs_load_u16(w + 34 + 2 * g);
        const uint8_t *qs = w + 2 + 4 * g;
        const __m256i co = rows64((const uint8_t *)QS_GRID_IQ1_S[qs[0] | (qh & 7) << 8],
                                  (const uint8_t *)QS_GRID_IQ1_S[qs[1] | (qh & 56) << 5],
                                  (const uint8_t *)QS_GRID_IQ1_S[qs[2] | (qh & 448) << 2],
                                  (const uint8_t *)QS_GRID_IQ1_S[qs[3] | (qh & 3584) >> 1]);
        const __m256i p = _mm256_maddubs_epi16(_mm256_add_epi8(co, one), _mm256_loadu_si256((const __m256i *)(q + 32 * g)));
        const __m256i sc = _mm256_shuffle_epi8(ls8, _mm256_set1_epi16((short)(0x0100 + 0x0202 * g)));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, sc));
    }
    return acc;
}

T float qs_dot_iq1_s_avx2(int64_t n, const uint8_t *w, const uint8_t *x) { DOT_BLOCKS4(50, 0.125f, iq1_s_block); }

/* IQ1_M: code = 8·G + δ per row of 8 (δ = ±1 from the row's nibble), scales per 16. With u = 8·(G + 1) + δ + 1
 * (0..18, unsigned for vpmaddubsw), Σ code · q = Σ u · q − 9 · Σ q, the last from Q8_K's sums of 16. */
/* δ + 1 of the four rows of a chunk (bit 3 of each row's nibble set: δ = −1, so 0; else 2) as 32 bytes, by the
 * four bits */
static uint8_t IQ1M_DL[16][32];

__attribute__((constructor)) static void iq1m_dl_init(void) {
    for (int v = 0; v < 16; ++v)
        for (int r = 0; r < 4; ++r)
            for (int e = 0; e < 8; ++e) IQ1M_DL[v][8 * r + e] = (v >> r & 1) ? 0 : 2;
}

T float qs_dot_iq1_m_avx2(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    const __m256i one = _mm256_set1_epi8(1);
    for (int64_t i = 0; i < n / 256; ++i, w += 56, x += 292) {
        const int8_t *q = (const int8_t *)(x + 4);
        uint16_t sw[4];
        for (int k = 0; k < 4; ++k) sw[k] = qs_load_u16(w + 48 + 2 * k);
        const float d = _cvtsh_ss((uint16_t)((sw[0] >> 12) | ((sw[1] >> 8) & 0x00F0) | ((sw[2] >> 4) & 0x0F00) |
                                             (sw[3] & 0xF000))) * 0.125f;
        /* the 16 scales of the groups of 16 (2·l + 1, three bits each, four per word: group 4k + j at bit 3j of
         * word k), built in vectors: each word in four 32-bit lanes, shifted by 0, 3, 6, 9 */
        const __m128i sw8 = _mm_loadl_epi64((const __m128i *)(w + 48));
        const __m256i sh = _mm256_setr_epi32(0, 3, 6, 9, 0, 3, 6, 9), m7 = _mm256_set1_epi32(7);
        const __m256i w01 = _mm256_cvtepu16_epi32(_mm_shuffle_epi8(sw8, _mm_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3,
                                                                                        2, 3, 2, 3)));
        const __m256i w23 = _mm256_cvtepu16_epi32(_mm_shuffle_epi8(sw8, _mm_setr_epi8(4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7,
                                                                                        6, 7, 6, 7)));
        const __m256i l01 = _mm256_and_si256(_mm256_srlv_epi32(w01, sh), m7), l23 = _mm256_and_si256(_mm256_srlv_epi32(w23, sh), m7);
        const __m256i l16 = _mm256_permute4x64_epi64(_mm256_packus_epi32(l01, l23), 0xD8); /* groups 0..15 in order */
        const __m128i lb = _mm_packus_epi16(_mm256_castsi256_si128(l16), _mm256_extracti128_si256(l16, 1));
        const __m128i l8 = _mm_add_epi8(_mm_add_epi8(lb, lb), _mm_set1_epi8(1));
        /* − 9 · Σ l · (Q8_K's sum of 16), as lane sums of the block */
        __m256i acc = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_madd_epi16(
            _mm256_mullo_epi16(_mm256_cvtepu8_epi16(l8), _mm256_set1_epi16(9)), _mm256_loadu_si256((const __m256i *)(x + 260))));
        _Pragma("GCC unroll 8")
        for (int c = 0; c < 8; ++c) { /* rows 4c..4c+3 (elements 32c..32c+31), groups 2c and 2c+1 */
            const uint32_t nb = qs_load_u16(w + 32 + 2 * c); /* the four rows' nibbles */
            const uint8_t *qs = w + 4 * c;
            const __m256i co = rows64((const uint8_t *)QS_GRID_IQ1_S[qs[0] | (nb & 7) << 8],
                                      (const uint8_t *)QS_GRID_IQ1_S[qs[1] | ((nb >> 4) & 7) << 8],
                                      (const uint8_t *)QS_GRID_IQ1_S[qs[2] | ((nb >> 8) & 7) << 8],
                                      (const uint8_t *)QS_GRID_IQ1_S[qs[3] | ((nb >> 12) & 7) << 8]);
            const uint32_t bits = ((nb >> 3) & 1) | ((nb >> 6) & 2) | ((nb >> 9) & 4) | ((nb >> 12) & 8);
            const __m256i dl = _mm256_loadu_si256((const __m256i *)IQ1M_DL[bits]);
            const __m256i u = _mm256_add_epi8(_mm256_slli_epi16(_mm256_add_epi8(co, one), 3), dl);
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(
                _mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)(q + 32 * c))), scales_pair_u8(l8, 2 * c)));
        }
        s = fmaf(d * qs_load_f32(x), (float)hsum8(acc), s);
    }
    return s;
}

/* TQ1_0: base-3 digits (ggml: digit k of byte q is ((q · 3^k mod 256) · 3) >> 8), 16 bytes widened to 16-bit
 * lanes at a time; Σ (t − 1) · q = Σ t · q − Σ q, the last from Q8_K's sums of 16 */
T AI __m256i trits16(__m256i q16, int p3) { /* digit of each 16-bit lane's byte for the power p3 */
    const __m256i x = _mm256_and_si256(_mm256_mullo_epi16(q16, _mm256_set1_epi16((short)p3)), _mm256_set1_epi16(255));
    return _mm256_srli_epi16(_mm256_add_epi16(_mm256_add_epi16(x, x), x), 8);
}

T AI __m256i act16(const int8_t *q) { return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)q)); }

T float qs_dot_tq1_0_avx2(int64_t n, const uint8_t *w, const uint8_t *x) {
    static const int P3[5] = {1, 3, 9, 27, 81};
    float s = 0.0f;
    for (int64_t i = 0; i < n / 256; ++i, w += 54, x += 292) {
        const int8_t *q = (const int8_t *)(x + 4);
        __m256i acc = _mm256_setzero_si256();
        _Pragma("GCC unroll 2")
        for (int h = 0; h < 2; ++h) { /* bytes 16h..16h+15: elements 32k + 16h + j */
            const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(w + 16 * h)));
            _Pragma("GCC unroll 5")
            for (int k = 0; k < 5; ++k)
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(trits16(b, P3[k]), act16(q + 32 * k + 16 * h)));
        }
        const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(w + 32))); /* 160 + 16k + j */
        _Pragma("GCC unroll 5")
        for (int k = 0; k < 5; ++k)
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(trits16(b, P3[k]), act16(q + 160 + 16 * k)));
        int32_t isum = hsum8(acc);
        for (int k = 0; k < 4; ++k) /* qh: elements 240 + 4k + j */
            for (int j = 0; j < 4; ++j)
                isum += (int32_t)((((unsigned)(uint8_t)(w[48 + j] * P3[k])) * 3u) >> 8) * q[240 + 4 * k + j];
        int32_t bs = 0;
        for (int g = 0; g < 16; ++g) bs += (int16_t)qs_load_u16(x + 260 + 2 * g);
        s = fmaf(f16(w + 52) * qs_load_f32(x), (float)(isum - bs), s);
    }
    return s;
}

/* MXFP4 / NVFP4 x Q8_0: E2M1 codes to their doubled integer values by one byte shuffle, then signed products */
T AI __m128i fp4_values(__m128i nibbles) {
    const __m128i book = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    return _mm_shuffle_epi8(book, nibbles);
}

T AI __m256i signed_sums(__m256i c, const int8_t *q) { /* 8 int32 partial sums of c · q, c and q signed */
    const __m256i v = _mm256_loadu_si256((const __m256i *)q);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(c, c), _mm256_sign_epi8(v, c)),
                             _mm256_set1_epi16(1));
}



T AI __m256i mxfp4_sums(const uint8_t *w, const uint8_t *x) { /* one block's 8 lane sums */
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m128i qv = _mm_loadu_si128((const __m128i *)(w + 1));
    const __m256i c = _mm256_set_m128i(fp4_values(_mm_and_si128(_mm_srli_epi16(qv, 4), m4)),
                                       fp4_values(_mm_and_si128(qv, m4)));
    return signed_sums(c, (const int8_t *)(x + 2));
}

/* Four blocks at a time: their integer sums by one reduction, then the per-block fma in order (the same bits as one
 * block at a time) */
T float qs_dot_mxfp4_avx2(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    const int64_t nb = n / 32;
    int64_t i = 0;
    for (; i + 4 <= nb; i += 4, w += 4 * 17, x += 4 * 34) {
        int32_t is[4];
        _mm_storeu_si128((__m128i *)is, hsum8x4(mxfp4_sums(w, x), mxfp4_sums(w + 17, x + 34), mxfp4_sums(w + 34, x + 68),
                                                mxfp4_sums(w + 51, x + 102)));
        for (int j = 0; j < 4; ++j) s = fmaf(qs_e8m0_half(w[17 * j]) * f16(x + 34 * j), (float)is[j], s);
    }
    for (; i < nb; ++i, w += 17, x += 34) s = fmaf(qs_e8m0_half(w[0]) * f16(x), (float)hsum8(mxfp4_sums(w, x)), s);
    return s;
}

T float qs_dot_nvfp4_avx2(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    const __m128i m4 = _mm_set1_epi8(0x0F);
    for (int64_t i = 0; i < n / 64; ++i, w += 36) {
        for (int h = 0; h < 2; ++h) { /* two Q8_0 blocks, two 16-element groups each */
            const uint8_t *xb = x + 34 * (2 * i + h);
            const __m128i qv = _mm_loadu_si128((const __m128i *)(w + 4 + 16 * h)); /* groups 2h, 2h+1 */
            const __m128i lo = _mm_and_si128(qv, m4), hi = _mm_and_si128(_mm_srli_epi16(qv, 4), m4);
            /* per group: 8 low nibbles (elements 0-7), then 8 high (8-15) */
            const __m128i g0 = _mm_unpacklo_epi64(lo, hi), g1 = _mm_unpackhi_epi64(lo, hi);
            const __m256i p = signed_sums(_mm256_set_m128i(fp4_values(g1), fp4_values(g0)), (const int8_t *)(xb + 2));
            const float dx = f16(xb);
            s = fmaf(qs_ue4m3_half(w[2 * h]) * dx, (float)hsum4(_mm256_castsi256_si128(p)), s);
            s = fmaf(qs_ue4m3_half(w[2 * h + 1]) * dx, (float)hsum4(_mm256_extracti128_si256(p, 1)), s);
        }
    }
    return s;
}

T float qs_dot_tq2_0_avx2(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    const __m256i m3 = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
    for (int64_t i = 0; i < n / 256; ++i, w += 66, x += 292) {
        const int8_t *q = (const int8_t *)(x + 4);
        __m256i acc = _mm256_setzero_si256();
        for (int h = 0; h < 2; ++h) {
            const __m256i qv = _mm256_loadu_si256((const __m256i *)(w + 32 * h));
            for (int k = 0; k < 4; ++k) {
                const __m256i c = _mm256_and_si256(_mm256_srli_epi16(qv, 2 * k), m3); /* t in 0..2 */
                const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 128 * h + 32 * k));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(c, v), ones));
            }
        }
        int32_t bs = 0; /* Σ (t − 1)·q = Σ t·q − Σ q */
        for (int g = 0; g < 16; ++g) bs += (int16_t)qs_load_u16(x + 260 + 2 * g);
        s = fmaf(f16(w + 64) * qs_load_f32(x), (float)(hsum8(acc) - bs), s);
    }
    return s;
}

#endif /* QS_ARCH_X86 */
