/* Quantscope native API: weight quantizers (docs/quantize.md). Read by cffi's cdef: declarations only.
 * They write the same bytes as ggml's ggml_quantize_chunk for the same rows and importance weights. */
int qs_can_quantize(int type);      /* 1 when qs_quantize_rows takes this ggml type id */
/* Quantize n_rows rows of n_per_row floats into ggml type `type`. imatrix: NULL or n_per_row importance weights
 * (ignored by the types whose ggml quantizer takes none). dst holds dst_bytes. Returns the bytes written
 * (n_rows * row bytes), or <0: -1 type without a quantizer, -2 n_rows/n_per_row negative or not whole blocks,
 * -3 dst_bytes too small or the size overflows, -4 a row holds a NaN or an infinity (those rows are left zero: ggml's
 * quantizers have no defined result for them). Rows are shared among n_threads pool threads (0: the default). */
int64_t qs_quantize_rows(int type, const float *src, int64_t n_rows, int64_t n_per_row, const float *imatrix,
                         uint8_t *dst, int64_t dst_bytes, int n_threads);
