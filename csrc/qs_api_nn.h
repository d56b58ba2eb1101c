/* Quantscope native API: float kernels of the inference engine (cffi cdef: declarations only). */

void qs_rmsnorm(const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps);
void qs_rope(float *x, int64_t n_tokens, int n_heads, int head_dim, int rot_dim, const int32_t *pos,
             float freq_base, float freq_scale, int neox);
void qs_softmax(float *x, int64_t n_rows, int64_t n);
void qs_swiglu(const float *gate, const float *up, float *out, int64_t n);
void qs_geglu_tanh(const float *gate, const float *up, float *out, int64_t n);
int qs_attention(const float *q, int64_t n_q, const int32_t *q_pos, int n_heads, int head_dim,
                 const void *k_cache, const void *v_cache, int kv_f16, int n_kv_heads, int64_t n_kv,
                 int64_t window, float scale, float *out, int n_threads);
