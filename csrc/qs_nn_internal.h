/* Internal entry points of the float kernels (scalar references and SIMD variants). */
#ifndef QS_NN_INTERNAL_H
#define QS_NN_INTERNAL_H
#include <stdint.h>

void qs_rmsnorm_scalar(const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps);
void qs_rmsnorm_avx2(const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps);
float qs_dot_f32_avx2(const float *a, const float *b, int n);
float qs_dot_f32_f16_avx2(const float *a, const uint16_t *b, int n);
void qs_axpy_f32_avx2(float a, const float *x, float *y, int n);
void qs_axpy_f16_avx2(float a, const uint16_t *x, float *y, int n);
void qs_swiglu_avx2(const float *gate, const float *up, float *out, int64_t n);
void qs_geglu_tanh_avx2(const float *gate, const float *up, float *out, int64_t n);

#endif
