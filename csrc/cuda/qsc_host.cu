/* Host side of the CUDA backend that needs no GPU: weight repacking, the config's per-layer choices, and the
 * device's per-block math (qsc_common.cuh) run on the CPU, so machines without a GPU can test the layouts, the
 * decode of every block format and the int8 dot scheme against the CPU kernels. */
#include <stdlib.h>

#include <vector>

#include "qsc_common.cuh"

/* Q4_K / Q5_K 6-bit scale and min of sub-block j from the 12 packed bytes (get_scale_min_k4). */
static void k4_scale_min(const uint8_t *s, int j, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
        *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

int repack_host(int type, const uint8_t *src, int64_t rows, int64_t k, uint8_t *dst, int64_t dst_bytes) {
    PackedLayout L;
    if (!packed_layout(type, rows, k, &L)) return -1;
    if (dst_bytes < L.total) return -2;
    memset(dst, 0, (size_t)L.total);
    const TypeDesc &t = type_desc(type);
    const int64_t nblocks = rows * (k / t.qk);
    for (int sec = 0; sec < 4; ++sec) {
        if (!t.field[sec] || t.src[sec] < 0) continue;
        uint8_t *out = dst + L.off[sec];
        if (t.field[sec] == t.raw_bytes) { /* the whole block (F32 / F16): the rows as stored */
            memcpy(out, src, (size_t)(nblocks * t.raw_bytes));
            continue;
        }
        for (int64_t b = 0; b < nblocks; ++b)
            memcpy(out + b * t.field[sec], src + b * t.raw_bytes + t.src[sec], (size_t)t.field[sec]);
    }
    if (t.k4_scales) { /* Q4_K: 8 scales then 8 mins, the 6-bit fields unpacked to bytes */
        uint8_t *sc = dst + L.off[SEC_SC];
        for (int64_t b = 0; b < nblocks; ++b)
            for (int j = 0; j < 8; ++j) k4_scale_min(src + b * t.raw_bytes + 4, j, sc + b * 16 + j, sc + b * 16 + 8 + j);
    }
    if (t.unpack_sc) /* Q3_K, IQ4_XS: the packed scales as one signed byte each */
        for (int64_t b = 0; b < nblocks; ++b)
            unpack_scales(type, src + b * t.raw_bytes, dst + L.off[SEC_SC] + b * t.field[SEC_SC]);
    return 0;
}

/* A repacked copy of a raw matrix in host memory. */
struct HostQW {
    std::vector<uint8_t> buf;
    QW w;
    bool ok = false;
    HostQW(int type, const uint8_t *src, int64_t rows, int64_t k) {
        PackedLayout L;
        if (!packed_layout(type, rows, k, &L)) return;
        buf.resize((size_t)L.total + 16);
        if (repack_host(type, src, rows, k, buf.data(), L.total) != 0) return;
        w = make_qw(type, rows, k, buf.data(), L);
        ok = true;
    }
};

/* Host activations in the device's formats (ACT_32 and ACT_256 together, plus the floats). */
struct HostAct {
    std::vector<int8_t> qs32, qs256;
    std::vector<float> d32, s32, d256, f;
    std::vector<int> bs;
    int64_t k;
    HostAct(const float *x, int n_x, int64_t k_) : k(k_) {
        f.assign(x, x + (size_t)n_x * k);
        qs32.resize((size_t)n_x * k);
        d32.resize((size_t)n_x * k / 32);
        s32.resize((size_t)n_x * k / 32);
        for (int64_t b = 0; b < n_x * k / 32; ++b)
            quant_block32(x + 32 * b, qs32.data() + 32 * b, d32.data() + b, s32.data() + b);
        if (k % 256 == 0) {
            qs256.resize((size_t)n_x * k);
            d256.resize((size_t)n_x * k / 256);
            bs.resize((size_t)n_x * k / 16);
            for (int64_t b = 0; b < n_x * k / 256; ++b)
                quant_block256(x + 256 * b, qs256.data() + 256 * b, d256.data() + b, bs.data() + 16 * b);
        }
    }
    Act view(int type) const {
        Act a;
        bool k256 = type_act(type) == ACT_256;
        a.qs = k256 ? qs256.data() : qs32.data();
        a.d = k256 ? d256.data() : d32.data();
        a.s = s32.data();
        a.bs = bs.data();
        a.f = f.data();
        a.k = k;
        return a;
    }
};

template <int TYPE> static void host_mm(const QW &w, const Act &a, int n_x, float *y) {
    using U = Unit<TYPE>;
    const int nu = w.nb * U::NU;
    for (int64_t r = 0; r < w.rows; ++r)
        for (int c = 0; c < n_x; ++c) {
            float acc = 0.0f;
            for (int t = 0; t < nu; ++t) {
                U u;
                u.load(w, r * w.nb + t / U::NU, t % U::NU);
                acc += u.dot(a, c, t / U::NU);
            }
            y[(int64_t)c * w.rows + r] = acc;
        }
}

extern "C" {

int qsc_type_supported(int type) { return type_supported(type) ? 1 : 0; }

int64_t qsc_packed_bytes(int type, int64_t rows, int64_t k) {
    PackedLayout L;
    return packed_layout(type, rows, k, &L) ? L.total : -1;
}

int qsc_repack(int type, const uint8_t *src, int64_t rows, int64_t k, uint8_t *dst, int64_t dst_bytes) {
    return repack_host(type, src, rows, k, dst, dst_bytes);
}

int qsc_check_model(const qsc_model_desc *md, const qs_block *layers, char *err, size_t err_len) {
    return check_model(md, layers, nullptr, err, err_len);
}

int qsc_host_dequantize(int type, const uint8_t *w, int64_t rows, int64_t k, float *out) {
    HostQW q(type, w, rows, k);
    if (!q.ok) return -1;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t e = 0; e < k; ++e) out[r * k + e] = dequant_elem(q.w, r, e);
    return 0;
}

int qsc_host_quantize(int act_type, const float *x, int64_t n, uint8_t *out) {
    if (act_type == T_Q8_K ? n % 256 : n % 32) return -1;
    if (act_type != T_Q8_0 && act_type != T_Q8_1 && act_type != T_Q8_K) return -1;
    HostAct a(x, 1, n);
    if (act_type == T_Q8_K)
        return act_to_cpu_bytes(act_type, n, a.qs256.data(), a.d256.data(), nullptr, a.bs.data(), out) ? 0 : -1;
    return act_to_cpu_bytes(act_type, n, a.qs32.data(), a.d32.data(), a.s32.data(), nullptr, out) ? 0 : -1;
}

int qsc_host_matmat(int type, const uint8_t *w, int64_t rows, int64_t k, const float *x, int n_x, float *y) {
    if (n_x <= 0) return -1;
    HostQW q(type, w, rows, k);
    if (!q.ok) return -1;
    HostAct act(x, n_x, k);
    Act a = act.view(type);
    switch (type) {
    case T_Q4_0: host_mm<T_Q4_0>(q.w, a, n_x, y); break;
    case T_Q4_1: host_mm<T_Q4_1>(q.w, a, n_x, y); break;
    case T_Q5_0: host_mm<T_Q5_0>(q.w, a, n_x, y); break;
    case T_Q8_0: host_mm<T_Q8_0>(q.w, a, n_x, y); break;
    case T_Q4_K: host_mm<T_Q4_K>(q.w, a, n_x, y); break;
    case T_Q6_K: host_mm<T_Q6_K>(q.w, a, n_x, y); break;
    case T_F32: host_mm<T_F32>(q.w, a, n_x, y); break;
    case T_F16: host_mm<T_F16>(q.w, a, n_x, y); break;
#define QSC_HOST_MM(T) case T: host_mm<T>(q.w, a, n_x, y); break;
    QSC_EXT_TYPES(QSC_HOST_MM)
#undef QSC_HOST_MM
    default: return -1;
    }
    return 0;
}

} /* extern "C" */

/* host emulation of the prefill kernels (tensor-core GEMM, flash attention) */
#include "qsc_fast_host.cuh"

/* ------------------------------------------------------------------------------------------------------------------
 * Mixture of experts (qsc_moe.cuh) on the host: the device's routing and its expert-by-expert FFN over views of the
 * repacked stacked tensors, with the host build of the per-block math, for tests against the CPU block. */
static bool host_mm_any(const QW &w, const Act &a, int n_x, float *y) {
    switch (w.type) {
    case T_Q4_0: host_mm<T_Q4_0>(w, a, n_x, y); return true;
    case T_Q4_1: host_mm<T_Q4_1>(w, a, n_x, y); return true;
    case T_Q5_0: host_mm<T_Q5_0>(w, a, n_x, y); return true;
    case T_Q8_0: host_mm<T_Q8_0>(w, a, n_x, y); return true;
    case T_Q4_K: host_mm<T_Q4_K>(w, a, n_x, y); return true;
    case T_Q6_K: host_mm<T_Q6_K>(w, a, n_x, y); return true;
    case T_F32: host_mm<T_F32>(w, a, n_x, y); return true;
    case T_F16: host_mm<T_F16>(w, a, n_x, y); return true;
#define QSC_MOE_MM(T) case T: host_mm<T>(w, a, n_x, y); return true;
    QSC_EXT_TYPES(QSC_MOE_MM)
#undef QSC_MOE_MM
    default: return false;
    }
}

/* y [n_x][w.rows] = w x[n_x][k] (+ bias), as k_matmul computes it */
static bool host_linear(const QW &w, const float *x, int n_x, const float *bias, float *y) {
    HostAct act(x, n_x, w.k);
    if (!host_mm_any(w, act.view(w.type), n_x, y)) return false;
    if (bias)
        for (int c = 0; c < n_x; ++c)
            for (int64_t r = 0; r < w.rows; ++r) y[c * w.rows + r] += bias[r];
    return true;
}

extern "C" {

int qsc_host_moe_route(const float *logits, int n_tokens, int n_expert, int n_used, int norm, float scale,
                       int32_t *sel, float *w) {
    if (n_tokens <= 0 || n_expert <= 0 || n_expert > QSC_MOE_MAX_EXPERTS || n_used < 1 || n_used > n_expert)
        return -1;
    std::vector<float> p((size_t)n_expert);
    for (int t = 0; t < n_tokens; ++t) {
        memcpy(p.data(), logits + (int64_t)t * n_expert, (size_t)n_expert * sizeof(float));
        moe_route(p.data(), n_expert, n_used, norm, scale, sel + (int64_t)t * n_used, w + (int64_t)t * n_used);
    }
    return 0;
}

int qsc_host_moe_ffn(const qs_block *b, const float *h, int n_tokens, float *out, char *err, size_t err_len) {
    if (!b || !h || !out || n_tokens <= 0 || b->moe.n_expert <= 0) {
        set_err(err, err_len, "no block, input or output, or no experts");
        return -1;
    }
    Dims D = {};
    D.E = b->n_embd;
    D.F = b->ffn.n_ff;
    if (D.E <= 0 || D.F <= 0 || !moe_check(*b, 0, D, err, err_len)) return -1;
    const int T = n_tokens, E = D.E, F = D.F, NE = b->moe.n_expert, K = b->moe.n_used, FS = b->moe.n_ff_shexp;
    const struct { const qs_weight *w; int64_t rows, k; } want[3] = {
        {&b->ffn.gate, (int64_t)NE * F, E}, {&b->ffn.up, (int64_t)NE * F, E}, {&b->ffn.down, (int64_t)NE * E, F}};
    for (const auto &x : want)
        if (!weight_ok(*x.w, x.rows, x.k)) {
            set_err(err, err_len, "expert tensor of %lld x %lld, expected %lld x %lld", (long long)x.w->rows,
                    (long long)x.w->k, (long long)x.rows, (long long)x.k);
            return -1;
        }
    HostQW router(b->moe.router.type, b->moe.router.ptr, NE, E);
    HostQW G(b->ffn.gate.type, b->ffn.gate.ptr, (int64_t)NE * F, E), U(b->ffn.up.type, b->ffn.up.ptr, (int64_t)NE * F, E),
        Dn(b->ffn.down.type, b->ffn.down.ptr, (int64_t)NE * E, F);
    if (!router.ok || !G.ok || !U.ok || !Dn.ok) {
        set_err(err, err_len, "repack failed");
        return -1;
    }
    std::vector<float> logits((size_t)T * NE), wsel((size_t)T * K);
    std::vector<int32_t> sel((size_t)T * K);
    if (!host_linear(router.w, h, T, b->moe.b_router.ptr, logits.data())) return -1;
    for (int t = 0; t < T; ++t)
        moe_route(logits.data() + (int64_t)t * NE, NE, K, b->moe.norm, b->moe.scale, sel.data() + (int64_t)t * K,
                  wsel.data() + (int64_t)t * K);
    memset(out, 0, (size_t)T * E * sizeof(float));
    std::vector<float> hb((size_t)T * E), g((size_t)T * F), u((size_t)T * F), ob((size_t)T * E);
    for (int e = 0; e < NE; ++e) { /* the same grouping as enqueue_moe: expert by expert, tokens in order */
        std::vector<int> pairs;
        for (int i = 0; i < T * K; ++i)
            if (sel[(size_t)i] == e) pairs.push_back(i);
        const int n = (int)pairs.size();
        if (!n) continue;
        for (int i = 0; i < n; ++i) memcpy(&hb[(size_t)i * E], h + (int64_t)(pairs[(size_t)i] / K) * E, (size_t)E * 4);
        const QW ge = expert_view(G.w, e, F), ue = expert_view(U.w, e, F), de = expert_view(Dn.w, e, E);
        const float *bg = b->moe.b_gate.ptr ? b->moe.b_gate.ptr + (int64_t)e * F : nullptr;
        const float *bu = b->moe.b_up.ptr ? b->moe.b_up.ptr + (int64_t)e * F : nullptr;
        const float *bd = b->moe.b_down.ptr ? b->moe.b_down.ptr + (int64_t)e * E : nullptr;
        if (!host_linear(ge, hb.data(), n, bg, g.data()) || !host_linear(ue, hb.data(), n, bu, u.data())) return -1;
        for (int64_t i = 0; i < (int64_t)n * F; ++i)
            g[(size_t)i] = b->ffn.swiglu_oai ? moe_swiglu_oai(g[(size_t)i], u[(size_t)i]) : moe_silu_mul(g[(size_t)i], u[(size_t)i]);
        if (!host_linear(de, g.data(), n, bd, ob.data())) return -1;
        for (int i = 0; i < n; ++i) {
            float *o = out + (int64_t)(pairs[(size_t)i] / K) * E;
            const float wt = wsel[(size_t)pairs[(size_t)i]];
            for (int c = 0; c < E; ++c) o[c] = moe_madd(o[c], wt, ob[(size_t)i * E + c]);
        }
    }
    if (FS) {
        HostQW sg(b->moe.sh_gate.type, b->moe.sh_gate.ptr, FS, E), su(b->moe.sh_up.type, b->moe.sh_up.ptr, FS, E),
            sd(b->moe.sh_down.type, b->moe.sh_down.ptr, E, FS);
        if (!sg.ok || !su.ok || !sd.ok) return -1;
        std::vector<float> a((size_t)T * FS), a2((size_t)T * FS), so((size_t)T * E);
        if (!host_linear(sg.w, h, T, nullptr, a.data()) || !host_linear(su.w, h, T, nullptr, a2.data())) return -1;
        for (int64_t i = 0; i < (int64_t)T * FS; ++i) a[(size_t)i] = moe_silu_mul(a[(size_t)i], a2[(size_t)i]);
        if (!host_linear(sd.w, a.data(), T, nullptr, so.data())) return -1;
        for (int t = 0; t < T; ++t) {
            float z = 0.0f;
            for (int c = 0; c < E; ++c) z += h[(int64_t)t * E + c] * b->moe.sh_gate_inp.ptr[c];
            const float wt = 1.0f / (1.0f + expf(-z));
            for (int c = 0; c < E; ++c) out[(int64_t)t * E + c] = moe_madd(out[(int64_t)t * E + c], wt, so[(size_t)t * E + c]);
        }
    }
    return 0;
}

} /* extern "C" */

/* the delta-net and per-layer embedding entry points (after HostQW / host_linear, which they use) */
#define QSC_GDN_HOST
#include "qsc_gdn.cuh"
#define QSC_PLE_HOST
#include "qsc_ple.cuh"
