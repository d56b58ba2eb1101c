/* Repacked weights' codecs (qs_repack.h): the load-time writers of one (16-row group, k-block) unit per layout and
 * the scalar reference kernels, one column. The scalar kernels compute exactly what the SIMD ones compute (same
 * integer sums, same float operations in the same order, fmaf where the SIMD code fuses), so the tests compare
 * them bit for bit. The type table (qs_traits.c) names them; they call nothing above them. */
#include <math.h>
#include <string.h>

#include "qs.h"
#include "qs_quant_internal.h"
#include "qs_repack.h"

static inline float h2f(const uint8_t *p) { return qs_fp16_to_fp32(qs_load_u16(p)); }

/* ---------------------------------------------------------------- one row's block -> codes and scales */
/* A nibble chunk's 4 bytes of one row from 8 consecutive source bytes whose low (hi = 0) or high (hi = 1)
 * nibbles hold elements e0..e7: byte j = e_j | e_{4+j} << 4. */
static inline uint32_t nib8(const uint8_t *p, int hi) {
    uint64_t x;
    memcpy(&x, p, 8);
    x = (hi ? x >> 4 : x) & 0x0F0F0F0F0F0F0F0FULL;
    return (uint32_t)(x | (x >> 28));
}

static inline void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

/* Q4_K (144-B blocks, nibbles at 16) and Q5_K (176-B blocks, fifth bits at 16, nibbles at 48) */
static void unit_k45(const uint8_t *const *rows, int64_t kb, uint8_t *u, const int five) {
    const int bytes = five ? 176 : 144, qoff = five ? 48 : 16;
    for (int r = 0; r < QS_RP_ROWS; ++r) {
        const uint8_t *b = rows[r] + kb * bytes;
        uint32_t sm[4];
        memcpy(u + 2 * r, b, 2);
        memcpy(u + 32 + 2 * r, b + 2, 2);
        k4_scales_mins(b + 4, sm);
        const uint8_t *smb = (const uint8_t *)sm;
        for (int s = 0; s < 8; ++s) {
            u[64 + 16 * s + r] = smb[s];
            u[192 + 32 * (s / 2) + 2 * r + s % 2] = smb[8 + s];
        }
        /* elements 64q + l: low nibble of byte qoff + 32q + l; 64q + 32 + l: its high nibble */
        for (int q = 0; q < 4; ++q)
            for (int g = 0; g < 4; ++g) {
                const uint8_t *p = b + qoff + 32 * q + 8 * g;
                put32(u + K45_NIB(five, 8 * q + g) + 4 * r, nib8(p, 0));
                put32(u + K45_NIB(five, 8 * q + 4 + g) + 4 * r, nib8(p, 1));
            }
        if (five) /* element 32s + l: fifth bit at bit s of qh[l]; chunk bit v of byte j is l = 4v + j */
            for (int s = 0; s < 8; ++s) {
                uint32_t v = 0;
                for (int i = 0; i < 8; ++i) v |= ((qs_load_u32(b + 16 + 4 * i) >> s) & 0x01010101u) << i;
                put32(u + K5_BITS(s) + 4 * r, v);
            }
    }
}

void qs_rp_unit_q4_K(const uint8_t *const *rows, int64_t kb, uint8_t *u) { unit_k45(rows, kb, u, 0); }
void qs_rp_unit_q5_K(const uint8_t *const *rows, int64_t kb, uint8_t *u) { unit_k45(rows, kb, u, 1); }

void qs_rp_unit_q6_K(const uint8_t *const *rows, int64_t kb, uint8_t *u) {
    memset(u + 32, 0, 32);
    for (int r = 0; r < QS_RP_ROWS; ++r) {
        const uint8_t *b = rows[r] + kb * 210;
        memcpy(u + 2 * r, b + 208, 2);
        for (int s = 0; s < 16; ++s) u[64 + 16 * s + r] = b[192 + s];
        /* element 128h + 32p + l: low 4 bits in the (p >> 1) nibble of ql[64h + 32(p & 1) + l], high 2 bits at
         * bit 2p of qh[32h + l] */
        for (int h = 0; h < 2; ++h)
            for (int p = 0; p < 4; ++p)
                for (int g = 0; g < 4; ++g)
                    put32(u + Q6_LO(16 * h + 4 * p + g) + 4 * r, nib8(b + 64 * h + 32 * (p & 1) + 8 * g, p >> 1));
        for (int s = 0; s < 16; ++s) { /* elements 16s + 4i + j, i = 0..3: l = 16(s % 2) + 4i + j */
            const uint8_t *qh = b + 128 + 32 * (s / 8) + 16 * (s % 2);
            const int p = (s % 8) / 2;
            uint32_t v = 0;
            for (int i = 0; i < 4; ++i) v |= ((qs_load_u32(qh + 4 * i) >> (2 * p)) & 0x03030303u) << (2 * i);
            put32(u + Q6_HI(s) + 4 * r, v);
        }
    }
}

/* Q2_K (84-B blocks: scale|min << 4 [16], qs[64], d, dmin): element 128h + 32j + l at bits 2j of qs[32h + l];
 * sub-block s = 8h + 2j + l / 16 */
void qs_rp_unit_q2_K(const uint8_t *const *rows, int64_t kb, uint8_t *u) {
    for (int r = 0; r < QS_RP_ROWS; ++r) {
        const uint8_t *b = rows[r] + kb * 84;
        memcpy(u + 2 * r, b + 80, 2);
        memcpy(u + 32 + 2 * r, b + 82, 2);
        for (int s = 0; s < 16; ++s) {
            u[64 + 16 * s + r] = b[s];
            const int h = s / 8, jj = (s % 8) / 2, l0 = 16 * (s % 2); /* elements 16s + e, e = 4i + j */
            uint32_t v = 0;
            for (int e = 0; e < 16; ++e) {
                const uint32_t q = (b[16 + 32 * h + l0 + e] >> (2 * jj)) & 3;
                v |= q << (8 * (e % 4) + 2 * (e / 4));
            }
            put32(u + Q2_CR(s) + 4 * r, v);
        }
    }
}

/* Q3_K (110-B blocks: hmask[32], qs[64], 12 scale bytes, d): element 128h + 32j + l has its low bits at bits 2j of
 * qs[32h + l] and its third bit at bit 4h + j of hmask[l]; code = low + 4 · third bit (ggml subtracts 4) */
void qs_rp_unit_q3_K(const uint8_t *const *rows, int64_t kb, uint8_t *u) {
    memset(u + 32, 0, 32);
    for (int r = 0; r < QS_RP_ROWS; ++r) {
        const uint8_t *b = rows[r] + kb * 110;
        int8_t sc[16];
        memcpy(u + 2 * r, b + 108, 2);
        qs_q3k_scales(b + 96, sc);
        uint32_t hi[8] = {0};
        for (int s = 0; s < 16; ++s) {
            u[64 + 16 * s + r] = (uint8_t)sc[s];
            const int h = s / 8, jj = (s % 8) / 2, l0 = 16 * (s % 2);
            uint32_t v = 0;
            for (int e = 0; e < 16; ++e) {
                const int l = l0 + e;
                v |= (uint32_t)((b[32 + 32 * h + l] >> (2 * jj)) & 3) << (8 * (e % 4) + 2 * (e / 4));
                hi[s / 2] |= (uint32_t)((b[l] >> (4 * h + jj)) & 1) << (8 * (e % 4) + e / 4 + 4 * (s % 2));
            }
            put32(u + Q3_CR(s) + 4 * r, v);
        }
        for (int p = 0; p < 8; ++p) put32(u + Q3_HI(p) + 4 * r, hi[p]);
    }
}

/* IQ4_XS (136-B blocks: d, scales_h u16, scales_l[4], 128 nibble bytes): sub-block s of 32 elements j and 16 + j
 * in the low and high nibble of byte 8 + 16 s + j */
void qs_rp_unit_iq4_xs(const uint8_t *const *rows, int64_t kb, uint8_t *u) {
    memset(u + 32, 0, 32);
    for (int r = 0; r < QS_RP_ROWS; ++r) {
        const uint8_t *b = rows[r] + kb * 136;
        const uint16_t sh = qs_load_u16(b + 2);
        memcpy(u + 2 * r, b, 2);
        for (int s = 0; s < 8; ++s) {
            const int ls = ((b[4 + s / 2] >> (4 * (s % 2))) & 15) | (((sh >> (2 * s)) & 3) << 4);
            u[64 + 16 * s + r] = (uint8_t)(int8_t)(ls - 32);
            for (int c = 0; c < 4; ++c) put32(u + 192 + 64 * (4 * s + c) + 4 * r, nib8(b + 8 + 16 * s + 8 * (c % 2), c / 2));
        }
    }
}

/* 32-element ggml blocks, two per layout k-block (kinds as in B32 below); elements j and 16 + j in the low and
 * high nibble of byte j, Q5's fifth bit of element e at bit e of the u32 qh. */
typedef struct {
    int unit, bytes, qoff, has_min, qh, byte_codes, uq, planes, lut;
} b32_kind;

/* unit bytes, ggml block bytes, codes in the block, min, qh in the block (-1 none), 8-bit codes, chunk offset in the
 * unit, bit-plane offset in the unit, nibble = index into a code book (value + 128 as the code: 1 IQ4_NL's, 2
 * MXFP4's, whose one-byte E8M0 exponent takes the place of d) */
static const b32_kind B32[7] = {
    {576, 18, 2, 0, -1, 0, 64, 0, 0},    /* Q4_0 */
    {640, 20, 4, 1, -1, 0, 128, 0, 0},   /* Q4_1 */
    {1088, 34, 2, 0, -1, 1, 64, 0, 0},   /* Q8_0 */
    {704, 22, 6, 0, 2, 0, 64, 576, 0},   /* Q5_0 */
    {768, 24, 8, 1, 4, 0, 128, 640, 0},  /* Q5_1 */
    {576, 18, 2, 0, -1, 0, 64, 0, 1},    /* IQ4_NL */
    {576, 17, 1, 0, -1, 0, 64, 0, 2},    /* MXFP4 */
};

static void unit_b32(const uint8_t *const *rows, int64_t kb, uint8_t *u, const int kind) {
    const b32_kind *k = &B32[kind];
    for (int r = 0; r < QS_RP_ROWS; ++r)
        for (int h = 0; h < 2; ++h) {
            const uint8_t *b = rows[r] + (2 * kb + h) * k->bytes;
            if (k->lut == 2) { /* MXFP4: the exponent byte, then 0 */
                u[32 * h + 2 * r] = b[0];
                u[32 * h + 2 * r + 1] = 0;
            } else {
                memcpy(u + 32 * h + 2 * r, b, 2);
            }
            if (k->has_min) memcpy(u + 64 + 32 * h + 2 * r, b + 2, 2);
            if (k->byte_codes) {
                for (int c = 0; c < 8; ++c)
                    put32(u + k->uq + 64 * (8 * h + c) + 4 * r, qs_load_u32(b + k->qoff + 4 * c) ^ 0x80808080u);
                continue;
            }
            for (int c = 0; c < 4; ++c)
                put32(u + k->uq + 64 * (4 * h + c) + 4 * r, nib8(b + k->qoff + 8 * (c % 2), c / 2));
            if (k->qh >= 0) {
                const uint32_t qh = qs_load_u32(b + k->qh); /* bit e: fifth bit of element e */
                for (int j = 0; j < 4; ++j) {
                    uint8_t v = 0;
                    for (int i = 0; i < 8; ++i) v |= (uint8_t)(((qh >> (j + 4 * i)) & 1) << i);
                    u[k->planes + 64 * h + 4 * r + j] = v;
                }
            }
        }
}

void qs_rp_unit_q4_0(const uint8_t *const *rows, int64_t kb, uint8_t *u) { unit_b32(rows, kb, u, 0); }
void qs_rp_unit_q4_1(const uint8_t *const *rows, int64_t kb, uint8_t *u) { unit_b32(rows, kb, u, 1); }
void qs_rp_unit_q8_0(const uint8_t *const *rows, int64_t kb, uint8_t *u) { unit_b32(rows, kb, u, 2); }
void qs_rp_unit_q5_0(const uint8_t *const *rows, int64_t kb, uint8_t *u) { unit_b32(rows, kb, u, 3); }
void qs_rp_unit_q5_1(const uint8_t *const *rows, int64_t kb, uint8_t *u) { unit_b32(rows, kb, u, 4); }
void qs_rp_unit_iq4_nl(const uint8_t *const *rows, int64_t kb, uint8_t *u) { unit_b32(rows, kb, u, 5); }
void qs_rp_unit_mxfp4(const uint8_t *const *rows, int64_t kb, uint8_t *u) { unit_b32(rows, kb, u, 6); }

/* F32 / F16 / BF16: element e of the k-block holds the 16 rows' values side by side (es bytes each) */
static void unit_float(const uint8_t *const *rows, int64_t kb, uint8_t *u, const int es) {
    for (int r = 0; r < QS_RP_ROWS; ++r) {
        const uint8_t *b = rows[r] + kb * 16 * es;
        for (int e = 0; e < 16; ++e) memcpy(u + es * (16 * e + r), b + es * e, (size_t)es);
    }
}

void qs_rp_unit_f32(const uint8_t *const *rows, int64_t kb, uint8_t *u) { unit_float(rows, kb, u, 4); }
void qs_rp_unit_f16(const uint8_t *const *rows, int64_t kb, uint8_t *u) { unit_float(rows, kb, u, 2); }

/* BF16: pair p of the k-block (elements 2p, 2p+1) of the 16 rows side by side, 4 bytes a row: the operand of one
 * vdpbf16ps for 16 rows */
void qs_rp_unit_bf16(const uint8_t *const *rows, int64_t kb, uint8_t *u) {
    for (int r = 0; r < QS_RP_ROWS; ++r) {
        const uint8_t *b = rows[r] + kb * 32;
        for (int p = 0; p < 8; ++p) memcpy(u + 64 * p + 4 * r, b + 4 * p, 4);
    }
}


/* ---------------------------------------------------------------- scalar reference kernels (one column) */
#define RP_COL(x, c)                                                                                               \
    const uint8_t *xq = (x)->xq + (c) * (x)->xq_stride;                                                            \
    const int32_t *ia = (x)->ia + (c) * (x)->ia_stride;                                                            \
    const float *fa = (x)->fa + (c) * (x)->f_stride;                                                               \
    (void)ia;                                                                                                      \
    (void)fa

static void rp_k45_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out, const int five) {
    RP_COL(x, c0);
    const int unit = five ? 2880 : 2368;
    float acc[16] = {0};
    for (int64_t sb = 0; sb < nb; ++sb, g += unit, xq += 292) {
        const int8_t *q = (const int8_t *)(xq + 4);
        const float dx = fa[sb];
        for (int r = 0; r < 16; ++r) {
            int32_t I = 0, M = 0;
            for (int s = 0; s < 8; ++s) {
                int32_t P = 0;
                for (int cc = 0; cc < 4; ++cc) {
                    const int c = 4 * s + cc;
                    const uint8_t *v = g + K45_NIB(five, c) + 4 * r, *hb = g + K5_BITS(s) + 4 * r;
                    for (int j = 0; j < 4; ++j) {
                        const int c0v = (v[j] & 15) | (five ? ((hb[j] >> (2 * cc)) & 1) << 4 : 0);
                        const int c1v = (v[j] >> 4) | (five ? ((hb[j] >> (2 * cc + 1)) & 1) << 4 : 0);
                        P += c0v * q[8 * c + j] + c1v * q[8 * c + 4 + j];
                    }
                }
                I += P * (int32_t)g[64 + 16 * s + r];
            }
            for (int p = 0; p < 4; ++p) {
                int32_t s2 = ia[4 * sb + p];
                M += (int32_t)g[192 + 32 * p + 2 * r] * (int16_t)(s2 & 0xFFFF) +
                     (int32_t)g[193 + 32 * p + 2 * r] * (int16_t)((uint32_t)s2 >> 16);
            }
            acc[r] = fmaf((float)I, h2f(g + 2 * r) * dx, acc[r]);
            acc[r] = fmaf(-(float)M, h2f(g + 32 + 2 * r) * dx, acc[r]);
        }
    }
    memcpy(out, acc, sizeof acc);
}

void qs_rp_q4_K_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    rp_k45_scalar(g, nb, x, c0, out, 0);
}
void qs_rp_q5_K_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    rp_k45_scalar(g, nb, x, c0, out, 1);
}

void qs_rp_q6_K_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    RP_COL(x, c0);
    float acc[16] = {0};
    for (int64_t sb = 0; sb < nb; ++sb, g += 3392, xq += 292) {
        const int8_t *q = (const int8_t *)(xq + 4);
        const float dx = fa[sb];
        for (int r = 0; r < 16; ++r) {
            int32_t I = 0;
            for (int s = 0; s < 16; ++s) {
                int32_t P = 0;
                const uint8_t *hb = g + Q6_HI(s) + 4 * r;
                for (int half = 0; half < 2; ++half) {
                    int c = 2 * s + half;
                    const uint8_t *v = g + Q6_LO(c) + 4 * r;
                    for (int j = 0; j < 4; ++j) {
                        int c0v = (v[j] & 15) | (((hb[j] >> (4 * half)) & 3) << 4);
                        int c1v = (v[j] >> 4) | (((hb[j] >> (4 * half + 2)) & 3) << 4);
                        P += c0v * q[8 * c + j] + c1v * q[8 * c + 4 + j];
                    }
                }
                P -= ia[16 * sb + s];
                I += P * (int32_t)(int8_t)g[64 + 16 * s + r];
            }
            acc[r] = fmaf((float)I, h2f(g + 2 * r) * dx, acc[r]);
        }
    }
    memcpy(out, acc, sizeof acc);
}

/* Q2_K: per sub-block of 16 the codes against the activations times the scale (I) and the min times the
 * activations' sum (M); per block and row acc + I · (d · d_x), then acc − M · (dmin · d_x), both fused */
void qs_rp_q2_K_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    RP_COL(x, c0);
    float acc[16] = {0};
    for (int64_t sb = 0; sb < nb; ++sb, g += 1344, xq += 292) {
        const int8_t *q = (const int8_t *)(xq + 4);
        for (int r = 0; r < 16; ++r) {
            int32_t I = 0, M = 0;
            for (int s = 0; s < 16; ++s) {
                const uint8_t *v = g + Q2_CR(s) + 4 * r;
                int32_t P = 0;
                for (int i = 0; i < 4; ++i)
                    for (int j = 0; j < 4; ++j) P += ((v[j] >> (2 * i)) & 3) * q[16 * s + 4 * i + j];
                const uint8_t sm = g[64 + 16 * s + r];
                I += P * (sm & 15);
                M += (sm >> 4) * ia[16 * sb + s];
            }
            const float dx = fa[sb];
            acc[r] = fmaf((float)I, h2f(g + 2 * r) * dx, acc[r]);
            acc[r] = fmaf(-(float)M, h2f(g + 32 + 2 * r) * dx, acc[r]);
        }
    }
    memcpy(out, acc, sizeof acc);
}

/* Q3_K: per sub-block of 16 the 3-bit codes against the activations minus 4 x their sum (ia), times the signed
 * scale; one float multiply-add per block and row */
void qs_rp_q3_K_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    RP_COL(x, c0);
    float acc[16] = {0};
    for (int64_t sb = 0; sb < nb; ++sb, g += 1856, xq += 292) {
        const int8_t *q = (const int8_t *)(xq + 4);
        for (int r = 0; r < 16; ++r) {
            int32_t I = 0;
            for (int s = 0; s < 16; ++s) {
                const uint8_t *v = g + Q3_CR(s) + 4 * r, *hb = g + Q3_HI(s / 2) + 4 * r;
                int32_t P = -ia[16 * sb + s];
                for (int i = 0; i < 4; ++i)
                    for (int j = 0; j < 4; ++j)
                        P += (((v[j] >> (2 * i)) & 3) | (((hb[j] >> (i + 4 * (s % 2))) & 1) << 2)) * q[16 * s + 4 * i + j];
                I += P * (int32_t)(int8_t)g[64 + 16 * s + r];
            }
            acc[r] = fmaf((float)I, h2f(g + 2 * r) * fa[sb], acc[r]);
        }
    }
    memcpy(out, acc, sizeof acc);
}

/* IQ4_XS: per sub-block of 32 the code-book values + 128 against the activations minus 128 x their sum (ia), times
 * the signed scale; one float multiply-add per block and row */
void qs_rp_iq4_xs_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    RP_COL(x, c0);
    float acc[16] = {0};
    for (int64_t sb = 0; sb < nb; ++sb, g += 2240, xq += 292) {
        const int8_t *q = (const int8_t *)(xq + 4);
        for (int r = 0; r < 16; ++r) {
            int32_t I = 0;
            for (int s = 0; s < 8; ++s) {
                int32_t P = -ia[8 * sb + s];
                for (int c = 4 * s; c < 4 * s + 4; ++c) {
                    const uint8_t *v = g + 192 + 64 * c + 4 * r;
                    for (int j = 0; j < 4; ++j)
                        P += (QS_IQ4NL[v[j] & 15] + 128) * q[8 * c + j] + (QS_IQ4NL[v[j] >> 4] + 128) * q[8 * c + 4 + j];
                }
                I += P * (int32_t)(int8_t)g[64 + 16 * s + r];
            }
            acc[r] = fmaf((float)I, h2f(g + 2 * r) * fa[sb], acc[r]);
        }
    }
    memcpy(out, acc, sizeof acc);
}

/* 32-element blocks (kinds as in B32): integer sum per block and row, minus the activation offset (ia) or plus the
 * min term (Q8_1's s) */
static void rp_b32_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out, const int kind) {
    RP_COL(x, c0);
    const b32_kind *k = &B32[kind];
    const float *fb = x->fb + c0 * x->f_stride;
    const int ab = k->has_min ? 36 : 34;
    float acc[16] = {0};
    for (int64_t kb = 0; kb < nb; ++kb, g += k->unit)
        for (int h = 0; h < 2; ++h) {
            int64_t b = 2 * kb + h;
            const int8_t *q = (const int8_t *)(xq + ab * b + ab - 32);
            for (int r = 0; r < 16; ++r) {
                int32_t P = 0;
                if (k->byte_codes) {
                    for (int c = 0; c < 8; ++c)
                        for (int j = 0; j < 4; ++j) P += (int32_t)g[k->uq + 64 * (8 * h + c) + 4 * r + j] * q[4 * c + j];
                } else {
                    const uint8_t *hb = g + k->planes + 64 * h + 4 * r;
                    for (int c = 0; c < 4; ++c) {
                        const uint8_t *v = g + k->uq + 64 * (4 * h + c) + 4 * r;
                        for (int j = 0; j < 4; ++j) {
                            int c0v = v[j] & 15, c1v = v[j] >> 4;
                            if (k->qh >= 0) {
                                c0v |= ((hb[j] >> (2 * c)) & 1) << 4;
                                c1v |= ((hb[j] >> (2 * c + 1)) & 1) << 4;
                            }
                            if (k->lut) {
                                const int8_t *book = k->lut == 2 ? QS_FP4X2 : QS_IQ4NL;
                                c0v = book[c0v] + 128;
                                c1v = book[c1v] + 128;
                            }
                            P += c0v * q[8 * c + j] + c1v * q[8 * c + 4 + j];
                        }
                    }
                }
                if (!k->has_min) P -= ia[b];
                const float d = k->lut == 2 ? qs_e8m0_half(g[32 * h + 2 * r]) : h2f(g + 32 * h + 2 * r);
                acc[r] = fmaf((float)P, d * fa[b], acc[r]);
                if (k->has_min) acc[r] = fmaf(h2f(g + 64 + 32 * h + 2 * r), fb[b], acc[r]);
            }
        }
    memcpy(out, acc, sizeof acc);
}

void qs_rp_q4_0_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    rp_b32_scalar(g, nb, x, c0, out, 0);
}
void qs_rp_q4_1_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    rp_b32_scalar(g, nb, x, c0, out, 1);
}
void qs_rp_q8_0_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    rp_b32_scalar(g, nb, x, c0, out, 2);
}
void qs_rp_q5_0_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    rp_b32_scalar(g, nb, x, c0, out, 3);
}
void qs_rp_q5_1_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    rp_b32_scalar(g, nb, x, c0, out, 4);
}
void qs_rp_iq4_nl_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    rp_b32_scalar(g, nb, x, c0, out, 5);
}
void qs_rp_mxfp4_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    rp_b32_scalar(g, nb, x, c0, out, 6);
}

/* Float layouts: per row, two accumulation chains (element e of a k-block feeds chain e % 2), fused multiply-adds
 * against the float32 activation, the chains added at the end; kind 0 F32, 1 F16. */
static void rp_float_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out, const int kind) {
    const float *xs = (const float *)(x->xq + c0 * x->xq_stride);
    const int es = kind ? 2 : 4;
    float acc[2][16] = {{0}};
    for (int64_t kb = 0; kb < nb; ++kb, g += 16 * 16 * es)
        for (int e = 0; e < 16; ++e)
            for (int r = 0; r < 16; ++r) {
                const uint8_t *p = g + es * (16 * e + r);
                const float w = kind == 0 ? qs_load_f32(p) : h2f(p);
                acc[e & 1][r] = fmaf(w, xs[16 * kb + e], acc[e & 1][r]);
            }
    for (int r = 0; r < 16; ++r) out[r] = acc[0][r] + acc[1][r];
}

/* BF16 against BF16 activations (ggml's vec_dot_type for BF16: the activations rounded to nearest even, as
 * llama.cpp does): what one vdpbf16ps does per row and pair, in Intel's order: the odd element's product added
 * first, then the even one's. A product of two bfloat16 values is exact in float32, so each step rounds once
 * (fmaf and a plain add of the product agree). Two chains per row (pair p feeds chain p % 2), added at the end. */
void qs_rp_bf16_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    const uint8_t *xs = x->xq + c0 * x->xq_stride;
    float acc[2][16] = {{0}};
    for (int64_t kb = 0; kb < nb; ++kb, g += 512)
        for (int p = 0; p < 8; ++p) {
            const uint8_t *xp = xs + 32 * kb + 4 * p;
            const float xe = qs_bf16_to_fp32(qs_load_u16(xp)), xo = qs_bf16_to_fp32(qs_load_u16(xp + 2));
            for (int r = 0; r < 16; ++r) {
                const uint8_t *wp = g + 64 * p + 4 * r;
                float a = fmaf(qs_bf16_to_fp32(qs_load_u16(wp + 2)), xo, acc[p & 1][r]);
                acc[p & 1][r] = fmaf(qs_bf16_to_fp32(qs_load_u16(wp)), xe, a);
            }
        }
    for (int r = 0; r < 16; ++r) out[r] = acc[0][r] + acc[1][r];
}

void qs_rp_f32_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    rp_float_scalar(g, nb, x, c0, out, 0);
}
void qs_rp_f16_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    rp_float_scalar(g, nb, x, c0, out, 1);
}

