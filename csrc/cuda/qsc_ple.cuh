/* gemma4's per-layer embeddings on the CUDA backend (the CPU block: the end of csrc/qs_block.c's block_forward):
 * after the FFN's residual, x += RMSNorm(proj(GELU-tanh(gate x) * inputs)) * post_norm, with gate dim x n_embd,
 * proj n_embd x dim and inputs [T][dim] of the call (core computes them from the token ids).
 *
 * The per-element math is __host__ __device__: qsc_host_ple (QSC_PLE_HOST, included at the end of qsc_host.cu) runs
 * the whole step on the CPU for tests/test_cuda_ple.py. The device forward does not run it yet: the inputs come
 * from core per call (session.py's _ple_inputs) and qsc_forward has no way to take them. */
#pragma once

#include "qsc_common.cuh"

/* GELU-tanh of the gate times the layer's input value, in the CPU's qs_geglu_tanh_scalar form. */
HD float ple_gelu_mul(float g, float in) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g))) * in;
}

/* The group's sizes against the description (host only). */
static inline bool ple_check(const qs_block &b, char *err, size_t err_len) {
    const qs_ple_desc &P = b.ple;
    const int64_t E = b.n_embd;
    if (P.dim <= 0 || P.dim > (1 << 16) || E <= 0) {
        set_err(err, err_len, "per-layer embedding size %d invalid", P.dim);
        return false;
    }
    if (!weight_ok(P.gate, P.dim, E) || !weight_ok(P.proj, E, P.dim)) {
        set_err(err, err_len, "per-layer embedding gate %lld x %lld / proj %lld x %lld of types %d / %d, expected "
                "%d x %lld / %lld x %d of GPU types", (long long)P.gate.rows, (long long)P.gate.k,
                (long long)P.proj.rows, (long long)P.proj.k, P.gate.type, P.proj.type, P.dim, (long long)E,
                (long long)E, P.dim);
        return false;
    }
    if (!vec_ok(P.post_norm, E, true)) {
        set_err(err, err_len, "per-layer embedding post norm has %lld values, expected %lld", (long long)P.post_norm.len,
                (long long)E);
        return false;
    }
    return true;
}

#ifdef QSC_PLE_HOST
/* The step on the host with the shared math, in place on x [T][E]; the inputs are b->ple.inputs [T][dim]. */
extern "C" int qsc_host_ple(const qs_block *b, float *x, int n_tokens, char *err, size_t err_len) {
    if (!b || !x || n_tokens <= 0) {
        set_err(err, err_len, "no block or input, or no tokens");
        return -1;
    }
    if (!ple_check(*b, err, err_len)) return -1;
    const qs_ple_desc &P = b->ple;
    const int T = n_tokens, E = b->n_embd, D = P.dim;
    if (!P.inputs || P.inputs_len < (int64_t)T * D) {
        set_err(err, err_len, "per-layer inputs: %lld values for %d tokens of %d", (long long)P.inputs_len, T, D);
        return -1;
    }
    HostQW wg(P.gate.type, P.gate.ptr, D, E), wp(P.proj.type, P.proj.ptr, E, D);
    if (!wg.ok || !wp.ok) {
        set_err(err, err_len, "repack failed");
        return -1;
    }
    std::vector<float> g((size_t)T * D), o((size_t)T * E);
    if (!host_linear(wg.w, x, T, nullptr, g.data())) return -1;
    for (int64_t i = 0; i < (int64_t)T * D; ++i) g[(size_t)i] = ple_gelu_mul(g[(size_t)i], P.inputs[i]);
    if (!host_linear(wp.w, g.data(), T, nullptr, o.data())) return -1;
    for (int t = 0; t < T; ++t) {
        const float *orow = o.data() + (int64_t)t * E;
        double ss = 0.0;
        for (int i = 0; i < E; ++i) ss += (double)orow[i] * orow[i];
        const float sc = (float)(1.0 / sqrt(ss / (double)E + (double)b->eps));
        for (int i = 0; i < E; ++i) x[(int64_t)t * E + i] += orow[i] * sc * P.post_norm.ptr[i];
    }
    return 0;
}
#endif /* QSC_PLE_HOST */
