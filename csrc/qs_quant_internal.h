/* Internal declarations shared by the quantized-kernel files. */
#ifndef QS_QUANT_INTERNAL_H
#define QS_QUANT_INTERNAL_H
#include <stdint.h>

#include "qs.h"

typedef void (*qs_deq_block_fn)(const uint8_t *blk, float *y);

/* Q4_K/Q5_K scales: 12 bytes -> bytes 0..7 = eight 6-bit scales, bytes 8..15 = eight 6-bit mins (ggml's masks). */
static inline void k4_scales_mins(const uint8_t *s, uint32_t u[4]) {
    const uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
    memcpy(u, s, 12);
    u[3] = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
    uint32_t aux = u[1] & k1;
    u[1] = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
    u[2] = aux;
    u[0] &= k1;
}

/* IQ4_NL / IQ4_XS code book */
static const int8_t QS_IQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
/* MXFP4's E2M1 values, doubled (ggml's kvalues_mxfp4) */
static const int8_t QS_FP4X2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* ggml's ksigns_iq2xs rule: 7 stored sign bits, the 8th makes the number of minus signs even */
static inline uint8_t qs_ksign(uint32_t i7) {
    i7 &= 127;
    return (uint8_t)(i7 | ((uint32_t)__builtin_parity(i7) << 7));
}

/* MXFP4's E8M0 scale halved (ggml_e8m0_to_fp32_half: E2M1 values are stored doubled) */
static inline float qs_e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
}

/* NVFP4's unsigned E4M3 scale (bias 7; 0 and 0x7F read as 0), halved: built from its bits */
static inline float qs_ue4m3_half(uint8_t x) {
    if (x == 0 || x == 0x7F) return 0.0f;
    const int exp = (x >> 3) & 15, man = x & 7;
    if (exp == 0) return (float)man * 0x1p-10f; /* subnormal: m · 2^-9, halved */
    const uint32_t bits = (uint32_t)(exp - 8 + 127) << 23 | (uint32_t)man << 20; /* (1 + m/8) · 2^(e-7), halved */
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
}

/* i-quants, ternary and FP4 types (qs_iquants.c): one block -> float32 */
void qs_deq_iq2_xxs(const uint8_t *b, float *y);
void qs_deq_iq2_xs(const uint8_t *b, float *y);
void qs_deq_iq2_s(const uint8_t *b, float *y);
void qs_deq_iq3_xxs(const uint8_t *b, float *y);
void qs_deq_iq3_s(const uint8_t *b, float *y);
void qs_deq_iq1_s(const uint8_t *b, float *y);
void qs_deq_iq1_m(const uint8_t *b, float *y);
void qs_deq_tq1_0(const uint8_t *b, float *y);
void qs_deq_tq2_0(const uint8_t *b, float *y);
void qs_deq_mxfp4(const uint8_t *b, float *y);
void qs_deq_nvfp4(const uint8_t *b, float *y);
/* their dot products against Q8_K (Q8_0 for MXFP4/NVFP4), through int8 codes per block (qs_iquants.c) */
typedef int (*qs_codes_fn)(const uint8_t *blk, int8_t *code, float *mult, int16_t *ls);
int qs_codes_iq2_xxs(const uint8_t *b, int8_t *code, float *mult, int16_t *ls);
int qs_codes_iq2_xs(const uint8_t *b, int8_t *code, float *mult, int16_t *ls);
int qs_codes_iq2_s(const uint8_t *b, int8_t *code, float *mult, int16_t *ls);
int qs_codes_iq3_xxs(const uint8_t *b, int8_t *code, float *mult, int16_t *ls);
int qs_codes_iq3_s(const uint8_t *b, int8_t *code, float *mult, int16_t *ls);
int qs_codes_iq1_s(const uint8_t *b, int8_t *code, float *mult, int16_t *ls);
int qs_codes_iq1_m(const uint8_t *b, int8_t *code, float *mult, int16_t *ls);
int qs_codes_tq1_0(const uint8_t *b, int8_t *code, float *mult, int16_t *ls);
int qs_codes_tq2_0(const uint8_t *b, int8_t *code, float *mult, int16_t *ls);
int qs_codes_mxfp4(const uint8_t *b, int8_t *code, float *mult, int16_t *ls);
int qs_codes_nvfp4(const uint8_t *b, int8_t *code, float *mult, int16_t *ls);
/* The 256 int8 codes (coordinate with its sign) of one IQ2_XXS/IQ2_XS/IQ2_S/IQ3_XXS/IQ3_S block, AVX2: the same
 * bytes as the scalar decoding in qs_codes_* (the prefill GEMM's panels and the many-column path decode through it) */
void qs_iq_lattice_codes_scalar(int type, const uint8_t *b, int8_t *code);
void qs_iq_lattice_codes_avx2(int type, const uint8_t *b, int8_t *code); /* elements sharing one float multiplier: 256, or 32 (MXFP4), 16 (NVFP4) */
int qs_iq_row_codes(qs_codes_fn fn, int elems, int bytes, const uint8_t *w, int64_t k, int8_t *codes, float *mults,
                    int16_t *ls);
/* The activation codes and scale of the group starting at element e0 of a Q8_K (q8k) or Q8_0 row */
static inline const int8_t *qs_iq_act(const uint8_t *x, int64_t e0, int q8k, float *dx) {
    if (q8k) {
        *dx = qs_load_f32(x + 292 * (e0 / 256));
        return (const int8_t *)(x + 292 * (e0 / 256) + 4) + e0 % 256;
    }
    *dx = qs_fp16_to_fp32(qs_load_u16(x + 34 * (e0 / 32)));
    return (const int8_t *)(x + 34 * (e0 / 32) + 2) + e0 % 32;
}
float qs_iq_dot_codes_scalar(const int8_t *codes, const float *mults, const int16_t *ls, int gs, int os, int q8k,
                             int64_t k, const uint8_t *x);
float qs_iq_dot_codes_avx2(const int8_t *codes, const float *mults, const int16_t *ls, int gs, int os, int q8k,
                           int64_t k, const uint8_t *x);
float qs_dot_iq2_xxs_scalar(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq2_xxs_avx2(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq2_xxs_avx512(int64_t n, const uint8_t *w, const uint8_t *x); /* AVX512_VBMI */
float qs_dot_iq2_xs_scalar(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq2_xs_avx2(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq2_xs_avx512(int64_t n, const uint8_t *w, const uint8_t *x); /* AVX512_VBMI */
float qs_dot_iq2_s_scalar(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq2_s_avx2(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq3_xxs_scalar(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq3_xxs_avx2(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq3_xxs_avx512(int64_t n, const uint8_t *w, const uint8_t *x); /* AVX512_VBMI */
float qs_dot_iq3_s_scalar(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq3_s_avx2(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq3_s_avx512(int64_t n, const uint8_t *w, const uint8_t *x); /* AVX512_VBMI */
int qs_cpu_has_vbmi(void);
float qs_dot_iq1_s_scalar(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq1_s_avx2(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq1_m_scalar(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq1_m_avx2(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_tq1_0_scalar(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_tq1_0_avx2(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_tq1_0_avx512(int64_t n, const uint8_t *w, const uint8_t *x); /* AVX512_VBMI */
float qs_dot_tq2_0_scalar(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_tq2_0_avx2(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_tq2_0_avx512(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_mxfp4_scalar(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_mxfp4_avx2(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_nvfp4_scalar(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_nvfp4_avx2(int64_t n, const uint8_t *w, const uint8_t *x);
typedef float (*qs_dot_fn)(int64_t n, const uint8_t *w, const uint8_t *xq);

/* scalar references (qs_quant.c) */
void qs_deq_f32(const uint8_t *b, float *y);
void qs_deq_f16(const uint8_t *b, float *y);
void qs_deq_bf16(const uint8_t *b, float *y);
void qs_deq_q4_0(const uint8_t *b, float *y);
void qs_deq_q4_1(const uint8_t *b, float *y);
void qs_deq_q5_0(const uint8_t *b, float *y);
void qs_deq_q5_1(const uint8_t *b, float *y);
void qs_deq_q8_0(const uint8_t *b, float *y);
void qs_deq_q2_K(const uint8_t *b, float *y);
void qs_deq_q3_K(const uint8_t *b, float *y);
void qs_deq_q4_K(const uint8_t *b, float *y);
void qs_deq_q5_K(const uint8_t *b, float *y);
void qs_deq_q6_K(const uint8_t *b, float *y);
void qs_deq_iq4_nl(const uint8_t *b, float *y);
void qs_deq_iq4_xs(const uint8_t *b, float *y);
void qs_deq_row_f32(const uint8_t *src, float *dst, int64_t n); /* a copy */
float qs_dot_q4_0_scalar(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q4_1_scalar(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q5_0_scalar(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q5_1_scalar(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q8_0_scalar(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q4_K_scalar(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q5_K_scalar(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q6_K_scalar(int64_t n, const uint8_t *w, const uint8_t *x);
void qs_q3k_scales(const uint8_t *s, int8_t out[16]); /* Q3_K's 16 six-bit scales, minus 32 */
float qs_dot_q2_K_scalar(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q3_K_scalar(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q2_K_avx2(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q3_K_avx2(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq4_nl_scalar(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq4_xs_scalar(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq4_nl_avx2(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq4_xs_avx2(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_f16_scalar(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_bf16_scalar(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_f32_scalar(int64_t n, const uint8_t *w, const uint8_t *x);

/* AVX2 (qs_quant_avx2.c) */
float qs_dot_q4_0_avx2(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q4_1_avx2(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q5_0_avx2(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q8_0_avx2(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q4_K_avx2(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q6_K_avx2(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_f16_avx2(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_f32_avx2_q(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q5_1_avx2(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q5_K_avx2(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_bf16_avx2(int64_t n, const uint8_t *w, const uint8_t *x);
void qs_deq_q4_K_avx2(const uint8_t *blk, float *y);
void qs_deq_q6_K_avx2(const uint8_t *blk, float *y);
void qs_deq_q8_0_avx2(const uint8_t *blk, float *y);
void qs_f16_row_avx2(const uint8_t *src, float *dst, int64_t n);  /* bulk F16 -> F32, exact */
void qs_bf16_row_avx2(const uint8_t *src, float *dst, int64_t n);
void qs_deq_q5_0_avx2(const uint8_t *blk, float *y);
void qs_deq_q4_1_avx2(const uint8_t *blk, float *y);

/* AVX-512 (qs_quant_avx512.c) */
float qs_dot_q4_0_avx512(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q4_1_avx512(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q5_0_avx512(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q8_0_avx512(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q4_K_avx512(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q6_K_avx512(int64_t n, const uint8_t *w, const uint8_t *x);

/* activation quantizers (qs_act.c; the others are API functions): F32 is a copy */
int qs_quantize_f32_act(const float *x, uint8_t *dst, int64_t n);
/* activation quantizers: scalar references (qs_act.c, ggml's *_ref) and SIMD versions giving the same bytes */
void qs_quantize_q8_0_scalar(const float *x, uint8_t *dst, int64_t n);
void qs_quantize_q8_1_scalar(const float *x, uint8_t *dst, int64_t n);
void qs_quantize_q8_K_scalar(const float *x, uint8_t *dst, int64_t n);
void qs_quantize_q8_0_avx2(const float *x, uint8_t *dst, int64_t n);
void qs_quantize_q8_1_avx2(const float *x, uint8_t *dst, int64_t n);
void qs_quantize_q8_K_avx2(const float *x, uint8_t *dst, int64_t n);

#endif
