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
 * Sections, each compiled once however often the file is included: 1. the shared math, GdnArgs and gdn_check
 * (always; qsc_common.cuh includes it for check_model); QSC_GDN_HOST: the host twins of the kernels (emu_gdn_core,
 * emu_qgate_*: a host model's forward runs them, qsc_emul.cuh) and the test entry points (included at the end of
 * qsc_host.cu, after HostQW / host_linear); QSC_GDN_KERNELS: the device kernels and the layer's device copy (in
 * qsc_device.cu before Layer); QSC_GDN_ENQUEUE: scratch, the session's state and the mixer's steps (before
 * enqueue_forward); QSC_GDN_UPLOAD: gdn_upload (before upload_model). */
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

/* One delta-net layer's call, as the kernels and their host twins read it: the projections raw [T][C] (before
 * the conv), beta / alpha [T][Hv], z [T][Vd]; conv [T][C] the conv's output, o [T][Vd] the gated output; the
 * state conv_state [K - 1][C], ssm [Hv][S][S], updated in place. */
struct GdnArgs {
    const float *raw, *beta, *alpha, *z, *conv_w, *dt_bias, *a, *norm;
    float *conv, *conv_state, *ssm, *o;
    int K, S, Hk, Hv;
    int64_t C;
    float eps;
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
/* The host twin of k_gdn_conv + k_gdn_conv_state + k_gdn_recur: the squared norms summed in double, as the CPU. */
void emu_gdn_core(const GdnArgs &A, int T) {
    const int K = A.K, S = A.S, Hk = A.Hk, Hv = A.Hv;
    const int64_t C = A.C, Kd = (int64_t)Hk * S, Vd = (int64_t)Hv * S;
    std::vector<float> win((size_t)K);
    for (int t = 0; t < T; ++t)
        for (int64_t ch = 0; ch < C; ++ch) {
            for (int j = 0; j < K; ++j) {
                const int r = t + j;
                win[(size_t)j] = r < K - 1 ? A.conv_state[(int64_t)r * C + ch] : A.raw[(int64_t)(r - (K - 1)) * C + ch];
            }
            A.conv[(int64_t)t * C + ch] = gdn_conv_silu(A.conv_w + ch * K, win.data(), 1, K);
        }
    for (int64_t ch = 0; ch < C; ++ch) /* the state keeps the window's last K - 1 rows */
        for (int r = 0; r < K - 1; ++r) {
            const int s2 = T + r;
            A.conv_state[(int64_t)r * C + ch] =
                s2 < K - 1 ? A.conv_state[(int64_t)s2 * C + ch] : A.raw[(int64_t)(s2 - (K - 1)) * C + ch];
        }
    std::vector<float> qn((size_t)S), kn((size_t)S), ov((size_t)S);
    const float qscale = 1.0f / sqrtf((float)S);
    for (int hh = 0; hh < Hv; ++hh) {
        float *st = A.ssm + (int64_t)hh * S * S;
        const int kh = hh % Hk;
        for (int t = 0; t < T; ++t) {
            const float *row = A.conv + (int64_t)t * C, *q = row + kh * S, *k = row + Kd + kh * S;
            const float *v = row + 2 * Kd + (int64_t)hh * S;
            double sq = 0.0, sk = 0.0;
            for (int j = 0; j < S; ++j) {
                sq += (double)q[j] * q[j];
                sk += (double)k[j] * k[j];
            }
            const float iq = gdn_inv_norm(sq, A.eps, qscale), ik = gdn_inv_norm(sk, A.eps, 1.0f);
            for (int j = 0; j < S; ++j) {
                qn[(size_t)j] = q[j] * iq;
                kn[(size_t)j] = k[j] * ik;
            }
            float decay, bt;
            gdn_gates(A.alpha[t * Hv + hh], A.dt_bias[hh], A.a[hh], A.beta[t * Hv + hh], &decay, &bt);
            double ss = 0.0;
            for (int i = 0; i < S; ++i) {
                ov[(size_t)i] = gdn_column(S, st, i, kn.data(), qn.data(), v[i], decay, bt);
                ss += (double)ov[(size_t)i] * ov[(size_t)i];
            }
            const float sc = gdn_rms_scale(ss, S, A.eps);
            const int64_t at = (int64_t)t * Vd + (int64_t)hh * S;
            for (int i = 0; i < S; ++i) A.o[at + i] = gdn_out_gate(ov[(size_t)i], sc, A.norm[i], A.z[at + i]);
        }
    }
}

/* The host twins of k_qgate_split and k_qgate_quant. */
void emu_qgate_split(const float *qg, const float *bq, float *q, float *gate, int T, int H, int hd) {
    for (int t = 0; t < T; ++t)
        for (int i = 0; i < H * hd; ++i) qgate_split(qg, bq, t, H, hd, i, q, gate);
}
void emu_qgate_quant(float *att, const float *gate, const ActOut &ao, int T, int n) {
    for (int64_t i = 0; i < (int64_t)T * n; ++i) att[i] = qgate_apply(att[i], gate[i]);
    emu_quantize(att, ao, T, n);
}

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
    const int T = n_tokens, K = g.K, S = g.S, Hv = g.Hv;
    const int64_t Vd = g.Vd, C = g.C;
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
    std::vector<float> raw((size_t)(T * C)), conv((size_t)(T * C)), z((size_t)(T * Vd)), o((size_t)(T * Vd));
    std::vector<float> beta((size_t)T * Hv), alpha((size_t)T * Hv), none(1);
    if (!host_linear(wqkv.w, h, T, nullptr, raw.data()) || !host_linear(wz.w, h, T, nullptr, z.data()) ||
        !host_linear(wb.w, h, T, nullptr, beta.data()) || !host_linear(wa.w, h, T, nullptr, alpha.data())) {
        set_err(err, err_len, "projection failed");
        return -1;
    }
    const GdnArgs A = {raw.data(), beta.data(), alpha.data(), z.data(), G.conv_w.ptr, G.dt_bias.ptr, G.a.ptr,
                       G.norm.ptr, conv.data(), K > 1 ? G.conv_state : none.data(), G.ssm_state, o.data(),
                       K, S, g.Hk, Hv, C, b->eps};
    emu_gdn_core(A, T);
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
    emu_qgate_split(qg, bq, q, gate.data(), n_tokens, n_head, head_dim);
    memcpy(out, att, (size_t)(n_tokens * QD) * sizeof(float));
    emu_qgate_quant(out, gate.data(), ActOut{}, n_tokens, (int)QD);
    return 0;
}
#endif /* QSC_GDN_HOST */

#if defined(QSC_GDN_KERNELS) && !defined(QSC_GDN_KERNELS_DONE)
#define QSC_GDN_KERNELS_DONE
/* The conv over [conv_state (K - 1 rows); raw (T rows)] of C channels, then SiLU: conv [T][C]. One thread per
 * (token, channel); the window's rows are read where they live. */
__global__ void k_gdn_conv(const GdnArgs A, int T) {
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)T * A.C) return;
    const int t = (int)(idx / A.C), K = A.K;
    const int64_t ch = idx % A.C;
    float win[64];
    for (int j = 0; j < K; ++j) {
        const int r = t + j; /* row of the window */
        win[j] = r < K - 1 ? A.conv_state[(int64_t)r * A.C + ch] : A.raw[(int64_t)(r - (K - 1)) * A.C + ch];
    }
    A.conv[idx] = gdn_conv_silu(A.conv_w + ch * K, win, 1, K);
}

/* The conv state keeps the window's last K - 1 rows (one thread per channel, rows ascending: a row moves only
 * towards the front, so it is read before it is overwritten). */
__global__ void k_gdn_conv_state(const GdnArgs A, int T) {
    const int64_t ch = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= A.C) return;
    for (int r = 0; r < A.K - 1; ++r) {
        const int s = T + r;
        A.conv_state[(int64_t)r * A.C + ch] =
            s < A.K - 1 ? A.conv_state[(int64_t)s * A.C + ch] : A.raw[(int64_t)(s - (A.K - 1)) * A.C + ch];
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
__global__ void k_gdn_recur(const GdnArgs A, int T) {
    extern __shared__ float sh[]; /* qn[S], kn[S], red[32] */
    const int S = A.S, Hk = A.Hk, Hv = A.Hv;
    float *qn = sh, *kn = sh + S, *red = sh + 2 * S;
    const int hh = blockIdx.x, kh = hh % Hk, i = threadIdx.x;
    const int64_t Kd = (int64_t)Hk * S, Vd = (int64_t)Hv * S, C = A.C;
    float *st = A.ssm + (int64_t)hh * S * S;
    const float qscale = 1.0f / sqrtf((float)S);
    for (int t = 0; t < T; ++t) {
        const float *row = A.conv + t * C;
        const float qv = i < S ? row[kh * S + i] : 0.0f, kv = i < S ? row[Kd + kh * S + i] : 0.0f;
        const float sq = gdn_block_sum(qv * qv, red), sk = gdn_block_sum(kv * kv, red);
        if (i < S) {
            qn[i] = qv * gdn_inv_norm(sq, A.eps, qscale);
            kn[i] = kv * gdn_inv_norm(sk, A.eps, 1.0f);
        }
        __syncthreads();
        float decay, bt;
        gdn_gates(A.alpha[t * Hv + hh], A.dt_bias[hh], A.a[hh], A.beta[t * Hv + hh], &decay, &bt);
        const float ov = i < S ? gdn_column(S, st, i, kn, qn, row[2 * Kd + (int64_t)hh * S + i], decay, bt) : 0.0f;
        const float ss = gdn_block_sum(ov * ov, red);
        if (i < S) {
            const int64_t at = t * Vd + (int64_t)hh * S + i;
            A.o[at] = gdn_out_gate(ov, gdn_rms_scale(ss, S, A.eps), A.norm[i], A.z[at]);
        }
        __syncthreads(); /* qn / kn are rewritten by the next token */
    }
}

/* The device's copy of one layer's delta-net group (g.K 0: none); its state lies in the model's GdnModel. */
struct GdnLayer {
    GdnDims g = {};
    DevMat qkv, z, beta, alpha, out;
    float *conv_w = nullptr, *dt_bias = nullptr, *a = nullptr, *norm = nullptr;
    float *conv_state = nullptr, *ssm_state = nullptr; /* [K - 1][C], [Hv][S][S] */
    int q_gate = 0; /* an attention layer with gated outputs (qwen35) */
};

/* The model's delta-net part: the scratch (sized for mb tokens and the largest group), the session's state of
 * every delta-net layer in one buffer (each layer's conv state then ssm state) and one checkpoint copy of it. */
struct GdnModel {
    float *raw = nullptr, *conv = nullptr, *z = nullptr, *o = nullptr, *beta = nullptr, *alpha = nullptr;
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

/* The gated attention's scratch, the delta-net scratch and the state (zeros: a new sequence) of m (nothing
 * without such layers). */
static int gdn_finalize(qsc_model *m, char *err, size_t err_len) {
    GdnModel &G = m->gdn;
    bool q_gate = false;
    for (const Layer &L : m->layers) {
        const GdnDims &g = L.gdn.g;
        q_gate |= L.gdn.q_gate != 0;
        if (!g.K) continue;
        G.n += (int64_t)(g.K - 1) * g.C + (int64_t)g.Hv * g.S * g.S;
        G.max_c = g.C > G.max_c ? g.C : G.max_c;
        G.max_vd = g.Vd > G.max_vd ? g.Vd : G.max_vd;
        G.max_hv = g.Hv > G.max_hv ? g.Hv : G.max_hv;
    }
    const int64_t T = m->mb, QD = m->cfg.max_qd;
    int rc = 0;
    if (q_gate) {
        rc = rc ? rc : dalloc_t(m, &G.qg, T * 2 * QD, err, err_len);
        rc = rc ? rc : dalloc_t(m, &G.gate, T * QD, err, err_len);
    }
    if (rc || !G.n) return rc;
    rc = rc ? rc : dalloc_t(m, &G.state, G.n, err, err_len);
    rc = rc ? rc : dalloc_t(m, &G.ckpt, G.n, err, err_len);
    rc = rc ? rc : dalloc_t(m, &G.raw, T * G.max_c, err, err_len);
    rc = rc ? rc : dalloc_t(m, &G.conv, T * G.max_c, err, err_len);
    rc = rc ? rc : dalloc_t(m, &G.z, T * G.max_vd, err, err_len);
    rc = rc ? rc : dalloc_t(m, &G.o, T * G.max_vd, err, err_len);
    rc = rc ? rc : dalloc_t(m, &G.beta, T * G.max_hv, err, err_len);
    rc = rc ? rc : dalloc_t(m, &G.alpha, T * G.max_hv, err, err_len);
    if (rc) return rc;
    if (!m->host) { /* a host model's buffers are calloc'ed */
        CUDA_TRY(cudaMemset(G.state, 0, (size_t)G.n * sizeof(float)));
        CUDA_TRY(cudaMemset(G.ckpt, 0, (size_t)G.n * sizeof(float)));
    }
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

/* The session's recurrent state: 0 zero it, 1 save it as the checkpoint, 2 restore the checkpoint (enqueued on
 * the model's stream; a host model at once). */
static int gdn_state_op(qsc_model *m, int op, char *err, size_t err_len) {
    const GdnModel &G = m->gdn;
    if (!G.n) return 0;
    const size_t bytes = (size_t)G.n * sizeof(float);
    float *dst = op == 1 ? G.ckpt : G.state;
    const float *src = op == 1 ? G.state : G.ckpt;
    if (m->host) {
        if (op == 0) memset(G.state, 0, bytes);
        else memcpy(dst, src, bytes);
        return 0;
    }
    if (op == 0) CUDA_TRY(cudaMemsetAsync(G.state, 0, bytes, m->st));
    else CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, m->st));
    return 0;
}

/* The delta-net mixer of layer L on m->h (normed and quantized for its projections) into m->o, launched through
 * the model's table (the kernels or their host twins). */
static void enqueue_gdn(qsc_model *m, const Layer &L, int T) {
    const GdnLayer &G = L.gdn;
    const GdnDims &g = G.g;
    const GdnModel &s = m->gdn;
    const int E = m->cfg.E;
    MatJob pz[2] = {{&G.qkv.w, act_view(m, G.qkv.w.type, m->h, E, 0), s.raw, g.C, nullptr},
                    {&G.z.w, act_view(m, G.z.w.type, m->h, E, 0), s.z, g.Vd, nullptr}};
    m->ops->matmul(m, pz, 2, T);
    MatJob ba[2] = {{&G.beta.w, act_view(m, G.beta.w.type, m->h, E, 0), s.beta, g.Hv, nullptr},
                    {&G.alpha.w, act_view(m, G.alpha.w.type, m->h, E, 0), s.alpha, g.Hv, nullptr}};
    m->ops->matmul(m, ba, 2, T);
    const GdnArgs A = {s.raw, s.beta, s.alpha, s.z, G.conv_w, G.dt_bias, G.a, G.norm, s.conv, G.conv_state,
                       G.ssm_state, s.o, g.K, g.S, g.Hk, g.Hv, g.C, L.eps};
    m->ops->gdn_core(m, A, T, act_out_for(m, {G.out.w.type}), (int)g.Vd);
    MatJob ob = {&G.out.w, act_view(m, G.out.w.type, s.o, g.Vd, 0), m->o, E, nullptr};
    m->ops->matmul(m, &ob, 1, T);
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

