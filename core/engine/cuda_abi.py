"""The CUDA library's ABI as cffi declarations: csrc/qs_api_nn.h (the forward description the CPU block reads)
followed by csrc/cuda/qsc_api.h, their preprocessor lines dropped, as csrc/build_ffi.py's ``_cdef`` reads the CPU
headers.

:data:`CDEF` is generated from those headers and committed, so that a wheel or a frozen app (which carry no
headers) declares exactly what the library was built from; ``python -m quantscope.core.engine.cuda_abi``
regenerates it after a header changes, and tests/test_cuda.py fails until it is regenerated.
"""

from __future__ import annotations

import sys
from pathlib import Path

#: the headers, in declaration order, relative to the source tree's root
HEADERS = ("csrc/qs_api_nn.h", "csrc/cuda/qsc_api.h")
_MARK = "CDEF = r'''"


def from_headers(root: Path) -> str:
    """The declarations of :data:`HEADERS` under ``root``, preprocessor lines dropped."""
    parts = []
    for rel in HEADERS:
        lines = (root / rel).read_text(encoding="utf-8").splitlines()
        parts.append("\n".join(ln for ln in lines if not ln.lstrip().startswith("#")))
    return "\n".join(parts) + "\n"


def _write(root: Path) -> bool:
    """Rewrite this module's :data:`CDEF` from the headers; True when it changed."""
    text = from_headers(root)
    if "'''" in text or "\\" in text:
        raise ValueError("a header holds ''' or a backslash; the generated literal cannot carry it")
    me = Path(__file__)
    src = me.read_text(encoding="utf-8")
    head = src[:src.rindex(_MARK) + len(_MARK)]
    new = f"{head}{text}'''\n"
    if new == src:
        return False
    me.write_text(new, encoding="utf-8")
    return True


if __name__ == "__main__":  # pragma: no cover - a developer's tool
    changed = _write(Path(__file__).resolve().parents[2])
    print("cuda_abi: CDEF regenerated" if changed else "cuda_abi: CDEF is up to date", file=sys.stderr)

# ---- generated from HEADERS: do not edit below this line
CDEF = r'''/* Quantscope native API: float kernels of the inference engine (cffi cdef: declarations only). */

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
/* Quantscope CUDA backend: the plain C API loaded with cffi's ffi.dlopen. core/engine/cuda_abi.py's CDEF is
 * generated from this file and qs_api_nn.h (python -m quantscope.core.engine.cuda_abi; tests/test_cuda.py fails
 * until it is regenerated). Declarations only, no preprocessor lines (cffi parses this text as it is).
 *
 * Conventions: functions return 0 on success and a negative number on failure, writing a one-line reason into
 * err[err_len] when err is not NULL. Type ids are ggml's. Sizes are validated by the Python wrappers first; the
 * C side checks them again and refuses (never trusts) a size that does not add up.
 *
 * The model is the same forward description the CPU block reads (csrc/qs_api_nn.h, declared before this file):
 * one qs_block per layer (weights {ptr, type, bytes, rows, k}, vectors {ptr, len}, grouped into attn, rope, ffn,
 * moe, gdn, ple, probe) and the model-level part below. Python decides every policy once; the device derives
 * none. qsc_check_model refuses (host only, before any device call) a description whose sizes, types or byte
 * counts do not add up, a missing group, and every feature the device code lacks, naming it.
 */

/* The model-level part of the forward description: the embedding, the head and their scales. output
 * zero-filled (ptr NULL, rows 0): tied to tok_embd (no second copy). eps: the final norm's. kv_source: NULL, or
 * n_layers entries, the layer whose KV cache each layer attends to (itself; for a layer with attn.kv_reuse, an
 * earlier layer with a cache of its own and the same KV heads and head size: gemma4's shared layers). */
typedef struct {
    int n_layers, n_vocab;
    float eps, embed_scale, final_softcap, logit_scale; /* final_softcap 0: none; logit_scale 0 or 1: none */
    qs_weight tok_embd, output;
    qs_vec output_norm;
    const int32_t *kv_source;
} qsc_model_desc;

typedef struct {
    char name[256];
    int major, minor, sm_count;
    int64_t total_mem, free_mem;
    int mem_clock_khz, bus_width_bits;
    double peak_bw_gbs;                 /* 2 (DDR) x memory clock x bus width */
    int driver_version, runtime_version;
} qsc_device_props;

typedef struct qsc_model qsc_model;

/* ---- library and device */
const char *qsc_build_info(void);                       /* CUDA version and the archs compiled in */
int qsc_init(char *err, size_t err_len);                /* 0 = usable device; else the cudaError_t code (> 0) */
int qsc_device_props_get(qsc_device_props *out, char *err, size_t err_len);
int qsc_device_info(char *buf, size_t len);             /* one human line, e.g. "NVIDIA H100 (sm_90, 132 SMs...)" */

/* ---- weight formats */
int qsc_type_supported(int type); /* 1: kernels run on this type as stored (its row in qsc_types.cuh's QSC_TYPE_LIST,
                                   * the one list of the device's types); 0: dequantized to F32 on upload */
int64_t qsc_packed_bytes(int type, int64_t rows, int64_t k);   /* device bytes after repacking; < 0 unsupported */
int qsc_repack(int type, const uint8_t *src, int64_t rows, int64_t k, uint8_t *dst, int64_t dst_bytes);
int qsc_check_model(const qsc_model_desc *md, const qs_block *layers, char *err, size_t err_len); /* 0: usable */

/* ---- model: weights uploaded once, a GPU-resident KV cache, the whole forward pass on the device.
 * qsc_model_create checks the description (qsc_check_model), uploads every weight of it (the host memory it
 * points to is read during the call only) and allocates the cache and the scratch. */
qsc_model *qsc_model_create(const qsc_model_desc *md, const qs_block *layers, int n_ctx, int kv_f16, int max_batch,
                             char *err, size_t err_len);
int qsc_forward(qsc_model *m, const int32_t *tokens, int n_tokens, int n_past, int all_logits, float *logits,
                char *err, size_t err_len);             /* logits: n_vocab floats, or n_tokens x n_vocab */
int qsc_set_graphs(qsc_model *m, int enabled);          /* CUDA graph for one-token steps (default on) */
int64_t qsc_model_device_bytes(qsc_model *m);
/* The debug mode: QUANTSCOPE_CUDA_DEBUG=1 in the environment when the model is made (read once) has every launch of
 * its forward followed by a stream synchronize and an error check; the first fault, one line naming the kernel,
 * its grid, block and main sizes, is kept on the model and is the error of that forward and of every later one.
 * qsc_model_debug: 1 when m runs so, else 0. qsc_debug_message: that line for the given parts (tests; no GPU).
 * qsc_debug_selftest (GPU): a launch the device refuses (2048 threads a block: nothing runs and the context stays
 * usable) checked as the debug mode checks; 0 and its line in err when the check named it. */
int qsc_model_debug(qsc_model *m);
int qsc_debug_message(const char *kernel, int gx, int gy, int gz, int bx, int by, int bz, const char *sizes,
                      const char *error, char *out, size_t len);
int qsc_debug_selftest(char *err, size_t err_len);
void qsc_model_free(qsc_model *m);

/* ---- single device kernels on host arrays (tests) */
int qsc_kernel_matmat(int type, const uint8_t *w, int64_t rows, int64_t k, const float *x, int n_x, float *y,
                      char *err, size_t err_len);
int qsc_kernel_quantize(int act_type, const float *x, int64_t n, uint8_t *out, char *err, size_t err_len);
int qsc_kernel_get_rows(int type, const uint8_t *w, int64_t rows, int64_t k, const int32_t *ids, int n_ids,
                        float scale, float *out, char *err, size_t err_len);
int qsc_kernel_rmsnorm(const float *x, const float *w, float *y, int n_rows, int n, float eps, char *err,
                       size_t err_len);
int qsc_kernel_rope(float *x, int n_tokens, int n_heads, int head_dim, int rot_dim, const int32_t *pos,
                    float freq_base, int neox, char *err, size_t err_len);
int qsc_kernel_glu(const float *gate, const float *up, float *out, int n_rows, int n, int mode, char *err,
                   size_t err_len);
int qsc_kernel_attention(const float *q, int n_q, const int32_t *q_pos, int n_heads, int head_dim,
                         const void *k_cache, const void *v_cache, int kv_f16, int n_kv_heads, int n_kv,
                         int window, float scale, float *out, char *err, size_t err_len);

/* ---- the device's per-block math compiled for the host (no GPU needed): repack + decode + int8 dots */
int qsc_host_dequantize(int type, const uint8_t *w, int64_t rows, int64_t k, float *out);
int qsc_host_quantize(int act_type, const float *x, int64_t n, uint8_t *out);
int qsc_host_matmat(int type, const uint8_t *w, int64_t rows, int64_t k, const float *x, int n_x, float *y);

/* ---- mixture of experts (qsc_moe.cuh): the device's routing compiled for the host (sel, w: n_tokens x n_used), and
 * one layer's moe FFN of h [n_tokens][n_embd] into out through the forward's own launches (enqueue_moe on a one-layer
 * model): the host twins (no GPU needed) or the device */
int qsc_host_moe_route(const float *logits, int n_tokens, int n_expert, int n_used, int norm, float scale,
                       int32_t *sel, float *w);
int qsc_host_moe_ffn(const qs_block *b, const float *h, int n_tokens, float *out, char *err, size_t err_len);
int qsc_kernel_moe_ffn(const qs_block *b, const float *h, int n_tokens, float *out, char *err, size_t err_len);
/* the routing sel [n_tokens][n_used] grouped by expert as the forward groups it (k_moe_group / its host twin):
 * pairs, trow [n_tokens * n_used], off [n_expert + 1], tiles [3 * n_tokens * n_used] ((expert, first row, rows) of
 * `tile` rows at most), n_tiles [1] */
int qsc_host_moe_group(const int32_t *sel, int n_tokens, int n_used, int n_expert, int tile, int32_t *pairs,
                       int32_t *trow, int32_t *off, int32_t *tiles, int32_t *n_tiles, char *err, size_t err_len);
int qsc_kernel_moe_group(const int32_t *sel, int n_tokens, int n_used, int n_expert, int tile, int32_t *pairs,
                         int32_t *trow, int32_t *off, int32_t *tiles, int32_t *n_tiles, char *err, size_t err_len);

/* ---- the probes (qsc_probe.cuh): copies back only when asked for */
int qsc_probe_trace(qsc_model *m, float *resid, float *queries, int64_t n_tokens, char *err, size_t err_len);
int qsc_stats_enable(qsc_model *m, const float *init, int64_t n, char *err, size_t err_len);
int qsc_stats_read(qsc_model *m, float *out, int64_t n, char *err, size_t err_len);
int qsc_head(qsc_model *m, const float *x, int n_rows, float *logits, char *err, size_t err_len);
int qsc_read_cache(qsc_model *m, int layer, int which, int n_rows, void *out, int64_t out_bytes, char *err,
                   size_t err_len);
int qsc_host_probe_sumsq(float *acc, const float *x, int64_t T, int64_t n);

/* ---- the dense architecture features (tests/test_cuda_features.py): each on the device (qsc_kernel_*) and its
 * per-element math (qsc_arch.cuh) run on the host the way the kernel runs it (qsc_host_*). glu mode: 0 SwiGLU,
 * 1 GELU-tanh, 2 gpt-oss's clamped SwiGLU. qk_post: the q/k RMSNorms (both or neither; per head, or qk_full over
 * the whole projection), RoPE as the description's qs_rope_desc says (NoPE, scaling, factors), the query
 * temperature, in place (k NULL: queries only). attention: scores scaled, soft-capped (0: none), with one sink per
 * query head (NULL: none), any head size up to 1024. logits: divided by logit_scale (0 or 1: none), then
 * soft-capped (0: none). residual: x = (x + rs * [RMSNorm](o) * post_w) * out_scale, post_w NULL: o as it is. */
int qsc_kernel_attention_ext(const float *q, int n_q, const int32_t *q_pos, int n_heads, int head_dim,
                             const void *k_cache, const void *v_cache, int kv_f16, int n_kv_heads, int n_kv,
                             int window, float scale, float softcap, const float *sinks, float *out, char *err,
                             size_t err_len);
/* flash-decoding (qsc_decode.cuh): decode attention of n_q <= 15 tokens with the keys split across blocks and the
 * partials merged, as the forward runs it for T <= 15 (arguments as qsc_kernel_attention_ext; head sizes whose rows
 * are whole 16-byte chunks: a multiple of 8 for an F16 cache, of 4 for F32). n_split: the splits (1..128), or <= 0
 * for the forward's choice with n_kv as the context size (the host twin counts 132 SMs). Returns the split count
 * used (> 0), or < 0 refused. The host twin runs the kernels' blocks, partials and merge on the CPU. */
int qsc_kernel_flashdec(const float *q, int n_q, const int32_t *q_pos, int n_heads, int head_dim,
                        const void *k_cache, const void *v_cache, int kv_f16, int n_kv_heads, int n_kv, int window,
                        float scale, float softcap, const float *sinks, int n_split, float *out, char *err,
                        size_t err_len);
int qsc_host_flashdec(const float *q, int n_q, const int32_t *q_pos, int n_heads, int head_dim, const void *k_cache,
                      const void *v_cache, int kv_f16, int n_kv_heads, int n_kv, int window, float scale, float softcap,
                      const float *sinks, int n_split, float *out);
int qsc_kernel_qk_post(float *q, float *k, int n_tokens, int n_head, int n_head_kv, int head_dim,
                       const float *q_norm, const float *k_norm, int qk_full, float eps, const int32_t *pos,
                       const qs_rope_desc *rope, float temp_scale, int64_t temp_floor, char *err, size_t err_len);
int qsc_kernel_logits(float *x, int64_t n, float logit_scale, float softcap, char *err, size_t err_len);
int qsc_host_attention(const float *q, int n_q, const int32_t *q_pos, int n_heads, int head_dim,
                       const void *k_cache, const void *v_cache, int kv_f16, int n_kv_heads, int n_kv, int window,
                       float scale, float softcap, const float *sinks, float *out);
int qsc_host_qk_post(float *q, float *k, int n_tokens, int n_head, int n_head_kv, int head_dim, const float *q_norm,
                     const float *k_norm, int qk_full, float eps, const int32_t *pos, const qs_rope_desc *rope,
                     float temp_scale, int64_t temp_floor);
int qsc_host_glu(const float *gate, const float *up, float *out, int64_t n, int mode);
int qsc_host_logits(float *x, int64_t n, float logit_scale, float softcap);
int qsc_host_residual(float *x, const float *o, const float *post_w, int n_rows, int n, float eps, float rs,
                      float out_scale);
/* The device's forward pass run on the host (tests, machines without a GPU): a model like qsc_model_create's, its
 * buffers in host memory and each kernel replaced by its host twin (qsc_emul.cuh); qsc_forward, qsc_set_graphs,
 * qsc_model_device_bytes and qsc_model_free take it. Needs no GPU, driver or CUDA call. */
/* qsc_forward for a model with per-layer embeddings (gemma4: the layers' ple.dim P > 0): ple holds the call's
 * per-layer inputs [n_tokens][n_layers][P] (ple_len floats, exactly that many); qsc_forward refuses such a model. */
int qsc_forward_ple(qsc_model *m, const int32_t *tokens, int n_tokens, int n_past, int all_logits, float *logits,
                    const float *ple, int64_t ple_len, char *err, size_t err_len);
qsc_model *qsc_host_model_create(const qsc_model_desc *md, const qs_block *layers, int n_ctx, int kv_f16,
                                 int max_batch, char *err, size_t err_len);

/* ---- qwen35 (qsc_gdn.cuh) compiled for the host: one layer's gated delta-net mixer on h [n_tokens][n_embd] into
 * out, its conv_state / ssm_state updated in place; the gated attention's split of wq's output qg
 * [n_tokens][n_head][2 head_dim] (each head's query, then its gate) into q (+ bq, NULL: none), and
 * out = att * sigmoid(gate) (no GPU needed) */
int qsc_host_gdn_mixer(const qs_block *b, const float *h, int n_tokens, float *out, char *err, size_t err_len);
int qsc_host_qgate(const float *qg, const float *bq, const float *att, int n_tokens, int n_head, int head_dim,
                   float *q, float *out);
/* the session's recurrent state (every delta-net layer's conv and ssm state; the forward zeroes it at position 0):
 * op 0 zero it, 1 save it as the checkpoint, 2 restore the checkpoint, 3 ask whether there is one (1 / 0) */
int qsc_recurrent_state(qsc_model *m, int op, char *err, size_t err_len);
/* partial offload (core/engine/split.py): qsc_forward_ple (ple NULL / 0 for a model without per-layer inputs) that
 * copies the residual stream after the model's last layer into resid [n_tokens][n_embd] instead of logits; a
 * one-token step runs uncaptured */
int qsc_forward_resid(qsc_model *m, const int32_t *tokens, int n_tokens, int n_past, const float *ple,
                      int64_t ple_len, float *resid, char *err, size_t err_len);
'''
