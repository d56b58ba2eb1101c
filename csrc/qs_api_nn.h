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

/* One transformer block (llama / qwen2 / gemma3 variants), in place on x [T][n_embd]. Pointers that a variant
 * lacks are NULL. KV cache layout: [n_ctx][n_head_kv][head_dim], F32 or F16. Returns 0, or <0 on failure. */
typedef struct {
    int n_embd, n_head, n_head_kv, head_dim, n_ff, rope_dim, rope_neox, gelu, kv_f16;
    int64_t n_ctx, window;
    float eps, rope_base, attn_scale;
    int wq_type, wk_type, wv_type, wo_type, wg_type, wu_type, wd_type;
    const uint8_t *wq, *wk, *wv, *wo, *wg, *wu, *wd;
    const float *attn_norm, *ffn_norm, *bq, *bk, *bv, *q_norm, *k_norm, *post_attn_norm, *post_ffn_norm;
    void *k_cache, *v_cache;
} qs_block;
int qs_block_forward(const qs_block *b, float *x, int64_t n_tokens, const int32_t *pos, int64_t n_past,
                     int n_threads);
