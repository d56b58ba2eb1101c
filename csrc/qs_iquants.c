/* Scalar dequantization of the i-quants, the ternary and the FP4 types (docs/quant-formats.md, "I-quants,
 * ternary and FP4 types"). Each value is the float32 product chain of the numpy reference (core/quant/iquants.py)
 * in the same order, so the two agree bit for bit (tests/test_native_iquants.py). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "qs.h"
#include "qs_iq_grids.h"
#include "qs_iquants_neon.h"
#include "qs_quant_internal.h"
#include "qs_slots.h"

static inline float f16at(const uint8_t *p) { return qs_fp16_to_fp32(qs_load_u16(p)); }


static inline float sgn(uint8_t bits, int j) { return (bits >> j) & 1 ? -1.0f : 1.0f; }

void qs_deq_iq2_xxs(const uint8_t *b, float *y) {
    const float d = f16at(b);
    for (int g = 0; g < 8; ++g, y += 32) {
        const uint8_t *q = b + 2 + 8 * g;
        const uint32_t aux = qs_load_u32(q + 4);
        const float db = d * (0.5f + (float)(aux >> 28)) * 0.25f;
        for (int l = 0; l < 4; ++l) {
            const uint8_t *pt = QS_GRID_IQ2_XXS[q[l]];
            const uint8_t s = qs_ksign(aux >> (7 * l));
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
        const uint8_t s = qs_ksign(q >> 9);
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
            const uint8_t s = qs_ksign(aux >> (7 * l));
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


void qs_deq_mxfp4(const uint8_t *b, float *y) {
    const float d = qs_e8m0_half(b[0]);
    for (int j = 0; j < 16; ++j) {
        y[j] = d * (float)FP4[b[1 + j] & 15];
        y[16 + j] = d * (float)FP4[b[1 + j] >> 4];
    }
}


void qs_deq_nvfp4(const uint8_t *b, float *y) {
    for (int s = 0; s < 4; ++s, y += 16) {
        const float d = qs_ue4m3_half(b[s]);
        for (int j = 0; j < 8; ++j) {
            y[j] = d * (float)FP4[b[4 + 8 * s + j] & 15];
            y[8 + j] = d * (float)FP4[b[4 + 8 * s + j] >> 4];
        }
    }
}

/* ---------------------------------------------------------------- dot products against quantized activations */
/* One block as int8 codes, an integer scale per group of gs elements and a float multiplier per outer group
 * (the type-table row's code_outer: the elements that share one, stored once per group):
 * value[i] = mult[i / gs] · ls[i / gs] · code[i] exactly (the IQ1 types: code = 8·G ± 1, mult = d / 8); returns gs. ggml's integer scales stay integers, so a dot
 * sums a whole 256-element block exactly before its one float multiply, as ggml's own dots do. */
static void (*const LATTICE_CODES[QS_TIERS])(int type, const uint8_t *b, int8_t *code) =
    SLOTS(iq_lattice_codes, X1, A1);

static int lattice_codes(int type, const uint8_t *b, int8_t *code, float *mult, int16_t *ls) {
    int gs = type == QS_IQ2_XS || type == QS_IQ2_S ? 16 : 32;
    /* ggml: d · (0.5 + sc) / 4 (IQ2), d · (0.5 + sc) / 2 (IQ3_XXS), d · (1 + 2 sc) (IQ3_S) */
    const float d = f16at(b) * (type == QS_IQ3_S ? 1.0f : type == QS_IQ3_XXS ? 0.25f : 0.125f);
    for (int g = 0; g < 256 / gs; ++g) {
        int sc;
        switch (type) {
        case QS_IQ2_XXS: sc = (int)(qs_load_u32(b + 2 + 8 * g + 4) >> 28); break;
        case QS_IQ2_XS: sc = (b[66 + g / 2] >> (4 * (g & 1))) & 15; break;
        case QS_IQ2_S: sc = (b[74 + g / 2] >> (4 * (g & 1))) & 15; break;
        case QS_IQ3_XXS: sc = (int)(qs_load_u32(b + 66 + 4 * g) >> 28); break;
        default: sc = (b[106 + g / 2] >> (4 * (g & 1))) & 15; break;
        }
        mult[g] = d;
        ls[g] = (int16_t)(2 * sc + 1);
    }
    QS_PICK(LATTICE_CODES)(type, b, code); /* SIMD: the same codes, a 32-element chunk per step */
    return gs;
}

/* The codes straight from the code books and sign bits (the reference of the SIMD decoders). */
void qs_iq_lattice_codes_scalar(int type, const uint8_t *b, int8_t *code) {
    if (type == QS_IQ2_XXS || type == QS_IQ3_XXS) {
        for (int g = 0; g < 8; ++g) {
            const uint32_t aux = qs_load_u32(type == QS_IQ2_XXS ? b + 2 + 8 * g + 4 : b + 66 + 4 * g);
            for (int l = 0; l < 4; ++l) {
                const uint8_t s = qs_ksign(aux >> (7 * l));
                for (int j = 0; j < 8; ++j) {
                    const int e = 8 * l + j;
                    const int v = type == QS_IQ2_XXS ? QS_GRID_IQ2_XXS[b[2 + 8 * g + l]][j]
                                                     : QS_GRID_IQ3_XXS[b[2 + 8 * g + e / 4]][e % 4];
                    code[32 * g + e] = (int8_t)((s >> j) & 1 ? -v : v);
                }
            }
        }
    } else if (type == QS_IQ2_XS) {
        for (int e = 0; e < 32; ++e) {
            const uint16_t q = qs_load_u16(b + 2 + 2 * e);
            const uint8_t s = qs_ksign(q >> 9);
            for (int j = 0; j < 8; ++j) code[8 * e + j] = (int8_t)((s >> j) & 1 ? -QS_GRID_IQ2_XS[q & 511][j] : QS_GRID_IQ2_XS[q & 511][j]);
        }
    } else if (type == QS_IQ2_S) {
        for (int e = 0; e < 32; ++e) {
            const int idx = b[2 + e] | (((b[66 + e / 4] >> (2 * (e % 4))) & 3) << 8);
            for (int j = 0; j < 8; ++j) code[8 * e + j] = (int8_t)((b[34 + e] >> j) & 1 ? -QS_GRID_IQ2_S[idx][j] : QS_GRID_IQ2_S[idx][j]);
        }
    } else {
        for (int e = 0; e < 64; ++e) {
            const int idx = b[2 + e] | (((b[66 + e / 8] >> (e % 8)) & 1) << 8);
            for (int j = 0; j < 4; ++j) {
                const int el = 4 * e + j;
                code[el] = (int8_t)((b[74 + el / 8] >> (el % 8)) & 1 ? -QS_GRID_IQ3_S[idx][j] : QS_GRID_IQ3_S[idx][j]);
            }
        }
    }
}

int qs_codes_iq2_xxs(const uint8_t *b, int8_t *code, float *mult, int16_t *ls) {
    return lattice_codes(QS_IQ2_XXS, b, code, mult, ls);
}
int qs_codes_iq2_xs(const uint8_t *b, int8_t *code, float *mult, int16_t *ls) {
    return lattice_codes(QS_IQ2_XS, b, code, mult, ls);
}
int qs_codes_iq2_s(const uint8_t *b, int8_t *code, float *mult, int16_t *ls) {
    return lattice_codes(QS_IQ2_S, b, code, mult, ls);
}
int qs_codes_iq3_xxs(const uint8_t *b, int8_t *code, float *mult, int16_t *ls) {
    return lattice_codes(QS_IQ3_XXS, b, code, mult, ls);
}
int qs_codes_iq3_s(const uint8_t *b, int8_t *code, float *mult, int16_t *ls) {
    return lattice_codes(QS_IQ3_S, b, code, mult, ls);
}

int qs_codes_iq1_s(const uint8_t *b, int8_t *code, float *mult, int16_t *ls) {
    const float d = f16at(b) * 0.125f;
    for (int g = 0; g < 8; ++g) {
        const uint16_t qh = qs_load_u16(b + 34 + 2 * g);
        mult[g] = d;
        ls[g] = (int16_t)(2 * ((qh >> 12) & 7) + 1);
        const int delta = qh & 0x8000 ? -1 : 1;
        for (int l = 0; l < 4; ++l) {
            const int8_t *pt = QS_GRID_IQ1_S[b[2 + 4 * g + l] | (((qh >> (3 * l)) & 7) << 8)];
            for (int j = 0; j < 8; ++j) code[32 * g + 8 * l + j] = (int8_t)(8 * pt[j] + delta);
        }
    }
    return 32;
}

int qs_codes_iq1_m(const uint8_t *b, int8_t *code, float *mult, int16_t *ls) {
    uint16_t sw[4];
    for (int i = 0; i < 4; ++i) sw[i] = qs_load_u16(b + 48 + 2 * i);
    const float d = qs_fp16_to_fp32((uint16_t)((sw[0] >> 12) | ((sw[1] >> 8) & 0x00F0) | ((sw[2] >> 4) & 0x0F00) |
                                               (sw[3] & 0xF000))) * 0.125f;
    for (int s = 0; s < 16; ++s) {
        mult[s] = d;
        ls[s] = (int16_t)(2 * ((sw[s / 4] >> (3 * (s % 4))) & 7) + 1);
    }
    for (int e = 0; e < 32; ++e) {
        const int nib = (b[32 + e / 2] >> (4 * (e & 1))) & 15;
        const int8_t *pt = QS_GRID_IQ1_S[b[e] | ((nib & 7) << 8)];
        for (int j = 0; j < 8; ++j) code[8 * e + j] = (int8_t)(8 * pt[j] + (nib & 8 ? -1 : 1));
    }
    return 16;
}

int qs_codes_tq1_0(const uint8_t *b, int8_t *code, float *mult, int16_t *ls) {
    mult[0] = f16at(b + 52);
    ls[0] = 1;
    for (int k = 0; k < 5; ++k)
        for (int j = 0; j < 32; ++j) code[32 * k + j] = (int8_t)(trit(b[j], k) - 1);
    for (int k = 0; k < 5; ++k)
        for (int j = 0; j < 16; ++j) code[160 + 16 * k + j] = (int8_t)(trit(b[32 + j], k) - 1);
    for (int k = 0; k < 4; ++k)
        for (int j = 0; j < 4; ++j) code[240 + 4 * k + j] = (int8_t)(trit(b[48 + j], k) - 1);
    return 256;
}

int qs_codes_tq2_0(const uint8_t *b, int8_t *code, float *mult, int16_t *ls) {
    mult[0] = f16at(b + 64);
    ls[0] = 1;
    for (int h = 0; h < 2; ++h)
        for (int k = 0; k < 4; ++k)
            for (int j = 0; j < 32; ++j) code[128 * h + 32 * k + j] = (int8_t)(((b[32 * h + j] >> (2 * k)) & 3) - 1);
    return 256;
}

int qs_codes_mxfp4(const uint8_t *b, int8_t *code, float *mult, int16_t *ls) {
    mult[0] = qs_e8m0_half(b[0]);
    ls[0] = 1;
    for (int j = 0; j < 16; ++j) {
        code[j] = FP4[b[1 + j] & 15];
        code[16 + j] = FP4[b[1 + j] >> 4];
    }
    return 32;
}

int qs_codes_nvfp4(const uint8_t *b, int8_t *code, float *mult, int16_t *ls) {
    for (int s = 0; s < 4; ++s) {
        mult[s] = qs_ue4m3_half(b[s]);
        ls[s] = 1;
        for (int j = 0; j < 8; ++j) {
            code[16 * s + j] = FP4[b[4 + 8 * s + j] & 15];
            code[16 * s + 8 + j] = FP4[b[4 + 8 * s + j] >> 4];
        }
    }
    return 16;
}

/* A row of k elements as codes, one multiplier and one integer scale per group (its codes function block by block);
 * returns the group size (0 for a type without codes). */
int qs_iq_row_codes(qs_codes_fn fn, int elems, int bytes, const uint8_t *w, int64_t k, int8_t *codes, float *mults,
                    int16_t *ls) {
    int gs = 0;
    for (int64_t i = 0; i < k / elems; ++i) {
        float m[16];
        int16_t l[16];
        gs = fn(w + i * bytes, codes + i * elems, m, l);
        if (!gs) return 0;
        memcpy(mults + i * (elems / gs), m, (size_t)(elems / gs) * sizeof(float));
        memcpy(ls + i * (elems / gs), l, (size_t)(elems / gs) * sizeof(int16_t));
    }
    return gs;
}

/* Σ over the outer groups, in order, of (mult · d_x) · Σ_groups ls · Σ code · q: the 256-element types against
 * Q8_K (one f32 d per 256: one float multiply-add per block, as ggml), MXFP4 and NVFP4 against Q8_0 (an fp16 d
 * per 32; NVFP4's fp8 scales make its outer group 16). The integer sums are exact, so any ISA gets the same bits. */
float qs_iq_dot_codes_scalar(const int8_t *codes, const float *mults, const int16_t *ls, int gs, int os, int q8k,
                             int64_t k, const uint8_t *x) {
    float s = 0.0f;
    for (int64_t o0 = 0; o0 < k; o0 += os) {
        float dx;
        const int8_t *q = qs_iq_act(x, o0, q8k, &dx);
        int32_t isum = 0;
        for (int g0 = 0; g0 < os; g0 += gs) {
            int32_t gsum = 0;
            for (int j = 0; j < gs; ++j) gsum += codes[o0 + g0 + j] * q[g0 + j];
            isum += ls[(o0 + g0) / gs] * gsum;
        }
        s = fmaf(mults[o0 / gs] * dx, (float)isum, s); /* fused, as the SIMD kernels may fuse */
    }
    return s;
}

/* One row: decoded to codes, then one running sum over all its groups (what the many-column path does too) */
static float dot_codes(qs_codes_fn fn, int elems, int bytes, int os, int64_t n, const uint8_t *w, const uint8_t *x) {
    const int q8k = elems == 256;
    int8_t stack_codes[4096];
    float stack_mults[256];
    int16_t stack_ls[256];
    const int big = n > 4096;
    int8_t *codes = big ? (int8_t *)malloc((size_t)n) : stack_codes;
    float *mults = big ? (float *)malloc((size_t)(n / 16 + 1) * sizeof(float)) : stack_mults;
    int16_t *ls = big ? (int16_t *)malloc((size_t)(n / 16 + 1) * sizeof(int16_t)) : stack_ls;
    float s = NAN;
    if (codes && mults && ls) {
        const int gs = qs_iq_row_codes(fn, elems, bytes, w, n, codes, mults, ls);
        s = qs_iq_dot_codes_scalar(codes, mults, ls, gs, os, q8k, n, x);
    }
    if (big) {
        free(codes);
        free(mults);
        free(ls);
    }
    return s;
}

/* The scalar references: decoded to codes, then qs_iq_dot_codes_scalar. Every type's AVX2 dot reads the blocks
 * directly (qs_iquants_avx2.c) and gives the same bits. */
#define IQ_DOT_SCALAR(name, elems, bytes, outer)                                                                   \
    float qs_dot_##name##_scalar(int64_t n, const uint8_t *w, const uint8_t *x) {                                  \
        return dot_codes(qs_codes_##name, elems, bytes, outer, n, w, x);                                           \
    }
IQ_DOT_SCALAR(iq2_xxs, 256, 66, 256)
IQ_DOT_SCALAR(iq2_xs, 256, 74, 256)
IQ_DOT_SCALAR(iq2_s, 256, 82, 256)
IQ_DOT_SCALAR(iq3_xxs, 256, 98, 256)
IQ_DOT_SCALAR(iq3_s, 256, 110, 256)
IQ_DOT_SCALAR(iq1_s, 256, 50, 256)
IQ_DOT_SCALAR(iq1_m, 256, 56, 256)
IQ_DOT_SCALAR(tq1_0, 256, 54, 256)
IQ_DOT_SCALAR(tq2_0, 256, 66, 256)
IQ_DOT_SCALAR(mxfp4, 32, 17, 32)
IQ_DOT_SCALAR(nvfp4, 64, 36, 16)
