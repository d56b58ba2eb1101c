/* The CUDA backend's model: weights uploaded once (repacked, still quantized), a GPU-resident KV cache, scratch
 * buffers allocated once, and the whole forward pass enqueued on one stream. A one-token step is captured into a
 * CUDA graph the first time and replayed afterwards: one graph launch, one host round-trip (logits back) per token.
 *
 * Launches per token and layer: norm_quant, qkv matmul, qk_post, attention (+quantize), output matmul, norm_quant,
 * gate/up matmul, glu_quant, down matmul = 9; plus embed, final norm, lm_head and the two copies. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include <mutex>
#include <vector>

#include "qsc_debug.cuh" /* QUANTSCOPE_CUDA_DEBUG: QSC_DBG after every launch */
#include "qsc_emul.cuh"
#include "qsc_kernels.cuh"
#include "qsc_fast.cuh" /* tensor-core prefill GEMM, flash attention, decode GEMV */
#define QSC_FD_KERNELS
#include "qsc_decode.cuh" /* flash-decoding: decode attention split across blocks */
#include "../qs_plan.h" /* the layer as a plan: the steps this file walks */

#ifndef QSC_ARCHS
#define QSC_ARCHS "?"
#endif

/* Every CUDA call is checked; the message names the call, the error and its code. */
#define CUDA_TRY(call)                                                                                            \
    do {                                                                                                          \
        cudaError_t e_ = (call);                                                                                  \
        if (e_ != cudaSuccess) {                                                                                  \
            set_err(err, err_len, "%s: %s (%s = %d)", #call, cudaGetErrorString(e_), cudaGetErrorName(e_), (int)e_); \
            return -1000 - (int)e_;                                                                               \
        }                                                                                                         \
    } while (0)

struct DevMat {
    QW w;
    uint8_t *buf = nullptr;
    bool present = false;
};

#define QSC_MOE_KERNELS
#include "qsc_moe.cuh" /* mixture-of-experts: MoeLayer, MoeScratch, the routing and expert kernels */
#define QSC_GDN_KERNELS
#include "qsc_gdn.cuh" /* gated delta-net and gated attention: GdnLayer, GdnModel, their kernels */

/* One layer on the device: its description's attention and FFN groups (absent vectors NULL), its own sizes, its
 * policy, and its plan (qs_plan.h), which resolves the description's 0-means-1 scales. */
struct Layer {
    DevMat wq, wk, wv, wo, gate, up, down, ple_gate, ple_proj;
    int kv_reuse = 0; /* attends to an earlier layer's cache (kv_off is that layer's): no K, V of its own */
    float *vec[QS_VECS] = {}; /* the vectors the plan names (norms, biases), by slot (qs_plan_vec); NULL: absent */
    float *q_norm = nullptr, *k_norm = nullptr, *sinks = nullptr, *rope_freqs = nullptr;
    int H = 0, KV = 0, hd = 0, F = 0, window = 0, qk_full = 0;
    float eps = 0.0f, scale = 0.0f, softcap = 0.0f; /* (residual and output scales: the plan's steps) */
    QKArgs qk = {};
    int64_t kv_off = 0; /* this layer's bytes in the K (and V) cache */
    MoeLayer moe; /* n_expert 0: a dense FFN */
    GdnLayer gdn; /* gdn.g.K 0: attention (else the delta-net mixer replaces it); gdn.q_gate: gated outputs */
    qs_step plan[QS_PLAN_MAX]; /* the layer's steps (qs_plan.h: the list the CPU block walks too) */
    int n_steps = 0;
};

struct Launch;

struct qsc_model {
    Dims cfg; /* read from the description by check_model */
    int n_ctx, kv_f16, mb, device;
    std::vector<Layer> layers;
    DevMat tok, out;
    bool tied = false, finalized = false, use_graphs = true;
    bool host = false; /* qsc_host_model_create: every buffer in host memory, the kernels' host twins run instead */
    const Launch *ops = nullptr; /* the kernels, or their host twins: chosen when the model is made */
    FastPaths fast;              /* the fast paths its launches may take (qsc_fast.cuh: env switches, hardware) */
    float *out_norm = nullptr;
    uint8_t *k_cache = nullptr, *v_cache = nullptr;
    /* scratch, sized for mb tokens */
    float *x, *h, *q, *k, *v, *att, *o, *g, *u, *a;
    float *pg = nullptr, *pa = nullptr;     /* gemma4's per-layer embedding: [mb][ple_pad], pads kept 0 */
    float *d_ple = nullptr, *h_ple = nullptr; /* the call's per-layer inputs [mb][n_layers][ple] (device, pinned) */
    int8_t *qs32, *qs256;
    float *d32, *s32, *d256;
    int *bs256;
    int *d_params, *h_params;     /* tokens[mb], pos[mb], n_kv: device copy and its pinned host source */
    float *d_logits1, *h_logits1; /* last-token logits (device, pinned host) */
    float *d_logits_all = nullptr;
    int64_t logits_all_rows = 0;
    cudaStream_t st = nullptr;
    cudaGraphExec_t gexec = nullptr;  /* the one-token step's graph: logits out */
    cudaGraphExec_t gresid = nullptr; /* qsc_forward_resid's: the stream out (no head) */
    float *h_resid1 = nullptr;        /* its pinned copy of one token's stream */
    bool stepped = false; /* a one-token step ran without capture: every kernel it uses is loaded */
    int64_t dev_bytes = 0;
    std::vector<void *> allocs;
    MoeScratch moe_s;
    GdnModel gdn; /* the delta-net layers' scratch and the session's recurrent state; the gated attention's */
    bool has_moe = false; /* some layer has experts (their routing stays on the device: graphs as dense) */
    std::mutex mu;
    struct QscProbe *probe = nullptr; /* qsc_probe.cuh: traces, statistics (NULL: none asked for) */
    float *h_resid = nullptr; /* qsc_forward_resid's host buffer: the stream after the last layer (NULL: none) */
    float *fd_part = nullptr; /* flash-decoding's partials (qsc_decode.cuh; fd_scratch_floats) */
    int fd_sm = 0;            /* the SM count its split counts assume (the host model: FD_HOST_SMS) */
    bool no_head = false;     /* qsc_forward_resid: the stream only (no lm_head; the final norm still adds the last
                                 residual to it) */
    QscDebug dbg;             /* QUANTSCOPE_CUDA_DEBUG (qsc_debug.cuh): every launch checked, the first fault kept */
    float *h_stage = nullptr; /* pinned staging of all-token logits and traces (lazily, sized to the chunk) */
    size_t stage_bytes = 0;
};

static int dalloc(qsc_model *m, void **p, int64_t bytes, char *err, size_t err_len) {
    bytes = (bytes + 255) / 256 * 256;
    if (bytes == 0) bytes = 256;
    if (m->host) {
        *p = calloc((size_t)bytes, 1);
        if (!*p) {
            set_err(err, err_len, "out of host memory (%lld bytes)", (long long)bytes);
            return -2;
        }
    } else {
        CUDA_TRY(cudaMalloc(p, (size_t)bytes));
    }
    m->allocs.push_back(*p);
    m->dev_bytes += bytes;
    return 0;
}

template <typename T> static int dalloc_t(qsc_model *m, T **p, int64_t count, char *err, size_t err_len) {
    void *v = nullptr;
    int rc = dalloc(m, &v, count * (int64_t)sizeof(T), err, err_len);
    *p = (T *)v;
    return rc;
}

/* Host bytes into a buffer of the model (device memory, or host memory for a host model). */
static int copy_in(qsc_model *m, void *dst, const void *src, size_t bytes, char *err, size_t err_len) {
    if (m->host) {
        memcpy(dst, src, bytes);
        return 0;
    }
    CUDA_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    return 0;
}

/* ------------------------------------------------------------------------------------------------ launches */
static Act act_view(const qsc_model *m, int type, const float *f, int64_t k, int64_t row0) {
    Act a;
    const bool k256 = type_act(type) == ACT_256;
    a.qs = (k256 ? m->qs256 : m->qs32) + row0 * k;
    a.d = k256 ? m->d256 + row0 * (k / 256) : m->d32 + row0 * (k / 32);
    a.s = m->s32 + row0 * (k / 32);
    a.bs = m->bs256 + row0 * (k / 16);
    a.f = f + row0 * k;
    a.k = k;
    return a;
}

/* The int8 formats that products of these weight types read (NULL pointers: not produced). */
static ActOut act_out_types(const qsc_model *m, const int *types, int n) {
    bool n32 = false, n256 = false;
    for (int i = 0; i < n; ++i) {
        n32 |= type_act(types[i]) == ACT_32;
        n256 |= type_act(types[i]) == ACT_256;
    }
    ActOut o = {};
    if (n32) { o.qs32 = m->qs32; o.d32 = m->d32; o.s32 = m->s32; }
    if (n256) { o.qs256 = m->qs256; o.d256 = m->d256; o.bs256 = m->bs256; }
    return o;
}

static ActOut act_out_for(const qsc_model *m, std::initializer_list<int> types) {
    return act_out_types(m, types.begin(), (int)types.size());
}

struct MatJob {
    const QW *w;
    Act a;
    float *y;
    int64_t ldy;
    const float *bias;
};

/* A launch's matrices as the fast paths' segments (MmaArgs: at most three, blk0 laid out by the launcher). */
static MmaArgs mat_args(const MatJob *jobs, int n, int ncols) {
    MmaArgs a = {};
    for (int i = 0; i < n && i < 3; ++i) a.seg[i] = {*jobs[i].w, jobs[i].a, jobs[i].y, jobs[i].ldy, jobs[i].bias, 0};
    a.nseg = n;
    a.ncols = ncols;
    return a;
}

/* A matmul launch's name and sizes for the debug mode: "kernel<types>", rows per matrix, k, cols. */
static const char *type_name(int type) {
    switch (type) {
#define QSC_ROW_NAME(F, N, ID, ACT, GEMV, MMA) case ID: return #N;
        QSC_TYPE_LIST(QSC_ROW_NAME, _)
#undef QSC_ROW_NAME
    default: return "?";
    }
}
static void matmul_dbg(cudaStream_t st, const char *kernel, dim3 grid, int threads, const MatJob *jobs, int n,
                       int ncols) {
    char name[96], rows[64];
    int a = snprintf(name, sizeof name, "%s<", kernel), b = 0;
    for (int i = 0; i < n; ++i) {
        a += snprintf(name + a, sizeof name - (size_t)a, "%s%s", i ? "," : "", type_name(jobs[i].w->type));
        b += snprintf(rows + b, sizeof rows - (size_t)b, "%s%lld", i ? "+" : "", (long long)jobs[i].w->rows);
        a = a < 95 ? a : 95;
        b = b < 63 ? b : 63;
    }
    snprintf(name + a, sizeof name - (size_t)a, ">");
    qsc_dbg_after(st, name, grid, dim3(threads), "rows %s, k %lld, cols %d", rows, (long long)jobs[0].w->k, ncols);
}

/* The kernel matmul_path chooses (qsc_fast.cuh; host_matmul runs the same choice's twin). */
static void launch_matmul(const FastPaths &fp, const MatJob *jobs, int n, int ncols, cudaStream_t st) {
    const MmaArgs fa = mat_args(jobs, n, ncols);
    const int path = took(matmul_path(fp, fa));
    if (path == QSC_PATH_GEMV || path == QSC_PATH_MMA) {
        bool piped = false;
        if (path == QSC_PATH_GEMV) launch_gemv(fa, st);              /* decode GEMV */
        else piped = launch_matmul_mma(fa, st, fp.mma_pipe);         /* tensor-core prefill */
        if (qsc_dbg_cur) { /* the launcher's grid, from its tile sizes */
            const int64_t tile = ncols == 1 ? GEMV_WARPS : MMA_BM;
            unsigned gx = 0;
            for (int i = 0; i < n; ++i) gx += (unsigned)((jobs[i].w->rows + tile - 1) / tile);
            const dim3 grid(gx, ncols == 1 ? 1u : (unsigned)((ncols + MMA_BN - 1) / MMA_BN));
            matmul_dbg(st, ncols == 1 ? "k_gemv" : piped ? "k_matmul_mma_pipe" : "k_matmul_mma", grid,
                       ncols == 1 ? GEMV_WARPS * 32 : MMA_THREADS, jobs, n, ncols);
        }
        return;
    }
    MMArgs args = {};
    int blocks = 0;
    for (int i = 0; i < n; ++i) {
        MMSeg &s = args.seg[i];
        s.w = *jobs[i].w;
        s.a = jobs[i].a;
        s.y = jobs[i].y;
        s.ldy = jobs[i].ldy;
        s.bias = jobs[i].bias;
        s.blk0 = blocks;
        blocks += (int)((jobs[i].w->rows + MM_WARPS - 1) / MM_WARPS);
    }
    args.nseg = n;
    args.ncols = ncols;
    if (ncols == 1) {
        k_matmul<1><<<dim3(blocks, 1), MM_WARPS * 32, 0, st>>>(args);
        if (qsc_dbg_cur) matmul_dbg(st, "k_matmul<1>", dim3(blocks, 1), MM_WARPS * 32, jobs, n, ncols);
    } else {
        k_matmul<8><<<dim3(blocks, (ncols + 7) / 8), MM_WARPS * 32, 0, st>>>(args);
        if (qsc_dbg_cur)
            matmul_dbg(st, "k_matmul<8>", dim3(blocks, (ncols + 7) / 8), MM_WARPS * 32, jobs, n, ncols);
    }
}

/* Elements per lane of the attention kernel for a head size: the instantiated EPL at least hd / 32 (any head size
 * up to QSC_MAX_HEAD). */
static int attention_epl(int hd) {
    static const int epls[] = {1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32};
    for (int e : epls)
        if (32 * e >= hd) return e;
    return 0;
}

template <typename KT>
static void launch_attention_t(dim3 grid, cudaStream_t st, const float *q, const int *pos, const AttnArgs &A,
                               const void *kc, const void *vc, const int *nkv, float *out, const ActOut &ao) {
    const KT *K = (const KT *)kc, *V = (const KT *)vc;
#define QSC_ATT(E)                                                                                              \
    case E:                                                                                                     \
        k_attention<E, KT><<<grid, 256, 0, st>>>(q, pos, A.H, A.KV, A.hd, K, V, nkv, A.window, A.scale,       \
                                                 A.softcap, A.sinks, out, ao);                                \
        QSC_DBG(st, sizeof(KT) == 2 ? "k_attention<" #E ", half>" : "k_attention<" #E ", float>", grid, 256,   \
                "heads %d/%d, head_dim %d, window %d", A.H, A.KV, A.hd, A.window);                           \
        break;
    switch (attention_epl(A.hd)) {
        QSC_ATT(1) QSC_ATT(2) QSC_ATT(3) QSC_ATT(4) QSC_ATT(5) QSC_ATT(6) QSC_ATT(7) QSC_ATT(8) QSC_ATT(12)
        QSC_ATT(16) QSC_ATT(24) QSC_ATT(32)
    default: break;
    }
#undef QSC_ATT
}

/* Attention over the cache; quantizes the output in the same kernel when the int8 blocks fall inside a head,
 * otherwise with one more launch. Decode (T <= FD_MAX_T) with a flash-decoding plan (fd: scratch) splits the keys
 * across blocks (qsc_decode.cuh, which writes its own int8 output); the host model's table asks the same fd_use. */
static void launch_attention(const FastPaths &fp, int T, const AttnArgs &A, int kv_f16, cudaStream_t st,
                             const float *q, const int *pos, const void *kc, const void *vc, const int *nkv, float *out,
                             ActOut ao, const FdPlan *fd = nullptr) {
    const int hd = A.hd, path = took(attention_path(fp, T, A.H, A.KV, hd)); /* host_attention: the same choice */
    if (path != QSC_PATH_FLASH && fd && fd_use(T, A, kv_f16, *fd)) {
        launch_flashdec(fd_args(A, *fd, T, q, pos, nkv, out), kv_f16, kc, vc, ao, st);
        return;
    }
    const bool apart = attention_quantize_apart(path, hd, ao);
    if (path == QSC_PATH_FLASH) { /* prefill: flash attention (qsc_fast.cuh) */
        const FaArgs fa = {q, pos, nkv, T, A.H, A.KV, A.window, A.scale, A.softcap, A.sinks, out};
        launch_flash(fa, hd, kv_f16, kc, vc, st);
        if (qsc_dbg_cur) { /* launch_flash's grid */
            const int64_t rows = (int64_t)T * (A.H / A.KV);
            char name[48];
            snprintf(name, sizeof name, "k_flash<%d, %s>", hd / 32, kv_f16 ? "half" : "float");
            QSC_DBG(st, name, dim3((unsigned)((rows + FA_ROWS - 1) / FA_ROWS), (unsigned)A.KV), FA_WARPS * 32,
                    "tokens %d, heads %d/%d, head_dim %d, window %d", T, A.H, A.KV, hd, A.window);
        }
    } else {
        const ActOut none = {};
        const dim3 grid(A.H, T);
        if (kv_f16) launch_attention_t<__half>(grid, st, q, pos, A, kc, vc, nkv, out, apart ? none : ao);
        else launch_attention_t<float>(grid, st, q, pos, A, kc, vc, nkv, out, apart ? none : ao);
    }
    if (apart) {
        took(QSC_PATH_QUANTIZE);
        k_quantize<<<T, 256, 0, st>>>(out, ao, A.H * hd);
        QSC_DBG(st, "k_quantize", T, 256, "rows %d, n %d", T, A.H * hd);
    }
}

/* ------------------------------------------------------------------------------------------ the launch tables */
/* What the forward's steps launch: the device's kernels or, for a host model (qsc_host_model_create), their host
 * twins (qsc_emul.cuh) on host memory. One table each, chosen once when the model is made (m->ops): the steps
 * below are written once for both. */
struct Launch {
    void (*embed)(qsc_model *m, const QW &w, const int *tok, int T, int E, float scale);
    void (*norm_quant)(qsc_model *m, int T, const ResidIn &r, const float *w, int norm, const ActOut &ao, int n,
                       float eps);
    void (*matmul)(qsc_model *m, const MatJob *jobs, int n, int ncols);
    void (*qk_post)(qsc_model *m, const QKArgs &A, const int *pos, int T, void *kst, void *vst);
    void (*attention)(qsc_model *m, int T, const AttnArgs &A, const int *pos, const void *kc, const void *vc,
                      const int *nkv, const ActOut &ao);
    void (*glu)(qsc_model *m, const float *g, const float *u, float *a, const ActOut &ao, int T, int n, int mode,
                int64_t ldu, int nv);
    void (*qgate_split)(qsc_model *m, const float *bq, int T, int H, int hd);
    void (*qgate_quant)(qsc_model *m, const ActOut &ao, int T, int n);
    void (*gdn_core)(qsc_model *m, const GdnArgs &A, int T, const ActOut &ao, int Vd);
    void (*logits)(qsc_model *m, float *x, int64_t n, float scale, float cap);
    /* the probe's (qsc_probe.cuh): a trace's rows to the caller's host buffer, a statistics' column sums */
    void (*copy_out)(qsc_model *m, void *dst, const void *src, size_t bytes);
    void (*sumsq)(qsc_model *m, float *acc, const float *x, int T, int n);
    /* the mixture of experts' (qsc_moe.cuh): routing, its grouping by expert, the gather, the grouped products,
     * SwiGLU, each token's experts added, the shared expert's gated output added */
    void (*moe_route)(qsc_model *m, float *logits, int T, int NE, int K, int norm, float scale, int32_t *sel,
                      float *w);
    void (*moe_group)(qsc_model *m, const int32_t *sel, int P, int K, int NE, int tw, const MoeGroup &g);
    void (*moe_gather)(qsc_model *m, const float *h, const int32_t *pairs, int K, int P, float *hb, const ActOut &ao,
                       int E);
    void (*moe_matmul)(qsc_model *m, const MoeArgs &args, int max_tiles, int tw);
    void (*moe_glu)(qsc_model *m, const float *g, const float *u, float *a, const ActOut &ao, int rows, int n, int oai);
    void (*moe_combine)(qsc_model *m, const float *ob, const MoeGroup &g, int K, const float *w, float *out, int T,
                        int E);
    void (*moe_shared_add)(qsc_model *m, const float *h, const float *gate_inp, const float *so, float *out, int T,
                           int E);
};

static void dev_embed(qsc_model *m, const QW &w, const int *tok, int T, int E, float scale) {
    k_embed<<<T, 256, 0, m->st>>>(w, tok, m->x, E, scale);
    QSC_DBG(m->st, "k_embed", T, 256, "tokens %d, n_embd %d, vocab %lld", T, E, (long long)w.rows);
}
static void dev_norm_quant(qsc_model *m, int T, const ResidIn &r, const float *w, int norm, const ActOut &ao, int n,
                           float eps) {
    k_norm_quant<<<T, 256, 0, m->st>>>(m->x, r, w, norm, m->h, ao, n, eps);
    QSC_DBG(m->st, "k_norm_quant", T, 256, "rows %d, n %d", T, n);
}
static void dev_matmul(qsc_model *m, const MatJob *jobs, int n, int ncols) {
    launch_matmul(m->fast, jobs, n, ncols, m->st);
}
static void dev_qk_post(qsc_model *m, const QKArgs &A, const int *pos, int T, void *kst, void *vst) {
    k_qk_post<<<T, 256, 0, m->st>>>(m->q, m->k, m->v, A, pos, kst, vst, m->kv_f16);
    QSC_DBG(m->st, "k_qk_post", T, 256, "tokens %d, heads %d/%d, head_dim %d", T, A.H, A.KV, A.hd);
}
static void dev_attention(qsc_model *m, int T, const AttnArgs &A, const int *pos, const void *kc, const void *vc,
                          const int *nkv, const ActOut &ao) {
    const FdPlan fdp = {m->fd_part, m->n_ctx, m->fd_sm};
    launch_attention(m->fast, T, A, m->kv_f16, m->st, m->q, pos, kc, vc, nkv, m->att, ao, &fdp);
}
static void dev_glu(qsc_model *m, const float *g, const float *u, float *a, const ActOut &ao, int T, int n, int mode,
                    int64_t ldu, int nv) {
    k_glu_quant<<<T, 256, 0, m->st>>>(g, u, a, ao, n, mode, ldu, nv);
    QSC_DBG(m->st, "k_glu_quant", T, 256, "rows %d, n %d, mode %d, ldu %lld", T, n, mode, (long long)ldu);
}
static void dev_qgate_split(qsc_model *m, const float *bq, int T, int H, int hd) {
    k_qgate_split<<<T, 256, 0, m->st>>>(m->gdn.qg, bq, m->q, m->gdn.gate, H, hd);
    QSC_DBG(m->st, "k_qgate_split", T, 256, "tokens %d, heads %d, head_dim %d", T, H, hd);
}
static void dev_qgate_quant(qsc_model *m, const ActOut &ao, int T, int n) {
    k_qgate_quant<<<T, 256, 0, m->st>>>(m->att, m->gdn.gate, ao, n);
    QSC_DBG(m->st, "k_qgate_quant", T, 256, "rows %d, n %d", T, n);
}
static void dev_gdn_core(qsc_model *m, const GdnArgs &A, int T, const ActOut &ao, int Vd) {
    cudaStream_t st = m->st;
    const int64_t n = (int64_t)T * A.C;
    k_gdn_conv<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(A, T);
    QSC_DBG(st, "k_gdn_conv", (unsigned)((n + 255) / 256), 256, "tokens %d, channels %d, kernel %d", T, A.C, A.K);
    if (A.K > 1) {
        k_gdn_conv_state<<<(unsigned)((A.C + 255) / 256), 256, 0, st>>>(A, T);
        QSC_DBG(st, "k_gdn_conv_state", (unsigned)((A.C + 255) / 256), 256, "tokens %d, channels %d", T, A.C);
    }
    const int threads = (A.S + 31) / 32 * 32;
    k_gdn_recur<<<A.Hv, threads, (size_t)(2 * A.S + 32) * sizeof(float), st>>>(A, T);
    QSC_DBG(st, "k_gdn_recur", A.Hv, threads, "tokens %d, heads %d, state %d", T, A.Hv, A.S);
    if (ao.qs32 || ao.qs256) {
        k_quantize<<<T, 256, 0, st>>>(A.o, ao, Vd);
        QSC_DBG(st, "k_quantize", T, 256, "rows %d, n %d", T, Vd);
    }
}
static void dev_logits(qsc_model *m, float *x, int64_t n, float scale, float cap) {
    const int blocks = (int)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
    k_logits_post<<<blocks, 256, 0, m->st>>>(x, n, scale, cap);
    QSC_DBG(m->st, "k_logits_post", blocks, 256, "n %lld", (long long)n);
}

static void host_embed(qsc_model *m, const QW &w, const int *tok, int T, int E, float scale) {
    emu_embed(w, tok, m->x, T, E, scale);
}
static void host_norm_quant(qsc_model *m, int T, const ResidIn &r, const float *w, int norm, const ActOut &ao, int n,
                            float eps) {
    emu_norm_quant(m->x, r, w, norm, m->h, ao, T, n, eps);
}
/* The same choices as dev_matmul / dev_attention (qsc_fast.cuh's matmul_path, attention_path), each run by its
 * kernel's host twin (qsc_fast_host.cuh, qsc_host.cu). */
static void host_matmul(qsc_model *m, const MatJob *jobs, int n, int ncols) {
    const MmaArgs fa = mat_args(jobs, n, ncols);
    switch (took(matmul_path(m->fast, fa))) {
    case QSC_PATH_GEMV: emu_gemv(fa); return;
    case QSC_PATH_MMA: emu_matmul_mma(fa); return;
    default:
        for (int i = 0; i < n; ++i) emu_matmul(*jobs[i].w, jobs[i].a, jobs[i].y, jobs[i].ldy, jobs[i].bias, ncols);
    }
}
static void host_qk_post(qsc_model *m, const QKArgs &A, const int *pos, int T, void *kst, void *vst) {
    emu_qk_post(m->q, m->k, m->v, A, pos, T, kst, vst, m->kv_f16);
}
static void host_attention(qsc_model *m, int T, const AttnArgs &A, const int *pos, const void *kc, const void *vc,
                           const int *nkv, const ActOut &ao) {
    const int path = took(attention_path(m->fast, T, A.H, A.KV, A.hd));
    const FdPlan fdp = {m->fd_part, m->n_ctx, m->fd_sm};
    const bool fdec = path != QSC_PATH_FLASH && fd_use(T, A, m->kv_f16, fdp); /* as launch_attention */
    if (path == QSC_PATH_FLASH) {
        const FaArgs fa = {m->q, pos, nkv, T, A.H, A.KV, A.window, A.scale, A.softcap, A.sinks, m->att};
        emu_flash(fa, A.hd, m->kv_f16, kc, vc);
    } else if (fdec) {
        emu_flashdec(fd_args(A, fdp, T, m->q, pos, nkv, m->att), m->kv_f16, kc, vc);
    } else {
        emu_attention(T, A, m->kv_f16, m->q, pos, kc, vc, *nkv, m->att);
    }
    if (!fdec && attention_quantize_apart(path, A.hd, ao)) took(QSC_PATH_QUANTIZE); /* k_quantize; else fused */
    emu_quantize(m->att, ao, T, A.H * A.hd);
}
static void host_glu(qsc_model *m, const float *g, const float *u, float *a, const ActOut &ao, int T, int n, int mode,
                     int64_t ldu, int nv) {
    (void)m;
    emu_glu(g, u, a, ao, T, n, mode, ldu, nv);
}
static void host_qgate_split(qsc_model *m, const float *bq, int T, int H, int hd) {
    emu_qgate_split(m->gdn.qg, bq, m->q, m->gdn.gate, T, H, hd);
}
static void host_qgate_quant(qsc_model *m, const ActOut &ao, int T, int n) {
    emu_qgate_quant(m->att, m->gdn.gate, ao, T, n);
}
static void host_gdn_core(qsc_model *m, const GdnArgs &A, int T, const ActOut &ao, int Vd) {
    (void)m;
    emu_gdn_core(A, T);
    emu_quantize(A.o, ao, T, Vd);
}
static void host_logits(qsc_model *m, float *x, int64_t n, float scale, float cap) {
    (void)m;
    emu_logits(x, n, scale, cap);
}

/* The pinned staging of a chunk's copies to the caller's (pageable) memory: all-token logits, the residual stream
 * of qsc_forward_resid and a trace's rows (dev_copy_out) go to m->h_stage by cudaMemcpyAsync, then, once the
 * stream is synchronized, to their destinations by memcpy (stage_flush). Allocated on first use, grown to the
 * largest chunk asked for, freed with the model. */
struct StageCopy {
    void *dst;
    size_t off, bytes;
};
static thread_local std::vector<StageCopy> *stage_list = nullptr; /* the chunk's pending copies (forward_impl's) */

static int stage_reserve(qsc_model *m, size_t bytes, char *err, size_t err_len) {
    if (m->stage_bytes >= bytes) return 0;
    if (m->h_stage) CUDA_TRY(cudaFreeHost(m->h_stage));
    m->h_stage = nullptr;
    m->stage_bytes = 0;
    CUDA_TRY(cudaMallocHost((void **)&m->h_stage, bytes));
    m->stage_bytes = bytes;
    return 0;
}

/* Enqueue src (device) -> dst (host, pageable) through the stage; straight to dst when no stage room is left. */
static void stage_copy(qsc_model *m, void *dst, const void *src, size_t bytes) {
    std::vector<StageCopy> *l = stage_list;
    const size_t off = l && !l->empty() ? (l->back().off + l->back().bytes + 255) / 256 * 256 : 0;
    if (!l || off + bytes > m->stage_bytes) {
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, m->st);
        return;
    }
    cudaMemcpyAsync((char *)m->h_stage + off, src, bytes, cudaMemcpyDeviceToHost, m->st);
    l->push_back({dst, off, bytes});
}

/* After the stream's synchronize: the staged rows to their destinations. */
static void stage_flush(qsc_model *m, std::vector<StageCopy> &l) {
    for (const StageCopy &c : l) memcpy(c.dst, (const char *)m->h_stage + c.off, c.bytes);
    l.clear();
}

#define QSC_MOE_ENQUEUE
#include "qsc_moe.cuh" /* moe_finalize, moe_input_formats, enqueue_moe */
#include "qsc_probe.cuh"
#define QSC_GDN_ENQUEUE
#include "qsc_gdn.cuh" /* gdn_finalize, gdn_state_op, enqueue_gdn */

/* The two launch tables (their probe entries are qsc_probe.cuh's). */
static const Launch DEVICE_LAUNCH = {dev_embed,  dev_norm_quant,  dev_matmul,      dev_qk_post,  dev_attention,
                                     dev_glu,    dev_qgate_split, dev_qgate_quant, dev_gdn_core, dev_logits,
                                     dev_copy_out, dev_sumsq,
                                     dev_moe_route, dev_moe_group, dev_moe_gather, dev_moe_matmul, dev_moe_glu,
                                     dev_moe_combine, dev_moe_shared_add};
static const Launch HOST_LAUNCH = {host_embed, host_norm_quant,  host_matmul,      host_qk_post,  host_attention,
                                   host_glu,   host_qgate_split, host_qgate_quant, host_gdn_core, host_logits,
                                   host_copy_out, host_sumsq,
                                   host_moe_route, host_moe_group, host_moe_gather, host_moe_matmul, host_moe_glu,
                                   host_moe_combine, host_moe_shared_add};

/* ------------------------------------------------------------------------------------------ the plan's walk */
static_assert((int)QS_GLU_SILU == (int)GLU_SILU && (int)QS_GLU_GELU == (int)GLU_GELU && (int)QS_GLU_OAI == (int)GLU_OAI,
              "the plan's GLU modes are the kernels'");

/* One forward's walk: the call's tokens and the residual the next norm adds. The device adds each branch's output
 * to the stream in the next norm kernel (which also quantizes for the next products): a residual step only records
 * it, and a scale step scales it. */
struct Walk {
    int T, li;
    const int *pos, *nkv;
    ResidIn prev;
};

/* Where the plan's buffers live for layer li, and the floats of one token's row of each (the stride a product
 * reads or writes). */
static float *buf_ptr(const qsc_model *m, int li, int b) {
    switch (b) {
    case QS_BUF_X: return m->x;
    case QS_BUF_H: return m->h;
    case QS_BUF_Q: return m->q;
    case QS_BUF_QG: return m->gdn.qg;
    case QS_BUF_GATE: return m->gdn.gate;
    case QS_BUF_K: return m->k;
    case QS_BUF_V: return m->v;
    case QS_BUF_ATT: return m->att;
    case QS_BUF_O: return m->o;
    case QS_BUF_G: return m->g;
    case QS_BUF_U: return m->u;
    case QS_BUF_A: return m->a;
    case QS_BUF_PG: return m->pg;
    case QS_BUF_PA: return m->pa;
    case QS_BUF_PLE_IN: return m->d_ple + (int64_t)li * m->cfg.ple;
    default: return nullptr;
    }
}

static int64_t buf_width(const qsc_model *m, const Layer &L, int b) {
    const int64_t QD = (int64_t)L.H * L.hd, KD = (int64_t)L.KV * L.hd;
    switch (b) {
    case QS_BUF_X: case QS_BUF_H: case QS_BUF_O: return m->cfg.E;
    case QS_BUF_Q: case QS_BUF_GATE: case QS_BUF_ATT: return QD;
    case QS_BUF_QG: return 2 * QD;
    case QS_BUF_K: case QS_BUF_V: return KD;
    case QS_BUF_G: case QS_BUF_U: case QS_BUF_A: return L.F;
    case QS_BUF_PG: case QS_BUF_PA: return m->cfg.ple_pad;
    case QS_BUF_PLE_IN: return (int64_t)m->cfg.n_layers * m->cfg.ple;
    default: return 0;
    }
}

static const QW *step_weight(const Layer &L, int w) {
    switch (w) {
    case QS_W_WQ: return &L.wq.w;
    case QS_W_WK: return &L.wk.w;
    case QS_W_WV: return &L.wv.w;
    case QS_W_WO: return &L.wo.w;
    case QS_W_GATE: return &L.gate.w;
    case QS_W_UP: return &L.up.w;
    case QS_W_DOWN: return &L.down.w;
    case QS_W_PLE_GATE: return &L.ple_gate.w;
    case QS_W_PLE_PROJ: return &L.ple_proj.w;
    default: return nullptr;
    }
}

static const float *step_vec(const Layer &L, int v) { return v > 0 && v < QS_VECS ? L.vec[v] : nullptr; }

/* The formats step i writes its output in: those of the step that reads it next (qs_plan_consumer), none when no
 * product does. */
static ActOut formats_for(const qsc_model *m, const Layer &L, int i) {
    const int j = qs_plan_consumer(L.plan, L.n_steps, i);
    if (j < 0) return ActOut{};
    const qs_step &c = L.plan[j];
    if (c.kind == QS_STEP_MOE) return moe_input_formats(m, L.moe);
    int types[4], n = 0;
    if (c.kind == QS_STEP_GDN) {
        const GdnLayer &G = L.gdn;
        const int t[4] = {G.qkv.w.type, G.z.w.type, G.beta.w.type, G.alpha.w.type};
        for (int k = 0; k < 4; ++k) types[n++] = t[k];
    } else {
        for (int k = 0; k < c.n; ++k) types[n++] = step_weight(L, c.w[k])->type;
    }
    return act_out_types(m, types, n);
}

static int probe_point(int tap) {
    switch (tap) {
    case QS_TAP_ATTN_IN: return PROBE_ATTN_IN;
    case QS_TAP_Q: return PROBE_Q;
    case QS_TAP_WO_IN: return PROBE_WO_IN;
    case QS_TAP_FFN_IN: return PROBE_FFN_IN;
    default: return PROBE_DOWN_IN;
    }
}

/* Step i of layer L: each step kind once, launched through the model's table (kernels or host twins). */
static int run_step(qsc_model *m, const Layer &L, Walk &w, int i, char *err, size_t err_len) {
    const qs_step &s = L.plan[i];
    const Launch &op = *m->ops;
    const int T = w.T;
    uint8_t *kc = m->k_cache + L.kv_off, *vc = m->v_cache + L.kv_off;
    switch (s.kind) {
    case QS_STEP_NORM: {
        const float *v = step_vec(L, s.vec);
        op.norm_quant(m, T, w.prev, v, v != nullptr, formats_for(m, L, i), m->cfg.E, L.eps);
        w.prev = ResidIn{};
        if (i == 0) probe_tap(m, PROBE_RESID, w.li, m->x, T); /* the stream entering the layer */
        return 0;
    }
    case QS_STEP_TAP: probe_tap(m, probe_point(s.arg), w.li, buf_ptr(m, w.li, s.src), T); return 0;
    case QS_STEP_PROJ: {
        MatJob jobs[3];
        const float *src = buf_ptr(m, w.li, s.src);
        const int64_t k = buf_width(m, L, s.src);
        for (int j = 0; j < s.n; ++j) {
            const QW *W = step_weight(L, s.w[j]);
            jobs[j] = {W, act_view(m, W->type, src, k, 0), buf_ptr(m, w.li, s.out[j]), buf_width(m, L, s.out[j]),
                       step_vec(L, s.bias[j])};
        }
        op.matmul(m, jobs, s.n, T);
        return 0;
    }
    case QS_STEP_QGATE_SPLIT: op.qgate_split(m, step_vec(L, s.bias[0]), T, L.H, L.hd); return 0;
    case QS_STEP_QK_POST: /* a layer reading another's cache stores nothing */
        op.qk_post(m, L.qk, w.pos, T, L.kv_reuse ? nullptr : kc, L.kv_reuse ? nullptr : vc);
        return 0;
    case QS_STEP_ATTEND: {
        const AttnArgs aa = {L.H, L.KV, L.hd, L.window, L.scale, L.softcap, L.sinks};
        op.attention(m, T, aa, w.pos, kc, vc, w.nkv, formats_for(m, L, i));
        return 0;
    }
    case QS_STEP_QGATE: op.qgate_quant(m, formats_for(m, L, i), T, L.H * L.hd); return 0;
    case QS_STEP_GDN: enqueue_gdn(m, L, T); return 0;
    case QS_STEP_RESIDUAL: w.prev = {buf_ptr(m, w.li, s.src), step_vec(L, s.vec), L.eps, s.scale, 1.0f}; return 0;
    case QS_STEP_GLU: {
        const int nv = s.src2 == QS_BUF_PLE_IN ? m->cfg.ple : (int)buf_width(m, L, s.src2); /* u's values per row */
        op.glu(m, buf_ptr(m, w.li, s.src), buf_ptr(m, w.li, s.src2), buf_ptr(m, w.li, s.dst), formats_for(m, L, i), T,
               (int)buf_width(m, L, s.src), s.arg, buf_width(m, L, s.src2), nv);
        return 0;
    }
    case QS_STEP_MOE: return enqueue_moe(m, L, T, err, err_len); /* device-resident routing: graph-safe */
    case QS_STEP_SCALE: w.prev.out_scale = s.scale; return 0;
    default: set_err(err, err_len, "layer %d: step %d has kind %d, which this backend does not know", w.li, i, s.kind);
        return -1;
    }
}

/* Enqueue the forward pass of T tokens whose ids/positions are already in m->d_params. logits: NULL (no lm_head),
 * or T x n_vocab (all rows) / n_vocab (last row) floats on the device. A host model runs it at once. */
static int enqueue_forward(qsc_model *m, int T, bool all_rows, float *logits, char *err, size_t err_len) {
    const Dims &c = m->cfg;
    const Launch &op = *m->ops;
    Walk w = {T, 0, m->d_params + m->mb, m->d_params + 2 * m->mb, ResidIn{}};
    op.embed(m, m->tok.w, m->d_params, T, c.E, c.embed_scale);
    for (int li = 0; li < c.n_layers; ++li) {
        const Layer &L = m->layers[li];
        w.li = li;
        for (int i = 0; i < L.n_steps; ++i) {
            int rc = run_step(m, L, w, i, err, err_len);
            if (rc) return rc;
        }
    }
    const QW &wout = m->tied ? m->tok.w : m->out.w;
    op.norm_quant(m, T, w.prev, m->out_norm, 1, act_out_types(m, &wout.type, 1), c.E, c.eps);
    probe_tap(m, PROBE_RESID, c.n_layers, m->x, T);
    if (logits) {
        const int rows = all_rows ? T : 1;
        MatJob lm = {&wout, act_view(m, wout.type, m->h, c.E, all_rows ? 0 : T - 1), logits, c.V, nullptr};
        op.matmul(m, &lm, 1, rows);
        if (c.logit_scale != 1.0f || c.final_softcap != 0.0f)
            op.logits(m, logits, (int64_t)rows * c.V, c.logit_scale, c.final_softcap);
    }
    if (!m->host) CUDA_TRY(cudaGetLastError());
    return 0;
}

static int ensure_logits_all(qsc_model *m, int64_t rows, char *err, size_t err_len) {
    if (m->logits_all_rows >= rows) return 0;
    if (m->d_logits_all) {
        if (m->host) free(m->d_logits_all);
        else CUDA_TRY(cudaFree(m->d_logits_all));
        for (auto &p : m->allocs)
            if (p == m->d_logits_all) p = nullptr;
        m->dev_bytes -= (m->logits_all_rows * m->cfg.V * 4 + 255) / 256 * 256;
        m->d_logits_all = nullptr;
        m->logits_all_rows = 0;
    }
    int rc = dalloc_t(m, &m->d_logits_all, rows * m->cfg.V, err, err_len);
    if (rc) return rc;
    m->logits_all_rows = rows;
    return 0;
}

static void drop_graph(qsc_model *m) {
    if (m->gexec) cudaGraphExecDestroy(m->gexec);
    if (m->gresid) cudaGraphExecDestroy(m->gresid);
    m->gexec = m->gresid = nullptr;
}

/* One-token step: capture (first time) and replay the graph: params in, every kernel, logits out (m->h_logits1);
 * resid (qsc_forward_resid's step): no head, the stream after the last layer out (m->h_resid1) instead. Both
 * destinations are pinned (a graph's copy to pageable memory is not allowed). */
static int step_graph(qsc_model *m, bool resid, char *err, size_t err_len) {
    const size_t pbytes = (size_t)(2 * m->mb + 1) * sizeof(int);
    const size_t obytes = (size_t)(resid ? m->cfg.E : m->cfg.V) * sizeof(float);
    cudaGraphExec_t &gx = resid ? m->gresid : m->gexec;
    if (resid && !m->h_resid1) CUDA_TRY(cudaMallocHost((void **)&m->h_resid1, obytes));
    if (!gx) {
        CUDA_TRY(cudaStreamBeginCapture(m->st, cudaStreamCaptureModeThreadLocal));
        cudaMemcpyAsync(m->d_params, m->h_params, pbytes, cudaMemcpyHostToDevice, m->st);
        if (m->cfg.ple) /* one token's per-layer inputs, filled in before each replay */
            cudaMemcpyAsync(m->d_ple, m->h_ple, (size_t)m->cfg.n_layers * m->cfg.ple * sizeof(float),
                            cudaMemcpyHostToDevice, m->st);
        int rc = enqueue_forward(m, 1, false, resid ? nullptr : m->d_logits1, err, err_len);
        if (resid) cudaMemcpyAsync(m->h_resid1, m->x, obytes, cudaMemcpyDeviceToHost, m->st);
        else cudaMemcpyAsync(m->h_logits1, m->d_logits1, obytes, cudaMemcpyDeviceToHost, m->st);
        cudaGraph_t graph = nullptr;
        cudaError_t e = cudaStreamEndCapture(m->st, &graph);
        if (rc) {
            if (graph) cudaGraphDestroy(graph);
            return rc;
        }
        CUDA_TRY(e);
        e = cudaGraphInstantiate(&gx, graph, 0);
        cudaGraphDestroy(graph);
        if (e != cudaSuccess) {
            gx = nullptr;
            CUDA_TRY(e);
        }
    }
    CUDA_TRY(cudaGraphLaunch(gx, m->st));
    CUDA_TRY(cudaStreamSynchronize(m->st));
    return 0;
}


/* ------------------------------------------------------------------------------------ single kernels (tests) */

/* Device buffers freed on scope exit. */
struct Scratch {
    std::vector<void *> ptrs;
    ~Scratch() {
        for (void *p : ptrs) cudaFree(p);
    }
    template <typename T> cudaError_t get(T **p, int64_t count) {
        void *v = nullptr;
        cudaError_t e = cudaMalloc(&v, (size_t)(count > 0 ? count : 1) * sizeof(T) + 16);
        if (e == cudaSuccess) ptrs.push_back(v);
        *p = (T *)v;
        return e;
    }
    template <typename T> cudaError_t put(T **p, const T *src, int64_t count) {
        cudaError_t e = get(p, count);
        return e != cudaSuccess ? e : cudaMemcpy(*p, src, (size_t)count * sizeof(T), cudaMemcpyHostToDevice);
    }
};

/* int8 activation buffers for n_x rows of k elements, both formats. */
static cudaError_t scratch_act(Scratch &s, ActOut &o, int64_t n_x, int64_t k) {
    cudaError_t e = cudaSuccess;
    if (e == cudaSuccess) e = s.get(&o.qs32, n_x * k);
    if (e == cudaSuccess) e = s.get(&o.d32, n_x * k / 32);
    if (e == cudaSuccess) e = s.get(&o.s32, n_x * k / 32);
    if (k % 256 == 0) {
        if (e == cudaSuccess) e = s.get(&o.qs256, n_x * k);
        if (e == cudaSuccess) e = s.get(&o.d256, n_x * k / 256);
        if (e == cudaSuccess) e = s.get(&o.bs256, n_x * k / 16);
    }
    return e;
}

/* A single-kernel entry point in the debug mode (QUANTSCOPE_CUDA_DEBUG read per call): its launches are checked as a
 * model's, and the first fault is its error. */
#define QSC_ENTRY_DEBUG                                                                                            \
    QscDebug dbg_;                                                                                                \
    dbg_.on = qsc_debug_env();                                                                                    \
    QscDebugScope dbg_scope_(&dbg_)
#define QSC_ENTRY_CHECK                                                                                            \
    do {                                                                                                          \
        if (dbg_.fault[0]) {                                                                                      \
            set_err(err, err_len, "%s", dbg_.fault);                                                              \
            return -1;                                                                                            \
        }                                                                                                         \
        CUDA_TRY(cudaGetLastError());                                                                             \
    } while (0)

/* ------------------------------------------------------------------------------------------------ C API */
extern "C" {

const char *qsc_build_info(void) {
    static char buf[160];
    snprintf(buf, sizeof buf, "quantscope-cuda 1; CUDA runtime %d.%d; archs %s", CUDART_VERSION / 1000,
             (CUDART_VERSION % 1000) / 10, QSC_ARCHS);
    return buf;
}

int qsc_init(char *err, size_t err_len) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        set_err(err, err_len, "%s (%s = %d)", cudaGetErrorString(e), cudaGetErrorName(e), (int)e);
        return (int)e;
    }
    if (n <= 0) {
        set_err(err, err_len, "no CUDA-capable device is detected (cudaErrorNoDevice = 100)");
        return (int)cudaErrorNoDevice;
    }
    /* a kernel image for this GPU must be in the library (or its PTX must JIT): ask for one kernel's attributes */
    cudaFuncAttributes attr;
    e = cudaFuncGetAttributes(&attr, k_embed);
    if (e != cudaSuccess) {
        set_err(err, err_len, "%s (%s = %d); library built for %s", cudaGetErrorString(e), cudaGetErrorName(e),
                (int)e, QSC_ARCHS);
        return (int)e;
    }
    return 0;
}

int qsc_device_props_get(qsc_device_props *out, char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    int dev = 0;
    CUDA_TRY(cudaGetDevice(&dev));
    cudaDeviceProp p;
    CUDA_TRY(cudaGetDeviceProperties(&p, dev));
    snprintf(out->name, sizeof out->name, "%s", p.name);
    out->major = p.major;
    out->minor = p.minor;
    out->sm_count = p.multiProcessorCount;
    out->total_mem = (int64_t)p.totalGlobalMem;
    size_t fr = 0, tot = 0;
    CUDA_TRY(cudaMemGetInfo(&fr, &tot));
    out->free_mem = (int64_t)fr;
    CUDA_TRY(cudaDeviceGetAttribute(&out->mem_clock_khz, cudaDevAttrMemoryClockRate, dev));
    CUDA_TRY(cudaDeviceGetAttribute(&out->bus_width_bits, cudaDevAttrGlobalMemoryBusWidth, dev));
    out->peak_bw_gbs = 2.0 * out->mem_clock_khz * 1e3 * (out->bus_width_bits / 8.0) / 1e9;
    cudaDriverGetVersion(&out->driver_version);
    cudaRuntimeGetVersion(&out->runtime_version);
    return 0;
}

int qsc_device_info(char *buf, size_t len) {
    qsc_device_props p;
    char err[256];
    if (qsc_device_props_get(&p, err, sizeof err) != 0) {
        set_err(buf, len, "%s", err);
        return -1;
    }
    set_err(buf, len, "%s (sm_%d%d, %d SMs, %.1f GiB, %.0f GB/s peak, driver %d.%d)", p.name, p.major, p.minor,
            p.sm_count, p.total_mem / 1073741824.0, p.peak_bw_gbs, p.driver_version / 1000,
            (p.driver_version % 1000) / 10);
    return 0;
}

void qsc_model_free(qsc_model *m) {
    if (!m) return;
    if (m->host) {
        for (void *p : m->allocs) free(p);
        free(m->h_params);
        free(m->h_logits1);
        free(m->h_ple);
        delete m;
        return;
    }
    cudaSetDevice(m->device);
    if (m->st) cudaStreamSynchronize(m->st);
    drop_graph(m);
    probe_free(m);
    for (void *p : m->allocs)
        if (p) cudaFree(p);
    if (m->h_params) cudaFreeHost(m->h_params);
    if (m->h_logits1) cudaFreeHost(m->h_logits1);
    if (m->h_resid1) cudaFreeHost(m->h_resid1);
    if (m->h_stage) cudaFreeHost(m->h_stage);
    if (m->h_ple) cudaFreeHost(m->h_ple);
    if (m->st) cudaStreamDestroy(m->st);
    delete m;
}

/* One matrix of the description onto the device, repacked (check_model has checked its size, type and bytes). */
static int upload_matrix(qsc_model *m, const qs_weight &w, DevMat *dm, const char *what, char *err,
                         size_t err_len) {
    PackedLayout L;
    if (!packed_layout(w.type, w.rows, w.k, &L)) {
        set_err(err, err_len, "%s: type %d has no GPU kernel", what, w.type);
        return -1;
    }
    std::vector<uint8_t> host((size_t)L.total);
    if (repack_host(w.type, w.ptr, w.rows, w.k, host.data(), L.total) != 0) {
        set_err(err, err_len, "%s: repack failed", what);
        return -1;
    }
    int rc = dalloc(m, (void **)&dm->buf, L.total, err, err_len);
    if (rc) return rc;
    rc = copy_in(m, dm->buf, host.data(), (size_t)L.total, err, err_len);
    if (rc) return rc;
    dm->w = make_qw(w.type, w.rows, w.k, dm->buf, L);
    dm->present = true;
    return 0;
}

/* An F32/F16 matrix of k columns with zero columns appended up to k_pad (gemma4's per-layer embedding projection
 * of width P: the matmul works in 32-element units), then uploaded as upload_matrix does. */
static int upload_matrix_padded(qsc_model *m, const qs_weight &w, int64_t k_pad, DevMat *dm, const char *what,
                                char *err, size_t err_len) {
    if (k_pad == w.k) return upload_matrix(m, w, dm, what, err, err_len);
    const int64_t es = w.type == T_F32 ? 4 : 2;
    std::vector<uint8_t> padded((size_t)(w.rows * k_pad * es), 0);
    for (int64_t r = 0; r < w.rows; ++r) memcpy(&padded[(size_t)(r * k_pad * es)], w.ptr + r * w.k * es, (size_t)(w.k * es));
    qs_weight pw = w;
    pw.ptr = padded.data();
    pw.k = k_pad;
    pw.bytes = (int64_t)padded.size();
    return upload_matrix(m, pw, dm, what, err, err_len);
}

/* One vector of the description onto the device (absent: *dst stays NULL). */
static int upload_vector(qsc_model *m, const qs_vec &v, float **dst, char *err, size_t err_len) {
    if (!v.ptr) return 0;
    int rc = dalloc_t(m, dst, v.len, err, err_len);
    if (rc) return rc;
    return copy_in(m, *dst, v.ptr, (size_t)v.len * sizeof(float), err, err_len);
}

#define QSC_GDN_UPLOAD
#include "qsc_gdn.cuh" /* gdn_upload */

/* Every weight of the description onto the device, by group. */
static int upload_model(qsc_model *m, const qsc_model_desc *md, const qs_block *layers, char *err,
                        size_t err_len) {
    char what[64];
    for (int li = 0; li < m->cfg.n_layers; ++li) {
        const qs_block &b = layers[li];
        Layer &L = m->layers[li];
        const struct { const char *name; const qs_weight *w; DevMat *dm; } mats[] = {
            {"attn.wq", &b.attn.wq, &L.wq}, {"attn.wk", &b.attn.wk, &L.wk}, {"attn.wv", &b.attn.wv, &L.wv},
            {"attn.wo", &b.attn.wo, &L.wo}, {"ffn.gate", &b.ffn.gate, &L.gate}, {"ffn.up", &b.ffn.up, &L.up},
            {"ffn.down", &b.ffn.down, &L.down}};
        for (const auto &x : mats) {
            if (b.attn.kv_reuse && (x.dm == &L.wk || x.dm == &L.wv)) continue; /* not read */
            if (b.gdn.conv && x.dm != &L.gate && x.dm != &L.up && x.dm != &L.down) continue; /* no attention */
            snprintf(what, sizeof what, "layer %d: %s", li, x.name);
            int rc = upload_matrix(m, *x.w, x.dm, what, err, err_len);
            if (rc) return rc;
        }
        if (b.gdn.conv) {
            int rc = gdn_upload(m, b, L, li, err, err_len);
            if (rc) return rc;
        }
        L.gdn.q_gate = b.attn.q_gate;
        L.n_steps = qs_plan_build(&b, L.plan);
        if (m->cfg.ple) {
            snprintf(what, sizeof what, "layer %d: ple.gate", li);
            int rc = upload_matrix(m, b.ple.gate, &L.ple_gate, what, err, err_len);
            snprintf(what, sizeof what, "layer %d: ple.proj", li);
            if (!rc) rc = upload_matrix_padded(m, b.ple.proj, m->cfg.ple_pad, &L.ple_proj, what, err, err_len);
            if (rc) return rc;
        }
        const qs_attn_desc &a = b.attn;
        const qs_rope_desc &r = b.rope;
        const qs_vec no_vec = {nullptr, 0};
        for (int slot = 1; slot < QS_VECS; ++slot) { /* every vector the plan may name */
            int rc = upload_vector(m, *qs_plan_vec(&b, slot), &L.vec[slot], err, err_len);
            if (rc) return rc;
        }
        const struct { const qs_vec *v; float **dst; } vecs[] = {
            {&a.q_norm, &L.q_norm}, {&a.k_norm, &L.k_norm}, {&a.sinks, &L.sinks},
            {r.skip ? &no_vec : &r.freqs, &L.rope_freqs}};
        for (const auto &x : vecs) {
            int rc = upload_vector(m, *x.v, x.dst, err, err_len);
            if (rc) return rc;
        }
        if (b.moe.n_expert) { /* the stacked experts went up as ffn.gate/up/down above */
            int rc = moe_upload(m, b, L, li, err, err_len);
            if (rc) return rc;
        }
        L.H = a.n_head;
        L.KV = a.n_head_kv;
        L.hd = a.head_dim;
        L.F = b.ffn.n_ff;
        L.window = (int)a.window;
        L.eps = b.eps;
        L.scale = a.scale;
        L.softcap = a.softcap;
        L.kv_reuse = a.kv_reuse ? 1 : 0;
        const RopeP rp = rope_params(r, L.rope_freqs);
        if (L.kv_reuse) /* the queries alone, their norm per head (the CPU block's V-from-another-layer path) */
            L.qk = {L.H, 0, L.hd, 0, L.q_norm, nullptr, b.eps, rp, a.temp_scale, (long long)a.temp_floor, 0};
        else
            L.qk = {L.H, L.KV, L.hd, a.qk_norm_full ? 1 : 0, L.q_norm, L.k_norm, b.eps, rp, a.temp_scale,
                    (long long)a.temp_floor, a.v_norm ? 1 : 0};
    }
    int rc = upload_matrix(m, md->tok_embd, &m->tok, "tok_embd", err, err_len);
    if (rc) return rc;
    m->tied = !md->output.ptr;
    if (!m->tied) {
        rc = upload_matrix(m, md->output, &m->out, "output", err, err_len);
        if (rc) return rc;
    }
    return upload_vector(m, md->output_norm, &m->out_norm, err, err_len);
}

/* Scratch for mb tokens and the pinned host buffers. */
static int finalize(qsc_model *m, char *err, size_t err_len) {
    const Dims &c = m->cfg;
    if (!m->host) CUDA_TRY(cudaSetDevice(m->device));
    const int64_t T = m->mb, E = c.E, QD = c.max_qd, KD = c.max_kd, F = c.max_f;
    int64_t kmax = E > QD ? E : QD;
    kmax = kmax > F ? kmax : F;
    kmax = kmax > c.ple_pad ? kmax : c.ple_pad;
    kmax = kmax > gdn_kmax(m) ? kmax : gdn_kmax(m);
    int rc = 0;
    rc = rc ? rc : dalloc_t(m, &m->x, T * E, err, err_len);
    rc = rc ? rc : dalloc_t(m, &m->h, T * E, err, err_len);
    rc = rc ? rc : dalloc_t(m, &m->q, T * QD, err, err_len);
    rc = rc ? rc : dalloc_t(m, &m->k, T * KD, err, err_len);
    rc = rc ? rc : dalloc_t(m, &m->v, T * KD, err, err_len);
    rc = rc ? rc : dalloc_t(m, &m->att, T * QD, err, err_len);
    rc = rc ? rc : dalloc_t(m, &m->o, T * E, err, err_len);
    rc = rc ? rc : dalloc_t(m, &m->g, T * F, err, err_len);
    rc = rc ? rc : dalloc_t(m, &m->u, T * F, err, err_len);
    rc = rc ? rc : dalloc_t(m, &m->a, T * F, err, err_len);
    rc = rc ? rc : dalloc_t(m, &m->qs32, T * kmax, err, err_len);
    rc = rc ? rc : dalloc_t(m, &m->qs256, T * kmax, err, err_len);
    rc = rc ? rc : dalloc_t(m, &m->d32, T * kmax / 32, err, err_len);
    rc = rc ? rc : dalloc_t(m, &m->s32, T * kmax / 32, err, err_len);
    rc = rc ? rc : dalloc_t(m, &m->d256, T * kmax / 256 + 1, err, err_len);
    rc = rc ? rc : dalloc_t(m, &m->bs256, T * kmax / 16, err, err_len);
    rc = rc ? rc : dalloc_t(m, &m->d_params, 2 * T + 1, err, err_len);
    if (c.ple) { /* pads of pg / pa are never written: 0 from the allocation on */
        rc = rc ? rc : dalloc_t(m, &m->pg, T * c.ple_pad, err, err_len);
        rc = rc ? rc : dalloc_t(m, &m->pa, T * c.ple_pad, err, err_len);
        rc = rc ? rc : dalloc_t(m, &m->d_ple, T * c.n_layers * c.ple, err, err_len);
        if (!rc && !m->host) {
            CUDA_TRY(cudaMemset(m->pg, 0, (size_t)(T * c.ple_pad) * sizeof(float)));
            CUDA_TRY(cudaMemset(m->pa, 0, (size_t)(T * c.ple_pad) * sizeof(float)));
        }
    }
    rc = rc ? rc : dalloc_t(m, &m->d_logits1, c.V, err, err_len);
    int64_t fd_hw = 0; /* flash-decoding's partials: the widest layer's H (hd + 2) */
    for (const Layer &L : m->layers) fd_hw = fd_hw > (int64_t)L.H * (L.hd + 2) ? fd_hw : (int64_t)L.H * (L.hd + 2);
    rc = rc ? rc : dalloc_t(m, &m->fd_part, fd_scratch_floats(fd_hw), err, err_len);
    m->fd_sm = FD_HOST_SMS;
    if (!rc && !m->host) CUDA_TRY(cudaDeviceGetAttribute(&m->fd_sm, cudaDevAttrMultiProcessorCount, m->device));
    rc = rc ? rc : moe_finalize(m, err, err_len);
    rc = rc ? rc : gdn_finalize(m, err, err_len);
    if (rc) return rc;
    const size_t ple_bytes = (size_t)(T * c.n_layers * c.ple) * sizeof(float);
    if (m->host) {
        m->h_params = (int *)calloc((size_t)(2 * T + 1), sizeof(int));
        m->h_logits1 = (float *)calloc((size_t)c.V, sizeof(float));
        if (c.ple) m->h_ple = (float *)calloc(ple_bytes, 1);
        if (!m->h_params || !m->h_logits1 || (c.ple && !m->h_ple)) {
            set_err(err, err_len, "out of host memory");
            return -2;
        }
    } else {
        CUDA_TRY(cudaMallocHost((void **)&m->h_params, (size_t)(2 * T + 1) * sizeof(int)));
        CUDA_TRY(cudaMallocHost((void **)&m->h_logits1, (size_t)c.V * sizeof(float)));
        if (c.ple) CUDA_TRY(cudaMallocHost((void **)&m->h_ple, ple_bytes));
        /* The uploads (copy_in's cudaMemcpy from pageable memory) and the zeroing of pg / pa and the recurrent
         * state (cudaMemset) went to the legacy default stream, with which the forward's non-blocking stream
         * m->st is not ordered: wait for them here, once, so that no kernel on m->st can read a buffer still being
         * written. (Putting them on m->st instead would buy nothing: a copy from pageable memory is staged by the
         * driver and returns when the source was read; the create call is synchronous for its caller anyway.) */
        CUDA_TRY(cudaStreamSynchronize(cudaStreamLegacy));
    }
    m->finalized = true;
    return 0;
}


static qsc_model *model_create(const qsc_model_desc *md, const qs_block *layers, int n_ctx, int kv_f16,
                               int max_batch, bool host, char *err, size_t err_len) {
    Dims d;
    if (check_model(md, layers, &d, err, err_len)) return nullptr;
    if (n_ctx <= 0 || max_batch <= 0 || max_batch > 4096) {
        set_err(err, err_len, "n_ctx %d / max_batch %d out of range", n_ctx, max_batch);
        return nullptr;
    }
    qsc_model *m = new qsc_model();
    m->cfg = d;
    m->n_ctx = n_ctx;
    m->kv_f16 = kv_f16 ? 1 : 0;
    m->mb = max_batch;
    m->device = 0;
    m->host = host;
    m->ops = host ? &HOST_LAUNCH : &DEVICE_LAUNCH;
    m->dbg.on = qsc_debug_env(); /* QUANTSCOPE_CUDA_DEBUG, read once (a host model runs no launch to check) */
    if (m->dbg.on) m->use_graphs = false; /* a captured launch cannot be synchronized */
    m->layers.resize(d.n_layers);
    auto fail = [&](void) -> qsc_model * {
        qsc_model_free(m);
        return nullptr;
    };
    cudaError_t e = host ? cudaSuccess : cudaSetDevice(m->device);
    if (e == cudaSuccess && !host) e = cudaStreamCreateWithFlags(&m->st, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        set_err(err, err_len, "CUDA setup: %s (%s = %d)", cudaGetErrorString(e), cudaGetErrorName(e), (int)e);
        return fail();
    }
    m->fast = fast_paths(host);
    int64_t kv_bytes = 0; /* each layer's [n_ctx][n_head_kv][head_dim] rows, 256-byte aligned */
    for (int li = 0; li < d.n_layers; ++li) {
        if (layers[li].attn.kv_reuse) { /* the source's cache (check_model: an earlier layer with its own) */
            m->layers[li].kv_off = m->layers[md->kv_source[li]].kv_off;
            continue;
        }
        m->layers[li].kv_off = kv_bytes;
        const int64_t elems = (int64_t)n_ctx * layers[li].attn.n_head_kv * layers[li].attn.head_dim;
        kv_bytes += (elems * (kv_f16 ? 2 : 4) + 255) / 256 * 256;
    }
    if (dalloc(m, (void **)&m->k_cache, kv_bytes, err, err_len) ||
        dalloc(m, (void **)&m->v_cache, kv_bytes, err, err_len))
        return fail();
    if (upload_model(m, md, layers, err, err_len) || finalize(m, err, err_len)) return fail();
    return m;
}

qsc_model *qsc_model_create(const qsc_model_desc *md, const qs_block *layers, int n_ctx, int kv_f16, int max_batch,
                             char *err, size_t err_len) {
    return model_create(md, layers, n_ctx, kv_f16, max_batch, false, err, err_len);
}

qsc_model *qsc_host_model_create(const qsc_model_desc *md, const qs_block *layers, int n_ctx, int kv_f16,
                                 int max_batch, char *err, size_t err_len) {
    return model_create(md, layers, n_ctx, kv_f16, max_batch, true, err, err_len);
}

int qsc_set_graphs(qsc_model *m, int enabled) {
    if (!m) return -1;
    std::lock_guard<std::mutex> lock(m->mu);
    m->use_graphs = enabled != 0 && !m->dbg.on;
    if (!m->use_graphs) drop_graph(m);
    return 0;
}

int64_t qsc_model_device_bytes(qsc_model *m) { return m ? m->dev_bytes : 0; }

int qsc_model_debug(qsc_model *m) { return m && m->dbg.on ? 1 : 0; }

int qsc_debug_message(const char *kernel, int gx, int gy, int gz, int bx, int by, int bz, const char *sizes,
                      const char *error, char *out, size_t len) {
    if (!kernel || !error || !out || !len || gx < 0 || gy < 0 || gz < 0 || bx < 0 || by < 0 || bz < 0) return -1;
    qsc_debug_format(out, len, kernel, (unsigned)gx, (unsigned)gy, (unsigned)gz, (unsigned)bx, (unsigned)by,
                     (unsigned)bz, sizes, error);
    return 0;
}

__global__ void k_debug_nop(int *p) {
    if (p) *p = 0;
}

int qsc_debug_selftest(char *err, size_t err_len) {
    QscDebug d;
    d.on = true;
    {
        QscDebugScope scope(&d);
        k_debug_nop<<<dim3(3, 2), 2048>>>(nullptr); /* more threads than a block may have: refused, not sticky */
        QSC_DBG(0, "k_debug_nop", dim3(3, 2), 2048, "selftest %d", 1);
    }
    set_err(err, err_len, "%s", d.fault[0] ? d.fault : "no fault was reported");
    return d.fault[0] ? 0 : -1;
}

/* The forward of n_tokens tokens in chunks of mb. logits: n_vocab floats (last token) or n_tokens x n_vocab
 * (all_logits); with m->no_head (qsc_forward_resid) none: m->h_resid gets the stream after the last layer instead. */
static int forward_impl(qsc_model *m, const int32_t *tokens, int n_tokens, int n_past, int all_logits, float *logits,
                        const float *ple, int64_t ple_len, char *err, size_t err_len) {
    if (!m || !tokens || (!logits && !m->no_head)) {
        set_err(err, err_len, "no model, tokens or logits buffer");
        return -1;
    }
    std::lock_guard<std::mutex> lock(m->mu);
    const int V = m->cfg.V;
    const bool head = !m->no_head;
    if (!m->finalized) {
        set_err(err, err_len, "model not finalized");
        return -1;
    }
    if (m->dbg.fault[0]) { /* debug mode: a fault was seen (the context is poisoned); every later forward says so */
        set_err(err, err_len, "%s", m->dbg.fault);
        return -1;
    }
    if (n_tokens <= 0 || n_past < 0 || (int64_t)n_past + n_tokens > m->n_ctx) {
        set_err(err, err_len, "%d tokens at position %d do not fit the context of %d", n_tokens, n_past, m->n_ctx);
        return -1;
    }
    for (int i = 0; i < n_tokens; ++i)
        if (tokens[i] < 0 || tokens[i] >= V) {
            set_err(err, err_len, "token id %d outside 0..%d", tokens[i], V - 1);
            return -1;
        }
    const int64_t ple_row = (int64_t)m->cfg.n_layers * m->cfg.ple; /* one token's per-layer inputs */
    if (ple_row ? !ple || ple_len != n_tokens * ple_row : ple || ple_len) {
        set_err(err, err_len, "%lld per-layer input values for %d tokens; the model takes %lld per token",
                (long long)(ple ? ple_len : 0), n_tokens, (long long)ple_row);
        return -1;
    }
    if (!m->host) CUDA_TRY(cudaSetDevice(m->device));
    QscDebugScope dbg_scope(&m->dbg);
    /* a fault seen by the debug mode is the call's error, whatever error it led to afterwards */
    auto fault = [&](int rc) -> int {
        if (!m->dbg.fault[0]) return rc;
        set_err(err, err_len, "%s", m->dbg.fault);
        return rc ? rc : -1;
    };
    all_logits = all_logits && head;
    if (all_logits) {
        int rc = ensure_logits_all(m, n_tokens < m->mb ? n_tokens : m->mb, err, err_len);
        if (rc) return rc;
    }
    const size_t pbytes = (size_t)(2 * m->mb + 1) * sizeof(int);
    if (n_past == 0) { /* a new sequence: the recurrent state starts from zeros, as the CPU session's */
        int rc = gdn_state_op(m, 0, err, err_len);
        if (rc) return rc;
    }
    std::vector<StageCopy> staged;
    struct StageList {
        StageList(std::vector<StageCopy> *l) { stage_list = l; }
        ~StageList() { stage_list = nullptr; }
    } stage_scope(m->host ? nullptr : &staged);
    for (int start = 0; start < n_tokens; start += m->mb) {
        const int T = n_tokens - start < m->mb ? n_tokens - start : m->mb;
        const bool last = start + T == n_tokens;
        for (int i = 0; i < T; ++i) {
            m->h_params[i] = tokens[start + i];
            m->h_params[m->mb + i] = n_past + start + i;
        }
        m->h_params[2 * m->mb] = n_past + start + T;
        const size_t ple_bytes = (size_t)(T * ple_row) * sizeof(float);
        if (ple_row) memcpy(m->h_ple, ple + start * ple_row, ple_bytes);
        float *dl = !head ? nullptr : all_logits ? m->d_logits_all : (last ? m->d_logits1 : nullptr);
        if (m->host) {
            probe_chunk(m, start, n_tokens); /* traced as the device's, by the probe's host twins */
            if (ple_row) memcpy(m->d_ple, m->h_ple, ple_bytes); /* the host twins, at once: logits straight into the caller's buffer */
            memcpy(m->d_params, m->h_params, pbytes);
            int rc = enqueue_forward(m, T, all_logits != 0, dl, err, err_len);
            if (rc) return rc;
            if (m->h_resid)
                memcpy(m->h_resid + (int64_t)start * m->cfg.E, m->x, (size_t)T * m->cfg.E * sizeof(float));
            if (all_logits) memcpy(logits + (int64_t)start * V, dl, (size_t)T * V * sizeof(float));
            else if (last && head) memcpy(logits, dl, (size_t)V * sizeof(float));
            continue;
        }
        /* the first one-token step runs uncaptured (kernels load lazily on first use), later ones replay a graph:
         * the logits' graph, or without a head (qsc_forward_resid) the stream's */
        const bool traced = probe_chunk(m, start, n_tokens);
        if (T == 1 && m->use_graphs && m->stepped && !traced) {
            int rc = step_graph(m, !head, err, err_len);
            if (rc) return fault(rc);
            if (!head) memcpy(m->h_resid + (int64_t)start * m->cfg.E, m->h_resid1, (size_t)m->cfg.E * sizeof(float));
            else if (all_logits) memcpy(logits + (int64_t)start * V, m->h_logits1, (size_t)V * sizeof(float));
            else if (last) memcpy(logits, m->h_logits1, (size_t)V * sizeof(float));
            continue;
        }
        /* the chunk's copies to the caller's pageable memory go through the pinned stage */
        size_t stage = 0;
        if (all_logits) stage += ((size_t)T * V * sizeof(float) + 255) / 256 * 256;
        if (m->h_resid) stage += ((size_t)T * m->cfg.E * sizeof(float) + 255) / 256 * 256;
        if (traced) /* the residual stream at each layer boundary and each layer's queries */
            stage += (size_t)(m->cfg.n_layers + 1) * (((size_t)T * m->cfg.E * sizeof(float) + 255) / 256 * 256) +
                     (size_t)m->cfg.n_layers * (((size_t)T * m->cfg.max_qd * sizeof(float) + 255) / 256 * 256);
        if (stage) {
            int rc = stage_reserve(m, stage, err, err_len);
            if (rc) return rc;
        }
        CUDA_TRY(cudaMemcpyAsync(m->d_params, m->h_params, pbytes, cudaMemcpyHostToDevice, m->st));
        if (ple_row) CUDA_TRY(cudaMemcpyAsync(m->d_ple, m->h_ple, ple_bytes, cudaMemcpyHostToDevice, m->st));
        int rc = enqueue_forward(m, T, all_logits != 0, dl, err, err_len);
        if (rc || m->dbg.fault[0]) return fault(rc);
        if (m->h_resid)
            stage_copy(m, m->h_resid + (int64_t)start * m->cfg.E, m->x, (size_t)T * m->cfg.E * sizeof(float));
        if (all_logits) stage_copy(m, logits + (int64_t)start * V, dl, (size_t)T * V * sizeof(float));
        else if (last && head)
            CUDA_TRY(cudaMemcpyAsync(m->h_logits1, dl, (size_t)V * sizeof(float), cudaMemcpyDeviceToHost, m->st));
        const cudaError_t e = cudaStreamSynchronize(m->st);
        if (m->dbg.fault[0]) return fault(-1);
        CUDA_TRY(e);
        stage_flush(m, staged);
        if (!all_logits && last && head) memcpy(logits, m->h_logits1, (size_t)V * sizeof(float));
        if (T == 1) m->stepped = true;
    }
    return 0;
}

int qsc_forward_resid(qsc_model *m, const int32_t *tokens, int n_tokens, int n_past, const float *ple,
                      int64_t ple_len, float *resid, char *err, size_t err_len) {
    if (!m || !resid) {
        set_err(err, err_len, "no model or residual buffer");
        return -1;
    }
    m->h_resid = resid; /* the stream only: no final head (its logits would not be used) */
    m->no_head = true;
    const int rc = forward_impl(m, tokens, n_tokens, n_past, 0, nullptr, ple, ple_len, err, err_len);
    m->no_head = false;
    m->h_resid = nullptr;
    return rc;
}

int qsc_recurrent_state(qsc_model *m, int op, char *err, size_t err_len) {
    if (!m || op < 0 || op > 3) {
        set_err(err, err_len, "no model, or state operation %d not 0..3", op);
        return -1;
    }
    std::lock_guard<std::mutex> lock(m->mu);
    if (op == 3) return m->gdn.n > 0 ? 1 : 0;
    if (!m->host) CUDA_TRY(cudaSetDevice(m->device));
    int rc = gdn_state_op(m, op, err, err_len);
    if (rc) return rc;
    if (!m->host) CUDA_TRY(cudaStreamSynchronize(m->st));
    return 0;
}

int qsc_forward(qsc_model *m, const int32_t *tokens, int n_tokens, int n_past, int all_logits, float *logits,
                char *err, size_t err_len) {
    return forward_impl(m, tokens, n_tokens, n_past, all_logits, logits, nullptr, 0, err, err_len);
}

int qsc_forward_ple(qsc_model *m, const int32_t *tokens, int n_tokens, int n_past, int all_logits, float *logits,
                    const float *ple, int64_t ple_len, char *err, size_t err_len) {
    return forward_impl(m, tokens, n_tokens, n_past, all_logits, logits, ple, ple_len, err, err_len);
}

/* the single-kernel test entry points */
int qsc_kernel_matmat(int type, const uint8_t *w, int64_t rows, int64_t k, const float *x, int n_x, float *y,
                      char *err, size_t err_len) {
    PackedLayout L;
    if (!packed_layout(type, rows, k, &L) || n_x <= 0 || n_x > 8 * 65535) {
        set_err(err, err_len, "unsupported type %d / shape %lld x %lld / n_x %d", type, (long long)rows,
                (long long)k, n_x);
        return -1;
    }
    std::vector<uint8_t> host((size_t)L.total);
    repack_host(type, w, rows, k, host.data(), L.total);
    Scratch s;
    uint8_t *dw;
    float *dx, *dy;
    ActOut ao = {};
    CUDA_TRY(s.put(&dw, host.data(), L.total));
    CUDA_TRY(s.put(&dx, x, (int64_t)n_x * k));
    CUDA_TRY(s.get(&dy, (int64_t)n_x * rows));
    CUDA_TRY(scratch_act(s, ao, n_x, k));
    ActOut want = {};
    if (type_act(type) == ACT_32) { want.qs32 = ao.qs32; want.d32 = ao.d32; want.s32 = ao.s32; }
    if (type_act(type) == ACT_256) { want.qs256 = ao.qs256; want.d256 = ao.d256; want.bs256 = ao.bs256; }
    QSC_ENTRY_DEBUG;
    if (want.qs32 || want.qs256) {
        k_quantize<<<n_x, 256>>>(dx, want, (int)k);
        QSC_DBG(0, "k_quantize", n_x, 256, "rows %d, n %lld", n_x, (long long)k);
    }
    QW qw = make_qw(type, rows, k, dw, L);
    Act a;
    const bool k256 = type_act(type) == ACT_256;
    a.qs = k256 ? ao.qs256 : ao.qs32;
    a.d = k256 ? ao.d256 : ao.d32;
    a.s = ao.s32;
    a.bs = ao.bs256;
    a.f = dx;
    a.k = k;
    MatJob job = {&qw, a, dy, rows, nullptr};
    launch_matmul(fast_paths(false), &job, 1, n_x, 0);
    QSC_ENTRY_CHECK;
    CUDA_TRY(cudaMemcpy(y, dy, (size_t)n_x * rows * sizeof(float), cudaMemcpyDeviceToHost));
    return 0;
}

int qsc_kernel_quantize(int act_type, const float *x, int64_t n, uint8_t *out, char *err, size_t err_len) {
    const bool k256 = act_type == T_Q8_K;
    if ((act_type != T_Q8_0 && act_type != T_Q8_1 && !k256) || n <= 0 || n % (k256 ? 256 : 32)) {
        set_err(err, err_len, "bad activation type %d or length %lld", act_type, (long long)n);
        return -1;
    }
    Scratch s;
    float *dx;
    ActOut ao = {}, want = {};
    CUDA_TRY(s.put(&dx, x, n));
    CUDA_TRY(scratch_act(s, ao, 1, n));
    if (k256) { want.qs256 = ao.qs256; want.d256 = ao.d256; want.bs256 = ao.bs256; }
    else { want.qs32 = ao.qs32; want.d32 = ao.d32; want.s32 = ao.s32; }
    QSC_ENTRY_DEBUG;
    k_quantize<<<1, 256>>>(dx, want, (int)n);
    QSC_DBG(0, "k_quantize", 1, 256, "rows 1, n %lld", (long long)n);
    QSC_ENTRY_CHECK;
    std::vector<int8_t> qs((size_t)n);
    std::vector<float> d((size_t)n / 32 + 1), sm((size_t)n / 32 + 1);
    std::vector<int> bs((size_t)n / 16 + 1);
    if (k256) {
        CUDA_TRY(cudaMemcpy(qs.data(), ao.qs256, (size_t)n, cudaMemcpyDeviceToHost));
        CUDA_TRY(cudaMemcpy(d.data(), ao.d256, (size_t)(n / 256) * 4, cudaMemcpyDeviceToHost));
        CUDA_TRY(cudaMemcpy(bs.data(), ao.bs256, (size_t)(n / 16) * 4, cudaMemcpyDeviceToHost));
    } else {
        CUDA_TRY(cudaMemcpy(qs.data(), ao.qs32, (size_t)n, cudaMemcpyDeviceToHost));
        CUDA_TRY(cudaMemcpy(d.data(), ao.d32, (size_t)(n / 32) * 4, cudaMemcpyDeviceToHost));
        CUDA_TRY(cudaMemcpy(sm.data(), ao.s32, (size_t)(n / 32) * 4, cudaMemcpyDeviceToHost));
    }
    act_to_cpu_bytes(act_type, n, qs.data(), d.data(), sm.data(), bs.data(), out);
    return 0;
}

int qsc_kernel_get_rows(int type, const uint8_t *w, int64_t rows, int64_t k, const int32_t *ids, int n_ids,
                        float scale, float *out, char *err, size_t err_len) {
    PackedLayout L;
    if (!packed_layout(type, rows, k, &L) || n_ids <= 0) {
        set_err(err, err_len, "unsupported type %d / shape / ids", type);
        return -1;
    }
    for (int i = 0; i < n_ids; ++i)
        if (ids[i] < 0 || ids[i] >= rows) {
            set_err(err, err_len, "row id %d outside 0..%lld", ids[i], (long long)rows - 1);
            return -1;
        }
    std::vector<uint8_t> host((size_t)L.total);
    repack_host(type, w, rows, k, host.data(), L.total);
    Scratch s;
    uint8_t *dw;
    int *dids;
    float *dout;
    CUDA_TRY(s.put(&dw, host.data(), L.total));
    CUDA_TRY(s.put(&dids, (const int *)ids, n_ids));
    CUDA_TRY(s.get(&dout, (int64_t)n_ids * k));
    QSC_ENTRY_DEBUG;
    k_embed<<<n_ids, 256>>>(make_qw(type, rows, k, dw, L), dids, dout, (int)k, scale);
    QSC_DBG(0, "k_embed", n_ids, 256, "tokens %d, n %lld, rows %lld", n_ids, (long long)k, (long long)rows);
    QSC_ENTRY_CHECK;
    CUDA_TRY(cudaMemcpy(out, dout, (size_t)n_ids * k * sizeof(float), cudaMemcpyDeviceToHost));
    return 0;
}

int qsc_kernel_rmsnorm(const float *x, const float *w, float *y, int n_rows, int n, float eps, char *err,
                       size_t err_len) {
    if (n_rows <= 0 || n <= 0) {
        set_err(err, err_len, "bad shape");
        return -1;
    }
    Scratch s;
    float *dx, *dw = nullptr, *dy;
    CUDA_TRY(s.put(&dx, x, (int64_t)n_rows * n));
    if (w) CUDA_TRY(s.put(&dw, w, n));
    CUDA_TRY(s.get(&dy, (int64_t)n_rows * n));
    QSC_ENTRY_DEBUG;
    k_norm_quant<<<n_rows, 256>>>(dx, ResidIn{}, dw, 1, dy, ActOut{}, n, eps);
    QSC_DBG(0, "k_norm_quant", n_rows, 256, "rows %d, n %d", n_rows, n);
    QSC_ENTRY_CHECK;
    CUDA_TRY(cudaMemcpy(y, dy, (size_t)n_rows * n * sizeof(float), cudaMemcpyDeviceToHost));
    return 0;
}

int qsc_kernel_rope(float *x, int n_tokens, int n_heads, int head_dim, int rot_dim, const int32_t *pos,
                    float freq_base, int neox, char *err, size_t err_len) {
    if (n_tokens <= 0 || n_heads <= 0 || head_dim <= 0 || head_dim > QSC_MAX_HEAD || rot_dim <= 0 ||
        rot_dim > head_dim || rot_dim % 2) {
        set_err(err, err_len, "bad shape");
        return -1;
    }
    Scratch s;
    float *dx;
    int *dpos;
    const int64_t n = (int64_t)n_tokens * n_heads * head_dim;
    CUDA_TRY(s.put(&dx, x, n));
    CUDA_TRY(s.put(&dpos, (const int *)pos, n_tokens));
    QKArgs A = {};
    A.H = n_heads;
    A.hd = head_dim;
    A.rope = {0, rot_dim, neox ? 1 : 0, freq_base, 1.0f, 0.0f, 0.0f, 0.0f, 1.0f, nullptr};
    QSC_ENTRY_DEBUG;
    k_qk_post<<<n_tokens, 256>>>(dx, nullptr, nullptr, A, dpos, nullptr, nullptr, 0);
    QSC_DBG(0, "k_qk_post", n_tokens, 256, "tokens %d, heads %d, head_dim %d", n_tokens, n_heads, head_dim);
    QSC_ENTRY_CHECK;
    CUDA_TRY(cudaMemcpy(x, dx, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost));
    return 0;
}

int qsc_kernel_glu(const float *gate, const float *up, float *out, int n_rows, int n, int mode, char *err,
                   size_t err_len) {
    if (n_rows <= 0 || n <= 0 || mode < 0 || mode > 2) {
        set_err(err, err_len, "bad shape");
        return -1;
    }
    Scratch s;
    float *dg, *du, *dout;
    const int64_t total = (int64_t)n_rows * n;
    CUDA_TRY(s.put(&dg, gate, total));
    CUDA_TRY(s.put(&du, up, total));
    CUDA_TRY(s.get(&dout, total));
    QSC_ENTRY_DEBUG;
    k_glu_quant<<<n_rows, 256>>>(dg, du, dout, ActOut{}, n, mode, n, n);
    QSC_DBG(0, "k_glu_quant", n_rows, 256, "rows %d, n %d, mode %d", n_rows, n, mode);
    QSC_ENTRY_CHECK;
    CUDA_TRY(cudaMemcpy(out, dout, (size_t)total * sizeof(float), cudaMemcpyDeviceToHost));
    return 0;
}

int qsc_kernel_attention(const float *q, int n_q, const int32_t *q_pos, int n_heads, int head_dim,
                         const void *k_cache, const void *v_cache, int kv_f16, int n_kv_heads, int n_kv, int window,
                         float scale, float *out, char *err, size_t err_len) {
    return qsc_kernel_attention_ext(q, n_q, q_pos, n_heads, head_dim, k_cache, v_cache, kv_f16, n_kv_heads, n_kv,
                                    window, scale, 0.0f, nullptr, out, err, err_len);
}

int qsc_kernel_attention_ext(const float *q, int n_q, const int32_t *q_pos, int n_heads, int head_dim,
                             const void *k_cache, const void *v_cache, int kv_f16, int n_kv_heads, int n_kv,
                             int window, float scale, float softcap, const float *sinks, float *out, char *err,
                             size_t err_len) {
    if (n_q <= 0 || n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads || head_dim <= 0 ||
        head_dim > QSC_MAX_HEAD || n_kv <= 0 || window < 0 || !(softcap >= 0.0f)) {
        set_err(err, err_len, "bad shape");
        return -1;
    }
    for (int i = 0; i < n_q; ++i)
        if (q_pos[i] < 0) {
            set_err(err, err_len, "negative position");
            return -1;
        }
    Scratch s;
    float *dq, *dout, *dsinks = nullptr;
    int *dpos, *dnkv;
    uint8_t *dk, *dv;
    const int64_t kv_bytes = (int64_t)n_kv * n_kv_heads * head_dim * (kv_f16 ? 2 : 4);
    CUDA_TRY(s.put(&dq, q, (int64_t)n_q * n_heads * head_dim));
    CUDA_TRY(s.put(&dpos, (const int *)q_pos, n_q));
    CUDA_TRY(s.put(&dnkv, &n_kv, 1));
    CUDA_TRY(s.put(&dk, (const uint8_t *)k_cache, kv_bytes));
    CUDA_TRY(s.put(&dv, (const uint8_t *)v_cache, kv_bytes));
    if (sinks) CUDA_TRY(s.put(&dsinks, sinks, n_heads));
    CUDA_TRY(s.get(&dout, (int64_t)n_q * n_heads * head_dim));
    const AttnArgs A = {n_heads, n_kv_heads, head_dim, window, scale, softcap, dsinks};
    QSC_ENTRY_DEBUG;
    launch_attention(fast_paths(false), n_q, A, kv_f16, 0, dq, dpos, dk, dv, dnkv, dout, ActOut{});
    QSC_ENTRY_CHECK;
    CUDA_TRY(cudaMemcpy(out, dout, (size_t)n_q * n_heads * head_dim * sizeof(float), cudaMemcpyDeviceToHost));
    return 0;
}

int qsc_kernel_qk_post(float *q, float *k, int n_tokens, int n_head, int n_head_kv, int head_dim,
                       const float *q_norm, const float *k_norm, int qk_full, float eps, const int32_t *pos,
                       const qs_rope_desc *rope, float temp_scale, int64_t temp_floor, char *err, size_t err_len) {
    if (!qk_post_args_ok(q, k, n_tokens, n_head, n_head_kv, head_dim, pos, rope, temp_scale, temp_floor)) {
        set_err(err, err_len, "bad shape or RoPE description");
        return -1;
    }
    Scratch s;
    float *dq, *dk = nullptr, *dqn = nullptr, *dkn = nullptr, *dfreqs = nullptr;
    int *dpos;
    const int64_t nq = (int64_t)n_tokens * n_head * head_dim, nk = (int64_t)n_tokens * n_head_kv * head_dim;
    const int64_t qn = qk_full ? (int64_t)n_head * head_dim : head_dim, kn = qk_full ? (int64_t)n_head_kv * head_dim
                                                                                      : head_dim;
    CUDA_TRY(s.put(&dq, q, nq));
    if (k) CUDA_TRY(s.put(&dk, k, nk));
    if (q_norm && k_norm) {
        CUDA_TRY(s.put(&dqn, q_norm, qn));
        CUDA_TRY(s.put(&dkn, k_norm, kn));
    }
    if (rope->freqs.ptr && !rope->skip) CUDA_TRY(s.put(&dfreqs, rope->freqs.ptr, rope->dim / 2));
    CUDA_TRY(s.put(&dpos, (const int *)pos, n_tokens));
    const QKArgs A = {n_head, k ? n_head_kv : 0, head_dim, qk_full ? 1 : 0, dqn, dkn, eps, rope_params(*rope, dfreqs),
                      temp_scale, (long long)temp_floor};
    QSC_ENTRY_DEBUG;
    k_qk_post<<<n_tokens, 256>>>(dq, dk, nullptr, A, dpos, nullptr, nullptr, 0);
    QSC_DBG(0, "k_qk_post", n_tokens, 256, "tokens %d, heads %d/%d, head_dim %d", n_tokens, n_head, n_head_kv,
            head_dim);
    QSC_ENTRY_CHECK;
    CUDA_TRY(cudaMemcpy(q, dq, (size_t)nq * sizeof(float), cudaMemcpyDeviceToHost));
    if (k) CUDA_TRY(cudaMemcpy(k, dk, (size_t)nk * sizeof(float), cudaMemcpyDeviceToHost));
    return 0;
}

int qsc_kernel_logits(float *x, int64_t n, float logit_scale, float softcap, char *err, size_t err_len) {
    if (n <= 0) {
        set_err(err, err_len, "bad length");
        return -1;
    }
    Scratch s;
    float *dx;
    CUDA_TRY(s.put(&dx, x, n));
    QSC_ENTRY_DEBUG;
    const int blocks = (int)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
    k_logits_post<<<blocks, 256>>>(dx, n, qs_plan_one(logit_scale), softcap);
    QSC_DBG(0, "k_logits_post", blocks, 256, "n %lld", (long long)n);
    QSC_ENTRY_CHECK;
    CUDA_TRY(cudaMemcpy(x, dx, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost));
    return 0;
}

} /* extern "C" */

#define QSC_MOE_ENTRY
#include "qsc_moe.cuh" /* qsc_kernel_moe_ffn */

#define QSC_FD_ENTRY
#include "qsc_decode.cuh" /* qsc_kernel_flashdec */
