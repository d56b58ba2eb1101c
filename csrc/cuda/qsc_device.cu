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

#include "qsc_kernels.cuh"
#include "qsc_fast.cuh" /* tensor-core prefill GEMM, flash attention, decode GEMV */

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
#include "qsc_gdn.cuh" /* gated delta-net: GdnLayer, GdnModel, the conv and recurrence kernels */

/* One layer on the device: its description's attention and FFN groups (absent vectors NULL) and policy. */
struct Layer {
    DevMat wq, wk, wv, wo, gate, up, down;
    float *attn_norm = nullptr, *ffn_norm = nullptr, *post_attn_norm = nullptr, *post_ffn_norm = nullptr;
    float *bq = nullptr, *bk = nullptr, *bv = nullptr, *q_norm = nullptr, *k_norm = nullptr;
    int window;
    float rope_base, scale;
    MoeLayer moe; /* n_expert 0: a dense FFN */
    GdnLayer gdn; /* g.K 0: attention (else the delta-net mixer replaces it) */
};

struct qsc_model {
    Dims cfg; /* read from the description by check_model */
    int n_ctx, kv_f16, mb, device;
    std::vector<Layer> layers;
    DevMat tok, out;
    bool tied = false, finalized = false, use_graphs = true;
    float *out_norm = nullptr;
    uint8_t *k_cache = nullptr, *v_cache = nullptr;
    int64_t kv_layer_bytes = 0;
    /* scratch, sized for mb tokens */
    float *x, *h, *q, *k, *v, *att, *o, *g, *u, *a;
    int8_t *qs32, *qs256;
    float *d32, *s32, *d256;
    int *bs256;
    int *d_params, *h_params;     /* tokens[mb], pos[mb], n_kv: device copy and its pinned host source */
    float *d_logits1, *h_logits1; /* last-token logits (device, pinned host) */
    float *d_logits_all = nullptr;
    int64_t logits_all_rows = 0;
    cudaStream_t st = nullptr;
    cudaGraphExec_t gexec = nullptr;
    bool stepped = false; /* a one-token step ran without capture: every kernel it uses is loaded */
    int64_t dev_bytes = 0;
    std::vector<void *> allocs;
    MoeScratch moe_s;
    GdnModel gdn; /* the delta-net layers' scratch and the session's recurrent state */
    bool has_moe = false; /* the routing is read back once per moe layer: no CUDA graph */
    std::mutex mu;
    struct QscProbe *probe = nullptr; /* qsc_probe.cuh: traces, statistics (NULL: none asked for) */
};

static int dalloc(qsc_model *m, void **p, int64_t bytes, char *err, size_t err_len) {
    bytes = (bytes + 255) / 256 * 256;
    if (bytes == 0) bytes = 256;
    CUDA_TRY(cudaMalloc(p, (size_t)bytes));
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

/* The formats a set of consumer matrices needs (NULL pointers = not produced). */
static ActOut act_out_for(const qsc_model *m, std::initializer_list<int> types) {
    bool n32 = false, n256 = false;
    for (int t : types) {
        n32 |= type_act(t) == ACT_32;
        n256 |= type_act(t) == ACT_256;
    }
    ActOut o = {};
    if (n32) { o.qs32 = m->qs32; o.d32 = m->d32; o.s32 = m->s32; }
    if (n256) { o.qs256 = m->qs256; o.d256 = m->d256; o.bs256 = m->bs256; }
    return o;
}

struct MatJob {
    const QW *w;
    Act a;
    float *y;
    int64_t ldy;
    const float *bias;
};

static void launch_matmul(const MatJob *jobs, int n, int ncols, cudaStream_t st) {
    if ((ncols == 1 || ncols >= MMA_MIN_COLS) && n <= 3) { /* decode GEMV / tensor-core prefill (qsc_fast.cuh) */
        MmaSeg segs[3];
        for (int i = 0; i < n; ++i) segs[i] = {*jobs[i].w, jobs[i].a, jobs[i].y, jobs[i].ldy, jobs[i].bias, 0};
        if (ncols == 1 ? launch_gemv(segs, n, ncols, st) : launch_matmul_mma(segs, n, ncols, st)) return;
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
    if (ncols == 1)
        k_matmul<1><<<dim3(blocks, 1), MM_WARPS * 32, 0, st>>>(args);
    else
        k_matmul<8><<<dim3(blocks, (ncols + 7) / 8), MM_WARPS * 32, 0, st>>>(args);
}

template <typename KT>
static void launch_attention_t(int epl, dim3 grid, cudaStream_t st, const float *q, const int *pos, int H, int KV,
                               const void *kc, const void *vc, const int *nkv, int window, float scale, float *out,
                               const ActOut &ao) {
    const KT *K = (const KT *)kc, *V = (const KT *)vc;
#define QSC_ATT(E)                                                                                              \
    case E: k_attention<E, KT><<<grid, 256, 0, st>>>(q, pos, H, KV, K, V, nkv, window, scale, out, ao); break;
    switch (epl) {
        QSC_ATT(1) QSC_ATT(2) QSC_ATT(3) QSC_ATT(4) QSC_ATT(5) QSC_ATT(6) QSC_ATT(7) QSC_ATT(8)
    default: break;
    }
#undef QSC_ATT
}

/* Attention over the cache; quantizes the output in the same kernel when the int8 blocks fall inside a head,
 * otherwise with one more launch. */
static void launch_attention(int T, int H, int KV, int hd, int kv_f16, cudaStream_t st, const float *q,
                             const int *pos, const void *kc, const void *vc, const int *nkv, int window, float scale,
                             float *out, ActOut ao) {
    const FaArgs fa = {q, pos, nkv, T, H, KV, window, scale, 0.0f, nullptr, out}; /* no soft-cap, no sinks */
    if (launch_flash(fa, hd, kv_f16, kc, vc, st)) { /* prefill: flash attention (qsc_fast.cuh) */
        if (ao.qs32 || ao.qs256) k_quantize<<<T, 256, 0, st>>>(out, ao, H * hd);
        return;
    }
    const bool fused = (!ao.qs32 || hd % 32 == 0) && (!ao.qs256 || hd % 256 == 0);
    const ActOut none = {};
    dim3 grid(H, T);
    const ActOut &aq = fused ? ao : none;
    if (kv_f16)
        launch_attention_t<__half>(hd / 32, grid, st, q, pos, H, KV, kc, vc, nkv, window, scale, out, aq);
    else
        launch_attention_t<float>(hd / 32, grid, st, q, pos, H, KV, kc, vc, nkv, window, scale, out, aq);
    if (!fused && (ao.qs32 || ao.qs256)) k_quantize<<<T, 256, 0, st>>>(out, ao, H * hd);
}

#define QSC_MOE_ENQUEUE
#include "qsc_moe.cuh" /* moe_finalize, moe_input_formats, enqueue_moe */
#include "qsc_probe.cuh"
#define QSC_GDN_ENQUEUE
#include "qsc_gdn.cuh" /* gdn_finalize, enqueue_gdn */

/* Enqueue the forward pass of T tokens whose ids/positions are already in m->d_params. logits: NULL (no lm_head),
 * or T x n_vocab (all rows) / n_vocab (last row) floats on the device. */
static int enqueue_forward(qsc_model *m, int T, bool all_rows, float *logits, char *err, size_t err_len) {
    const Dims &c = m->cfg;
    const int E = c.E, H = c.H, KV = c.KV, hd = c.hd, F = c.F, V = c.V;
    const int QD = H * hd, KD = KV * hd;
    cudaStream_t st = m->st;
    const int *tok = m->d_params, *pos = m->d_params + m->mb, *nkv = m->d_params + 2 * m->mb;
    k_embed<<<T, 256, 0, st>>>(m->tok.w, tok, m->x, E, c.embed_scale);
    const float *prev_o = nullptr, *prev_post = nullptr;
    for (int li = 0; li < c.n_layers; ++li) {
        Layer &L = m->layers[li];
        const QW &wq = L.wq.w, &wk = L.wk.w, &wv = L.wv.w, &wo = L.wo.w;
        const QW &wg = L.gate.w, &wu = L.up.w, &wd = L.down.w;
        uint8_t *kc = m->k_cache + li * m->kv_layer_bytes, *vc = m->v_cache + li * m->kv_layer_bytes;
        /* attention branch (or the delta-net mixer) */
        const GdnLayer &G = L.gdn;
        k_norm_quant<<<T, 256, 0, st>>>(m->x, prev_o, prev_post, L.attn_norm, m->h,
                                        G.g.K ? act_out_for(m, {G.qkv.w.type, G.z.w.type, G.beta.w.type,
                                                                G.alpha.w.type})
                                              : act_out_for(m, {wq.type, wk.type, wv.type}), E, c.eps);
        probe_tap(m, PROBE_RESID, li, m->x, T);
        probe_tap(m, PROBE_ATTN_IN, li, m->h, T);
        if (G.g.K) {
            enqueue_gdn(m, L, T);
            goto ffn;
        }
        {
        const bool qgate = G.q_gate != 0; /* wq gives each head's query and gate (qwen35): split, bias after */
        MatJob qkv[3] = {{&wq, act_view(m, wq.type, m->h, E, 0), qgate ? m->gdn.qg : m->q, qgate ? 2 * QD : QD,
                          qgate ? nullptr : L.bq},
                         {&wk, act_view(m, wk.type, m->h, E, 0), m->k, KD, L.bk},
                         {&wv, act_view(m, wv.type, m->h, E, 0), m->v, KD, L.bv}};
        launch_matmul(qkv, 3, T, st);
        if (qgate) k_qgate_split<<<T, 256, 0, st>>>(m->gdn.qg, L.bq, m->q, m->gdn.gate, H, hd);
        k_qk_post<<<T, 256, 0, st>>>(m->q, m->k, m->v, H, KV, hd, L.q_norm, L.k_norm, c.eps,
                                     pos, c.rope_dim, L.rope_base, c.neox, kc, vc, m->kv_f16);
        probe_tap(m, PROBE_Q, li, m->q, T);
        launch_attention(T, H, KV, hd, m->kv_f16, st, m->q, pos, kc, vc, nkv, L.window, L.scale, m->att,
                         qgate ? ActOut{} : act_out_for(m, {wo.type}));
        if (qgate) k_qgate_quant<<<T, 256, 0, st>>>(m->att, m->gdn.gate, act_out_for(m, {wo.type}), QD);
        probe_tap(m, PROBE_WO_IN, li, m->att, T);
        MatJob ob = {&wo, act_view(m, wo.type, m->att, QD, 0), m->o, E, nullptr};
        launch_matmul(&ob, 1, T, st);
        }
    ffn: /* feed-forward branch */
        k_norm_quant<<<T, 256, 0, st>>>(m->x, m->o, L.post_attn_norm, L.ffn_norm, m->h,
                                        L.moe.n_expert ? moe_input_formats(m, L.moe)
                                                       : act_out_for(m, {wg.type, wu.type}), E, c.eps);
        probe_tap(m, PROBE_FFN_IN, li, m->h, T);
        if (L.moe.n_expert) {
            int rc = enqueue_moe(m, L, T, err, err_len);
            if (rc) return rc;
        } else {
            MatJob gu[2] = {{&wg, act_view(m, wg.type, m->h, E, 0), m->g, F, nullptr},
                            {&wu, act_view(m, wu.type, m->h, E, 0), m->u, F, nullptr}};
            launch_matmul(gu, 2, T, st);
            k_glu_quant<<<T, 256, 0, st>>>(m->g, m->u, m->a, act_out_for(m, {wd.type}), F, c.gelu);
            probe_tap(m, PROBE_DOWN_IN, li, m->a, T);
            MatJob db = {&wd, act_view(m, wd.type, m->a, F, 0), m->o, E, nullptr};
            launch_matmul(&db, 1, T, st);
        }
        prev_o = m->o;
        prev_post = L.post_ffn_norm;
    }
    const QW &wout = m->tied ? m->tok.w : m->out.w;
    k_norm_quant<<<T, 256, 0, st>>>(m->x, prev_o, prev_post, m->out_norm, m->h, act_out_for(m, {wout.type}), E,
                                    c.eps);
    probe_tap(m, PROBE_RESID, c.n_layers, m->x, T);
    if (logits) {
        const int rows = all_rows ? T : 1;
        MatJob lm = {&wout, act_view(m, wout.type, m->h, E, all_rows ? 0 : T - 1), logits, V, nullptr};
        launch_matmul(&lm, 1, rows, st);
    }
    CUDA_TRY(cudaGetLastError());
    return 0;
}

static int ensure_logits_all(qsc_model *m, int64_t rows, char *err, size_t err_len) {
    if (m->logits_all_rows >= rows) return 0;
    if (m->d_logits_all) {
        CUDA_TRY(cudaFree(m->d_logits_all));
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
    m->gexec = nullptr;
}

/* One-token step: capture (first time) and replay the graph: params in, every kernel, logits out. */
static int step_graph(qsc_model *m, char *err, size_t err_len) {
    const size_t pbytes = (size_t)(2 * m->mb + 1) * sizeof(int);
    const size_t lbytes = (size_t)m->cfg.V * sizeof(float);
    if (!m->gexec) {
        CUDA_TRY(cudaStreamBeginCapture(m->st, cudaStreamCaptureModeThreadLocal));
        cudaMemcpyAsync(m->d_params, m->h_params, pbytes, cudaMemcpyHostToDevice, m->st);
        int rc = enqueue_forward(m, 1, false, m->d_logits1, err, err_len);
        cudaMemcpyAsync(m->h_logits1, m->d_logits1, lbytes, cudaMemcpyDeviceToHost, m->st);
        cudaGraph_t graph = nullptr;
        cudaError_t e = cudaStreamEndCapture(m->st, &graph);
        if (rc) {
            if (graph) cudaGraphDestroy(graph);
            return rc;
        }
        CUDA_TRY(e);
        e = cudaGraphInstantiate(&m->gexec, graph, 0);
        cudaGraphDestroy(graph);
        if (e != cudaSuccess) {
            m->gexec = nullptr;
            CUDA_TRY(e);
        }
    }
    CUDA_TRY(cudaGraphLaunch(m->gexec, m->st));
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
    cudaSetDevice(m->device);
    if (m->st) cudaStreamSynchronize(m->st);
    drop_graph(m);
    probe_free(m);
    for (void *p : m->allocs)
        if (p) cudaFree(p);
    if (m->h_params) cudaFreeHost(m->h_params);
    if (m->h_logits1) cudaFreeHost(m->h_logits1);
    moe_free_host(m->moe_s);
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
    CUDA_TRY(cudaMemcpy(dm->buf, host.data(), (size_t)L.total, cudaMemcpyHostToDevice));
    dm->w = make_qw(w.type, w.rows, w.k, dm->buf, L);
    dm->present = true;
    return 0;
}

/* One vector of the description onto the device (absent: *dst stays NULL). */
static int upload_vector(qsc_model *m, const qs_vec &v, float **dst, char *err, size_t err_len) {
    if (!v.ptr) return 0;
    int rc = dalloc_t(m, dst, v.len, err, err_len);
    if (rc) return rc;
    CUDA_TRY(cudaMemcpy(*dst, v.ptr, (size_t)v.len * sizeof(float), cudaMemcpyHostToDevice));
    return 0;
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
            if (b.gdn.conv && x.dm != &L.gate && x.dm != &L.up && x.dm != &L.down) continue; /* no attention */
            snprintf(what, sizeof what, "layer %d: %s", li, x.name);
            int rc = upload_matrix(m, *x.w, x.dm, what, err, err_len);
            if (rc) return rc;
        }
        if (b.gdn.conv) {
            int rc = gdn_upload(m, b, L, li, err, err_len);
            if (rc) return rc;
        }
        const struct { const qs_vec *v; float **dst; } vecs[] = {
            {&b.attn_norm, &L.attn_norm}, {&b.ffn_norm, &L.ffn_norm}, {&b.post_attn_norm, &L.post_attn_norm},
            {&b.post_ffn_norm, &L.post_ffn_norm}, {&b.attn.bq, &L.bq}, {&b.attn.bk, &L.bk}, {&b.attn.bv, &L.bv},
            {&b.attn.q_norm, &L.q_norm}, {&b.attn.k_norm, &L.k_norm}};
        for (const auto &x : vecs) {
            int rc = upload_vector(m, *x.v, x.dst, err, err_len);
            if (rc) return rc;
        }
        if (b.moe.n_expert) { /* the stacked experts went up as ffn.gate/up/down above */
            MoeMat mm[4];
            MoeVec mv[5];
            int nv = 0, nm = moe_parts(b, L.moe, mm, mv, &nv);
            for (int j = 0; j < nm; ++j) {
                snprintf(what, sizeof what, "layer %d: %s", li, mm[j].name);
                int rc = upload_matrix(m, *mm[j].w, mm[j].dm, what, err, err_len);
                if (rc) return rc;
            }
            for (int j = 0; j < nv; ++j) {
                int rc = upload_vector(m, *mv[j].v, mv[j].dst, err, err_len);
                if (rc) return rc;
            }
        }
        L.gdn.q_gate = b.attn.q_gate;
        L.window = (int)b.attn.window;
        L.rope_base = b.rope.base;
        L.scale = b.attn.scale;
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
    CUDA_TRY(cudaSetDevice(m->device));
    const int64_t T = m->mb, E = c.E, QD = (int64_t)c.H * c.hd, KD = (int64_t)c.KV * c.hd;
    const int64_t F = c.F;
    int64_t kmax = E > QD ? E : QD;
    kmax = kmax > F ? kmax : F;
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
    rc = rc ? rc : dalloc_t(m, &m->d_logits1, c.V, err, err_len);
    rc = rc ? rc : moe_finalize(m, err, err_len);
    rc = rc ? rc : gdn_finalize(m, err, err_len);
    if (rc) return rc;
    CUDA_TRY(cudaMallocHost((void **)&m->h_params, (size_t)(2 * T + 1) * sizeof(int)));
    CUDA_TRY(cudaMallocHost((void **)&m->h_logits1, (size_t)c.V * sizeof(float)));
    m->finalized = true;
    return 0;
}


qsc_model *qsc_model_create(const qsc_model_desc *md, const qs_block *layers, int n_ctx, int kv_f16, int max_batch,
                             char *err, size_t err_len) {
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
    m->layers.resize(d.n_layers);
    auto fail = [&](void) -> qsc_model * {
        qsc_model_free(m);
        return nullptr;
    };
    cudaError_t e = cudaSetDevice(m->device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&m->st, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        set_err(err, err_len, "CUDA setup: %s (%s = %d)", cudaGetErrorString(e), cudaGetErrorName(e), (int)e);
        return fail();
    }
    const int64_t kv_elems = (int64_t)n_ctx * d.KV * d.hd;
    m->kv_layer_bytes = (kv_elems * (kv_f16 ? 2 : 4) + 255) / 256 * 256;
    if (dalloc(m, (void **)&m->k_cache, m->kv_layer_bytes * d.n_layers, err, err_len) ||
        dalloc(m, (void **)&m->v_cache, m->kv_layer_bytes * d.n_layers, err, err_len))
        return fail();
    if (upload_model(m, md, layers, err, err_len) || finalize(m, err, err_len)) return fail();
    return m;
}

int qsc_set_graphs(qsc_model *m, int enabled) {
    if (!m) return -1;
    std::lock_guard<std::mutex> lock(m->mu);
    m->use_graphs = enabled != 0;
    if (!m->use_graphs) drop_graph(m);
    return 0;
}

int64_t qsc_model_device_bytes(qsc_model *m) { return m ? m->dev_bytes : 0; }

int qsc_forward(qsc_model *m, const int32_t *tokens, int n_tokens, int n_past, int all_logits, float *logits,
                char *err, size_t err_len) {
    if (!m || !tokens || !logits) {
        set_err(err, err_len, "no model, tokens or logits buffer");
        return -1;
    }
    std::lock_guard<std::mutex> lock(m->mu);
    const int V = m->cfg.V;
    if (!m->finalized) {
        set_err(err, err_len, "model not finalized");
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
    CUDA_TRY(cudaSetDevice(m->device));
    if (all_logits) {
        int rc = ensure_logits_all(m, n_tokens < m->mb ? n_tokens : m->mb, err, err_len);
        if (rc) return rc;
    }
    const size_t pbytes = (size_t)(2 * m->mb + 1) * sizeof(int);
    if (n_past == 0 && m->gdn.n) /* a new sequence: the recurrent state starts from zeros, as the CPU's */
        CUDA_TRY(cudaMemsetAsync(m->gdn.state, 0, (size_t)m->gdn.n * sizeof(float), m->st));
    for (int start = 0; start < n_tokens; start += m->mb) {
        const int T = n_tokens - start < m->mb ? n_tokens - start : m->mb;
        const bool last = start + T == n_tokens;
        for (int i = 0; i < T; ++i) {
            m->h_params[i] = tokens[start + i];
            m->h_params[m->mb + i] = n_past + start + i;
        }
        m->h_params[2 * m->mb] = n_past + start + T;
        /* the first one-token step runs uncaptured (kernels load lazily on first use), later ones replay a graph */
        const bool traced = probe_chunk(m, start, n_tokens);
        if (T == 1 && m->use_graphs && m->stepped && !m->has_moe && !traced) {
            int rc = step_graph(m, err, err_len);
            if (rc) return rc;
            if (all_logits) memcpy(logits + (int64_t)start * V, m->h_logits1, (size_t)V * sizeof(float));
            else if (last) memcpy(logits, m->h_logits1, (size_t)V * sizeof(float));
            continue;
        }
        CUDA_TRY(cudaMemcpyAsync(m->d_params, m->h_params, pbytes, cudaMemcpyHostToDevice, m->st));
        float *dl = all_logits ? m->d_logits_all : (last ? m->d_logits1 : nullptr);
        int rc = enqueue_forward(m, T, all_logits != 0, dl, err, err_len);
        if (rc) return rc;
        if (all_logits)
            CUDA_TRY(cudaMemcpyAsync(logits + (int64_t)start * V, dl, (size_t)T * V * sizeof(float),
                                     cudaMemcpyDeviceToHost, m->st));
        else if (last)
            CUDA_TRY(cudaMemcpyAsync(m->h_logits1, dl, (size_t)V * sizeof(float), cudaMemcpyDeviceToHost, m->st));
        CUDA_TRY(cudaStreamSynchronize(m->st));
        if (!all_logits && last) memcpy(logits, m->h_logits1, (size_t)V * sizeof(float));
        if (T == 1) m->stepped = true;
    }
    return 0;
}

int qsc_recurrent_state(qsc_model *m, int op, char *err, size_t err_len) {
    if (!m || op < 0 || op > 3) {
        set_err(err, err_len, "no model, or state operation %d not 0..3", op);
        return -1;
    }
    std::lock_guard<std::mutex> lock(m->mu);
    const GdnModel &G = m->gdn;
    if (op == 3 || !G.n) return op == 3 ? (int)(G.n > 0) : 0;
    CUDA_TRY(cudaSetDevice(m->device));
    const size_t bytes = (size_t)G.n * sizeof(float);
    if (op == 0) CUDA_TRY(cudaMemsetAsync(G.state, 0, bytes, m->st));
    else if (op == 1) CUDA_TRY(cudaMemcpyAsync(G.ckpt, G.state, bytes, cudaMemcpyDeviceToDevice, m->st));
    else CUDA_TRY(cudaMemcpyAsync(G.state, G.ckpt, bytes, cudaMemcpyDeviceToDevice, m->st));
    CUDA_TRY(cudaStreamSynchronize(m->st));
    return 0;
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
    if (want.qs32 || want.qs256) k_quantize<<<n_x, 256>>>(dx, want, (int)k);
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
    launch_matmul(&job, 1, n_x, 0);
    CUDA_TRY(cudaGetLastError());
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
    k_quantize<<<1, 256>>>(dx, want, (int)n);
    CUDA_TRY(cudaGetLastError());
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
    k_embed<<<n_ids, 256>>>(make_qw(type, rows, k, dw, L), dids, dout, (int)k, scale);
    CUDA_TRY(cudaGetLastError());
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
    k_norm_quant<<<n_rows, 256>>>(dx, nullptr, nullptr, dw, dy, ActOut{}, n, eps);
    CUDA_TRY(cudaGetLastError());
    CUDA_TRY(cudaMemcpy(y, dy, (size_t)n_rows * n * sizeof(float), cudaMemcpyDeviceToHost));
    return 0;
}

int qsc_kernel_rope(float *x, int n_tokens, int n_heads, int head_dim, int rot_dim, const int32_t *pos,
                    float freq_base, int neox, char *err, size_t err_len) {
    if (n_tokens <= 0 || n_heads <= 0 || head_dim <= 0 || rot_dim <= 0 || rot_dim > head_dim || rot_dim % 2) {
        set_err(err, err_len, "bad shape");
        return -1;
    }
    Scratch s;
    float *dx;
    int *dpos;
    const int64_t n = (int64_t)n_tokens * n_heads * head_dim;
    CUDA_TRY(s.put(&dx, x, n));
    CUDA_TRY(s.put(&dpos, (const int *)pos, n_tokens));
    k_qk_post<<<n_tokens, 256>>>(dx, nullptr, nullptr, n_heads, 0, head_dim, nullptr, nullptr, 0.0f, dpos, rot_dim,
                                 freq_base, neox, nullptr, nullptr, 0);
    CUDA_TRY(cudaGetLastError());
    CUDA_TRY(cudaMemcpy(x, dx, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost));
    return 0;
}

int qsc_kernel_glu(const float *gate, const float *up, float *out, int n_rows, int n, int gelu, char *err,
                   size_t err_len) {
    if (n_rows <= 0 || n <= 0) {
        set_err(err, err_len, "bad shape");
        return -1;
    }
    Scratch s;
    float *dg, *du, *dout;
    const int64_t total = (int64_t)n_rows * n;
    CUDA_TRY(s.put(&dg, gate, total));
    CUDA_TRY(s.put(&du, up, total));
    CUDA_TRY(s.get(&dout, total));
    k_glu_quant<<<n_rows, 256>>>(dg, du, dout, ActOut{}, n, gelu);
    CUDA_TRY(cudaGetLastError());
    CUDA_TRY(cudaMemcpy(out, dout, (size_t)total * sizeof(float), cudaMemcpyDeviceToHost));
    return 0;
}

int qsc_kernel_attention(const float *q, int n_q, const int32_t *q_pos, int n_heads, int head_dim,
                         const void *k_cache, const void *v_cache, int kv_f16, int n_kv_heads, int n_kv, int window,
                         float scale, float *out, char *err, size_t err_len) {
    if (n_q <= 0 || n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads || head_dim % 32 || head_dim <= 0 ||
        head_dim > 256 || n_kv <= 0) {
        set_err(err, err_len, "bad shape");
        return -1;
    }
    Scratch s;
    float *dq, *dout;
    int *dpos, *dnkv;
    uint8_t *dk, *dv;
    const int64_t kv_bytes = (int64_t)n_kv * n_kv_heads * head_dim * (kv_f16 ? 2 : 4);
    CUDA_TRY(s.put(&dq, q, (int64_t)n_q * n_heads * head_dim));
    CUDA_TRY(s.put(&dpos, (const int *)q_pos, n_q));
    CUDA_TRY(s.put(&dnkv, &n_kv, 1));
    CUDA_TRY(s.put(&dk, (const uint8_t *)k_cache, kv_bytes));
    CUDA_TRY(s.put(&dv, (const uint8_t *)v_cache, kv_bytes));
    CUDA_TRY(s.get(&dout, (int64_t)n_q * n_heads * head_dim));
    launch_attention(n_q, n_heads, n_kv_heads, head_dim, kv_f16, 0, dq, dpos, dk, dv, dnkv, window, scale, dout,
                     ActOut{});
    CUDA_TRY(cudaGetLastError());
    CUDA_TRY(cudaMemcpy(out, dout, (size_t)n_q * n_heads * head_dim * sizeof(float), cudaMemcpyDeviceToHost));
    return 0;
}

} /* extern "C" */

#define QSC_MOE_ENTRY
#include "qsc_moe.cuh" /* qsc_kernel_moe_ffn */
