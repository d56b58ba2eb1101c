/* AVX2+FMA+F16C variants of the quantized kernels (ggml's x86 strategy; see docs/quant-formats.md §6 and docs/engine.md §5).
 * Dot products are exact in their integer parts; dequantization is bit-exact (every product is exact). */
#include "qs_arch.h"
#if QS_ARCH_X86
#include <immintrin.h>
#include <math.h>

#include "qs.h"
#include "qs_quant_internal.h"
#include "qs_simd_common.h"

#define T QS_TARGET_AVX2

T static inline __m256i bits_to_bytes(uint32_t x32) { /* bit e set -> byte e = 0xFF */
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x32), shuf);
    bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}

T static inline __m256 mul_sum_i8_pairs(__m256i x, __m256i y) { /* signed x signed -> 8 float lanes */
    __m256i ax = _mm256_sign_epi8(x, x);
    __m256i sy = _mm256_sign_epi8(y, x);
    __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1));
    return _mm256_cvtepi32_ps(dot);
}

T static inline __m256 mul_sum_u8_i8(__m256i x, __m256i y) { /* unsigned x signed -> 8 float lanes */
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1)));
}

T float qs_dot_q8_0_avx2(int64_t n, const uint8_t *w, const uint8_t *x) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 32; ++i, w += 34, x += 34) {
        __m256 d = _mm256_set1_ps(f16at(w) * f16at(x));
        __m256i qw = _mm256_loadu_si256((const __m256i *)(w + 2));
        __m256i qx = _mm256_loadu_si256((const __m256i *)(x + 2));
        acc = _mm256_fmadd_ps(d, mul_sum_i8_pairs(qw, qx), acc);
    }
    return hsum256(acc);
}

T float qs_dot_q4_0_avx2(int64_t n, const uint8_t *w, const uint8_t *x) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 32; ++i, w += 18, x += 34) {
        __m256 d = _mm256_set1_ps(f16at(w) * f16at(x));
        __m256i qw = _mm256_sub_epi8(nibbles_32(w + 2), _mm256_set1_epi8(8));
        __m256i qx = _mm256_loadu_si256((const __m256i *)(x + 2));
        acc = _mm256_fmadd_ps(d, mul_sum_i8_pairs(qw, qx), acc);
    }
    return hsum256(acc);
}

T static inline int hsum_i32x8(__m256i v);

/* Q2_K / Q3_K: per 128-element half and shift j, 32 codes of 2 (Q3_K: 3) bits; vpmaddubsw against the
 * activations gives 16 pair sums, vpmaddwd with the two 16-element groups' scales weights and adds them. The
 * integer sums equal the scalar reference's, so only the final float products may be fused differently. */
/* Signed byte scales g and g + 1 of sc8 (16 of them) as int16: pair sums 0-7 (elements 0-15) get scale g, 8-15
 * get g + 1; one byte shuffle and a widening instead of two broadcasts from general registers */
T static inline __m256i scales_pair(__m128i sc8, int g) {
    const __m128i pick = _mm_add_epi8(_mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), _mm_set1_epi8((char)g));
    return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, pick));
}

/* Σ over the 16 sub-blocks of (an int8 per sub-block) · (Q8_K's int16 sum of that sub-block's activations) */
T static inline __m256i sub_sums(__m128i v8, const uint8_t *x) {
    return _mm256_madd_epi16(_mm256_cvtepi8_epi16(v8), _mm256_loadu_si256((const __m256i *)(x + 260)));
}

T float qs_dot_q2_K_avx2(int64_t n, const uint8_t *w, const uint8_t *x) {
    __m256 accf = _mm256_setzero_ps(), accm = _mm256_setzero_ps(); /* scale and min terms, reduced once at the end */
    const __m256i m3 = _mm256_set1_epi8(3);
    for (int64_t i = 0; i < n / 256; ++i, w += 84, x += 292) {
        const __m128i sc8 = _mm_and_si128(_mm_loadu_si128((const __m128i *)w), _mm_set1_epi8(15));
        __m256i acc[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        _Pragma("GCC unroll 2")
        for (int h = 0; h < 2; ++h) {
            const __m256i qv = _mm256_loadu_si256((const __m256i *)(w + 16 + 32 * h));
            _Pragma("GCC unroll 4")
            for (int j = 0; j < 4; ++j) {
                const __m256i c = _mm256_and_si256(_mm256_srli_epi16(qv, 2 * j), m3);
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(x + 4 + 128 * h + 32 * j));
                const int g = 8 * h + 2 * j;
                acc[j & 1] = _mm256_add_epi32(acc[j & 1], _mm256_madd_epi16(_mm256_maddubs_epi16(c, xv),
                                                                            scales_pair(sc8, g)));
            }
        }
        const __m128i mins = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)w), 4), _mm_set1_epi8(15));
        const float dx = qs_load_f32(x);
        accf = _mm256_fmadd_ps(_mm256_set1_ps(dx * f16at(w + 80)), _mm256_cvtepi32_ps(_mm256_add_epi32(acc[0], acc[1])),
                               accf);
        accm = _mm256_fmadd_ps(_mm256_set1_ps(dx * f16at(w + 82)), _mm256_cvtepi32_ps(sub_sums(mins, x)), accm);
    }
    return hsum256(accf) - hsum256(accm);
}

/* Q3_K's 16 6-bit scales - 32 (qs_q3k_scales) in one vector: low 4 bits from bytes 0-7 (low then high nibbles),
 * high 2 bits from bytes 8-11 (bits 2k..2k+1 of byte b belong to scale 4k + b) */
T static inline __m128i q3k_scales(const uint8_t *s) {
    const __m128i m4 = _mm_set1_epi8(15);
    const __m128i l8 = _mm_loadl_epi64((const __m128i *)s);
    const __m128i lo = _mm_unpacklo_epi64(_mm_and_si128(l8, m4), _mm_and_si128(_mm_srli_epi16(l8, 4), m4));
    const __m128i hi = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32((int)qs_load_u32(s + 8)), _mm_setr_epi32(0, 2, 4, 6)),
                                     _mm_set1_epi8(3));
    return _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
}

T float qs_dot_q3_K_avx2(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    for (int64_t i = 0; i < n / 256; ++i, w += 110, x += 292) {
        const __m128i scv = q3k_scales(w + 96);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)w);
        /* the codes are stored + 4: subtract 4 · Σ scale · (sub-block activation sum) */
        __m256i acc[2] = {_mm256_slli_epi32(_mm256_sub_epi32(_mm256_setzero_si256(), sub_sums(scv, x)), 2),
                          _mm256_setzero_si256()};
        _Pragma("GCC unroll 2")
        for (int h = 0; h < 2; ++h) {
            const __m256i qv = _mm256_loadu_si256((const __m256i *)(w + 32 + 32 * h));
            _Pragma("GCC unroll 4")
            for (int j = 0; j < 4; ++j) {
                const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + j), one);
                const __m256i c = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qv, 2 * j), m3),
                                                  _mm256_slli_epi16(hb, 2));
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(x + 4 + 128 * h + 32 * j));
                const int g = 8 * h + 2 * j;
                acc[j & 1] = _mm256_add_epi32(acc[j & 1], _mm256_madd_epi16(_mm256_maddubs_epi16(c, xv),
                                                                            scales_pair(scv, g)));
            }
        }
        s += qs_load_f32(x) * f16at(w + 108) * (float)hsum_i32x8(_mm256_add_epi32(acc[0], acc[1]));
    }
    return s;
}

/* IQ4_NL / IQ4_XS: 32 nibbles -> code-book values by one byte shuffle (low nibbles = elements 0-15, high =
 * 16-31), then the signed products as for Q8_0 */
T static inline __m256i iq4nl_values(const uint8_t *qs) {
    const __m128i book = _mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
    const __m128i q = _mm_loadu_si128((const __m128i *)qs), m4 = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_shuffle_epi8(book, _mm_and_si128(q, m4));
    const __m128i hi = _mm_shuffle_epi8(book, _mm_and_si128(_mm_srli_epi16(q, 4), m4));
    return _mm256_set_m128i(hi, lo);
}

T float qs_dot_iq4_nl_avx2(int64_t n, const uint8_t *w, const uint8_t *x) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 32; ++i, w += 18, x += 34) {
        __m256 d = _mm256_set1_ps(f16at(w) * f16at(x));
        __m256i qx = _mm256_loadu_si256((const __m256i *)(x + 2));
        acc = _mm256_fmadd_ps(d, mul_sum_i8_pairs(iq4nl_values(w + 2), qx), acc);
    }
    return hsum256(acc);
}

T float qs_dot_iq4_xs_avx2(int64_t n, const uint8_t *w, const uint8_t *x) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 256; ++i, w += 136, x += 292) {
        const uint16_t sh = qs_load_u16(w + 2);
        const float d = f16at(w) * qs_load_f32(x);
        for (int sb = 0; sb < 8; ++sb) {
            const int ls = ((w[4 + sb / 2] >> (4 * (sb % 2))) & 15) | (((sh >> (2 * sb)) & 3) << 4);
            __m256i qx = _mm256_loadu_si256((const __m256i *)(x + 4 + 32 * sb));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)(ls - 32)), mul_sum_i8_pairs(iq4nl_values(w + 8 + 16 * sb), qx),
                                  acc);
        }
    }
    return hsum256(acc);
}

T float qs_dot_q5_0_avx2(int64_t n, const uint8_t *w, const uint8_t *x) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 32; ++i, w += 22, x += 34) {
        __m256 d = _mm256_set1_ps(f16at(w) * f16at(x));
        __m256i hi = _mm256_andnot_si256(bits_to_bytes(qs_load_u32(w + 2)), _mm256_set1_epi8((char)0xF0));
        __m256i qw = _mm256_or_si256(nibbles_32(w + 6), hi); /* = q - 16 as int8 */
        __m256i qx = _mm256_loadu_si256((const __m256i *)(x + 2));
        acc = _mm256_fmadd_ps(d, mul_sum_i8_pairs(qw, qx), acc);
    }
    return hsum256(acc);
}

T float qs_dot_q4_1_avx2(int64_t n, const uint8_t *w, const uint8_t *x) {
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (int64_t i = 0; i < n / 32; ++i, w += 20, x += 36) {
        summs += f16at(w + 2) * f16at(x + 2);
        __m256 d = _mm256_set1_ps(f16at(w) * f16at(x));
        __m256i qw = nibbles_32(w + 4);
        __m256i qx = _mm256_loadu_si256((const __m256i *)(x + 4));
        acc = _mm256_fmadd_ps(d, mul_sum_u8_i8(qw, qx), acc);
    }
    return hsum256(acc) + summs;
}

static inline void k4_unpack(const uint8_t *s, uint8_t sc[8], uint8_t m[8]) {
    for (int j = 0; j < 4; ++j) {
        sc[j] = s[j] & 63;
        m[j] = s[j + 4] & 63;
        sc[j + 4] = (uint8_t)((s[j + 8] & 15) | ((s[j] >> 6) << 4));
        m[j + 4] = (uint8_t)((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4));
    }
}

/* Q4_K / Q5_K: scale s of the 8 (int16 in both lanes, sc16) in all 16 lanes, by one byte shuffle */
T static inline __m256i k4_scale(__m256i sc16, int s) {
    return _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)(0x0100 + 0x0202 * s)));
}

T float qs_dot_q4_K_avx2(int64_t n, const uint8_t *w, const uint8_t *x) {
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int64_t i = 0; i < n / 256; ++i, w += 144, x += 292) {
        uint32_t u[4];
        k4_scales_mins(w + 4, u);
        const uint8_t *sc = (const uint8_t *)u; /* sc0..7, then m0..7 */
        __m128i mins16 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(sc + 8)));
        __m256i bs = _mm256_loadu_si256((const __m256i *)(x + 260));
        __m128i bsp = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
        __m128 dd8 = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128((int)qs_load_u32(w))), _mm_set1_ps(qs_load_f32(x)));
        accm = _mm_fmadd_ps(_mm_shuffle_ps(dd8, dd8, 0x55), _mm_cvtepi32_ps(_mm_madd_epi16(mins16, bsp)), accm);
        const uint8_t *qs = w + 16;
        const uint8_t *q8 = x + 4;
        const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
        __m256i sumi = _mm256_setzero_si256();
        _Pragma("GCC unroll 4")
        for (int c = 0; c < 4; ++c) {
            __m256i q4 = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
            __m256i lo = _mm256_and_si256(q4, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
            __m256i pl = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(q8 + 64 * c)));
            __m256i ph = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q8 + 64 * c + 32)));
            pl = _mm256_madd_epi16(pl, k4_scale(sc16, 2 * c));
            ph = _mm256_madd_epi16(ph, k4_scale(sc16, 2 * c + 1));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(_mm_cvtss_f32(dd8)), _mm256_cvtepi32_ps(sumi), acc);
    }
    __m128 m = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    return hsum256(acc) - _mm_cvtss_f32(m);
}

T float qs_dot_q6_K_avx2(int64_t n, const uint8_t *w, const uint8_t *x) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 256; ++i, w += 210, x += 292) {
        const int8_t *sc = (const int8_t *)(w + 192);
        const uint8_t *q8 = x + 4;
        /* -32 offset: 32 * sum_j sc_j * bsum_j */
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)sc);
        __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
        __m256i bs16 = _mm256_loadu_si256((const __m256i *)(x + 260));
        __m256i off = _mm256_madd_epi16(sc16, bs16);
        __m256i sumi = _mm256_setzero_si256();
        _Pragma("GCC unroll 2")
        for (int h = 0; h < 2; ++h) {
            __m256i q[4];
            q6k_half_codes(w, h, q);
            _Pragma("GCC unroll 4")
            for (int k = 0; k < 4; ++k) {
                __m256i p = _mm256_maddubs_epi16(q[k], _mm256_loadu_si256((const __m256i *)(q8 + 128 * h + 32 * k)));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, scales_pair(sc8, 8 * h + 2 * k)));
            }
        }
        sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(off, 5));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16at(w + 208) * qs_load_f32(x)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum256(acc);
}

T float qs_dot_f16_avx2(int64_t n, const uint8_t *w, const uint8_t *x) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 2 * i)));
        __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 2 * i + 16)));
        __m256 x0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + 2 * i)));
        __m256 x1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + 2 * i + 16)));
        a0 = _mm256_fmadd_ps(w0, x0, a0);
        a1 = _mm256_fmadd_ps(w1, x1, a1);
    }
    float s = hsum256(_mm256_add_ps(a0, a1));
    for (; i < n; ++i) s += f16at(w + 2 * i) * f16at(x + 2 * i);
    return s;
}

T float qs_dot_f32_avx2_q(int64_t n, const uint8_t *w, const uint8_t *x) {
    const float *a = (const float *)w, *b = (const float *)x;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
    float s = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

/* ---------------------------------------------------------------- dequantization (bit-exact) */
T static inline void store_i8x32_scaled(const __m256i q, __m256 d, float *y) {
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    _mm256_storeu_ps(y, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), d));
    _mm256_storeu_ps(y + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), d));
    _mm256_storeu_ps(y + 16, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), d));
    _mm256_storeu_ps(y + 24, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), d));
}

T void qs_deq_q8_0_avx2(const uint8_t *b, float *y) {
    store_i8x32_scaled(_mm256_loadu_si256((const __m256i *)(b + 2)), _mm256_set1_ps(f16at(b)), y);
}

T void qs_deq_q5_0_avx2(const uint8_t *b, float *y) {
    __m256i hi = _mm256_andnot_si256(bits_to_bytes(qs_load_u32(b + 2)), _mm256_set1_epi8((char)0xF0));
    store_i8x32_scaled(_mm256_or_si256(nibbles_32(b + 6), hi), _mm256_set1_ps(f16at(b)), y);
}

T static inline void store_u8x32_fma(const __m256i q, __m256 d, __m256 m, float *y) { /* y = q*d + m */
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    _mm256_storeu_ps(y, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), d, m));
    _mm256_storeu_ps(y + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), d, m));
    _mm256_storeu_ps(y + 16, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), d, m));
    _mm256_storeu_ps(y + 24, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), d, m));
}

T void qs_deq_q4_1_avx2(const uint8_t *b, float *y) {
    store_u8x32_fma(nibbles_32(b + 4), _mm256_set1_ps(f16at(b)), _mm256_set1_ps(f16at(b + 2)), y);
}

T void qs_deq_q4_K_avx2(const uint8_t *b, float *y) {
    uint8_t sc[8], m[8];
    k4_unpack(b + 4, sc, m);
    float d = f16at(b), dmin = f16at(b + 2);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int c = 0; c < 4; ++c) {
        __m256i q4 = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * c));
        __m256i lo = _mm256_and_si256(q4, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
        store_u8x32_fma(lo, _mm256_set1_ps(d * (float)sc[2 * c]), _mm256_set1_ps(-(dmin * (float)m[2 * c])),
                        y + 64 * c);
        store_u8x32_fma(hi, _mm256_set1_ps(d * (float)sc[2 * c + 1]), _mm256_set1_ps(-(dmin * (float)m[2 * c + 1])),
                        y + 64 * c + 32);
    }
}

T void qs_deq_q6_K_avx2(const uint8_t *b, float *y) {
    const __m256i off = _mm256_set1_epi8(32);
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = f16at(b + 208);
    for (int h = 0; h < 2; ++h) {
        __m256i q[4];
        q6k_half_codes(b, h, q);
        for (int k = 0; k < 4; ++k) {
            __m256i v = _mm256_sub_epi8(q[k], off);
            float *yy = y + 128 * h + 32 * k;
            int j = 8 * h + 2 * k;
            __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
            __m256 s0 = _mm256_set1_ps(d * (float)sc[j]), s1 = _mm256_set1_ps(d * (float)sc[j + 1]);
            _mm256_storeu_ps(yy, _mm256_mul_ps(s0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo))));
            _mm256_storeu_ps(yy + 8, _mm256_mul_ps(s0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)))));
            _mm256_storeu_ps(yy + 16, _mm256_mul_ps(s1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi))));
            _mm256_storeu_ps(yy + 24, _mm256_mul_ps(s1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)))));
        }
    }
}

T float qs_dot_q5_1_avx2(int64_t n, const uint8_t *w, const uint8_t *x) {
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    const __m256i b16 = _mm256_set1_epi8(0x10);
    for (int64_t i = 0; i < n / 32; ++i, w += 24, x += 36) {
        summs += f16at(w + 2) * f16at(x + 2);
        __m256i hi = _mm256_and_si256(bits_to_bytes(qs_load_u32(w + 4)), b16);
        __m256i qw = _mm256_or_si256(nibbles_32(w + 8), hi);
        __m256i qx = _mm256_loadu_si256((const __m256i *)(x + 4));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16at(w) * f16at(x)), mul_sum_u8_i8(qw, qx), acc);
    }
    return hsum256(acc) + summs;
}

T float qs_dot_q5_K_avx2(int64_t n, const uint8_t *w, const uint8_t *x) {
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0F), b16 = _mm256_set1_epi8(0x10);
    for (int64_t i = 0; i < n / 256; ++i, w += 176, x += 292) {
        uint32_t u[4];
        k4_scales_mins(w + 4, u);
        const uint8_t *sc = (const uint8_t *)u;
        __m128i mins16 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(sc + 8)));
        __m256i bs = _mm256_loadu_si256((const __m256i *)(x + 260));
        __m128i bsp = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
        __m128 dd8 = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128((int)qs_load_u32(w))), _mm_set1_ps(qs_load_f32(x)));
        accm = _mm_fmadd_ps(_mm_shuffle_ps(dd8, dd8, 0x55), _mm_cvtepi32_ps(_mm_madd_epi16(mins16, bsp)), accm);
        __m256i qh = _mm256_loadu_si256((const __m256i *)(w + 16));
        const uint8_t *qs = w + 48;
        const uint8_t *q8 = x + 4;
        const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
        __m256i sumi = _mm256_setzero_si256();
        _Pragma("GCC unroll 4")
        for (int c = 0; c < 4; ++c) {
            __m256i q4 = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
            __m256i lo = _mm256_or_si256(_mm256_and_si256(q4, m4),
                                         _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(qh, 2 * c), 4), b16));
            __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4, 4), m4),
                                         _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(qh, 2 * c + 1), 4), b16));
            __m256i pl = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(q8 + 64 * c)));
            __m256i ph = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q8 + 64 * c + 32)));
            pl = _mm256_madd_epi16(pl, k4_scale(sc16, 2 * c));
            ph = _mm256_madd_epi16(ph, k4_scale(sc16, 2 * c + 1));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(_mm_cvtss_f32(dd8)), _mm256_cvtepi32_ps(sumi), acc);
    }
    __m128 m = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    return hsum256(acc) - _mm_cvtss_f32(m);
}

T static inline __m256 bf16x8(const uint8_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

T float qs_dot_bf16_avx2(int64_t n, const uint8_t *w, const uint8_t *x) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(bf16x8(w + 2 * i), bf16x8(x + 2 * i), a0);
        a1 = _mm256_fmadd_ps(bf16x8(w + 2 * i + 16), bf16x8(x + 2 * i + 16), a1);
    }
    float s = hsum256(_mm256_add_ps(a0, a1));
    for (; i < n; ++i) s += qs_bf16_to_fp32(qs_load_u16(w + 2 * i)) * qs_bf16_to_fp32(qs_load_u16(x + 2 * i));
    return s;
}

/* ---------------------------------------------------------------- activation quantizers, bit-identical to the
 * scalar ggml reference versions in qs_quant.c (roundf = round half away from zero; nearest_int = half to even) */

T static inline __m256 round_half_away8(__m256 p) {
    __m256 t = _mm256_round_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 frac = _mm256_sub_ps(p, t); /* exact */
    __m256 sign = _mm256_and_ps(p, _mm256_set1_ps(-0.0f));
    __m256 up = _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), frac), _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    return _mm256_add_ps(t, _mm256_and_ps(up, _mm256_or_ps(_mm256_set1_ps(1.0f), sign)));
}

/* four vectors of 8 int32 (values within int8) -> 32 bytes in element order */
T static inline void store_i8x32(int8_t *o, __m256i a, __m256i b, __m256i c, __m256i d) {
    __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    __m256i v = _mm256_packs_epi16(ab, cd);
    v = _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)o, v);
}

T static inline float hmax8(__m256 m) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

T static inline int hsum_i32x8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

T static inline int q8_block32_avx2(const float *v, int8_t *o, float *d_out) {
    const __m256 absm = _mm256_set1_ps(-0.0f);
    __m256 a[4];
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
        a[j] = _mm256_loadu_ps(v + 8 * j);
        m = _mm256_max_ps(m, _mm256_andnot_ps(absm, a[j]));
    }
    float amax = hmax8(m);
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    __m256i q[4];
    __m256i sum = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
        q[j] = _mm256_cvtps_epi32(round_half_away8(_mm256_mul_ps(a[j], _mm256_set1_ps(id))));
        sum = _mm256_add_epi32(sum, q[j]);
    }
    store_i8x32(o, q[0], q[1], q[2], q[3]);
    *d_out = d;
    return hsum_i32x8(sum);
}

T void qs_quantize_q8_0_avx2(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t i = 0; i < n / 32; ++i) {
        uint8_t *o = dst + 34 * i;
        float d;
        q8_block32_avx2(x + 32 * i, (int8_t *)(o + 2), &d);
        uint16_t dh = qs_fp32_to_fp16(d);
        memcpy(o, &dh, 2);
    }
}

T void qs_quantize_q8_1_avx2(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t i = 0; i < n / 32; ++i) {
        uint8_t *o = dst + 36 * i;
        float d;
        int sum = q8_block32_avx2(x + 32 * i, (int8_t *)(o + 4), &d);
        uint16_t dh = qs_fp32_to_fp16(d), sh = qs_fp32_to_fp16((float)sum * d);
        memcpy(o, &dh, 2);
        memcpy(o + 2, &sh, 2);
    }
}

T void qs_quantize_q8_K_avx2(const float *x, uint8_t *dst, int64_t n) {
    const __m256 absm = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < n / 256; ++i) {
        const float *v = x + 256 * i;
        uint8_t *o = dst + 292 * i;
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < 32; ++j) m = _mm256_max_ps(m, _mm256_andnot_ps(absm, _mm256_loadu_ps(v + 8 * j)));
        float amax = hmax8(m);
        if (amax == 0.0f) {
            memset(o, 0, 292);
            continue;
        }
        float max = 0.0f; /* the first element whose magnitude is amax, with its sign (as the scalar loop finds) */
        for (int j = 0; j < 256; ++j) {
            if (fabsf(v[j]) == amax) {
                max = v[j];
                break;
            }
        }
        float iscale = -127.0f / max;
        const __m256 is = _mm256_set1_ps(iscale);
        const __m256i lim = _mm256_set1_epi32(127);
        for (int j = 0; j < 8; ++j) { /* 32 elements per step: two 16-element bsums */
            __m256i q[4];
            for (int t = 0; t < 4; ++t)
                q[t] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + 32 * j + 8 * t), is)), lim);
            store_i8x32((int8_t *)(o + 4 + 32 * j), q[0], q[1], q[2], q[3]);
            int16_t s0 = (int16_t)hsum_i32x8(_mm256_add_epi32(q[0], q[1]));
            int16_t s1 = (int16_t)hsum_i32x8(_mm256_add_epi32(q[2], q[3]));
            memcpy(o + 260 + 4 * j, &s0, 2);
            memcpy(o + 262 + 4 * j, &s1, 2);
        }
        float d = 1.0f / iscale;
        memcpy(o, &d, 4);
    }
}

/* The i-quant / ternary / FP4 codes of qs_iq_row_codes against Q8_K or Q8_0 activations: per group the exact
 * integer Σ code · q (sign trick + vpmaddubsw: every code is within ±63, so no pair leaves int16), times the
 * group's integer scale in vpmaddwd, summed over the outer group; then the scalar reference's float operation:
 * bit-identical to qs_iq_dot_codes_scalar. */
T float qs_iq_dot_codes_avx2(const int8_t *codes, const float *mults, const int16_t *ls, int gs, int os, int q8k,
                           int64_t k, const uint8_t *x) {
    float s = 0.0f;
    for (int64_t o0 = 0; o0 < k; o0 += os) {
        float dx;
        const int8_t *q = qs_iq_act(x, o0, q8k, &dx);
        const int8_t *c0 = codes + o0;
        const int16_t *l0 = ls + o0 / gs;
        __m256i acc = _mm256_setzero_si256();
        if (os == 16) { /* NVFP4: one group of 16, the low lane only */
            const __m128i c = _mm_loadu_si128((const __m128i *)c0), v = _mm_loadu_si128((const __m128i *)q);
            const __m128i p = _mm_madd_epi16(_mm_maddubs_epi16(_mm_sign_epi8(c, c), _mm_sign_epi8(v, c)),
                                             _mm_set1_epi16(l0[0]));
            acc = _mm256_inserti128_si256(acc, p, 0);
        } else {
            for (int j = 0; j < os; j += 32) {
                const __m256i c = _mm256_loadu_si256((const __m256i *)(c0 + j));
                const __m256i v = _mm256_loadu_si256((const __m256i *)(q + j));
                const __m256i sc = gs == 16 ? _mm256_set_m128i(_mm_set1_epi16(l0[j / 16 + 1]), _mm_set1_epi16(l0[j / 16]))
                                            : _mm256_set1_epi16(l0[j / gs]);
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(c, c),
                                                                                   _mm256_sign_epi8(v, c)), sc));
            }
        }
        s = fmaf(mults[o0 / gs] * dx, (float)hsum_i32x8(acc), s);
    }
    return s;
}

/* n binary16 values -> binary32 with F16C; a group of 8 holding a NaN is redone by the exact scalar conversion (the
 * instruction quiets signalling NaNs, the scalar keeps every payload bit, as ggml's software conversion does). */
T void qs_f16_row_avx2(const uint8_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    const __m128i expm = _mm_set1_epi16(0x7C00), absm = _mm_set1_epi16(0x7FFF);
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(src + 2 * i));
        __m128i nan = _mm_cmpgt_epi16(_mm_and_si128(h, absm), expm); /* |h| > 0x7C00: NaN (signed compare ok) */
        if (_mm_movemask_epi8(nan)) {
            for (int k = 0; k < 8; ++k) dst[i + k] = qs_fp16_to_fp32(qs_load_u16(src + 2 * (i + k)));
            continue;
        }
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
    for (; i < n; ++i) dst[i] = qs_fp16_to_fp32(qs_load_u16(src + 2 * i));
}

/* n bfloat16 values -> binary32 (a shift: exact). */
T void qs_bf16_row_avx2(const uint8_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + 2 * i)));
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
    for (; i < n; ++i) dst[i] = qs_bf16_to_fp32(qs_load_u16(src + 2 * i));
}

#endif /* QS_ARCH_X86 */
