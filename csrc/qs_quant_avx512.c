/* AVX-512 (F/BW/VL) + VNNI variants of the quantized dot products.
 * K-quants: 64 elements (two sub-blocks) per 512-bit register, scales applied in the integer domain with
 * vpdpwssd, one float FMA per super-block. 32-element formats: vpdpbusd on 256-bit registers. */
#include "qs_arch.h"
#if QS_ARCH_X86
#include <immintrin.h>

#include "qs.h"
#include "qs_quant_internal.h"
#include "qs_simd_common.h"

#define T QS_TARGET_AVX512

/* sum over 32 bytes of u8 q * s8 x, minus off * sum(x) -> 8 int32 lanes */
T static inline __m256i dot_u8_s8_off(__m256i q, __m256i x, int off) {
    __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, x);
    if (off) p = _mm256_sub_epi32(p, _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8((char)off), x));
    return p;
}

T float qs_dot_q8_0_avx512(int64_t n, const uint8_t *w, const uint8_t *x) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 32; ++i, w += 34, x += 34) {
        __m256i qw = _mm256_loadu_si256((const __m256i *)(w + 2));
        __m256i qx = _mm256_loadu_si256((const __m256i *)(x + 2));
        __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(qw, qw), _mm256_sign_epi8(qx, qw));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16at(w) * f16at(x)), _mm256_cvtepi32_ps(p), acc);
    }
    return hsum256(acc);
}

T float qs_dot_q4_0_avx512(int64_t n, const uint8_t *w, const uint8_t *x) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 32; ++i, w += 18, x += 34) {
        __m256i p = dot_u8_s8_off(nibbles_32(w + 2), _mm256_loadu_si256((const __m256i *)(x + 2)), 8);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16at(w) * f16at(x)), _mm256_cvtepi32_ps(p), acc);
    }
    return hsum256(acc);
}

T float qs_dot_q5_0_avx512(int64_t n, const uint8_t *w, const uint8_t *x) {
    __m256 acc = _mm256_setzero_ps();
    const __m256i b16 = _mm256_set1_epi8(16);
    for (int64_t i = 0; i < n / 32; ++i, w += 22, x += 34) {
        __m256i hi = _mm256_maskz_mov_epi8((__mmask32)qs_load_u32(w + 2), b16);
        __m256i q = _mm256_or_si256(nibbles_32(w + 6), hi);
        __m256i p = dot_u8_s8_off(q, _mm256_loadu_si256((const __m256i *)(x + 2)), 16);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16at(w) * f16at(x)), _mm256_cvtepi32_ps(p), acc);
    }
    return hsum256(acc);
}

T float qs_dot_q4_1_avx512(int64_t n, const uint8_t *w, const uint8_t *x) {
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (int64_t i = 0; i < n / 32; ++i, w += 20, x += 36) {
        summs += f16at(w + 2) * f16at(x + 2);
        __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), nibbles_32(w + 4),
                                        _mm256_loadu_si256((const __m256i *)(x + 4)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16at(w) * f16at(x)), _mm256_cvtepi32_ps(p), acc);
    }
    return hsum256(acc) + summs;
}

static const int16_t K4_IDX[4][32] __attribute__((aligned(64))) = {
    {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
    {2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5},
    {6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7},
};

T float qs_dot_q4_K_avx512(int64_t n, const uint8_t *w, const uint8_t *x) {
    __m512 acc = _mm512_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i i0 = _mm512_load_si512((const void *)K4_IDX[0]), i1 = _mm512_load_si512((const void *)K4_IDX[1]);
    const __m512i i2 = _mm512_load_si512((const void *)K4_IDX[2]), i3 = _mm512_load_si512((const void *)K4_IDX[3]);
    for (int64_t i = 0; i < n / 256; ++i, w += 144, x += 292) {
        uint32_t u[4];
        k4_scales_mins(w + 4, u);
        __m256i sm16 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)u)); /* sc0..7, m0..7 */
        __m256i bs = _mm256_loadu_si256((const __m256i *)(x + 260));
        __m128i bsp = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
        __m128i mprod = _mm_madd_epi16(_mm256_extracti128_si256(sm16, 1), bsp);
        __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128((int)qs_load_u32(w))); /* d, dmin */
        __m128 d8 = _mm_set1_ps(qs_load_f32(x));
        __m128 dd8 = _mm_mul_ps(dd, d8);
        accm = _mm_fmadd_ps(_mm_shuffle_ps(dd8, dd8, 0x55), _mm_cvtepi32_ps(mprod), accm);
        __m512i sc512 = _mm512_castsi256_si512(sm16);
        const uint8_t *qs = w + 16;
        const uint8_t *q8 = x + 4;
        __m512i sumi = _mm512_setzero_si512();
#define Q4K_STEP(c, idx)                                                                                         \
        do {                                                                                                     \
            __m256i q4 = _mm256_loadu_si256((const __m256i *)(qs + 32 * (c)));                                  \
            __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(q4), _mm256_srli_epi16(q4, 4), 1);            \
            __m512i p = _mm512_maddubs_epi16(_mm512_and_si512(v, m4), _mm512_loadu_si512((const void *)(q8 + 64 * (c)))); \
            sumi = _mm512_dpwssd_epi32(sumi, p, _mm512_permutexvar_epi16(idx, sc512));                          \
        } while (0)
        Q4K_STEP(0, i0);
        Q4K_STEP(1, i1);
        Q4K_STEP(2, i2);
        Q4K_STEP(3, i3);
#undef Q4K_STEP
        acc = _mm512_fmadd_ps(_mm512_set1_ps(_mm_cvtss_f32(dd8)), _mm512_cvtepi32_ps(sumi), acc);
    }
    __m128 m = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    return _mm512_reduce_add_ps(acc) - _mm_cvtss_f32(m);
}

T float qs_dot_q6_K_avx512(int64_t n, const uint8_t *w, const uint8_t *x) {
    __m512 acc = _mm512_setzero_ps();

    /* lane i of a 64-element register (32 int16 pairs) belongs to scale group base + i/8 */
    __m512i idx[4];
    for (int k = 0; k < 4; ++k) {
        int16_t v[32];
        for (int i = 0; i < 32; ++i) v[i] = (int16_t)(4 * k + i / 8);
        idx[k] = _mm512_loadu_si512((const void *)v);
    }
    for (int64_t i = 0; i < n / 256; ++i, w += 210, x += 292) {
        const uint8_t *q8 = x + 4;
        __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 192)));
        __m512i sc512 = _mm512_castsi256_si512(sc16);
        __m256i off = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)(x + 260)));
        __m512i sumi = _mm512_setzero_si512();
        for (int h = 0; h < 2; ++h) {
            __m256i qv[4];
            q6k_half_codes(w, h, qv);
            __m256i q0 = qv[0], q1 = qv[1], q2 = qv[2], q3 = qv[3];
            __m512i z0 = _mm512_inserti64x4(_mm512_castsi256_si512(q0), q1, 1);
            __m512i z1 = _mm512_inserti64x4(_mm512_castsi256_si512(q2), q3, 1);
            __m512i p0 = _mm512_maddubs_epi16(z0, _mm512_loadu_si512((const void *)(q8 + 128 * h)));
            __m512i p1 = _mm512_maddubs_epi16(z1, _mm512_loadu_si512((const void *)(q8 + 128 * h + 64)));
            __m512i s0 = _mm512_permutexvar_epi16(idx[2 * h], sc512);
            __m512i s1 = _mm512_permutexvar_epi16(idx[2 * h + 1], sc512);
            sumi = _mm512_dpwssd_epi32(sumi, p0, s0);
            sumi = _mm512_dpwssd_epi32(sumi, p1, s1);
        }
        __m512i offz = _mm512_castsi256_si512(_mm256_slli_epi32(off, 5));
        offz = _mm512_inserti64x4(offz, _mm256_setzero_si256(), 1);
        sumi = _mm512_sub_epi32(sumi, offz);
        acc = _mm512_fmadd_ps(_mm512_set1_ps(f16at(w + 208) * qs_load_f32(x)), _mm512_cvtepi32_ps(sumi), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

#endif /* QS_ARCH_X86 */
