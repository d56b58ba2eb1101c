/* Helpers shared by the AVX2 and AVX-512 kernel files (x86 only: included after <immintrin.h> and qs.h). */
#ifndef QS_SIMD_COMMON_H
#define QS_SIMD_COMMON_H

QS_TARGET_AVX2 static inline float f16at(const uint8_t *p) { return _cvtsh_ss(qs_load_u16(p)); } /* F16C */

QS_TARGET_AVX2 static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 16 bytes -> 32 codes: low nibbles (elements 0..15), then high nibbles (16..31). */
QS_TARGET_AVX2 static inline __m256i nibbles_32(const uint8_t *p) {
    __m128i t = _mm_loadu_si128((const __m128i *)p);
    __m128i m = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(t, 4), m), _mm_and_si128(t, m));
}

/* Q6_K half h (128 elements) -> four vectors of 32 six-bit codes (0..63), element order 32k + l. */
QS_TARGET_AVX2 static inline void q6k_half_codes(const uint8_t *blk, int h, __m256i q[4]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    const uint8_t *ql = blk + 64 * h;
    __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
    __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
    __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
    q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
    q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4));
}

#endif
