/* Mixture-of-experts layers on the device (qs_block's moe group, as csrc/qs_block.c's moe_ffn computes them).
 *
 * Per layer and T tokens: the router (n_expert x n_embd, + b_router) scores the experts; per token a softmax, the
 * n_used largest probabilities (ties to the lower index: a stable descending sort), their weights normalized to
 * sum 1 (norm; the sum clamped below at 2^-14, as llama.cpp) and times scale (0: 1). Then expert by expert (in
 * ascending order, as the CPU adds them), only the tokens routed to it: their rows of h gathered, gate/up (+ b_gate,
 * b_up), SwiGLU or gpt-oss's clamped SwiGLU, down (+ b_down), each output row added with its token's weight. A
 * shared expert (qwen35moe) runs on every token; its output times sigmoid(h . sh_gate_inp) is added last.
 *
 * Three parts, one file:
 *   1. (every includer) the router math and the expert views as __host__ __device__ / host functions, and the
 *      host check of the group (moe_check, called by check_model) — qsc_host.cu tests them against the CPU;
 *   2. (QSC_MOE_KERNELS, after qsc_kernels.cuh) the per-layer device state and the kernels;
 *   3. (QSC_MOE_ENQUEUE, inside qsc_device.cu where qsc_model and launch_matmul are known) scratch and enqueue.
 * The expert matrices reuse k_matmul on a view of one expert's rows of the repacked tensor (correctness first):
 * the routing is copied back to the host once per layer to pick the views, so MoE models skip the CUDA graph. */

#include "qsc_common.cuh" /* (which includes this file for part 1 where check_model needs it) */

#ifndef QSC_MOE_MATH
#define QSC_MOE_MATH

#define QSC_MOE_MAX_EXPERTS 4096 /* the CPU block's QS_MAX_EXPERTS */

/* acc + w * x rounded like the CPU's separate multiply and add (no fused multiply-add on the device). */
HD float moe_madd(float acc, float w, float x) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(acc, __fmul_rn(w, x));
#else
    volatile float p = w * x; /* keep the host compiler from contracting too */
    return acc + p;
#endif
}

/* Softmax of n logits in place, the CPU's qs_softmax: max, expf(v - max), a double sum, one float reciprocal. A row
 * of -inf only: zeros. */
HD void moe_softmax(float *v, int n) {
    float mx = -INFINITY;
    for (int i = 0; i < n; ++i) mx = v[i] > mx ? v[i] : mx;
    if (mx == -INFINITY) {
        for (int i = 0; i < n; ++i) v[i] = 0.0f;
        return;
    }
    double sum = 0.0;
    for (int i = 0; i < n; ++i) {
        v[i] = expf(v[i] - mx);
        sum += v[i];
    }
    const float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; ++i) v[i] *= inv;
}

/* The k largest of p[0..n) into sel[0..k), largest first; on equal values the lower index first (and a NaN is
 * never larger: the first free index stands), exactly the CPU's selection loop. */
HD void moe_topk(const float *p, int n, int k, int32_t *sel) {
    for (int j = 0; j < k; ++j) {
        int best = -1;
        for (int e = 0; e < n; ++e) {
            bool taken = false;
            for (int i = 0; i < j; ++i) taken |= sel[i] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        sel[j] = best;
    }
}

/* The picked experts' weights: p[sel] / sum (norm; sum clamped below at 2^-14) or p[sel], times scale (0: 1). */
HD void moe_weights(const float *p, const int32_t *sel, int k, int norm, float scale, float *w) {
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += p[sel[j]];
    if (sum < 6.103515625e-5f) sum = 6.103515625e-5f;
    for (int j = 0; j < k; ++j) {
        float x = norm ? p[sel[j]] / sum : p[sel[j]];
        if (scale != 0.0f) x *= scale;
        w[j] = x;
    }
}

/* One token's routing from its router logits (bias already added; overwritten with the probabilities). */
HD void moe_route(float *logits, int n, int k, int norm, float scale, int32_t *sel, float *w) {
    moe_softmax(logits, n);
    moe_topk(logits, n, k, sel);
    moe_weights(logits, sel, k, norm, scale, w);
}

/* gpt-oss's clamped SwiGLU (qs_swiglu_oai): g = min(g, 7) (a NaN gate stays NaN), u = clamp(u, -7, 7). */
HD float moe_swiglu_oai(float gate, float up) {
    const float g = gate < 7.0f ? gate : 7.0f;
    const float u = up < -7.0f ? -7.0f : up > 7.0f ? 7.0f : up;
    return g / (1.0f + expf(-1.702f * g)) * (u + 1.0f);
}

HD float moe_silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/* Rows [e * rows, (e + 1) * rows) of a repacked matrix as a matrix of its own (one expert of a stacked tensor):
 * each section's bytes start block e * rows * nb further on. Host only (the type table lives on the host). */
static inline QW expert_view(const QW &w, int64_t e, int64_t rows) {
    const int64_t b0 = e * rows * w.nb;
    const int *fb = type_desc(w.type).field;
    QW v = w;
    v.rows = rows;
    v.qs = w.qs + b0 * fb[SEC_QS];
    v.qh = w.qh + b0 * fb[SEC_QH];
    v.sc = w.sc + b0 * fb[SEC_SC];
    v.d = (const __half *)((const uint8_t *)w.d + b0 * fb[SEC_D]);
    return v;
}

/* The moe group of layer li against the model's sizes (host only, before any device call): false with the
 * reason. The stacked gate / up / down tensors themselves are checked by check_model (n_expert matrices each). */
static inline bool moe_check(const qs_block &b, int li, const Dims &D, char *err, size_t err_len) {
    const qs_moe_desc &M = b.moe;
    const int64_t NE = M.n_expert, E = D.E, F = b.ffn.n_ff, FS = M.n_ff_shexp;
    if (NE <= 0 || NE > QSC_MOE_MAX_EXPERTS || M.n_used < 1 || M.n_used > NE || (M.norm != 0 && M.norm != 1) ||
        !isfinite(M.scale) || M.scale < 0.0f || FS < 0 || FS > (1 << 22)) {
        set_err(err, err_len, "layer %d: moe: %lld experts, %d used, norm %d, scale %g, shared FFN %lld out of range",
                li, (long long)NE, M.n_used, M.norm, (double)M.scale, (long long)FS);
        return false;
    }
    const struct { const char *name; const qs_weight *w; int64_t rows, k; } mats[] = {
        {"moe.router", &M.router, NE, E}, {"moe.sh_gate", &M.sh_gate, FS, E}, {"moe.sh_up", &M.sh_up, FS, E},
        {"moe.sh_down", &M.sh_down, E, FS}};
    for (int i = 0; i < 4; ++i) {
        const auto &m = mats[i];
        if (i > 0 && !FS) {
            if (m.w->ptr || m.w->rows || m.w->bytes) {
                set_err(err, err_len, "layer %d: %s given without a shared expert (n_ff_shexp 0)", li, m.name);
                return false;
            }
            continue;
        }
        if (!weight_ok(*m.w, m.rows, m.k)) {
            set_err(err, err_len, "layer %d: %s is %s%lld x %lld of type %d in %lld bytes; the GPU needs %lld x %lld "
                    "of a GPU type with the bytes that make", li, m.name, m.w->ptr ? "" : "missing: ",
                    (long long)m.w->rows, (long long)m.w->k, m.w->type, (long long)m.w->bytes, (long long)m.rows,
                    (long long)m.k);
            return false;
        }
    }
    const struct { const char *name; const qs_vec *v; int64_t n; bool required; } vecs[] = {
        {"moe.b_router", &M.b_router, NE, false}, {"moe.b_gate", &M.b_gate, NE * F, false},
        {"moe.b_up", &M.b_up, NE * F, false}, {"moe.b_down", &M.b_down, NE * E, false},
        {"moe.sh_gate_inp", &M.sh_gate_inp, FS ? E : 0, FS > 0}};
    for (const auto &v : vecs)
        if (!vec_ok(*v.v, v.n, v.required) || (!v.n && (v.v->ptr || v.v->len))) {
            set_err(err, err_len, "layer %d: %s has %lld values%s, expected %lld", li, v.name, (long long)v.v->len,
                    v.v->ptr ? "" : " and no data", (long long)v.n);
            return false;
        }
    if (b.ffn.swiglu_oai != 0 && b.ffn.swiglu_oai != 1) {
        set_err(err, err_len, "layer %d: swiglu_oai %d out of range", li, b.ffn.swiglu_oai);
        return false;
    }
    return true;
}

#endif /* QSC_MOE_MATH */

/* ================================================================================================ 2. kernels */
#if defined(QSC_MOE_KERNELS) && !defined(QSC_MOE_KERNELS_DONE)
#define QSC_MOE_KERNELS_DONE

/* One layer's moe group on the device (n_expert 0: a dense layer). The stacked gate / up / down tensors are the
 * layer's ffn matrices (Layer::gate, up, down); absent vectors NULL. */
struct MoeLayer {
    int n_expert = 0, n_used = 0, norm = 0, n_ff_shexp = 0, oai = 0;
    float scale = 0.0f;
    DevMat router, sh_gate, sh_up, sh_down;
    float *b_router = nullptr, *b_gate = nullptr, *b_up = nullptr, *b_down = nullptr, *sh_gate_inp = nullptr;
};

/* What upload_model copies for a moe group: the matrices and vectors, by name. */
struct MoeMat {
    const char *name;
    const qs_weight *w;
    DevMat *dm;
};
struct MoeVec {
    const qs_vec *v;
    float **dst;
};
static inline int moe_parts(const qs_block &b, MoeLayer &ml, MoeMat *mats, MoeVec *vecs, int *n_vecs) {
    const qs_moe_desc &M = b.moe;
    ml.n_expert = M.n_expert;
    ml.n_used = M.n_used;
    ml.norm = M.norm;
    ml.scale = M.scale;
    ml.n_ff_shexp = M.n_ff_shexp;
    ml.oai = b.ffn.swiglu_oai;
    int n = 0;
    mats[n++] = {"moe.router", &M.router, &ml.router};
    if (M.n_ff_shexp) {
        mats[n++] = {"moe.sh_gate", &M.sh_gate, &ml.sh_gate};
        mats[n++] = {"moe.sh_up", &M.sh_up, &ml.sh_up};
        mats[n++] = {"moe.sh_down", &M.sh_down, &ml.sh_down};
    }
    const MoeVec v[5] = {{&M.b_router, &ml.b_router}, {&M.b_gate, &ml.b_gate}, {&M.b_up, &ml.b_up},
                         {&M.b_down, &ml.b_down}, {&M.sh_gate_inp, &ml.sh_gate_inp}};
    for (int i = 0; i < 5; ++i) vecs[i] = v[i];
    *n_vecs = 5;
    return n;
}

/* Routing, one thread per token: logits [T][NE] (probabilities afterwards) -> sel, w [T][K]. */
__global__ void k_moe_route(float *__restrict__ logits, int T, int NE, int K, int norm, float scale,
                            int32_t *__restrict__ sel, float *__restrict__ w) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    moe_route(logits + (int64_t)t * NE, NE, K, norm, scale, sel + (int64_t)t * K, w + (int64_t)t * K);
}

/* Row i of hb = row pairs[i] / K of h, then hb's row into the int8 formats in ao. One block per row. */
__global__ void __launch_bounds__(256) k_moe_gather(const float *__restrict__ h, const int32_t *__restrict__ pairs,
                                                    int K, float *__restrict__ hb, const ActOut ao, int E) {
    const int64_t i = blockIdx.x, t = pairs[i] / K;
    for (int c = threadIdx.x; c < E; c += blockDim.x) hb[i * E + c] = h[t * E + c];
    __syncthreads();
    block_quantize_row(hb + i * E, E, ao, i);
}

/* a = act(g) * u (SwiGLU, or gpt-oss's clamped one), then a's row into the int8 formats. One block per row. */
__global__ void __launch_bounds__(256) k_moe_glu(const float *__restrict__ g, const float *__restrict__ u,
                                                 float *__restrict__ a, const ActOut ao, int n, int oai) {
    const int64_t row = blockIdx.x;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float gg = g[row * n + i], uu = u[row * n + i];
        a[row * n + i] = oai ? moe_swiglu_oai(gg, uu) : moe_silu_mul(gg, uu);
    }
    __syncthreads();
    block_quantize_row(a + row * n, n, ao, row);
}

/* out[pairs[i] / K] += w[pairs[i]] * ob[i]: one expert's rows (a token picks an expert once: no two blocks write
 * the same row). One block per row. */
__global__ void __launch_bounds__(256) k_moe_scatter(const float *__restrict__ ob, const int32_t *__restrict__ pairs,
                                                     int K, const float *__restrict__ w, float *__restrict__ out,
                                                     int E) {
    const int64_t i = blockIdx.x, p = pairs[i], t = p / K;
    const float wt = w[p];
    for (int c = threadIdx.x; c < E; c += blockDim.x) out[t * E + c] = moe_madd(out[t * E + c], wt, ob[i * E + c]);
}

/* The shared expert's output so, times sigmoid(h . gate_inp), added to out. One block per token. */
__global__ void __launch_bounds__(256) k_moe_shared_add(const float *__restrict__ h, const float *__restrict__ gate_inp,
                                                        const float *__restrict__ so, float *__restrict__ out, int E) {
    __shared__ float red[32];
    const int64_t t = blockIdx.x;
    float z = 0.0f;
    for (int c = threadIdx.x; c < E; c += blockDim.x) z += h[t * E + c] * gate_inp[c];
    z = block_sum(z, red);
    const float wt = 1.0f / (1.0f + expf(-z));
    for (int c = threadIdx.x; c < E; c += blockDim.x) out[t * E + c] = moe_madd(out[t * E + c], wt, so[t * E + c]);
}

/* Scratch of the moe layers, sized for mb tokens and the largest group (allocated by moe_finalize). */
struct MoeScratch {
    int64_t ne = 0, k = 0, fs = 0, kmax = 0;
    float *logits = nullptr, *wsel = nullptr, *hb = nullptr, *ob = nullptr;
    float *sg = nullptr, *su = nullptr, *sa = nullptr, *so = nullptr;
    int32_t *sel = nullptr, *pairs = nullptr;
    int32_t *h_sel = nullptr, *h_pairs = nullptr; /* pinned host copies */
    int8_t *qs32 = nullptr, *qs256 = nullptr;
    float *d32 = nullptr, *s32 = nullptr, *d256 = nullptr;
    int *bs256 = nullptr;
};

static inline void moe_free_host(MoeScratch &s) {
    if (s.h_sel) cudaFreeHost(s.h_sel);
    if (s.h_pairs) cudaFreeHost(s.h_pairs);
    s.h_sel = s.h_pairs = nullptr;
}

#endif /* QSC_MOE_KERNELS */

/* ================================================================================================ 3. enqueue */
#if defined(QSC_MOE_ENQUEUE) && !defined(QSC_MOE_ENQUEUE_DONE)
#define QSC_MOE_ENQUEUE_DONE

/* The scratch for every moe layer of m (nothing without one). */
static int moe_finalize(qsc_model *m, char *err, size_t err_len) {
    MoeScratch &s = m->moe_s;
    for (const Layer &L : m->layers) {
        const MoeLayer &ml = L.moe;
        if (!ml.n_expert) continue;
        s.ne = s.ne > ml.n_expert ? s.ne : ml.n_expert;
        s.k = s.k > ml.n_used ? s.k : ml.n_used;
        s.fs = s.fs > ml.n_ff_shexp ? s.fs : ml.n_ff_shexp;
    }
    if (!s.ne) return 0;
    m->has_moe = true;
    const int64_t T = m->mb, E = m->cfg.E, F = m->cfg.max_f, FS = s.fs;
    int64_t kmax = E > F ? E : F;
    kmax = kmax > FS ? kmax : FS;
    s.kmax = kmax;
    int rc = 0;
    rc = rc ? rc : dalloc_t(m, &s.logits, T * s.ne, err, err_len);
    rc = rc ? rc : dalloc_t(m, &s.wsel, T * s.k, err, err_len);
    rc = rc ? rc : dalloc_t(m, &s.sel, T * s.k, err, err_len);
    rc = rc ? rc : dalloc_t(m, &s.pairs, T * s.k, err, err_len);
    rc = rc ? rc : dalloc_t(m, &s.hb, T * E, err, err_len);
    rc = rc ? rc : dalloc_t(m, &s.ob, T * E, err, err_len);
    if (FS) {
        rc = rc ? rc : dalloc_t(m, &s.sg, T * FS, err, err_len);
        rc = rc ? rc : dalloc_t(m, &s.su, T * FS, err, err_len);
        rc = rc ? rc : dalloc_t(m, &s.sa, T * FS, err, err_len);
        rc = rc ? rc : dalloc_t(m, &s.so, T * E, err, err_len);
    }
    rc = rc ? rc : dalloc_t(m, &s.qs32, T * kmax, err, err_len);
    rc = rc ? rc : dalloc_t(m, &s.qs256, T * kmax, err, err_len);
    rc = rc ? rc : dalloc_t(m, &s.d32, T * kmax / 32, err, err_len);
    rc = rc ? rc : dalloc_t(m, &s.s32, T * kmax / 32, err, err_len);
    rc = rc ? rc : dalloc_t(m, &s.d256, T * kmax / 256 + 1, err, err_len);
    rc = rc ? rc : dalloc_t(m, &s.bs256, T * kmax / 16, err, err_len);
    if (rc) return rc;
    CUDA_TRY(cudaMallocHost((void **)&s.h_sel, (size_t)(T * s.k) * sizeof(int32_t)));
    CUDA_TRY(cudaMallocHost((void **)&s.h_pairs, (size_t)(T * s.k) * sizeof(int32_t)));
    return 0;
}

/* The moe scratch's activation buffers for the formats `types` consume (ActOut) and as one matrix's input (Act). */
static ActOut moe_act_out(const MoeScratch &s, std::initializer_list<int> types) {
    ActOut o = {};
    for (int t : types) {
        if (type_act(t) == ACT_32) { o.qs32 = s.qs32; o.d32 = s.d32; o.s32 = s.s32; }
        if (type_act(t) == ACT_256) { o.qs256 = s.qs256; o.d256 = s.d256; o.bs256 = s.bs256; }
    }
    return o;
}
static Act moe_act(const MoeScratch &s, int type, const float *f, int64_t k) {
    Act a;
    const bool k256 = type_act(type) == ACT_256;
    a.qs = k256 ? s.qs256 : s.qs32;
    a.d = k256 ? s.d256 : s.d32;
    a.s = s.s32;
    a.bs = s.bs256;
    a.f = f;
    a.k = k;
    return a;
}

/* The formats the layer's input h must be quantized to (router and shared expert read m->h's int8 copies). */
static ActOut moe_input_formats(const qsc_model *m, const MoeLayer &ml) {
    const int r = ml.router.w.type;
    return ml.n_ff_shexp ? act_out_for(m, {r, ml.sh_gate.w.type, ml.sh_up.w.type}) : act_out_for(m, {r});
}

/* The moe FFN of m->h (T rows, quantized per moe_input_formats) into m->o. Synchronizes the stream once (the
 * routing comes back to pick the experts' views): not for CUDA graph capture. */
static int enqueue_moe(qsc_model *m, const Layer &L, int T, char *err, size_t err_len) {
    const MoeLayer &ml = L.moe;
    MoeScratch &s = m->moe_s;
    const int E = m->cfg.E, F = L.F, NE = ml.n_expert, K = ml.n_used, FS = ml.n_ff_shexp;
    cudaStream_t st = m->st;
    MatJob rj = {&ml.router.w, act_view(m, ml.router.w.type, m->h, E, 0), s.logits, NE, ml.b_router};
    launch_matmul(m->fast, &rj, 1, T, st);
    k_moe_route<<<(T + 63) / 64, 64, 0, st>>>(s.logits, T, NE, K, ml.norm, ml.scale, s.sel, s.wsel);
    CUDA_TRY(cudaGetLastError());
    CUDA_TRY(cudaMemcpyAsync(s.h_sel, s.sel, (size_t)T * K * sizeof(int32_t), cudaMemcpyDeviceToHost, st));
    if (FS) { /* the shared expert meanwhile: it reads m->h's int8 copies, which the experts below leave alone */
        const QW &g = ml.sh_gate.w, &u = ml.sh_up.w, &d = ml.sh_down.w;
        MatJob gu[2] = {{&g, act_view(m, g.type, m->h, E, 0), s.sg, FS, nullptr},
                        {&u, act_view(m, u.type, m->h, E, 0), s.su, FS, nullptr}};
        launch_matmul(m->fast, gu, 2, T, st);
        k_moe_glu<<<T, 256, 0, st>>>(s.sg, s.su, s.sa, moe_act_out(s, {d.type}), FS, 0);
        MatJob dj = {&d, moe_act(s, d.type, s.sa, FS), s.so, E, nullptr};
        launch_matmul(m->fast, &dj, 1, T, st);
    }
    CUDA_TRY(cudaMemsetAsync(m->o, 0, (size_t)T * E * sizeof(float), st));
    CUDA_TRY(cudaStreamSynchronize(st));
    /* (token, slot) pairs by expert, each expert's in token order: the CPU's grouping */
    std::vector<int64_t> start((size_t)NE + 1, 0);
    for (int i = 0; i < T * K; ++i) {
        const int e = s.h_sel[i];
        if (e < 0 || e >= NE) {
            set_err(err, err_len, "moe routing picked expert %d of %d (non-finite router logits?)", e, NE);
            return -1;
        }
        start[(size_t)e + 1]++;
    }
    for (int e = 0; e < NE; ++e) start[(size_t)e + 1] += start[(size_t)e];
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (int i = 0; i < T * K; ++i) s.h_pairs[fill[(size_t)s.h_sel[i]]++] = i;
    CUDA_TRY(cudaMemcpyAsync(s.pairs, s.h_pairs, (size_t)T * K * sizeof(int32_t), cudaMemcpyHostToDevice, st));
    const QW &G = L.gate.w, &U = L.up.w, &D = L.down.w;
    for (int e = 0; e < NE; ++e) {
        const int n = (int)(start[(size_t)e + 1] - start[(size_t)e]);
        if (!n) continue;
        const int32_t *pairs = s.pairs + start[(size_t)e];
        const QW ge = expert_view(G, e, F), ue = expert_view(U, e, F), de = expert_view(D, e, E);
        k_moe_gather<<<n, 256, 0, st>>>(m->h, pairs, K, s.hb, moe_act_out(s, {G.type, U.type}), E);
        MatJob gu[2] = {{&ge, moe_act(s, G.type, s.hb, E), m->g, F, ml.b_gate ? ml.b_gate + (int64_t)e * F : nullptr},
                        {&ue, moe_act(s, U.type, s.hb, E), m->u, F, ml.b_up ? ml.b_up + (int64_t)e * F : nullptr}};
        launch_matmul(m->fast, gu, 2, n, st);
        k_moe_glu<<<n, 256, 0, st>>>(m->g, m->u, m->a, moe_act_out(s, {D.type}), F, ml.oai);
        MatJob dj = {&de, moe_act(s, D.type, m->a, F), s.ob, E, ml.b_down ? ml.b_down + (int64_t)e * E : nullptr};
        launch_matmul(m->fast, &dj, 1, n, st);
        k_moe_scatter<<<n, 256, 0, st>>>(s.ob, pairs, K, s.wsel, m->o, E);
    }
    if (FS) k_moe_shared_add<<<T, 256, 0, st>>>(m->h, ml.sh_gate_inp, s.so, m->o, E);
    CUDA_TRY(cudaGetLastError());
    return 0;
}

#endif /* QSC_MOE_ENQUEUE */

/* ================================================================================= 4. single-layer test entry */
#if defined(QSC_MOE_ENTRY) && !defined(QSC_MOE_ENTRY_DONE)
#define QSC_MOE_ENTRY_DONE

/* One layer's moe FFN of h [n_tokens][n_embd] on the device (enqueue_moe on a one-layer model holding only the
 * layer's moe group), for tests against the CPU block and the host build. Checked like qsc_host_moe_ffn before any
 * device call. */
extern "C" int qsc_kernel_moe_ffn(const qs_block *b, const float *h, int n_tokens, float *out, char *err,
                                  size_t err_len) {
    if (!b || !h || !out || n_tokens <= 0 || n_tokens > 4096 || b->moe.n_expert <= 0) {
        set_err(err, err_len, "no block, input or output, no experts, or n_tokens %d outside 1..4096", n_tokens);
        return -1;
    }
    Dims D = {};
    D.E = b->n_embd;
    const int n_ff = b->ffn.n_ff;
    if (D.E <= 0 || n_ff <= 0 || D.E % 32 || n_ff % 32) {
        set_err(err, err_len, "n_embd %d / n_ff %d must be positive multiples of 32", D.E, n_ff);
        return -1;
    }
    if (!moe_check(*b, 0, D, err, err_len)) return -1;
    const int64_t NE = b->moe.n_expert, E = D.E, F = n_ff;
    const struct { const char *name; const qs_weight *w; int64_t rows, k; } want[3] = {
        {"ffn.gate", &b->ffn.gate, NE * F, E}, {"ffn.up", &b->ffn.up, NE * F, E}, {"ffn.down", &b->ffn.down, NE * E, F}};
    for (const auto &x : want)
        if (!weight_ok(*x.w, x.rows, x.k)) {
            set_err(err, err_len, "%s is %lld x %lld, expected %lld x %lld of a GPU type", x.name,
                    (long long)x.w->rows, (long long)x.w->k, (long long)x.rows, (long long)x.k);
            return -1;
        }
    qsc_model *m = new qsc_model();
    struct Guard {
        qsc_model *m;
        ~Guard() { qsc_model_free(m); }
    } guard{m};
    m->cfg = D;
    m->cfg.n_layers = 1;
    m->cfg.max_qd = m->cfg.max_kd = 32;
    m->cfg.max_f = F;
    m->cfg.V = 1;
    m->mb = n_tokens;
    m->layers.resize(1);
    CUDA_TRY(cudaSetDevice(m->device));
    CUDA_TRY(cudaStreamCreateWithFlags(&m->st, cudaStreamNonBlocking));
    Layer &L = m->layers[0];
    L.H = L.KV = 1;
    L.hd = 32;
    L.F = (int)F;
    const struct { const char *name; const qs_weight *w; DevMat *dm; } mats[3] = {
        {"ffn.gate", &b->ffn.gate, &L.gate}, {"ffn.up", &b->ffn.up, &L.up}, {"ffn.down", &b->ffn.down, &L.down}};
    for (const auto &x : mats) {
        int rc = upload_matrix(m, *x.w, x.dm, x.name, err, err_len);
        if (rc) return rc;
    }
    MoeMat mm[4];
    MoeVec mv[5];
    int nv = 0, nm = moe_parts(*b, L.moe, mm, mv, &nv);
    for (int j = 0; j < nm; ++j) {
        int rc = upload_matrix(m, *mm[j].w, mm[j].dm, mm[j].name, err, err_len);
        if (rc) return rc;
    }
    for (int j = 0; j < nv; ++j) {
        int rc = upload_vector(m, *mv[j].v, mv[j].dst, err, err_len);
        if (rc) return rc;
    }
    int rc = finalize(m, err, err_len);
    if (rc) return rc;
    const int T = n_tokens;
    CUDA_TRY(cudaMemcpyAsync(m->h, h, (size_t)T * E * sizeof(float), cudaMemcpyHostToDevice, m->st));
    k_quantize<<<T, 256, 0, m->st>>>(m->h, moe_input_formats(m, L.moe), (int)E);
    rc = enqueue_moe(m, L, T, err, err_len);
    if (rc) return rc;
    CUDA_TRY(cudaMemcpyAsync(out, m->o, (size_t)T * E * sizeof(float), cudaMemcpyDeviceToHost, m->st));
    CUDA_TRY(cudaStreamSynchronize(m->st));
    return 0;
}

#endif /* QSC_MOE_ENTRY */
