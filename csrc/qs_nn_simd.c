/* AVX2+FMA variants of the float kernels (compiled with target attributes; called only after dispatch). */
#include "qs_arch.h"
#if QS_ARCH_X86
#include <immintrin.h>
#include <math.h>

#include "qs.h"
#include "qs_nn_internal.h"
#include "qs_simd_common.h"

QS_TARGET_AVX2 float qs_dot_f32_avx2(const float *a, const float *b, int n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    float s = hsum256(_mm256_add_ps(acc0, acc1));
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

QS_TARGET_AVX2 float qs_dot_f32_f16_avx2(const float *a, const uint16_t *b, int n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 b0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + i)));
        __m256 b1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + i + 8)));
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), b0, acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), b1, acc1);
    }
    float s = hsum256(_mm256_add_ps(acc0, acc1));
    for (; i < n; ++i) s += a[i] * qs_fp16_to_fp32(b[i]);
    return s;
}

QS_TARGET_AVX2 void qs_axpy_f32_avx2(float a, const float *x, float *y, int n) {
    __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; ++i) y[i] += a * x[i];
}

QS_TARGET_AVX2 void qs_axpy_f16_avx2(float a, const uint16_t *x, float *y, int n) {
    __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 xv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i)));
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, xv, _mm256_loadu_ps(y + i)));
    }
    for (; i < n; ++i) y[i] += a * qs_fp16_to_fp32(x[i]);
}

/* Reference: qs_axpy_q8_0_scalar, y += a * (d * q), 8 lanes at a time. */
QS_TARGET_AVX2 void qs_axpy_q8_0_avx2(float a, const uint8_t *x, float *y, int n) {
    const __m256 va = _mm256_set1_ps(a);
    for (int b = 0; b < n / 32; ++b, x += 34, y += 32) {
        const __m256 vd = _mm256_set1_ps(qs_fp16_to_fp32(qs_load_u16(x)));
        for (int j = 0; j < 32; j += 8) {
            const __m128i q = _mm_loadl_epi64((const __m128i *)(x + 2 + j));
            const __m256 v = _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
            _mm256_storeu_ps(y + j, _mm256_fmadd_ps(va, v, _mm256_loadu_ps(y + j)));
        }
    }
}

/* Reference: qs_axpy_q4_0_scalar: low nibbles are elements 0..15, high nibbles 16..31, each minus 8. */
QS_TARGET_AVX2 void qs_axpy_q4_0_avx2(float a, const uint8_t *x, float *y, int n) {
    const __m256 va = _mm256_set1_ps(a);
    const __m128i m4 = _mm_set1_epi8(15), eight = _mm_set1_epi8(8);
    for (int b = 0; b < n / 32; ++b, x += 18, y += 32) {
        const __m256 vd = _mm256_set1_ps(qs_fp16_to_fp32(qs_load_u16(x)));
        const __m128i raw = _mm_loadu_si128((const __m128i *)(x + 2));
        const __m128i lo = _mm_sub_epi8(_mm_and_si128(raw, m4), eight);
        const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), eight);
        const __m128i part[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
        for (int j = 0; j < 4; ++j) {
            const __m256 v = _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part[j])));
            _mm256_storeu_ps(y + 8 * j, _mm256_fmadd_ps(va, v, _mm256_loadu_ps(y + 8 * j)));
        }
    }
}

/* Reference: qs_axpy_bf16_scalar (bf16 -> f32 is exact: the bits shifted up). */
QS_TARGET_AVX2 void qs_axpy_bf16_avx2(float a, const uint8_t *x, float *y, int n) {
    const __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + 2 * i)));
        const __m256 v = _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, v, _mm256_loadu_ps(y + i)));
    }
    for (; i < n; ++i) y[i] += a * qs_bf16_to_fp32(qs_load_u16(x + 2 * i));
}

QS_TARGET_AVX2 void qs_rmsnorm_avx2(const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps) {
    for (int64_t r = 0; r < n_rows; ++r) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        __m256d acc = _mm256_setzero_pd();
        int64_t i = 0;
        for (; i + 4 <= n; i += 4) {
            __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(xr + i));
            acc = _mm256_fmadd_pd(v, v, acc);
        }
        double buf[4];
        _mm256_storeu_pd(buf, acc);
        double ss = buf[0] + buf[1] + buf[2] + buf[3];
        for (; i < n; ++i) ss += (double)xr[i] * xr[i];
        float scale = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
        __m256 vs = _mm256_set1_ps(scale);
        i = 0;
        if (w) {
            for (; i + 8 <= n; i += 8)
                _mm256_storeu_ps(yr + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + i), vs), _mm256_loadu_ps(w + i)));
            for (; i < n; ++i) yr[i] = xr[i] * scale * w[i];
        } else {
            for (; i + 8 <= n; i += 8) _mm256_storeu_ps(yr + i, _mm256_mul_ps(_mm256_loadu_ps(xr + i), vs));
            for (; i < n; ++i) yr[i] = xr[i] * scale;
        }
    }
}

/* exp(x) for 8 floats: Cody-Waite range reduction x = n*ln2 + r, degree-6 polynomial for e^r (|r| <= ln2/2),
 * scaled by 2^n through the exponent bits; inputs clamped to [-87.3, 88.7] (relative error ~2e-7). */
QS_TARGET_AVX2 static inline __m256 exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.7f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

QS_TARGET_AVX2 void qs_swiglu_avx2(const float *gate, const float *up, float *out, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), g))));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
    }
    for (; i < n; ++i) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

QS_TARGET_AVX2 void qs_geglu_tanh_avx2(const float *gate, const float *up, float *out, int64_t n) {
    const __m256 k = _mm256_set1_ps(0.7978845608028654f), c = _mm256_set1_ps(0.044715f);
    const __m256 one = _mm256_set1_ps(1.0f), half = _mm256_set1_ps(0.5f), two = _mm256_set1_ps(2.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 y = _mm256_mul_ps(k, _mm256_fmadd_ps(_mm256_mul_ps(c, g), _mm256_mul_ps(g, g), g));
        /* tanh(y) = 1 - 2 / (exp(2y) + 1), exact limits at +-inf through the clamp in exp256 */
        __m256 t = _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(exp256(_mm256_mul_ps(two, y)), one)));
        __m256 v = _mm256_mul_ps(_mm256_mul_ps(half, g), _mm256_add_ps(one, t));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(v, _mm256_loadu_ps(up + i)));
    }
    const float ks = 0.7978845608028654f;
    for (; i < n; ++i) {
        float g = gate[i];
        out[i] = 0.5f * g * (1.0f + tanhf(ks * (g + 0.044715f * g * g * g))) * up[i];
    }
}

QS_TARGET_AVX2 void qs_gdn_step_avx2(int64_t S, float *st, const float *k, const float *q, const float *v, float decay,
                                     float beta, float *o, float *sk) {
    const __m256 dv = _mm256_set1_ps(decay);
    int64_t i0 = 0;
    for (; i0 + 8 <= S; i0 += 8) _mm256_storeu_ps(sk + i0, _mm256_setzero_ps());
    for (int64_t i = i0; i < S; ++i) sk[i] = 0.0f;
    for (int64_t j = 0; j < S; ++j) {
        float *r = st + j * S;
        const __m256 kj = _mm256_set1_ps(k[j]);
        int64_t i = 0;
        for (; i + 8 <= S; i += 8) {
            const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(r + i), dv);
            _mm256_storeu_ps(r + i, x);
            _mm256_storeu_ps(sk + i, _mm256_fmadd_ps(kj, x, _mm256_loadu_ps(sk + i)));
        }
        for (; i < S; ++i) {
            r[i] *= decay;
            sk[i] = fmaf(k[j], r[i], sk[i]);
        }
    }
    for (int64_t i = 0; i < S; ++i) {
        sk[i] = (v[i] - sk[i]) * beta;
        o[i] = 0.0f;
    }
    for (int64_t j = 0; j < S; ++j) {
        float *r = st + j * S;
        const __m256 kj = _mm256_set1_ps(k[j]), qj = _mm256_set1_ps(q[j]);
        int64_t i = 0;
        for (; i + 8 <= S; i += 8) {
            const __m256 x = _mm256_fmadd_ps(kj, _mm256_loadu_ps(sk + i), _mm256_loadu_ps(r + i));
            _mm256_storeu_ps(r + i, x);
            _mm256_storeu_ps(o + i, _mm256_fmadd_ps(qj, x, _mm256_loadu_ps(o + i)));
        }
        for (; i < S; ++i) {
            r[i] = fmaf(k[j], sk[i], r[i]);
            o[i] = fmaf(q[j], r[i], o[i]);
        }
    }
}

#endif /* QS_ARCH_X86 */
