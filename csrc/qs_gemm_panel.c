/* Prefill GEMM weight-row decoders, scalar (see qs_gemm.h): each type's rows into the common code/scale/min form.
 * The specification of the AVX2 decoders (qs_gemm_avx2.c); the type table (qs_traits.c) names both. Codecs: they
 * call nothing above them. */
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

void qs_gemm_panel_q4_0_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
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

void qs_gemm_panel_q4_1_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
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

void qs_gemm_panel_q5_0_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
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

void qs_gemm_panel_q5_1_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
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

void qs_gemm_panel_q8_0_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
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

void qs_gemm_panel_q4_K_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
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

void qs_gemm_panel_q5_K_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
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

void qs_gemm_panel_q6_K_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
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

/* Q2_K: code q (0..3), lane scale d·(sc & 15), min dmin·(sc >> 4) per 16; Q3_K: code = low 2 bits + 4·hmask
 * bit (0..7), lane scale d·(scale − 32), min 4·that per 16 */
void qs_gemm_panel_q2_K_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
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

void qs_gemm_panel_q3_K_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
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

void qs_gemm_panel_iq4_nl_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
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

void qs_gemm_panel_iq4_xs_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) {
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

/* The i-quants, TQ and FP4 types from their exact int8 codes (qs_codes_*): code + an offset that makes it
 * unsigned and at most 127 (so vpmaddubsw pairs never saturate), lane scale = the group's multiplier · its scale, min =
 * offset · multiplier, per GEMM group (the code group, or 32 within TQ's one 256-element group). */
static void panel_codes(qs_codes_fn codes, int elems, int bytes, int off, const uint8_t *w, const qs_gemm_dims *d,
                        uint8_t *c, float *ws, float *mrow) {
    int8_t code[256];
    float mult[16];
    int16_t ls[16];
    for (int64_t i = 0; i < d->k / elems; ++i, w += bytes) {
        const int gs = codes(w, code, mult, ls);
        const int ng = elems / gs, per = gs / 4;
        for (int g = 0; g < ng; ++g) mult[g] *= (float)ls[g]; /* exact: an fp16 times a 5-bit integer */
        for (int e = 0; e < elems; ++e) c[elems * i + e] = (uint8_t)(code[e] + off); /* vectorised by the compiler */
        for (int g = 0; g < ng; ++g)
            for (int l = 0; l < per; ++l) ws[elems / 4 * i + per * g + l] = mult[g];
        for (int g = 0; g < elems / d->group; ++g) mrow[elems / d->group * i + g] = (float)off * mult[g * d->group / gs];
    }
    qs_gemm_zero_tail(d, c, ws, mrow);
}

#define PANEL_CODES(name, elems, bytes, off)                                                                       \
    void qs_gemm_panel_##name##_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow) { \
        panel_codes(qs_codes_##name, elems, bytes, off, w, d, c, ws, mrow);                                       \
    }
/* offsets: the lattice types 64, IQ1 16, TQ 1, FP4 12 */
PANEL_CODES(iq2_xxs, 256, 66, 64)
PANEL_CODES(iq2_xs, 256, 74, 64)
PANEL_CODES(iq2_s, 256, 82, 64)
PANEL_CODES(iq3_xxs, 256, 98, 64)
PANEL_CODES(iq3_s, 256, 110, 64)
PANEL_CODES(iq1_s, 256, 50, 16)
PANEL_CODES(iq1_m, 256, 56, 16)
PANEL_CODES(tq1_0, 256, 54, 1)
PANEL_CODES(tq2_0, 256, 66, 1)
PANEL_CODES(mxfp4, 32, 17, 12)
PANEL_CODES(nvfp4, 64, 36, 12)

