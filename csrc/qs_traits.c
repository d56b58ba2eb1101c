/* The type table (qs_traits.h): one row per ggml type, naming its block geometry, its activation format and the
 * codec of every job for every ISA tier. The drivers look rows up here and never switch on a type id. */
#include <stdint.h>

#include "qs_traits.h"

/* per-ISA slots: {scalar, AVX2, AVX-512, [QS_TIER_VBMI] = AVX-512 with VBMI}; an empty slot falls back */
#define ISA2(name) {qs_##name##_scalar, qs_##name##_avx2}
#define ISA3(name) {qs_##name##_scalar, qs_##name##_avx2, qs_##name##_avx512}
#define ISA_VBMI(name) {qs_##name##_scalar, qs_##name##_avx2, [QS_TIER_VBMI] = qs_##name##_avx512}

static const qs_type_traits TYPES[QS_NTYPES] = {
    /* plain floats: one element per block, the activations stay in the same format */
    [QS_F32] = {.name = "F32", .elems = 1, .bytes = 4, .act = QS_F32, .act_quantize = qs_quantize_f32_act,
                .deq = {qs_deq_f32}, .deq_row = {qs_deq_row_f32}, .dot = {qs_dot_f32_scalar, qs_dot_f32_avx2_q}},
    [QS_F16] = {.name = "F16", .elems = 1, .bytes = 2, .act = QS_F16, .act_quantize = qs_quantize_f16,
                .deq = {qs_deq_f16}, .deq_row = {NULL, qs_f16_row_avx2}, .dot = ISA2(dot_f16)},
    [QS_BF16] = {.name = "BF16", .elems = 1, .bytes = 2, .act = QS_BF16, .act_quantize = qs_quantize_bf16,
                 .deq = {qs_deq_bf16}, .deq_row = {NULL, qs_bf16_row_avx2}, .dot = ISA2(dot_bf16)},

    /* 32-element blocks */
    [QS_Q4_0] = {.name = "Q4_0", .elems = 32, .bytes = 18, .act = QS_Q8_0,
                 .deq = {qs_deq_q4_0}, .dot = ISA3(dot_q4_0),
             .panel = {qs_gemm_panel_q4_0_scalar, qs_gemm_panel_q4_0_avx2}, .gemm_group = 32},
    [QS_Q4_1] = {.name = "Q4_1", .elems = 32, .bytes = 20, .act = QS_Q8_1,
                 .deq = {qs_deq_q4_1, qs_deq_q4_1_avx2}, .dot = ISA3(dot_q4_1),
             .panel = {qs_gemm_panel_q4_1_scalar, qs_gemm_panel_q4_1_avx2}, .gemm_group = 32},
    [QS_Q5_0] = {.name = "Q5_0", .elems = 32, .bytes = 22, .act = QS_Q8_0,
                 .deq = {qs_deq_q5_0, qs_deq_q5_0_avx2}, .dot = ISA3(dot_q5_0),
             .panel = {qs_gemm_panel_q5_0_scalar, qs_gemm_panel_q5_0_avx2}, .gemm_group = 32},
    [QS_Q5_1] = {.name = "Q5_1", .elems = 32, .bytes = 24, .act = QS_Q8_1,
                 .deq = {qs_deq_q5_1}, .dot = ISA2(dot_q5_1),
             .panel = {qs_gemm_panel_q5_1_scalar}, .gemm_group = 32},
    [QS_Q8_0] = {.name = "Q8_0", .elems = 32, .bytes = 34, .act = QS_Q8_0, .act_quantize = qs_quantize_q8_0,
                 .deq = {qs_deq_q8_0, qs_deq_q8_0_avx2}, .dot = ISA3(dot_q8_0),
             .panel = {qs_gemm_panel_q8_0_scalar, qs_gemm_panel_q8_0_avx2}, .gemm_group = 32, .gemm_wide = 1},
    [QS_Q8_1] = {.name = "Q8_1", .elems = 32, .bytes = 36, .act_quantize = qs_quantize_q8_1},
    [QS_IQ4_NL] = {.name = "IQ4_NL", .elems = 32, .bytes = 18, .act = QS_Q8_0,
                   .deq = {qs_deq_iq4_nl}, .dot = ISA2(dot_iq4_nl),
               .panel = {qs_gemm_panel_iq4_nl_scalar}, .gemm_group = 32, .gemm_wide = 1},
    [QS_MXFP4] = {.name = "MXFP4", .elems = 32, .bytes = 17, .act = QS_Q8_0,
                  .deq = {qs_deq_mxfp4}, .dot = ISA2(dot_mxfp4),
              .panel = {qs_gemm_panel_mxfp4_scalar}, .gemm_group = 32,
              .codes = qs_codes_mxfp4, .code_group = 32, .code_outer = 32},
    [QS_NVFP4] = {.name = "NVFP4", .elems = 64, .bytes = 36, .act = QS_Q8_0,
                  .deq = {qs_deq_nvfp4}, .dot = ISA2(dot_nvfp4),
              .panel = {qs_gemm_panel_nvfp4_scalar}, .gemm_group = 16,
              .codes = qs_codes_nvfp4, .code_group = 16, .code_outer = 16},

    /* 256-element super-blocks against Q8_K */
    [QS_Q2_K] = {.name = "Q2_K", .elems = 256, .bytes = 84, .act = QS_Q8_K,
                 .deq = {qs_deq_q2_K}, .dot = ISA2(dot_q2_K),
             .panel = {qs_gemm_panel_q2_K_scalar}, .gemm_group = 16},
    [QS_Q3_K] = {.name = "Q3_K", .elems = 256, .bytes = 110, .act = QS_Q8_K,
                 .deq = {qs_deq_q3_K}, .dot = ISA2(dot_q3_K),
             .panel = {qs_gemm_panel_q3_K_scalar}, .gemm_group = 16},
    [QS_Q4_K] = {.name = "Q4_K", .elems = 256, .bytes = 144, .act = QS_Q8_K,
                 .deq = {qs_deq_q4_K, qs_deq_q4_K_avx2}, .dot = ISA3(dot_q4_K),
             .panel = {qs_gemm_panel_q4_K_scalar, qs_gemm_panel_q4_K_avx2}, .gemm_group = 32},
    [QS_Q5_K] = {.name = "Q5_K", .elems = 256, .bytes = 176, .act = QS_Q8_K,
                 .deq = {qs_deq_q5_K}, .dot = ISA2(dot_q5_K),
             .panel = {qs_gemm_panel_q5_K_scalar}, .gemm_group = 32},
    [QS_Q6_K] = {.name = "Q6_K", .elems = 256, .bytes = 210, .act = QS_Q8_K,
                 .deq = {qs_deq_q6_K, qs_deq_q6_K_avx2}, .dot = ISA3(dot_q6_K),
             .panel = {qs_gemm_panel_q6_K_scalar, qs_gemm_panel_q6_K_avx2}, .gemm_group = 16},
    [QS_Q8_K] = {.name = "Q8_K", .elems = 256, .bytes = 292, .act_quantize = qs_quantize_q8_K},
    [QS_IQ4_XS] = {.name = "IQ4_XS", .elems = 256, .bytes = 136, .act = QS_Q8_K,
                   .deq = {qs_deq_iq4_xs}, .dot = ISA2(dot_iq4_xs),
               .panel = {qs_gemm_panel_iq4_xs_scalar}, .gemm_group = 32, .gemm_wide = 1},
    [QS_IQ2_XXS] = {.name = "IQ2_XXS", .elems = 256, .bytes = 66, .act = QS_Q8_K,
                    .deq = {qs_deq_iq2_xxs}, .dot = ISA_VBMI(dot_iq2_xxs),
                .panel = {qs_gemm_panel_iq2_xxs_scalar}, .gemm_group = 32,
                .codes = qs_codes_iq2_xxs, .code_group = 32, .code_outer = 256},
    [QS_IQ2_XS] = {.name = "IQ2_XS", .elems = 256, .bytes = 74, .act = QS_Q8_K,
                   .deq = {qs_deq_iq2_xs}, .dot = ISA_VBMI(dot_iq2_xs),
               .panel = {qs_gemm_panel_iq2_xs_scalar}, .gemm_group = 16,
               .codes = qs_codes_iq2_xs, .code_group = 16, .code_outer = 256},
    [QS_IQ2_S] = {.name = "IQ2_S", .elems = 256, .bytes = 82, .act = QS_Q8_K,
                  .deq = {qs_deq_iq2_s}, .dot = ISA2(dot_iq2_s),
              .panel = {qs_gemm_panel_iq2_s_scalar}, .gemm_group = 16,
              .codes = qs_codes_iq2_s, .code_group = 16, .code_outer = 256},
    [QS_IQ3_XXS] = {.name = "IQ3_XXS", .elems = 256, .bytes = 98, .act = QS_Q8_K,
                    .deq = {qs_deq_iq3_xxs}, .dot = ISA_VBMI(dot_iq3_xxs),
                .panel = {qs_gemm_panel_iq3_xxs_scalar}, .gemm_group = 32,
                .codes = qs_codes_iq3_xxs, .code_group = 32, .code_outer = 256},
    [QS_IQ3_S] = {.name = "IQ3_S", .elems = 256, .bytes = 110, .act = QS_Q8_K,
                  .deq = {qs_deq_iq3_s}, .dot = ISA_VBMI(dot_iq3_s),
              .panel = {qs_gemm_panel_iq3_s_scalar}, .gemm_group = 32,
              .codes = qs_codes_iq3_s, .code_group = 32, .code_outer = 256},
    [QS_IQ1_S] = {.name = "IQ1_S", .elems = 256, .bytes = 50, .act = QS_Q8_K,
                  .deq = {qs_deq_iq1_s}, .dot = ISA2(dot_iq1_s),
              .panel = {qs_gemm_panel_iq1_s_scalar}, .gemm_group = 32,
              .codes = qs_codes_iq1_s, .code_group = 32, .code_outer = 256},
    [QS_IQ1_M] = {.name = "IQ1_M", .elems = 256, .bytes = 56, .act = QS_Q8_K,
                  .deq = {qs_deq_iq1_m}, .dot = ISA2(dot_iq1_m),
              .panel = {qs_gemm_panel_iq1_m_scalar}, .gemm_group = 16,
              .codes = qs_codes_iq1_m, .code_group = 16, .code_outer = 256},
    [QS_TQ1_0] = {.name = "TQ1_0", .elems = 256, .bytes = 54, .act = QS_Q8_K,
                  .deq = {qs_deq_tq1_0}, .dot = ISA_VBMI(dot_tq1_0),
              .panel = {qs_gemm_panel_tq1_0_scalar}, .gemm_group = 32,
              .codes = qs_codes_tq1_0, .code_group = 256, .code_outer = 256},
    [QS_TQ2_0] = {.name = "TQ2_0", .elems = 256, .bytes = 66, .act = QS_Q8_K,
                  .deq = {qs_deq_tq2_0}, .dot = ISA3(dot_tq2_0),
              .panel = {qs_gemm_panel_tq2_0_scalar}, .gemm_group = 32,
              .codes = qs_codes_tq2_0, .code_group = 256, .code_outer = 256},
};

static const qs_type_traits NONE = {.name = "", .act = -1};

const qs_type_traits *qs_traits(int type) { return type >= 0 && type < QS_NTYPES ? &TYPES[type] : &NONE; }

int qs_isa_tier(void) {
    const int isa = qs_isa_get();
    return isa >= QS_ISA_AVX512 && qs_cpu_has_vbmi() ? QS_TIER_VBMI : isa;
}

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
