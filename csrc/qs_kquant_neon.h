/* ARM64 NEON kernels of the k-quants, IQ4_XS and the ternary types (qs_kquant_neon.c): dot products against Q8_K
 * activations and the two SIMD dequantizations. Same signatures as their scalar references (qs_quant.c,
 * qs_iquants.c). _neon: ARMv8.0 (type-table level 1); _dotprod: + SDOT (level 2), built only where the compiler
 * can target it (QS_HAVE_DOTPROD). */
#ifndef QS_KQUANT_NEON_H
#define QS_KQUANT_NEON_H
#include <stdint.h>

#include "qs_arch.h"

#if QS_ARCH_ARM64
float qs_dot_q2_K_neon(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q3_K_neon(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q4_K_neon(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q5_K_neon(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q6_K_neon(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq4_xs_neon(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_tq1_0_neon(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_tq2_0_neon(int64_t n, const uint8_t *w, const uint8_t *x);
void qs_deq_q4_K_neon(const uint8_t *b, float *y); /* bit-exact with qs_deq_q4_K */
void qs_deq_q6_K_neon(const uint8_t *b, float *y); /* bit-exact with qs_deq_q6_K */

#if QS_HAVE_DOTPROD
float qs_dot_q2_K_dotprod(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q3_K_dotprod(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q4_K_dotprod(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q5_K_dotprod(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_q6_K_dotprod(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_iq4_xs_dotprod(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_tq1_0_dotprod(int64_t n, const uint8_t *w, const uint8_t *x);
float qs_dot_tq2_0_dotprod(int64_t n, const uint8_t *w, const uint8_t *x);
#endif
#endif

#endif
