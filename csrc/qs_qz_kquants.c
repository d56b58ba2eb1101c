/* K-quant weight quantizers: Q2_K, Q3_K, Q4_K, Q5_K and Q6_K, one row at a time (docs/quantize.md).
 *
 * Each writes the same bytes as ggml's quantizer of that type: with qw == NULL the bytes of its reference path,
 * otherwise those of its importance-weighted path. The 256-value super-block is split into sub-blocks (16 values
 * for Q2_K, Q3_K and Q6_K, 32 for Q4_K and Q5_K); a search picks each sub-block's float scale (and offset), the
 * sub-block scales are then themselves quantized against one fp16 super-block scale, and finally every value is
 * re-rounded against the scale the decoder will really see.
 *
 * Byte identity rests on doing the float32 arithmetic exactly as ggml does it: every sum is accumulated
 * sequentially in the same order, every product is associated the same way ((w * x) * l, not w * (x * l)),
 * rounding to the nearest integer uses the same add-a-magic-number trick (ties to even, and the same garbage far
 * outside its range), and narrowing integer stores (uint8 / int8) wrap where ggml's wrap. This file is plain C
 * compiled without ISA flags, like ggml-base, so no multiply-add is ever fused on either side. */
/* ggml-base builds its quantizers with -O3: the same here (no fast-math, so the float results do not change). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif
#include <math.h>

#include "qs.h"
#include "qs_quantize_internal.h"

#define SUPER 256        /* values per super-block */
#define ZERO_EPS 1e-15f  /* a group whose largest magnitude is below this counts as all zero */

enum { Q2K_BYTES = 84, Q3K_BYTES = 110, Q4K_BYTES = 144, Q5K_BYTES = 176, Q6K_BYTES = 210 };

/* ---------------------------------------------------------------- small shared pieces */

/* Round to nearest, ties to even: adding 1.5 * 2^23 pushes the integer part into the low mantissa bits, where it
 * is read back off. Only meaningful for |v| < 2^22; beyond that it yields whatever those bits hold, as ggml's
 * does (its range assert is compiled out), so out-of-range inputs still give ggml's bytes. */
static inline int round_near(float v) {
    float t = v + 12582912.f;
    int32_t bits;
    memcpy(&bits, &t, 4);
    return (bits & 0x007fffff) - 0x00400000;
}

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

static inline void put_f16(uint8_t *p, float v) {
    uint16_t h = qs_fp32_to_fp16(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

static inline float get_f16(const uint8_t *p) { return qs_fp16_to_fp32(qs_load_u16(p)); }

/* Four 2-bit planes: byte l of each 32-byte chunk holds values l, l+32, l+64, l+96 of its 128 (Q2_K, Q3_K). */
static void pack_2bit(uint8_t *qs, const uint8_t *L) {
    for (int c = 0; c < SUPER; c += 128)
        for (int l = 0; l < 32; ++l)
            qs[c / 4 + l] = (uint8_t)(L[c + l] | (L[c + l + 32] << 2) | (L[c + l + 64] << 4) | (L[c + l + 96] << 6));
}

/* Sum of squares of one super-block, in order (the importance-weighted paths derive a variance from it). */
static float sum_sq(const float *x) {
    float s = 0;
    for (int i = 0; i < SUPER; ++i) s += x[i] * x[i];
    return s;
}

/* ---------------------------------------------------------------- scale searches */

/* Symmetric scale for n values on the signed grid [-nmax, nmax-1] (Q3_K weighted, Q6_K and Q3_K's scale-of-
 * scales). The grid is anchored so that the value of largest magnitude lands on -nmax; with that anchor and 18
 * perturbed ones (nmax + 0.1*k, k = -9..9, k != 0) the levels are rounded, and the weighted least-squares scale
 * sum(w x l) / sum(w l^2) kept where it explains the most (largest sum(w x l)^2 / sum(w l^2)). Weights are qw,
 * or x^2 without it. L gets level + nmax; an all-zero group gets L = 0 (not nmax) and scale 0. */
static float sym_search(int n, int nmax, const float *x, int8_t *L, const float *qw) {
    float amax = 0, peak = 0;
    for (int i = 0; i < n; ++i) {
        float a = fabsf(x[i]);
        if (a > amax) {
            amax = a;
            peak = x[i];
        }
    }
    if (amax < ZERO_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float inv = (float)-nmax / peak;
    float sxl = 0, sll = 0;
    for (int i = 0; i < n; ++i) {
        int l = clampi(round_near(inv * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        float w = qw ? qw[i] : x[i] * x[i];
        sxl += w * x[i] * (float)l;
        sll += w * (float)l * (float)l;
    }
    float scale = sll != 0 ? sxl / sll : 0.0f;
    float best = scale * sxl;
    for (int k = -9; k <= 9; ++k) {
        if (k == 0) continue;
        inv = -((float)nmax + 0.1f * (float)k) / peak;
        sxl = sll = 0;
        for (int i = 0; i < n; ++i) {
            int l = clampi(round_near(inv * x[i]), -nmax, nmax - 1);
            float w = qw ? qw[i] : x[i] * x[i];
            sxl += w * x[i] * (float)l;
            sll += w * (float)l * (float)l;
        }
        if (sll > 0 && sxl * sxl > best * sll) { /* strictly better only: the earliest anchor wins ties */
            for (int i = 0; i < n; ++i) L[i] = (int8_t)(nmax + clampi(round_near(inv * x[i]), -nmax, nmax - 1));
            scale = sxl / sll;
            best = scale * sxl;
        }
    }
    return scale;
}

/* Q3_K's unweighted sub-block scale (16 values, grid [-4, 3]): round against the largest-magnitude anchor, then
 * up to five passes of coordinate descent. Each pass re-derives every level alone from the least-squares scale
 * of the others (weights x^2) and keeps a change only if it raises sum(w x l)^2 / sum(w l^2); a pass without any
 * change ends it. L gets level + 4 (0 for an all-zero group). */
static float q3_search(const float *x, int8_t *L) {
    const int n = 16, nmax = 4;
    float amax = 0, peak = 0;
    for (int i = 0; i < n; ++i) {
        float a = fabsf(x[i]);
        if (a > amax) {
            amax = a;
            peak = x[i];
        }
    }
    if (amax < ZERO_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float inv = (float)-nmax / peak;
    float sxl = 0, sll = 0;
    for (int i = 0; i < n; ++i) {
        int l = clampi(round_near(inv * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        float w = x[i] * x[i];
        sxl += w * x[i] * (float)l;
        sll += w * (float)l * (float)l;
    }
    for (int pass = 0; pass < 5; ++pass) {
        int changed = 0;
        for (int i = 0; i < n; ++i) {
            float w = x[i] * x[i];
            float sxl_o = sxl - w * x[i] * (float)L[i]; /* the sums without value i */
            if (!(sxl_o > 0)) continue;
            float sll_o = sll - w * (float)L[i] * (float)L[i];
            int nl = clampi(round_near(x[i] * sll_o / sxl_o), -nmax, nmax - 1);
            if (nl == L[i]) continue;
            sxl_o += w * x[i] * (float)nl;
            sll_o += w * (float)nl * (float)nl;
            if (sll_o > 0 && sxl_o * sxl_o * sll > sxl * sxl * sll_o) {
                L[i] = (int8_t)nl;
                sxl = sxl_o;
                sll = sll_o;
                ++changed;
            }
        }
        if (!changed) break;
    }
    for (int i = 0; i < n; ++i) L[i] = (int8_t)(L[i] + nmax);
    return sll > 0.0f ? sxl / sll : 0.0f;
}

/* Scale and offset for n values on the unsigned grid [0, nmax] with x ~ scale * l + min, min <= 0 (Q2_K, Q4_K,
 * Q5_K sub-blocks). Start from the plain min..max mapping; then for nstep + 1 grid widths
 * (nmax + rmin + rdelta * k) / (max - min) round the levels and solve the weighted 2x2 least-squares problem for
 * scale and min (refitting the scale alone where the solved min is positive), keeping the candidate only if its
 * weighted error (|diff| when mad, else diff^2) is strictly smaller. Note that min is the running best offset:
 * once a candidate is kept, the later grids are laid from the fitted min, not from the data minimum (ggml reuses
 * one variable for both). Returns the scale, *neg_min = -min (>= 0). */
static float affine_search(int n, int nmax, const float *x, const float *w, uint8_t *L, float *neg_min, float rmin,
                           float rdelta, int nstep, int mad) {
    uint8_t cand[32];
    float min = x[0], max = x[0];
    float sw = w[0];
    float swx = sw * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sw += w[i];
        swx += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *neg_min = -min;
        return 0.f;
    }
    float inv = (float)nmax / (max - min);
    float scale = 1 / inv;
    float best = 0;
    for (int i = 0; i < n; ++i) {
        L[i] = (uint8_t)clampi(round_near(inv * (x[i] - min)), 0, nmax);
        float diff = scale * (float)L[i] + min - x[i];
        diff = mad ? fabsf(diff) : diff * diff;
        best += w[i] * diff;
    }
    for (int k = 0; k <= nstep; ++k) {
        inv = (rmin + rdelta * (float)k + (float)nmax) / (max - min);
        float sl = 0, sll = 0, sxl = 0;
        for (int i = 0; i < n; ++i) {
            int l = clampi(round_near(inv * (x[i] - min)), 0, nmax);
            cand[i] = (uint8_t)l;
            sl += w[i] * (float)l;
            sll += w[i] * (float)l * (float)l;
            sxl += w[i] * (float)l * x[i];
        }
        float det = sw * sll - sl * sl;
        if (!(det > 0)) continue;
        float s = (sw * sxl - swx * sl) / det;
        float m = (sll * swx - sl * sxl) / det;
        if (m > 0) {
            m = 0;
            s = sxl / sll;
        }
        float err = 0;
        for (int i = 0; i < n; ++i) {
            float diff = s * (float)cand[i] + m - x[i];
            diff = mad ? fabsf(diff) : diff * diff;
            err += w[i] * diff;
        }
        if (err < best) {
            memcpy(L, cand, (size_t)n);
            best = err;
            scale = s;
            min = m;
        }
    }
    *neg_min = -min;
    return scale;
}

/* Weighted quantization of n non-negative values (sub-block scales or offsets) on [0, nmax] with no offset, for
 * the importance-weighted paths. Of nine grid widths ((nmax + 0.1*k) / max, k = -4..4) the one with the smallest
 * weighted squared error is taken (strictly smaller: the plain width wins ties), then up to five passes of the
 * same coordinate descent as q3_search refine single levels. Levels have no lower clamp: a negative input rounds
 * to a negative level, which the uint8 L stores wrapped while the running sums use the unwrapped value. */
static float pos_search(int n, int nmax, const float *x, uint8_t *L, const float *w) {
    float max = 0;
    for (int i = 0; i < n; ++i) max = max > x[i] ? max : x[i];
    if (max < ZERO_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float inv = (float)nmax / max;
    for (int i = 0; i < n; ++i) L[i] = (uint8_t)round_near(inv * x[i]);
    float scale = 1 / inv;
    float best = 0;
    for (int i = 0; i < n; ++i) {
        float diff = x[i] - scale * (float)L[i];
        best += w[i] * diff * diff;
    }
    for (int k = -4; k <= 4; ++k) {
        if (k == 0) continue;
        float inv_k = (0.1f * (float)k + (float)nmax) / max;
        float scale_k = 1 / inv_k;
        float err = 0;
        for (int i = 0; i < n; ++i) {
            int l = round_near(inv_k * x[i]);
            if (l > nmax) l = nmax;
            float diff = x[i] - scale_k * (float)l;
            err += w[i] * diff * diff;
        }
        if (err < best) {
            best = err;
            inv = inv_k;
        }
    }
    float sxl = 0, sll = 0;
    for (int i = 0; i < n; ++i) {
        int l = round_near(inv * x[i]);
        if (l > nmax) l = nmax;
        L[i] = (uint8_t)l;
        sxl += w[i] * x[i] * (float)l;
        sll += w[i] * (float)l * (float)l;
    }
    for (int pass = 0; pass < 5; ++pass) {
        int changed = 0;
        for (int i = 0; i < n; ++i) {
            float sxl_o = sxl - w[i] * x[i] * (float)L[i];
            float sll_o = sll - w[i] * (float)L[i] * (float)L[i];
            if (!(sxl_o > 0 && sll_o > 0)) continue;
            int nl = round_near(x[i] * sll_o / sxl_o);
            if (nl > nmax) nl = nmax;
            if (nl == L[i]) continue;
            sxl_o += w[i] * x[i] * (float)nl;
            sll_o += w[i] * (float)nl * (float)nl;
            if (sxl_o * sxl_o * sll > sxl * sxl * sll_o) {
                L[i] = (uint8_t)nl;
                sxl = sxl_o;
                sll = sll_o;
                ++changed;
            }
        }
        if (!changed) break;
    }
    return sll > 0.0f ? sxl / sll : 0.0f;
}

/* ---------------------------------------------------------------- Q2_K: scales[16] qs[64] d dmin */

void qs_qrow_q2_K(const float *x, uint8_t *y, int64_t n, const float *qw) {
    uint8_t L[SUPER], sc[16];
    float scales[16], mins[16], w[16];
    for (int64_t b = 0; b < n / SUPER; ++b, x += SUPER, y += Q2K_BYTES) {
        const float *bw = qw ? qw + b * SUPER : NULL;
        float d, dmin;
        if (!bw) {
            /* each sub-block fitted with |x| weights and absolute error; scales and offsets quantized to
             * 4 bits against their maxima */
            float max_scale = 0, max_min = 0;
            for (int j = 0; j < 16; ++j) {
                for (int l = 0; l < 16; ++l) w[l] = fabsf(x[16 * j + l]);
                scales[j] = affine_search(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], -0.5f, 0.1f, 15, 1);
                if (scales[j] > max_scale) max_scale = scales[j];
                if (mins[j] > max_min) max_min = mins[j];
            }
            if (max_scale > 0) {
                float inv = 15.f / max_scale;
                for (int j = 0; j < 16; ++j) sc[j] = (uint8_t)round_near(inv * scales[j]);
                put_f16(y + 80, max_scale / 15.f);
            } else {
                memset(sc, 0, 16);
                put_f16(y + 80, 0.f);
            }
            if (max_min > 0) {
                float inv = 15.f / max_min;
                for (int j = 0; j < 16; ++j) sc[j] |= (uint8_t)((unsigned)round_near(inv * mins[j]) << 4);
                put_f16(y + 82, max_min / 15.f);
            } else {
                put_f16(y + 82, 0.f);
            }
            d = get_f16(y + 80);
            dmin = get_f16(y + 82);
        } else {
            /* weights qw * sqrt(var + x^2) with var the block's mean square; squared error; the 16 scales and
             * the 16 offsets each quantized by pos_search, weighted by the sub-block's total weight */
            uint8_t Ls[16], Lm[16];
            float sw[16];
            float var = sum_sq(x) / SUPER;
            for (int j = 0; j < 16; ++j) {
                float s = 0;
                for (int l = 0; l < 16; ++l) {
                    w[l] = bw[16 * j + l] * sqrtf(var + x[16 * j + l] * x[16 * j + l]);
                    s += w[l];
                }
                sw[j] = s;
                scales[j] = affine_search(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], -0.9f, 0.05f, 36, 0);
            }
            float dm = pos_search(16, 15, scales, Ls, sw);
            float mm = pos_search(16, 15, mins, Lm, sw);
            put_f16(y + 80, dm);
            put_f16(y + 82, mm);
            d = get_f16(y + 80);
            dmin = get_f16(y + 82);
            for (int j = 0; j < 16; ++j) sc[j] = (uint8_t)(Ls[j] | (Lm[j] << 4));
        }
        memcpy(y, sc, 16);
        /* final levels against the stored scales; a sub-block whose scale reads 0 keeps its search levels */
        for (int j = 0; j < 16; ++j) {
            const float ds = d * (float)(sc[j] & 0xF);
            if (ds == 0) continue;
            const float dm = dmin * (float)(sc[j] >> 4);
            for (int l = 0; l < 16; ++l) L[16 * j + l] = (uint8_t)clampi(round_near((x[16 * j + l] + dm) / ds), 0, 3);
        }
        pack_2bit(y + 16, L);
    }
}

/* ---------------------------------------------------------------- Q3_K: hmask[32] qs[64] scales[12] d */

/* 16 six-bit scales: low nibbles of 0-7 in bytes 0-7, of 8-15 in the high nibbles of bytes 0-7; the top two bits
 * of scale j go to byte 8 + j%4 at bit 2*(j/4). */
static void q3_pack_scales(uint8_t *s, const int *ls) {
    memset(s, 0, 12);
    for (int j = 0; j < 16; ++j) {
        int l = ls[j];
        if (j < 8) s[j] = (uint8_t)(l & 0xF);
        else s[j - 8] |= (uint8_t)((l & 0xF) << 4);
        s[8 + j % 4] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
    }
}

static int q3_scale(const uint8_t *s, int j) {
    int lo = j < 8 ? s[j] & 0xF : s[j - 8] >> 4;
    return (lo | (((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
}

void qs_qrow_q3_K(const float *x, uint8_t *y, int64_t n, const float *qw) {
    int8_t L[SUPER];
    float scales[16];
    int ls[16];
    for (int64_t b = 0; b < n / SUPER; ++b, x += SUPER, y += Q3K_BYTES) {
        const float *bw = qw ? qw + b * SUPER : NULL;
        uint8_t *s = y + 96;
        if (!bw) {
            /* the signed scale of largest magnitude maps to -32 */
            float amax = 0, max_scale = 0;
            for (int j = 0; j < 16; ++j) {
                scales[j] = q3_search(x + 16 * j, L + 16 * j);
                float a = fabsf(scales[j]);
                if (a > amax) {
                    amax = a;
                    max_scale = scales[j];
                }
            }
            if (max_scale != 0) {
                float inv = -32.f / max_scale;
                for (int j = 0; j < 16; ++j) {
                    int8_t l = (int8_t)round_near(inv * scales[j]); /* narrowed before the clamp, as ggml */
                    ls[j] = clampi(l, -32, 31) + 32;
                }
                q3_pack_scales(s, ls);
                put_f16(y + 108, 1 / inv);
            } else {
                memset(s, 0, 12);
                put_f16(y + 108, 0.f);
            }
        } else {
            /* weights qw * sqrt(2 * mean square + x^2); the 16 scales quantized by sym_search weighted by the
             * sub-block's total weight */
            float w[16], sw[16];
            int8_t Ls[16];
            float var = 2 * sum_sq(x) / SUPER;
            for (int j = 0; j < 16; ++j) {
                float t = 0;
                for (int l = 0; l < 16; ++l) {
                    w[l] = bw[16 * j + l] * sqrtf(var + x[16 * j + l] * x[16 * j + l]);
                    t += w[l];
                }
                sw[j] = t;
                scales[j] = sym_search(16, 4, x + 16 * j, L + 16 * j, w);
            }
            float d_block = sym_search(16, 32, scales, Ls, sw);
            for (int j = 0; j < 16; ++j) ls[j] = Ls[j];
            q3_pack_scales(s, ls);
            put_f16(y + 108, d_block);
        }
        const float d = get_f16(y + 108);
        for (int j = 0; j < 16; ++j) {
            const float ds = d * (float)q3_scale(s, j);
            if (ds == 0) continue;
            for (int l = 0; l < 16; ++l) L[16 * j + l] = (int8_t)(clampi(round_near(x[16 * j + l] / ds), -4, 3) + 4);
        }
        /* bit 2 of value j goes to hmask[j % 32] at bit j / 32; the low two bits to the 2-bit planes */
        uint8_t low[SUPER];
        memset(y, 0, 32);
        for (int j = 0; j < SUPER; ++j) {
            int l = L[j];
            if (l > 3) {
                y[j % 32] |= (uint8_t)(1u << (j / 32));
                l -= 4;
            }
            low[j] = (uint8_t)l;
        }
        pack_2bit(y + 32, low);
    }
}

/* ---------------------------------------------------------------- Q4_K and Q5_K: d dmin scales[12] ... */

/* 8 six-bit scales and 8 six-bit mins in 12 bytes: for j < 4 scale j in byte j and min j in byte j+4 (low six
 * bits); for j >= 4 the low nibbles share byte j+4 and the top two bits ride in bits 6-7 of bytes j-4 and j. */
static void k4_pack_scales(uint8_t *s, const uint8_t *ls, const uint8_t *lm) {
    for (int j = 0; j < 8; ++j) {
        if (j < 4) {
            s[j] = ls[j];
            s[j + 4] = lm[j];
        } else {
            s[j + 4] = (uint8_t)((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
            s[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            s[j] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
}

static void k4_get_scale(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* The part Q4_K and Q5_K share (nmax 15 or 31): writes d, dmin and the 12 scale bytes into y and the final levels
 * (0..nmax) into L. Without importance weights each sub-block is fitted with weights rms + |x| and the scales and
 * mins are rounded against their maxima; with them the weights are qw * sqrt(2 * mean square + x^2) and the
 * scales and mins are quantized by pos_search, weighted by the sub-block's total weight. */
static void k45_levels(const float *x, uint8_t *y, const float *bw, int nmax, uint8_t *L) {
    float scales[8], mins[8], w[32];
    uint8_t ls[8], lm[8];
    if (!bw) {
        const float rmin = nmax == 15 ? -1.f : -0.5f;
        const int nstep = nmax == 15 ? 20 : 15;
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < 8; ++j) {
            const float *xs = x + 32 * j;
            float s2 = 0;
            for (int l = 0; l < 32; ++l) s2 += xs[l] * xs[l];
            float rms = sqrtf(s2 / 32);
            for (int l = 0; l < 32; ++l) w[l] = rms + fabsf(xs[l]);
            scales[j] = affine_search(32, nmax, xs, w, L + 32 * j, &mins[j], rmin, 0.1f, nstep, 0);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        float inv_s = max_scale > 0 ? 63.f / max_scale : 0.f;
        float inv_m = max_min > 0 ? 63.f / max_min : 0.f;
        for (int j = 0; j < 8; ++j) {
            uint8_t a = (uint8_t)round_near(inv_s * scales[j]); /* narrowed before the clamp, as ggml */
            uint8_t c = (uint8_t)round_near(inv_m * mins[j]);
            ls[j] = a < 63 ? a : 63;
            lm[j] = c < 63 ? c : 63;
        }
        k4_pack_scales(y + 4, ls, lm);
        put_f16(y, max_scale / 63.f);
        put_f16(y + 2, max_min / 63.f);
    } else {
        float sw[8];
        float var = 2 * sum_sq(x) / SUPER;
        for (int j = 0; j < 8; ++j) {
            const float *xs = x + 32 * j;
            for (int l = 0; l < 32; ++l) w[l] = bw[32 * j + l] * sqrtf(var + xs[l] * xs[l]);
            float t = 0;
            for (int l = 0; l < 32; ++l) t += w[l];
            sw[j] = t;
            scales[j] = affine_search(32, nmax, xs, w, L + 32 * j, &mins[j], -0.9f, 0.05f, 36, 0);
        }
        float d_block = pos_search(8, 63, scales, ls, sw);
        float m_block = pos_search(8, 63, mins, lm, sw);
        if (nmax == 31) { /* ggml clamps a wrapped (negative) level for Q5_K only */
            for (int j = 0; j < 8; ++j) {
                if (ls[j] > 63) ls[j] = 63;
                if (lm[j] > 63) lm[j] = 63;
            }
        }
        k4_pack_scales(y + 4, ls, lm);
        put_f16(y, d_block);
        put_f16(y + 2, m_block);
    }
    const float d = get_f16(y), dmin = get_f16(y + 2);
    for (int j = 0; j < 8; ++j) {
        int sc, m;
        k4_get_scale(y + 4, j, &sc, &m);
        const float ds = d * (float)sc;
        if (ds == 0) continue;
        const float dm = dmin * (float)m;
        for (int l = 0; l < 32; ++l) L[32 * j + l] = (uint8_t)clampi(round_near((x[32 * j + l] + dm) / ds), 0, nmax);
    }
}

void qs_qrow_q4_K(const float *x, uint8_t *y, int64_t n, const float *qw) {
    uint8_t L[SUPER];
    for (int64_t b = 0; b < n / SUPER; ++b, x += SUPER, y += Q4K_BYTES) {
        k45_levels(x, y, qw ? qw + b * SUPER : NULL, 15, L);
        /* each 32-byte chunk: values c..c+31 in the low nibbles, c+32..c+63 in the high */
        uint8_t *q = y + 16;
        for (int c = 0; c < SUPER; c += 64, q += 32)
            for (int l = 0; l < 32; ++l) q[l] = (uint8_t)(L[c + l] | (L[c + l + 32] << 4));
    }
}

void qs_qrow_q5_K(const float *x, uint8_t *y, int64_t n, const float *qw) {
    uint8_t L[SUPER];
    for (int64_t b = 0; b < n / SUPER; ++b, x += SUPER, y += Q5K_BYTES) {
        k45_levels(x, y, qw ? qw + b * SUPER : NULL, 31, L);
        /* nibbles as Q4_K; bit 4 of value c+l (c = 64*p) goes to qh[l] bit 2p, of value c+32+l to bit 2p+1 */
        uint8_t *qh = y + 16, *q = y + 48;
        memset(qh, 0, 32);
        for (int c = 0, p = 0; c < SUPER; c += 64, ++p, q += 32) {
            for (int l = 0; l < 32; ++l) {
                int a = L[c + l], e = L[c + l + 32];
                if (a > 15) {
                    a -= 16;
                    qh[l] |= (uint8_t)(1u << (2 * p));
                }
                if (e > 15) {
                    e -= 16;
                    qh[l] |= (uint8_t)(2u << (2 * p));
                }
                q[l] = (uint8_t)(a | (e << 4));
            }
        }
    }
}

/* ---------------------------------------------------------------- Q6_K: ql[128] qh[64] scales[16] d */

void qs_qrow_q6_K(const float *x, uint8_t *y, int64_t n, const float *qw) {
    int8_t L[SUPER];
    float scales[16];
    for (int64_t b = 0; b < n / SUPER; ++b, x += SUPER, y += Q6K_BYTES) {
        /* weighted: the raw importance weights (no variance term), unlike the other types */
        const float *bw = qw ? qw + b * SUPER : NULL;
        float amax = 0, max_scale = 0;
        for (int j = 0; j < 16; ++j) {
            scales[j] = sym_search(16, 32, x + 16 * j, L + 16 * j, bw ? bw + 16 * j : NULL);
            float a = fabsf(scales[j]);
            if (a > amax) {
                amax = a;
                max_scale = scales[j];
            }
        }
        if (amax < ZERO_EPS) {
            memset(y, 0, Q6K_BYTES);
            continue;
        }
        /* the signed scale of largest magnitude maps to -128; int8 scales */
        float inv = -128.f / max_scale;
        put_f16(y + 208, 1 / inv);
        int8_t *sc = (int8_t *)(y + 192);
        for (int j = 0; j < 16; ++j) {
            int l = round_near(inv * scales[j]);
            sc[j] = (int8_t)(l < 127 ? l : 127);
        }
        const float d = get_f16(y + 208);
        for (int j = 0; j < 16; ++j) {
            const float ds = d * (float)sc[j];
            if (ds == 0) continue;
            for (int l = 0; l < 16; ++l) L[16 * j + l] = (int8_t)(clampi(round_near(x[16 * j + l] / ds), -32, 31) + 32);
        }
        /* per 128 values: ql[l] = low nibbles of values l and l+64, ql[l+32] of l+32 and l+96; qh[l] the top two
         * bits of l, l+32, l+64, l+96 */
        uint8_t *ql = y, *qh = y + 128;
        for (int c = 0; c < SUPER; c += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; ++l) {
                const int a = L[c + l], e = L[c + l + 32], f = L[c + l + 64], g = L[c + l + 96];
                ql[l] = (uint8_t)((a & 0xF) | ((f & 0xF) << 4));
                ql[l + 32] = (uint8_t)((e & 0xF) | ((g & 0xF) << 4));
                qh[l] = (uint8_t)((a >> 4) | ((e >> 4) << 2) | ((f >> 4) << 4) | ((g >> 4) << 6));
            }
        }
    }
}
