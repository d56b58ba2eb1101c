/* Load-time repacking into the R16 layouts (qs_repack.h), their scalar reference kernels, activation preparation
 * and the threaded matmul driver for repacked weights. The scalar kernels compute exactly what the SIMD ones
 * compute (same integer sums, same float operations in the same order, fmaf where the SIMD code fuses), so the
 * tests compare them bit for bit; against ggml's row-by-row dot products they differ only in float summation
 * order (docs/engine.md#repacked-weights). */
#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "qs.h"
#include "qs_guard.h"
#include "qs_quant_internal.h"
#include "qs_repack.h"
#include "qs_simd_common.h"
#include "qs_traits.h"

static inline float h2f(const uint8_t *p) { return qs_fp16_to_fp32(qs_load_u16(p)); }

/* ---------------------------------------------------------------- the layout table */
typedef struct {
    int type;      /* ggml weight type */
    int blk;       /* elements of one k-block of the layout */
    int unit;      /* bytes of one (16-row group, k-block) unit */
    int act;       /* activation format (ggml's vec_dot_type for the weight type) */
    int act_elems; /* elements of one activation block */
    int act_bytes; /* bytes of one activation block */
    int ia_per;    /* int32 offsets per activation block */
    qs_rp_kernel k4, k1, a4, a1; /* AVX-512 and AVX2 kernels, `cols` columns and 1 */
    int cols;      /* columns of the wide kernels */
} rp_info;

static const rp_info RP_TABLE[] = {
    {QS_Q4_K, 256, 2368, QS_Q8_K, 256, 292, 4, qs_rp_q4_K_avx512_4, qs_rp_q4_K_avx512_1, qs_rp_q4_K_avx2_4, qs_rp_q4_K_avx2_1, 4},
    {QS_Q5_K, 256, 2880, QS_Q8_K, 256, 292, 4, qs_rp_q5_K_avx512_4, qs_rp_q5_K_avx512_1, qs_rp_q5_K_avx2_4, qs_rp_q5_K_avx2_1, 4},
    {QS_Q6_K, 256, 3392, QS_Q8_K, 256, 292, 16, qs_rp_q6_K_avx512_4, qs_rp_q6_K_avx512_1, qs_rp_q6_K_avx2_4, qs_rp_q6_K_avx2_1, 4},
    {QS_Q4_0, 64, 576, QS_Q8_0, 32, 34, 1, qs_rp_q4_0_avx512_4, qs_rp_q4_0_avx512_1, qs_rp_q4_0_avx2_4, qs_rp_q4_0_avx2_1, 4},
    {QS_Q4_1, 64, 640, QS_Q8_1, 32, 36, 0, qs_rp_q4_1_avx512_4, qs_rp_q4_1_avx512_1, qs_rp_q4_1_avx2_4, qs_rp_q4_1_avx2_1, 4},
    {QS_Q8_0, 64, 1088, QS_Q8_0, 32, 34, 1, qs_rp_q8_0_avx512_4, qs_rp_q8_0_avx512_1, qs_rp_q8_0_avx2_4, qs_rp_q8_0_avx2_1, 4},
    {QS_Q5_0, 64, 704, QS_Q8_0, 32, 34, 1, qs_rp_q5_0_avx512_4, qs_rp_q5_0_avx512_1, qs_rp_q5_0_avx2_4, qs_rp_q5_0_avx2_1, 4},
    {QS_Q5_1, 64, 768, QS_Q8_1, 32, 36, 0, qs_rp_q5_1_avx512_4, qs_rp_q5_1_avx512_1, qs_rp_q5_1_avx2_4, qs_rp_q5_1_avx2_1, 4},
    {QS_Q2_K, 256, 1344, QS_Q8_K, 256, 292, 16, qs_rp_q2_K_avx512_4, qs_rp_q2_K_avx512_1, qs_rp_q2_K_avx2_4, qs_rp_q2_K_avx2_1, 4},
    {QS_Q3_K, 256, 1856, QS_Q8_K, 256, 292, 16, qs_rp_q3_K_avx512_4, qs_rp_q3_K_avx512_1, qs_rp_q3_K_avx2_4, qs_rp_q3_K_avx2_1, 4},
    {QS_IQ4_XS, 256, 2240, QS_Q8_K, 256, 292, 8, qs_rp_iq4_xs_avx512_4, qs_rp_iq4_xs_avx512_1, qs_rp_iq4_xs_avx2_4, qs_rp_iq4_xs_avx2_1, 4},
    {QS_IQ4_NL, 64, 576, QS_Q8_0, 32, 34, 1, qs_rp_iq4_nl_avx512_4, qs_rp_iq4_nl_avx512_1, qs_rp_iq4_nl_avx2_4, qs_rp_iq4_nl_avx2_1, 4},
    {QS_MXFP4, 64, 576, QS_Q8_0, 32, 34, 1, qs_rp_mxfp4_avx512_4, qs_rp_mxfp4_avx512_1, qs_rp_mxfp4_avx2_4, qs_rp_mxfp4_avx2_1, 4},
    /* float weights: the activations stay float32, read in place (no preparation) */
    {QS_F32, 16, 1024, QS_F32, 16, 64, 0, qs_rp_f32_avx512_8, qs_rp_f32_avx512_1, qs_rp_f32_avx2_8, qs_rp_f32_avx2_1, 8},
    {QS_F16, 16, 512, QS_F32, 16, 64, 0, qs_rp_f16_avx512_8, qs_rp_f16_avx512_1, qs_rp_f16_avx2_8, qs_rp_f16_avx2_1, 8},
    {QS_BF16, 16, 512, QS_F32, 16, 64, 0, qs_rp_bf16_avx512_8, qs_rp_bf16_avx512_1, qs_rp_bf16_avx2_8, qs_rp_bf16_avx2_1, 8},
};

/* The code types' prompt layout (qs_iq_prefill): never a load-time copy (2.5x the file's bytes), only a row
 * group decoded for the columns of one product. blk 256, unit 4416: the block multiplier f32[16] @0, the group
 * scales s8 [256/gs][16] @64, then 64 byte chunks @320 (chunk c, byte 4r+j: code of element 4c+j + 64). */
static const rp_info RP_CODES[] = {
    {QS_IQ2_XXS, 256, 4416, QS_Q8_K, 256, 292, 8, qs_rp_codes32_avx512_4, qs_rp_codes32_avx512_1, qs_rp_codes32_avx2_4, qs_rp_codes32_avx2_1, 4},
    {QS_IQ2_XS, 256, 4416, QS_Q8_K, 256, 292, 16, qs_rp_codes16_avx512_4, qs_rp_codes16_avx512_1, qs_rp_codes16_avx2_4, qs_rp_codes16_avx2_1, 4},
    {QS_IQ2_S, 256, 4416, QS_Q8_K, 256, 292, 16, qs_rp_codes16_avx512_4, qs_rp_codes16_avx512_1, qs_rp_codes16_avx2_4, qs_rp_codes16_avx2_1, 4},
    {QS_IQ3_XXS, 256, 4416, QS_Q8_K, 256, 292, 8, qs_rp_codes32_avx512_4, qs_rp_codes32_avx512_1, qs_rp_codes32_avx2_4, qs_rp_codes32_avx2_1, 4},
    {QS_IQ3_S, 256, 4416, QS_Q8_K, 256, 292, 8, qs_rp_codes32_avx512_4, qs_rp_codes32_avx512_1, qs_rp_codes32_avx2_4, qs_rp_codes32_avx2_1, 4},
    {QS_IQ1_S, 256, 4416, QS_Q8_K, 256, 292, 8, qs_rp_codes32_avx512_4, qs_rp_codes32_avx512_1, qs_rp_codes32_avx2_4, qs_rp_codes32_avx2_1, 4},
    {QS_IQ1_M, 256, 4416, QS_Q8_K, 256, 292, 16, qs_rp_codes16_avx512_4, qs_rp_codes16_avx512_1, qs_rp_codes16_avx2_4, qs_rp_codes16_avx2_1, 4},
    {QS_TQ1_0, 256, 4416, QS_Q8_K, 256, 292, 1, qs_rp_codes256_avx512_4, qs_rp_codes256_avx512_1, qs_rp_codes256_avx2_4, qs_rp_codes256_avx2_1, 4},
    {QS_TQ2_0, 256, 4416, QS_Q8_K, 256, 292, 1, qs_rp_codes256_avx512_4, qs_rp_codes256_avx512_1, qs_rp_codes256_avx2_4, qs_rp_codes256_avx2_1, 4},
};

static const rp_info *rp_find(int type) {
    for (size_t i = 0; i < sizeof RP_TABLE / sizeof RP_TABLE[0]; ++i)
        if (RP_TABLE[i].type == type) return &RP_TABLE[i];
    return NULL;
}

static const rp_info *rp_codes(int type) {
    for (size_t i = 0; i < sizeof RP_CODES / sizeof RP_CODES[0]; ++i)
        if (RP_CODES[i].type == type) return &RP_CODES[i];
    return NULL;
}

int qs_repack_type(int type) { return rp_find(type) ? (QS_RP_FLAG | type) : -1; }

int64_t qs_repack_bytes(int type, int64_t rows, int64_t k) {
    const rp_info *ri = rp_find(type & ~QS_RP_FLAG);
    if (!ri || rows <= 0 || k <= 0 || rows % QS_RP_ROWS || k % ri->blk) return -1;
    int64_t units, bytes;
    if (__builtin_mul_overflow(rows / QS_RP_ROWS, k / ri->blk, &units) ||
        __builtin_mul_overflow(units, (int64_t)ri->unit, &bytes))
        return -1;
    return bytes;
}

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

static void unit_q4_K(const uint8_t *const *rows, int64_t kb, uint8_t *u) { unit_k45(rows, kb, u, 0); }
static void unit_q5_K(const uint8_t *const *rows, int64_t kb, uint8_t *u) { unit_k45(rows, kb, u, 1); }

static void unit_q6_K(const uint8_t *const *rows, int64_t kb, uint8_t *u) {
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
static void unit_q2_K(const uint8_t *const *rows, int64_t kb, uint8_t *u) {
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
static void unit_q3_K(const uint8_t *const *rows, int64_t kb, uint8_t *u) {
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
static void unit_iq4_xs(const uint8_t *const *rows, int64_t kb, uint8_t *u) {
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

static void unit_q4_0(const uint8_t *const *rows, int64_t kb, uint8_t *u) { unit_b32(rows, kb, u, 0); }
static void unit_q4_1(const uint8_t *const *rows, int64_t kb, uint8_t *u) { unit_b32(rows, kb, u, 1); }
static void unit_q8_0(const uint8_t *const *rows, int64_t kb, uint8_t *u) { unit_b32(rows, kb, u, 2); }
static void unit_q5_0(const uint8_t *const *rows, int64_t kb, uint8_t *u) { unit_b32(rows, kb, u, 3); }
static void unit_q5_1(const uint8_t *const *rows, int64_t kb, uint8_t *u) { unit_b32(rows, kb, u, 4); }
static void unit_iq4_nl(const uint8_t *const *rows, int64_t kb, uint8_t *u) { unit_b32(rows, kb, u, 5); }
static void unit_mxfp4(const uint8_t *const *rows, int64_t kb, uint8_t *u) { unit_b32(rows, kb, u, 6); }

/* F32 / F16 / BF16: element e of the k-block holds the 16 rows' values side by side (es bytes each) */
static void unit_float(const uint8_t *const *rows, int64_t kb, uint8_t *u, const int es) {
    for (int r = 0; r < QS_RP_ROWS; ++r) {
        const uint8_t *b = rows[r] + kb * 16 * es;
        for (int e = 0; e < 16; ++e) memcpy(u + es * (16 * e + r), b + es * e, (size_t)es);
    }
}

static void unit_f32(const uint8_t *const *rows, int64_t kb, uint8_t *u) { unit_float(rows, kb, u, 4); }
static void unit_f16(const uint8_t *const *rows, int64_t kb, uint8_t *u) { unit_float(rows, kb, u, 2); }

typedef void (*unit_fn)(const uint8_t *const *rows, int64_t kb, uint8_t *u);

static unit_fn unit_for(int type) {
    switch (type) {
    case QS_Q4_K: return unit_q4_K;
    case QS_Q5_K: return unit_q5_K;
    case QS_Q6_K: return unit_q6_K;
    case QS_Q4_0: return unit_q4_0;
    case QS_Q4_1: return unit_q4_1;
    case QS_Q8_0: return unit_q8_0;
    case QS_Q5_0: return unit_q5_0;
    case QS_Q5_1: return unit_q5_1;
    case QS_IQ4_NL: return unit_iq4_nl;
    case QS_MXFP4: return unit_mxfp4;
    case QS_IQ4_XS: return unit_iq4_xs;
    case QS_Q2_K: return unit_q2_K;
    case QS_Q3_K: return unit_q3_K;
    case QS_F32: return unit_f32;
    case QS_F16:
    case QS_BF16: return unit_f16;
    default: return NULL;
    }
}

typedef struct {
    const rp_info *ri;
    const uint8_t *src;
    int64_t row_bytes, nkb, g0;
    uint8_t *dst;
} repack_ctx;

static void repack_task(void *vctx, int64_t t) {
    repack_ctx *c = (repack_ctx *)vctx;
    int64_t g = c->g0 + t;
    const uint8_t *rows[QS_RP_ROWS];
    for (int r = 0; r < QS_RP_ROWS; ++r) rows[r] = c->src + (g * QS_RP_ROWS + r) * c->row_bytes;
    uint8_t *u = c->dst + g * c->nkb * c->ri->unit;
    unit_fn fn = unit_for(c->ri->type);
    for (int64_t kb = 0; kb < c->nkb; ++kb, u += c->ri->unit) fn(rows, kb, u);
}

static int repack_unguarded(int type, const uint8_t *src, int64_t src_bytes, int64_t rows, int64_t k, uint8_t *dst,
                            int64_t dst_bytes, int64_t g0, int64_t g1, int n_threads) {
    const rp_info *ri = rp_find(type);
    int64_t need = qs_repack_bytes(type, rows, k);
    if (!ri || need < 0 || !src || !dst || dst_bytes < need) return QS_ERR_SIZE;
    int64_t row_bytes = k / qs_block_elems(type) * qs_block_bytes(type);
    if (src_bytes < 0 || rows > src_bytes / row_bytes) return QS_ERR_WEIGHT;
    if (g0 < 0 || g1 < g0 || g1 > rows / QS_RP_ROWS) return QS_ERR_SIZE;
    repack_ctx c = {ri, src, row_bytes, k / ri->blk, g0, dst};
    qs_parallel_for(g1 - g0, repack_task, &c, n_threads);
    return QS_OK;
}

int qs_repack(int type, const uint8_t *src, int64_t src_bytes, int64_t rows, int64_t k, uint8_t *dst,
              int64_t dst_bytes, int64_t g0, int64_t g1, int n_threads) {
    int rc;
    QS_GUARDED(rc, repack_unguarded(type, src, src_bytes, rows, k, dst, dst_bytes, g0, g1, n_threads));
    return rc;
}

/* ---------------------------------------------------------------- anonymous memory for repacked copies */
#define QS_HUGE (2 * 1024 * 1024)

void *qs_alloc_huge(int64_t bytes) {
    if (bytes <= 0 || bytes > INT64_MAX / 2 - QS_HUGE) return NULL;
    size_t n = ((size_t)bytes + 4095) & ~(size_t)4095;
    size_t total = n + QS_HUGE;
    uint8_t *p = (uint8_t *)mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    uint8_t *a = (uint8_t *)(((uintptr_t)p + QS_HUGE - 1) & ~(uintptr_t)(QS_HUGE - 1));
    if (a > p) munmap(p, (size_t)(a - p));
    size_t tail = (size_t)(p + total - (a + n));
    if (tail) munmap(a + n, tail);
#ifdef MADV_HUGEPAGE
    madvise(a, n, MADV_HUGEPAGE); /* a hint: without THP the copy still works on 4 KiB pages */
#endif
    return a;
}

void qs_free_huge(void *p, int64_t bytes) {
    if (p && bytes > 0) munmap(p, ((size_t)bytes + 4095) & ~(size_t)4095);
}

int qs_drop_pages(const uint8_t *p, int64_t n) {
    long pg = sysconf(_SC_PAGESIZE);
    if (!p || n <= 0 || pg <= 0) return -1;
    uintptr_t a = ((uintptr_t)p + (uintptr_t)pg - 1) & ~(uintptr_t)(pg - 1);
    uintptr_t b = ((uintptr_t)p + (uintptr_t)n) & ~(uintptr_t)(pg - 1);
    if (b <= a) return 0;
    return madvise((void *)a, b - a, MADV_DONTNEED) == 0 ? 0 : -1;
}

/* ---------------------------------------------------------------- scalar reference kernels (one column) */
#define RP_COL(x, c)                                                                                               \
    const uint8_t *xq = (x)->xq + (c) * (x)->xq_stride;                                                            \
    const int32_t *ia = (x)->ia + (c) * (x)->ia_stride;                                                            \
    const float *fa = (x)->fa + (c) * (x)->f_stride;                                                               \
    (void)ia;                                                                                                      \
    (void)fa

static int32_t nib_dot(const uint8_t *v, const int8_t *q) { /* one row's 4 bytes of a nibble chunk, 8 codes */
    int32_t p = 0;
    for (int j = 0; j < 4; ++j) p += (v[j] & 15) * q[j] + (v[j] >> 4) * q[4 + j];
    return p;
}

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

static void rp_q4_K_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    rp_k45_scalar(g, nb, x, c0, out, 0);
}
static void rp_q5_K_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    rp_k45_scalar(g, nb, x, c0, out, 1);
}

static void rp_q6_K_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
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
static void rp_q2_K_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
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
static void rp_q3_K_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
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
static void rp_iq4_xs_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
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

static void rp_q4_0_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    rp_b32_scalar(g, nb, x, c0, out, 0);
}
static void rp_q4_1_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    rp_b32_scalar(g, nb, x, c0, out, 1);
}
static void rp_q8_0_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    rp_b32_scalar(g, nb, x, c0, out, 2);
}
static void rp_q5_0_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    rp_b32_scalar(g, nb, x, c0, out, 3);
}
static void rp_q5_1_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    rp_b32_scalar(g, nb, x, c0, out, 4);
}
static void rp_iq4_nl_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    rp_b32_scalar(g, nb, x, c0, out, 5);
}
static void rp_mxfp4_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    rp_b32_scalar(g, nb, x, c0, out, 6);
}

/* Float layouts: per row, two accumulation chains (element e of a k-block feeds chain e % 2), fused multiply-adds
 * against the float32 activation, the chains added at the end; kind 0 F32, 1 F16, 2 BF16. */
static void rp_float_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out, const int kind) {
    const float *xs = (const float *)(x->xq + c0 * x->xq_stride);
    const int es = kind ? 2 : 4;
    float acc[2][16] = {{0}};
    for (int64_t kb = 0; kb < nb; ++kb, g += 16 * 16 * es)
        for (int e = 0; e < 16; ++e)
            for (int r = 0; r < 16; ++r) {
                const uint8_t *p = g + es * (16 * e + r);
                const float w = kind == 0 ? qs_load_f32(p) : kind == 1 ? h2f(p) : qs_bf16_to_fp32(qs_load_u16(p));
                acc[e & 1][r] = fmaf(w, xs[16 * kb + e], acc[e & 1][r]);
            }
    for (int r = 0; r < 16; ++r) out[r] = acc[0][r] + acc[1][r];
}

static void rp_f32_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    rp_float_scalar(g, nb, x, c0, out, 0);
}
static void rp_f16_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    rp_float_scalar(g, nb, x, c0, out, 1);
}
static void rp_bf16_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out) {
    rp_float_scalar(g, nb, x, c0, out, 2);
}

static qs_rp_kernel scalar_for(int type) {
    switch (type) {
    case QS_Q4_K: return rp_q4_K_scalar;
    case QS_Q5_K: return rp_q5_K_scalar;
    case QS_Q6_K: return rp_q6_K_scalar;
    case QS_Q4_0: return rp_q4_0_scalar;
    case QS_Q4_1: return rp_q4_1_scalar;
    case QS_Q8_0: return rp_q8_0_scalar;
    case QS_Q5_0: return rp_q5_0_scalar;
    case QS_Q5_1: return rp_q5_1_scalar;
    case QS_IQ4_NL: return rp_iq4_nl_scalar;
    case QS_MXFP4: return rp_mxfp4_scalar;
    case QS_IQ4_XS: return rp_iq4_xs_scalar;
    case QS_Q2_K: return rp_q2_K_scalar;
    case QS_Q3_K: return rp_q3_K_scalar;
    case QS_F32: return rp_f32_scalar;
    case QS_F16: return rp_f16_scalar;
    case QS_BF16: return rp_bf16_scalar;
    default: return NULL;
    }
}

/* ---------------------------------------------------------------- activations */
typedef struct {
    const rp_info *ri;
    const float *x;
    int64_t k, n_x;
    uint8_t *xq;
    int64_t xq_stride;
    int32_t *ia;
    int64_t ia_stride;
    float *fa, *fb;
    int64_t f_stride;
} prep_ctx;

/* Column j: ggml's quantized blocks, then per block its scale (fa), Q8_1's s (fb) and the integer offsets (ia):
 * Q4_K, Q5_K: per 256, four int16 pairs (sums of sub-blocks 2p, 2p+1); Q6_K: per 256, 32 x the 16 sums of 16;
 * Q2_K: per 256, the 16 sums of 16; Q3_K: 4 x them; IQ4_XS: per 256, 128 x the 8 sums of 32; Q4_0 / Q5_0 / Q8_0, IQ4_NL: per 32, 8 / 16 / 128 x the block's sum. */
static void prep_task(void *vctx, int64_t j) {
    prep_ctx *p = (prep_ctx *)vctx;
    const rp_info *ri = p->ri;
    uint8_t *xq = p->xq + j * p->xq_stride;
    int32_t *ia = p->ia + j * p->ia_stride;
    float *fa = p->fa + j * p->f_stride, *fb = p->fb + j * p->f_stride;
    qs_quantize_activation(ri->act, p->x + j * p->k, xq, p->k);
    int64_t nab = p->k / ri->act_elems;
    for (int64_t b = 0; b < nab; ++b) {
        const uint8_t *blk = xq + b * ri->act_bytes;
        if (ri->act == QS_Q8_K) {
            int16_t bs[16];
            memcpy(bs, blk + 260, 32);
            fa[b] = qs_load_f32(blk);
            if (ri->type == QS_Q4_K || ri->type == QS_Q5_K) {
                for (int q = 0; q < 4; ++q) {
                    int32_t s0 = bs[4 * q] + bs[4 * q + 1], s1 = bs[4 * q + 2] + bs[4 * q + 3];
                    ia[4 * b + q] = (int32_t)(((uint32_t)(uint16_t)(int16_t)s0) | ((uint32_t)(uint16_t)(int16_t)s1 << 16));
                }
            } else if (ri == rp_codes(ri->type)) { /* the code types' prompt layout: 64 x each scale group's sum */
                const int ng = ri->ia_per, per = 16 / ng;
                for (int g = 0; g < ng; ++g) {
                    int32_t t = 0;
                    for (int e = 0; e < per; ++e) t += bs[per * g + e];
                    ia[ng * b + g] = 64 * t;
                }
            } else if (ri->type == QS_Q2_K) {
                for (int s = 0; s < 16; ++s) ia[16 * b + s] = bs[s];
            } else if (ri->type == QS_Q3_K) {
                for (int s = 0; s < 16; ++s) ia[16 * b + s] = 4 * bs[s];
            } else if (ri->type == QS_IQ4_XS) {
                for (int s = 0; s < 8; ++s) ia[8 * b + s] = 128 * (bs[2 * s] + bs[2 * s + 1]);
            } else {
                for (int s = 0; s < 16; ++s) ia[16 * b + s] = 32 * bs[s];
            }
        } else {
            fa[b] = h2f(blk);
            if (ri->act == QS_Q8_1) {
                fb[b] = h2f(blk + 2);
            } else {
                int32_t s = 0;
                for (int e = 0; e < 32; ++e) s += (int8_t)blk[2 + e];
                ia[b] = (ri->type == QS_Q4_0 ? 8 : ri->type == QS_Q5_0 ? 16 : 128) * s; /* Q8_0, IQ4_NL, MXFP4: 128 */
            }
        }
    }
}

/* ---------------------------------------------------------------- driver */
/* Activations prepared for one layout: the buffer behind a qs_rp_x. */
typedef struct {
    const rp_info *ri;
    uint8_t *buf;
    qs_rp_x x;
    int64_t per_col; /* bytes of one column's prepared activations */
} rp_act;

static int act_prepare(rp_act *a, const rp_info *ri, const float *x, int64_t k, int64_t n_x, int n_threads) {
    prep_ctx p;
    a->ri = ri;
    if (ri->act == QS_F32) { /* float layouts read the activations where they are */
        a->buf = NULL;
        a->per_col = k * 4;
        a->x = (qs_rp_x){(const uint8_t *)x, k * 4, NULL, 0, NULL, NULL, 0};
        return QS_OK;
    }
    const int64_t nab = k / ri->act_elems;
    p.ri = ri;
    p.x = x;
    p.k = k;
    p.n_x = n_x;
    p.xq_stride = (nab * ri->act_bytes + 63) / 64 * 64;
    p.ia_stride = (nab * (ri->ia_per ? ri->ia_per : 1) + 15) / 16 * 16;
    p.f_stride = (nab + 15) / 16 * 16;
    a->per_col = p.xq_stride + p.ia_stride * 4 + p.f_stride * 8;
    size_t bytes = (size_t)n_x * (size_t)a->per_col;
    a->buf = (uint8_t *)aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!a->buf) return QS_ERR_NOMEM;
    p.xq = a->buf;
    p.ia = (int32_t *)(a->buf + n_x * p.xq_stride);
    p.fa = (float *)(p.ia + n_x * p.ia_stride);
    p.fb = p.fa + n_x * p.f_stride;
    qs_parallel_for(n_x, prep_task, &p, n_x * k < (1 << 16) ? 1 : n_threads);
    a->ri = ri;
    a->x = (qs_rp_x){p.xq, p.xq_stride, p.ia, p.ia_stride, p.fa, p.fb, p.f_stride};
    return QS_OK;
}

/* One product of a job: its weights, prepared activations and output. */
typedef struct {
    const rp_info *ri;
    qs_rp_kernel scalar;
    const uint8_t *w;
    int64_t n_groups, nkb, n_rows, col_block;
    const qs_rp_x *x;
    float *y;
} mm_mat;

/* Products of the same input (q/k/v, gate/up) in one pool job: their row groups form one sequence that the
 * threads take in contiguous chunks, so a layer waits at one barrier instead of three and the threads finish
 * together. Decode chunks shrink as the work runs out (guided: remaining / (2 x threads), at least ~32 KiB of
 * weights), which keeps each thread's stream long at first and the wait at the end short. The prefill GEMM
 * takes one long run per thread (its activations are reused across a run's groups). */
#define RP_MAX_MATS 32 /* a decode step's selected experts' gate and up matrices go in one job */
typedef struct {
    int n, simd, n_threads; /* simd: 2 AVX-512 kernels, 1 AVX2, 0 the scalar references */
    int64_t n_x, total, min_chunk, fixed_chunk;
    int64_t g_end[RP_MAX_MATS]; /* cumulative group counts */
    mm_mat m[RP_MAX_MATS];
    atomic_llong next;
} mm_job;

static void mm_run(const mm_mat *c, int simd, int64_t n_x, int64_t g0, int64_t g1) {
    const int64_t gbytes = c->nkb * c->ri->unit;
    const int wide = c->ri->cols;
    float out[8 * 16] __attribute__((aligned(64)));
    for (int64_t cb = 0; cb < n_x; cb += c->col_block) {
        int64_t ce = cb + c->col_block < n_x ? cb + c->col_block : n_x;
        for (int64_t g = g0; g < g1; ++g) {
            const uint8_t *gp = c->w + g * gbytes;
            for (int64_t j = cb; j < ce;) {
                int nc;
                if (simd && ce - j >= wide) {
                    (simd == 2 ? c->ri->k4 : c->ri->a4)(gp, c->nkb, c->x, j, out);
                    nc = wide;
                } else {
                    (simd == 2 ? c->ri->k1 : simd == 1 ? c->ri->a1 : c->scalar)(gp, c->nkb, c->x, j, out);
                    nc = 1;
                }
                for (int q = 0; q < nc; ++q) memcpy(c->y + (j + q) * c->n_rows + g * 16, out + 16 * q, 16 * sizeof(float));
                j += nc;
            }
        }
    }
}

static void mm_task(void *vctx, int64_t t) {
    (void)t;
    mm_job *job = (mm_job *)vctx;
    for (;;) {
        long long cur = atomic_load_explicit(&job->next, memory_order_relaxed), size;
        do {
            if (cur >= job->total) return;
            const int64_t rem = job->total - cur;
            size = job->fixed_chunk ? job->fixed_chunk : rem / (2 * job->n_threads);
            if (size < job->min_chunk) size = job->min_chunk;
            if (size > rem) size = rem;
        } while (!atomic_compare_exchange_weak_explicit(&job->next, &cur, cur + size, memory_order_relaxed,
                                                        memory_order_relaxed));
        const int64_t a = cur, b = cur + size;
        int64_t base = 0;
        for (int i = 0; i < job->n; base = job->g_end[i], ++i) {
            const int64_t lo = a > base ? a : base, hi = b < job->g_end[i] ? b : job->g_end[i];
            if (lo < hi) mm_run(&job->m[i], job->simd, job->n_x, lo - base, hi - base);
        }
    }
}

static int matmat_multi(int n, const int *rtype, const uint8_t *const *w, const int64_t *n_rows, int64_t k,
                        const float *x, const float *const *xs, int64_t n_x, float *const *y, int n_threads) {
    if (!rtype || !w || !n_rows || !y || n < 1 || n > RP_MAX_MATS || n_x < 0 || (!x && !xs)) return QS_ERR_SIZE;
    for (int i = 0; xs && i < n; ++i)
        if (!xs[i]) return QS_ERR_SIZE;
    const rp_info *ri[RP_MAX_MATS];
    for (int i = 0; i < n; ++i) {
        ri[i] = (rtype[i] & QS_RP_FLAG) ? rp_find(rtype[i] & ~QS_RP_FLAG) : NULL;
        if (!ri[i] || !w[i] || !y[i] || qs_repack_bytes(ri[i]->type, n_rows[i], k) < 0) return QS_ERR_SIZE;
    }
    if (n_x == 0) return QS_OK;
    if (n_threads <= 0) n_threads = qs_threads_default();
    rp_act acts[RP_MAX_MATS];
    const float *act_x[RP_MAX_MATS];
    int n_acts = 0, rc = QS_OK;
    mm_job job;
    memset(&job, 0, sizeof job);
    job.n = n;
    job.simd = qs_isa_get() >= QS_ISA_AVX512 ? 2 : qs_isa_get() >= QS_ISA_AVX2 ? 1 : 0;
    job.n_x = n_x;
    int64_t work = 0, bytes = 0;
    for (int i = 0; i < n && !rc; ++i) {
        const float *xi = xs ? xs[i] : x;
        int a = 0;
        while (a < n_acts && !(acts[a].ri == ri[i] && act_x[a] == xi)) ++a; /* one preparation per layout and input */
        if (a == n_acts) {
            rc = act_prepare(&acts[a], ri[i], xi, k, n_x, n_threads);
            if (rc) break;
            act_x[a] = xi;
            ++n_acts;
        }
        mm_mat *m = &job.m[i];
        m->ri = ri[i];
        m->scalar = scalar_for(ri[i]->type);
        m->w = w[i];
        m->n_groups = n_rows[i] / QS_RP_ROWS;
        m->nkb = k / ri[i]->blk;
        m->n_rows = n_rows[i];
        m->x = &acts[a].x;
        m->y = y[i];
        /* columns per pass over a run of groups: their activations stay in L2 (~256 KiB) while weights stream */
        m->col_block = (256 * 1024 / acts[a].per_col) / 8 * 8;
        if (m->col_block < 8) m->col_block = 8;
        job.total += m->n_groups;
        job.g_end[i] = job.total;
        work += n_rows[i] * k * n_x;
        bytes += qs_repack_bytes(ri[i]->type, n_rows[i], k);
    }
    if (!rc) {
        if (work < (1 << 16)) n_threads = 1;
        job.n_threads = n_threads;
        job.min_chunk = (32 * 1024 * job.total + bytes - 1) / (bytes > 0 ? bytes : 1);
        if (job.min_chunk < 1) job.min_chunk = 1;
        if (n_x > 1) job.fixed_chunk = (job.total + n_threads - 1) / n_threads;
        atomic_init(&job.next, 0);
        qs_parallel_for(n_threads, mm_task, &job, n_threads);
    }
    for (int a = 0; a < n_acts; ++a) free(acts[a].buf);
    return rc;
}

int qs_rp_matmat_multi(int n, const int *rtype, const uint8_t *const *w, const int64_t *n_rows, int64_t k,
                       const float *x, int64_t n_x, float *const *y, int n_threads) {
    int rc;
    QS_GUARDED(rc, matmat_multi(n, rtype, w, n_rows, k, x, NULL, n_x, y, n_threads));
    return rc;
}

int qs_rp_matmat_multi_x(int n, const int *rtype, const uint8_t *const *w, const int64_t *n_rows, int64_t k,
                         const float *const *x, int64_t n_x, float *const *y, int n_threads) {
    int rc;
    QS_GUARDED(rc, matmat_multi(n, rtype, w, n_rows, k, NULL, x, n_x, y, n_threads));
    return rc;
}

int qs_rp_matmat(int rtype, const uint8_t *w, int64_t n_rows, int64_t k, const float *x, int64_t n_x, float *y,
                 int n_threads) {
    return matmat_multi(1, &rtype, &w, &n_rows, k, x, NULL, n_x, &y, n_threads);
}

/* ---------------------------------------------------------------- prompts of the code types */
/* The i-quants, IQ1 and TQ against many columns: each 16-row group decoded once (qs_iq_codes, AVX2 where the CPU
 * has it) into the RP_CODES layout in a buffer of the task's own, then the repacked 4-column kernels over every
 * column. Per row the integer sums and the one float multiply-add per block are the one-column dot's
 * (qs_iq_dot_codes_scalar), so a prompt gives the same bits as token-by-token decoding. */
typedef struct {
    const rp_info *ri;
    int type, simd;
    const uint8_t *w;
    int64_t row_bytes, nkb, n_rows, n_x;
    const qs_rp_x *x;
    float *y;
    atomic_int failed;
} cp_ctx;

static void codes_unit(qs_codes_fn codes, const uint8_t *b, int r, uint8_t *u) {
    int8_t code[256];
    float mult[16];
    int16_t ls[16];
    const int gs = codes(b, code, mult, ls);
    memcpy(u + 4 * r, &mult[0], 4);
    for (int g = 0; g < 256 / gs; ++g) u[64 + 16 * g + r] = (uint8_t)(int8_t)ls[g];
    for (int c = 0; c < 64; ++c)
        for (int j = 0; j < 4; ++j) u[320 + 64 * c + 4 * r + j] = (uint8_t)(code[4 * c + j] + 64);
}

static void cp_task(void *vctx, int64_t g) {
    cp_ctx *c = (cp_ctx *)vctx;
    const int64_t unit = c->ri->unit;
    uint8_t *buf = (uint8_t *)aligned_alloc(64, (size_t)(c->nkb * unit));
    if (!buf) {
        atomic_store(&c->failed, 1);
        return;
    }
    memset(buf, 0, (size_t)(c->nkb * unit));
    const int bytes = qs_block_bytes(c->type);
    for (int r = 0; r < QS_RP_ROWS; ++r) {
        const uint8_t *row = c->w + (g * QS_RP_ROWS + r) * c->row_bytes;
        for (int64_t kb = 0; kb < c->nkb; ++kb) codes_unit(qs_traits(c->type)->codes, row + kb * bytes, r, buf + kb * unit);
    }
    float out[4 * 16] __attribute__((aligned(64)));
    for (int64_t j = 0; j < c->n_x;) {
        int nc = 1;
        if (c->n_x - j >= 4) {
            (c->simd == 2 ? c->ri->k4 : c->ri->a4)(buf, c->nkb, c->x, j, out);
            nc = 4;
        } else {
            (c->simd == 2 ? c->ri->k1 : c->ri->a1)(buf, c->nkb, c->x, j, out);
        }
        for (int q = 0; q < nc; ++q) memcpy(c->y + (j + q) * c->n_rows + g * 16, out + 16 * q, 16 * sizeof(float));
        j += nc;
    }
    free(buf);
}

int qs_iq_prefill_usable(int type, int64_t n_rows, int64_t k) {
    return rp_codes(type) && qs_isa_get() >= QS_ISA_AVX2 && n_rows > 0 && n_rows % QS_RP_ROWS == 0 && k > 0 &&
           k % 256 == 0 && k <= (1 << 22);
}

static int iq_prefill_unguarded(int type, const uint8_t *w, int64_t n_rows, int64_t k, const float *x, int64_t n_x,
                                float *y, int n_threads) {
    if (!qs_iq_prefill_usable(type, n_rows, k) || !w || !x || !y || n_x < 1 || n_x > (1 << 20)) return QS_ERR_SIZE;
    cp_ctx c;
    memset(&c, 0, sizeof c);
    c.ri = rp_codes(type);
    c.type = type;
    c.simd = qs_isa_get() >= QS_ISA_AVX512 ? 2 : 1;
    c.w = w;
    c.row_bytes = k / 256 * qs_block_bytes(type);
    c.nkb = k / 256;
    c.n_rows = n_rows;
    c.n_x = n_x;
    c.y = y;
    atomic_init(&c.failed, 0);
    if (n_threads <= 0) n_threads = qs_threads_default();
    rp_act a;
    int rc = act_prepare(&a, c.ri, x, k, n_x, n_threads);
    if (rc) return rc;
    c.x = &a.x;
    qs_parallel_for(n_rows / QS_RP_ROWS, cp_task, &c, n_threads);
    free(a.buf);
    return atomic_load(&c.failed) ? QS_ERR_NOMEM : QS_OK;
}

int qs_iq_prefill(int type, const uint8_t *w, int64_t n_rows, int64_t k, const float *x, int64_t n_x, float *y,
                  int n_threads) {
    int rc;
    QS_GUARDED(rc, iq_prefill_unguarded(type, w, n_rows, k, x, n_x, y, n_threads));
    return rc;
}
