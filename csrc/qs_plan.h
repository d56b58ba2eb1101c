/* One layer's plan (docs/engine.md, "The layer as a plan"): the ordered steps of its forward pass, built from its
 * description. Header-only so that the CPU library (qs_block.c: qs_block_plan, qs_block_forward) and the CUDA
 * library (csrc/cuda/qsc_device.cu, which does not link the CPU library) build the same list from the same code.
 * The policy a layer's description leaves as "0 means 1" (residual and output scales, RoPE's frequency scale and
 * magnitude) is resolved here and nowhere else. */
#ifndef QS_PLAN_H
#define QS_PLAN_H

#include <string.h>

/* qs_api_nn.h (qs_block, qs_step; a cffi header without an include guard) is included before this file. */

/* 0 (unset) and 1 both mean "no scaling". */
static inline float qs_plan_one(float x) { return x == 0.0f ? 1.0f : x; }

/* RoPE as the layer applies it: the description's, its 0-means-1 scales resolved (ggml_rope_ext's arguments). */
static inline qs_rope_params qs_plan_rope(const qs_rope_desc *r) {
    qs_rope_params p;
    p.freq_base = r->base;
    p.freq_scale = qs_plan_one(r->freq_scale);
    p.neox = r->neox;
    p.freq_factors = r->freqs.ptr;
    p.ext_factor = r->ext_factor;
    p.corr0 = r->corr0;
    p.corr1 = r->corr1;
    p.mscale = qs_plan_one(r->mscale);
    return p;
}

/* The description's weight and vector of each slot the steps name (NULL: QS_W_NONE / QS_V_NONE or unknown). */
static inline const qs_weight *qs_plan_weight(const qs_block *b, int slot) {
    switch (slot) {
    case QS_W_WQ: return &b->attn.wq;
    case QS_W_WK: return &b->attn.wk;
    case QS_W_WV: return &b->attn.wv;
    case QS_W_WO: return &b->attn.wo;
    case QS_W_GATE: return &b->ffn.gate;
    case QS_W_UP: return &b->ffn.up;
    case QS_W_DOWN: return &b->ffn.down;
    case QS_W_PLE_GATE: return &b->ple.gate;
    case QS_W_PLE_PROJ: return &b->ple.proj;
    default: return NULL;
    }
}

static inline const qs_vec *qs_plan_vec(const qs_block *b, int slot) {
    switch (slot) {
    case QS_V_ATTN_NORM: return &b->attn_norm;
    case QS_V_POST_ATTN_NORM: return &b->post_attn_norm;
    case QS_V_FFN_NORM: return &b->ffn_norm;
    case QS_V_POST_FFN_NORM: return &b->post_ffn_norm;
    case QS_V_PLE_POST_NORM: return &b->ple.post_norm;
    case QS_V_BQ: return &b->attn.bq;
    case QS_V_BK: return &b->attn.bk;
    case QS_V_BV: return &b->attn.bv;
    case QS_V_BO: return &b->attn.bo;
    case QS_V_BUP: return &b->ffn.b_up;
    case QS_V_BDOWN: return &b->ffn.b_down;
    case QS_V_POST_ATTN_NORM_B: return &b->post_attn_norm_b;
    case QS_V_POST_FFN_NORM_B: return &b->post_ffn_norm_b;
    default: return NULL;
    }
}

/* A vector slot's name (messages) and the length its vector must have when present. */
static inline const char *qs_plan_vec_name(int slot) {
    static const char *const names[QS_VECS] = {"none", "attn_norm", "post_attn_norm", "ffn_norm", "post_ffn_norm",
                                               "ple.post_norm", "attn.bq", "attn.bk", "attn.bv", "attn.bo",
                                               "ffn.b_up", "ffn.b_down", "post_attn_norm_b", "post_ffn_norm_b"};
    return slot > 0 && slot < QS_VECS ? names[slot] : "none";
}

static inline int64_t qs_plan_vec_len(const qs_block *b, int slot) {
    const int64_t QD = (int64_t)b->attn.n_head * b->attn.head_dim, KD = (int64_t)b->attn.n_head_kv * b->attn.head_dim;
    if (slot == QS_V_BUP) return b->ffn.n_ff;
    return slot == QS_V_BQ ? QD : slot == QS_V_BK || slot == QS_V_BV ? KD : b->n_embd;
}

/* The first vector slot whose vector is neither absent (NULL, 0) nor of its length (0: every one is). Both
 * backends check a description with it: a vector the plan names exists once, here. */
static inline int qs_plan_bad_vec(const qs_block *b) {
    for (int slot = 1; slot < QS_VECS; ++slot) {
        const qs_vec *v = qs_plan_vec(b, slot);
        if (v->ptr ? v->len != qs_plan_vec_len(b, slot) : v->len != 0) return slot;
    }
    return 0;
}

/* Append one step to steps[QS_PLAN_MAX] (a layer has at most 25: the last slot is reused rather than overrun). */
static inline qs_step *qs_plan_add(qs_step *steps, int max, int *n, int kind) {
    qs_step *s = &steps[*n < max ? (*n)++ : max - 1];
    memset(s, 0, sizeof *s);
    s->kind = kind;
    s->scale = 1.0f;
    return s;
}

static inline void qs_plan_norm(qs_step *steps, int max, int *n, int vec) {
    qs_step *s = qs_plan_add(steps, max, n, QS_STEP_NORM);
    s->src = QS_BUF_X;
    s->dst = QS_BUF_H;
    s->vec = vec;
}

static inline void qs_plan_tap(qs_step *steps, int max, int *n, int point, int src) {
    qs_step *s = qs_plan_add(steps, max, n, QS_STEP_TAP);
    s->arg = point;
    s->src = src;
}

static inline void qs_plan_proj(qs_step *steps, int max, int *n, int src, int count, const int *w, const int *out,
                                const int *bias) {
    qs_step *s = qs_plan_add(steps, max, n, QS_STEP_PROJ);
    s->src = src;
    s->n = count;
    for (int i = 0; i < count; ++i) {
        s->w[i] = w[i];
        s->out[i] = out[i];
        s->bias[i] = bias ? bias[i] : QS_V_NONE;
    }
}

static inline void qs_plan_residual(qs_step *steps, int max, int *n, int vec, float scale) {
    qs_step *s = qs_plan_add(steps, max, n, QS_STEP_RESIDUAL);
    s->src = QS_BUF_O;
    s->vec = vec;
    s->scale = scale;
}

/* BERT's residual: X = LayerNorm(X + scale * O) by vec and its bias. */
static inline void qs_plan_residual_ln(qs_step *steps, int max, int *n, int vec, int bias, float scale) {
    qs_plan_residual(steps, max, n, vec, scale);
    steps[*n - 1].arg = QS_RES_POST_LN;
    steps[*n - 1].bias[0] = bias;
}

static inline void qs_plan_glu(qs_step *steps, int max, int *n, int mode, int src, int src2, int dst) {
    qs_step *s = qs_plan_add(steps, max, n, QS_STEP_GLU);
    s->arg = mode;
    s->src = src;
    s->src2 = src2;
    s->dst = dst;
}

/* The steps of layer *b into steps[QS_PLAN_MAX]: their count. */
static inline int qs_plan_build(const qs_block *b, qs_step *steps) {
    const int max = QS_PLAN_MAX;
    const qs_attn_desc *A = &b->attn;
    const float rs = qs_plan_one(b->residual_scale);
    int n = 0;
    /* attention, or the delta-net mixer; without pre-norms (olmo2) on x itself */
    qs_plan_norm(steps, max, &n, b->attn_norm.ptr ? QS_V_ATTN_NORM : QS_V_NONE);
    qs_plan_tap(steps, max, &n, QS_TAP_ATTN_IN, QS_BUF_H);
    if (b->gdn.conv) {
        qs_step *s = qs_plan_add(steps, max, &n, QS_STEP_GDN);
        s->src = QS_BUF_H;
        s->dst = QS_BUF_O;
    } else {
        const int w[3] = {QS_W_WQ, QS_W_WK, QS_W_WV}, out[3] = {A->q_gate ? QS_BUF_QG : QS_BUF_Q, QS_BUF_K, QS_BUF_V};
        const int bias[3] = {A->q_gate || !A->bq.ptr ? QS_V_NONE : QS_V_BQ, A->bk.ptr ? QS_V_BK : QS_V_NONE,
                             A->bv.ptr ? QS_V_BV : QS_V_NONE};
        qs_plan_proj(steps, max, &n, QS_BUF_H, A->kv_reuse ? 1 : 3, w, out, bias); /* a reused cache: q alone */
        if (A->q_gate) {
            qs_step *s = qs_plan_add(steps, max, &n, QS_STEP_QGATE_SPLIT);
            s->src = QS_BUF_QG;
            s->dst = QS_BUF_Q;
            s->src2 = QS_BUF_GATE;
            s->bias[0] = A->bq.ptr ? QS_V_BQ : QS_V_NONE;
        }
        qs_plan_add(steps, max, &n, QS_STEP_QK_POST);
        qs_plan_tap(steps, max, &n, QS_TAP_Q, QS_BUF_Q);
        qs_step *s = qs_plan_add(steps, max, &n, QS_STEP_ATTEND);
        s->src = QS_BUF_Q;
        s->dst = QS_BUF_ATT;
        if (A->q_gate) {
            s = qs_plan_add(steps, max, &n, QS_STEP_QGATE);
            s->src = QS_BUF_GATE;
            s->dst = QS_BUF_ATT;
        }
        qs_plan_tap(steps, max, &n, QS_TAP_WO_IN, QS_BUF_ATT);
        const int wo[1] = {QS_W_WO}, oo[1] = {QS_BUF_O}, bo[1] = {A->bo.ptr ? QS_V_BO : QS_V_NONE};
        qs_plan_proj(steps, max, &n, QS_BUF_ATT, 1, wo, oo, bo);
    }
    if (b->post_ln) qs_plan_residual_ln(steps, max, &n, QS_V_POST_ATTN_NORM, QS_V_POST_ATTN_NORM_B, rs);
    else qs_plan_residual(steps, max, &n, b->post_attn_norm.ptr ? QS_V_POST_ATTN_NORM : QS_V_NONE, rs);
    /* feed-forward: dense, ungated (BERT), or the experts */
    qs_plan_norm(steps, max, &n, b->ffn_norm.ptr ? QS_V_FFN_NORM : QS_V_NONE);
    qs_plan_tap(steps, max, &n, QS_TAP_FFN_IN, QS_BUF_H);
    if (b->moe.n_expert) {
        qs_step *s = qs_plan_add(steps, max, &n, QS_STEP_MOE);
        s->src = QS_BUF_H;
        s->dst = QS_BUF_O;
    } else if (b->ffn.plain) {
        const int w[1] = {QS_W_UP}, out[1] = {QS_BUF_U}, bu[1] = {b->ffn.b_up.ptr ? QS_V_BUP : QS_V_NONE};
        qs_plan_proj(steps, max, &n, QS_BUF_H, 1, w, out, bu);
        qs_plan_glu(steps, max, &n, QS_GLU_GELU_PLAIN, QS_BUF_U, QS_BUF_U, QS_BUF_A);
        qs_plan_tap(steps, max, &n, QS_TAP_DOWN_IN, QS_BUF_A);
        const int wd[1] = {QS_W_DOWN}, od[1] = {QS_BUF_O}, bd[1] = {b->ffn.b_down.ptr ? QS_V_BDOWN : QS_V_NONE};
        qs_plan_proj(steps, max, &n, QS_BUF_A, 1, wd, od, bd);
    } else {
        const int w[2] = {QS_W_GATE, QS_W_UP}, out[2] = {QS_BUF_G, QS_BUF_U};
        const int bg[2] = {QS_V_NONE, b->ffn.b_up.ptr ? QS_V_BUP : QS_V_NONE}; /* jina-bert-v2's biases */
        qs_plan_proj(steps, max, &n, QS_BUF_H, 2, w, out, bg);
        qs_plan_glu(steps, max, &n, b->ffn.swiglu_oai ? QS_GLU_OAI : b->ffn.gelu ? QS_GLU_GELU : QS_GLU_SILU,
                    QS_BUF_G, QS_BUF_U, QS_BUF_A);
        qs_plan_tap(steps, max, &n, QS_TAP_DOWN_IN, QS_BUF_A);
        const int wd[1] = {QS_W_DOWN}, od[1] = {QS_BUF_O}, bd[1] = {b->ffn.b_down.ptr ? QS_V_BDOWN : QS_V_NONE};
        qs_plan_proj(steps, max, &n, QS_BUF_A, 1, wd, od, bd);
    }
    if (b->post_ln) qs_plan_residual_ln(steps, max, &n, QS_V_POST_FFN_NORM, QS_V_POST_FFN_NORM_B, rs);
    else qs_plan_residual(steps, max, &n, b->post_ffn_norm.ptr ? QS_V_POST_FFN_NORM : QS_V_NONE, rs);
    if (b->ple.dim) { /* gemma4's per-layer embedding: x += RMSNorm(proj(gelu(gate(x)) * inputs)) */
        qs_plan_norm(steps, max, &n, QS_V_NONE);
        const int wg[1] = {QS_W_PLE_GATE}, og[1] = {QS_BUF_PG};
        qs_plan_proj(steps, max, &n, QS_BUF_H, 1, wg, og, NULL);
        qs_plan_glu(steps, max, &n, QS_GLU_GELU, QS_BUF_PG, QS_BUF_PLE_IN, QS_BUF_PA);
        const int wp[1] = {QS_W_PLE_PROJ}, op[1] = {QS_BUF_O};
        qs_plan_proj(steps, max, &n, QS_BUF_PA, 1, wp, op, NULL);
        qs_plan_residual(steps, max, &n, QS_V_PLE_POST_NORM, 1.0f);
    }
    const float os = qs_plan_one(b->out_scale);
    if (os != 1.0f) {
        qs_step *s = qs_plan_add(steps, max, &n, QS_STEP_SCALE);
        s->scale = os;
    }
    return n;
}

/* The step after `i` that reads what step i wrote, skipping probe taps (-1: none). A backend that quantizes
 * activations as they are written (the CUDA backend) asks it which formats its consumer needs. */
static inline int qs_plan_consumer(const qs_step *steps, int n, int i) {
    int j = i + 1;
    while (j < n && steps[j].kind == QS_STEP_TAP) ++j;
    if (j >= n) return -1;
    const int k = steps[j].kind;
    return (k == QS_STEP_PROJ || k == QS_STEP_MOE || k == QS_STEP_GDN) && steps[j].src == steps[i].dst ? j : -1;
}

#endif
