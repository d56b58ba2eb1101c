/* Weight quantizers, one row at a time (docs/quantize.md). Each writes the n / block_elems blocks of one row of n
 * values (n a whole number of blocks, checked by the caller) exactly as ggml's quantizer of that type does; qw is
 * NULL (ggml's reference path) or n importance weights (its weighted path). Plain C compiled without ISA flags:
 * ggml's quantizers run in ggml-base, built without -march, so neither side fuses a multiply and an add. */
#ifndef QS_QUANTIZE_INTERNAL_H
#define QS_QUANTIZE_INTERNAL_H

#include <stdint.h>

typedef void (*qs_qrow_fn)(const float *x, uint8_t *y, int64_t n, const float *qw);

/* csrc/qs_qz_basic.c */
void qs_qrow_q4_0(const float *x, uint8_t *y, int64_t n, const float *qw);
void qs_qrow_q4_1(const float *x, uint8_t *y, int64_t n, const float *qw);
void qs_qrow_q5_0(const float *x, uint8_t *y, int64_t n, const float *qw);
void qs_qrow_q5_1(const float *x, uint8_t *y, int64_t n, const float *qw);
void qs_qrow_q8_0(const float *x, uint8_t *y, int64_t n, const float *qw);
void qs_qrow_iq4_nl(const float *x, uint8_t *y, int64_t n, const float *qw);
void qs_qrow_iq4_xs(const float *x, uint8_t *y, int64_t n, const float *qw);
void qs_qrow_tq1_0(const float *x, uint8_t *y, int64_t n, const float *qw);
void qs_qrow_tq2_0(const float *x, uint8_t *y, int64_t n, const float *qw);
void qs_qrow_mxfp4(const float *x, uint8_t *y, int64_t n, const float *qw);

/* csrc/qs_qz_kquants.c */
void qs_qrow_q2_K(const float *x, uint8_t *y, int64_t n, const float *qw);
void qs_qrow_q3_K(const float *x, uint8_t *y, int64_t n, const float *qw);
void qs_qrow_q4_K(const float *x, uint8_t *y, int64_t n, const float *qw);
void qs_qrow_q5_K(const float *x, uint8_t *y, int64_t n, const float *qw);
void qs_qrow_q6_K(const float *x, uint8_t *y, int64_t n, const float *qw);

#endif
