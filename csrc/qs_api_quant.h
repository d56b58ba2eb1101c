/* Quantscope native API: ISA dispatch, dequantization, activation quantizers, dots, matvec/matmat.
 * This file is read by cffi's cdef: declarations only, no preprocessor directives.
 * Type ids are ggml's. Size arguments are checked (negative, not whole blocks, products that overflow int64: the
 * call returns <0); the lengths of the buffers behind the pointers are not visible here, so the Python wrappers
 * (core/native/kernels.py) check them against those sizes before calling. */

int qs_isa_detected(void);          /* 0 = scalar, 1 = AVX2+FMA+F16C, 2 = AVX-512 F/BW/VL + VNNI */
int qs_isa_get(void);
int qs_isa_set(int level);          /* clamps to the detected level; returns the level now active */

int qs_block_elems(int type);       /* 0 for unknown types */
int qs_block_bytes(int type);
int qs_can_dequantize(int type);
int qs_dequantize(int type, const uint8_t *src, float *dst, int64_t n_blocks, int n_threads);

int qs_quantize_q8_0(const float *x, uint8_t *dst, int64_t n);   /* n % 32 == 0 */
int qs_quantize_q8_1(const float *x, uint8_t *dst, int64_t n);   /* n % 32 == 0 */
int qs_quantize_q8_K(const float *x, uint8_t *dst, int64_t n);   /* n % 256 == 0 */
int qs_quantize_f16(const float *x, uint8_t *dst, int64_t n);
int qs_quantize_bf16(const float *x, uint8_t *dst, int64_t n);

int qs_vec_dot_type(int type);      /* activation type a weight type pairs with; -1 if no direct kernel */
int qs_quantize_activation(int act_type, const float *x, uint8_t *dst, int64_t n);
int qs_vec_dot(int type, int64_t n, const uint8_t *w, const uint8_t *xq, float *out);
int qs_matvec(int type, const uint8_t *w, int64_t n_rows, int64_t k, const float *x, float *y, int n_threads);
int qs_matmat(int type, const uint8_t *w, int64_t n_rows, int64_t k, const float *x, int64_t n_x, float *y,
              int n_threads);

int qs_gemm_set(int on);           /* tiled prefill GEMM on (1) / off (0); -1 queries; returns the previous state */
/* Test hook: one weight row in the GEMM's decoded form (codes[k64], lane scales[k64/4], group mins[ceil16(k/group)]),
 * k64 = k rounded up to 64; simd = 1 uses the decoder of the active ISA level (returns 1 below AVX2). */
int qs_gemm_decode_row(int type, const uint8_t *row, int64_t k, int simd, uint8_t *codes, float *ws, float *mrow);
int qs_threads_default(void);
uint64_t qs_read_probe(const uint8_t *p, int64_t n, int n_threads);  /* XOR of every byte: a read-bandwidth probe */
