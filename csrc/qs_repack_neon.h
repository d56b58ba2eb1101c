/* ARM64 kernels on the repacked (R16) layouts of the 32-element types and the float layouts (qs_repack_neon.c).
 * Prototypes only; each has the signature of qs_rp_kernel (qs_repack.h) and equals its scalar reference
 * qs_rp_<name>_scalar (qs_repack_rows.c) bit for bit. _4 / _8: 4 (quantized) / 8 (float) columns per call, _1: one.
 * ISA levels (qs_arch.h): _neon = 1 (ARMv8.0), _dotprod = 2. */
#ifndef QS_REPACK_NEON_H
#define QS_REPACK_NEON_H
#include <stdint.h>

#include "qs_arch.h"
#include "qs_repack.h"

#if QS_ARCH_ARM64
void qs_rp_q4_0_neon_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q4_0_neon_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q4_1_neon_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q4_1_neon_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q8_0_neon_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q8_0_neon_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q5_0_neon_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q5_0_neon_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q5_1_neon_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q5_1_neon_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_iq4_nl_neon_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_iq4_nl_neon_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_mxfp4_neon_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_mxfp4_neon_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_f32_neon_8(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_f32_neon_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_f16_neon_8(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_f16_neon_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_bf16_neon_8(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_bf16_neon_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
#if QS_HAVE_DOTPROD
void qs_rp_q4_0_dotprod_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q4_0_dotprod_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q4_1_dotprod_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q4_1_dotprod_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q8_0_dotprod_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q8_0_dotprod_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q5_0_dotprod_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q5_0_dotprod_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q5_1_dotprod_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_q5_1_dotprod_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_iq4_nl_dotprod_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_iq4_nl_dotprod_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_mxfp4_dotprod_4(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
void qs_rp_mxfp4_dotprod_1(const uint8_t *g, int64_t nb, const qs_rp_x *x, int64_t c0, float *out);
#endif
#endif

#endif
