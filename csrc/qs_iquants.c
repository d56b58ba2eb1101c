/* Scalar dequantization of the i-quants, the ternary and the FP4 types (docs/quant-formats.md, "I-quants,
 * ternary and FP4 types"). Each value is the float32 product chain of the numpy reference (core/quant/iquants.py)
 * in the same order, so the two agree bit for bit (tests/test_native_iquants.py). */
#include <math.h>
#include <string.h>

#include "qs.h"
#include "qs_iq_grids.h"
#include "qs_quant_internal.h"

static inline float f16at(const uint8_t *p) { return qs_fp16_to_fp32(qs_load_u16(p)); }

/* ggml's ksigns_iq2xs rule: 7 stored sign bits, the 8th makes the number of minus signs even */
static inline uint8_t ksign(uint32_t i7) {
    i7 &= 127;
    return (uint8_t)(i7 | ((uint32_t)__builtin_parity(i7) << 7));
}

static inline float sgn(uint8_t bits, int j) { return (bits >> j) & 1 ? -1.0f : 1.0f; }

void qs_deq_iq2_xxs(const uint8_t *b, float *y) {
    const float d = f16at(b);
    for (int g = 0; g < 8; ++g, y += 32) {
        const uint8_t *q = b + 2 + 8 * g;
        const uint32_t aux = qs_load_u32(q + 4);
        const float db = d * (0.5f + (float)(aux >> 28)) * 0.25f;
        for (int l = 0; l < 4; ++l) {
            const uint8_t *pt = QS_GRID_IQ2_XXS[q[l]];
            const uint8_t s = ksign(aux >> (7 * l));
            for (int j = 0; j < 8; ++j) y[8 * l + j] = db * (float)pt[j] * sgn(s, j);
        }
    }
}

void qs_deq_iq2_xs(const uint8_t *b, float *y) {
    const float d = f16at(b);
    for (int e = 0; e < 32; ++e, y += 8) {
        const uint16_t q = qs_load_u16(b + 2 + 2 * e);
        const int sc = (b[66 + e / 4] >> (4 * ((e / 2) & 1))) & 15; /* one scale per 16 elements */
        const float db = d * (0.5f + (float)sc) * 0.25f;
        const uint8_t *pt = QS_GRID_IQ2_XS[q & 511];
        const uint8_t s = ksign(q >> 9);
        for (int j = 0; j < 8; ++j) y[j] = db * (float)pt[j] * sgn(s, j);
    }
}

void qs_deq_iq2_s(const uint8_t *b, float *y) {
    const float d = f16at(b);
    for (int e = 0; e < 32; ++e, y += 8) {
        const int idx = b[2 + e] | (((b[66 + e / 4] >> (2 * (e % 4))) & 3) << 8);
        const int sc = (b[74 + e / 4] >> (4 * ((e / 2) & 1))) & 15;
        const float db = d * (0.5f + (float)sc) * 0.25f;
        const uint8_t *pt = QS_GRID_IQ2_S[idx];
        const uint8_t s = b[34 + e];
        for (int j = 0; j < 8; ++j) y[j] = db * (float)pt[j] * sgn(s, j);
    }
}

void qs_deq_iq3_xxs(const uint8_t *b, float *y) {
    const float d = f16at(b);
    for (int g = 0; g < 8; ++g, y += 32) {
        const uint32_t aux = qs_load_u32(b + 66 + 4 * g);
        const float db = d * (0.5f + (float)(aux >> 28)) * 0.5f;
        for (int l = 0; l < 4; ++l) {
            const uint8_t s = ksign(aux >> (7 * l));
            const uint8_t *p0 = QS_GRID_IQ3_XXS[b[2 + 8 * g + 2 * l]], *p1 = QS_GRID_IQ3_XXS[b[3 + 8 * g + 2 * l]];
            for (int j = 0; j < 4; ++j) {
                y[8 * l + j] = db * (float)p0[j] * sgn(s, j);
                y[8 * l + 4 + j] = db * (float)p1[j] * sgn(s, 4 + j);
            }
        }
    }
}

void qs_deq_iq3_s(const uint8_t *b, float *y) {
    const float d = f16at(b);
    for (int g = 0; g < 8; ++g) {
        const int sc = (b[106 + g / 2] >> (4 * (g & 1))) & 15;
        const float db = d * (float)(1 + 2 * sc);
        for (int e = 8 * g; e < 8 * g + 8; ++e) { /* 8 grid points of 4 elements per group */
            const int idx = b[2 + e] | (((b[66 + e / 8] >> (e % 8)) & 1) << 8);
            const uint8_t *pt = QS_GRID_IQ3_S[idx];
            for (int j = 0; j < 4; ++j) {
                const int el = 4 * e + j;
                y[el] = db * (float)pt[j] * sgn(b[74 + el / 8], el % 8);
            }
        }
    }
}

void qs_deq_iq1_s(const uint8_t *b, float *y) {
    const float d = f16at(b);
    for (int g = 0; g < 8; ++g, y += 32) {
        const uint16_t qh = qs_load_u16(b + 34 + 2 * g);
        const float dl = d * (2.0f * (float)((qh >> 12) & 7) + 1.0f);
        const float delta = qh & 0x8000 ? -0.125f : 0.125f;
        for (int l = 0; l < 4; ++l) {
            const int8_t *pt = QS_GRID_IQ1_S[b[2 + 4 * g + l] | (((qh >> (3 * l)) & 7) << 8)];
            for (int j = 0; j < 8; ++j) y[8 * l + j] = dl * ((float)pt[j] + delta);
        }
    }
}

void qs_deq_iq1_m(const uint8_t *b, float *y) {
    uint16_t sw[4];
    for (int i = 0; i < 4; ++i) sw[i] = qs_load_u16(b + 48 + 2 * i);
    const uint16_t dbits = (uint16_t)((sw[0] >> 12) | ((sw[1] >> 8) & 0x00F0) | ((sw[2] >> 4) & 0x0F00) |
                                      (sw[3] & 0xF000));
    const float d = qs_fp16_to_fp32(dbits);
    for (int e = 0; e < 32; ++e, y += 8) { /* 8 elements per grid point, a 3-bit scale per 16 */
        const int nib = (b[32 + e / 2] >> (4 * (e & 1))) & 15;
        const int s = e / 2, sc = (sw[s / 4] >> (3 * (s % 4))) & 7;
        const float dl = d * (2.0f * (float)sc + 1.0f);
        const float delta = nib & 8 ? -0.125f : 0.125f;
        const int8_t *pt = QS_GRID_IQ1_S[b[e] | ((nib & 7) << 8)];
        for (int j = 0; j < 8; ++j) y[j] = dl * ((float)pt[j] + delta);
    }
}

/* TQ1_0: digit k of a byte q is ((q * 3^k) mod 256) * 3 >> 8 */
static inline int trit(uint8_t q, int k) {
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    return (int)(((unsigned)(uint8_t)(q * pow3[k]) * 3u) >> 8);
}

void qs_deq_tq1_0(const uint8_t *b, float *y) {
    const float d = f16at(b + 52);
    for (int k = 0; k < 5; ++k)
        for (int j = 0; j < 32; ++j) y[32 * k + j] = d * (float)(trit(b[j], k) - 1);
    for (int k = 0; k < 5; ++k)
        for (int j = 0; j < 16; ++j) y[160 + 16 * k + j] = d * (float)(trit(b[32 + j], k) - 1);
    for (int k = 0; k < 4; ++k)
        for (int j = 0; j < 4; ++j) y[240 + 4 * k + j] = d * (float)(trit(b[48 + j], k) - 1);
}

void qs_deq_tq2_0(const uint8_t *b, float *y) {
    const float d = f16at(b + 64);
    for (int h = 0; h < 2; ++h)
        for (int k = 0; k < 4; ++k)
            for (int j = 0; j < 32; ++j) y[128 * h + 32 * k + j] = d * (float)(((b[32 * h + j] >> (2 * k)) & 3) - 1);
}

static const int8_t FP4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* ggml_e8m0_to_fp32_half */
static inline float e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

void qs_deq_mxfp4(const uint8_t *b, float *y) {
    const float d = e8m0_half(b[0]);
    for (int j = 0; j < 16; ++j) {
        y[j] = d * (float)FP4[b[1 + j] & 15];
        y[16 + j] = d * (float)FP4[b[1 + j] >> 4];
    }
}

/* NVFP4's unsigned E4M3 scale (bias 7; 0 and 0x7F read as 0), halved */
static inline float ue4m3_half(uint8_t x) {
    if (x == 0 || x == 0x7F) return 0.0f;
    const int exp = (x >> 3) & 15, man = x & 7;
    const float raw = exp == 0 ? (float)man * 0x1p-9f : (1.0f + (float)man / 8.0f) * ldexpf(1.0f, exp - 7);
    return raw * 0.5f;
}

void qs_deq_nvfp4(const uint8_t *b, float *y) {
    for (int s = 0; s < 4; ++s, y += 16) {
        const float d = ue4m3_half(b[s]);
        for (int j = 0; j < 8; ++j) {
            y[j] = d * (float)FP4[b[4 + 8 * s + j] & 15];
            y[8 + j] = d * (float)FP4[b[4 + 8 * s + j] >> 4];
        }
    }
}
