/* Prefill GEMM: quantized weights x many activation rows, by register tiles.
 *
 * Every supported weight type is decoded, one row at a time, into one form: an unsigned 8-bit code c per element,
 * a float scale s per 4-element lane and a float min m per group of 16 or 32 elements, such that
 *     w[i] = s[i/4] * c[i] - m[g(i)]
 * (Q5_0: c = q, s = d, m = 16d; Q8_0: c = q + 128, m = 128d; Q4_1: m = -min; Q4_K: s = d*sc, m = dmin*mn; Q6_K:
 * s = d*sc, m = 32*d*sc). Activations are quantized exactly as ggml does for the weight type (Q8_0, Q8_1 or Q8_K)
 * and become signed codes q, a float scale xs per lane (the block's d) and a float per group bcol = d * (sum of
 * the group's codes) (Q8_1: its stored s). Then
 *     dot(w, x) = sum over lanes of s * xs * (sum of the lane's 4 products c*q)  -  sum over groups of m * bcol
 * The integer lane sums are exact (one vpdpbusd per 64 elements and tile on AVX-512 VNNI); only the order of the
 * float additions differs from the row-by-row dot products, which the tests compare within float tolerance.
 */
#ifndef QS_GEMM_H
#define QS_GEMM_H
#include <stdint.h>

typedef struct {
    int64_t k;   /* row length (elements) */
    int64_t k64; /* k rounded up to 64: code bytes per row */
    int64_t nl;  /* k64 / 4 lanes: floats of lane scales per row */
    int64_t ng;  /* groups per row */
    int64_t ngp; /* ng rounded up to 16: floats of mins per row */
    int group;   /* 16 or 32 */
} qs_gemm_dims;

/* Decode one weight row: codes[k64], ws[nl], mrow[ngp] (padding zeroed). */
typedef void (*qs_panel_fn)(const uint8_t *row, const qs_gemm_dims *d, uint8_t *codes, float *ws, float *mrow);

/* Scalar decoders (qs_gemm_panel.c; the specification, also used where no SIMD decoder exists). The type table
 * (qs_traits.c) holds each type's decoders and its GEMM group (16 or 32). */
void qs_gemm_panel_q4_0_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_q4_1_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_q5_0_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_q5_1_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_q8_0_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_q4_K_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_q5_K_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_q6_K_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_q2_K_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_q3_K_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_iq4_nl_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_iq4_xs_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_iq2_xxs_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_iq2_xs_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_iq2_s_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_iq3_xxs_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_iq3_s_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_iq1_s_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_iq1_m_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_tq1_0_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_tq2_0_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_mxfp4_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_nvfp4_scalar(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);

/* One activation column from its quantized blocks (act = QS_Q8_0, QS_Q8_1 or QS_Q8_K). */
void qs_gemm_prep_column(int act, const uint8_t *xq_blocks, const qs_gemm_dims *d, int8_t *codes, float *xs,
                         float *bcol);

/* The scalar tile (qs_gemm.c): the numeric specification of the SIMD tiles. */
void qs_gemm_tile_scalar(const qs_gemm_dims *d, const uint8_t *wc, const float *ws, const float *mrow,
                         const int8_t *xc, const float *xs, const float *bcol, int64_t n_c, int64_t n_valid, int n_r,
                         float *y, int64_t ldy);

/* AVX-512 VNNI kernel: rows [0, 4) of a decoded panel against n_c (multiple of 4) prepared columns. */
void qs_gemm_tile_avx512(const qs_gemm_dims *d, const uint8_t *wc, const float *ws, const float *mrow,
                         const int8_t *xc, const float *xs, const float *bcol, int64_t n_c, int64_t n_valid, int n_r,
                         float *y, int64_t ldy);


void qs_gemm_tile_avx2(const qs_gemm_dims *d, const uint8_t *wc, const float *ws, const float *mrow,
                       const int8_t *xc, const float *xs, const float *bcol, int64_t n_c, int64_t n_valid, int n_r,
                       float *y, int64_t ldy);

/* Zero the padding after k codes, k/4 lane scales and ng mins of one decoded row. */
void qs_gemm_zero_tail(const qs_gemm_dims *d, uint8_t *codes, float *ws, float *mrow);

/* AVX2 decoders (also used at the AVX-512 level), bit-identical to the scalar ones */
void qs_gemm_panel_q8_0_avx2(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_q4_0_avx2(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_q4_1_avx2(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_q5_0_avx2(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_q4_K_avx2(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);
void qs_gemm_panel_q6_K_avx2(const uint8_t *w, const qs_gemm_dims *d, uint8_t *c, float *ws, float *mrow);

/* Activations prepared once for every weight type with the same activation format (e.g. q/k/v, gate/up). */
typedef struct {
    int act;
    qs_gemm_dims d;
    int64_t n_x, n_c; /* columns, and columns padded to a multiple of 4 */
    uint8_t *buf;
    int8_t *xc;
    float *xs, *bcol;
} qs_gemm_act;

int qs_gemm_enabled(void);
int qs_gemm_usable(int type, int64_t k);
int qs_gemm_act_prepare(qs_gemm_act *a, int type, const float *x, int64_t n_x, int64_t k, int n_threads);
int qs_gemm_act_fits(const qs_gemm_act *a, int type, int64_t k);
void qs_gemm_act_free(qs_gemm_act *a);
int qs_gemm_run(int type, const uint8_t *w, int64_t n_rows, int64_t row_bytes, const qs_gemm_act *a, float *y,
                int n_threads);

/* Whole product y[j][r] = dot(row r, x[j]) for j < n_x; returns 1 when the type or the CPU has no GEMM path. */
int qs_gemm(int type, const uint8_t *w, int64_t n_rows, int64_t k, int64_t row_bytes, const float *x, int64_t n_x,
            float *y, int n_threads);

#endif
