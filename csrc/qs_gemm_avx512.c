/* AVX-512 VNNI tile kernel of the prefill GEMM (qs_gemm.h): 4 decoded weight rows x 4 prepared activation columns
 * per step, 64 elements per vpdpbusd, 16 float accumulators in registers. */
#include "qs_arch.h"
#if QS_ARCH_X86
#include <immintrin.h>

#include "qs.h"
#include "qs_gemm.h"

#define T QS_TARGET_AVX512

/* Horizontal sums of four vectors -> [sum a, sum b, sum c, sum d]. */
T static inline __m128 hsum4x16(__m512 a, __m512 b, __m512 c, __m512 d) {
    __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
    __m256 b8 = _mm256_add_ps(_mm512_castps512_ps256(b), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(b), 1)));
    __m256 c8 = _mm256_add_ps(_mm512_castps512_ps256(c), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(c), 1)));
    __m256 d8 = _mm256_add_ps(_mm512_castps512_ps256(d), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(d), 1)));
    __m256 ab = _mm256_hadd_ps(a8, b8), cd = _mm256_hadd_ps(c8, d8);
    __m256 abcd = _mm256_hadd_ps(ab, cd); /* per 128-bit half: a, b, c, d partials */
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

T void qs_gemm_tile_avx512(const qs_gemm_dims *d, const uint8_t *wc, const float *ws, const float *mrow,
                           const int8_t *xc, const float *xs, const float *bcol, int64_t n_c, int64_t n_valid,
                           int n_r, float *y, int64_t ldy) {
    const int64_t k64 = d->k64, nl = d->nl, ngp = d->ngp, nch = k64 / 64;
    const uint8_t *w0p = wc, *w1p = wc + k64, *w2p = wc + 2 * k64, *w3p = wc + 3 * k64;
    const float *s0p = ws, *s1p = ws + nl, *s2p = ws + 2 * nl, *s3p = ws + 3 * nl;
    for (int64_t c0 = 0; c0 < n_c; c0 += 4) {
        __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00,
               a13 = a00, a20 = a00, a21 = a00, a22 = a00, a23 = a00, a30 = a00, a31 = a00, a32 = a00, a33 = a00;
        const int8_t *xb = xc + c0 * k64;
        const float *sb = xs + c0 * nl;
        for (int64_t ch = 0; ch < nch; ++ch) {
            const __m512i w0 = _mm512_load_si512((const void *)(w0p + 64 * ch));
            const __m512i w1 = _mm512_load_si512((const void *)(w1p + 64 * ch));
            const __m512i w2 = _mm512_load_si512((const void *)(w2p + 64 * ch));
            const __m512i w3 = _mm512_load_si512((const void *)(w3p + 64 * ch));
            const __m512 s0 = _mm512_load_ps(s0p + 16 * ch), s1 = _mm512_load_ps(s1p + 16 * ch);
            const __m512 s2 = _mm512_load_ps(s2p + 16 * ch), s3 = _mm512_load_ps(s3p + 16 * ch);
#define QS_COL(c, A0, A1, A2, A3)                                                                               \
            do {                                                                                                \
                const __m512i xv = _mm512_load_si512((const void *)(xb + (c) * k64 + 64 * ch));                  \
                const __m512 xsv = _mm512_load_ps(sb + (c) * nl + 16 * ch);                                      \
                const __m512i z = _mm512_setzero_si512();                                                        \
                A0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(z, w0, xv)), _mm512_mul_ps(s0, xsv), A0); \
                A1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(z, w1, xv)), _mm512_mul_ps(s1, xsv), A1); \
                A2 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(z, w2, xv)), _mm512_mul_ps(s2, xsv), A2); \
                A3 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(z, w3, xv)), _mm512_mul_ps(s3, xsv), A3); \
            } while (0)
            QS_COL(0, a00, a10, a20, a30);
            QS_COL(1, a01, a11, a21, a31);
            QS_COL(2, a02, a12, a22, a32);
            QS_COL(3, a03, a13, a23, a33);
#undef QS_COL
        }
        const float *bb = bcol + c0 * ngp;
        for (int64_t g = 0; g < ngp; g += 16) {
            const __m512 m0 = _mm512_load_ps(mrow + g), m1 = _mm512_load_ps(mrow + ngp + g);
            const __m512 m2 = _mm512_load_ps(mrow + 2 * ngp + g), m3 = _mm512_load_ps(mrow + 3 * ngp + g);
#define QS_MIN(c, A0, A1, A2, A3)                                                                               \
            do {                                                                                                \
                const __m512 b = _mm512_load_ps(bb + (c) * ngp + g);                                            \
                A0 = _mm512_fnmadd_ps(m0, b, A0);                                                               \
                A1 = _mm512_fnmadd_ps(m1, b, A1);                                                               \
                A2 = _mm512_fnmadd_ps(m2, b, A2);                                                               \
                A3 = _mm512_fnmadd_ps(m3, b, A3);                                                               \
            } while (0)
            QS_MIN(0, a00, a10, a20, a30);
            QS_MIN(1, a01, a11, a21, a31);
            QS_MIN(2, a02, a12, a22, a32);
            QS_MIN(3, a03, a13, a23, a33);
#undef QS_MIN
        }
        __m128 v[4] = {hsum4x16(a00, a10, a20, a30), hsum4x16(a01, a11, a21, a31), hsum4x16(a02, a12, a22, a32),
                       hsum4x16(a03, a13, a23, a33)};
        for (int c = 0; c < 4 && c0 + c < n_valid; ++c) {
            float *yc = y + (c0 + c) * ldy;
            if (n_r == 4) {
                _mm_storeu_ps(yc, v[c]);
            } else {
                float t[4];
                _mm_storeu_ps(t, v[c]);
                for (int r = 0; r < n_r; ++r) yc[r] = t[r];
            }
        }
    }
}

#endif /* QS_ARCH_X86 */
