/* Load-time repacked weights ("R16" layouts, docs/engine.md#repacked-weights): internal declarations.
 *
 * A repacked weight interleaves 16 consecutive rows so that one 512-bit register holds 4 code bytes of each of
 * the 16 rows: one vpdpbusd against 4 broadcast activation codes advances all 16 dot products, the integer sums
 * stay in their row's lane through a whole block, and no horizontal sum is ever needed. The bytes of one row
 * group are contiguous in k order, so a thread streams one sequential run of memory per group.
 *
 * Layout of one (16-row group, k-block) unit, offsets in bytes, all chunk offsets 64-byte aligned:
 *   nibble chunk (64 B, 8 elements e0..e7 of each row): byte 4r+j = code(e_j) | code(e_{4+j}) << 4
 *   byte chunk   (64 B, 4 elements e0..e3 of each row): byte 4r+j = code(e_j)
 *   Q4_K  k-block 256, 2368 B: d[16] f16 @0, dmin[16] f16 @32, scale[8][16] u8 @64,
 *         min pairs [4][16][2] u8 @192 (sub-blocks 2p, 2p+1 of row r at 32p+2r), 32 nibble chunks @320
 *   Q5_K  k-block 256, 2880 B: Q4_K's first 320 B, then per sub-block s of 32 elements, in reading order: its
 *         4 nibble chunks (low 4 bits), then its fifth-bit chunk (byte 4r+j: bit v = fifth bit of element
 *         32s+4v+j); see K45_NIB / K5_BITS
 *   Q6_K  k-block 256, 3392 B: d[16] f16 @0, scale[16][16] s8 @64, then per sub-block s of 16 elements, in the
 *         order the kernels read them (one forward stream): nibble chunks 2s and 2s+1 (low 4 bits), then the
 *         high-bit chunk s (byte 4r+j: bits 2i..2i+1 = high bits of element 16s+4i+j); see Q6_LO / Q6_HI
 *   Q4_0  k-block 64 (two ggml blocks), 576 B: d[2][16] f16 @0, 8 nibble chunks @64
 *   Q4_1  k-block 64, 640 B: d[2][16] f16 @0, m[2][16] f16 @64, 8 nibble chunks @128
 *   Q8_0  k-block 64, 1088 B: d[2][16] f16 @0, 16 byte chunks of code = q + 128 @64
 *   Q5_0  k-block 64, 704 B: d[2][16] f16 @0, 8 nibble chunks (low 4 bits) @64, 2 high-bit planes @576
 *         (plane h, byte 4r+j: bit i = fifth bit of element j+4i of ggml block h)
 *   Q5_1  k-block 64, 768 B: d[2][16] f16 @0, m[2][16] f16 @64, 8 nibble chunks @128, 2 high-bit planes @640
 *   Q2_K  k-block 256, 1344 B (as the file's 16 blocks): d[16] f16 @0, dmin[16] f16 @32, scale|min << 4 [16][16] u8
 *         @64 (sub-block s of 16 elements, row r at 64 + 16 s + r), then a crumb chunk per sub-block @320 + 64 s
 *         (byte 4r+j: bits 2i..2i+1 = code of element 16s + 4i + j); see Q2_CR
 *   Q3_K  k-block 256, 1856 B: d[16] f16 @0, scale[16][16] s8 (the 6-bit scale - 32) @64, then per pair p of
 *         sub-blocks: the crumb chunks (low 2 bits) of sub-blocks 2p and 2p+1, then their high-bit chunk (byte
 *         4r+j: bit i = third bit of element 4i+j of sub-block 2p, bit 4+i of sub-block 2p+1); see Q3_CR / Q3_HI
 *   IQ4_NL as Q4_0; a nibble is an index into the code book (the kernels look it up with one byte shuffle)
 *   MXFP4  as Q4_0 with the E8M0 exponent byte in place of d (its high byte 0) and MXFP4's doubled E2M1 values as
 *         the code book (d = 2^(e - 128), ggml's halved scale)
 *   IQ4_XS k-block 256, 2240 B: d[16] f16 @0, scale[8][16] s8 (the 6-bit scale - 32) @64, 32 nibble chunks @192
 *         (chunk c: elements 8c..8c+7, code-book indices as IQ4_NL's)
 *   F32   k-block 16, 1024 B: element e of the block as 16 rows' float32 side by side @64e
 *   F16   k-block 16, 512 B: the same with 2-byte values @32e (converted to float32 in the kernels)
 *   BF16  k-block 16, 512 B: pair p (elements 2p, 2p+1) of the 16 rows side by side, 4 bytes a row, @64p: one
 *         vdpbf16ps operand; the activations are BF16 too (ggml's vec_dot_type), pairs read as 32-bit words
 * Codes are unsigned (Q2_K 0..3 with its mins against the activation sums; Q3_K 0..7 with offset 4; Q6_K 0..63 with the offset 32 folded into the activation sums; Q4_0 offset 8; Q5_0 16;
 * Q8_0, IQ4_NL and MXFP4 128).
 */
#ifndef QS_REPACK_H
#define QS_REPACK_H
#include <stdint.h>

#include "qs.h"

#define QS_RP_ROWS 16
#define K45_NIB(five, c) ((five) ? 320 + 320 * ((c) / 4) + 64 * ((c) % 4) : 320 + 64 * (c)) /* Q4_K/Q5_K chunk c */
#define K5_BITS(s) (320 + 320 * (s) + 256) /* Q5_K: fifth-bit chunk of sub-block s */
#define Q6_LO(c) (320 + 192 * ((c) / 2) + 64 * ((c) % 2)) /* Q6_K: nibble chunk c (elements 8c..8c+7) */
#define Q6_HI(s) (320 + 192 * (s) + 128)                  /* Q6_K: high-bit chunk of sub-block s */
#define Q2_CR(s) (320 + 64 * (s))                         /* Q2_K: crumb chunk of sub-block s */
#define Q3_CR(s) (320 + 192 * ((s) / 2) + 64 * ((s) % 2))  /* Q3_K: crumb chunk of sub-block s */
#define Q3_HI(p) (320 + 192 * (p) + 128)                  /* Q3_K: high-bit chunk of sub-blocks 2p, 2p+1 */

/* Activations prepared for the repacked kernels: ggml's quantized blocks plus per-block sums. */
typedef struct {
    const uint8_t *xq;  /* column j's blocks at xq + j * xq_stride */
    int64_t xq_stride;
    const int32_t *ia;  /* per column: integer offsets (see qs_repack.c, rp_prep) */
    int64_t ia_stride;
    const float *fa;    /* per column, per ggml block: the activation scale d */
    const float *fb;    /* per column, per ggml block: Q8_1's s (Q4_1 only) */
    int64_t f_stride;
} qs_rp_x;

/* Kernel over one row group: nb k-blocks, columns c0 .. c0+nc-1, out[j*16 + r]; the wide kernels take 4
 * columns (quantized layouts) or 8 (float layouts). */
typedef void (*qs_rp_kernel)(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);

/* Writes one (16-row group, k-block kb) unit from the 16 source rows (load time). */
typedef void (*qs_rp_unit_fn)(const uint8_t *const *rows, int64_t kb, uint8_t *u);

/* How the prepared activations' integer offsets (qs_rp_x.ia) are formed from ggml's activation blocks */
enum {
    QS_RP_IA_NONE = 0,  /* Q8_1 (its s is used) and the float layouts */
    QS_RP_IA_BLOCK,     /* Q8_0 per 32: ia_mul x the block's sum (Q4_0 8, Q5_0 16, Q8_0 / IQ4_NL / MXFP4 128) */
    QS_RP_IA_K45,       /* Q4_K, Q5_K per 256: four int16 pairs (sums of sub-blocks 2p, 2p+1) */
    QS_RP_IA_SUM16,     /* per 256: ia_mul x the 16 sums of 16 (Q6_K 32, Q2_K 1, Q3_K 4) */
    QS_RP_IA_SUM32,     /* IQ4_XS per 256: ia_mul x the 8 sums of 32 */
    QS_RP_IA_CODES      /* the code types' prompt layout: 64 x each scale group's sum */
};

/* A repacked layout: a row of the type table (qs_traits.h) */
typedef struct {
    int blk;                     /* elements of one k-block of the layout; 0: no layout */
    int unit;                    /* bytes of one (16-row group, k-block) unit */
    int act;                     /* activation format (ggml's vec_dot_type for the weight type) */
    int act_elems, act_bytes;    /* one activation block */
    int ia_per;                  /* int32 offsets per activation block */
    int ia, ia_mul;              /* QS_RP_IA_* and its multiplier */
    int cols;                    /* columns of the wide kernels */
    qs_rp_unit_fn write;         /* load-time writer (NULL for the prompt layout: decoded per product) */
    qs_rp_kernel wide[QS_TIERS]; /* per ISA slot: `cols` columns per call ([0] unused: no wide reference) */
    qs_rp_kernel one[QS_TIERS];  /* per ISA slot: 1 column; [0] the reference kernel (NULL: the prompt layout) */
} qs_rp_layout;

/* AVX-512 VNNI kernels (qs_repack_avx512.c): 4 columns and 1 column per call. */
void qs_rp_q4_K_avx512_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q4_K_avx512_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q5_K_avx512_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q5_K_avx512_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q6_K_avx512_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q6_K_avx512_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q4_0_avx512_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q4_0_avx512_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q4_1_avx512_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q4_1_avx512_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q8_0_avx512_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q5_0_avx512_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q5_0_avx512_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q5_1_avx512_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q5_1_avx512_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q8_0_avx512_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_iq4_nl_avx512_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_iq4_nl_avx512_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_mxfp4_avx512_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_mxfp4_avx512_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q2_K_avx512_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q2_K_avx512_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q3_K_avx512_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q3_K_avx512_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_iq4_xs_avx512_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_iq4_xs_avx512_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);

void qs_rp_f32_avx512_8(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_f32_avx512_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_f16_avx512_8(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_f16_avx512_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_bf16_avx512_8(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_bf16_avx512_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);

void qs_rp_codes16_avx512_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_codes16_avx512_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_codes32_avx512_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_codes32_avx512_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_codes256_avx512_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_codes256_avx512_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);

/* AVX2 kernels (qs_repack_avx2.c): the same, half a row group per pass. */
void qs_rp_q4_K_avx2_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q4_K_avx2_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q5_K_avx2_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q5_K_avx2_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q6_K_avx2_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q6_K_avx2_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q4_0_avx2_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q4_0_avx2_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q4_1_avx2_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q4_1_avx2_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q8_0_avx2_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q8_0_avx2_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q5_0_avx2_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q5_0_avx2_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q5_1_avx2_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q5_1_avx2_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_iq4_nl_avx2_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_iq4_nl_avx2_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_mxfp4_avx2_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_mxfp4_avx2_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q2_K_avx2_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q2_K_avx2_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q3_K_avx2_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q3_K_avx2_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_iq4_xs_avx2_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_iq4_xs_avx2_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_f32_avx2_8(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_f32_avx2_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_f16_avx2_8(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_f16_avx2_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_bf16_avx2_8(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_bf16_avx2_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);

void qs_rp_codes16_avx2_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_codes16_avx2_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_codes32_avx2_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_codes32_avx2_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_codes256_avx2_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_codes256_avx2_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);

/* Whether the AVX-512 slot's BF16 kernels use vdpbf16ps (qs_dispatch.c: the CPU has AVX512_BF16 and
 * qs_bf16_dot_set has not switched it off): one load, as qs_isa_tier */
extern int qs_bf16_dot_now;
int qs_bf16_dot_set(int on);
static inline int qs_bf16_dot(void) { return qs_bf16_dot_now >= 0 ? qs_bf16_dot_now : qs_bf16_dot_set(-1); }

/* float32 -> BF16 activations for the BF16 layout, qs_fp32_to_bf16's bits (the scalar one: qs_quantize_bf16) */
void qs_rp_bf16_act_scalar(const float *x, uint8_t *dst, int64_t n);
void qs_rp_bf16_act_avx2(const float *x, uint8_t *dst, int64_t n);
void qs_rp_bf16_act_avx512(const float *x, uint8_t *dst, int64_t n);

/* Load-time unit writers and scalar reference kernels, 1 column (qs_repack_rows.c) */
void qs_rp_unit_q4_K(const uint8_t *const *rows, int64_t kb, uint8_t *u);
void qs_rp_unit_q5_K(const uint8_t *const *rows, int64_t kb, uint8_t *u);
void qs_rp_unit_q6_K(const uint8_t *const *rows, int64_t kb, uint8_t *u);
void qs_rp_unit_q2_K(const uint8_t *const *rows, int64_t kb, uint8_t *u);
void qs_rp_unit_q3_K(const uint8_t *const *rows, int64_t kb, uint8_t *u);
void qs_rp_unit_iq4_xs(const uint8_t *const *rows, int64_t kb, uint8_t *u);
void qs_rp_unit_q4_0(const uint8_t *const *rows, int64_t kb, uint8_t *u);
void qs_rp_unit_q4_1(const uint8_t *const *rows, int64_t kb, uint8_t *u);
void qs_rp_unit_q8_0(const uint8_t *const *rows, int64_t kb, uint8_t *u);
void qs_rp_unit_q5_0(const uint8_t *const *rows, int64_t kb, uint8_t *u);
void qs_rp_unit_q5_1(const uint8_t *const *rows, int64_t kb, uint8_t *u);
void qs_rp_unit_iq4_nl(const uint8_t *const *rows, int64_t kb, uint8_t *u);
void qs_rp_unit_mxfp4(const uint8_t *const *rows, int64_t kb, uint8_t *u);
void qs_rp_unit_f32(const uint8_t *const *rows, int64_t kb, uint8_t *u);
void qs_rp_unit_f16(const uint8_t *const *rows, int64_t kb, uint8_t *u);
void qs_rp_unit_bf16(const uint8_t *const *rows, int64_t kb, uint8_t *u);
void qs_rp_q4_K_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q5_K_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q6_K_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q2_K_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q3_K_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_iq4_xs_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q4_0_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q4_1_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q8_0_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q5_0_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q5_1_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_iq4_nl_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_mxfp4_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_f32_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_f16_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_bf16_scalar(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);

/* repacked matmul driver (qs_repack.c), called by qs_matmat for repacked type ids */
int qs_rp_matmat(int rtype, const uint8_t *w, int64_t n_rows, int64_t k, const float *x, int64_t n_x, float *y,
                 int n_threads);

#endif
