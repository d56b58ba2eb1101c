/* Internal entry points of the float kernels (scalar references and SIMD variants). */
#ifndef QS_NN_INTERNAL_H
#define QS_NN_INTERNAL_H
#include <stdint.h>

/* Scalar references (qs_nn.c); the SIMD kernels (x86: qs_nn_simd.c, ARM64: qs_nn_neon.c) beside them are picked
 * from per-ISA slots (qs_slots.h). */
void qs_rmsnorm_scalar(const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps);
void qs_swiglu_scalar(const float *gate, const float *up, float *out, int64_t n);
void qs_geglu_tanh_scalar(const float *gate, const float *up, float *out, int64_t n);
void qs_layernorm_scalar(const float *x, const float *w, const float *b, float *y, int64_t n_rows, int64_t n,
                         float eps);
void qs_gelu_tanh_scalar(const float *x, float *out, int64_t n);
float qs_fdot_f32_scalar(const float *a, const float *b, int n);
float qs_fdot_f16_scalar(const float *a, const uint16_t *b, int n);
void qs_axpy_f32_scalar(float a, const float *x, float *y, int n);
void qs_axpy_f16_scalar(float a, const uint16_t *x, float *y, int n);
/* V rows of the block caches (QS_KV_Q8_0 / Q4_0 / BF16, n elements): y += a * (each element as the block holds it) */
void qs_axpy_q8_0_scalar(float a, const uint8_t *x, float *y, int n);
void qs_axpy_q4_0_scalar(float a, const uint8_t *x, float *y, int n);
void qs_axpy_bf16_scalar(float a, const uint8_t *x, float *y, int n);
void qs_axpy_q8_0_avx2(float a, const uint8_t *x, float *y, int n);
void qs_axpy_q4_0_avx2(float a, const uint8_t *x, float *y, int n);
void qs_axpy_bf16_avx2(float a, const uint8_t *x, float *y, int n);
void qs_rmsnorm_avx2(const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps);
float qs_dot_f32_avx2(const float *a, const float *b, int n);
float qs_dot_f32_f16_avx2(const float *a, const uint16_t *b, int n);
void qs_axpy_f32_avx2(float a, const float *x, float *y, int n);
void qs_axpy_f16_avx2(float a, const uint16_t *x, float *y, int n);
void qs_swiglu_avx2(const float *gate, const float *up, float *out, int64_t n);
void qs_geglu_tanh_avx2(const float *gate, const float *up, float *out, int64_t n);
/* One token of a gated delta-net head (docs/engine.md, "Gated delta-net layers"), state st [S key][S value]:
 * st *= decay; sk = st^T k; d = beta (v - sk); st += k d^T; o = st^T q. Per value lane the same operations in the
 * same order (fused multiply-adds over the key index), so the two give the same bits. sk: S floats of scratch. */
void qs_gdn_step_scalar(int64_t S, float *st, const float *k, const float *q, const float *v, float decay, float beta,
                        float *o, float *sk);
typedef void (*qs_gdn_step_fn)(int64_t S, float *st, const float *k, const float *q, const float *v, float decay,
                               float beta, float *o, float *sk);
qs_gdn_step_fn qs_gdn_step_kernel(void); /* the active ISA's (qs_nn.c) */
void qs_gdn_step_avx2(int64_t S, float *st, const float *k, const float *q, const float *v, float decay, float beta,
                      float *o, float *sk);

#endif
