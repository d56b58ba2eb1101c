/* A whole transformer block in C: the engine calls this once per layer, so per-token work never returns to
 * Python between operations. The layer's steps come from its plan (qs_plan.h), walked here one function per step
 * kind, as the CUDA backend walks the same list (docs/engine.md, "The layer as a plan"). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "qs.h"
#include "qs_gemm.h"
#include "qs_guard.h"
#include "qs_nn_internal.h"
#include "qs_plan.h"
#include "qs_repack.h"

#define QS_MAX_EXPERTS 4096

/* n products of the same input x (q/k/v, gate/up): repacked weights go to one pool job (one barrier); for the
 * prefill GEMM the activations are quantized once per activation format instead of once per matrix. */
static int matmat_shared(int n, const int *type, const uint8_t *const *w, const int64_t *rows, int64_t k,
                         const float *x, int64_t T, float *const *y, int n_threads) {
    int all_repacked = 1;
    for (int i = 0; i < n; ++i) all_repacked &= (type[i] & QS_RP_FLAG) != 0;
    if (all_repacked) return qs_rp_matmat_multi(n, type, w, rows, k, x, T, y, n_threads);
    qs_gemm_act acts[3];
    int n_acts = 0, rc = 0;
    for (int i = 0; i < n && !rc; ++i) {
        if (T >= 4 && qs_gemm_enabled() && qs_gemm_usable(type[i], k) && !qs_iq_prefill_usable(type[i], rows[i], k)) {
            int a = 0;
            while (a < n_acts && !qs_gemm_act_fits(&acts[a], type[i], k)) ++a;
            if (a == n_acts) {
                rc = qs_gemm_act_prepare(&acts[a], type[i], x, T, k, n_threads);
                if (rc) break;
                ++n_acts;
            }
            int64_t row_bytes = k / qs_block_elems(type[i]) * qs_block_bytes(type[i]);
            rc = qs_gemm_run(type[i], w[i], rows[i], row_bytes, &acts[a], y[i], n_threads);
        } else {
            rc = qs_matmat(type[i], w[i], rows[i], k, x, T, y[i], n_threads);
        }
    }
    for (int a = 0; a < n_acts; ++a) qs_gemm_act_free(&acts[a]);
    return rc;
}

static void add_bias(float *y, const float *b, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < n; ++i) y[r * n + i] += b[i];
}

/* A weight of rows x k elements of `type` fits in `bytes`, and the type has a kernel. */
/* acc[j] += x[t][j]^2 over T rows of n (llama-imatrix's float sums of squared activations); callers skip decode
 * steps (T == 1): the statistics are of prompts. */
static void acc_sq(float *acc, const float *x, int64_t T, int64_t n) {
    if (!acc) return;
    for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < n; ++j) acc[j] += x[t * n + j] * x[t * n + j];
}

static int check_stats(const qs_block *b) {
    const int64_t E = b->n_embd, NE = b->moe.n_expert, F = b->ffn.n_ff, A = (int64_t)b->attn.n_head * b->attn.head_dim;
    const int64_t per = NE ? NE : 1;
    if (b->probe.attn && b->probe.attn_len != E) return QS_ERR_SIZE;
    if (b->probe.wo && b->probe.wo_len != A) return QS_ERR_SIZE;
    if (b->probe.ffn && b->probe.ffn_len != per * E) return QS_ERR_SIZE;
    if (b->probe.down && b->probe.down_len != per * F) return QS_ERR_SIZE;
    if (b->probe.exp_count && b->probe.exp_count_len != NE) return QS_ERR_SIZE;
    return 0;
}

/* The probe's query buffer holds the call's queries (checked per call: T varies). */
static int check_probe(const qs_block *b, int64_t T) {
    if (b->probe.q && b->probe.q_len < T * b->attn.n_head * (int64_t)b->attn.head_dim) return QS_ERR_SIZE;
    return 0;
}

/* A weight the block reads as rows x k: the type has a kernel for rows of k, the bytes hold them, and the
 * description says the same shape. */
static int check_weight(const qs_weight *w, int64_t rows, int64_t k) {
    int64_t need = qs_weight_bytes(w->type, rows, k);
    if (need < 0) return QS_ERR_TYPE;
    if (!w->ptr || w->bytes < need || w->rows != rows || w->k != k) return QS_ERR_WEIGHT;
    return QS_OK;
}

/* The gated delta-net group of *b (gdn.conv > 0): sizes, weights, vectors and the state buffers' lengths. */
static int check_gdn(const qs_block *b) {
    const qs_gdn_desc *G = &b->gdn;
    const int64_t E = b->n_embd, K = G->conv, S = G->state, Hk = G->k_heads, Hv = G->v_heads;
    if (K < 1 || K > 64 || S < 1 || S > 1024 || Hk < 1 || Hv < 1 || Hv > 4096 || Hv % Hk) return QS_ERR_HEADS;
    const int64_t Kd = Hk * S, Vd = Hv * S, C = 2 * Kd + Vd;
    if (C > (1 << 22)) return QS_ERR_HEADS;
    int rc;
    if ((rc = check_weight(&G->qkv, C, E)) || (rc = check_weight(&G->out, E, Vd)) ||
        (rc = check_weight(&G->z, Vd, E)) ||
        (rc = check_weight(&G->beta, Hv, E)) ||
        (rc = check_weight(&G->alpha, Hv, E)))
        return rc;
    if (!G->conv_w.ptr || G->conv_w.len != C * K || !G->dt_bias.ptr || G->dt_bias.len != Hv || !G->a.ptr ||
        G->a.len != Hv || !G->norm.ptr || G->norm.len != S)
        return QS_ERR_VECTOR;
    if ((K > 1 && !G->conv_state) || G->conv_state_len != (K - 1) * C || !G->ssm_state ||
        G->ssm_state_len != Hv * S * S)
        return QS_ERR_CACHE;
    return QS_OK;
}

typedef struct {
    const qs_block *b;
    const float *qkv, *beta, *alpha; /* [T][C] after the conv and SiLU, [T][Hv] raw */
    float *o;                        /* [T][Hv * S] */
    int64_t T;
    float *scratch; /* 3 S floats per value head */
} gdn_ctx;

/* One value head's recurrence over the call's tokens: q and k (of key head h mod Hk) L2-normalized, q scaled by
 * 1/sqrt(S); per token st <- st * exp(g), d = beta (v - st^T k), st <- st + k d^T, o = st^T q, with st the head's
 * [S key][S value] state, g = softplus(alpha + dt_bias) * ssm_a and beta = sigmoid(beta) (llama.cpp's
 * autoregressive delta net; qs_gdn_step_*). */
static void gdn_head(void *vctx, int64_t h) {
    const gdn_ctx *c = (const gdn_ctx *)vctx;
    const qs_block *b = c->b;
    const qs_gdn_desc *G = &b->gdn;
    const int64_t S = G->state, Hk = G->k_heads, Hv = G->v_heads, Kd = Hk * S, C = 2 * Kd + Hv * S;
    const int64_t kh = h % Hk;
    float *St = G->ssm_state + h * S * S;
    float *qn = c->scratch + h * 3 * S, *kn = qn + S, *sk = kn + S;
    const qs_gdn_step_fn step = qs_gdn_step_kernel();
    const float qscale = 1.0f / sqrtf((float)S);
    for (int64_t t = 0; t < c->T; ++t) {
        const float *row = c->qkv + t * C, *q = row + kh * S, *k = row + Kd + kh * S, *v = row + 2 * Kd + h * S;
        double sq = 0.0, sk2 = 0.0;
        for (int64_t j = 0; j < S; ++j) {
            sq += (double)q[j] * q[j];
            sk2 += (double)k[j] * k[j];
        }
        const float iq = qscale / sqrtf((float)sq + b->eps), ik = 1.0f / sqrtf((float)sk2 + b->eps);
        for (int64_t j = 0; j < S; ++j) {
            qn[j] = q[j] * iq;
            kn[j] = k[j] * ik;
        }
        const float a = c->alpha[t * Hv + h] + G->dt_bias.ptr[h];
        const float sp = a > 20.0f ? a : log1pf(expf(a));
        const float decay = expf(sp * G->a.ptr[h]);
        const float beta = 1.0f / (1.0f + expf(-c->beta[t * Hv + h]));
        float *out = c->o + t * Hv * S + h * S;
        step(S, St, kn, qn, v, decay, beta, out, sk);
    }
}

/* qwen35's gated delta-net mixer: h [T][E] (normed) -> out [T][E] (docs/engine.md, "Gated delta-net layers"). */
static int gdn_mixer(const qs_block *b, const float *h, int64_t T, float *out, int n_threads) {
    const qs_gdn_desc *G = &b->gdn;
    const int64_t E = b->n_embd, K = G->conv, S = G->state, Hk = G->k_heads, Hv = G->v_heads;
    const int64_t Kd = Hk * S, Vd = Hv * S, C = 2 * Kd + Vd;
    float *buf = (float *)malloc((size_t)(T * C + T * Vd * 2 + 2 * T * Hv + (K - 1 + T) * C + 3 * Vd) * sizeof(float));
    if (!buf) return QS_ERR_NOMEM;
    float *qkv = buf, *z = qkv + T * C, *o = z + T * Vd, *beta = o + T * Vd, *alpha = beta + T * Hv;
    float *win = alpha + T * Hv;
    int rc;
    {
        const int ty[2] = {G->qkv.type, G->z.type}, ty2[2] = {G->beta.type, G->alpha.type};
        const uint8_t *const ws[2] = {G->qkv.ptr, G->z.ptr}, *const ws2[2] = {G->beta.ptr, G->alpha.ptr};
        const int64_t rows[2] = {C, Vd}, rows2[2] = {Hv, Hv};
        float *const ys[2] = {qkv, z}, *const ys2[2] = {beta, alpha};
        rc = matmat_shared(2, ty, ws, rows, E, h, T, ys, n_threads);
        if (!rc) rc = matmat_shared(2, ty2, ws2, rows2, E, h, T, ys2, n_threads);
    }
    if (rc) goto done;
    /* the depthwise causal conv over the state's K - 1 inputs and this call's, then SiLU; the state keeps the last
     * K - 1 inputs */
    if (K > 1) memcpy(win, G->conv_state, (size_t)((K - 1) * C) * sizeof(float));
    memcpy(win + (K - 1) * C, qkv, (size_t)(T * C) * sizeof(float));
    for (int64_t t = 0; t < T; ++t)
        for (int64_t ch = 0; ch < C; ++ch) {
            const float *w = G->conv_w.ptr + ch * K;
            float acc = 0.0f;
            for (int64_t j = 0; j < K; ++j) acc += w[j] * win[(t + j) * C + ch];
            qkv[t * C + ch] = acc / (1.0f + expf(-acc));
        }
    if (K > 1) memcpy(G->conv_state, win + T * C, (size_t)((K - 1) * C) * sizeof(float));
    gdn_ctx ctx = {b, qkv, beta, alpha, o, T, win + (K - 1 + T) * C};
    qs_parallel_for(Hv, gdn_head, &ctx, n_threads);
    /* each head's output RMS-normalized (ssm_norm) and gated by SiLU(z), then ssm_out */
    qs_rmsnorm(o, G->norm.ptr, o, T * Hv, S, b->eps);
    for (int64_t i = 0; i < T * Vd; ++i) o[i] *= z[i] / (1.0f + expf(-z[i]));
    rc = qs_matmat(G->out.type, G->out.ptr, E, Vd, o, T, out, n_threads);
done:
    free(buf);
    return rc;
}

/* Every size in *b against the others and the call's arguments: integer checks only, once per call. */
static int check_block(const qs_block *b, const float *x, int64_t T, const int32_t *pos, int64_t n_past) {
    int rc_weight;
    const qs_attn_desc *A = &b->attn;
    const qs_moe_desc *M = &b->moe;
    const int64_t E = b->n_embd, H = A->n_head, KV = A->n_head_kv, hd = A->head_dim, F = b->ffn.n_ff;
    if (E <= 0 || E > (1 << 20) || F <= 0 || F > (1 << 22)) return QS_ERR_SIZE;
    if (H <= 0 || H > 4096 || KV <= 0 || H % KV || hd <= 0 || hd > 1024 || H * hd > (1 << 22)) return QS_ERR_HEADS;
    if (b->rope.dim <= 0 || b->rope.dim % 2 || b->rope.dim > hd) return QS_ERR_HEADS;
    if (b->rope.freqs.ptr ? b->rope.freqs.len != b->rope.dim / 2 : b->rope.freqs.len != 0) return QS_ERR_SIZE;
    if (!isfinite(b->residual_scale) || !isfinite(A->softcap) || A->softcap < 0.0f ||
        !isfinite(b->rope.mscale) || !isfinite(A->temp_scale) || (A->temp_scale != 0.0f && A->temp_floor <= 0))
        return QS_ERR_SIZE;
    if (A->n_ctx <= 0 || A->n_ctx > (1 << 24) || A->window < 0 || T <= 0 || T > (1 << 20) || n_past < 0 ||
        n_past > A->n_ctx - T || !x || !pos)
        return QS_ERR_SIZE;
    for (int64_t t = 0; t < T; ++t)
        if (pos[t] < 0 || pos[t] >= A->n_ctx) return QS_ERR_POS;
    const int64_t P = b->ple.dim;
    if (P < 0 || P > (1 << 20) || !isfinite(b->out_scale) || (A->kv_reuse != 0 && A->kv_reuse != 1)) return QS_ERR_SIZE;
    const qs_weight *const ws[9] = {&A->wq, &A->wk,  &A->wv,  &A->wo, &b->ffn.gate,
                                    &b->ffn.up,   &b->ffn.down, &b->ple.gate, &b->ple.proj};
    const int64_t NE = M->n_expert;
    if (NE < 0 || NE > QS_MAX_EXPERTS || (NE && (M->n_used < 1 || M->n_used > NE)) ||
        (NE && (!isfinite(M->scale) || M->scale < 0.0f)))
        return QS_ERR_SIZE;
    if (NE && (rc_weight = check_weight(&M->router, NE, E)) != QS_OK) return rc_weight;
    const int64_t FS = M->n_ff_shexp;
    if (FS < 0 || FS > (1 << 22) || (FS && !NE)) return QS_ERR_SIZE;
    if (FS) {
        if ((rc_weight = check_weight(&M->sh_gate, FS, E)) ||
            (rc_weight = check_weight(&M->sh_up, FS, E)) ||
            (rc_weight = check_weight(&M->sh_down, E, FS)))
            return rc_weight;
        if (!M->sh_gate_inp.ptr || M->sh_gate_inp.len != E) return QS_ERR_VECTOR;
    } else if (M->sh_gate_inp.ptr || M->sh_gate_inp.len) {
        return QS_ERR_VECTOR;
    }
    const int64_t ne = NE ? NE : 1; /* the FFN matrices hold n_expert matrices back to back */
    const int gdn = b->gdn.conv != 0;
    if (A->q_gate != 0 && (A->q_gate != 1 || gdn)) return QS_ERR_SIZE;
    if (gdn && (rc_weight = check_gdn(b)) != QS_OK) return rc_weight;
    const int64_t rows[9] = {(A->q_gate ? 2 : 1) * H * hd, KV * hd, KV * hd, E, ne * F, ne * F, ne * E, P, E},
                  ks[9] = {E, E, E, H * hd, E, E, F, E, P};
    for (int i = 0; i < 9; ++i) {
        if ((A->kv_reuse && (i == 1 || i == 2)) || (!P && i >= 7) || (gdn && i < 4) || (b->ffn.plain && i == 4))
            continue; /* not read */
        int rc = check_weight(ws[i], rows[i], ks[i]);
        if (rc) return rc;
    }
    if (P && (!b->ple.post_norm.ptr || b->ple.post_norm.len != E || !b->ple.inputs || b->ple.inputs_len < T * P))
        return QS_ERR_VECTOR;
    /* the vectors the plan names (norms, biases: qs_plan_bad_vec), then q/k norms: per head (length head_dim) or
     * over the whole projection (olmo2: H*hd and KV*hd) */
    if (qs_plan_bad_vec(b)) return QS_ERR_VECTOR;
    /* BERT's switches: flags, their vectors present exactly with them (a window with full attention is symmetric) */
    if ((b->ffn.plain != 0 && b->ffn.plain != 1) || (b->post_ln != 0 && b->post_ln != 1) ||
        (A->non_causal != 0 && A->non_causal != 1) || (b->ffn.plain && NE))
        return QS_ERR_SIZE;
    if (!(A->alibi_max_bias >= 0.0f) || !isfinite(A->alibi_max_bias) ||
        (A->alibi_max_bias > 0.0f && (!A->non_causal || A->sinks.ptr || A->softcap != 0.0f)))
        return QS_ERR_SIZE; /* ALiBi (jina-bert-v2): the encoder's attention only */
    if ((NE && (b->ffn.b_up.ptr || b->ffn.b_down.ptr)) || /* dense FFNs' biases: BERT's, jina-bert-v2's */
        (!b->post_ln && (b->post_attn_norm_b.ptr || b->post_ffn_norm_b.ptr)) ||
        (b->post_ln && (!b->post_attn_norm.ptr || !b->post_ffn_norm.ptr || !b->post_attn_norm_b.ptr ||
                        !b->post_ffn_norm_b.ptr)))
        return QS_ERR_VECTOR;
    if (b->ffn.gelu_f16 != 0 && (b->ffn.gelu_f16 != 1 || !b->post_ln)) return QS_ERR_SIZE; /* encoders only */
    if (A->qk_norm_full != 0 && A->qk_norm_full != 1) return QS_ERR_SIZE;
    const int full = A->qk_norm_full;
    if ((A->q_norm.ptr && A->q_norm.len != (full ? H * hd : hd)) ||
        (A->k_norm.ptr && A->k_norm.len != (full ? KV * hd : hd)))
        return QS_ERR_VECTOR;
    if (!b->attn_norm.ptr != !b->ffn_norm.ptr || (!A->q_norm.ptr != !A->k_norm.ptr && !A->kv_reuse))
        return QS_ERR_VECTOR; /* NULL norms: olmo2 */
    /* gpt-oss's vectors: each absent (NULL, length 0) or of its exact length; expert biases need experts */
    const float *const gv[5] = {A->sinks.ptr, M->b_router.ptr, M->b_gate.ptr, M->b_up.ptr, M->b_down.ptr};
    const int64_t glen[5] = {A->sinks.len, M->b_router.len, M->b_gate.len, M->b_up.len, M->b_down.len};
    const int64_t gwant[5] = {H, NE, NE * F, NE * F, NE * E};
    for (int i = 0; i < 5; ++i)
        if (gv[i] ? glen[i] != gwant[i] || (i >= 1 && !NE) : glen[i] != 0) return QS_ERR_VECTOR;
    if (b->ffn.swiglu_oai != 0 && b->ffn.swiglu_oai != 1) return QS_ERR_SIZE;
    /* checked here too: the attention would refuse after the KV store */
    for (int64_t h = 0; A->sinks.ptr && h < H; ++h)
        if (!isfinite(A->sinks.ptr[h])) return QS_ERR_SIZE;
    if (gdn) /* a delta-net layer has none of attention's vectors */
        return (A->bq.ptr || A->bk.ptr || A->bv.ptr || A->q_norm.ptr || A->k_norm.ptr || A->bo.ptr || A->sinks.ptr)
                   ? QS_ERR_VECTOR
                   : QS_OK;
    const int64_t k_row = qs_kv_row_bytes(A->k_type, (int)hd), v_row = qs_kv_row_bytes(A->v_type, (int)hd);
    if (k_row < 0 || v_row < 0) return QS_ERR_HEADS; /* a block type needs head_dim % 32 == 0 */
    if (!A->k_cache || !A->v_cache || A->k_cache_bytes < A->n_ctx * KV * k_row ||
        A->v_cache_bytes < A->n_ctx * KV * v_row)
        return QS_ERR_CACHE;
    return QS_OK;
}

/* The mixture-of-experts FFN of h [T][E] into out [T][E] (qs_block's moe group): router logits (+ bias),
 * softmax, the n_expert_used largest per token (ties to the lower index, as a stable descending sort), their
 * weights normalized as llama.cpp does (sum clamped below at 2^-14) and scaled. Then expert by expert, only the tokens routed to it:
 * their rows of h gathered, gate/up (one job, + biases), SwiGLU (or the clamped variant), down (+ bias), and each
 * output row added with its token's weight. Decode reads the picked experts' rows only; prefill streams each
 * expert's weights once. */
/* qwen35moe's shared expert on every token of h [T][E], its output times sigmoid(h . shexp_gate) added to out */
static int shared_expert(const qs_block *b, const float *h, int64_t T, float *out, int n_threads) {
    const int64_t E = b->n_embd, FS = b->moe.n_ff_shexp;
    float *buf = (float *)malloc((size_t)(T * FS * 2 + T * E) * sizeof(float));
    if (!buf) return QS_ERR_NOMEM;
    float *g = buf, *u = g + T * FS, *o = u + T * FS;
    const int ty[2] = {b->moe.sh_gate.type, b->moe.sh_up.type};
    const uint8_t *const ws[2] = {b->moe.sh_gate.ptr, b->moe.sh_up.ptr};
    const int64_t rows[2] = {FS, FS};
    float *const ys[2] = {g, u};
    int rc = matmat_shared(2, ty, ws, rows, E, h, T, ys, n_threads);
    if (!rc) {
        qs_swiglu(g, u, g, T * FS);
        rc = qs_matmat(b->moe.sh_down.type, b->moe.sh_down.ptr, E, FS, g, T, o, n_threads);
    }
    if (!rc)
        for (int64_t t = 0; t < T; ++t) {
            float z = 0.0f;
            for (int64_t c = 0; c < E; ++c) z += h[t * E + c] * b->moe.sh_gate_inp.ptr[c];
            const float w = 1.0f / (1.0f + expf(-z));
            for (int64_t c = 0; c < E; ++c) out[t * E + c] += w * o[t * E + c];
        }
    free(buf);
    return rc;
}

/* moe_ffn's decode step (one token, repacked experts): sel / wsel the K picked experts and weights; gb holds
 * 2 K F floats, ob K E (as moe_ffn allocates them for K >= 1 pairs) */
static int decode_experts(const qs_block *b, const float *h, const int32_t *sel, const float *wsel, float *gb,
                          float *ob, float *out, int n_threads) {
    const int64_t E = b->n_embd, F = b->ffn.n_ff, K = b->moe.n_used;
    const int64_t sg = qs_weight_bytes(b->ffn.gate.type, F, E), su = qs_weight_bytes(b->ffn.up.type, F, E),
                  sd = qs_weight_bytes(b->ffn.down.type, E, F);
    int32_t order[32];
    for (int64_t j = 0; j < K; ++j) { /* the picked experts by index: the accumulation order of moe_ffn */
        int64_t i = j;
        while (i > 0 && sel[order[i - 1]] > sel[j]) {
            order[i] = order[i - 1];
            --i;
        }
        order[i] = (int32_t)j;
    }
    int ty[64];
    const uint8_t *ws[64];
    int64_t rows[64];
    float *ys[64];
    const float *xs[32];
    for (int64_t j = 0; j < K; ++j) {
        const int64_t e = sel[order[j]];
        ty[2 * j] = b->ffn.gate.type, ws[2 * j] = b->ffn.gate.ptr + e * sg, rows[2 * j] = F, ys[2 * j] = gb + j * F;
        ty[2 * j + 1] = b->ffn.up.type, ws[2 * j + 1] = b->ffn.up.ptr + e * su, rows[2 * j + 1] = F, ys[2 * j + 1] = gb + (K + j) * F;
    }
    int rc = qs_rp_matmat_multi((int)(2 * K), ty, ws, rows, E, h, 1, ys, n_threads);
    if (rc) return rc;
    for (int64_t j = 0; j < K; ++j) {
        const int64_t e = sel[order[j]];
        float *g = gb + j * F, *u = gb + (K + j) * F;
        if (b->moe.b_gate.ptr) add_bias(g, b->moe.b_gate.ptr + e * F, 1, F);
        if (b->moe.b_up.ptr) add_bias(u, b->moe.b_up.ptr + e * F, 1, F);
        if (b->ffn.swiglu_oai) qs_swiglu_oai(g, u, g, F);
        else qs_swiglu(g, u, g, F);
        ty[j] = b->ffn.down.type, ws[j] = b->ffn.down.ptr + e * sd, rows[j] = E, xs[j] = g, ys[j] = ob + j * E;
    }
    rc = qs_rp_matmat_multi_x((int)K, ty, ws, rows, F, xs, 1, ys, n_threads);
    if (rc) return rc;
    for (int64_t j = 0; j < K; ++j) {
        const int64_t e = sel[order[j]];
        const float w = wsel[order[j]];
        if (b->moe.b_down.ptr) add_bias(ob + j * E, b->moe.b_down.ptr + e * E, 1, E);
        for (int64_t c = 0; c < E; ++c) out[c] += w * ob[j * E + c];
    }
    return QS_OK;
}

static int moe_ffn(const qs_block *b, const float *h, int64_t T, float *out, int n_threads) {
    const int64_t E = b->n_embd, F = b->ffn.n_ff, NE = b->moe.n_expert, K = b->moe.n_used;
    const int64_t sg = qs_weight_bytes(b->ffn.gate.type, F, E), su = qs_weight_bytes(b->ffn.up.type, F, E),
                  sd = qs_weight_bytes(b->ffn.down.type, E, F);
    if (sg < 0 || su < 0 || sd < 0) return QS_ERR_TYPE;
    float *probs = (float *)malloc((size_t)(T * NE) * sizeof(float));
    int32_t *sel = (int32_t *)malloc((size_t)(T * K) * sizeof(int32_t));
    float *wsel = (float *)malloc((size_t)(T * K) * sizeof(float));
    int64_t *count = (int64_t *)calloc((size_t)NE + 1, sizeof(int64_t));
    int64_t *tok = (int64_t *)malloc((size_t)(T * K) * sizeof(int64_t)); /* (token, slot) pairs by expert */
    float *hb = (float *)malloc((size_t)(T * E) * sizeof(float));
    const int64_t nb = T > K ? T : K; /* (decode_experts takes K experts' rows at once) */
    float *gb = (float *)malloc((size_t)(nb * F * 2) * sizeof(float));
    float *ob = (float *)malloc((size_t)(nb * E) * sizeof(float));
    int rc = QS_ERR_NOMEM;
    if (!probs || !sel || !wsel || !count || !tok || !hb || !gb || !ob) goto done;
    rc = qs_matmat(b->moe.router.type, b->moe.router.ptr, NE, E, h, T, probs, n_threads);
    if (rc) goto done;
    if (b->moe.b_router.ptr) add_bias(probs, b->moe.b_router.ptr, T, NE);
    qs_softmax(probs, T, NE);
    for (int64_t t = 0; t < T; ++t) {
        const float *p = probs + t * NE;
        int32_t *s = sel + t * K;
        for (int64_t j = 0; j < K; ++j) { /* insertion into the top K, descending, earlier index first on ties */
            int64_t best = -1;
            for (int64_t e = 0; e < NE; ++e) {
                int taken = 0;
                for (int64_t i = 0; i < j; ++i) taken |= s[i] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            s[j] = (int32_t)best;
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < K; ++j) sum += p[s[j]];
        if (sum < 6.103515625e-5f) sum = 6.103515625e-5f;
        for (int64_t j = 0; j < K; ++j) {
            float w = b->moe.norm ? p[s[j]] / sum : p[s[j]];
            if (b->moe.scale != 0.0f) w *= b->moe.scale;
            wsel[t * K + j] = w;
            count[s[j] + 1]++;
        }
    }
    for (int64_t e = 0; e < NE; ++e) count[e + 1] += count[e]; /* start of expert e's pairs in tok */
    {
        int64_t *fill = (int64_t *)malloc((size_t)NE * sizeof(int64_t));
        if (!fill) { rc = QS_ERR_NOMEM; goto done; }
        memcpy(fill, count, (size_t)NE * sizeof(int64_t));
        for (int64_t t = 0; t < T; ++t)
            for (int64_t j = 0; j < K; ++j) tok[fill[sel[t * K + j]]++] = t * K + j;
        free(fill);
    }
    memset(out, 0, (size_t)(T * E) * sizeof(float));
    if (T == 1 && 2 * K <= 32 && (b->ffn.gate.type & b->ffn.up.type & b->ffn.down.type & QS_RP_FLAG)) {
        /* one token (decode), repacked experts: the picked experts' gate and up products in one pool job, their
         * down products in another (the same kernels and sums as expert by expert below), then the weighted outputs
         * added in expert order as below */
        rc = decode_experts(b, h, sel, wsel, gb, ob, out, n_threads);
        if (!rc && b->moe.n_ff_shexp) rc = shared_expert(b, h, T, out, n_threads);
        goto done;
    }
    for (int64_t e = 0; e < NE && !rc; ++e) {
        const int64_t n = count[e + 1] - count[e];
        if (!n) continue;
        const int64_t *pairs = tok + count[e];
        for (int64_t i = 0; i < n; ++i) memcpy(hb + i * E, h + (pairs[i] / K) * E, (size_t)E * sizeof(float));
        if (T > 1) { /* each expert its own rows and count, however few picked it (llama-imatrix's MUL_MAT_ID) */
            if (b->probe.ffn) acc_sq(b->probe.ffn + e * E, hb, n, E);
            if (b->probe.exp_count) b->probe.exp_count[e] += n;
        }
        const int ty[2] = {b->ffn.gate.type, b->ffn.up.type};
        const uint8_t *const ws[2] = {b->ffn.gate.ptr + e * sg, b->ffn.up.ptr + e * su};
        const int64_t rows[2] = {F, F};
        float *const ys[2] = {gb, gb + n * F};
        rc = matmat_shared(2, ty, ws, rows, E, hb, n, ys, n_threads);
        if (rc) break;
        if (b->moe.b_gate.ptr) add_bias(gb, b->moe.b_gate.ptr + e * F, n, F);
        if (b->moe.b_up.ptr) add_bias(gb + n * F, b->moe.b_up.ptr + e * F, n, F);
        if (b->ffn.swiglu_oai) qs_swiglu_oai(gb, gb + n * F, gb, n * F);
        else qs_swiglu(gb, gb + n * F, gb, n * F);
        if (T > 1 && b->probe.down) acc_sq(b->probe.down + e * F, gb, n, F);
        rc = qs_matmat(b->ffn.down.type, b->ffn.down.ptr + e * sd, E, F, gb, n, ob, n_threads);
        if (rc) break;
        if (b->moe.b_down.ptr) add_bias(ob, b->moe.b_down.ptr + e * E, n, E);
        for (int64_t i = 0; i < n; ++i) {
            const float w = wsel[pairs[i]];
            float *o = out + (pairs[i] / K) * E;
            for (int64_t c = 0; c < E; ++c) o[c] += w * ob[i * E + c];
        }
    }
    if (!rc && b->moe.n_ff_shexp) rc = shared_expert(b, h, T, out, n_threads);
done:
    free(probs);
    free(sel);
    free(wsel);
    free(count);
    free(tok);
    free(hb);
    free(gb);
    free(ob);
    return rc;
}

/* The segments of a non-causal batch (qs_attn_desc.seg_len): none, or positive lengths summing to T, with full
 * attention, n_past 0 and one sequence. */
static int check_segments(const qs_block *b, int64_t T, int64_t n_past, int batched) {
    const qs_attn_desc *A = &b->attn;
    if (!A->seg_len) return A->n_seg ? QS_ERR_SIZE : QS_OK;
    if (!A->non_causal || A->window > 0 || n_past || batched || A->n_seg <= 0 || A->n_seg > T) return QS_ERR_SIZE;
    int64_t sum = 0;
    for (int64_t i = 0; i < A->n_seg; ++i) {
        if (A->seg_len[i] <= 0) return QS_ERR_SIZE;
        sum += A->seg_len[i];
    }
    return sum == T ? QS_OK : QS_ERR_SIZE;
}

/* qs_block_forward_seqs' checks beyond check_block's: one sequence per row, each with this layer's weights and
 * shapes and a cache of its own, large enough, with room for the row's token; attention layers only, no probe. */
static int check_seqs(const qs_block *const *seqs, const int64_t *n_pasts, const int32_t *pos, int64_t T) {
    const qs_block *b = seqs[0];
    const qs_attn_desc *A = &b->attn;
    const qs_probe_desc *P = &b->probe;
    if (!n_pasts || !pos || T <= 0 || T > 4096) return QS_ERR_SIZE;
    if (b->gdn.conv || A->non_causal || P->attn || P->wo || P->ffn || P->down || P->exp_count || P->q)
        return QS_ERR_SIZE;
    const int64_t KV = A->n_head_kv, hd = A->head_dim;
    for (int64_t t = 0; t < T; ++t) {
        const qs_block *s = seqs[t];
        if (!s) return QS_ERR_SIZE;
        const qs_attn_desc *S = &s->attn;
        if (S->wq.ptr != A->wq.ptr || S->wo.ptr != A->wo.ptr || b->ffn.down.ptr != s->ffn.down.ptr ||
            S->n_head != A->n_head || S->n_head_kv != KV || S->head_dim != hd || S->k_type != A->k_type || S->v_type != A->v_type ||
            S->window != A->window || S->kv_reuse != A->kv_reuse || s->gdn.conv)
            return QS_ERR_SIZE;
        if (S->n_ctx <= 0 || S->n_ctx > (1 << 24) || n_pasts[t] < 0 || n_pasts[t] >= S->n_ctx) return QS_ERR_SIZE;
        if (pos[t] < 0 || pos[t] >= S->n_ctx) return QS_ERR_POS;
        const int64_t k_row = qs_kv_row_bytes(S->k_type, (int)hd), v_row = qs_kv_row_bytes(S->v_type, (int)hd);
        if (k_row < 0 || v_row < 0) return QS_ERR_HEADS;
        if (!S->k_cache || !S->v_cache || S->k_cache_bytes < S->n_ctx * KV * k_row ||
            S->v_cache_bytes < S->n_ctx * KV * v_row)
            return QS_ERR_CACHE;
        for (int64_t u = 0; u < t; ++u)
            if (seqs[u]->attn.k_cache == S->k_cache || seqs[u]->attn.v_cache == S->v_cache) return QS_ERR_CACHE;
    }
    return QS_OK;
}

/* ------------------------------------------------------------------------------------------------------------------
 * The CPU walk of a layer's plan (qs_plan.h): one function per step kind. */

/* One call's state: the layer, the call's arguments and the rows of each QS_BUF_* buffer. seqs NULL: T tokens of
 * one sequence after n_past cached ones (b's cache). seqs: T sequences, row t the next token of sequence t, whose
 * layer is seqs[t] (b == seqs[0]) with n_pasts[t] cached tokens. */
typedef struct {
    const qs_block *b;
    const qs_block *const *seqs;
    const int64_t *n_pasts;
    int64_t T, n_past;
    const int32_t *pos;
    int n_threads;
    float *buf[QS_BUFS];
} cpu_walk;

static int cpu_norm(cpu_walk *w, const qs_step *s) {
    const qs_block *b = w->b;
    const int64_t E = b->n_embd;
    const qs_vec *v = qs_plan_vec(b, s->vec);
    if (v) qs_rmsnorm(w->buf[s->src], v->ptr, w->buf[s->dst], w->T, E, b->eps);
    else memcpy(w->buf[s->dst], w->buf[s->src], (size_t)(w->T * E) * sizeof(float));
    return QS_OK;
}

/* Statistics of prompts (T > 1) into the block's probe sums; the queries into probe.q. The MoE step keeps its
 * own per-expert statistics. */
static int cpu_tap(cpu_walk *w, const qs_step *s) {
    const qs_block *b = w->b;
    const qs_probe_desc *P = &b->probe;
    const int64_t T = w->T, E = b->n_embd, QD = (int64_t)b->attn.n_head * b->attn.head_dim;
    const float *src = w->buf[s->src];
    if (s->arg == QS_TAP_Q) {
        if (P->q) memcpy(P->q, src, (size_t)(T * QD) * sizeof(float));
        return QS_OK;
    }
    if (T < 2) return QS_OK;
    if (s->arg == QS_TAP_ATTN_IN) acc_sq(P->attn, src, T, E);
    else if (s->arg == QS_TAP_WO_IN) acc_sq(P->wo, src, T, QD);
    else if (s->arg == QS_TAP_FFN_IN && !b->moe.n_expert) acc_sq(P->ffn, src, T, E);
    else if (s->arg == QS_TAP_DOWN_IN) acc_sq(P->down, src, T, b->ffn.n_ff);
    return QS_OK;
}

/* n products of one input: repacked weights in one pool job, the prefill GEMM's activations quantized once
 * (matmat_shared); then the biases. */
static int cpu_proj(cpu_walk *w, const qs_step *s) {
    const qs_block *b = w->b;
    int ty[3];
    const uint8_t *ws[3];
    int64_t rows[3];
    float *ys[3];
    const int64_t k = qs_plan_weight(b, s->w[0])->k;
    for (int i = 0; i < s->n; ++i) {
        const qs_weight *W = qs_plan_weight(b, s->w[i]);
        ty[i] = W->type;
        ws[i] = W->ptr;
        rows[i] = W->rows;
        ys[i] = w->buf[s->out[i]];
    }
    int rc = s->n == 1 ? qs_matmat(ty[0], ws[0], rows[0], k, w->buf[s->src], w->T, ys[0], w->n_threads)
                       : matmat_shared(s->n, ty, ws, rows, k, w->buf[s->src], w->T, ys, w->n_threads);
    for (int i = 0; i < s->n && !rc; ++i) {
        const qs_vec *bias = qs_plan_vec(b, s->bias[i]);
        if (bias) add_bias(ys[i], bias->ptr, w->T, rows[i]);
    }
    return rc;
}

/* [T][H][query | gate] -> the queries packed (then their bias) and the gates apart. */
static int cpu_qgate_split(cpu_walk *w, const qs_step *s) {
    const qs_attn_desc *A = &w->b->attn;
    const int64_t H = A->n_head, hd = A->head_dim;
    float *q = w->buf[s->dst], *gate = w->buf[s->src2];
    const float *qg = w->buf[s->src];
    for (int64_t t = 0; t < w->T; ++t)
        for (int64_t hh = 0; hh < H; ++hh) {
            memcpy(gate + (t * H + hh) * hd, qg + (t * H + hh) * 2 * hd + hd, (size_t)hd * sizeof(float));
            memmove(q + (t * H + hh) * hd, qg + (t * H + hh) * 2 * hd, (size_t)hd * sizeof(float));
        }
    const qs_vec *bias = qs_plan_vec(w->b, s->bias[0]);
    if (bias) add_bias(q, bias->ptr, w->T, H * hd);
    return QS_OK;
}

/* q / k norms, RoPE, V's norm, temperature tuning, then K and V into the cache(s). */
static int cpu_qk_post(cpu_walk *w, const qs_step *s) {
    (void)s;
    const qs_block *b = w->b;
    const qs_attn_desc *A = &b->attn;
    const int64_t T = w->T, H = A->n_head, KV = A->n_head_kv, hd = A->head_dim;
    float *q = w->buf[QS_BUF_Q], *k = w->buf[QS_BUF_K], *v = w->buf[QS_BUF_V];
    int rc = QS_OK;
    if (A->kv_reuse) {
        if (A->q_norm.ptr) qs_rmsnorm(q, A->q_norm.ptr, q, T * H, hd, b->eps);
    } else if (A->q_norm.ptr && A->k_norm.ptr) {
        if (A->qk_norm_full) { /* over the whole projection */
            qs_rmsnorm(q, A->q_norm.ptr, q, T, H * hd, b->eps);
            qs_rmsnorm(k, A->k_norm.ptr, k, T, KV * hd, b->eps);
        } else {
            qs_rmsnorm(q, A->q_norm.ptr, q, T * H, hd, b->eps);
            qs_rmsnorm(k, A->k_norm.ptr, k, T * KV, hd, b->eps);
        }
    }
    if (!b->rope.skip) {
        const qs_rope_params rp = qs_plan_rope(&b->rope);
        rc = qs_rope_ext(q, T, (int)H, (int)hd, b->rope.dim, w->pos, &rp);
        if (!rc && !A->kv_reuse) rc = qs_rope_ext(k, T, (int)KV, (int)hd, b->rope.dim, w->pos, &rp);
    }
    if (A->v_norm && !A->kv_reuse) qs_rmsnorm(v, NULL, v, T * KV, hd, b->eps);
    if (rc) return rc;
    if (A->temp_scale != 0.0f) /* Llama 4 / Ministral 3 temperature tuning of the queries */
        for (int64_t t = 0; t < T; ++t) {
            const float sc = (float)(log(floor((double)w->pos[t] / (double)A->temp_floor) + 1.0) *
                                     A->temp_scale + 1.0);
            for (int64_t i = 0; i < H * hd; ++i) q[t * H * hd + i] *= sc;
        }
    /* a quantized cache's rotation (qs_kv_rotation): q and k by K's runs, v by V's (the output is turned back in
     * cpu_attend); q of a layer reading another's cache too, which was written rotated */
    const int rk = qs_kv_rotation(A->k_type, (int)hd, 1), rv = qs_kv_rotation(A->v_type, (int)hd, 0);
    if (rk) qs_hadamard(q, T * H * hd, rk);
    if (A->kv_reuse) return QS_OK;
    if (rk) qs_hadamard(k, T * KV * hd, rk);
    if (rv) qs_hadamard(v, T * KV * hd, rv);
    if (w->seqs) { /* each row's K and V into its own sequence's cache */
        for (int64_t t = 0; t < T; ++t) {
            qs_kv_store(w->seqs[t]->attn.k_cache, A->k_type, w->n_pasts[t] * KV, k + t * KV * hd, KV, (int)hd);
            qs_kv_store(w->seqs[t]->attn.v_cache, A->v_type, w->n_pasts[t] * KV, v + t * KV * hd, KV, (int)hd);
        }
    } else {
        qs_kv_store(A->k_cache, A->k_type, w->n_past * KV, k, T * KV, (int)hd); /* rows: (position, KV head) */
        qs_kv_store(A->v_cache, A->v_type, w->n_past * KV, v, T * KV, (int)hd);
    }
    return QS_OK;
}

/* Non-causal attention of a batch of inputs (qs_attn_desc.seg_len): each input's queries see that input's keys, the
 * cache rows r0..r0+len of its rows (n_past 0), each query asking as the input's last position. */
static int attend_segments(cpu_walk *w, const float *q, float *dst) {
    const qs_attn_desc *A = &w->b->attn;
    const int64_t H = A->n_head, KV = A->n_head_kv, hd = A->head_dim, kr = KV * qs_kv_row_bytes(A->k_type, (int)hd),
                  vr = KV * qs_kv_row_bytes(A->v_type, (int)hd);
    int64_t most = 0;
    for (int64_t i = 0; i < A->n_seg; ++i) most = A->seg_len[i] > most ? A->seg_len[i] : most;
    int32_t *last = (int32_t *)malloc((size_t)most * sizeof(int32_t));
    if (!last) return QS_ERR_NOMEM;
    int rc = QS_OK;
    for (int64_t i = 0, r0 = 0; i < A->n_seg && !rc; r0 += A->seg_len[i++]) {
        const int64_t n = A->seg_len[i];
        for (int64_t t = 0; t < n; ++t) last[t] = (int32_t)(n - 1);
        if (A->alibi_max_bias > 0.0f) { /* positions restart per input: key j at j */
            rc = A->k_type != A->v_type ? QS_ERR_SIZE /* (F32 or F16 both: qs_attention_alibi checks) */
                 : qs_attention_alibi(q + r0 * H * hd, n, w->pos + r0, (int)H, (int)hd,
                                      (const uint8_t *)A->k_cache + r0 * kr, (const uint8_t *)A->v_cache + r0 * vr,
                                      A->k_type, (int)KV, n, A->scale, A->alibi_max_bias, dst + r0 * H * hd,
                                      w->n_threads);
            continue;
        }
        rc = qs_attention_kv(q + r0 * H * hd, n, last, (int)H, (int)hd, (const uint8_t *)A->k_cache + r0 * kr,
                             (const uint8_t *)A->v_cache + r0 * vr, A->k_type, A->v_type, (int)KV, n, A->n_ctx - r0, 0,
                             A->scale, A->softcap, A->sinks.ptr, dst + r0 * H * hd, w->n_threads);
    }
    free(last);
    return rc;
}

static int attend(cpu_walk *w, const qs_step *s);

/* The attention, its output turned back by V's rotation where the cache has one (qs_kv_rotation). */
static int cpu_attend(cpu_walk *w, const qs_step *s) {
    const qs_attn_desc *A = &w->b->attn;
    int rc = attend(w, s);
    const int rv = qs_kv_rotation(A->v_type, A->head_dim, 0);
    if (!rc && rv) rc = qs_hadamard(w->buf[s->dst], w->T * A->n_head * (int64_t)A->head_dim, rv);
    return rc;
}

static int attend(cpu_walk *w, const qs_step *s) {
    const qs_attn_desc *A = &w->b->attn;
    const int64_t T = w->T, H = A->n_head, KV = A->n_head_kv, hd = A->head_dim;
    const float *q = w->buf[s->src];
    float *dst = w->buf[s->dst];
    if (A->seg_len) return attend_segments(w, q, dst);
    if (A->non_causal) { /* every query sees every key: each asks as the last position (no RoPE reads pos here);
                          * with a window, the keys within window / 2 either side (llama.cpp's symmetric window,
                          * EmbeddingGemma's): the query asks as position t + window / 2 over window / 2 * 2 + 1 */
        const int64_t half = A->window / 2, n_kv = w->n_past + T;
        const int sym = A->window > 0 && half < n_kv; /* a window wider than the input masks nothing */
        int32_t *last = (int32_t *)malloc((size_t)T * sizeof(int32_t));
        if (!last) return QS_ERR_NOMEM;
        if (A->alibi_max_bias > 0.0f) { /* key j at position j, query t at its own position */
            free(last);
            return A->k_type != A->v_type ? QS_ERR_SIZE /* (F32 or F16 both: qs_attention_alibi checks) */
                 : qs_attention_alibi(q, T, w->pos, (int)H, (int)hd, A->k_cache, A->v_cache, A->k_type, (int)KV,
                                      n_kv, A->scale, A->alibi_max_bias, dst, w->n_threads);
        }
        for (int64_t t = 0; t < T; ++t) /* (the kernel stops at the last key: n_kv - 1) */
            last[t] = (int32_t)(sym ? w->n_past + t + half : n_kv - 1);
        int rc = qs_attention_kv(q, T, last, (int)H, (int)hd, A->k_cache, A->v_cache, A->k_type, A->v_type, (int)KV,
                                 n_kv, A->n_ctx, sym ? 2 * half + 1 : 0, A->scale, A->softcap, A->sinks.ptr, dst,
                                 w->n_threads);
        free(last);
        return rc;
    }
    if (!w->seqs)
        return qs_attention_kv(q, T, w->pos, (int)H, (int)hd, A->k_cache, A->v_cache, A->k_type, A->v_type, (int)KV,
                               w->n_past + T, A->n_ctx, A->window, A->scale, A->softcap, A->sinks.ptr, dst,
                               w->n_threads);
    int rc = QS_OK;
    for (int64_t t = 0; t < T && !rc; ++t) { /* each row attends to its own sequence's cache */
        const qs_attn_desc *S = &w->seqs[t]->attn;
        rc = qs_attention_kv(q + t * H * hd, 1, w->pos + t, (int)H, (int)hd, S->k_cache, S->v_cache, A->k_type,
                             A->v_type, (int)KV, w->n_pasts[t] + 1, S->n_ctx, A->window, A->scale, A->softcap,
                             A->sinks.ptr, dst + t * H * hd, w->n_threads);
    }
    return rc;
}

static int cpu_qgate(cpu_walk *w, const qs_step *s) {
    const int64_t n = w->T * w->b->attn.n_head * (int64_t)w->b->attn.head_dim;
    float *att = w->buf[s->dst];
    const float *gate = w->buf[s->src];
    for (int64_t i = 0; i < n; ++i) att[i] = att[i] / (1.0f + expf(-gate[i]));
    return QS_OK;
}

static int cpu_gdn(cpu_walk *w, const qs_step *s) {
    return gdn_mixer(w->b, w->buf[s->src], w->T, w->buf[s->dst], w->n_threads);
}

static int cpu_residual(cpu_walk *w, const qs_step *s) {
    const qs_block *b = w->b;
    const int64_t n = w->T * b->n_embd;
    float *o = w->buf[s->src], *x = w->buf[QS_BUF_X];
    const qs_vec *v = qs_plan_vec(b, s->vec);
    if (s->arg == QS_RES_POST_LN) { /* X = LayerNorm(X + scale * O) */
        const qs_vec *bias = qs_plan_vec(b, s->bias[0]);
        for (int64_t i = 0; i < n; ++i) x[i] += s->scale * o[i];
        qs_layernorm(x, v ? v->ptr : NULL, bias ? bias->ptr : NULL, x, w->T, b->n_embd, b->eps);
        return QS_OK;
    }
    if (v) qs_rmsnorm(o, v->ptr, o, w->T, b->n_embd, b->eps);
    if (s->scale != 1.0f)
        for (int64_t i = 0; i < n; ++i) o[i] *= s->scale;
    for (int64_t i = 0; i < n; ++i) x[i] += o[i];
    return QS_OK;
}

static int cpu_glu(cpu_walk *w, const qs_step *s) {
    const int64_t n = w->T * (s->src == QS_BUF_PG ? w->b->ple.dim : w->b->ffn.n_ff);
    const float *g = w->buf[s->src], *u = w->buf[s->src2];
    float *out = w->buf[s->dst];
    const int f16 = s->src != QS_BUF_PG && w->b->ffn.gelu_f16; /* the encoders' GELU (ggml's F16 table) */
    if (s->arg == QS_GLU_GELU_PLAIN) (f16 ? qs_gelu_f16 : qs_gelu_tanh)(g, out, n);
    else if (s->arg == QS_GLU_GELU) (f16 ? qs_geglu_f16 : qs_geglu_tanh)(g, u, out, n);
    else if (s->arg == QS_GLU_OAI) qs_swiglu_oai(g, u, out, n);
    else qs_swiglu(g, u, out, n);
    return QS_OK;
}

static int cpu_moe(cpu_walk *w, const qs_step *s) {
    return moe_ffn(w->b, w->buf[s->src], w->T, w->buf[s->dst], w->n_threads);
}

static int cpu_scale(cpu_walk *w, const qs_step *s) {
    float *x = w->buf[QS_BUF_X];
    for (int64_t i = 0; i < w->T * w->b->n_embd; ++i) x[i] *= s->scale;
    return QS_OK;
}

typedef int (*cpu_step_fn)(cpu_walk *, const qs_step *);
static const cpu_step_fn CPU_STEPS[QS_STEP_KINDS] = {
    [QS_STEP_NORM] = cpu_norm,       [QS_STEP_TAP] = cpu_tap,         [QS_STEP_PROJ] = cpu_proj,
    [QS_STEP_QGATE_SPLIT] = cpu_qgate_split, [QS_STEP_QK_POST] = cpu_qk_post, [QS_STEP_ATTEND] = cpu_attend,
    [QS_STEP_QGATE] = cpu_qgate,     [QS_STEP_GDN] = cpu_gdn,         [QS_STEP_RESIDUAL] = cpu_residual,
    [QS_STEP_GLU] = cpu_glu,         [QS_STEP_MOE] = cpu_moe,         [QS_STEP_SCALE] = cpu_scale};

int qs_block_plan(const qs_block *b, qs_step *steps, int max_steps) {
    if (!b || !steps || max_steps < 0) return QS_ERR_SIZE;
    qs_step plan[QS_PLAN_MAX];
    const int n = qs_plan_build(b, plan);
    if (n > max_steps) return QS_ERR_SIZE;
    memcpy(steps, plan, (size_t)n * sizeof(qs_step));
    return n;
}

/* Check the call, lay out the buffers, walk the plan. */
static int block_forward(const qs_block *b, const qs_block *const *seqs, const int64_t *n_pasts, float *x, int64_t T,
                         const int32_t *pos, int64_t n_past, int n_threads) {
    if (!b) return QS_ERR_SIZE;
    int rc = check_block(b, x, T, pos, seqs ? 0 : n_past);
    if (!rc && seqs) rc = check_seqs(seqs, n_pasts, pos, T);
    if (!rc) rc = check_segments(b, T, n_past, seqs != NULL);
    if (!rc) rc = check_stats(b);
    if (!rc) rc = check_probe(b, T);
    if (rc) return rc;
    const qs_attn_desc *A = &b->attn;
    const int64_t E = b->n_embd, H = A->n_head, KV = A->n_head_kv, hd = A->head_dim, F = b->ffn.n_ff, P = b->ple.dim;
    const int64_t qg = A->q_gate ? 2 : 1, FP = F > P ? F : P;
    const size_t need = (size_t)(T * E * 2 + T * H * hd * 2 * qg + T * KV * hd * 2 + T * FP * 2);
    float *mem = (float *)malloc(need * sizeof(float));
    if (!mem) return QS_ERR_NOMEM;
    cpu_walk w = {b, seqs, n_pasts, T, n_past, pos, n_threads, {0}};
    float **buf = w.buf;
    buf[QS_BUF_X] = x;
    buf[QS_BUF_H] = mem;
    buf[QS_BUF_O] = buf[QS_BUF_H] + T * E;
    buf[QS_BUF_Q] = buf[QS_BUF_QG] = buf[QS_BUF_O] + T * E; /* the queries packed in place of [query | gate] */
    buf[QS_BUF_ATT] = buf[QS_BUF_Q] + T * H * hd * qg;
    buf[QS_BUF_GATE] = buf[QS_BUF_ATT] + T * H * hd;
    buf[QS_BUF_K] = buf[QS_BUF_GATE] + T * H * hd * (qg - 1);
    buf[QS_BUF_V] = buf[QS_BUF_K] + T * KV * hd;
    buf[QS_BUF_G] = buf[QS_BUF_A] = buf[QS_BUF_PG] = buf[QS_BUF_PA] = buf[QS_BUF_V] + T * KV * hd; /* in place */
    buf[QS_BUF_U] = buf[QS_BUF_G] + T * FP;
    buf[QS_BUF_PLE_IN] = (float *)b->ple.inputs;
    qs_step plan[QS_PLAN_MAX];
    const int n_steps = qs_plan_build(b, plan);
    for (int i = 0; i < n_steps && !rc; ++i) rc = CPU_STEPS[plan[i].kind](&w, &plan[i]);
    free(mem);
    return rc;
}

int qs_block_forward(const qs_block *b, float *x, int64_t T, const int32_t *pos, int64_t n_past, int n_threads) {
    int rc;
    QS_GUARDED(rc, block_forward(b, NULL, NULL, x, T, pos, n_past, n_threads));
    return rc;
}

int qs_block_forward_seqs(const qs_block *const *seqs, float *x, int64_t n_seqs, const int32_t *pos,
                          const int64_t *n_pasts, int n_threads) {
    int rc;
    if (!seqs || n_seqs <= 0) return QS_ERR_SIZE;
    QS_GUARDED(rc, block_forward(seqs[0], seqs, n_pasts, x, n_seqs, pos, 0, n_threads));
    return rc;
}
