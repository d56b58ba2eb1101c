/* ARM64 NEON kernels on repacked (R16) weights with 256-element k-blocks (qs_repack_kneon.c): Q4_K, Q5_K, Q6_K,
 * Q2_K, Q3_K, IQ4_XS and the code types' prompt layouts. Signature and output as qs_rp_kernel (qs_repack.h): _4
 * takes 4 columns (the layout's wide slot), _1 one column. _neon: ARMv8.0 (type-table level 1); _dotprod: + SDOT
 * (level 2), built only where the compiler can target it (QS_HAVE_DOTPROD). Bit-identical to the scalar
 * references qs_rp_<name>_scalar (the codes layouts: to the row dot qs_iq_dot_codes_scalar). */
#ifndef QS_REPACK_KNEON_H
#define QS_REPACK_KNEON_H
#include <stdint.h>

#include "qs_arch.h"
#include "qs_repack.h"

#if QS_ARCH_ARM64
void qs_rp_q4_K_neon_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q4_K_neon_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q5_K_neon_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q5_K_neon_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q6_K_neon_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q6_K_neon_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q2_K_neon_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q2_K_neon_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q3_K_neon_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q3_K_neon_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_iq4_xs_neon_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_iq4_xs_neon_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_codes16_neon_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_codes16_neon_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_codes32_neon_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_codes32_neon_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_codes256_neon_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_codes256_neon_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);

#if QS_HAVE_DOTPROD
void qs_rp_q4_K_dotprod_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q4_K_dotprod_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q5_K_dotprod_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q5_K_dotprod_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q6_K_dotprod_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q6_K_dotprod_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q2_K_dotprod_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q2_K_dotprod_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q3_K_dotprod_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q3_K_dotprod_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_iq4_xs_dotprod_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_iq4_xs_dotprod_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_codes16_dotprod_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_codes16_dotprod_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_codes32_dotprod_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_codes32_dotprod_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_codes256_dotprod_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_codes256_dotprod_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
#endif
#endif

#endif
