/* Prefill GEMM (see qs_gemm.h): scalar weight-row decoders into the common code/scale/min form, activation
 * column preparation, and the threaded driver that runs the AVX-512 tile kernel over panels of 4 weight rows. */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "qs.h"
#include "qs_gemm.h"
#include "qs_quant_internal.h"

static inline float h2f(const uint8_t *p) { return qs_fp16_to_fp32(qs_load_u16(p)); }

void qs_gemm_zero_tail(const qs_gemm_dims *d, uint8_t *codes, float *ws, float *mrow) {
    memset(codes + d->k, 0, (size_t)(d->k64 - d->k));
    for (int64_t i = d->k / 4; i < d->nl; ++i) ws[i] = 0.0f;
    for (int64_t i = d->ng; i < d->ngp; ++i) mrow[i] = 0.0f;
}

/* 32-element blocks: per block 32 codes, one scale d (8 lanes), one min term. */
static void set_lanes(float *ws, int64_t b, float d) {
    for (int j = 0; j < 8; ++j) ws[8 * b + j] = d;
}

static void panel_q4_0(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
    for (int64_t b = 0; b < d->k / 32; ++b, w += 18) {
        for (int j = 0; j < 16; ++j) {
            c[32 * b + j] = w[2 + j] & 15;
            c[32 * b + 16 + j] = w[2 + j] >> 4;
        }
        float s = h2f(w);
        set_lanes(ws, b, s);
        mrow[b] = 8.0f * s;
    }
    qs_gemm_zero_tail(d, c, ws, mrow);
}

static void panel_q4_1(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
    for (int64_t b = 0; b < d->k / 32; ++b, w += 20) {
        for (int j = 0; j < 16; ++j) {
            c[32 * b + j] = w[4 + j] & 15;
            c[32 * b + 16 + j] = w[4 + j] >> 4;
        }
        set_lanes(ws, b, h2f(w));
        mrow[b] = -h2f(w + 2);
    }
    qs_gemm_zero_tail(d, c, ws, mrow);
}

static void panel_q5_0(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
    for (int64_t b = 0; b < d->k / 32; ++b, w += 22) {
        uint32_t qh = qs_load_u32(w + 2);
        for (int j = 0; j < 16; ++j) {
            c[32 * b + j] = (uint8_t)((w[6 + j] & 15) | (((qh >> j) & 1) << 4));
            c[32 * b + 16 + j] = (uint8_t)((w[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
        }
        float s = h2f(w);
        set_lanes(ws, b, s);
        mrow[b] = 16.0f * s;
    }
    qs_gemm_zero_tail(d, c, ws, mrow);
}

static void panel_q5_1(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
    for (int64_t b = 0; b < d->k / 32; ++b, w += 24) {
        uint32_t qh = qs_load_u32(w + 4);
        for (int j = 0; j < 16; ++j) {
            c[32 * b + j] = (uint8_t)((w[8 + j] & 15) | (((qh >> j) & 1) << 4));
            c[32 * b + 16 + j] = (uint8_t)((w[8 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
        }
        set_lanes(ws, b, h2f(w));
        mrow[b] = -h2f(w + 2);
    }
    qs_gemm_zero_tail(d, c, ws, mrow);
}

static void panel_q8_0(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
    for (int64_t b = 0; b < d->k / 32; ++b, w += 34) {
        for (int j = 0; j < 32; ++j) c[32 * b + j] = (uint8_t)(w[2 + j] ^ 0x80); /* s8 + 128 */
        float s = h2f(w);
        set_lanes(ws, b, s);
        mrow[b] = 128.0f * s;
    }
    qs_gemm_zero_tail(d, c, ws, mrow);
}

static void k4_sm(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

static void panel_q4_K(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
    for (int64_t i = 0; i < d->k / 256; ++i, w += 144) {
        float dd = h2f(w), dm = h2f(w + 2);
        for (int g = 0; g < 8; ++g) {
            int sc, m;
            k4_sm(w + 4, g, &sc, &m);
            for (int l = 0; l < 8; ++l) ws[64 * i + 8 * g + l] = dd * (float)sc;
            mrow[8 * i + g] = dm * (float)m;
        }
        for (int q = 0; q < 4; ++q)
            for (int l = 0; l < 32; ++l) {
                c[256 * i + 64 * q + l] = w[16 + 32 * q + l] & 15;
                c[256 * i + 64 * q + 32 + l] = w[16 + 32 * q + l] >> 4;
            }
    }
    qs_gemm_zero_tail(d, c, ws, mrow);
}

static void panel_q5_K(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
    for (int64_t i = 0; i < d->k / 256; ++i, w += 176) {
        float dd = h2f(w), dm = h2f(w + 2);
        const uint8_t *qh = w + 16, *qs = w + 48;
        for (int g = 0; g < 8; ++g) {
            int sc, m;
            k4_sm(w + 4, g, &sc, &m);
            for (int l = 0; l < 8; ++l) ws[64 * i + 8 * g + l] = dd * (float)sc;
            mrow[8 * i + g] = dm * (float)m;
        }
        for (int q = 0; q < 4; ++q)
            for (int l = 0; l < 32; ++l) {
                c[256 * i + 64 * q + l] = (uint8_t)((qs[32 * q + l] & 15) | (((qh[l] >> (2 * q)) & 1) << 4));
                c[256 * i + 64 * q + 32 + l] = (uint8_t)((qs[32 * q + l] >> 4) | (((qh[l] >> (2 * q + 1)) & 1) << 4));
            }
    }
    qs_gemm_zero_tail(d, c, ws, mrow);
}

static void panel_q6_K(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
    for (int64_t i = 0; i < d->k / 256; ++i, w += 210) {
        float dd = h2f(w + 208);
        const int8_t *sc = (const int8_t *)(w + 192);
        for (int g = 0; g < 16; ++g) {
            float s = dd * (float)sc[g];
            for (int l = 0; l < 4; ++l) ws[64 * i + 4 * g + l] = s;
            mrow[16 * i + g] = 32.0f * s;
        }
        for (int h = 0; h < 2; ++h) {
            const uint8_t *ql = w + 64 * h, *qh = w + 128 + 32 * h;
            uint8_t *o = c + 256 * i + 128 * h;
            for (int l = 0; l < 32; ++l) {
                o[l] = (uint8_t)((ql[l] & 15) | ((qh[l] & 3) << 4));
                o[32 + l] = (uint8_t)((ql[32 + l] & 15) | (((qh[l] >> 2) & 3) << 4));
                o[64 + l] = (uint8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
                o[96 + l] = (uint8_t)((ql[32 + l] >> 4) | (((qh[l] >> 6) & 3) << 4));
            }
        }
    }
    qs_gemm_zero_tail(d, c, ws, mrow);
}

static int gemm_act(int type);

/* Q2_K: code q (0..3), lane scale d·(sc & 15), min dmin·(sc >> 4) per 16; Q3_K: code = low 2 bits + 4·hmask
 * bit (0..7), lane scale d·(scale − 32), min 4·that per 16 */
static void panel_q2_K(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
    for (int64_t i = 0; i < d->k / 256; ++i, w += 84) {
        const float dd = h2f(w + 80), dm = h2f(w + 82);
        for (int g = 0; g < 16; ++g) {
            for (int l = 0; l < 4; ++l) ws[64 * i + 4 * g + l] = dd * (float)(w[g] & 15);
            mrow[16 * i + g] = dm * (float)(w[g] >> 4);
        }
        for (int n = 0; n < 2; ++n)
            for (int j = 0; j < 4; ++j)
                for (int l = 0; l < 32; ++l) c[256 * i + 128 * n + 32 * j + l] = (w[16 + 32 * n + l] >> (2 * j)) & 3;
    }
    qs_gemm_zero_tail(d, c, ws, mrow);
}

static void panel_q3_K(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
    int8_t sc[16];
    for (int64_t i = 0; i < d->k / 256; ++i, w += 110) {
        const float dd = h2f(w + 108);
        qs_q3k_scales(w + 96, sc);
        for (int g = 0; g < 16; ++g) {
            const float s = dd * (float)sc[g];
            for (int l = 0; l < 4; ++l) ws[64 * i + 4 * g + l] = s;
            mrow[16 * i + g] = 4.0f * s;
        }
        for (int n = 0; n < 2; ++n)
            for (int j = 0; j < 4; ++j)
                for (int l = 0; l < 32; ++l)
                    c[256 * i + 128 * n + 32 * j + l] =
                        (uint8_t)(((w[32 + 32 * n + l] >> (2 * j)) & 3) | (((w[l] >> (4 * n + j)) & 1) << 2));
    }
    qs_gemm_zero_tail(d, c, ws, mrow);
}

/* IQ4_NL / IQ4_XS: code = K[q] + 128 (1..241), lane scale d (IQ4_XS: d·(ls − 32)), min 128 · scale */

static void panel_iq4_nl(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
    for (int64_t b = 0; b < d->k / 32; ++b, w += 18) {
        for (int j = 0; j < 16; ++j) {
            c[32 * b + j] = (uint8_t)(QS_IQ4NL[w[2 + j] & 15] + 128);
            c[32 * b + 16 + j] = (uint8_t)(QS_IQ4NL[w[2 + j] >> 4] + 128);
        }
        float sc = h2f(w);
        set_lanes(ws, b, sc);
        mrow[b] = 128.0f * sc;
    }
    qs_gemm_zero_tail(d, c, ws, mrow);
}

static void panel_iq4_xs(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
    for (int64_t i = 0; i < d->k / 256; ++i, w += 136) {
        const float dd = h2f(w);
        const uint16_t sh = qs_load_u16(w + 2);
        for (int sb = 0; sb < 8; ++sb) {
            const int ls = ((w[4 + sb / 2] >> (4 * (sb % 2))) & 15) | (((sh >> (2 * sb)) & 3) << 4);
            const float sc = dd * (float)(ls - 32);
            const uint8_t *qs = w + 8 + 16 * sb;
            for (int j = 0; j < 16; ++j) {
                c[256 * i + 32 * sb + j] = (uint8_t)(QS_IQ4NL[qs[j] & 15] + 128);
                c[256 * i + 32 * sb + 16 + j] = (uint8_t)(QS_IQ4NL[qs[j] >> 4] + 128);
            }
            set_lanes(ws, 8 * i + sb, sc);
            mrow[8 * i + sb] = 128.0f * sc;
        }
    }
    qs_gemm_zero_tail(d, c, ws, mrow);
}

/* The i-quants, TQ and FP4 types from their exact int8 codes (qs_iq_codes): code + an offset that makes it
 * unsigned and at most 127 (so vpmaddubsw pairs never saturate), lane scale = the group's multiplier · its scale, min =
 * offset · multiplier, per GEMM group (the code group, or 32 within TQ's one 256-element group). */
static int code_offset(int type) {
    switch (type) {
    case QS_IQ2_XXS: case QS_IQ2_XS: case QS_IQ2_S: case QS_IQ3_XXS: case QS_IQ3_S: return 64;
    case QS_IQ1_S: case QS_IQ1_M: return 16;
    case QS_TQ1_0: case QS_TQ2_0: return 1;
    default: return 12; /* MXFP4, NVFP4 */
    }
}

static void panel_codes(int type, const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
    const int elems = qs_block_elems(type), bytes = qs_block_bytes(type), off = code_offset(type);
    int8_t code[256];
    float mult[16];
    int16_t ls[16];
    for (int64_t i = 0; i < d->k / elems; ++i, w += bytes) {
        const int gs = qs_iq_codes(type, w, code, mult, ls);
        const int ng = elems / gs, per = gs / 4;
        for (int g = 0; g < ng; ++g) mult[g] *= (float)ls[g]; /* exact: an fp16 times a 5-bit integer */
        const __m128i vo = _mm_set1_epi8((char)off); /* SSE2, the x86-64 baseline: 16 codes per add */
        for (int e = 0; e < elems; e += 16)
            _mm_storeu_si128((__m128i *)(c + elems * i + e),
                             _mm_add_epi8(_mm_loadu_si128((const __m128i *)(code + e)), vo));
        for (int g = 0; g < ng; ++g)
            for (int l = 0; l < per; ++l) ws[elems / 4 * i + per * g + l] = mult[g];
        for (int g = 0; g < elems / d->group; ++g) mrow[elems / d->group * i + g] = (float)off * mult[g * d->group / gs];
    }
    qs_gemm_zero_tail(d, c, ws, mrow);
}

#define PANEL_CODES(name, TYPE)                                                                                    \
    static void panel_##name(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {        \
        panel_codes(TYPE, w, d, c, ws, mrow);                                                                      \
    }
PANEL_CODES(iq2_xxs, QS_IQ2_XXS)
PANEL_CODES(iq2_xs, QS_IQ2_XS)
PANEL_CODES(iq2_s, QS_IQ2_S)
PANEL_CODES(iq3_xxs, QS_IQ3_XXS)
PANEL_CODES(iq3_s, QS_IQ3_S)
PANEL_CODES(iq1_s, QS_IQ1_S)
PANEL_CODES(iq1_m, QS_IQ1_M)
PANEL_CODES(tq1_0, QS_TQ1_0)
PANEL_CODES(tq2_0, QS_TQ2_0)
PANEL_CODES(mxfp4, QS_MXFP4)
PANEL_CODES(nvfp4, QS_NVFP4)

qs_panel_fn qs_gemm_panel_scalar(int type) {
    switch (type) {
    case QS_Q4_0: return panel_q4_0;
    case QS_Q4_1: return panel_q4_1;
    case QS_Q5_0: return panel_q5_0;
    case QS_Q5_1: return panel_q5_1;
    case QS_Q8_0: return panel_q8_0;
    case QS_Q4_K: return panel_q4_K;
    case QS_Q5_K: return panel_q5_K;
    case QS_Q6_K: return panel_q6_K;
    case QS_Q2_K: return panel_q2_K;
    case QS_Q3_K: return panel_q3_K;
    case QS_IQ4_NL: return panel_iq4_nl;
    case QS_IQ4_XS: return panel_iq4_xs;
    case QS_IQ2_XXS: return panel_iq2_xxs;
    case QS_IQ2_XS: return panel_iq2_xs;
    case QS_IQ2_S: return panel_iq2_s;
    case QS_IQ3_XXS: return panel_iq3_xxs;
    case QS_IQ3_S: return panel_iq3_s;
    case QS_IQ1_S: return panel_iq1_s;
    case QS_IQ1_M: return panel_iq1_m;
    case QS_TQ1_0: return panel_tq1_0;
    case QS_TQ2_0: return panel_tq2_0;
    case QS_MXFP4: return panel_mxfp4;
    case QS_NVFP4: return panel_nvfp4;
    default: return NULL;
    }
}

/* The decoder for the active ISA (the AVX2 ones serve AVX-512 too; scalar where no SIMD one exists). */
static qs_panel_fn panel_simd(int type) {
    if (qs_isa_get() >= QS_ISA_AVX2) {
        switch (type) {
        case QS_Q4_0: return qs_gemm_panel_q4_0_avx2;
        case QS_Q4_1: return qs_gemm_panel_q4_1_avx2;
        case QS_Q5_0: return qs_gemm_panel_q5_0_avx2;
        case QS_Q8_0: return qs_gemm_panel_q8_0_avx2;
        case QS_Q4_K: return qs_gemm_panel_q4_K_avx2;
        case QS_Q6_K: return qs_gemm_panel_q6_K_avx2;
        default: break;
        }
    }
    return qs_gemm_panel_scalar(type);
}

static void gemm_dims(int type, int64_t k, qs_gemm_dims *d) {
    int group = qs_gemm_group(type);
    d->k = k;
    d->k64 = (k + 63) / 64 * 64;
    d->nl = d->k64 / 4;
    d->ng = group ? k / group : 0;
    d->ngp = (d->ng + 15) / 16 * 16;
    d->group = group;
}

int qs_gemm_decode_row(int type, const uint8_t *row, int64_t k, int simd, uint8_t *codes, float *ws, float *mrow) {
    qs_gemm_dims d;
    int group = qs_gemm_group(type);
    if (!group || k % qs_block_elems(type) || k % (gemm_act(type) == QS_Q8_K ? 256 : 32)) return -1;
    if (simd && qs_isa_get() < QS_ISA_AVX2) return 1;
    gemm_dims(type, k, &d);
    (simd ? panel_simd(type) : qs_gemm_panel_scalar(type))(row, &d, codes, ws, mrow);
    return 0;
}

int qs_gemm_group(int type) {
    switch (type) {
    case QS_Q4_0: case QS_Q4_1: case QS_Q5_0: case QS_Q5_1: case QS_Q8_0: case QS_Q4_K: case QS_Q5_K: return 32;
    case QS_IQ4_NL: case QS_IQ4_XS: case QS_IQ2_XXS: case QS_IQ3_XXS: case QS_IQ3_S: case QS_IQ1_S: case QS_TQ1_0:
    case QS_TQ2_0: case QS_MXFP4: return 32;
    case QS_Q6_K: case QS_Q2_K: case QS_Q3_K: case QS_IQ2_XS: case QS_IQ2_S: case QS_IQ1_M: case QS_NVFP4: return 16;
    default: return 0;
    }
}

static int gemm_act(int type) {
    switch (type) {
    case QS_Q4_1: case QS_Q5_1: return QS_Q8_1;
    case QS_Q2_K: case QS_Q3_K: case QS_Q4_K: case QS_Q5_K: case QS_Q6_K: case QS_IQ4_XS: case QS_IQ2_XXS:
    case QS_IQ2_XS: case QS_IQ2_S:
    case QS_IQ3_XXS: case QS_IQ3_S: case QS_IQ1_S: case QS_IQ1_M: case QS_TQ1_0: case QS_TQ2_0: return QS_Q8_K;
    default: return QS_Q8_0;
    }
}

void qs_gemm_prep_column(int act, const uint8_t *xq, const qs_gemm_dims *d, int8_t *codes, float *xs, float *bcol) {
    if (act == QS_Q8_K) {
        for (int64_t i = 0; i < d->k / 256; ++i, xq += 292) {
            float dx = qs_load_f32(xq);
            memcpy(codes + 256 * i, xq + 4, 256);
            for (int l = 0; l < 64; ++l) xs[64 * i + l] = dx;
            for (int g = 0; g < 16; ++g) {
                int16_t s;
                memcpy(&s, xq + 260 + 2 * g, 2);
                if (d->group == 16) bcol[16 * i + g] = dx * (float)s;
                else if (g % 2 == 0) bcol[8 * i + g / 2] = (float)s;
                else bcol[8 * i + g / 2] = dx * (bcol[8 * i + g / 2] + (float)s);
            }
        }
    } else {
        const int bytes = act == QS_Q8_1 ? 36 : 34, off = act == QS_Q8_1 ? 4 : 2;
        for (int64_t b = 0; b < d->k / 32; ++b, xq += bytes) {
            float dx = h2f(xq);
            memcpy(codes + 32 * b, xq + off, 32);
            for (int l = 0; l < 8; ++l) xs[8 * b + l] = dx;
            if (act == QS_Q8_1) {
                bcol[b] = h2f(xq + 2);
            } else if (d->group == 16) { /* NVFP4: a min per 16 elements */
                for (int h = 0; h < 2; ++h) {
                    int s = 0;
                    for (int j = 0; j < 16; ++j) s += (int8_t)xq[2 + 16 * h + j];
                    bcol[2 * b + h] = dx * (float)s;
                }
            } else {
                int s = 0;
                for (int j = 0; j < 32; ++j) s += (int8_t)xq[2 + j];
                bcol[b] = dx * (float)s;
            }
        }
    }
    memset(codes + d->k, 0, (size_t)(d->k64 - d->k));
    for (int64_t i = d->k / 4; i < d->nl; ++i) xs[i] = 0.0f;
    for (int64_t i = d->ng; i < d->ngp; ++i) bcol[i] = 0.0f;
}

/* ---------------------------------------------------------------- prepared activations */
static int gemm_on = 1;

int qs_gemm_set(int on) {
    int prev = gemm_on;
    if (on >= 0) gemm_on = on != 0;
    return prev;
}

int qs_gemm_enabled(void) { return gemm_on; }

/* Scalar tile: the numeric specification of the SIMD tiles (same decoded operands, same formula). */
static void tile_scalar(const qs_gemm_dims *d, const uint8_t *wc, const float *ws, const float *mrow, const int8_t *xc,
                        const float *xs, const float *bcol, int64_t n_c, int64_t n_valid, int n_r, float *y,
                        int64_t ldy) {
    (void)n_c;
    for (int64_t c = 0; c < n_valid; ++c) {
        const int8_t *x = xc + c * d->k64;
        const float *sx = xs + c * d->nl, *bc = bcol + c * d->ngp;
        for (int r = 0; r < n_r; ++r) {
            const uint8_t *w = wc + r * d->k64;
            const float *sw = ws + r * d->nl, *mr = mrow + r * d->ngp;
            float acc = 0.0f;
            for (int64_t l = 0; l < d->nl; ++l) {
                int32_t p = 0;
                for (int e = 0; e < 4; ++e) p += (int32_t)w[4 * l + e] * (int32_t)x[4 * l + e];
                acc += (float)p * (sw[l] * sx[l]);
            }
            for (int64_t g = 0; g < d->ngp; ++g) acc -= mr[g] * bc[g];
            y[c * ldy + r] = acc;
        }
    }
}

typedef void (*tile_fn)(const qs_gemm_dims *, const uint8_t *, const float *, const float *, const int8_t *,
                        const float *, const float *, int64_t, int64_t, int, float *, int64_t);

static tile_fn tile_for_isa(void) {
    int isa = qs_isa_get();
    return isa >= QS_ISA_AVX512 ? qs_gemm_tile_avx512 : isa >= QS_ISA_AVX2 ? qs_gemm_tile_avx2 : tile_scalar;
}

int qs_gemm_usable(int type, int64_t k) {
    int group = qs_gemm_group(type);
    if (!group) return 0;
    if ((type == QS_Q8_0 || type == QS_IQ4_NL || type == QS_IQ4_XS) && qs_isa_get() == QS_ISA_AVX2)
        return 0; /* codes above 127 would saturate vpmaddubsw */
    int64_t ab = gemm_act(type) == QS_Q8_K ? 256 : 32;
    return k % ab == 0 && k % group == 0;
}

typedef struct {
    qs_gemm_act *a;
    const float *x;
    int64_t per;
    int failed;
} prep_ctx;

static int64_t act_block_bytes(int act, int64_t k) {
    return act == QS_Q8_K ? k / 256 * 292 : k / 32 * (act == QS_Q8_1 ? 36 : 34);
}

static void prep_task(void *vctx, int64_t t) {
    prep_ctx *p = (prep_ctx *)vctx;
    qs_gemm_act *a = p->a;
    const qs_gemm_dims *d = &a->d;
    uint8_t *tmp = (uint8_t *)malloc((size_t)act_block_bytes(a->act, d->k) + 64);
    if (!tmp) {
        p->failed = 1;
        return;
    }
    int64_t j1 = (t + 1) * p->per < a->n_c ? (t + 1) * p->per : a->n_c;
    for (int64_t j = t * p->per; j < j1; ++j) {
        int8_t *cj = a->xc + j * d->k64;
        float *sj = a->xs + j * d->nl, *bj = a->bcol + j * d->ngp;
        if (j < a->n_x) {
            qs_quantize_activation(a->act, p->x + j * d->k, tmp, d->k);
            qs_gemm_prep_column(a->act, tmp, d, cj, sj, bj);
        } else { /* padding column: all zero, its outputs are never stored */
            memset(cj, 0, (size_t)d->k64);
            memset(sj, 0, (size_t)d->nl * sizeof(float));
            memset(bj, 0, (size_t)d->ngp * sizeof(float));
        }
    }
    free(tmp);
}

int qs_gemm_act_prepare(qs_gemm_act *a, int type, const float *x, int64_t n_x, int64_t k, int n_threads) {
    memset(a, 0, sizeof *a);
    if (!qs_gemm_usable(type, k)) return 1;
    a->act = gemm_act(type);
    gemm_dims(type, k, &a->d);
    a->n_x = n_x;
    a->n_c = (n_x + 3) / 4 * 4;
    size_t per_col = (size_t)a->d.k64 + (size_t)(a->d.nl + a->d.ngp) * sizeof(float);
    a->buf = (uint8_t *)aligned_alloc(64, ((size_t)a->n_c * per_col + 63) & ~(size_t)63);
    if (!a->buf) return -2;
    a->xc = (int8_t *)a->buf;
    a->xs = (float *)(a->buf + a->n_c * a->d.k64);
    a->bcol = a->xs + a->n_c * a->d.nl;
    prep_ctx p = {a, x, 4, 0};
    if (n_threads <= 0) n_threads = qs_threads_default();
    qs_parallel_for((a->n_c + 3) / 4, prep_task, &p, a->n_c * k < (1 << 15) ? 1 : n_threads);
    if (p.failed) {
        qs_gemm_act_free(a);
        return -2;
    }
    return 0;
}

int qs_gemm_act_fits(const qs_gemm_act *a, int type, int64_t k) {
    return a->buf && qs_gemm_usable(type, k) && a->act == gemm_act(type) && a->d.group == qs_gemm_group(type) &&
           a->d.k == k;
}

void qs_gemm_act_free(qs_gemm_act *a) {
    free(a->buf);
    a->buf = NULL;
}

/* ---------------------------------------------------------------- driver */
typedef struct {
    const qs_gemm_act *a;
    qs_panel_fn panel;
    tile_fn tile;
    const uint8_t *w;
    int64_t row_bytes, n_rows, panels_per_task;
    float *y;
    int failed;
} gemm_ctx;

static void gemm_task(void *vctx, int64_t t) {
    gemm_ctx *g = (gemm_ctx *)vctx;
    const qs_gemm_act *a = g->a;
    const qs_gemm_dims *d = &a->d;
    size_t bytes = (size_t)(4 * d->k64) + (size_t)(4 * d->nl + 4 * d->ngp) * sizeof(float) + 64;
    uint8_t *buf = (uint8_t *)aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!buf) {
        g->failed = 1;
        return;
    }
    uint8_t *wc = buf;
    float *ws = (float *)(buf + 4 * d->k64), *mrow = ws + 4 * d->nl;
    int64_t p0 = t * g->panels_per_task, p1 = p0 + g->panels_per_task;
    int64_t n_panels = (g->n_rows + 3) / 4;
    if (p1 > n_panels) p1 = n_panels;
    for (int64_t p = p0; p < p1; ++p) {
        int64_t r0 = 4 * p;
        int n_r = g->n_rows - r0 < 4 ? (int)(g->n_rows - r0) : 4;
        for (int r = 0; r < 4; ++r) {
            if (r < n_r) {
                g->panel(g->w + (r0 + r) * g->row_bytes, d, wc + r * d->k64, ws + r * d->nl, mrow + r * d->ngp);
            } else {
                memset(wc + r * d->k64, 0, (size_t)d->k64);
                memset(ws + r * d->nl, 0, (size_t)d->nl * sizeof(float));
                memset(mrow + r * d->ngp, 0, (size_t)d->ngp * sizeof(float));
            }
        }
        g->tile(d, wc, ws, mrow, a->xc, a->xs, a->bcol, a->n_c, a->n_x, n_r, g->y + r0, g->n_rows);
    }
    free(buf);
}

int qs_gemm_run(int type, const uint8_t *w, int64_t n_rows, int64_t row_bytes, const qs_gemm_act *a, float *y,
                int n_threads) {
    gemm_ctx g;
    memset(&g, 0, sizeof g);
    g.a = a;
    g.panel = panel_simd(type);
    g.tile = tile_for_isa();
    g.w = w;
    g.row_bytes = row_bytes;
    g.n_rows = n_rows;
    g.y = y;
    if (n_threads <= 0) n_threads = qs_threads_default();
    int64_t n_panels = (n_rows + 3) / 4;
    int64_t per = (n_panels + 4 * (int64_t)n_threads - 1) / (4 * (int64_t)n_threads);
    if (per < 1) per = 1;
    g.panels_per_task = per;
    qs_parallel_for((n_panels + per - 1) / per, gemm_task, &g, n_threads);
    return g.failed ? -2 : 0;
}

int qs_gemm(int type, const uint8_t *w, int64_t n_rows, int64_t k, int64_t row_bytes, const float *x, int64_t n_x,
            float *y, int n_threads) {
    qs_gemm_act a;
    int rc = qs_gemm_act_prepare(&a, type, x, n_x, k, n_threads);
    if (rc) return rc;
    rc = qs_gemm_run(type, w, n_rows, row_bytes, &a, y, n_threads);
    qs_gemm_act_free(&a);
    return rc;
}
