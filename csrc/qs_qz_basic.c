/* Weight quantizers for the 32-value block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4) and the 256-value
 * IQ4_XS, TQ1_0 and TQ2_0 (docs/quantize.md). Each reproduces ggml's bytes for the same row: every float32 value
 * is computed with the same operations in the same order (sequential sums, no fused multiply-adds, the same
 * rounding and tie rules), so the choices of scales and codes agree exactly (tests/test_quantize_native.py).
 *
 * What ggml does per type, and so do we:
 *   Q4_0 Q4_1 Q5_0 Q5_1  no weights: scale from the block's extreme value(s), codes by truncating x/d + offset;
 *                        weights: a weighted least-squares scale search (symmetric types) or scale+min search
 *                        (types with a min), the weight of x being qw * sqrt(sigma2 + x^2), sigma2 the row's mean
 *                        square.
 *   IQ4_NL IQ4_XS        always the weighted search over the non-linear grid; without importance weights the
 *                        weight is x^2, with them qw * sqrt(sigma2 + x^2), sigma2 twice the mean square of the
 *                        block (IQ4_NL: 32 values) or super-block (IQ4_XS: 256 values).
 *   Q8_0 TQ1_0 TQ2_0 MXFP4  importance weights are ignored. */
/* ggml-base builds its quantizers with -O3: the same here (no fast-math, so the float results do not change). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif
#include <float.h>
#include <math.h>
#include <string.h>

#include "qs.h"
#include "qs_quantize_internal.h"

/* the IQ4_NL / IQ4_XS code book, ascending */
static const int8_t IQ4_GRID[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* e2m1 values times two (codes 8..15 are the negatives of 0..7) */
static const int8_t FP4_GRID[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* ---------------------------------------------------------------- small shared pieces */

/* Store v as binary16, little endian. Rounding is to nearest even as ggml's conversion; a NaN becomes the quiet
 * NaN 0x7E00 with v's sign, which is what ggml writes (qs_fp32_to_fp16 would keep the payload). */
static void put_f16(uint8_t *p, float v) {
    uint16_t h = isnan(v) ? (uint16_t)((signbit(v) ? 0x8000u : 0u) | 0x7E00u) : qs_fp32_to_fp16(v);
    p[0] = (uint8_t)(h & 0xFF);
    p[1] = (uint8_t)(h >> 8);
}

/* Round to the nearest integer, ties to even, by adding 1.5 * 2^23 and reading the low mantissa bits: exact for
 * |v| < 2^22, which every caller guarantees. The add rounds as the FPU does, so this is not roundf. */
static inline int round_magic(float v) {
    float t = v + 12582912.f;
    int32_t i;
    memcpy(&i, &t, 4);
    return (i & 0x007FFFFF) - 0x00400000;
}

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* The value of largest magnitude in x[0..n) (the first one on ties) and that magnitude. */
static float signed_absmax(const float *x, int n, float *amax_out) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; ++j) {
        float a = fabsf(x[j]);
        if (a > amax) {
            amax = a;
            max = x[j];
        }
    }
    *amax_out = amax;
    return max;
}

/* Largest magnitude, accumulated as "keep the bigger of the two" (the Q8_0 and ternary scans). */
static float plain_absmax(const float *x, int n) {
    float amax = 0.0f;
    for (int j = 0; j < n; ++j) {
        float a = fabsf(x[j]);
        amax = amax > a ? amax : a;
    }
    return amax;
}

/* Sum of squares, left to right in float. */
static float sum_squares(const float *x, int64_t n) {
    float s = 0.0f;
    for (int64_t j = 0; j < n; ++j) s += x[j] * x[j];
    return s;
}

/* Weight of each value of a 32-block in the imatrix paths of the Q4/Q5 types. */
static void block_weights(const float *xb, const float *qw, float sigma2, float *w) {
    for (int j = 0; j < 32; ++j) w[j] = qw[j] * sqrtf(sigma2 + xb[j] * xb[j]);
}

/* 32 4-bit codes: the first 16 in the low nibbles, the last 16 in the high ones. */
static void pack_nibbles(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < 16; ++j) qs[j] = (uint8_t)((L[j] & 15) | ((L[j + 16] & 15) << 4));
}

/* 32 5-bit codes: low nibbles as pack_nibbles, the fifth bits as one little-endian 32-bit mask. */
static void pack_fivebit(const uint8_t *L, uint8_t *qh, uint8_t *qs) {
    uint32_t h = 0;
    for (int j = 0; j < 32; ++j) h |= (uint32_t)((L[j] >> 4) & 1) << j;
    for (int k = 0; k < 4; ++k) qh[k] = (uint8_t)(h >> (8 * k));
    pack_nibbles(L, qs);
}

/* Index of the grid entry nearest to v in an ascending 16-entry grid; exactly between two, the upper one. */
static int nearest_in_grid(const int8_t *g, float v) {
    if (v <= g[0]) return 0;
    if (v >= g[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (v < g[mid]) hi = mid;
        else lo = mid;
    }
    return v - g[hi - 1] < g[hi] - v ? hi - 1 : hi;
}

/* ---------------------------------------------------------------- weighted scale searches (imatrix paths) */

/* Symmetric codes l in [-nmax, nmax - 1] for 32 values with weights w: start from the scale that maps the
 * largest-magnitude value to -nmax, then try 18 nearby scales and keep the one with the best weighted
 * least-squares fit (strictly better only). L gets l + nmax; returns the fitted scale. */
static float fit_symmetric(int nmax, const float *x, const float *w, uint8_t *L) {
    float amax;
    const float max = signed_absmax(x, 32, &amax);
    if (amax < 1e-15f) {
        memset(L, 0, 32);
        return 0.0f;
    }
    float inv = (float)-nmax / max;
    float sumlx = 0.0f, suml2 = 0.0f;
    for (int j = 0; j < 32; ++j) {
        int l = clampi(round_magic(inv * x[j]), -nmax, nmax - 1);
        L[j] = (uint8_t)(l + nmax);
        sumlx += w[j] * x[j] * (float)l;
        suml2 += w[j] * (float)l * (float)l;
    }
    float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int step = -9; step <= 9; ++step) {
        if (step == 0) continue;
        inv = -((float)nmax + 0.1f * (float)step) / max;
        sumlx = suml2 = 0.0f;
        for (int j = 0; j < 32; ++j) {
            int l = clampi(round_magic(inv * x[j]), -nmax, nmax - 1);
            sumlx += w[j] * x[j] * (float)l;
            suml2 += w[j] * (float)l * (float)l;
        }
        if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
            for (int j = 0; j < 32; ++j) L[j] = (uint8_t)(nmax + clampi(round_magic(inv * x[j]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Codes l in [0, nmax] with x ~ scale * l + min (min <= 0) for 32 values with weights w. The first guess spans
 * [min(x, 0), max(x)]; 37 stretched spans follow, each refitted by weighted least squares for scale and min, kept
 * when its weighted squared error is strictly smaller. Returns the scale; *neg_min gets -min. */
static float fit_affine(int nmax, const float *x, const float *w, uint8_t *L, float *neg_min) {
    float lo = x[0], hi = x[0];
    float sum_w = w[0], sum_x = sum_w * x[0];
    for (int j = 1; j < 32; ++j) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
        sum_w += w[j];
        sum_x += w[j] * x[j];
    }
    if (lo > 0) lo = 0;
    if (hi <= lo) {
        memset(L, 0, 32);
        *neg_min = -lo;
        return 0.0f;
    }
    float inv = (float)nmax / (hi - lo);
    float scale = 1 / inv;
    float best_err = 0.0f;
    for (int j = 0; j < 32; ++j) {
        L[j] = (uint8_t)clampi(round_magic(inv * (x[j] - lo)), 0, nmax);
        float diff = scale * (float)L[j] + lo - x[j];
        best_err += w[j] * (diff * diff);
    }
    uint8_t trial[32];
    for (int step = 0; step <= 36; ++step) {
        inv = (-0.9f + 0.05f * (float)step + (float)nmax) / (hi - lo);
        float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
        for (int j = 0; j < 32; ++j) {
            int l = clampi(round_magic(inv * (x[j] - lo)), 0, nmax);
            trial[j] = (uint8_t)l;
            sum_l += w[j] * (float)l;
            sum_l2 += w[j] * (float)l * (float)l;
            sum_xl += w[j] * (float)l * x[j];
        }
        float det = sum_w * sum_l2 - sum_l * sum_l;
        if (!(det > 0)) continue;
        float s = (sum_w * sum_xl - sum_x * sum_l) / det;
        float m = (sum_l2 * sum_x - sum_l * sum_xl) / det;
        if (m > 0) {
            m = 0;
            s = sum_xl / sum_l2;
        }
        float err = 0.0f;
        for (int j = 0; j < 32; ++j) {
            float diff = s * (float)trial[j] + m - x[j];
            err += w[j] * (diff * diff);
        }
        if (err < best_err) {
            memcpy(L, trial, 32);
            best_err = err;
            scale = s;
            lo = m;
        }
    }
    *neg_min = -lo;
    return scale;
}

/* ---------------------------------------------------------------- Q4_0, Q5_0: d then 4/5-bit codes, offset 8/16 */

/* Unweighted symmetric block: d = (largest-magnitude value) / -half, code = trunc(x / d + half + 0.5) capped. */
static float symmetric_ref(const float *xb, int half, uint8_t *L) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; ++j) {
        if (amax < fabsf(xb[j])) {
            amax = fabsf(xb[j]);
            max = xb[j];
        }
    }
    const float d = max / (float)-half;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const float bias = (float)half + 0.5f;
    for (int j = 0; j < 32; ++j) {
        int q = (int)(xb[j] * id + bias);
        L[j] = (uint8_t)(q < 2 * half - 1 ? q : 2 * half - 1);
    }
    return d;
}

void qs_qrow_q4_0(const float *x, uint8_t *y, int64_t n, const float *qw) {
    uint8_t L[32];
    float w[32];
    const float sigma2 = qw ? sum_squares(x, n) / (float)n : 0.0f;
    for (int64_t b = 0; b < n / 32; ++b, y += 18) {
        const float *xb = x + 32 * b;
        float d;
        if (qw) {
            block_weights(xb, qw + 32 * b, sigma2, w);
            d = fit_symmetric(8, xb, w, L);
        } else {
            d = symmetric_ref(xb, 8, L);
        }
        put_f16(y, d);
        pack_nibbles(L, y + 2);
    }
}

void qs_qrow_q5_0(const float *x, uint8_t *y, int64_t n, const float *qw) {
    uint8_t L[32];
    float w[32];
    const float sigma2 = qw ? sum_squares(x, n) / (float)n : 0.0f;
    for (int64_t b = 0; b < n / 32; ++b, y += 22) {
        const float *xb = x + 32 * b;
        float d;
        if (qw) {
            block_weights(xb, qw + 32 * b, sigma2, w);
            d = fit_symmetric(16, xb, w, L);
        } else {
            d = symmetric_ref(xb, 16, L);
        }
        put_f16(y, d);
        pack_fivebit(L, y + 2, y + 6);
    }
}

/* ---------------------------------------------------------------- Q4_1, Q5_1: d, min, then codes */

/* Unweighted block with a min: d = (max - min) / nmax, code = trunc((x - min) / d + 0.5), capped at nmax when
 * cap is set (Q4_1; Q5_1 never needs it). Returns d, *mn the min. */
static float affine_ref(const float *xb, int nmax, int cap, uint8_t *L, float *mn) {
    float lo = FLT_MAX, hi = -FLT_MAX;
    for (int j = 0; j < 32; ++j) {
        if (xb[j] < lo) lo = xb[j];
        if (xb[j] > hi) hi = xb[j];
    }
    const float d = (hi - lo) / (float)nmax;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; ++j) {
        int q = (int)((xb[j] - lo) * id + 0.5f);
        L[j] = (uint8_t)(cap && q > nmax ? nmax : q);
    }
    *mn = lo;
    return d;
}

static void qrow_affine(const float *x, uint8_t *y, int64_t n, const float *qw, int nmax) {
    const int five = nmax == 31, bytes = five ? 24 : 20;
    uint8_t L[32];
    float w[32];
    const float sigma2 = qw ? sum_squares(x, n) / (float)n : 0.0f;
    for (int64_t b = 0; b < n / 32; ++b, y += bytes) {
        const float *xb = x + 32 * b;
        float d, m;
        if (qw) {
            float neg_min;
            block_weights(xb, qw + 32 * b, sigma2, w);
            d = fit_affine(nmax, xb, w, L, &neg_min);
            m = -neg_min;
        } else {
            d = affine_ref(xb, nmax, !five, L, &m);
        }
        put_f16(y, d);
        put_f16(y + 2, m);
        if (five) pack_fivebit(L, y + 4, y + 8);
        else pack_nibbles(L, y + 4);
    }
}

void qs_qrow_q4_1(const float *x, uint8_t *y, int64_t n, const float *qw) { qrow_affine(x, y, n, qw, 15); }
void qs_qrow_q5_1(const float *x, uint8_t *y, int64_t n, const float *qw) { qrow_affine(x, y, n, qw, 31); }

/* ---------------------------------------------------------------- Q8_0 (importance weights unused) */

void qs_qrow_q8_0(const float *x, uint8_t *y, int64_t n, const float *qw) {
    (void)qw;
    for (int64_t b = 0; b < n / 32; ++b, y += 34) {
        const float *xb = x + 32 * b;
        const float d = plain_absmax(xb, 32) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        put_f16(y, d);
        for (int j = 0; j < 32; ++j) y[2 + j] = (uint8_t)(int8_t)roundf(xb[j] * id);
    }
}

/* ---------------------------------------------------------------- IQ4_NL, IQ4_XS */

/* One super-block of 32 * nsub values (nsub 1: IQ4_NL, 8: IQ4_XS) with its 16-entry non-linear grid. Each 32-value
 * block gets a weighted best scale: a first guess mapping the largest-magnitude value onto the grid's -127 end,
 * then 15 inverse scales (k - 127) / max for k in [-7, 7], keeping the best weighted fit (strictly better only).
 * IQ4_NL stores that scale as fp16; IQ4_XS stores a 6-bit multiple of one fp16 super-scale per block. The codes
 * are then chosen again against the stored (IQ4_XS) or exact (IQ4_NL) scale. Writes d at y, the IQ4_XS scales at
 * y + 2 .. y + 7, and the packed codes at q4. */
static void iq4_superblock(const float *x, int nsub, const float *qw, uint8_t *y, uint8_t *q4) {
    const int n = 32 * nsub;
    const int8_t *g = IQ4_GRID;
    float w[32], scales[8];
    uint8_t L[256];
    float sigma2 = sum_squares(x, n);
    sigma2 *= 2.f / (float)n;

    float max_scale = 0.0f, amax_scale = 0.0f;
    for (int ib = 0; ib < nsub; ++ib) {
        const float *xb = x + 32 * ib;
        uint8_t *Lb = L + 32 * ib;
        if (qw) block_weights(xb, qw + 32 * ib, sigma2, w);
        else
            for (int j = 0; j < 32; ++j) w[j] = xb[j] * xb[j];
        float amax;
        const float max = signed_absmax(xb, 32, &amax);
        if (amax < 1e-15f) {
            scales[ib] = 0.0f;
            continue;
        }
        float d = -max / (float)g[0];
        float id = 1 / d;
        float sumqx = 0.0f, sumq2 = 0.0f;
        for (int j = 0; j < 32; ++j) {
            int l = nearest_in_grid(g, id * xb[j]);
            Lb[j] = (uint8_t)l;
            float q = (float)g[l];
            sumqx += w[j] * q * xb[j];
            sumq2 += w[j] * q * q;
        }
        d = sumq2 > 0.0f ? sumqx / sumq2 : 0.0f;
        float best = d * sumqx;
        for (int k = -7; k <= 7; ++k) {
            id = (float)(k + g[0]) / max;
            sumqx = sumq2 = 0.0f;
            for (int j = 0; j < 32; ++j) {
                float q = (float)g[nearest_in_grid(g, id * xb[j])];
                sumqx += w[j] * q * xb[j];
                sumq2 += w[j] * q * q;
            }
            if (sumq2 > 0.0f && sumqx * sumqx > best * sumq2) {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        if (fabsf(d) > amax_scale) {
            amax_scale = fabsf(d);
            max_scale = d;
        }
    }

    if (nsub > 1) {
        /* super-scale d = -max_scale / 32; block ib uses d * l, l in [-32, 31] stored as l + 32 (4 + 2 bits) */
        const float d = -max_scale / 32.0f;
        const float id = d != 0.0f ? 1 / d : 0.0f;
        uint16_t sh = 0;
        put_f16(y, d);
        memset(y + 4, 0, (size_t)nsub / 2);
        for (int ib = 0; ib < nsub; ++ib) {
            int l = clampi(round_magic(id * scales[ib]), -32, 31);
            const float dl = d * (float)l;
            const float idl = dl != 0.0f ? 1 / dl : 0.0f;
            for (int j = 0; j < 32; ++j) L[32 * ib + j] = (uint8_t)nearest_in_grid(g, idl * x[32 * ib + j]);
            l += 32;
            y[4 + ib / 2] |= (uint8_t)((l & 15) << (4 * (ib % 2)));
            sh |= (uint16_t)((l >> 4) << (2 * ib));
        }
        y[2] = (uint8_t)(sh & 0xFF);
        y[3] = (uint8_t)(sh >> 8);
    } else {
        put_f16(y, scales[0]);
        const float id = scales[0] != 0.0f ? 1 / scales[0] : 0.0f;
        for (int j = 0; j < 32; ++j) L[j] = (uint8_t)nearest_in_grid(g, id * x[j]);
    }
    for (int ib = 0; ib < nsub; ++ib) pack_nibbles(L + 32 * ib, q4 + 16 * ib);
}

void qs_qrow_iq4_nl(const float *x, uint8_t *y, int64_t n, const float *qw) {
    for (int64_t b = 0; b < n / 32; ++b, y += 18) iq4_superblock(x + 32 * b, 1, qw ? qw + 32 * b : NULL, y, y + 2);
}

void qs_qrow_iq4_xs(const float *x, uint8_t *y, int64_t n, const float *qw) {
    for (int64_t b = 0; b < n / 256; ++b, y += 136)
        iq4_superblock(x + 256 * b, 8, qw ? qw + 256 * b : NULL, y, y + 8);
}

/* ---------------------------------------------------------------- TQ1_0, TQ2_0 (importance weights unused) */

/* -1, 0, 1 (x / amax rounded half away from zero) as the trit 0, 1, 2 */
static inline int trit(float v, float id) { return (int)lroundf(v * id) + 1; }

/* Five (or four, then times 3) trits as a base-3 number, first trit most significant, scaled to a byte by
 * ceil(t * 256 / 243) so the decoder can pull trits off the top with multiplications by 3. */
static inline uint8_t trits_to_byte(int t) { return (uint8_t)((t * 256 + 242) / 243); }

void qs_qrow_tq1_0(const float *x, uint8_t *y, int64_t n, const float *qw) {
    (void)qw;
    for (int64_t b = 0; b < n / 256; ++b, y += 54) {
        const float *xb = x + 256 * b;
        const float d = plain_absmax(xb, 256);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        /* bytes 0..31: values 0..159, byte m holding m, m+32, .., m+128 */
        for (int m = 0; m < 32; ++m) {
            int t = 0;
            for (int k = 0; k < 5; ++k) t = t * 3 + trit(xb[m + 32 * k], id);
            y[m] = trits_to_byte(t);
        }
        /* bytes 32..47: values 160..239, byte 32+m holding 160+m, 176+m, .., 224+m */
        for (int m = 0; m < 16; ++m) {
            int t = 0;
            for (int k = 0; k < 5; ++k) t = t * 3 + trit(xb[160 + m + 16 * k], id);
            y[32 + m] = trits_to_byte(t);
        }
        /* bytes 48..51: values 240..255, byte 48+m holding 240+m, 244+m, 248+m, 252+m and a zero trit last */
        for (int m = 0; m < 4; ++m) {
            int t = 0;
            for (int k = 0; k < 4; ++k) t = t * 3 + trit(xb[240 + m + 4 * k], id);
            y[48 + m] = trits_to_byte(t * 3);
        }
        put_f16(y + 52, d);
    }
}

void qs_qrow_tq2_0(const float *x, uint8_t *y, int64_t n, const float *qw) {
    (void)qw;
    for (int64_t b = 0; b < n / 256; ++b, y += 66) {
        const float *xb = x + 256 * b;
        const float d = plain_absmax(xb, 256);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        /* two halves of 128 values; byte 32*h + m holds values 128h + m + 32k in bits 2k, 2k+1 */
        for (int h = 0; h < 2; ++h)
            for (int m = 0; m < 32; ++m) {
                int q = 0;
                for (int k = 0; k < 4; ++k) q |= (trit(xb[128 * h + m + 32 * k], id) & 3) << (2 * k);
                y[32 * h + m] = (uint8_t)q;
            }
        put_f16(y + 64, d);
    }
}

/* ---------------------------------------------------------------- MXFP4 (importance weights unused) */

/* Half of 2^(e - 127) (the grid holds doubled values), subnormal for e < 2. */
static float e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Grid code whose value times d is nearest to v; the lowest code on ties (so +0 wins over -0). */
static int nearest_fp4(float v, float d) {
    int best = 0;
    float best_err = fabsf((float)FP4_GRID[0] * d - v);
    for (int i = 1; i < 16; ++i) {
        float err = fabsf((float)FP4_GRID[i] * d - v);
        if (err < best_err) {
            best = i;
            best_err = err;
        }
    }
    return best;
}

void qs_qrow_mxfp4(const float *x, uint8_t *y, int64_t n, const float *qw) {
    (void)qw;
    uint8_t L[32];
    for (int64_t b = 0; b < n / 32; ++b, y += 17) {
        const float *xb = x + 32 * b;
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j)
            if (amax < fabsf(xb[j])) amax = fabsf(xb[j]);
        /* shared exponent: floor(log2(amax)) - 2 (the grid tops out at 6 = 1.5 * 2^2), biased by 127; the float
         * goes through int first, so a (never seen) negative exponent wraps as it does on x86 */
        const uint8_t e = amax > 0.0f ? (uint8_t)(int)(floorf(log2f(amax)) - 2 + 127) : 0;
        const float d = e8m0_half(e);
        y[0] = e;
        for (int j = 0; j < 32; ++j) L[j] = (uint8_t)nearest_fp4(xb[j], d);
        pack_nibbles(L, y + 1);
    }
}
