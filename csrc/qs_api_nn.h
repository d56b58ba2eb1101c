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
/* LayerNorm of each row of n: (x - mean) / sqrt(var + eps) * w + b (statistics in double, as ggml_norm; w, b NULL:
 * 1 and 0); y may alias x. GELU in its tanh form (ggml_gelu), no gate; out may alias x. */
void qs_layernorm(const float *x, const float *w, const float *b, float *y, int64_t n_rows, int64_t n, float eps);
void qs_gelu_tanh(const float *x, float *out, int64_t n);
/* gpt-oss's clamped SwiGLU (qs_block's swiglu_oai); out may alias gate or up. */
void qs_swiglu_oai(const float *gate, const float *up, float *out, int64_t n);
/* KV cache element types, ggml's type ids (llama.cpp's --cache-type-k/-v): F32, F16, BF16, and Q8_0 / Q4_0 stored as
 * ggml blocks of 32 along head_dim (one row of head_dim / 32 blocks per position and KV head; head_dim % 32 == 0).
 * A row is written quantized by ggml's reference rounding (quantize_row_q8_0_ref / q4_0_ref) when it enters the
 * cache; attention reads the blocks directly (the query quantized to Q8_0 / BF16 for the K dots, V rows added
 * block by block), never a dequantized copy. */
enum { QS_KV_F32 = 0, QS_KV_F16 = 1, QS_KV_Q4_0 = 2, QS_KV_Q8_0 = 8, QS_KV_BF16 = 30 };
/* Bytes of one cache row (head_dim elements of `type`); -1 for an unknown type or a head_dim it cannot hold. */
int64_t qs_kv_row_bytes(int type, int head_dim);
/* n_rows rows of head_dim floats from src into cache rows row0.. of `type` (the rounding the cache applies). */
int qs_kv_store(void *cache, int type, int64_t row0, const float *src, int64_t n_rows, int head_dim);
/* Cache rows row0.. of `type` back to floats (tests and the probe's numpy twin). */
int qs_kv_load(const void *cache, int type, int64_t row0, float *dst, int64_t n_rows, int head_dim);
/* x (n values, n % nrot == 0) times the orthonormal Walsh-Hadamard matrix of order nrot (a power of two, Sylvester's
 * order, llama.cpp's ggml_gen_hadamard), each run of nrot values in turn; the matrix is its own inverse. QS_OK, or
 * QS_ERR_SIZE for a bad nrot or n. */
int qs_hadamard(float *x, int64_t n, int nrot);
/* The rotation llama.cpp gives a quantized cache's rows (attn_rot_k / attn_rot_v): the order of the Walsh-Hadamard
 * runs of a head of head_dim in a cache of `type`, 0 for none (F32, F16, BF16, or head_dim not a multiple of 64).
 * is_k: K's runs (the largest power of two dividing head_dim), else V's (64). qs_block_forward rotates q and k by
 * K's, v by V's and the attention output back by V's, so the scores and outputs are the unrotated ones while the
 * quantized blocks see the rotated values (outliers spread over a run). */
int qs_kv_rotation(int type, int head_dim, int is_k);
/* Caches hold n_ctx positions; the first n_kv (<= n_ctx) are valid. Query positions must be >= 0. kv_type: the
 * QS_KV_* type of both caches (0 and 1 are F32 and F16, as the flag this once was). Softmax online over tiles of
 * the cache (flash attention's running maximum and sum): no buffer grows with the context. */
int qs_attention(const float *q, int64_t n_q, const int32_t *q_pos, int n_heads, int head_dim,
                 const void *k_cache, const void *v_cache, int kv_type, int n_kv_heads, int64_t n_kv, int64_t n_ctx,
                 int64_t window, float scale, float *out, int n_threads);
/* The same with gemma2's soft-capping of the scaled scores, s -> softcap * tanh(s / softcap) (0: none; negative or
 * non-finite: QS_ERR_SIZE). */
int qs_attention_softcap(const float *q, int64_t n_q, const int32_t *q_pos, int n_heads, int head_dim,
                         const void *k_cache, const void *v_cache, int kv_type, int n_kv_heads, int64_t n_kv,
                         int64_t n_ctx, int64_t window, float scale, float softcap, float *out, int n_threads);
/* The same with gpt-oss's attention sinks: sinks (NULL: none) holds one logit per query head that joins each
 * softmax's denominator, unscaled and never masked, with no value row: p_j = e^(s_j - M) / (sum_i e^(s_i - M) +
 * e^(sink - M)), M the larger of the scores' maximum and the sink. A non-finite sink is QS_ERR_SIZE. */
int qs_attention_sinks(const float *q, int64_t n_q, const int32_t *q_pos, int n_heads, int head_dim,
                       const void *k_cache, const void *v_cache, int kv_type, int n_kv_heads, int64_t n_kv,
                       int64_t n_ctx, int64_t window, float scale, float softcap, const float *sinks, float *out,
                       int n_threads);
/* The same with K and V of their own types (QS_KV_*). */
int qs_attention_kv(const float *q, int64_t n_q, const int32_t *q_pos, int n_heads, int head_dim,
                    const void *k_cache, const void *v_cache, int k_type, int v_type, int n_kv_heads, int64_t n_kv,
                    int64_t n_ctx, int64_t window, float scale, float softcap, const float *sinks, float *out,
                    int n_threads);
/* The probe's attention weights (docs/probe.md): what qs_attention_sinks gives each key, computed by the same code,
 * written to probs [n_q][n_heads][n_kv] (0 outside the causal window) instead of attending to V. k_cache_bytes is
 * the cache's length (QS_ERR_CACHE when short of n_ctx rows), probs_len probs' (QS_ERR_SIZE when short). */
int qs_attention_probs(const float *q, int64_t n_q, const int32_t *q_pos, int n_heads, int head_dim,
                       const void *k_cache, int64_t k_cache_bytes, int k_type, int n_kv_heads, int64_t n_kv,
                       int64_t n_ctx, int64_t window, float scale, float softcap, const float *sinks, float *probs,
                       int64_t probs_len, int n_threads);
/* ALiBi attention of an encoder (jina-bert-v2; llama.cpp's ggml_soft_max_ext with max_bias over a mask of
 * -|p_q - p_k|): every query attends to all n_kv keys of a cache [n_kv][n_kv_heads][head_dim] (key j at
 * position j), score scale * q.k - slope_h * |q_pos - j|, with head h's slope as ggml's: n2 the largest power of
 * two <= n_heads, m0 = 2^(-max_bias / n2), m1 = 2^(-max_bias / 2 / n2), slope_h = m0^(h + 1) below n2, else
 * m1^(2 (h - n2) + 1) (qs_alibi_slope; max_bias 0: 1). F32 or F16 (kv_f16) cache; a scalar loop, threads over
 * (query, head). */
float qs_alibi_slope(int n_heads, int head, float max_bias);
/* ggml's CPU GELU (GGML_GELU_FP16): y = fp16(gelu(fp16(x))), the tanh form as ggml_gelu_f32 writes it; 0 for
 * x <= -10, x for x >= 10; the GEGLU form multiplies that by up in float. out may alias x / gate / up. */
void qs_gelu_f16(const float *x, float *out, int64_t n);
void qs_geglu_f16(const float *gate, const float *up, float *out, int64_t n);
int qs_attention_alibi(const float *q, int64_t n_q, const int32_t *q_pos, int n_heads, int head_dim,
                       const void *k_cache, const void *v_cache, int kv_f16, int n_kv_heads, int64_t n_kv,
                       float scale, float max_bias, float *out, int n_threads);

/* One layer's forward description (docs/engine.md, "The forward description"): Python decides every per-layer
 * policy once (window, RoPE, soft-caps, multipliers, which optional vectors exist, routing, delta-net sizes) and
 * hands the block this structure, grouped by what reads it. A weight is {ptr, type, bytes, rows, k}: rows x k
 * values of ggml type `type` (possibly repacked) in `bytes` bytes; a vector is {ptr, len} (NULL, 0: absent). A
 * zero-filled group is "this layer has none". qs_block_forward checks every size against the others on each call
 * (integer checks only) and returns QS_OK or a QS_ERR_* code before writing anything. */
typedef struct {
    const uint8_t *ptr;
    int type;
    int64_t bytes, rows, k;
} qs_weight;
typedef struct {
    const float *ptr;
    int64_t len;
} qs_vec;
/* Attention (unused by a delta-net layer). KV cache layout: [n_ctx][n_head_kv][row of head_dim elements of k_type /
 * v_type (QS_KV_*)]. */
typedef struct {
    int n_head, n_head_kv, head_dim;
    qs_weight wq, wk, wv, wo; /* wq: 2 x n_head x head_dim rows with q_gate (each head's query, then its gate) */
    qs_vec bq, bk, bv, bo;    /* biases of q, k, v (all or none) and of the output (gpt-oss) */
    qs_vec q_norm, k_norm;    /* RMSNorm weights of q and k: per head (head_dim) or, with qk_norm_full, over the
                               * whole projection (n_head x head_dim, n_head_kv x head_dim: olmo2) */
    qs_vec sinks;             /* gpt-oss: one logit per query head joining each softmax (qs_attention_sinks) */
    int qk_norm_full;
    int q_gate;   /* 1: each head's output times sigmoid(its gate) before wo (qwen35) */
    int kv_reuse; /* 1: no k/v of its own: attends to the cache as written by an earlier layer (wk, wv unused) */
    int v_norm;   /* 1: V RMS-normalized per head without a weight (gemma4) */
    int64_t window;        /* sliding window (0: all positions) */
    float scale, softcap;  /* score scale; scores soft-capped at softcap (gemma2; 0: none) */
    float temp_scale;      /* Llama 4 / mistral3: q of position p times 1 + temp_scale * ln(floor(p / floor) + 1) */
    int64_t temp_floor;
    int k_type, v_type; /* QS_KV_* (all zero: F32) */
    int64_t n_ctx;
    void *k_cache, *v_cache;
    int64_t k_cache_bytes, v_cache_bytes;
    int non_causal; /* 1: every query attends to every cached key (encoders); a window: those within window/2 */
    /* non_causal only: NULL (the rows are one input), or n_seg lengths (each > 0) summing to the call's rows: the
     * rows are n_seg inputs back to back, each attending to its own keys only (a batch of embedding inputs;
     * n_past 0, the cache holds the call's rows; no window) */
    const int32_t *seg_len;
    int64_t n_seg;
    float alibi_max_bias; /* > 0: ALiBi with this max_bias (jina-bert-v2; qs_attention_alibi): non-causal, no sinks or
                           * soft-cap */
} qs_attn_desc;
/* RoPE of q and k (ggml_rope_ext, see qs_rope_ext): skip 1 leaves this layer unrotated (smollm3's NoPE layers) */
typedef struct {
    int skip, dim, neox;
    float base, freq_scale, ext_factor, corr0, corr1, mscale; /* freq_scale / mscale 0: 1 */
    qs_vec freqs; /* NULL or dim/2 frequency divisors (rope_freqs, LongRoPE's long or short factors) */
} qs_rope_desc;
/* The gated FFN; with experts, gate / up hold n_expert matrices of n_ff rows back to back, down n_expert of
 * n_embd. gelu: GELU-tanh gating, swiglu_oai: gpt-oss's clamped SwiGLU, g = min(g, 7), u = clamp(u, -7, 7),
 * out = g / (1 + e^(-1.702 g)) * (u + 1); else SwiGLU. */
typedef struct {
    int n_ff, gelu, swiglu_oai;
    qs_weight gate, up, down;
    int plain;            /* 1: no gate (BERT): out = down(GELU-tanh(up(x) + b_up)) + b_down; gate unused */
    qs_vec b_up, b_down;  /* biases of up (n_ff) and down (n_embd): absent, or on a dense FFN (BERT, jina-bert-v2) */
    int gelu_f16;         /* 1: GELU as ggml's CPU table over F16 inputs (qs_gelu_f16, qs_geglu_f16): the encoders */
} qs_ffn_desc;
/* Mixture of experts (n_expert 0: a dense FFN). The router (n_expert x n_embd, + b_router) scores them; per token
 * the n_used largest softmax probabilities pick the experts, their weights normalized to sum 1 (norm) and times
 * scale (0: 1); the FFN output is the weighted sum of the picked experts'. b_gate / b_up (n_expert x n_ff,
 * expert-major), b_down (n_expert x n_embd): gpt-oss's expert biases. A shared expert (qwen35moe; n_ff_shexp 0:
 * none): a SwiGLU FFN of n_ff_shexp (sh_gate, sh_up n_ff_shexp x n_embd, sh_down n_embd x n_ff_shexp) on every
 * token, its output times sigmoid(h . sh_gate_inp) added. */
typedef struct {
    int n_expert, n_used, norm;
    float scale;
    qs_weight router;
    qs_vec b_router, b_gate, b_up, b_down;
    int n_ff_shexp;
    qs_weight sh_gate, sh_up, sh_down;
    qs_vec sh_gate_inp;
} qs_moe_desc;
/* qwen35's gated delta-net (docs/engine.md, "Gated delta-net layers"): with conv > 0 it replaces attention.
 * S = state (key and value head size), Hk / Hv key / value heads (Hv a multiple of Hk), C = 2 Hk S + Hv S conv
 * channels. qkv: attn_qkv (C x n_embd), out: ssm_out (n_embd x Hv S), z: attn_gate (Hv S x n_embd), beta / alpha:
 * ssm_beta / ssm_alpha (Hv x n_embd); conv_w the depthwise conv kernel [C][conv]; dt_bias, a (= -exp(A_log)) of
 * Hv, norm of S. The session's state: conv_state [conv - 1][C] (oldest first), ssm_state [Hv][S][S] (key index,
 * then value index), float32, updated in place; zeros start a sequence. */
typedef struct {
    int conv, state, k_heads, v_heads;
    qs_weight qkv, z, beta, alpha, out;
    qs_vec conv_w, dt_bias, a, norm;
    float *conv_state, *ssm_state;
    int64_t conv_state_len, ssm_state_len;
} qs_gdn_desc;
/* gemma4's per-layer embedding (dim 0: none): x += post_norm(proj(gelu(gate(x)) * inputs)) after the FFN; gate
 * is dim x n_embd, proj n_embd x dim; inputs: [T][dim] of this call (set per call). */
typedef struct {
    int dim;
    qs_weight gate, proj;
    qs_vec post_norm;
    const float *inputs;
    int64_t inputs_len;
} qs_ple_desc;
/* What the block hands back when asked (NULL: nothing). Importance-matrix statistics (docs/quantize.md,
 * "Computing one"): float sums of the squares of a product's inputs, added to in place on prompts (T > 1), as
 * llama-imatrix sums them: attn (n_embd) the attention's (or delta-net's) projections' input, wo (n_head x
 * head_dim) attn_output's, ffn (n_embd, or n_expert x n_embd) the FFN's gate/up input, down (n_ff, or n_expert x
 * n_ff) ffn_down's, exp_count (n_expert) rows routed to each expert. The probe (docs/probe.md): q, room for the
 * call's queries as the attention uses them ([T][n_head][head_dim], after biases, norms, RoPE and temperature
 * scaling; q_len at least that, else QS_ERR_SIZE; not written by delta-net layers). */
typedef struct {
    float *attn, *wo, *ffn, *down;
    int64_t attn_len, wo_len, ffn_len, down_len;
    int64_t *exp_count;
    int64_t exp_count_len;
    float *q;
    int64_t q_len;
} qs_probe_desc;
/* One layer, in place on x [T][n_embd]: norm, attention (or the delta-net), post norm, residual (times
 * residual_scale, 0: 1), norm, FFN (or experts), post norm, residual, per-layer embedding, x times out_scale
 * (0: 1). NULL norms: none (olmo2's pre-norms). */
typedef struct {
    int n_embd;
    float eps, residual_scale, out_scale;
    qs_vec attn_norm, post_attn_norm, ffn_norm, post_ffn_norm;
    qs_attn_desc attn;
    qs_rope_desc rope;
    qs_ffn_desc ffn;
    qs_moe_desc moe;
    qs_gdn_desc gdn;
    qs_ple_desc ple;
    qs_probe_desc probe;
    int post_ln; /* 1: BERT's residuals, x = LayerNorm(x + o) by post_attn_norm / post_ffn_norm with their biases */
    qs_vec post_attn_norm_b, post_ffn_norm_b;
} qs_block;
/* The layer as a plan (docs/engine.md, "The layer as a plan"): qs_block_plan turns one layer's description into
 * the ordered steps of its forward pass, and every backend walks that list, implementing each step kind once
 * (qs_block_forward here, the CUDA backend's enqueue_forward and its host emulation). Steps name what they read
 * and write by role: buffers (QS_BUF_*: per-token rows the backend owns), weights (QS_W_*) and vectors (QS_V_*)
 * of the description. The per-layer policy the plan resolves (residual and output scales, 0 meaning 1) is
 * resolved there only. Returns the number of steps, or QS_ERR_SIZE when max_steps is too small. */
enum {
    QS_STEP_NORM = 1,    /* dst = RMSNorm(src) by vec (QS_V_NONE: a copy) */
    QS_STEP_TAP,         /* a probe point (arg: QS_TAP_*) reads src: statistics, traces */
    QS_STEP_PROJ,        /* n (1..3) products of src: out[i] = src w[i]^T + bias[i] */
    QS_STEP_QGATE_SPLIT, /* qwen35: QG [T][H][query | gate] -> Q (queries, + bias[0]) and GATE */
    QS_STEP_QK_POST,     /* q/k norms, RoPE, V norm, temperature tuning, K and V into the cache */
    QS_STEP_ATTEND,      /* ATT = attention of Q over the cache (window, soft-cap, sinks) */
    QS_STEP_QGATE,       /* ATT *= sigmoid(GATE) */
    QS_STEP_GDN,         /* the gated delta-net mixer: O from H */
    QS_STEP_RESIDUAL,    /* X += scale * RMSNorm(src) by vec (QS_V_NONE: src itself); arg QS_RES_POST_LN:
                            X = LayerNorm(X + scale * src) by vec, bias[0] (BERT) */
    QS_STEP_GLU,         /* dst = act(src) * src2 (arg: QS_GLU_*; QS_GLU_GELU_PLAIN: dst = GELU(src)) */
    QS_STEP_MOE,         /* routed experts (and the shared expert): O from H */
    QS_STEP_SCALE,       /* X *= scale */
    QS_STEP_KINDS
};
enum {
    QS_BUF_X = 0, QS_BUF_H, QS_BUF_Q, QS_BUF_QG, QS_BUF_GATE, QS_BUF_K, QS_BUF_V, QS_BUF_ATT, QS_BUF_O, QS_BUF_G,
    QS_BUF_U, QS_BUF_A, QS_BUF_PG, QS_BUF_PA, QS_BUF_PLE_IN, QS_BUFS
};
enum {
    QS_W_NONE = 0, QS_W_WQ, QS_W_WK, QS_W_WV, QS_W_WO, QS_W_GATE, QS_W_UP, QS_W_DOWN, QS_W_PLE_GATE, QS_W_PLE_PROJ,
    QS_WEIGHTS
};
enum {
    QS_V_NONE = 0, QS_V_ATTN_NORM, QS_V_POST_ATTN_NORM, QS_V_FFN_NORM, QS_V_POST_FFN_NORM, QS_V_PLE_POST_NORM,
    QS_V_BQ, QS_V_BK, QS_V_BV, QS_V_BO, QS_V_BUP, QS_V_BDOWN, QS_V_POST_ATTN_NORM_B, QS_V_POST_FFN_NORM_B, QS_VECS
};
enum { QS_TAP_ATTN_IN = 0, QS_TAP_Q, QS_TAP_WO_IN, QS_TAP_FFN_IN, QS_TAP_DOWN_IN };
enum { QS_GLU_SILU = 0, QS_GLU_GELU, QS_GLU_OAI, QS_GLU_GELU_PLAIN };
enum { QS_RES_ADD = 0, QS_RES_POST_LN };
enum { QS_PLAN_MAX = 32 };
typedef struct {
    int kind;
    int src, src2, dst; /* QS_BUF_* */
    int n;              /* QS_STEP_PROJ: products */
    int w[3], out[3], bias[3];
    int vec;     /* QS_STEP_NORM, QS_STEP_RESIDUAL: the norm's weights */
    int arg;     /* QS_STEP_TAP: QS_TAP_*; QS_STEP_GLU: QS_GLU_* */
    float scale; /* QS_STEP_RESIDUAL, QS_STEP_SCALE (never 0) */
} qs_step;
int qs_block_plan(const qs_block *b, qs_step *steps, int max_steps);
int qs_block_forward(const qs_block *b, float *x, int64_t n_tokens, const int32_t *pos, int64_t n_past,
                     int n_threads);
/* One decode step of n_seqs sequences at once (a server's parallel slots): row t of x [n_seqs][n_embd] is the next
 * token of sequence t, at position pos[t] after n_pasts[t] cached tokens, and seqs[t] is this layer for sequence t
 * (the same weights, its own KV cache). The products run on all rows together (the prefill GEMM); each row's K/V
 * go to its own cache, and it attends to its own cache only. Attention layers only: QS_ERR_SIZE for a delta-net
 * layer, a probe or statistics, or sequences whose layers differ; QS_ERR_CACHE for two rows sharing a cache. */
int qs_block_forward_seqs(const qs_block *const *seqs, float *x, int64_t n_seqs, const int32_t *pos,
                          const int64_t *n_pasts, int n_threads);
/* One token of one gated delta-net head, as qs_block_forward runs it (k and q already normalized): st [S key][S
 * value] <- st * decay; d = beta (v - st^T k); st += k d^T; o = st^T q. QS_ERR_SIZE unless 0 < S <= 1024. */
int qs_gdn_step(int64_t S, float *st, const float *k, const float *q, const float *v, float decay, float beta,
                float *o);
