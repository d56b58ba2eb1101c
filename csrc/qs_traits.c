/* The type table (qs_traits.h): one row per ggml type, naming its block geometry, its activation format and the
 * codec of every job for every ISA tier. The drivers look rows up here and never switch on a type id. */
#include <stdint.h>

#include "qs_traits.h"

#include "qs_iquants_neon.h"
#include "qs_kquant_neon.h"
#include "qs_nn_neon.h"
#include "qs_quant_neon.h"
#include "qs_repack_kneon.h"
#include "qs_repack_neon.h"

/* repacked layouts (qs_repack.h): k-block, unit bytes, activation format and its block, int32 offsets per block
 * and how they are formed (QS_RP_IA_*, multiplier); writer, scalar reference, per-ISA kernels of `cols` columns
 * and of 1. The last argument is the ARM64 set (RP_A0: no kernels there, so no layout: the engine would keep the
 * file's rows; RP_A1 NEON; RP_A2 NEON + dotprod); x86 has AVX2 and AVX-512 kernels for every layout. */
#if QS_ARCH_X86
#define RP_KERNELS(name, w, a)                                                                                     \
    .wide = {NULL, qs_rp_##name##_avx2_##w, qs_rp_##name##_avx512_##w},                                           \
    .one = {qs_rp_##name##_scalar, qs_rp_##name##_avx2_1, qs_rp_##name##_avx512_1}
#define RP_CODE_KERNELS(kern, a)                                                                                   \
    .wide = {NULL, qs_rp_##kern##_avx2_4, qs_rp_##kern##_avx512_4},                                               \
    .one = {NULL, qs_rp_##kern##_avx2_1, qs_rp_##kern##_avx512_1}
#define RP_ON(a) 1
#elif QS_ARCH_ARM64
#define RP_KERNELS(name, w, a) RP_KERNELS_##a(name, w, qs_rp_##name##_scalar)
#define RP_CODE_KERNELS(kern, a) RP_KERNELS_##a(kern, 4, NULL)
#define RP_KERNELS_RP_A0(name, w, ref) .wide = {NULL}, .one = {ref}
#define RP_KERNELS_RP_A1(name, w, ref) .wide = {NULL, qs_rp_##name##_neon_##w}, .one = {ref, qs_rp_##name##_neon_1}
#define RP_KERNELS_RP_A2(name, w, ref)                                                                             \
    .wide = {NULL, qs_rp_##name##_neon_##w, QS_DOTPROD(qs_rp_##name##_dotprod_##w)},                              \
    .one = {ref, qs_rp_##name##_neon_1, QS_DOTPROD(qs_rp_##name##_dotprod_1)}
#define RP_ON(a) RP_ON_##a
#define RP_ON_RP_A0 0
#define RP_ON_RP_A1 1
#define RP_ON_RP_A2 1
#else
#define RP_KERNELS(name, w, a) .wide = {NULL}, .one = {qs_rp_##name##_scalar}
#define RP_CODE_KERNELS(kern, a) .wide = {NULL}, .one = {NULL}
#define RP_ON(a) 0
#endif
#define RP(name, blk_, unit_, act_, ae, ab, per, ia_, mul, a)                                                      \
    {.blk = RP_ON(a) ? blk_ : 0, .unit = unit_, .act = act_, .act_elems = ae, .act_bytes = ab, .ia_per = per,     \
     .ia = ia_, .ia_mul = mul, .cols = 4, .write = qs_rp_unit_##name, RP_KERNELS(name, 4, a)}
/* float layouts: the activations stay float32, read in place; 8 columns per wide kernel */
#define RP_FLOAT(name, unit_, writer, a)                                                                           \
    {.blk = RP_ON(a) ? 16 : 0, .unit = unit_, .act = QS_F32, .act_elems = 16, .act_bytes = 64, .cols = 8,         \
     .write = qs_rp_unit_##writer, RP_KERNELS(name, 8, a)}
/* BF16: pairs of rows' values against BF16 activation pairs (vdpbf16ps); 8 columns per wide kernel */
#define RP_BF16(a)                                                                                                 \
    {.blk = RP_ON(a) ? 16 : 0, .unit = 512, .act = QS_BF16, .act_elems = 16, .act_bytes = 32, .cols = 8,          \
     .write = qs_rp_unit_bf16, RP_KERNELS(bf16, 8, a)}
/* the code types' prompt layout: decoded per product (no writer), SIMD only */
#define RP_CODES(kern, per, a)                                                                                     \
    {.blk = RP_ON(a) ? 256 : 0, .unit = 4416, .act = QS_Q8_K, .act_elems = 256, .act_bytes = 292, .ia_per = per,  \
     .ia = QS_RP_IA_CODES, .cols = 4, RP_CODE_KERNELS(kern, a)}
#define RP_Q8_0(name, unit_, mul, a) RP(name, 64, unit_, QS_Q8_0, 32, 34, 1, QS_RP_IA_BLOCK, mul, a)
#define RP_Q8_1(name, unit_, a) RP(name, 64, unit_, QS_Q8_1, 32, 36, 0, QS_RP_IA_NONE, 0, a)
#define RP_Q8_K(name, unit_, per, ia_, mul, a) RP(name, 256, unit_, QS_Q8_K, 256, 292, per, ia_, mul, a)

/* SIMD kernels whose names do not follow the <kernel>_scalar rule: a block decoder beside the reference
 * qs_deq_<type>, a bulk row converter, the F32 dot */
#define DEQ_SIMD(name) BY_ARCH(({qs_deq_##name, qs_deq_##name##_avx2}), ({qs_deq_##name, qs_deq_##name##_neon}))
#define ROW_SIMD(name) BY_ARCH(({NULL, qs_##name##_row_avx2}), ({NULL, qs_##name##_row_neon}))
#define DOT_F32 BY_ARCH(({qs_dot_f32_scalar, qs_dot_f32_avx2_q}), ({qs_dot_f32_scalar, qs_dot_f32_neon_q}))

static const qs_type_traits TYPES[QS_NTYPES] = {
    /* plain floats: one element per block, the activations stay in the same format */
    [QS_F32] = {.name = "F32", .elems = 1, .bytes = 4, .act = QS_F32, .act_quantize = qs_quantize_f32_act,
                .deq = {qs_deq_f32}, .deq_row = {qs_deq_row_f32}, .dot = DOT_F32,
                .rp = RP_FLOAT(f32, 1024, f32, RP_A1)},
    [QS_F16] = {.name = "F16", .elems = 1, .bytes = 2, .act = QS_F16, .act_quantize = qs_quantize_f16,
                .deq = {qs_deq_f16}, .deq_row = ROW_SIMD(f16), .dot = SLOTS(dot_f16, X1, A1),
                .rp = RP_FLOAT(f16, 512, f16, RP_A1)},
    [QS_BF16] = {.name = "BF16", .elems = 1, .bytes = 2, .act = QS_BF16, .act_quantize = qs_quantize_bf16,
                 .deq = {qs_deq_bf16}, .deq_row = ROW_SIMD(bf16), .dot = SLOTS(dot_bf16, X1, A1),
                 .rp = RP_BF16(RP_A1)},

    /* 32-element blocks */
    [QS_Q4_0] = {.name = "Q4_0", .elems = 32, .bytes = 18, .act = QS_Q8_0,
                 .deq = {qs_deq_q4_0}, .dot = SLOTS(dot_q4_0, X2, A2),
                 .panel = SLOTS(gemm_panel_q4_0, X1, A1), .gemm_group = 32,
                 .quantize_row = qs_qrow_q4_0,
                 .rp = RP_Q8_0(q4_0, 576, 8, RP_A2)},
    [QS_Q4_1] = {.name = "Q4_1", .elems = 32, .bytes = 20, .act = QS_Q8_1,
                 .deq = DEQ_SIMD(q4_1), .dot = SLOTS(dot_q4_1, X2, A2),
                 .panel = SLOTS(gemm_panel_q4_1, X1, A1), .gemm_group = 32,
                 .quantize_row = qs_qrow_q4_1,
                 .rp = RP_Q8_1(q4_1, 640, RP_A2)},
    [QS_Q5_0] = {.name = "Q5_0", .elems = 32, .bytes = 22, .act = QS_Q8_0,
                 .deq = DEQ_SIMD(q5_0), .dot = SLOTS(dot_q5_0, X2, A2),
                 .panel = SLOTS(gemm_panel_q5_0, X1, A1), .gemm_group = 32,
                 .quantize_row = qs_qrow_q5_0,
                 .rp = RP_Q8_0(q5_0, 704, 16, RP_A2)},
    [QS_Q5_1] = {.name = "Q5_1", .elems = 32, .bytes = 24, .act = QS_Q8_1,
                 .deq = {qs_deq_q5_1}, .dot = SLOTS(dot_q5_1, X1, A2),
                 .panel = {qs_gemm_panel_q5_1_scalar}, .gemm_group = 32,
                 .quantize_row = qs_qrow_q5_1,
                 .rp = RP_Q8_1(q5_1, 768, RP_A2)},
    [QS_Q8_0] = {.name = "Q8_0", .elems = 32, .bytes = 34, .act = QS_Q8_0, .act_quantize = qs_quantize_q8_0,
                 .deq = DEQ_SIMD(q8_0), .dot = SLOTS(dot_q8_0, X2, A2),
                 .panel = SLOTS(gemm_panel_q8_0, X1, A1), .gemm_group = 32, .gemm_wide = 1,
                 .quantize_row = qs_qrow_q8_0,
                 .rp = RP_Q8_0(q8_0, 1088, 128, RP_A2)},
    [QS_Q8_1] = {.name = "Q8_1", .elems = 32, .bytes = 36, .act_quantize = qs_quantize_q8_1},
    [QS_IQ4_NL] = {.name = "IQ4_NL", .elems = 32, .bytes = 18, .act = QS_Q8_0,
                   .deq = {qs_deq_iq4_nl}, .dot = SLOTS(dot_iq4_nl, X1, A2),
                   .panel = {qs_gemm_panel_iq4_nl_scalar}, .gemm_group = 32, .gemm_wide = 1,
                   .quantize_row = qs_qrow_iq4_nl,
                   .rp = RP_Q8_0(iq4_nl, 576, 128, RP_A2)},
    [QS_MXFP4] = {.name = "MXFP4", .elems = 32, .bytes = 17, .act = QS_Q8_0,
                  .deq = {qs_deq_mxfp4}, .dot = SLOTS(dot_mxfp4, X1, A2),
                  .panel = {qs_gemm_panel_mxfp4_scalar}, .gemm_group = 32,
                  .codes = qs_codes_mxfp4, .code_group = 32, .code_outer = 32,
                  .quantize_row = qs_qrow_mxfp4,
                  .rp = RP_Q8_0(mxfp4, 576, 128, RP_A2)},
    [QS_NVFP4] = {.name = "NVFP4", .elems = 64, .bytes = 36, .act = QS_Q8_0,
                  .deq = {qs_deq_nvfp4}, .dot = SLOTS(dot_nvfp4, X1, A2),
                  .panel = {qs_gemm_panel_nvfp4_scalar}, .gemm_group = 16,
                  .codes = qs_codes_nvfp4, .code_group = 16, .code_outer = 16},

    /* 256-element super-blocks against Q8_K */
    [QS_Q2_K] = {.name = "Q2_K", .elems = 256, .bytes = 84, .act = QS_Q8_K,
                 .deq = {qs_deq_q2_K}, .dot = SLOTS(dot_q2_K, X1, A2),
                 .panel = {qs_gemm_panel_q2_K_scalar}, .gemm_group = 16,
                 .quantize_row = qs_qrow_q2_K,
                 .rp = RP_Q8_K(q2_K, 1344, 16, QS_RP_IA_SUM16, 1, RP_A2)},
    [QS_Q3_K] = {.name = "Q3_K", .elems = 256, .bytes = 110, .act = QS_Q8_K,
                 .deq = {qs_deq_q3_K}, .dot = SLOTS(dot_q3_K, X1, A2),
                 .panel = {qs_gemm_panel_q3_K_scalar}, .gemm_group = 16,
                 .quantize_row = qs_qrow_q3_K,
                 .rp = RP_Q8_K(q3_K, 1856, 16, QS_RP_IA_SUM16, 4, RP_A2)},
    [QS_Q4_K] = {.name = "Q4_K", .elems = 256, .bytes = 144, .act = QS_Q8_K,
                 .deq = DEQ_SIMD(q4_K), .dot = SLOTS(dot_q4_K, X2, A2),
                 .panel = SLOTS(gemm_panel_q4_K, X1, A1), .gemm_group = 32,
                 .quantize_row = qs_qrow_q4_K,
                 .rp = RP_Q8_K(q4_K, 2368, 4, QS_RP_IA_K45, 0, RP_A2)},
    [QS_Q5_K] = {.name = "Q5_K", .elems = 256, .bytes = 176, .act = QS_Q8_K,
                 .deq = {qs_deq_q5_K}, .dot = SLOTS(dot_q5_K, X1, A2),
                 .panel = {qs_gemm_panel_q5_K_scalar}, .gemm_group = 32,
                 .quantize_row = qs_qrow_q5_K,
                 .rp = RP_Q8_K(q5_K, 2880, 4, QS_RP_IA_K45, 0, RP_A2)},
    [QS_Q6_K] = {.name = "Q6_K", .elems = 256, .bytes = 210, .act = QS_Q8_K,
                 .deq = DEQ_SIMD(q6_K), .dot = SLOTS(dot_q6_K, X2, A2),
                 .panel = SLOTS(gemm_panel_q6_K, X1, A1), .gemm_group = 16,
                 .quantize_row = qs_qrow_q6_K,
                 .rp = RP_Q8_K(q6_K, 3392, 16, QS_RP_IA_SUM16, 32, RP_A2)},
    [QS_Q8_K] = {.name = "Q8_K", .elems = 256, .bytes = 292, .act_quantize = qs_quantize_q8_K},
    [QS_IQ4_XS] = {.name = "IQ4_XS", .elems = 256, .bytes = 136, .act = QS_Q8_K,
                   .deq = {qs_deq_iq4_xs}, .dot = SLOTS(dot_iq4_xs, X1, A2),
                   .panel = {qs_gemm_panel_iq4_xs_scalar}, .gemm_group = 32, .gemm_wide = 1,
                   .quantize_row = qs_qrow_iq4_xs,
                   .rp = RP_Q8_K(iq4_xs, 2240, 8, QS_RP_IA_SUM32, 128, RP_A2)},
    [QS_IQ2_XXS] = {.name = "IQ2_XXS", .elems = 256, .bytes = 66, .act = QS_Q8_K,
                    .deq = {qs_deq_iq2_xxs}, .dot = SLOTS(dot_iq2_xxs, XV, A2),
                    .panel = {qs_gemm_panel_iq2_xxs_scalar}, .gemm_group = 32,
                    .codes = qs_codes_iq2_xxs, .code_group = 32, .code_outer = 256,
                    .rp_codes = RP_CODES(codes32, 8, RP_A2)},
    [QS_IQ2_XS] = {.name = "IQ2_XS", .elems = 256, .bytes = 74, .act = QS_Q8_K,
                   .deq = {qs_deq_iq2_xs}, .dot = SLOTS(dot_iq2_xs, XV, A2),
                   .panel = {qs_gemm_panel_iq2_xs_scalar}, .gemm_group = 16,
                   .codes = qs_codes_iq2_xs, .code_group = 16, .code_outer = 256,
                   .rp_codes = RP_CODES(codes16, 16, RP_A2)},
    [QS_IQ2_S] = {.name = "IQ2_S", .elems = 256, .bytes = 82, .act = QS_Q8_K,
                  .deq = {qs_deq_iq2_s}, .dot = SLOTS(dot_iq2_s, X1, A2),
                  .panel = {qs_gemm_panel_iq2_s_scalar}, .gemm_group = 16,
                  .codes = qs_codes_iq2_s, .code_group = 16, .code_outer = 256,
                  .rp_codes = RP_CODES(codes16, 16, RP_A2)},
    [QS_IQ3_XXS] = {.name = "IQ3_XXS", .elems = 256, .bytes = 98, .act = QS_Q8_K,
                    .deq = {qs_deq_iq3_xxs}, .dot = SLOTS(dot_iq3_xxs, XV, A2),
                    .panel = {qs_gemm_panel_iq3_xxs_scalar}, .gemm_group = 32,
                    .codes = qs_codes_iq3_xxs, .code_group = 32, .code_outer = 256,
                    .rp_codes = RP_CODES(codes32, 8, RP_A2)},
    [QS_IQ3_S] = {.name = "IQ3_S", .elems = 256, .bytes = 110, .act = QS_Q8_K,
                  .deq = {qs_deq_iq3_s}, .dot = SLOTS(dot_iq3_s, XV, A2),
                  .panel = {qs_gemm_panel_iq3_s_scalar}, .gemm_group = 32,
                  .codes = qs_codes_iq3_s, .code_group = 32, .code_outer = 256,
                  .rp_codes = RP_CODES(codes32, 8, RP_A2)},
    [QS_IQ1_S] = {.name = "IQ1_S", .elems = 256, .bytes = 50, .act = QS_Q8_K,
                  .deq = {qs_deq_iq1_s}, .dot = SLOTS(dot_iq1_s, X1, A2),
                  .panel = {qs_gemm_panel_iq1_s_scalar}, .gemm_group = 32,
                  .codes = qs_codes_iq1_s, .code_group = 32, .code_outer = 256,
                  .rp_codes = RP_CODES(codes32, 8, RP_A2)},
    [QS_IQ1_M] = {.name = "IQ1_M", .elems = 256, .bytes = 56, .act = QS_Q8_K,
                  .deq = {qs_deq_iq1_m}, .dot = SLOTS(dot_iq1_m, X1, A2),
                  .panel = {qs_gemm_panel_iq1_m_scalar}, .gemm_group = 16,
                  .codes = qs_codes_iq1_m, .code_group = 16, .code_outer = 256,
                  .rp_codes = RP_CODES(codes16, 16, RP_A2)},
    [QS_TQ1_0] = {.name = "TQ1_0", .elems = 256, .bytes = 54, .act = QS_Q8_K,
                  .deq = {qs_deq_tq1_0}, .dot = SLOTS(dot_tq1_0, XV, A2),
                  .panel = {qs_gemm_panel_tq1_0_scalar}, .gemm_group = 32,
                  .codes = qs_codes_tq1_0, .code_group = 256, .code_outer = 256,
                  .quantize_row = qs_qrow_tq1_0,
                  .rp_codes = RP_CODES(codes256, 1, RP_A2)},
    [QS_TQ2_0] = {.name = "TQ2_0", .elems = 256, .bytes = 66, .act = QS_Q8_K,
                  .deq = {qs_deq_tq2_0}, .dot = SLOTS(dot_tq2_0, X2, A2),
                  .panel = {qs_gemm_panel_tq2_0_scalar}, .gemm_group = 32,
                  .codes = qs_codes_tq2_0, .code_group = 256, .code_outer = 256,
                  .quantize_row = qs_qrow_tq2_0,
                  .rp_codes = RP_CODES(codes256, 1, RP_A2)},
};

static const qs_type_traits NONE = {.name = "", .act = -1};

const qs_type_traits *qs_traits(int type) { return type >= 0 && type < QS_NTYPES ? &TYPES[type] : &NONE; }

int qs_block_elems(int type) { return qs_traits(type)->elems; }
int qs_block_bytes(int type) { return qs_traits(type)->bytes; }
int qs_can_dequantize(int type) { return qs_traits(type)->deq[0] != NULL; }
int qs_vec_dot_type(int type) {
    const qs_type_traits *t = qs_traits(type);
    return t->dot[0] ? t->act : -1;
}

int qs_quantize_activation(int act, const float *x, uint8_t *dst, int64_t n) {
    const qs_type_traits *t = qs_traits(act);
    if (n < 0 || n > INT64_MAX / 8 || !t->act_quantize) return -1;
    return t->act_quantize(x, dst, n);
}

/* bytes of one quantized activation row of k elements */
int64_t qs_act_row_bytes(int act, int64_t k) {
    const qs_type_traits *t = qs_traits(act);
    return t->elems ? k / t->elems * t->bytes : k * 4;
}

/* A row is consistent when every ISA slot has a scalar reference beneath it and each job has what its driver
 * reads: a dot's activation format has a quantizer, a GEMM panel a group, a layout its writer and kernels. */
static int slots_ok(void *const *slots) {
    for (int i = 1; i < QS_TIERS; ++i)
        if (slots[i] && !slots[0]) return 0;
    return 1;
}

static int layout_ok(const qs_rp_layout *l, int load_time) {
    if (!l->blk) return 1;
    int wide_at_one = 0; /* a wide kernel needs its one-column partner at the same slot */
    for (int i = 1; i < QS_TIERS; ++i) {
        if (!l->wide[i] != !l->one[i]) return 0;
        wide_at_one |= l->wide[i] != NULL;
    }
    return l->unit > 0 && wide_at_one && !l->wide[0] && (l->cols == 4 || l->cols == 8) &&
           qs_traits(l->act)->act_quantize && (!load_time || (l->write && l->one[0]));
}

int qs_traits_check(void) {
    for (int type = 0; type < QS_NTYPES; ++type) {
        const qs_type_traits *t = &TYPES[type];
        int ok = (t->elems > 0) == (t->bytes > 0) && (t->elems > 0 || !t->deq[0]);
        ok = ok && slots_ok((void *const *)t->deq) && slots_ok((void *const *)t->dot) && slots_ok((void *const *)t->panel);
        ok = ok && (!t->dot[0] || qs_traits(t->act)->act_quantize);
        ok = ok && (!t->panel[0] == !t->gemm_group) && (!t->gemm_group || t->gemm_group == 16 || t->gemm_group == 32);
        ok = ok && (!t->codes || (t->code_group > 0 && t->code_outer > 0 && t->elems % t->code_outer == 0));
        ok = ok && layout_ok(&t->rp, 1) && layout_ok(&t->rp_codes, 0) && (!t->rp_codes.blk || t->codes);
        ok = ok && (!t->quantize_row || t->deq[0]);
        if (!ok) return type;
    }
    return -1;
}
