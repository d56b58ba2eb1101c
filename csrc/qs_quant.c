/* Quantized kernels, scalar: one block of each type to float32 and each type's dot product against its quantized
 * activation row. This is the numeric specification the SIMD variants are tested against; the type table
 * (qs_traits.c) points at these, the drivers (qs_matmat.c) pick them from there. */
#include <math.h>
#include <stdlib.h>

#include "qs.h"
#include "qs_quant_internal.h"


static inline float f16at(const uint8_t *p) { return qs_fp16_to_fp32(qs_load_u16(p)); }

/* ---------------------------------------------------------------- scalar dequantization, one block */
void qs_deq_f32(const uint8_t *b, float *y) { memcpy(y, b, 4); }
void qs_deq_f16(const uint8_t *b, float *y) { y[0] = f16at(b); }
void qs_deq_bf16(const uint8_t *b, float *y) { y[0] = qs_bf16_to_fp32(qs_load_u16(b)); }

void qs_deq_q4_0(const uint8_t *b, float *y) {
    float d = f16at(b);
    for (int j = 0; j < 16; ++j) {
        y[j] = (float)((b[2 + j] & 15) - 8) * d;
        y[j + 16] = (float)((b[2 + j] >> 4) - 8) * d;
    }
}
void qs_deq_q4_1(const uint8_t *b, float *y) {
    float d = f16at(b), m = f16at(b + 2);
    for (int j = 0; j < 16; ++j) {
        y[j] = (float)(b[4 + j] & 15) * d + m;
        y[j + 16] = (float)(b[4 + j] >> 4) * d + m;
    }
}
void qs_deq_q5_0(const uint8_t *b, float *y) {
    float d = f16at(b);
    uint32_t qh = qs_load_u32(b + 2);
    for (int j = 0; j < 16; ++j) {
        int q0 = (b[6 + j] & 15) | (((qh >> j) & 1) << 4);
        int q1 = (b[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        y[j] = (float)(q0 - 16) * d;
        y[j + 16] = (float)(q1 - 16) * d;
    }
}
void qs_deq_q5_1(const uint8_t *b, float *y) {
    float d = f16at(b), m = f16at(b + 2);
    uint32_t qh = qs_load_u32(b + 4);
    for (int j = 0; j < 16; ++j) {
        int q0 = (b[8 + j] & 15) | (((qh >> j) & 1) << 4);
        int q1 = (b[8 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        y[j] = (float)q0 * d + m;
        y[j + 16] = (float)q1 * d + m;
    }
}
void qs_deq_q8_0(const uint8_t *b, float *y) {
    float d = f16at(b);
    for (int j = 0; j < 32; ++j) y[j] = (float)(int8_t)b[2 + j] * d;
}
void qs_deq_q2_K(const uint8_t *b, float *y) {
    const uint8_t *sc = b, *qs = b + 16;
    float d = f16at(b + 80), dmin = f16at(b + 82);
    for (int n = 0; n < 2; ++n)
        for (int j = 0; j < 4; ++j)
            for (int l = 0; l < 32; ++l) {
                uint8_t s = sc[8 * n + 2 * j + l / 16];
                int q = (qs[32 * n + l] >> (2 * j)) & 3;
                y[128 * n + 32 * j + l] = d * (float)(s & 15) * (float)q - dmin * (float)(s >> 4);
            }
}
void qs_q3k_scales(const uint8_t *s, int8_t out[16]) {
    for (int j = 0; j < 16; ++j) {
        int low = j < 8 ? (s[j] & 15) : (s[j - 8] >> 4);
        int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        out[j] = (int8_t)((low | (high << 4)) - 32);
    }
}
void qs_deq_q3_K(const uint8_t *b, float *y) {
    const uint8_t *hm = b, *qs = b + 32;
    float d = f16at(b + 108);
    int8_t sc[16];
    qs_q3k_scales(b + 96, sc);
    for (int n = 0; n < 2; ++n)
        for (int j = 0; j < 4; ++j)
            for (int l = 0; l < 32; ++l) {
                int q = ((qs[32 * n + l] >> (2 * j)) & 3) - (((hm[l] >> (4 * n + j)) & 1) ? 0 : 4);
                y[128 * n + 32 * j + l] = d * (float)sc[8 * n + 2 * j + l / 16] * (float)q;
            }
}
static inline void k4_scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}
void qs_deq_q4_K(const uint8_t *b, float *y) {
    float d = f16at(b), dmin = f16at(b + 2);
    const uint8_t *qs = b + 16;
    for (int c = 0; c < 4; ++c) {
        int sc0, m0, sc1, m1;
        k4_scale_min(b + 4, 2 * c, &sc0, &m0);
        k4_scale_min(b + 4, 2 * c + 1, &sc1, &m1);
        float d0 = d * (float)sc0, mm0 = dmin * (float)m0, d1 = d * (float)sc1, mm1 = dmin * (float)m1;
        for (int l = 0; l < 32; ++l) {
            y[64 * c + l] = d0 * (float)(qs[32 * c + l] & 15) - mm0;
            y[64 * c + 32 + l] = d1 * (float)(qs[32 * c + l] >> 4) - mm1;
        }
    }
}
void qs_deq_q5_K(const uint8_t *b, float *y) {
    float d = f16at(b), dmin = f16at(b + 2);
    const uint8_t *qh = b + 16, *qs = b + 48;
    for (int c = 0; c < 4; ++c) {
        int sc0, m0, sc1, m1;
        k4_scale_min(b + 4, 2 * c, &sc0, &m0);
        k4_scale_min(b + 4, 2 * c + 1, &sc1, &m1);
        float d0 = d * (float)sc0, mm0 = dmin * (float)m0, d1 = d * (float)sc1, mm1 = dmin * (float)m1;
        for (int l = 0; l < 32; ++l) {
            int q0 = (qs[32 * c + l] & 15) | (((qh[l] >> (2 * c)) & 1) << 4);
            int q1 = (qs[32 * c + l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4);
            y[64 * c + l] = d0 * (float)q0 - mm0;
            y[64 * c + 32 + l] = d1 * (float)q1 - mm1;
        }
    }
}
void qs_deq_q6_K(const uint8_t *b, float *y) {
    float d = f16at(b + 208);
    const int8_t *sc = (const int8_t *)(b + 192);
    for (int h = 0; h < 2; ++h) {
        const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
        float *yy = y + 128 * h;
        for (int l = 0; l < 32; ++l) {
            int q0 = ((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32;
            int q1 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            yy[l] = d * (float)sc[8 * h + l / 16] * (float)q0;
            yy[l + 32] = d * (float)sc[8 * h + 2 + l / 16] * (float)q1;
            yy[l + 64] = d * (float)sc[8 * h + 4 + l / 16] * (float)q2;
            yy[l + 96] = d * (float)sc[8 * h + 6 + l / 16] * (float)q3;
        }
    }
}
void qs_deq_iq4_nl(const uint8_t *b, float *y) {
    float d = f16at(b);
    for (int j = 0; j < 16; ++j) {
        y[j] = d * (float)QS_IQ4NL[b[2 + j] & 15];
        y[j + 16] = d * (float)QS_IQ4NL[b[2 + j] >> 4];
    }
}
void qs_deq_iq4_xs(const uint8_t *b, float *y) {
    float d = f16at(b);
    uint16_t sh = qs_load_u16(b + 2);
    for (int s = 0; s < 8; ++s) {
        int ls = ((b[4 + s / 2] >> (4 * (s % 2))) & 15) | (((sh >> (2 * s)) & 3) << 4);
        float dl = d * (float)(ls - 32);
        const uint8_t *qs = b + 8 + 16 * s;
        for (int j = 0; j < 16; ++j) {
            y[32 * s + j] = dl * (float)QS_IQ4NL[qs[j] & 15];
            y[32 * s + 16 + j] = dl * (float)QS_IQ4NL[qs[j] >> 4];
        }
    }
}


/* F32 rows are their own dequantization */
void qs_deq_row_f32(const uint8_t *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * 4); }


/* ---------------------------------------------------------------- scalar dot products (ggml generic math) */
float qs_dot_q4_0_scalar(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    for (int64_t i = 0; i < n / 32; ++i, w += 18, x += 34) {
        int sumi = 0;
        for (int j = 0; j < 16; ++j) {
            sumi += ((w[2 + j] & 15) - 8) * (int8_t)x[2 + j];
            sumi += ((w[2 + j] >> 4) - 8) * (int8_t)x[18 + j];
        }
        s += (float)sumi * (f16at(w) * f16at(x));
    }
    return s;
}
float qs_dot_q4_1_scalar(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    for (int64_t i = 0; i < n / 32; ++i, w += 20, x += 36) {
        int sumi = 0;
        for (int j = 0; j < 16; ++j) {
            sumi += (w[4 + j] & 15) * (int8_t)x[4 + j];
            sumi += (w[4 + j] >> 4) * (int8_t)x[20 + j];
        }
        s += (f16at(w) * f16at(x)) * (float)sumi + f16at(w + 2) * f16at(x + 2);
    }
    return s;
}
float qs_dot_q5_0_scalar(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    for (int64_t i = 0; i < n / 32; ++i, w += 22, x += 34) {
        uint32_t qh = qs_load_u32(w + 2);
        int sumi = 0;
        for (int j = 0; j < 16; ++j) {
            int q0 = ((w[6 + j] & 15) | (((qh >> j) & 1) << 4)) - 16;
            int q1 = ((w[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
            sumi += q0 * (int8_t)x[2 + j] + q1 * (int8_t)x[18 + j];
        }
        s += (float)sumi * (f16at(w) * f16at(x));
    }
    return s;
}
float qs_dot_q5_1_scalar(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    for (int64_t i = 0; i < n / 32; ++i, w += 24, x += 36) {
        uint32_t qh = qs_load_u32(w + 4);
        int sumi = 0;
        for (int j = 0; j < 16; ++j) {
            int q0 = (w[8 + j] & 15) | (((qh >> j) & 1) << 4);
            int q1 = (w[8 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
            sumi += q0 * (int8_t)x[4 + j] + q1 * (int8_t)x[20 + j];
        }
        s += (f16at(w) * f16at(x)) * (float)sumi + f16at(w + 2) * f16at(x + 2);
    }
    return s;
}
float qs_dot_q8_0_scalar(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    for (int64_t i = 0; i < n / 32; ++i, w += 34, x += 34) {
        int sumi = 0;
        for (int j = 0; j < 32; ++j) sumi += (int8_t)w[2 + j] * (int8_t)x[2 + j];
        s += (float)sumi * (f16at(w) * f16at(x));
    }
    return s;
}
static inline int16_t bsum_at(const uint8_t *x, int j) {
    int16_t v;
    memcpy(&v, x + 260 + 2 * j, 2);
    return v;
}
float qs_dot_q4_K_scalar(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    for (int64_t i = 0; i < n / 256; ++i, w += 144, x += 292) {
        const uint8_t *qs = w + 16;
        const int8_t *q8 = (const int8_t *)(x + 4);
        int32_t sumi = 0, msum = 0;
        for (int c = 0; c < 4; ++c) {
            int sc0, m0, sc1, m1;
            k4_scale_min(w + 4, 2 * c, &sc0, &m0);
            k4_scale_min(w + 4, 2 * c + 1, &sc1, &m1);
            int32_t a = 0, b = 0;
            for (int l = 0; l < 32; ++l) {
                a += (qs[32 * c + l] & 15) * q8[64 * c + l];
                b += (qs[32 * c + l] >> 4) * q8[64 * c + 32 + l];
            }
            sumi += sc0 * a + sc1 * b;
            msum += m0 * (bsum_at(x, 4 * c) + bsum_at(x, 4 * c + 1)) + m1 * (bsum_at(x, 4 * c + 2) + bsum_at(x, 4 * c + 3));
        }
        float d8 = qs_load_f32(x);
        s += f16at(w) * d8 * (float)sumi - f16at(w + 2) * d8 * (float)msum;
    }
    return s;
}
float qs_dot_q5_K_scalar(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    for (int64_t i = 0; i < n / 256; ++i, w += 176, x += 292) {
        const uint8_t *qh = w + 16, *qs = w + 48;
        const int8_t *q8 = (const int8_t *)(x + 4);
        int32_t sumi = 0, msum = 0;
        for (int c = 0; c < 4; ++c) {
            int sc0, m0, sc1, m1;
            k4_scale_min(w + 4, 2 * c, &sc0, &m0);
            k4_scale_min(w + 4, 2 * c + 1, &sc1, &m1);
            int32_t a = 0, b = 0;
            for (int l = 0; l < 32; ++l) {
                a += ((qs[32 * c + l] & 15) | (((qh[l] >> (2 * c)) & 1) << 4)) * q8[64 * c + l];
                b += ((qs[32 * c + l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4)) * q8[64 * c + 32 + l];
            }
            sumi += sc0 * a + sc1 * b;
            msum += m0 * (bsum_at(x, 4 * c) + bsum_at(x, 4 * c + 1)) + m1 * (bsum_at(x, 4 * c + 2) + bsum_at(x, 4 * c + 3));
        }
        float d8 = qs_load_f32(x);
        s += f16at(w) * d8 * (float)sumi - f16at(w + 2) * d8 * (float)msum;
    }
    return s;
}
float qs_dot_q6_K_scalar(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    for (int64_t i = 0; i < n / 256; ++i, w += 210, x += 292) {
        const int8_t *sc = (const int8_t *)(w + 192);
        const int8_t *q8 = (const int8_t *)(x + 4);
        int32_t sumi = 0;
        for (int h = 0; h < 2; ++h) {
            const uint8_t *ql = w + 64 * h, *qh = w + 128 + 32 * h;
            const int8_t *x8 = q8 + 128 * h;
            int32_t part[8] = {0};
            for (int l = 0; l < 32; ++l) {
                int q0 = ((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32;
                int q1 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                part[0 + l / 16] += q0 * x8[l];
                part[2 + l / 16] += q1 * x8[32 + l];
                part[4 + l / 16] += q2 * x8[64 + l];
                part[6 + l / 16] += q3 * x8[96 + l];
            }
            for (int j = 0; j < 8; ++j) sumi += sc[8 * h + j] * part[j];
        }
        s += f16at(w + 208) * qs_load_f32(x) * (float)sumi;
    }
    return s;
}
/* Q2_K x Q8_K: per 16 elements Σ q·x times the 4-bit scale; the mins against the activation's 16-sums (bsums) */
float qs_dot_q2_K_scalar(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    for (int64_t i = 0; i < n / 256; ++i, w += 84, x += 292) {
        const int8_t *q = (const int8_t *)(x + 4);
        int32_t isum = 0, summs = 0;
        for (int g = 0; g < 16; ++g) {
            const int16_t bs = (int16_t)qs_load_u16(x + 260 + 2 * g);
            summs += (w[g] >> 4) * bs;
            const int n2 = g / 8, j = (g % 8) / 2, l0 = 16 * (g % 2);
            int32_t p = 0;
            for (int l = l0; l < l0 + 16; ++l) p += ((w[16 + 32 * n2 + l] >> (2 * j)) & 3) * q[128 * n2 + 32 * j + l];
            isum += (w[g] & 15) * p;
        }
        const float dx = qs_load_f32(x);
        s += dx * f16at(w + 80) * (float)isum - dx * f16at(w + 82) * (float)summs;
    }
    return s;
}

/* Q3_K x Q8_K: codes q = low 2 bits + 4 · hmask bit (0..7), value q − 4: Σ (q − 4)·x = Σ q·x − 4 · bsum per 16 */
float qs_dot_q3_K_scalar(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    int8_t sc[16];
    for (int64_t i = 0; i < n / 256; ++i, w += 110, x += 292) {
        const int8_t *q = (const int8_t *)(x + 4);
        qs_q3k_scales(w + 96, sc);
        int32_t isum = 0;
        for (int g = 0; g < 16; ++g) {
            const int16_t bs = (int16_t)qs_load_u16(x + 260 + 2 * g);
            const int n2 = g / 8, j = (g % 8) / 2, l0 = 16 * (g % 2);
            int32_t p = 0;
            for (int l = l0; l < l0 + 16; ++l) {
                const int c = ((w[32 + 32 * n2 + l] >> (2 * j)) & 3) | (((w[l] >> (4 * n2 + j)) & 1) << 2);
                p += c * q[128 * n2 + 32 * j + l];
            }
            isum += sc[g] * (p - 4 * bs);
        }
        s += qs_load_f32(x) * f16at(w + 108) * (float)isum;
    }
    return s;
}

/* IQ4_NL x Q8_0: the code book's values times the activation codes, one integer sum per block */
float qs_dot_iq4_nl_scalar(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    for (int64_t i = 0; i < n / 32; ++i, w += 18, x += 34) {
        int32_t sumi = 0;
        for (int j = 0; j < 16; ++j)
            sumi += QS_IQ4NL[w[2 + j] & 15] * (int8_t)x[2 + j] + QS_IQ4NL[w[2 + j] >> 4] * (int8_t)x[18 + j];
        s += (float)sumi * (f16at(w) * f16at(x));
    }
    return s;
}

/* IQ4_XS x Q8_K: per 32-element sub-block an integer sum times its 6-bit scale minus 32 */
float qs_dot_iq4_xs_scalar(int64_t n, const uint8_t *w, const uint8_t *x) {
    float s = 0.0f;
    for (int64_t i = 0; i < n / 256; ++i, w += 136, x += 292) {
        const uint16_t sh = qs_load_u16(w + 2);
        const int8_t *q = (const int8_t *)(x + 4);
        int32_t sumi = 0;
        for (int sb = 0; sb < 8; ++sb) {
            const int ls = ((w[4 + sb / 2] >> (4 * (sb % 2))) & 15) | (((sh >> (2 * sb)) & 3) << 4);
            const uint8_t *qs = w + 8 + 16 * sb;
            int32_t p = 0;
            for (int j = 0; j < 16; ++j) p += QS_IQ4NL[qs[j] & 15] * q[32 * sb + j] + QS_IQ4NL[qs[j] >> 4] * q[32 * sb + 16 + j];
            sumi += p * (ls - 32);
        }
        s += (float)sumi * (f16at(w) * qs_load_f32(x));
    }
    return s;
}

float qs_dot_f16_scalar(int64_t n, const uint8_t *w, const uint8_t *x) {
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += (double)(f16at(w + 2 * i) * f16at(x + 2 * i));
    return (float)s;
}
float qs_dot_bf16_scalar(int64_t n, const uint8_t *w, const uint8_t *x) {
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i)
        s += (double)(qs_bf16_to_fp32(qs_load_u16(w + 2 * i)) * qs_bf16_to_fp32(qs_load_u16(x + 2 * i)));
    return (float)s;
}
float qs_dot_f32_scalar(int64_t n, const uint8_t *w, const uint8_t *x) {
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += (double)(qs_load_f32(w + 4 * i) * qs_load_f32(x + 4 * i));
    return (float)s;
}

