/* Host side of the CUDA backend that needs no GPU: weight repacking, the config's per-layer choices, and the
 * device's per-block math (qsc_common.cuh) run on the CPU, so machines without a GPU can test the layouts, the
 * decode of every block format and the int8 dot scheme against the CPU kernels. */
#include <stdlib.h>

#include <vector>

#include "qsc_common.cuh"
#include "qsc_emul.cuh"

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
    if (t.unpack) /* scales the type unpacks from the file's block (Q3_K, Q4_K, Q5_K, IQ4_XS: their rooms) */
        for (int64_t b = 0; b < nblocks; ++b)
            t.unpack(src + b * t.raw_bytes, dst + L.off[SEC_SC] + b * t.field[SEC_SC]);
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

/* k_matmul on the host: y[c * ldy + r] = row r of w . column c of a (+ bias[r]), unit by unit in the kernel's order
 * (acc starts at +0, so adding a zero bias never changes it: the same bits with or without). */
template <int TYPE>
static void emu_mm(const QW &w, const Act &a, float *y, int64_t ldy, const float *bias, int ncols) {
    using U = Unit<TYPE>;
    const int nu = w.nb * U::NU;
    for (int64_t r = 0; r < w.rows; ++r)
        for (int c = 0; c < ncols; ++c) {
            float acc = 0.0f;
            for (int t = 0; t < nu; ++t) {
                U u;
                u.load(w, r * w.nb + t / U::NU, t % U::NU);
                acc += u.dot(a, c, t / U::NU);
            }
            y[(int64_t)c * ldy + r] = acc + (bias ? bias[r] : 0.0f);
        }
}

/* the host's one dispatch over the types (false: not a device type) */
static bool emu_mm_any(const QW &w, const Act &a, float *y, int64_t ldy, const float *bias, int ncols) {
    switch (w.type) {
#define QSC_EMU_MM(T) case T: emu_mm<T>(w, a, y, ldy, bias, ncols); return true;
        QSC_FOR_TYPES(QSC_EMU_MM)
#undef QSC_EMU_MM
    default: return false;
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
    return emu_mm_any(q.w, act.view(type), y, rows, nullptr, n_x) ? 0 : -1;
}

/* ---- the dense architecture features, run on the host as the kernels run them (qsc_kernels.cuh) */

int qsc_host_attention(const float *q, int n_q, const int32_t *q_pos, int n_heads, int head_dim,
                       const void *k_cache, const void *v_cache, int kv_f16, int n_kv_heads, int n_kv, int window,
                       float scale, float softcap, const float *sinks, float *out) {
    if (n_q <= 0 || n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads || head_dim <= 0 ||
        head_dim > QSC_MAX_HEAD || n_kv <= 0 || window < 0 || !(softcap >= 0.0f))
        return -1;
    for (int t = 0; t < n_q; ++t)
        if (q_pos[t] < 0) return -1;
    const AttnArgs A = {n_heads, n_kv_heads, head_dim, window, scale, softcap, sinks};
    emu_attention(n_q, A, kv_f16, q, (const int *)q_pos, k_cache, v_cache, n_kv, out);
    return 0;
}

int qsc_host_qk_post(float *q, float *k, int n_tokens, int n_head, int n_head_kv, int head_dim, const float *q_norm,
                     const float *k_norm, int qk_full, float eps, const int32_t *pos, const qs_rope_desc *rope,
                     float temp_scale, int64_t temp_floor) {
    if (!qk_post_args_ok(q, k, n_tokens, n_head, n_head_kv, head_dim, pos, rope, temp_scale, temp_floor)) return -1;
    const bool norms = q_norm && k_norm && k;
    const QKArgs A = {n_head, k ? n_head_kv : 0, head_dim, qk_full ? 1 : 0, norms ? q_norm : nullptr,
                      norms ? k_norm : nullptr, eps, rope_params(*rope, rope->freqs.ptr), temp_scale,
                      (long long)temp_floor, 0};
    emu_qk_post(q, k, nullptr, A, (const int *)pos, n_tokens, nullptr, nullptr, 0);
    return 0;
}

int qsc_host_glu(const float *gate, const float *up, float *out, int64_t n, int mode) {
    if (n <= 0 || n > 2147483647 || mode < 0 || mode > 2) return -1;
    emu_glu(gate, up, out, ActOut{}, 1, (int)n, mode, n, (int)n);
    return 0;
}

int qsc_host_logits(float *x, int64_t n, float logit_scale, float softcap) {
    if (n <= 0) return -1;
    emu_logits(x, n, qs_plan_one(logit_scale), softcap);
    return 0;
}

int qsc_host_residual(float *x, const float *o, const float *post_w, int n_rows, int n, float eps, float rs,
                      float out_scale) {
    if (n_rows <= 0 || n <= 0) return -1;
    std::vector<float> h((size_t)n_rows * n);
    const ResidIn r = {o, post_w, eps, rs, out_scale};
    emu_norm_quant(x, r, nullptr, 0, h.data(), ActOut{}, n_rows, n, eps);
    return 0;
}

} /* extern "C" */

/* host emulation of the prefill kernels (tensor-core GEMM, flash attention) */
#include "qsc_fast_host.cuh"

/* ------------------------------------------------------------------------------------------------------------------
 * Mixture of experts (qsc_moe.cuh) on the host: the device's routing rules (its FFN's host twins, grouping and grouped
 * products, live in qsc_moe.cuh with the kernels: qsc_host_moe_ffn runs them on a one-layer host model). */
/* y [n_x][w.rows] = w x[n_x][k] (+ bias), as k_matmul computes it */
static bool host_linear(const QW &w, const float *x, int n_x, const float *bias, float *y) {
    HostAct act(x, n_x, w.k);
    if (!emu_mm_any(w, act.view(w.type), y, w.rows, nullptr, n_x)) return false;
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

} /* extern "C" */

/* ------------------------------------------------------------------------------------------------------------------
 * The kernels' host twins (qsc_emul.cuh), in the kernels' order of operations. */

void emu_embed(const QW &w, const int *tokens, float *x, int T, int n, float scale) {
    for (int t = 0; t < T; ++t)
        for (int e = 0; e < n; ++e) x[(int64_t)t * n + e] = dequant_elem(w, tokens[t], e) * scale;
}

void emu_quantize(const float *x, const ActOut &o, int rows, int n) {
    for (int64_t row = 0; row < rows; ++row) {
        const float *xr = x + row * n;
        if (o.qs32)
            for (int b = 0; b < n / 32; ++b) {
                const int64_t blk = row * (n / 32) + b;
                quant_block32(xr + 32 * b, o.qs32 + blk * 32, o.d32 + blk, o.s32 + blk);
            }
        if (o.qs256)
            for (int b = 0; b < n / 256; ++b) {
                const int64_t blk = row * (n / 256) + b;
                quant_block256(xr + 256 * b, o.qs256 + blk * 256, o.d256 + blk, o.bs256 + blk * 16);
            }
    }
}

void emu_norm_quant(float *x, const ResidIn &r, const float *w, int norm, float *h, const ActOut &ao, int rows, int n,
                    float eps) {
    for (int64_t row = 0; row < rows; ++row) {
        float *xr = x + row * n;
        if (r.o) {
            const float *orow = r.o + row * n;
            float sc = 1.0f;
            if (r.post_w) {
                float ss = 0.0f;
                for (int i = 0; i < n; ++i) ss += orow[i] * orow[i];
                sc = 1.0f / sqrtf(ss / (float)n + r.post_eps);
            }
            for (int i = 0; i < n; ++i)
                xr[i] = residual_add(xr[i], r.post_w ? orow[i] * sc * r.post_w[i] : orow[i], r.rs, r.out_scale);
        }
        float sc = 1.0f;
        if (norm) {
            float ss = 0.0f;
            for (int i = 0; i < n; ++i) ss += xr[i] * xr[i];
            sc = 1.0f / sqrtf(ss / (float)n + eps);
        }
        float *hr = h + row * n;
        for (int i = 0; i < n; ++i) hr[i] = !norm ? xr[i] : w ? xr[i] * sc * w[i] : xr[i] * sc;
    }
    emu_quantize(h, ao, rows, n);
}

void emu_matmul(const QW &w, const Act &a, float *y, int64_t ldy, const float *bias, int ncols) {
    emu_mm_any(w, a, y, ldy, bias, ncols);
}

/* RMSNorm of n values in place, times w (k_qk_post's per-head and whole-projection norms). */
static void emu_rms(float *r, int64_t n, const float *w, float eps) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; ++i) ss += r[i] * r[i];
    const float sc = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t i = 0; i < n; ++i) r[i] = r[i] * sc * w[i];
}

void emu_qk_post(float *q, float *k, const float *v, const QKArgs &A, const int *pos, int T, void *k_cache,
                 void *v_cache, int kv_f16) {
    const int H = A.H, KV = A.KV, hd = A.hd;
    const int half = A.rope.skip ? 0 : A.rope.dim / 2;
    std::vector<float> rc((size_t)half + 1), rs((size_t)half + 1);
    for (int t = 0; t < T; ++t) {
        const int p = pos[t];
        for (int i = 0; i < half; ++i) rope_cs(A.rope, p, i, &rc[i], &rs[i]);
        if (A.q_norm && A.k_norm && A.qk_full) {
            emu_rms(q + (int64_t)t * H * hd, (int64_t)H * hd, A.q_norm, A.eps);
            emu_rms(k + (int64_t)t * KV * hd, (int64_t)KV * hd, A.k_norm, A.eps);
        }
        for (int hh = 0; hh < H + KV; ++hh) {
            const bool isq = hh < H;
            float *vec = isq ? q + ((int64_t)t * H + hh) * hd : k + ((int64_t)t * KV + (hh - H)) * hd;
            const float *nw = isq ? A.q_norm : A.k_norm;
            if (nw && !A.qk_full) emu_rms(vec, hd, nw, A.eps);
            for (int i = 0; i < half; ++i) rope_pair(vec, rope_ia(A.rope, i), rope_ib(A.rope, i), rc[i], rs[i]);
            if (isq && A.temp_scale != 0.0f) {
                const float f = temp_factor(p, A.temp_scale, A.temp_floor);
                for (int i = 0; i < hd; ++i) vec[i] *= f;
            }
            if (!isq && k_cache) {
                const int kvh = hh - H;
                const float *vv = v + ((int64_t)t * KV + kvh) * hd;
                const int64_t off = ((int64_t)p * KV + kvh) * hd;
                float vs = 1.0f;
                if (A.v_norm) {
                    float ss = 0.0f;
                    for (int i = 0; i < hd; ++i) ss += vv[i] * vv[i];
                    vs = 1.0f / sqrtf(ss / (float)hd + A.eps);
                }
                for (int i = 0; i < hd; ++i) {
                    if (kv_f16) {
                        ((__half *)k_cache)[off + i] = __float2half_rn(vec[i]);
                        ((__half *)v_cache)[off + i] = __float2half_rn(vv[i] * vs);
                    } else {
                        ((float *)k_cache)[off + i] = vec[i];
                        ((float *)v_cache)[off + i] = vv[i] * vs;
                    }
                }
            }
        }
    }
}

void emu_attention(int T, const AttnArgs &A, int kv_f16, const float *q, const int *pos, const void *kc,
                   const void *vc, int n_kv, float *out) {
    const int NW = 8, hd = A.hd, H = A.H, KV = A.KV; /* k_attention: 8 warps take the keys round-robin */
    auto kv = [&](const void *c, int64_t i) -> float {
        if (!kv_f16) return ((const float *)c)[i];
        __half_raw r;
        r.x = ((const uint16_t *)c)[i];
        return h2f(__half(r));
    };
    std::vector<float> acc((size_t)NW * hd), m(NW), l(NW);
    for (int t = 0; t < T; ++t) {
        const int qp = pos[t], hi = qp < n_kv - 1 ? qp : n_kv - 1;
        const int lo = A.window > 0 && qp - A.window + 1 > 0 ? qp - A.window + 1 : 0;
        for (int h = 0; h < H; ++h) {
            const int kvh = h / (H / KV);
            const float *qv = q + ((int64_t)t * H + h) * hd;
            for (int w = 0; w < NW; ++w) {
                m[w] = -INFINITY;
                l[w] = 0.0f;
                float *a = acc.data() + (size_t)w * hd;
                for (int e = 0; e < hd; ++e) a[e] = 0.0f;
                for (int j = lo + w; j <= hi; j += NW) {
                    const int64_t base = ((int64_t)j * KV + kvh) * hd;
                    float dot = 0.0f;
                    for (int e = 0; e < hd; ++e) dot += qv[e] * kv(kc, base + e);
                    float alpha;
                    const float p = softmax_step(m[w], l[w], attn_score(dot, A.scale, A.softcap), &alpha);
                    for (int e = 0; e < hd; ++e) a[e] = a[e] * alpha + p * kv(vc, base + e);
                }
            }
            const float sink = A.sinks ? A.sinks[h] : -INFINITY;
            float M = sink;
            for (int w = 0; w < NW; ++w) M = fmaxf(M, m[w]);
            for (int e = 0; e < hd; ++e) {
                float L = A.sinks ? expf(sink - M) : 0.0f, o = 0.0f;
                if (M != -INFINITY)
                    for (int w = 0; w < NW; ++w) {
                        const float f = expf(m[w] - M);
                        L += l[w] * f;
                        o += acc[(size_t)w * hd + e] * f;
                    }
                out[((int64_t)t * H + h) * hd + e] = L > 0.0f ? o / L : 0.0f;
            }
        }
    }
}

void emu_glu(const float *g, const float *u, float *a, const ActOut &ao, int rows, int n, int mode, int64_t ldu,
             int nv) {
    for (int64_t r = 0; r < rows; ++r)
        for (int i = 0; i < n; ++i) a[r * n + i] = i < nv ? glu_unit(g[r * n + i], u[r * ldu + i], mode) : 0.0f;
    emu_quantize(a, ao, rows, n);
}

void emu_logits(float *x, int64_t n, float logit_scale, float cap) {
    for (int64_t i = 0; i < n; ++i) x[i] = logit_post(x[i], logit_scale, cap);
}

/* qsc_gdn.cuh: the delta-net and gated-attention host twins and entry points (after HostQW / host_linear, which they use) */
#define QSC_GDN_HOST
#include "qsc_gdn.cuh"

/* qsc_decode.cuh: flash-decoding's host twin (emu_flashdec) and qsc_host_flashdec */
#define QSC_FD_HOST
#include "qsc_decode.cuh"
