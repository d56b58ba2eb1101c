/* Quantscope native API: float kernels of the inference engine (cffi cdef: declarations only). */

/* Error codes of the engine's entry points (qs_rope, qs_attention, qs_block_forward; qs_matmat shares the first
 * two). Every size argument is checked before anything is written: a bad one returns its code, never writes out
 * of bounds. What C cannot see is the length of a buffer behind a bare pointer: qs_block carries those lengths. */
enum {
    QS_OK = 0,
    QS_ERR_SIZE = -1,   /* a size/count argument is negative, zero where it must not be, too large or inconsistent
                           (dimensions, tokens, n_past + tokens > n_ctx, window) */
    QS_ERR_NOMEM = -2,  /* scratch memory could not be allocated */
    QS_ERR_TYPE = -3,   /* a weight type has no kernel, or a row length is not a multiple of its block */
    QS_ERR_WEIGHT = -4, /* a weight's byte length is less than rows x row bytes */
    QS_ERR_VECTOR = -5, /* a norm/bias vector is missing or its length is not the one the block needs */
    QS_ERR_CACHE = -6,  /* a KV cache holds fewer bytes than n_ctx x n_head_kv x head_dim elements */
    QS_ERR_POS = -7,    /* a position lies outside 0..n_ctx-1 */
    QS_ERR_HEADS = -8   /* n_head, n_head_kv (must divide n_head), head_dim (<= 1024) or rope_dim (even, > 0,
                           <= head_dim) is invalid */
};

void qs_rmsnorm(const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps);
/* Rotates the first rot_dim values of each head; returns QS_ERR_HEADS unless rot_dim is even, > 0, <= head_dim
 * and <= 1024, QS_ERR_SIZE for negative counts. freq_factors: NULL, or rot_dim/2 finite positive divisors of the
 * pairs' frequencies (Llama 3's rope_freqs.weight; QS_ERR_SIZE otherwise). */
int qs_rope(float *x, int64_t n_tokens, int n_heads, int head_dim, int rot_dim, const int32_t *pos,
            float freq_base, float freq_scale, int neox, const float *freq_factors);
/* ggml_rope_ext's full form: angle freq_scale * pos * base^(-2i/rot) / freq_factors[i]; with ext_factor != 0
 * (YaRN) the unscaled angle is mixed back in below the correction dimensions corr0..corr1 and the magnitude gets
 * 1 + 0.1 ln(1/freq_scale); every rotated value is multiplied by mscale. QS_ERR_SIZE for a non-finite or
 * non-positive base or scale, or non-finite others. */
typedef struct {
    float freq_base, freq_scale;
    int neox;
    const float *freq_factors;
    float ext_factor, corr0, corr1, mscale;
} qs_rope_params;
int qs_rope_ext(float *x, int64_t n_tokens, int n_heads, int head_dim, int rot_dim, const int32_t *pos,
                const qs_rope_params *rp);
void qs_softmax(float *x, int64_t n_rows, int64_t n);
void qs_swiglu(const float *gate, const float *up, float *out, int64_t n);
void qs_geglu_tanh(const float *gate, const float *up, float *out, int64_t n);
/* gpt-oss's clamped SwiGLU (qs_block's swiglu_oai); out may alias gate or up. */
void qs_swiglu_oai(const float *gate, const float *up, float *out, int64_t n);
/* Caches hold n_ctx positions; the first n_kv (<= n_ctx) are valid. Query positions must be >= 0. */
int qs_attention(const float *q, int64_t n_q, const int32_t *q_pos, int n_heads, int head_dim,
                 const void *k_cache, const void *v_cache, int kv_f16, int n_kv_heads, int64_t n_kv, int64_t n_ctx,
                 int64_t window, float scale, float *out, int n_threads);
/* The same with gemma2's soft-capping of the scaled scores, s -> softcap * tanh(s / softcap) (0: none; negative or
 * non-finite: QS_ERR_SIZE). */
int qs_attention_softcap(const float *q, int64_t n_q, const int32_t *q_pos, int n_heads, int head_dim,
                         const void *k_cache, const void *v_cache, int kv_f16, int n_kv_heads, int64_t n_kv,
                         int64_t n_ctx, int64_t window, float scale, float softcap, float *out, int n_threads);
/* The same with gpt-oss's attention sinks: sinks (NULL: none) holds one logit per query head that joins each
 * softmax's denominator, unscaled and never masked, with no value row: p_j = e^(s_j - M) / (sum_i e^(s_i - M) +
 * e^(sink - M)), M the larger of the scores' maximum and the sink. A non-finite sink is QS_ERR_SIZE. */
int qs_attention_sinks(const float *q, int64_t n_q, const int32_t *q_pos, int n_heads, int head_dim,
                       const void *k_cache, const void *v_cache, int kv_f16, int n_kv_heads, int64_t n_kv,
                       int64_t n_ctx, int64_t window, float scale, float softcap, const float *sinks, float *out,
                       int n_threads);
/* The probe's attention weights (docs/probe.md): what qs_attention_sinks gives each key, computed by the same code,
 * written to probs [n_q][n_heads][n_kv] (0 outside the causal window) instead of attending to V. k_cache_bytes is
 * the cache's length (QS_ERR_CACHE when short of n_ctx rows), probs_len probs' (QS_ERR_SIZE when short). */
int qs_attention_probs(const float *q, int64_t n_q, const int32_t *q_pos, int n_heads, int head_dim,
                       const void *k_cache, int64_t k_cache_bytes, int kv_f16, int n_kv_heads, int64_t n_kv,
                       int64_t n_ctx, int64_t window, float scale, float softcap, const float *sinks, float *probs,
                       int64_t probs_len, int n_threads);

/* One transformer block (llama / qwen2 / gemma3 variants), in place on x [T][n_embd]. Pointers that a variant
 * lacks are NULL (their length 0). KV cache layout: [n_ctx][n_head_kv][head_dim], F32 or F16. Every size is
 * checked against the others on each call (integer checks only); returns QS_OK or a QS_ERR_* code. */
typedef struct {
    int n_embd, n_head, n_head_kv, head_dim, n_ff, rope_dim, rope_neox, gelu, kv_f16;
    int64_t n_ctx, window;
    float eps, rope_base, attn_scale;
    int wq_type, wk_type, wv_type, wo_type, wg_type, wu_type, wd_type;
    const uint8_t *wq, *wk, *wv, *wo, *wg, *wu, *wd;
    int64_t wq_bytes, wk_bytes, wv_bytes, wo_bytes, wg_bytes, wu_bytes, wd_bytes;
    const float *attn_norm, *ffn_norm, *bq, *bk, *bv, *q_norm, *k_norm, *post_attn_norm, *post_ffn_norm;
    int64_t attn_norm_len, ffn_norm_len, bq_len, bk_len, bv_len, q_norm_len, k_norm_len, post_attn_norm_len,
        post_ffn_norm_len;
    const float *rope_freqs; /* NULL or rope_dim/2 frequency divisors */
    int64_t rope_freqs_len;
    int no_rope; /* 1: this layer does not rotate q and k (smollm3's every fourth layer) */
    float attn_softcap; /* gemma2: scores soft-capped at this value (0: none) */
    float residual_scale; /* granite: the attention and FFN outputs are scaled by this before the add (0: 1) */
    float rope_mscale;    /* rotated values of q and k multiplied by this (LongRoPE/YaRN attn_factor; 0: 1) */
    float rope_freq_scale, rope_ext_factor, rope_corr0, rope_corr1; /* linear / YaRN scaling (freq_scale 0: 1) */
    float attn_temp_scale; /* mistral3 (Llama 4): q of position p times 1 + scale * ln(floor(p / floor) + 1) */
    int64_t attn_temp_floor;
    void *k_cache, *v_cache;
    int64_t k_cache_bytes, v_cache_bytes;
    /* gemma4 */
    int v_norm;    /* 1: V RMS-normalized per head without a weight */
    int kv_reuse;  /* 1: no k/v of its own: attend to the cache as written by an earlier layer (wk, wv unused) */
    float out_scale; /* the block's output x multiplied by this at the end (0: 1) */
    int ple_dim;   /* per-layer embedding: x += norm(proj(gelu(gate(x)) * ple_in)) after the FFN (0: none) */
    int wpg_type, wpp_type;
    const uint8_t *wpg, *wpp; /* gate ple_dim x n_embd, proj n_embd x ple_dim */
    int64_t wpg_bytes, wpp_bytes;
    const float *ple_post_norm; /* n_embd */
    int64_t ple_post_norm_len;
    const float *ple_in; /* [T][ple_dim] of this call (set per call) */
    int64_t ple_in_len;
    /* mixture of experts (Mixtral-style llama, qwen3moe): with n_expert > 0 the FFN is n_expert gated FFNs of
     * n_ff each, stored back to back in wg / wu (n_expert * n_ff rows) and wd (n_expert * n_embd rows). The router
     * wr (n_expert x n_embd) scores them; per token the n_expert_used largest softmax probabilities pick the
     * experts, their weights normalized to sum 1 (exp_norm) and multiplied by exp_scale (0: 1); the FFN output is
     * the weighted sum of the picked experts' outputs. */
    int n_expert, n_expert_used, exp_norm;
    float exp_scale;
    int wr_type;
    const uint8_t *wr;
    int64_t wr_bytes;
    /* gpt-oss: biases of the attention output (n_embd), the router (n_expert) and each expert's gate and up
     * (n_expert x n_ff, expert-major) and down (n_expert x n_embd); attention sinks (n_head logits, see
     * qs_attention_sinks); swiglu_oai 1: the clamped SwiGLU, g = min(g, 7), u = clamp(u, -7, 7),
     * out = g / (1 + e^(-1.702 g)) * (u + 1). NULL vectors: none. (gpt-oss's softmax over the picked router logits
     * is the normalized softmax above: e^l_i / sum over the picked e^l_j either way.) */
    const float *bo, *sinks, *br, *bg, *bu, *bd;
    int64_t bo_len, sinks_len, br_len, bg_len, bu_len, bd_len;
    int swiglu_oai;
    /* qwen35's attention layers: wq holds 2 x n_head x head_dim rows, each head's query then its output gate; the
     * attention output of each head is multiplied by sigmoid(gate) before wo */
    int q_gate;
    /* qwen35's gated delta-net layers (docs/engine.md, "Gated delta-net layers"): with gdn_conv > 0 the mixer
     * replaces attention. S = gdn_state (key and value head size), Hk / Hv key / value heads (Hv a multiple of Hk),
     * C = 2 Hk S + Hv S conv channels. wq is attn_qkv (C x n_embd), wo is ssm_out (n_embd x Hv S); wz attn_gate
     * (Hv S x n_embd), wbeta / walpha ssm_beta / ssm_alpha (Hv x n_embd); gdn_conv_w the depthwise conv kernel
     * [C][gdn_conv]; dt_bias, ssm_a (= -exp(A_log)) of Hv, ssm_norm of S. The session's state: conv_state
     * [gdn_conv - 1][C] (oldest first), ssm_state [Hv][S][S] (key index, then value index), both float32, updated
     * in place; zeros start a sequence. */
    int gdn_conv, gdn_state, gdn_k_heads, gdn_v_heads;
    int wz_type, wbeta_type, walpha_type;
    const uint8_t *wz, *wbeta, *walpha;
    int64_t wz_bytes, wbeta_bytes, walpha_bytes;
    const float *gdn_conv_w, *dt_bias, *ssm_a, *ssm_norm;
    int64_t gdn_conv_w_len, dt_bias_len, ssm_a_len, ssm_norm_len;
    float *conv_state, *ssm_state;
    int64_t conv_state_len, ssm_state_len;
    /* qwen35moe's shared expert (with experts only; n_ff_shexp 0: none): a SwiGLU FFN of n_ff_shexp (wsg, wsu
     * n_ff_shexp x n_embd, wsd n_embd x n_ff_shexp) on every token, its output times sigmoid(h . shexp_gate)
     * (shexp_gate: n_embd values) added to the experts' */
    int n_ff_shexp;
    int wsg_type, wsu_type, wsd_type;
    const uint8_t *wsg, *wsu, *wsd;
    int64_t wsg_bytes, wsu_bytes, wsd_bytes;
    const float *shexp_gate;
    int64_t shexp_gate_len;
    /* Activation statistics for importance matrices (docs/quantize.md, "Computing one"): NULL, or float sums of the
     * squares of a product's inputs, added to in place on prompts (T > 1), as llama-imatrix sums them. st_attn
     * (n_embd): the input of the attention's projections (q/k/v, or a delta-net layer's); st_wo (n_head *
     * head_dim): attn_output's; st_ffn (n_embd, or n_expert * n_embd for experts: each expert its rows): the
     * FFN's gate/up input; st_down (n_ff, or n_expert * n_ff): ffn_down's; st_exp_count (n_expert): rows routed
     * to each expert. The *_len fields are checked against those sizes. */
    float *st_attn, *st_wo, *st_ffn, *st_down;
    int64_t st_attn_len, st_wo_len, st_ffn_len, st_down_len;
    int64_t *st_exp_count;
    int64_t st_exp_count_len;
    /* The probe (docs/probe.md): NULL, or room for the call's queries as the attention uses them ([T][n_head]
     * [head_dim], after biases, norms, RoPE and temperature scaling); probe_q_len must be at least that
     * (QS_ERR_SIZE). Not written by delta-net layers. */
    float *probe_q;
    int64_t probe_q_len;
} qs_block;
int qs_block_forward(const qs_block *b, float *x, int64_t n_tokens, const int32_t *pos, int64_t n_past,
                     int n_threads);
/* One token of one gated delta-net head, as qs_block_forward runs it (k and q already normalized): st [S key][S
 * value] <- st * decay; d = beta (v - st^T k); st += k d^T; o = st^T q. QS_ERR_SIZE unless 0 < S <= 1024. */
int qs_gdn_step(int64_t S, float *st, const float *k, const float *q, const float *v, float decay, float beta,
                float *o);
