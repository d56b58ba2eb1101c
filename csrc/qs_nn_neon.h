/* ARM64 kernels of the float helpers (qs_nn_neon.c), of the prefill GEMM tile (qs_gemm_neon.c) and of its weight-row
 * decoders (qs_gemm_panel_neon.c). Prototypes only; each has the signature of its scalar reference. ISA levels
 * (qs_arch.h): _neon = 1 (ARMv8.0), _dotprod = 2, _i8mm = 3. */
#ifndef QS_NN_NEON_H
#define QS_NN_NEON_H
#include <stdint.h>

#include "qs_arch.h"
#include "qs_gemm.h"

#if QS_ARCH_ARM64
/* Float helpers, level 1 (references: qs_nn.c and the loops of kv_dot / kv_axpy there). */
float qs_dot_f32_neon(const float *a, const float *b, int n);
float qs_dot_f32_f16_neon(const float *a, const uint16_t *b, int n);
void qs_axpy_f32_neon(float a, const float *x, float *y, int n);
void qs_axpy_f16_neon(float a, const uint16_t *x, float *y, int n);
void qs_axpy_q8_0_neon(float a, const uint8_t *x, float *y, int n);
void qs_axpy_q4_0_neon(float a, const uint8_t *x, float *y, int n);
void qs_axpy_bf16_neon(float a, const uint8_t *x, float *y, int n);
void qs_rmsnorm_neon(const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps);
void qs_swiglu_neon(const float *gate, const float *up, float *out, int64_t n);
void qs_geglu_tanh_neon(const float *gate, const float *up, float *out, int64_t n);
/* Bit-identical to qs_gdn_step_scalar. */
void qs_gdn_step_neon(int64_t S, float *st, const float *k, const float *q, const float *v, float decay, float beta,
                      float *o, float *sk);

/* Prefill GEMM tile (reference: tile_scalar in qs_gemm.c). Level 1, any codes 0..255. */
void qs_gemm_tile_neon(const qs_gemm_dims *d, const uint8_t *wc, const float *ws, const float *mrow,
                       const int8_t *xc, const float *xs, const float *bcol, int64_t n_c, int64_t n_valid, int n_r,
                       float *y, int64_t ldy);
/* Prefill GEMM weight-row decoders (qs_gemm_panel_neon.c; references: qs_gemm_panel_<t>_scalar in
 * qs_gemm_panel.c), level 1, bit-identical to the references. */
void qs_gemm_panel_q4_0_neon(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_q4_1_neon(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_q5_0_neon(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_q8_0_neon(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_q4_K_neon(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_q6_K_neon(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
#if QS_HAVE_DOTPROD
/* Level 2, SDOT: weight codes at most 127 only (types without gemm_wide). */
void qs_gemm_tile_dotprod(const qs_gemm_dims *d, const uint8_t *wc, const float *ws, const float *mrow,
                          const int8_t *xc, const float *xs, const float *bcol, int64_t n_c, int64_t n_valid, int n_r,
                          float *y, int64_t ldy);
/* Level 2, SDOT on c - 128 plus 128 * (sum of q): any codes 0..255 (the gemm_wide types). */
void qs_gemm_tile_dotprod_wide(const qs_gemm_dims *d, const uint8_t *wc, const float *ws, const float *mrow,
                               const int8_t *xc, const float *xs, const float *bcol, int64_t n_c, int64_t n_valid,
                               int n_r, float *y, int64_t ldy);
#endif
#if QS_HAVE_I8MM
/* Level 3, USDOT (unsigned x signed, vpdpbusd's semantics): any codes 0..255. */
void qs_gemm_tile_i8mm(const qs_gemm_dims *d, const uint8_t *wc, const float *ws, const float *mrow,
                       const int8_t *xc, const float *xs, const float *bcol, int64_t n_c, int64_t n_valid, int n_r,
                       float *y, int64_t ldy);
#endif
#endif

#endif
