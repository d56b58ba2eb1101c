/* Quantscope native API: ISA dispatch, dequantization, activation quantizers, dots, matvec/matmat.
 * This file is read by cffi's cdef: declarations only, no preprocessor directives.
 * Type ids are ggml's. Size arguments are checked (negative, not whole blocks, products that overflow int64: the
 * call returns <0); the lengths of the buffers behind the pointers are not visible here, so the Python wrappers
 * (core/native/kernels.py) check them against those sizes before calling.
 *
 * Mapped memory: every entry point here and in qs_api_nn.h / gguf_scan.h that reads caller-supplied weights or
 * file bytes (qs_dequantize, qs_get_rows, qs_vec_dot, qs_matvec / qs_matmat and the GEMM behind them,
 * qs_block_forward, qs_read_probe, qs_scan_strings, qs_utf8_invalid_at) runs under a SIGBUS guard, on the calling
 * thread and on every pool thread. When the memory-mapped file is truncated or replaced under the call, it returns
 * QS_ERR_MAPPED_FAULT instead of killing the process (the entry points without an error return give 0 and
 * qs_guard_last_fault() reports 1). Buffers the faulted call had allocated are leaked. Outside guarded calls a
 * SIGBUS goes to the handler that was installed before ours (faulthandler, or the default: the process dies). */
enum { QS_ERR_MAPPED_FAULT = -9 };  /* mapped memory is no longer readable: the file changed or was truncated */
int qs_guard_last_fault(void);      /* 1 when this thread's last qs_read_probe / qs_utf8_invalid_at faulted; clears */
/* CLI mode: on a SIGBUS outside any guard, write msg to stderr and _exit(status) instead of dying by the signal
 * (NULL restores the default: hand it to the previous handler). Installs the handler. */
void qs_guard_set_fatal_message(const char *msg, int status);
int qs_copy_mapped(uint8_t *dst, const uint8_t *src, int64_t n);  /* memcpy under the guard, for numpy code */

int qs_isa_detected(void);          /* the CPU's best level (qs_arch.h): x86-64 0 scalar, 1 AVX2+FMA+F16C, 2 AVX-512
                                       F/BW/VL + VNNI; ARM64 0 scalar, 1 NEON, 2 + dotprod, 3 + i8mm */
int qs_isa_get(void);
int qs_isa_set(int level);          /* clamps to the detected level; returns the level now active */
const char *qs_isa_name(int level); /* "scalar", "avx2", ... on this build's CPU family; NULL past the last */
const char *qs_arch_name(void);     /* "x86_64", "arm64" or "generic" */
int qs_cpu_has_vbmi(void);         /* AVX512_VBMI: the AVX-512 lattice i-quant dots run */
int qs_cpu_has_avx512bf16(void);   /* AVX512_BF16: the repacked BF16 kernels use vdpbf16ps */
int qs_bf16_dot_set(int on);       /* vdpbf16ps on (1, where the CPU has it) / off (0: AVX-512F); -1 queries; returns the previous state */

int qs_block_elems(int type);       /* 0 for unknown types */
int qs_block_bytes(int type);
int qs_traits_check(void);         /* the type table's first inconsistent row (a type id; 41: the kernel table), or -1 */
int qs_can_dequantize(int type);
int qs_dequantize(int type, const uint8_t *src, float *dst, int64_t n_blocks, int n_threads);
/* Dequantize rows ids[0..n_ids) of an n_rows x row_len table into dst [n_ids][row_len]; -1 on a bad id. */
int qs_get_rows(int type, const uint8_t *table, int64_t n_rows, int64_t row_len, const int64_t *ids, int64_t n_ids,
                float *dst, int n_threads);

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

/* Load-time repacking (docs/engine.md#repacked-weights): 16 rows interleaved for the AVX-512 VNNI / AVX2 kernels.
 * qs_repack_type: the repacked type id (0x100 | type) qs_matmat accepts, or -1 when the type has no such layout.
 * qs_repack_bytes: bytes of the repacked copy of rows x k, or -1 (type, rows not a multiple of 16, k not whole
 * layout blocks). qs_repack writes row groups [g0, g1) (16 rows each) of src (src_bytes long) into dst. */
int qs_repack_type(int type);
int64_t qs_repack_bytes(int type, int64_t rows, int64_t k);
int qs_repack(int type, const uint8_t *src, int64_t src_bytes, int64_t rows, int64_t k, uint8_t *dst,
              int64_t dst_bytes, int64_t g0, int64_t g1, int n_threads);
/* n (1..32) products of the same x (n_x rows of k) by repacked weights (type ids 0x100 | type, n_rows[i] rows
 * each) in one pool job, y[i] = x W_i^T: the engine's q/k/v and gate/up. Same bits as n qs_matmat calls. */
int qs_rp_matmat_multi(int n, const int *rtype, const uint8_t *const *w, const int64_t *n_rows, int64_t k,
                       const float *x, int64_t n_x, float *const *y, int n_threads);
/* The same with an input of its own per product, y[i] = x[i] W_i^T (a decode step's experts' down products). */
int qs_rp_matmat_multi_x(int n, const int *rtype, const uint8_t *const *w, const int64_t *n_rows, int64_t k,
                         const float *const *x, int64_t n_x, float *const *y, int n_threads);
/* Prompts of the code types (IQ1/IQ2/IQ3 and TQ, Q8_K activations): each 16-row group decoded once into a
 * transient repacked layout and multiplied with every column; the same bits as the row dots. qs_matmat takes this
 * path for 4 or more columns where qs_iq_prefill_usable (a SIMD ISA, rows a multiple of 16, k of 256). */
int qs_iq_prefill_usable(int type, int64_t n_rows, int64_t k);
int qs_iq_prefill(int type, const uint8_t *w, int64_t n_rows, int64_t k, const float *x, int64_t n_x, float *y,
                  int n_threads);
/* Bytes rows x k of a weight of this type (plain or repacked) occupy; -1 when no kernel runs it. */
int64_t qs_weight_bytes(int type, int64_t rows, int64_t k);
/* Anonymous memory for repacked copies: 2 MiB aligned, transparent huge pages requested; NULL on failure. */
void *qs_alloc_huge(int64_t bytes);
void qs_free_huge(void *p, int64_t bytes);
/* Drop this process's pages of a read-only file mapping (MADV_DONTNEED on the whole pages inside [p, p+n)). */
int qs_drop_pages(const uint8_t *p, int64_t n);

int qs_gemm_set(int on);           /* tiled prefill GEMM on (1) / off (0); -1 queries; returns the previous state */
/* Test hook: one weight row in the GEMM's decoded form (codes[k64], lane scales[k64/4], group mins[ceil16(k/group)]),
 * k64 = k rounded up to 64; simd = 1 uses the decoder of the active ISA level (returns 1 below AVX2). */
int qs_gemm_decode_row(int type, const uint8_t *row, int64_t k, int simd, uint8_t *codes, float *ws, float *mrow);
int qs_threads_default(void);
uint64_t qs_read_probe(const uint8_t *p, int64_t n, int n_threads);  /* XOR of every byte: a read-bandwidth probe */
double qs_pool_op_ns(int n_threads, int reps); /* mean ns of one empty n_threads-task pool job (wake + barrier) */
/* Test hook: run `jobs` pool jobs of changing width on n_threads threads, workers pausing `pause_us` microseconds
 * after reading every 4th job; returns how many jobs returned before all their tasks ended, plus the tasks that
 * ran after their job had returned, plus the times a worker took part in one job twice (0 when the pool is
 * sound), -1 when out of memory. */
int64_t qs_pool_selftest(int64_t jobs, int n_threads, int pause_us);
