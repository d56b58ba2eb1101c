/* AVX-512 (F/BW/VL) + VNNI variants of the quantized dot products.
 * K-quants: 64 elements (two sub-blocks) per 512-bit register, scales applied in the integer domain with
 * vpdpwssd, one float FMA per super-block. 32-element formats: vpdpbusd on 256-bit registers. */
#include <immintrin.h>

#include "qs.h"
#include "qs_quant_internal.h"

#define T QS_TARGET_AVX512

static inline float f16at(const uint8_t *p) { return qs_fp16_to_fp32(qs_load_u16(p)); }

T static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

T static inline __m256i nibbles_32(const uint8_t *p) {
    __m128i t = _mm_loadu_si128((const __m128i *)p);
    __m128i m = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(t, 4), m), _mm_and_si128(t, m));
}

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

T float qs_dot_q4_K_avx512(int64_t n, const uint8_t *w, const uint8_t *x) {
    __m512 acc = _mm512_setzero_ps();
    float mins = 0.0f;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int64_t i = 0; i < n / 256; ++i, w += 144, x += 292) {
        const uint8_t *s = w + 4;
        uint32_t sc[8], mn[8];
        for (int j = 0; j < 4; ++j) {
            sc[j] = s[j] & 63;
            mn[j] = s[j + 4] & 63;
            sc[j + 4] = (uint32_t)((s[j + 8] & 15) | ((s[j] >> 6) << 4));
            mn[j + 4] = (uint32_t)((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4));
        }
        /* min term from the activation's 16-element sums */
        __m256i bs = _mm256_loadu_si256((const __m256i *)(x + 260));
        __m256i bs2 = _mm256_madd_epi16(bs, _mm256_set1_epi16(1)); /* 8 sums of 32 */
        __m256i mv = _mm256_loadu_si256((const __m256i *)mn);
        __m256i prod = _mm256_mullo_epi32(bs2, mv);
        __m128i t = _mm_add_epi32(_mm256_castsi256_si128(prod), _mm256_extracti128_si256(prod, 1));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
        float d8 = qs_load_f32(x);
        mins += f16at(w + 2) * d8 * (float)_mm_cvtsi128_si32(t);

        const uint8_t *qs = w + 16;
        const uint8_t *q8 = x + 4;
        __m512i sumi = _mm512_setzero_si512();
        for (int c = 0; c < 4; ++c) {
            __m256i q4 = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
            __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(q4), _mm256_srli_epi16(q4, 4), 1);
            v = _mm512_and_si512(v, m4);
            __m512i p = _mm512_maddubs_epi16(v, _mm512_loadu_si512((const void *)(q8 + 64 * c)));
            __m512i scl = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)sc[2 * c])),
                                             _mm256_set1_epi16((short)sc[2 * c + 1]), 1);
            sumi = _mm512_dpwssd_epi32(sumi, p, scl);
        }
        acc = _mm512_fmadd_ps(_mm512_set1_ps(f16at(w) * d8), _mm512_cvtepi32_ps(sumi), acc);
    }
    return _mm512_reduce_add_ps(acc) - mins;
}

T float qs_dot_q6_K_avx512(int64_t n, const uint8_t *w, const uint8_t *x) {
    __m512 acc = _mm512_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
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
            const uint8_t *ql = w + 64 * h;
            __m256i qh = _mm256_loadu_si256((const __m256i *)(w + 128 + 32 * h));
            __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            __m256i q0 = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
            __m256i q1 = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4));
            __m256i q2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4));
            __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4));
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
