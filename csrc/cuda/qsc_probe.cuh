/* The probes on the device (docs/probe.md): what the CPU block's ``qs_block.probe`` hooks give, copied back from the
 * device only when asked for. Included by qsc_device.cu after its launch helpers and before enqueue_forward, whose
 * hooks call probe_tap (a NULL check and nothing else while no probe is set: the decode path copies nothing).
 *
 *   trace  the residual stream entering each layer and leaving the last ((n_layers + 1) x n x E) and each layer's
 *          queries as its attention used them (n_layers x n x H*hd), copied into host buffers by the next
 *          qsc_forward of exactly n tokens (uncaptured: a traced one-token step does not replay the CUDA graph)
 *   stats  per layer, the column sums of squares of each product's input (attention in, wo in, FFN in, down in)
 *          on prompts (T > 1), as the CPU block's acc_sq: device sums started from the caller's, read back by
 *          qsc_stats_read
 *   head   the final norm and the output head of host residual rows, by the forward pass's own kernels (logit lens)
 *   cache  a layer's K or V cache rows back to the host (the attention weights are computed there by the CPU's
 *          native attention, against the same keys)
 */
#pragma once

/* What each hook in enqueue_forward hands over. */
enum { PROBE_RESID = 0, PROBE_Q, PROBE_ATTN_IN, PROBE_WO_IN, PROBE_FFN_IN, PROBE_DOWN_IN };

struct QscProbe {
    float *resid = nullptr, *queries = nullptr; /* host buffers of the next traced forward (NULL: off) */
    int64_t n = 0;                              /* that forward's token count */
    int64_t row0 = 0;                           /* the chunk being run: its first row */
    bool tracing = false;                       /* this chunk is traced */
    float *sums = nullptr;                      /* device sums, per layer [attn E | wo QD | ffn E | down F] */
    float *stats = nullptr;                     /* sums while collecting, else NULL */
    int64_t stats_len = 0;
};

/* Floats of one layer's statistics, and the offset of each product's input within them. */
/* (The widest layer's sizes: a model whose layers differ keeps each layer's own first max_qd / max_f floats.) */
static inline int64_t probe_stats_per_layer(const Dims &c) { return 2 * (int64_t)c.E + c.max_qd + c.max_f; }

static inline int64_t probe_stats_offset(const Dims &c, int what) {
    const int64_t E = c.E, QD = c.max_qd;
    return what == PROBE_ATTN_IN ? 0 : what == PROBE_WO_IN ? E : what == PROBE_FFN_IN ? E + QD : 2 * E + QD;
}

/* acc[j] += x[t][j]^2 for t = 0..T-1 in order (qs_block.c's acc_sq, the same additions in the same order): one
 * column j of T rows of n. Shared by the device kernel and qsc_host_probe_sumsq. */
__host__ __device__ inline void probe_sumsq_col(float *acc, const float *x, int64_t T, int64_t n, int64_t j) {
    float s = acc[j];
    for (int64_t t = 0; t < T; ++t) {
        const float v = x[t * n + j];
#ifdef __CUDA_ARCH__
        s = __fadd_rn(s, __fmul_rn(v, v)); /* no fused multiply-add: the CPU rounds the product first */
#else
        s = s + v * v;
#endif
    }
    acc[j] = s;
}

__global__ void k_probe_sumsq(float *__restrict__ acc, const float *__restrict__ x, int T, int n) {
    const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j < n) probe_sumsq_col(acc, x, T, n, j);
}

/* The probe's entries of the launch tables: the device's copy and kernel, and their host twins. */
static void dev_copy_out(qsc_model *m, void *dst, const void *src, size_t bytes) {
    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, m->st);
}
static void dev_sumsq(qsc_model *m, float *acc, const float *x, int T, int n) {
    k_probe_sumsq<<<(n + 255) / 256, 256, 0, m->st>>>(acc, x, T, n);
}
static void host_copy_out(qsc_model *m, void *dst, const void *src, size_t bytes) {
    (void)m;
    memcpy(dst, src, bytes);
}
static void host_sumsq(qsc_model *m, float *acc, const float *x, int T, int n) {
    (void)m;
    for (int64_t j = 0; j < n; ++j) probe_sumsq_col(acc, x, T, n, j);
}

/* A hook of enqueue_forward: ``src`` (T rows) is ``what`` of layer ``li`` (PROBE_RESID at n_layers: the stream
 * after the last layer). Errors of the enqueued copies surface in enqueue_forward's cudaGetLastError. */
static void probe_tap(qsc_model *m, int what, int li, const float *src, int T) {
    QscProbe *p = m->probe;
    if (!p) return;
    const Dims &c = m->cfg;
    const Layer *L = li < c.n_layers ? &m->layers[(size_t)li] : nullptr;
    const int64_t E = c.E, QD = c.max_qd, LQD = L ? (int64_t)L->H * L->hd : QD;
    if (p->tracing && what == PROBE_RESID && p->resid)
        m->ops->copy_out(m, p->resid + ((int64_t)li * p->n + p->row0) * E, src, (size_t)(T * E) * sizeof(float));
    else if (p->tracing && what == PROBE_Q && p->queries && LQD == QD) /* queries: layers of the widest size */
        m->ops->copy_out(m, p->queries + ((int64_t)li * p->n + p->row0) * QD, src, (size_t)(T * QD) * sizeof(float));
    else if (p->stats && T > 1 && what >= PROBE_ATTN_IN && li < c.n_layers) {
        const int n = what == PROBE_WO_IN ? (int)LQD : what == PROBE_DOWN_IN ? L->F : c.E;
        float *acc = p->stats + li * probe_stats_per_layer(c) + probe_stats_offset(c, what);
        m->ops->sumsq(m, acc, src, T, n);
    }
}

/* qsc_forward's hook before each chunk (rows start.., of a call of n_tokens): is the chunk traced? A traced chunk
 * runs uncaptured (the graph of a one-token step has no copies). */
static bool probe_chunk(qsc_model *m, int start, int n_tokens) {
    QscProbe *p = m->probe;
    if (!p) return false;
    p->tracing = (p->resid || p->queries) && p->n == n_tokens;
    p->row0 = start;
    return p->tracing;
}

static QscProbe *probe_get(qsc_model *m) {
    if (!m->probe) m->probe = new QscProbe();
    return m->probe;
}

static void probe_free(qsc_model *m) {
    delete m->probe; /* its device sums are among m->allocs */
    m->probe = nullptr;
}

static int ensure_logits_all(qsc_model *m, int64_t rows, char *err, size_t err_len);

extern "C" {

/* The next qsc_forward of exactly n_tokens tokens copies the residual stream into resid ((n_layers + 1) x
 * n_tokens x E floats) and the queries into queries (n_layers x n_tokens x H*hd), either NULL: not copied. All
 * NULL / n_tokens 0: off. The buffers must stay valid until that forward returns. */
int qsc_probe_trace(qsc_model *m, float *resid, float *queries, int64_t n_tokens, char *err, size_t err_len) {
    if (!m || n_tokens < 0 || n_tokens > m->n_ctx || ((resid || queries) && n_tokens == 0)) {
        set_err(err, err_len, "no model, or %lld traced tokens outside 1..n_ctx", (long long)n_tokens);
        return -1;
    }
    std::lock_guard<std::mutex> lock(m->mu);
    QscProbe *p = probe_get(m);
    p->resid = resid;
    p->queries = queries;
    p->n = (resid || queries) ? n_tokens : 0;
    p->tracing = false;
    return 0;
}

/* Collect the activation statistics onto init (n_layers x (2E + H*hd + F) floats, per layer attn | wo | ffn | down:
 * the caller's sums so far, uploaded, so that the device adds onto them in the CPU block's order), or stop (init
 * NULL). */
int qsc_stats_enable(qsc_model *m, const float *init, int64_t n, char *err, size_t err_len) {
    const int64_t len = m ? m->cfg.n_layers * probe_stats_per_layer(m->cfg) : 0;
    if (!m || (init && n != len)) {
        set_err(err, err_len, "no model, or %lld floats is not the statistics' size", (long long)n);
        return -1;
    }
    std::lock_guard<std::mutex> lock(m->mu);
    QscProbe *p = probe_get(m);
    if (!init) {
        p->stats = nullptr;
        return 0;
    }
    CUDA_TRY(cudaSetDevice(m->device));
    if (!p->sums) { /* allocated once, kept (among m->allocs) for the next enable */
        int rc = dalloc_t(m, &p->sums, len, err, err_len);
        if (rc) return rc;
        p->stats_len = len;
    }
    CUDA_TRY(cudaMemcpyAsync(p->sums, init, (size_t)len * sizeof(float), cudaMemcpyHostToDevice, m->st));
    CUDA_TRY(cudaStreamSynchronize(m->st));
    p->stats = p->sums;
    return 0;
}

/* Copy the device sums (the layout of qsc_stats_enable's init) into out. */
int qsc_stats_read(qsc_model *m, float *out, int64_t n, char *err, size_t err_len) {
    if (!m || !out) {
        set_err(err, err_len, "no model or output buffer");
        return -1;
    }
    std::lock_guard<std::mutex> lock(m->mu);
    if (!m->probe || !m->probe->stats || n != m->probe->stats_len) {
        set_err(err, err_len, "no statistics are collected, or %lld floats is not their size", (long long)n);
        return -1;
    }
    CUDA_TRY(cudaSetDevice(m->device));
    CUDA_TRY(cudaMemcpyAsync(out, m->probe->stats, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost, m->st));
    CUDA_TRY(cudaStreamSynchronize(m->st));
    return 0;
}

/* Logits (n_rows x n_vocab) of residual rows x (n_rows x E): the forward pass's final norm and output head, by its
 * own kernels (k_norm_quant, the int8 activations, k_matmul), mb rows at a time. */
int qsc_head(qsc_model *m, const float *x, int n_rows, float *logits, char *err, size_t err_len) {
    if (!m || !x || !logits || n_rows <= 0) {
        set_err(err, err_len, "no model, rows or logits buffer");
        return -1;
    }
    std::lock_guard<std::mutex> lock(m->mu);
    if (!m->finalized) {
        set_err(err, err_len, "model not finalized");
        return -1;
    }
    CUDA_TRY(cudaSetDevice(m->device));
    const Dims &c = m->cfg;
    const int E = c.E, V = c.V;
    const QW &wout = m->tied ? m->tok.w : m->out.w;
    int rc = ensure_logits_all(m, n_rows < m->mb ? n_rows : m->mb, err, err_len);
    if (rc) return rc;
    for (int start = 0; start < n_rows; start += m->mb) {
        const int T = n_rows - start < m->mb ? n_rows - start : m->mb;
        CUDA_TRY(cudaMemcpyAsync(m->x, x + (int64_t)start * E, (size_t)T * E * sizeof(float),
                                 cudaMemcpyHostToDevice, m->st));
        k_norm_quant<<<T, 256, 0, m->st>>>(m->x, ResidIn{}, m->out_norm, 1, m->h, act_out_for(m, {wout.type}), E,
                                           c.eps);
        MatJob lm = {&wout, act_view(m, wout.type, m->h, E, 0), m->d_logits_all, V, nullptr};
        launch_matmul(m->fast, &lm, 1, T, m->st);
        CUDA_TRY(cudaGetLastError());
        CUDA_TRY(cudaMemcpyAsync(logits + (int64_t)start * V, m->d_logits_all, (size_t)T * V * sizeof(float),
                                 cudaMemcpyDeviceToHost, m->st));
        CUDA_TRY(cudaStreamSynchronize(m->st));
    }
    return 0;
}

/* Rows 0..n_rows-1 of layer ``layer``'s K (which 0) or V (which 1) cache ([n_ctx][KV][hd], F16 or F32 as the
 * cache) into out (out_bytes must be their size). */
int qsc_read_cache(qsc_model *m, int layer, int which, int n_rows, void *out, int64_t out_bytes, char *err,
                   size_t err_len) {
    const bool ok = m && layer >= 0 && layer < m->cfg.n_layers;
    const int64_t row = ok ? (int64_t)m->layers[(size_t)layer].KV * m->layers[(size_t)layer].hd * (m->kv_f16 ? 2 : 4)
                           : 0;
    if (!ok || !out || (which != 0 && which != 1) || n_rows < 0 ||
        n_rows > m->n_ctx || out_bytes != n_rows * row) {
        set_err(err, err_len, "no model, or layer %d / cache %d / %d rows / %lld bytes out of range", layer, which,
                n_rows, (long long)out_bytes);
        return -1;
    }
    std::lock_guard<std::mutex> lock(m->mu);
    if (n_rows == 0) return 0;
    const uint8_t *src = (which ? m->v_cache : m->k_cache) + m->layers[(size_t)layer].kv_off;
    if (m->host) { /* a host model (qsc_host_model_create): its cache is host memory */
        memcpy(out, src, (size_t)out_bytes);
        return 0;
    }
    CUDA_TRY(cudaSetDevice(m->device));
    CUDA_TRY(cudaMemcpyAsync(out, src, (size_t)out_bytes, cudaMemcpyDeviceToHost, m->st));
    CUDA_TRY(cudaStreamSynchronize(m->st));
    return 0;
}

/* The statistics' sums of squares on the host, by the device's own per-column code (tests, no GPU needed). */
int qsc_host_probe_sumsq(float *acc, const float *x, int64_t T, int64_t n) {
    if (!acc || !x || T < 0 || n <= 0) return -1;
    for (int64_t j = 0; j < n; ++j) probe_sumsq_col(acc, x, T, n, j);
    return 0;
}

} /* extern "C" */
