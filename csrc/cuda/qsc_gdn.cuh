/* qwen35's gated delta-net layers on the CUDA backend (docs/engine.md, "Gated delta-net layers"; the CPU block:
 * csrc/qs_block.c's gdn_mixer / gdn_head, qs_nn.c's qs_gdn_step_scalar).
 *
 * The per-element and per-column math is written once as __host__ __device__ functions: the host build
 * (qsc_host.cu, qsc_host_gdn_mixer) runs the whole mixer with them on the CPU so tests/test_cuda_gdn.py can compare
 * it with qs_block_forward on machines without a GPU; the device kernels below call the same functions.
 *
 * The recurrence runs column by column: value index i of a head touches only column i of the head's [S key][S value]
 * state, and the CPU's scalar step visits each column's keys j in ascending order, so one device thread per column
 * looping over j computes exactly the CPU's sequence of fmaf's (the AVX2 step vectorizes over i with the same
 * order). Only the squared norms of q and k (summed in double by the CPU, by a tree on the device) and the conv's
 * products (which nvcc may contract into FMAs) differ in rounding on the device.
 *
 * Sections, each compiled once however often the file is included: 1. the shared math and gdn_check (always;
 * qsc_common.cuh includes it for check_model); QSC_GDN_HOST: the host entry point (included at the end of
 * qsc_host.cu, after HostQW / host_linear); QSC_GDN_KERNELS: the device kernels and the layer's device copy (in
 * qsc_device.cu before Layer); QSC_GDN_ENQUEUE: upload, scratch, the session's state and the mixer's launches (in
 * qsc_device.cu before enqueue_forward). */
#include "qsc_common.cuh" /* (which includes this file for part 1 where check_model needs it) */

#ifndef QSC_GDN_MATH
#define QSC_GDN_MATH

/* The largest state (key / value head size) the device kernels take: one thread per value index. */
#define QSC_GDN_MAX_S 1024

/* One conv output of one channel: the depthwise causal conv of the K inputs win[0], win[C], ... win[(K-1) C]
 * (oldest first) with the channel's kernel w[K], then SiLU. */
HD float gdn_conv_silu(const float *w, const float *win, int64_t C, int K) {
    float acc = 0.0f;
    for (int j = 0; j < K; ++j) acc += w[j] * win[(int64_t)j * C];
    return acc / (1.0f + expf(-acc));
}

/* The head's per-token gates: decay = exp(softplus(alpha + dt_bias) * a) (a = -exp(A_log)), beta = sigmoid. */
HD void gdn_gates(float alpha, float dt_bias, float a, float beta_raw, float *decay, float *beta) {
    const float x = alpha + dt_bias;
    const float sp = x > 20.0f ? x : log1pf(expf(x));
    *decay = expf(sp * a);
    *beta = 1.0f / (1.0f + expf(-beta_raw));
}

/* The L2 normalization factor of q (scale 1/sqrt(S)) or k (scale 1) from its squared norm. */
HD float gdn_inv_norm(double sumsq, float eps, float scale) { return scale / sqrtf((float)sumsq + eps); }

/* One token's update of column i of a [S key][S value] state st (row stride S) and the column's output: the
 * column decays, d = beta (v_i - st[:, i] . k), st[:, i] += k d, o_i = st[:, i] . q. k and q normalized. */
HD float gdn_column(int S, float *st, int i, const float *k, const float *q, float v_i, float decay, float beta) {
    float sk = 0.0f;
    for (int j = 0; j < S; ++j) {
        const float r = st[(int64_t)j * S + i] * decay;
        st[(int64_t)j * S + i] = r;
        sk = fmaf(k[j], r, sk);
    }
    const float d = (v_i - sk) * beta;
    float o = 0.0f;
    for (int j = 0; j < S; ++j) {
        const float r = fmaf(k[j], d, st[(int64_t)j * S + i]);
        st[(int64_t)j * S + i] = r;
        o = fmaf(q[j], r, o);
    }
    return o;
}

/* The output gate of one value: the head's RMSNorm (scale from its mean square, weight nw) times SiLU(z). */
HD float gdn_out_gate(float o, float scale, float nw, float z) { return o * scale * nw * (z / (1.0f + expf(-z))); }
HD float gdn_rms_scale(double sumsq, int S, float eps) { return (float)(1.0 / sqrt(sumsq / (double)S + (double)eps)); }

/* qwen35's gated attention outputs (its attention layers, attn.q_gate): wq's rows hold each head's query then its
 * gate, [T][H][2 hd]; value j of head h of token t goes to q (plus its bias) and to gate; after the attention each
 * output value is times sigmoid(its gate), in the CPU's form. */
HD void qgate_split(const float *qg, const float *bq, int64_t t, int H, int hd, int i, float *q, float *gate) {
    const int h = i / hd, j = i % hd;
    const int64_t QD = (int64_t)H * hd;
    const float *src = qg + t * 2 * QD + (int64_t)h * 2 * hd;
    q[t * QD + i] = bq ? src[j] + bq[i] : src[j];
    gate[t * QD + i] = src[hd + j];
}
HD float qgate_apply(float att, float gate) { return att / (1.0f + expf(-gate)); }

/* The group's sizes, checked against the description (host side; no device call). C: conv channels. */
struct GdnDims {
    int E, K, S, Hk, Hv;
    int64_t Kd, Vd, C;
};

static inline bool gdn_check(const qs_block &b, GdnDims *g, char *err, size_t err_len) {
    const qs_gdn_desc &G = b.gdn;
    const int64_t E = b.n_embd, K = G.conv, S = G.state, Hk = G.k_heads, Hv = G.v_heads;
    if (E <= 0 || K < 1 || K > 64 || S < 1 || S > QSC_GDN_MAX_S || Hk < 1 || Hv < 1 || Hv > 4096 || Hv % Hk) {
        set_err(err, err_len, "delta-net sizes conv %lld, state %lld, heads %lld / %lld invalid", (long long)K,
                (long long)S, (long long)Hk, (long long)Hv);
        return false;
    }
    const int64_t Kd = Hk * S, Vd = Hv * S, C = 2 * Kd + Vd;
    const struct { const char *name; const qs_weight *w; int64_t rows, k; } mats[] = {
        {"ssm qkv", &G.qkv, C, E}, {"ssm z", &G.z, Vd, E}, {"ssm beta", &G.beta, Hv, E},
        {"ssm alpha", &G.alpha, Hv, E}, {"ssm out", &G.out, E, Vd}};
    for (const auto &m : mats)
        if (!weight_ok(*m.w, m.rows, m.k)) {
            set_err(err, err_len, "%s is %lld x %lld of type %d, expected %lld x %lld of a GPU type", m.name,
                    (long long)m.w->rows, (long long)m.w->k, m.w->type, (long long)m.rows, (long long)m.k);
            return false;
        }
    const struct { const char *name; const qs_vec *v; int64_t n; } vecs[] = {
        {"ssm conv", &G.conv_w, C * K}, {"ssm dt_bias", &G.dt_bias, Hv}, {"ssm a", &G.a, Hv}, {"ssm norm", &G.norm, S}};
    for (const auto &v : vecs)
        if (!vec_ok(*v.v, v.n, true)) {
            set_err(err, err_len, "%s has %lld values, expected %lld", v.name, (long long)v.v->len, (long long)v.n);
            return false;
        }
    *g = {(int)E, (int)K, (int)S, (int)Hk, (int)Hv, Kd, Vd, C};
    return true;
}

#endif /* QSC_GDN_MATH */

#if defined(QSC_GDN_HOST) && !defined(QSC_GDN_HOST_DONE)
#define QSC_GDN_HOST_DONE
/* The mixer on the host with the shared math, as gdn_mixer runs it: h [T][E] -> out [T][E]; the description's
 * conv_state / ssm_state updated in place (their lengths checked). */
extern "C" int qsc_host_gdn_mixer(const qs_block *b, const float *h, int n_tokens, float *out, char *err,
                                  size_t err_len) {
    GdnDims g;
    if (!b || !h || !out || n_tokens <= 0) {
        set_err(err, err_len, "no block, input or output, or no tokens");
        return -1;
    }
    if (!gdn_check(*b, &g, err, err_len)) return -1;
    const qs_gdn_desc &G = b->gdn;
    const int T = n_tokens, K = g.K, S = g.S, Hk = g.Hk, Hv = g.Hv;
    const int64_t Kd = g.Kd, Vd = g.Vd, C = g.C;
    if ((K > 1 && !G.conv_state) || G.conv_state_len != (K - 1) * C || !G.ssm_state ||
        G.ssm_state_len != (int64_t)Hv * S * S) {
        set_err(err, err_len, "the delta-net state buffers have the wrong lengths");
        return -1;
    }
    HostQW wqkv(G.qkv.type, G.qkv.ptr, C, g.E), wz(G.z.type, G.z.ptr, Vd, g.E),
        wb(G.beta.type, G.beta.ptr, Hv, g.E), wa(G.alpha.type, G.alpha.ptr, Hv, g.E), wo(G.out.type, G.out.ptr, g.E, Vd);
    if (!wqkv.ok || !wz.ok || !wb.ok || !wa.ok || !wo.ok) {
        set_err(err, err_len, "repack failed");
        return -1;
    }
    std::vector<float> win((size_t)((K - 1 + T) * C)), qkv((size_t)(T * C)), z((size_t)(T * Vd)), o((size_t)(T * Vd));
    std::vector<float> beta((size_t)T * Hv), alpha((size_t)T * Hv), qn((size_t)S), kn((size_t)S);
    float *raw = win.data() + (K - 1) * C;
    if (!host_linear(wqkv.w, h, T, nullptr, raw) || !host_linear(wz.w, h, T, nullptr, z.data()) ||
        !host_linear(wb.w, h, T, nullptr, beta.data()) || !host_linear(wa.w, h, T, nullptr, alpha.data())) {
        set_err(err, err_len, "projection failed");
        return -1;
    }
    if (K > 1) memcpy(win.data(), G.conv_state, (size_t)((K - 1) * C) * sizeof(float));
    for (int t = 0; t < T; ++t)
        for (int64_t ch = 0; ch < C; ++ch)
            qkv[(size_t)(t * C + ch)] = gdn_conv_silu(G.conv_w.ptr + ch * K, win.data() + t * C + ch, C, K);
    if (K > 1) memcpy(G.conv_state, win.data() + T * C, (size_t)((K - 1) * C) * sizeof(float));
    const float qscale = 1.0f / sqrtf((float)S);
    for (int hh = 0; hh < Hv; ++hh) {
        float *st = G.ssm_state + (int64_t)hh * S * S;
        const int kh = hh % Hk;
        for (int t = 0; t < T; ++t) {
            const float *row = qkv.data() + t * C, *q = row + kh * S, *k = row + Kd + kh * S, *v = row + 2 * Kd + hh * S;
            double sq = 0.0, sk = 0.0;
            for (int j = 0; j < S; ++j) {
                sq += (double)q[j] * q[j];
                sk += (double)k[j] * k[j];
            }
            const float iq = gdn_inv_norm(sq, b->eps, qscale), ik = gdn_inv_norm(sk, b->eps, 1.0f);
            for (int j = 0; j < S; ++j) {
                qn[(size_t)j] = q[j] * iq;
                kn[(size_t)j] = k[j] * ik;
            }
            float decay, bt;
            gdn_gates(alpha[(size_t)(t * Hv + hh)], G.dt_bias.ptr[hh], G.a.ptr[hh], beta[(size_t)(t * Hv + hh)], &decay,
                      &bt);
            float *ot = o.data() + t * Vd + (int64_t)hh * S;
            for (int i = 0; i < S; ++i) ot[i] = gdn_column(S, st, i, kn.data(), qn.data(), v[i], decay, bt);
        }
    }
    for (int64_t r = 0; r < (int64_t)T * Hv; ++r) {
        float *orow = o.data() + r * S;
        const float *zr = z.data() + r * S;
        double ss = 0.0;
        for (int i = 0; i < S; ++i) ss += (double)orow[i] * orow[i];
        const float sc = gdn_rms_scale(ss, S, b->eps);
        for (int i = 0; i < S; ++i) orow[i] = gdn_out_gate(orow[i], sc, G.norm.ptr[i], zr[i]);
    }
    if (!host_linear(wo.w, o.data(), T, nullptr, out)) {
        set_err(err, err_len, "output projection failed");
        return -1;
    }
    return 0;
}

/* The gated attention's split and gate on the host: qg [T][H][2 hd] -> q [T][H hd], and out = att * sigmoid(gate). */
extern "C" int qsc_host_qgate(const float *qg, const float *bq, const float *att, int n_tokens, int n_head,
                              int head_dim, float *q, float *out) {
    if (!qg || !att || !q || !out || n_tokens <= 0 || n_head <= 0 || head_dim <= 0 || head_dim > 1024) return -1;
    const int64_t QD = (int64_t)n_head * head_dim;
    std::vector<float> gate((size_t)(n_tokens * QD));
    for (int t = 0; t < n_tokens; ++t)
        for (int i = 0; i < QD; ++i) qgate_split(qg, bq, t, n_head, head_dim, i, q, gate.data());
    for (int64_t i = 0; i < n_tokens * QD; ++i) out[i] = qgate_apply(att[i], gate[(size_t)i]);
    return 0;
}
#endif /* QSC_GDN_HOST */

#if defined(QSC_GDN_KERNELS) && !defined(QSC_GDN_KERNELS_DONE)
#define QSC_GDN_KERNELS_DONE
/* The conv over [conv_state (K - 1 rows); raw (T rows)] of C channels, then SiLU: out [T][C]. One thread per
 * (token, channel); the window's rows are read where they live. */
__global__ void k_gdn_conv(const float *__restrict__ raw, const float *__restrict__ cstate,
                           const float *__restrict__ w, float *__restrict__ out, int T, int64_t C, int K) {
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)T * C) return;
    const int t = (int)(idx / C);
    const int64_t ch = idx % C;
    float win[64];
    for (int j = 0; j < K; ++j) {
        const int r = t + j; /* row of the window */
        win[j] = r < K - 1 ? cstate[(int64_t)r * C + ch] : raw[(int64_t)(r - (K - 1)) * C + ch];
    }
    out[idx] = gdn_conv_silu(w + ch * K, win, 1, K);
}

/* The conv state keeps the window's last K - 1 rows (one thread per channel, rows ascending: a row moves only
 * towards the front, so it is read before it is overwritten). */
__global__ void k_gdn_conv_state(const float *__restrict__ raw, float *__restrict__ cstate, int T, int64_t C, int K) {
    const int64_t ch = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= C) return;
    for (int r = 0; r < K - 1; ++r) {
        const int s = T + r;
        cstate[(int64_t)r * C + ch] = s < K - 1 ? cstate[(int64_t)s * C + ch] : raw[(int64_t)(s - (K - 1)) * C + ch];
    }
}

/* The gated attention: qg -> q, gate (one block per token), and att *= sigmoid(gate) then quantized for wo. */
__global__ void __launch_bounds__(256) k_qgate_split(const float *__restrict__ qg, const float *__restrict__ bq,
                                                     float *__restrict__ q, float *__restrict__ gate, int H, int hd) {
    for (int i = threadIdx.x; i < H * hd; i += blockDim.x) qgate_split(qg, bq, blockIdx.x, H, hd, i, q, gate);
}
__global__ void __launch_bounds__(256) k_qgate_quant(float *__restrict__ att, const float *__restrict__ gate,
                                                     const ActOut ao, int n) {
    const int64_t row = blockIdx.x;
    for (int i = threadIdx.x; i < n; i += blockDim.x) att[row * n + i] = qgate_apply(att[row * n + i], gate[row * n + i]);
    __syncthreads();
    if (ao.qs32 || ao.qs256) block_quantize_row(att + row * n, n, ao, row);
}

/* Block-wide sum of one value per thread (blockDim a multiple of 32, at most 1024). */
__device__ __forceinline__ float gdn_block_sum(float v, float *red) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0) red[wid] = v;
    __syncthreads();
    float s = 0.0f;
    for (int i = 0; i < nw; ++i) s += red[i];
    return s;
}

/* One value head per block, one thread per value index (blockDim = S rounded up to 32): the call's tokens in
 * order, the head's state [S][S] updated in place, then the RMSNorm x SiLU(z) gate into o [T][Vd]. */
__global__ void k_gdn_recur(const float *__restrict__ qkv, const float *__restrict__ beta_raw,
                            const float *__restrict__ alpha, const float *__restrict__ z,
                            const float *__restrict__ dt_bias, const float *__restrict__ a,
                            const float *__restrict__ nw, float *__restrict__ ssm, float *__restrict__ o, int T,
                            int S, int Hk, int Hv, float eps) {
    extern __shared__ float sh[]; /* qn[S], kn[S], red[32] */
    float *qn = sh, *kn = sh + S, *red = sh + 2 * S;
    const int hh = blockIdx.x, kh = hh % Hk, i = threadIdx.x;
    const int64_t Kd = (int64_t)Hk * S, Vd = (int64_t)Hv * S, C = 2 * Kd + Vd;
    float *st = ssm + (int64_t)hh * S * S;
    const float qscale = 1.0f / sqrtf((float)S);
    for (int t = 0; t < T; ++t) {
        const float *row = qkv + t * C;
        const float qv = i < S ? row[kh * S + i] : 0.0f, kv = i < S ? row[Kd + kh * S + i] : 0.0f;
        const float sq = gdn_block_sum(qv * qv, red), sk = gdn_block_sum(kv * kv, red);
        if (i < S) {
            qn[i] = qv * gdn_inv_norm(sq, eps, qscale);
            kn[i] = kv * gdn_inv_norm(sk, eps, 1.0f);
        }
        __syncthreads();
        float decay, bt;
        gdn_gates(alpha[t * Hv + hh], dt_bias[hh], a[hh], beta_raw[t * Hv + hh], &decay, &bt);
        const float ov = i < S ? gdn_column(S, st, i, kn, qn, row[2 * Kd + (int64_t)hh * S + i], decay, bt) : 0.0f;
        const float ss = gdn_block_sum(ov * ov, red);
        if (i < S) {
            const int64_t at = t * Vd + (int64_t)hh * S + i;
            o[at] = gdn_out_gate(ov, gdn_rms_scale(ss, S, eps), nw[i], z[at]);
        }
        __syncthreads(); /* qn / kn are rewritten by the next token */
    }
}

/* The device's copy of one layer's delta-net group; state buffers are the session's (GdnState). */
struct GdnLayer {
    GdnDims g = {};
    DevMat qkv, z, beta, alpha, out;
    float *conv_w = nullptr, *dt_bias = nullptr, *a = nullptr, *norm = nullptr;
    float *conv_state = nullptr, *ssm_state = nullptr; /* [K - 1][C], [Hv][S][S] */
    int q_gate = 0; /* an attention layer with gated outputs (qwen35) */
};

/* The mixer of T tokens: h (normed, quantized for the projections by the caller into m's act buffers) -> out
 * [T][E]. Scratch: raw [T][C], conv [T][C], z / o [T][Vd], beta / alpha [T][Hv] (gdn_finalize sizes them). */
struct GdnScratch {
    float *raw = nullptr, *conv = nullptr, *z = nullptr, *o = nullptr, *beta = nullptr, *alpha = nullptr;
};

static void launch_gdn_core(const GdnLayer &L, const GdnScratch &s, int T, float eps, cudaStream_t st) {
    const GdnDims &g = L.g;
    const int64_t n = (int64_t)T * g.C;
    k_gdn_conv<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(s.raw, L.conv_state, L.conv_w, s.conv, T, g.C, g.K);
    if (g.K > 1) k_gdn_conv_state<<<(unsigned)((g.C + 255) / 256), 256, 0, st>>>(s.raw, L.conv_state, T, g.C, g.K);
    const int threads = (g.S + 31) / 32 * 32;
    const size_t shm = (size_t)(2 * g.S + 32) * sizeof(float);
    k_gdn_recur<<<g.Hv, threads, shm, st>>>(s.conv, s.beta, s.alpha, s.z, L.dt_bias, L.a, L.norm, L.ssm_state, s.o, T,
                                            g.S, g.Hk, g.Hv, eps);
}

/* The model's delta-net part: the scratch (sized for mb tokens and the largest group), the session's state of
 * every delta-net layer in one buffer (each layer's conv state then ssm state) and one checkpoint copy of it. */
struct GdnModel {
    GdnScratch s;
    float *state = nullptr, *ckpt = nullptr;
    int64_t n = 0; /* floats in state (0: no delta-net layer) */
    int64_t max_c = 0, max_vd = 0, max_hv = 0;
    float *qg = nullptr, *gate = nullptr; /* gated attention: wq's output [mb][2 QD], the gates [mb][QD] */
};
#endif /* QSC_GDN_KERNELS */

#if defined(QSC_GDN_ENQUEUE) && !defined(QSC_GDN_ENQUEUE_DONE)
#define QSC_GDN_ENQUEUE_DONE
/* The widest activation the delta-net layers quantize (the ssm_out input), for the int8 buffers. */
static int64_t gdn_kmax(const qsc_model *m) {
    int64_t k = 0;
    for (const Layer &L : m->layers) k = L.gdn.g.Vd > k ? L.gdn.g.Vd : k;
    return k;
}

/* The scratch and the state (zeros: a new sequence) of every delta-net layer of m (nothing without one). */
static int gdn_finalize(qsc_model *m, char *err, size_t err_len) {
    GdnModel &G = m->gdn;
    for (const Layer &L : m->layers) {
        const GdnDims &g = L.gdn.g;
        if (!g.K) continue;
        G.n += (int64_t)(g.K - 1) * g.C + (int64_t)g.Hv * g.S * g.S;
        G.max_c = g.C > G.max_c ? g.C : G.max_c;
        G.max_vd = g.Vd > G.max_vd ? g.Vd : G.max_vd;
        G.max_hv = g.Hv > G.max_hv ? g.Hv : G.max_hv;
    }
    const int64_t T = m->mb, QD = (int64_t)m->cfg.H * m->cfg.hd;
    int rc = 0;
    for (const Layer &L : m->layers)
        if (L.gdn.q_gate) {
            rc = rc ? rc : dalloc_t(m, &G.qg, T * 2 * QD, err, err_len);
            rc = rc ? rc : dalloc_t(m, &G.gate, T * QD, err, err_len);
            break;
        }
    if (rc || !G.n) return rc;
    rc = rc ? rc : dalloc_t(m, &G.state, G.n, err, err_len);
    rc = rc ? rc : dalloc_t(m, &G.ckpt, G.n, err, err_len);
    rc = rc ? rc : dalloc_t(m, &G.s.raw, T * G.max_c, err, err_len);
    rc = rc ? rc : dalloc_t(m, &G.s.conv, T * G.max_c, err, err_len);
    rc = rc ? rc : dalloc_t(m, &G.s.z, T * G.max_vd, err, err_len);
    rc = rc ? rc : dalloc_t(m, &G.s.o, T * G.max_vd, err, err_len);
    rc = rc ? rc : dalloc_t(m, &G.s.beta, T * G.max_hv, err, err_len);
    rc = rc ? rc : dalloc_t(m, &G.s.alpha, T * G.max_hv, err, err_len);
    if (rc) return rc;
    CUDA_TRY(cudaMemset(G.state, 0, (size_t)G.n * sizeof(float)));
    CUDA_TRY(cudaMemset(G.ckpt, 0, (size_t)G.n * sizeof(float)));
    float *p = G.state;
    for (Layer &L : m->layers) {
        const GdnDims &g = L.gdn.g;
        if (!g.K) continue;
        L.gdn.conv_state = p;
        p += (int64_t)(g.K - 1) * g.C;
        L.gdn.ssm_state = p;
        p += (int64_t)g.Hv * g.S * g.S;
    }
    return 0;
}

/* The delta-net mixer of layer L on m->h (normed and quantized for its projections) into m->o. */
static void enqueue_gdn(qsc_model *m, const Layer &L, int T) {
    const GdnLayer &G = L.gdn;
    const GdnDims &g = G.g;
    const GdnScratch &s = m->gdn.s;
    const int E = m->cfg.E;
    cudaStream_t st = m->st;
    MatJob pz[2] = {{&G.qkv.w, act_view(m, G.qkv.w.type, m->h, E, 0), s.raw, g.C, nullptr},
                    {&G.z.w, act_view(m, G.z.w.type, m->h, E, 0), s.z, g.Vd, nullptr}};
    launch_matmul(pz, 2, T, st);
    MatJob ba[2] = {{&G.beta.w, act_view(m, G.beta.w.type, m->h, E, 0), s.beta, g.Hv, nullptr},
                    {&G.alpha.w, act_view(m, G.alpha.w.type, m->h, E, 0), s.alpha, g.Hv, nullptr}};
    launch_matmul(ba, 2, T, st);
    launch_gdn_core(G, s, T, m->cfg.eps, st);
    const ActOut ao = act_out_for(m, {G.out.w.type});
    if (ao.qs32 || ao.qs256) k_quantize<<<T, 256, 0, st>>>(s.o, ao, (int)g.Vd);
    MatJob ob = {&G.out.w, act_view(m, G.out.w.type, s.o, g.Vd, 0), m->o, E, nullptr};
    launch_matmul(&ob, 1, T, st);
}
#endif /* QSC_GDN_ENQUEUE */

#if defined(QSC_GDN_UPLOAD) && !defined(QSC_GDN_UPLOAD_DONE)
#define QSC_GDN_UPLOAD_DONE
/* Layer li's delta-net group onto the device (check_model has checked it). */
static int gdn_upload(qsc_model *m, const qs_block &b, Layer &L, int li, char *err, size_t err_len) {
    GdnLayer &G = L.gdn;
    if (!gdn_check(b, &G.g, err, err_len)) return -1;
    char what[64];
    const struct { const char *name; const qs_weight *w; DevMat *dm; } mats[] = {
        {"ssm qkv", &b.gdn.qkv, &G.qkv}, {"ssm z", &b.gdn.z, &G.z}, {"ssm beta", &b.gdn.beta, &G.beta},
        {"ssm alpha", &b.gdn.alpha, &G.alpha}, {"ssm out", &b.gdn.out, &G.out}};
    for (const auto &x : mats) {
        snprintf(what, sizeof what, "layer %d: %s", li, x.name);
        int rc = upload_matrix(m, *x.w, x.dm, what, err, err_len);
        if (rc) return rc;
    }
    const struct { const qs_vec *v; float **dst; } vecs[] = {
        {&b.gdn.conv_w, &G.conv_w}, {&b.gdn.dt_bias, &G.dt_bias}, {&b.gdn.a, &G.a}, {&b.gdn.norm, &G.norm}};
    for (const auto &x : vecs) {
        int rc = upload_vector(m, *x.v, x.dst, err, err_len);
        if (rc) return rc;
    }
    return 0;
}
#endif /* QSC_GDN_UPLOAD */

