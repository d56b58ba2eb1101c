/* Flash attention for prefill: the math shared by the device kernel (qsc_fast.cuh) and its host emulation
 * (qsc_fast_host.cuh), as __host__ __device__ code.
 *
 * k_attention runs one block per (head, token) and reads the whole visible KV range for each of them. Here a block
 * takes FA_ROWS = 32 query rows that share one KV head (GQA: the row index runs over (token, head in the group)
 * pairs) and walks the union of their key ranges in tiles of FA_BKV = 32 keys: the tile is read from the cache once
 * into shared memory (as floats) and used by all 32 rows. Each of the 8 warps owns FA_RPW = 4 rows and keeps, per
 * row, the online-softmax state: running max m, running sum l of exp(s - m), and the accumulator acc (lane holds
 * head elements EPL*lane .. EPL*lane+EPL-1). For a tile with scores s_j (lane j: key j of the tile):
 *     m' = max(m, max_j s_j);  alpha = exp(m - m');  p_j = exp(s_j - m');
 *     l' = alpha l + sum_j p_j;  acc' = alpha acc + sum_j p_j V_j.
 * Masked keys (causal, sliding window, past the cache) have s = -inf and p = 0; alpha = 0 while m is still -inf
 * (nothing accumulated yet), so no exp(-inf + inf) ever happens. At the end out = acc / l, or with an attention sink
 * S (a logit in the denominator with no value): out = acc exp(m - M) / (l exp(m - M) + exp(S - M)), M = max(m, S).
 * Scores are soft-capped (s -> c tanh(s / c)) when softcap > 0, after the scale, as the CPU's qs_attention_softcap.
 *
 * As in qsc_mma.cuh the warp code is written for LANES lanes of state: LANES = 1 on the device (warp reductions are
 * shuffles), LANES = 32 on the host (reductions are loops). Head sizes 32..128 (EPL 1..4); larger heads keep
 * k_attention. */
#pragma once

#include "qsc_common.cuh"

constexpr int FA_ROWS = 32, FA_BKV = 32, FA_WARPS = 8, FA_RPW = FA_ROWS / FA_WARPS, FA_MAX_EPL = 4;

/* ------------------------------------------------------------------------------------------------------------------
 * The recurrence, one function per step. */
HD bool fa_visible(int kpos, int qpos, int n_kv, int window) {
    return kpos < n_kv && kpos <= qpos && (window <= 0 || kpos > qpos - window);
}
HD float fa_score(float dot, float scale, float softcap) {
    const float s = dot * scale;
    return softcap > 0.0f ? softcap * tanhf(s / softcap) : s;
}
HD float fa_alpha(float m_old, float m_new) { return m_old == -INFINITY ? 0.0f : expf(m_old - m_new); }
HD float fa_p(float s, float m_new) { return s == -INFINITY ? 0.0f : expf(s - m_new); }
/* The factor the accumulator is divided by at the end, and the rescale of acc (see above); out = acc * f. */
HD float fa_final_factor(float m, float l, bool has_sink, float sink) {
    if (!has_sink) return l > 0.0f ? 1.0f / l : 0.0f;
    const float M = fmaxf(m, sink);
    const float e = m == -INFINITY ? 0.0f : expf(m - M);
    return e / (l * e + expf(sink - M));
}

/* The key range [lo, hi] row (t, qpos) can see. */
HD int fa_lo(int qpos, int window) { return window > 0 ? (qpos - window + 1 > 0 ? qpos - window + 1 : 0) : 0; }
HD int fa_hi(int qpos, int n_kv) { return qpos < n_kv - 1 ? qpos : n_kv - 1; }

/* ------------------------------------------------------------------------------------------------------------------
 * Warp reductions over LANES lanes. */
template <int LANES> HD float fa_warp_max(const float (&v)[LANES]) {
#ifdef __CUDA_ARCH__
    float x = v[0];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
#else
    float x = v[0];
    for (int l = 1; l < LANES; ++l) x = fmaxf(x, v[l]);
    return x;
#endif
}
template <int LANES> HD float fa_warp_sum(const float (&v)[LANES]) {
#ifdef __CUDA_ARCH__
    float x = v[0];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
#else
    /* the butterfly's order: lane sums of pairs at distance 16, 8, 4, 2, 1 */
    float t[32];
    for (int l = 0; l < 32; ++l) t[l] = v[l];
    for (int o = 16; o > 0; o >>= 1) {
        float n[32];
        for (int l = 0; l < 32; ++l) n[l] = t[l] + t[l ^ o];
        for (int l = 0; l < 32; ++l) t[l] = n[l];
    }
    return t[0];
#endif
}
template <int LANES> HD float fa_lane_value(const float (&v)[LANES], int j) {
#ifdef __CUDA_ARCH__
    return __shfl_sync(0xffffffffu, v[0], j);
#else
    return v[j];
#endif
}

/* Per-row state of one lane. */
template <int EPL> struct FaRow {
    float m, l, acc[EPL];
};

template <int EPL, int LANES> HD void fa_row_init(FaRow<EPL> (&r)[LANES]) {
    for (int l = 0; l < LANES; ++l) {
        r[l].m = -INFINITY;
        r[l].l = 0.0f;
        for (int i = 0; i < EPL; ++i) r[l].acc[i] = 0.0f;
    }
}

/* One KV tile for one query row: sq = the row's query (HDIM floats, shared), sk[j][e] (stride HDIM + 1) and
 * sv[j][e] (stride HDIM) the tile's keys and values, kpos0 the tile's first position. */
template <int EPL, int LANES>
HD void fa_row_tile(const float *sq, const float *sk, const float *sv, int kpos0, int qpos, int n_kv, int window,
                    float scale, float softcap, int lane0, FaRow<EPL> (&r)[LANES]) {
    constexpr int HDIM = 32 * EPL;
    float s[LANES], p[LANES];
    for (int l = 0; l < LANES; ++l) {
        const int j = lane0 + l;
        s[l] = -INFINITY;
        if (fa_visible(kpos0 + j, qpos, n_kv, window)) {
            float d = 0.0f;
            for (int e = 0; e < HDIM; ++e) d += sq[e] * sk[j * (HDIM + 1) + e];
            s[l] = fa_score(d, scale, softcap);
        }
    }
    const float mt = fa_warp_max<LANES>(s);
    const float m_new = fmaxf(r[0].m, mt); /* m and l are the same in every lane */
    const float alpha = fa_alpha(r[0].m, m_new);
    for (int l = 0; l < LANES; ++l) p[l] = fa_p(s[l], m_new);
    const float ps = fa_warp_sum<LANES>(p);
    for (int l = 0; l < LANES; ++l) {
        r[l].m = m_new;
        r[l].l = r[l].l * alpha + ps;
        for (int i = 0; i < EPL; ++i) r[l].acc[i] *= alpha;
    }
    for (int j = 0; j < FA_BKV; ++j) {
        const float pj = fa_lane_value<LANES>(p, j);
        if (pj == 0.0f) continue; /* warp-uniform */
        for (int l = 0; l < LANES; ++l)
            for (int i = 0; i < EPL; ++i) r[l].acc[i] += pj * sv[j * HDIM + EPL * (lane0 + l) + i];
    }
}

/* The block's rows: row index gi = blockIdx.x * FA_ROWS + rr over (token t = gi / G, head kvh * G + gi % G). */
struct FaArgs {
    const float *q;   /* [T][H][hd] */
    const int *q_pos; /* [T] */
    const int *n_kv_p;  /* the cache length, in device memory (as k_attention reads it) */
    int T, H, KV, window;
    float scale, softcap;
    const float *sinks; /* [H] or NULL */
    float *out;         /* [T][H][hd] */
};

/* Key range of the block's rows: [*lo, *hi] (empty when *lo > *hi). */
HD void fa_block_range(const FaArgs &a, int bx, int *lo, int *hi) {
    const int G = a.H / a.KV;
    int L = 0x7fffffff, Hh = -1;
    for (int rr = 0; rr < FA_ROWS; ++rr) {
        const int64_t gi = (int64_t)bx * FA_ROWS + rr;
        if (gi >= (int64_t)a.T * G) break;
        const int qp = a.q_pos[gi / G];
        const int l = fa_lo(qp, a.window), h = fa_hi(qp, *a.n_kv_p);
        if (l <= h) {
            L = l < L ? l : L;
            Hh = h > Hh ? h : Hh;
        }
    }
    *lo = L;
    *hi = Hh;
}

/* k_flash's grid on the host (qsc_fast_host.cuh): blocks of FA_ROWS rows per KV head, the same tiles and
 * recurrence; head sizes 32 .. 32 * FA_MAX_EPL (false: none run). */
bool emu_flash(const FaArgs &a, int hd, int kv_f16, const void *kc, const void *vc);

HD float fa_to_f(float v) { return v; }
HD float fa_to_f(__half v) { return h2f(v); }

/* Tile load: keys kpos0.. of KV head kvh into sk / sv as floats, thread tid of nthr (zeros past hi). */
template <int EPL, typename KT>
HD void fa_load_tile(const KT *kc, const KT *vc, int KV, int kvh, int kpos0, int hi, float *sk, float *sv, int tid,
                     int nthr) {
    constexpr int HDIM = 32 * EPL;
    for (int idx = tid; idx < FA_BKV * HDIM; idx += nthr) {
        const int j = idx / HDIM, e = idx % HDIM;
        float kv = 0.0f, vv = 0.0f;
        if (kpos0 + j <= hi) {
            const int64_t off = ((int64_t)(kpos0 + j) * KV + kvh) * HDIM + e;
            kv = fa_to_f(kc[off]);
            vv = fa_to_f(vc[off]);
        }
        sk[j * (HDIM + 1) + e] = kv;
        sv[j * HDIM + e] = vv;
    }
}

/* Row rr of block bx: its token, head and position (false: past the last row). */
HD bool fa_row(const FaArgs &a, int bx, int kvh, int rr, int *t, int *h, int *qp) {
    const int G = a.H / a.KV;
    const int64_t gi = (int64_t)bx * FA_ROWS + rr;
    if (gi >= (int64_t)a.T * G) return false;
    *t = (int)(gi / G);
    *h = kvh * G + (int)(gi % G);
    *qp = a.q_pos[*t];
    return true;
}

/* The end of a row: out[t][h][EPL*lane + i] = acc * the final factor. */
template <int EPL, int LANES>
HD void fa_row_store(const FaArgs &a, int t, int h, int lane0, const FaRow<EPL> (&r)[LANES]) {
    constexpr int HDIM = 32 * EPL;
    const bool sink = a.sinks != nullptr;
    const float f = fa_final_factor(r[0].m, r[0].l, sink, sink ? a.sinks[h] : 0.0f);
    for (int l = 0; l < LANES; ++l)
        for (int i = 0; i < EPL; ++i)
            a.out[((int64_t)t * a.H + h) * HDIM + EPL * (lane0 + l) + i] = r[l].acc[i] * f;
}
