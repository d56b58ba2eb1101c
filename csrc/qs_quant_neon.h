/* ARM64 kernels of the 32-element quantized types, the float dots, the bit-exact dequantizers and the activation
 * quantizers (qs_quant_neon.c). Prototypes only; each has the signature of its scalar reference (qs_quant.c,
 * qs_iquants.c, qs_act.c). ISA levels (qs_arch.h): _neon = 1 (ARMv8.0), _dotprod = 2. */
#ifndef QS_QUANT_NEON_H
#define QS_QUANT_NEON_H
#include <stdint.h>

#include "qs_arch.h"

#if QS_ARCH_ARM64
/* Dot products against the quantized activation row (Q8_0; Q8_1 for Q4_1 / Q5_1; F16 / BF16 / F32 for the floats).
 * Integer sums exact; float results differ from the reference only in summation order (MXFP4 / NVFP4: identical). */
float qs_dot_q4_0_neon(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q4_1_neon(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q5_0_neon(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q5_1_neon(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q8_0_neon(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq4_nl_neon(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_mxfp4_neon(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_nvfp4_neon(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_f16_neon(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_bf16_neon(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_f32_neon_q(int64_t n, const uint8_t *w, const uint8_t *x);
#if QS_HAVE_DOTPROD
float qs_dot_q4_0_dotprod(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q4_1_dotprod(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q5_0_dotprod(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q5_1_dotprod(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q8_0_dotprod(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq4_nl_dotprod(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_mxfp4_dotprod(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_nvfp4_dotprod(int64_t n, const uint8_t *w, const uint8_t *x);
#endif

/* Dequantization, bit-exact with qs_deq_* (one block) and the scalar row conversions (NaN payloads kept). */
void qs_deq_q4_1_neon(const uint8_t *b, float *y);
void qs_deq_q5_0_neon(const uint8_t *b, float *y);
void qs_deq_q8_0_neon(const uint8_t *b, float *y);
void qs_f16_row_neon(const uint8_t *src, float *dst, int64_t n);
void qs_bf16_row_neon(const uint8_t *src, float *dst, int64_t n);

/* Activation quantizers, bit-identical to the scalar loops of qs_quantize_q8_0 / _q8_1 / _q8_K (n a multiple of
 * the block). */
void qs_quantize_q8_0_neon(const float *x, uint8_t *dst, int64_t n);
void qs_quantize_q8_1_neon(const float *x, uint8_t *dst, int64_t n);
void qs_quantize_q8_K_neon(const float *x, uint8_t *dst, int64_t n);
#endif

#endif
