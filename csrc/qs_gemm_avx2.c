/* AVX2 tile kernel of the prefill GEMM (qs_gemm.h), for CPUs without AVX-512 VNNI: 2 decoded weight rows x 4
 * prepared activation columns per pass (16 ymm registers), 32 elements per vpmaddubsw + vpmaddwd. Codes must be
 * at most 63 (vpmaddubsw saturates at 2 * 255 * 127): Q8_0 weights (codes up to 255) are not routed here. */
#include "qs_arch.h"
#if QS_ARCH_X86
#include <immintrin.h>

#include "qs.h"
#include "qs_gemm.h"
#include "qs_quant_internal.h"
#include "qs_simd_common.h"

#define T QS_TARGET_AVX2

T void qs_gemm_tile_avx2(const qs_gemm_dims *d, const uint8_t *wc, const float *ws, const float *mrow,
                         const int8_t *xc, const float *xs, const float *bcol, int64_t n_c, int64_t n_valid, int n_r,
                         float *y, int64_t ldy) {
    const int64_t k64 = d->k64, nl = d->nl, ngp = d->ngp, nch = k64 / 32;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int rp = 0; rp < n_r; rp += 2) {
        const uint8_t *w0p = wc + rp * k64, *w1p = w0p + k64;
        const float *s0p = ws + rp * nl, *s1p = s0p + nl;
        const float *m0p = mrow + rp * ngp, *m1p = m0p + ngp;
        for (int64_t c0 = 0; c0 < n_c; c0 += 4) {
            __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00,
                   a13 = a00;
            const int8_t *xb = xc + c0 * k64;
            const float *sb = xs + c0 * nl;
            for (int64_t ch = 0; ch < nch; ++ch) {
                const __m256i w0 = _mm256_load_si256((const __m256i *)(w0p + 32 * ch));
                const __m256i w1 = _mm256_load_si256((const __m256i *)(w1p + 32 * ch));
#define QS_COL(c, A0, A1)                                                                                       \
                do {                                                                                            \
                    const __m256i xv = _mm256_load_si256((const __m256i *)(xb + (c) * k64 + 32 * ch));           \
                    const __m256 xsv = _mm256_load_ps(sb + (c) * nl + 8 * ch);                                   \
                    __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(w0, xv), ones);                          \
                    __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(w1, xv), ones);                          \
                    A0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_mul_ps(_mm256_load_ps(s0p + 8 * ch), xsv), A0); \
                    A1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_mul_ps(_mm256_load_ps(s1p + 8 * ch), xsv), A1); \
                } while (0)
                QS_COL(0, a00, a10);
                QS_COL(1, a01, a11);
                QS_COL(2, a02, a12);
                QS_COL(3, a03, a13);
#undef QS_COL
            }
            const float *bb = bcol + c0 * ngp;
            for (int64_t g = 0; g < ngp; g += 8) {
                const __m256 m0 = _mm256_load_ps(m0p + g), m1 = _mm256_load_ps(m1p + g);
#define QS_MIN(c, A0, A1)                                                                                       \
                do {                                                                                            \
                    const __m256 b = _mm256_load_ps(bb + (c) * ngp + g);                                        \
                    A0 = _mm256_fnmadd_ps(m0, b, A0);                                                           \
                    A1 = _mm256_fnmadd_ps(m1, b, A1);                                                           \
                } while (0)
                QS_MIN(0, a00, a10);
                QS_MIN(1, a01, a11);
                QS_MIN(2, a02, a12);
                QS_MIN(3, a03, a13);
#undef QS_MIN
            }
            const float v0[4] = {hsum256(a00), hsum256(a01), hsum256(a02), hsum256(a03)};
            const float v1[4] = {hsum256(a10), hsum256(a11), hsum256(a12), hsum256(a13)};
            for (int c = 0; c < 4 && c0 + c < n_valid; ++c) {
                y[(c0 + c) * ldy + rp] = v0[c];
                if (rp + 1 < n_r) y[(c0 + c) * ldy + rp + 1] = v1[c];
            }
        }
    }
}

/* ---------------------------------------------------------------- weight-row decoders (AVX2; also used at the
 * AVX-512 level, where decoding is a few % of the GEMM), bit-identical to the scalar ones in qs_gemm.c */
/* 32 bits -> 32 bytes: byte j = 16 if bit j of qh is set, else 0 */
T static inline __m256i bit16_bytes(uint32_t qh) {
    const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2,
                                          3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), pick);
    __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(16));
}

T void qs_gemm_panel_q5_0_avx2(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
    for (int64_t b = 0; b < d->k / 32; ++b, w += 22) {
        __m256i q = _mm256_or_si256(nibbles_32(w + 6), bit16_bytes(qs_load_u32(w + 2)));
        _mm256_storeu_si256((__m256i *)(c + 32 * b), q);
        float s = f16at(w);
        _mm256_storeu_ps(ws + 8 * b, _mm256_set1_ps(s));
        mrow[b] = 16.0f * s;
    }
    qs_gemm_zero_tail(d, c, ws, mrow);
}

T void qs_gemm_panel_q8_0_avx2(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    for (int64_t b = 0; b < d->k / 32; ++b, w += 34) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(w + 2));
        _mm256_storeu_si256((__m256i *)(c + 32 * b), _mm256_xor_si256(q, flip)); /* s8 + 128 */
        float s = f16at(w);
        _mm256_storeu_ps(ws + 8 * b, _mm256_set1_ps(s));
        mrow[b] = 128.0f * s;
    }
    qs_gemm_zero_tail(d, c, ws, mrow);
}

T void qs_gemm_panel_q4_0_avx2(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
    for (int64_t b = 0; b < d->k / 32; ++b, w += 18) {
        _mm256_storeu_si256((__m256i *)(c + 32 * b), nibbles_32(w + 2));
        float s = f16at(w);
        _mm256_storeu_ps(ws + 8 * b, _mm256_set1_ps(s));
        mrow[b] = 8.0f * s;
    }
    qs_gemm_zero_tail(d, c, ws, mrow);
}

T void qs_gemm_panel_q4_1_avx2(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
    for (int64_t b = 0; b < d->k / 32; ++b, w += 20) {
        _mm256_storeu_si256((__m256i *)(c + 32 * b), nibbles_32(w + 4));
        _mm256_storeu_ps(ws + 8 * b, _mm256_set1_ps(f16at(w)));
        mrow[b] = -f16at(w + 2);
    }
    qs_gemm_zero_tail(d, c, ws, mrow);
}

T void qs_gemm_panel_q4_K_avx2(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int64_t i = 0; i < d->k / 256; ++i, w += 144) {
        uint32_t u[4];
        k4_scales_mins(w + 4, u);
        const uint8_t *sm = (const uint8_t *)u; /* sc0..7, m0..7 */
        float dd = f16at(w), dm = f16at(w + 2);
        for (int g = 0; g < 8; ++g) {
            _mm256_storeu_ps(ws + 64 * i + 8 * g, _mm256_set1_ps(dd * (float)sm[g]));
            mrow[8 * i + g] = dm * (float)sm[8 + g];
        }
        for (int q = 0; q < 4; ++q) {
            __m256i b = _mm256_loadu_si256((const __m256i *)(w + 16 + 32 * q));
            _mm256_storeu_si256((__m256i *)(c + 256 * i + 64 * q), _mm256_and_si256(b, m4));
            _mm256_storeu_si256((__m256i *)(c + 256 * i + 64 * q + 32), _mm256_and_si256(_mm256_srli_epi16(b, 4), m4));
        }
    }
    qs_gemm_zero_tail(d, c, ws, mrow);
}

T void qs_gemm_panel_q6_K_avx2(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
    for (int64_t i = 0; i < d->k / 256; ++i, w += 210) {
        float dd = f16at(w + 208);
        const int8_t *sc = (const int8_t *)(w + 192);
        for (int g = 0; g < 16; ++g) {
            float s = dd * (float)sc[g];
            _mm_storeu_ps(ws + 64 * i + 4 * g, _mm_set1_ps(s));
            mrow[16 * i + g] = 32.0f * s;
        }
        for (int h = 0; h < 2; ++h) {
            __m256i q[4];
            q6k_half_codes(w, h, q);
            for (int j = 0; j < 4; ++j) _mm256_storeu_si256((__m256i *)(c + 256 * i + 128 * h + 32 * j), q[j]);
        }
    }
    qs_gemm_zero_tail(d, c, ws, mrow);
}

#endif /* QS_ARCH_X86 */
