/* AVX-512 dot products of the lattice i-quants against Q8_K (docs/quant-formats.md, "I-quants"): two 32-element
 * groups per step. The code-book rows are gathered by index vector (vpgatherdd for the 4-byte IQ3 rows,
 * vpgatherqq with 32-bit indices for the 8-byte IQ2 rows); the 64 sign bits of the two groups become one mask
 * register, and the activations are negated under it (IQ2_S / IQ3_S store the sign bits as they are, the others
 * as ggml's 7-bit words whose eighth bit is the parity). vpmaddubsw, then vpmaddwd against the groups' integer
 * scales, give the block's exact integer sum, and the float work is the scalar reference's
 * (qs_iq_dot_codes_scalar): the same bits as the scalar and AVX2 kernels. */
#include <immintrin.h>
#include <math.h>

#include "qs.h"
#include "qs_iq_grids.h"
#include "qs_quant_internal.h"

#define T QS_TARGET_AVX512
#define AI __attribute__((always_inline)) static inline

T AI float f16(const uint8_t *p) { return _cvtsh_ss(qs_load_u16(p)); }

/* the activations of elements e (64 of them) negated where bit e of `neg` is set, times the unsigned coordinates,
 * times the int16 scales: 16 int32 partial sums */
T AI __m512i step_sums(__m512i coords, const int8_t *q, __mmask64 neg, __m512i sc) {
    const __m512i v = _mm512_loadu_si512((const void *)q);
    const __m512i a = _mm512_mask_sub_epi8(v, neg, _mm512_setzero_si512(), v);
    return _mm512_madd_epi16(_mm512_maddubs_epi16(coords, a), sc);
}

/* scale 2 sc + 1 per 256-bit half (two groups of 32) or per 128-bit lane (four groups of 16) */
T AI __m512i scales_32(int a, int b) {
    return _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * a + 1)), _mm256_set1_epi16((short)(2 * b + 1)), 1);
}
T AI __m512i scales_16(uint8_t s01, uint8_t s23) { /* nibbles: groups 0, 1 in s01, 2, 3 in s23 */
    const __m256i lo = _mm256_set_m128i(_mm_set1_epi16((short)(2 * (s01 >> 4) + 1)), _mm_set1_epi16((short)(2 * (s01 & 15) + 1)));
    const __m256i hi = _mm256_set_m128i(_mm_set1_epi16((short)(2 * (s23 >> 4) + 1)), _mm_set1_epi16((short)(2 * (s23 & 15) + 1)));
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* eight of ggml's 7-bit sign words (bits 7i.. of w0 for i < 4, of w1 for the rest) as 64 sign bits */
T AI __mmask64 ksigns8(uint32_t w0, uint32_t w1) {
    uint64_t m = 0;
    for (int i = 0; i < 4; ++i) {
        m |= (uint64_t)qs_ksign(w0 >> (7 * i)) << (8 * i);
        m |= (uint64_t)qs_ksign(w1 >> (7 * i)) << (8 * i + 32);
    }
    return (__mmask64)m;
}

T AI float block_end(float s, float mult, const uint8_t *x, __m512i acc) {
    return fmaf(mult * qs_load_f32(x), (float)_mm512_reduce_add_epi32(acc), s);
}

T float qs_dot_iq2_xxs_avx512(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    for (int64_t i = 0; i < n / 256; ++i, w += 66, x += 292) {
        const int8_t *q = (const int8_t *)(x + 4);
        __m512i acc = _mm512_setzero_si512();
        for (int g = 0; g < 8; g += 2) {
            const uint8_t *b = w + 2 + 8 * g; /* per group: 4 index bytes, then the signs and scale word */
            const uint32_t a0 = qs_load_u32(b + 4), a1 = qs_load_u32(b + 12);
            const __m128i ib = _mm_cvtsi64_si128((long long)(qs_load_u32(b) | (uint64_t)qs_load_u32(b + 8) << 32));
            const __m512i co = _mm512_i32gather_epi64(_mm256_cvtepu8_epi32(ib), (const void *)QS_GRID_IQ2_XXS, 8);
            acc = _mm512_add_epi32(acc, step_sums(co, q + 32 * g, ksigns8(a0, a1), scales_32((int)(a0 >> 28), (int)(a1 >> 28))));
        }
        s = block_end(s, f16(w) * 0.125f, x, acc);
    }
    return s;
}

T float qs_dot_iq2_xs_avx512(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    const __m256i m511 = _mm256_set1_epi32(511);
    for (int64_t i = 0; i < n / 256; ++i, w += 74, x += 292) {
        const int8_t *q = (const int8_t *)(x + 4);
        __m512i acc = _mm512_setzero_si512();
        for (int c = 0; c < 8; c += 2) {
            const __m128i e = _mm_loadu_si128((const __m128i *)(w + 2 + 8 * c)); /* 8 entries: 9-bit index, 7 signs */
            const __m512i co = _mm512_i32gather_epi64(_mm256_and_si256(_mm256_cvtepu16_epi32(e), m511),
                                                      (const void *)QS_GRID_IQ2_XS, 8);
            const __m128i sw = _mm_srli_epi16(e, 9); /* the 8 sign words */
            uint64_t m = 0;
            uint16_t v[8];
            _mm_storeu_si128((__m128i *)v, sw);
            for (int k = 0; k < 8; ++k) m |= (uint64_t)qs_ksign(v[k]) << (8 * k);
            acc = _mm512_add_epi32(acc, step_sums(co, q + 32 * c, (__mmask64)m, scales_16(w[66 + c], w[67 + c])));
        }
        s = block_end(s, f16(w) * 0.125f, x, acc);
    }
    return s;
}

T float qs_dot_iq2_s_avx512(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    const __m256i sh = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14), m3 = _mm256_set1_epi32(3);
    for (int64_t i = 0; i < n / 256; ++i, w += 82, x += 292) {
        const int8_t *q = (const int8_t *)(x + 4);
        __m512i acc = _mm512_setzero_si512();
        for (int c = 0; c < 8; c += 2) {
            /* 8 indices: low bytes at 2 + 4c, two high bits each from qh bytes 66 + c, 67 + c */
            const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(w + 2 + 4 * c)));
            const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(qs_load_u16(w + 66 + c)), sh), m3);
            const __m512i co = _mm512_i32gather_epi64(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 8)),
                                                      (const void *)QS_GRID_IQ2_S, 8);
            acc = _mm512_add_epi32(acc, step_sums(co, q + 32 * c, (__mmask64)qs_load_u64(w + 34 + 4 * c),
                                                  scales_16(w[74 + c], w[75 + c])));
        }
        s = block_end(s, f16(w) * 0.125f, x, acc);
    }
    return s;
}

T float qs_dot_iq3_xxs_avx512(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    for (int64_t i = 0; i < n / 256; ++i, w += 98, x += 292) {
        const int8_t *q = (const int8_t *)(x + 4);
        __m512i acc = _mm512_setzero_si512();
        for (int g = 0; g < 8; g += 2) {
            const uint32_t a0 = qs_load_u32(w + 66 + 4 * g), a1 = qs_load_u32(w + 70 + 4 * g);
            const __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(w + 2 + 8 * g)));
            const __m512i co = _mm512_i32gather_epi32(idx, (const void *)QS_GRID_IQ3_XXS, 4);
            acc = _mm512_add_epi32(acc, step_sums(co, q + 32 * g, ksigns8(a0, a1), scales_32((int)(a0 >> 28), (int)(a1 >> 28))));
        }
        s = block_end(s, f16(w) * 0.25f, x, acc);
    }
    return s;
}

T float qs_dot_iq3_s_avx512(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i one = _mm512_set1_epi32(1);
    for (int64_t i = 0; i < n / 256; ++i, w += 110, x += 292) {
        const int8_t *q = (const int8_t *)(x + 4);
        __m512i acc = _mm512_setzero_si512();
        for (int g = 0; g < 8; g += 2) {
            /* 16 indices: low bytes at 2 + 8g, the ninth bit of index k at bit k of the qh pair 66 + g */
            const __m512i lo = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(w + 2 + 8 * g)));
            const __m512i hi = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(qs_load_u16(w + 66 + g)), lane), one);
            const __m512i co = _mm512_i32gather_epi32(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 8)), (const void *)QS_GRID_IQ3_S, 4);
            const uint8_t sc = w[106 + g / 2];
            acc = _mm512_add_epi32(acc, step_sums(co, q + 32 * g, (__mmask64)qs_load_u64(w + 74 + 4 * g),
                                                  scales_32(sc & 15, sc >> 4)));
        }
        s = block_end(s, f16(w), x, acc);
    }
    return s;
}
