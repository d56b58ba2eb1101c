/* Mixture-of-experts layers on the device (qs_block's moe group, as csrc/qs_block.c's moe_ffn computes them).
 *
 * Per layer and T tokens: the router (n_expert x n_embd, + b_router) scores the experts; per token a softmax, the
 * n_used largest probabilities (ties to the lower index: a stable descending sort), their weights normalized to
 * sum 1 (norm; the sum clamped below at 2^-14, as llama.cpp) and times scale (0: 1). Then expert by expert (in
 * ascending order, as the CPU adds them), only the tokens routed to it: their rows of h gathered, gate/up (+ b_gate,
 * b_up), SwiGLU or gpt-oss's clamped SwiGLU, down (+ b_down), each output row added with its token's weight. A
 * shared expert (qwen35moe) runs on every token; its output times sigmoid(h . sh_gate_inp) is added last.
 *
 * On the device nothing of this comes back to the host: the routing is grouped by expert in device memory
 * (k_moe_group: counts, their scan, the (token, slot) pairs sorted by expert in token order, tiles of each
 * expert's rows; MoeGroup), the picked rows are gathered, and each product is ONE launch over every expert
 * (k_moe_matmul: k_matmul's warps / k_gemv's lanes on expert views; k_moe_mma: the tensor-core tiles), whose
 * blocks read their tile (expert, rows) from device memory; the grids are sized for the worst case (T * n_used
 * pairs) and blocks past the real tile count do nothing. So a one-token step is captured into the CUDA graph like
 * a dense one. Every launch goes through the model's table (dev_moe_* / their host twins host_moe_*): a host model
 * (qsc_host_model_create) runs the same grouping and products on the CPU.
 *
 * Four parts, one file:
 *   1. (every includer) the router math and the expert views as __host__ __device__ / host functions, and the
 *      host check of the group (moe_check, called by check_model);
 *   2. (QSC_MOE_KERNELS, after qsc_kernels.cuh and qsc_fast.cuh) the per-layer device state and the kernels;
 *   3. (QSC_MOE_ENQUEUE, inside qsc_device.cu where qsc_model and the launch table are known) scratch, the
 *      launches and their host twins, enqueue_moe;
 *   4. (QSC_MOE_ENTRY) the one-layer entry points for tests (device and host) and the grouping's own. */

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

/* The CPU's selection loop picks, for j = 0..k-1, best = the first index not yet taken, replaced by each later
 * free e with p[e] > p[best]: the first free index when its value is a NaN, otherwise the lowest index of the
 * largest non-NaN free value. Here in 32 lanes (k_moe_route: a warp per token): lane l scans e = l, l + 32, ...
 * (moe_pick_lane: its first free index and its lowest-index largest non-NaN value), and the lanes' partials combine
 * to that same index (moe_pick_combine). */
struct MoePick {
    int ff, bi; /* the lane's first free index, its best non-NaN one (-1: none) */
    float bv;
};
HD MoePick moe_pick_lane(const float *p, int n, const int32_t *sel, int j, int lane) {
    MoePick r = {-1, -1, 0.0f};
    for (int e = lane; e < n; e += 32) {
        bool taken = false;
        for (int i = 0; i < j; ++i) taken |= sel[i] == e;
        if (taken) continue;
        if (r.ff < 0) r.ff = e;
        const float v = p[e];
        if (v == v && (r.bi < 0 || v > r.bv)) {
            r.bi = e;
            r.bv = v;
        }
    }
    return r;
}
HD int moe_pick_combine(const MoePick *lanes, const float *p) {
    int f = -1, bi = -1;
    float bv = 0.0f;
    for (int l = 0; l < 32; ++l)
        if (lanes[l].ff >= 0 && (f < 0 || lanes[l].ff < f)) f = lanes[l].ff;
    if (f < 0 || p[f] != p[f]) return f;
    for (int l = 0; l < 32; ++l) {
        const MoePick &c = lanes[l];
        if (c.bi >= 0 && (bi < 0 || c.bv > bv || (c.bv == bv && c.bi < bi))) {
            bi = c.bi;
            bv = c.bv;
        }
    }
    return bi;
}

/* The k largest of p[0..n) into sel[0..k), largest first; on equal values the lower index first (and a NaN is
 * never larger: the first free index stands), exactly the CPU's selection loop, by the lanes' partials (the
 * kernel's arithmetic, one lane after another). */
HD void moe_topk(const float *p, int n, int k, int32_t *sel) {
    MoePick lanes[32];
    for (int j = 0; j < k; ++j) {
        for (int l = 0; l < 32; ++l) lanes[l] = moe_pick_lane(p, n, sel, j, l);
        sel[j] = moe_pick_combine(lanes, p);
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
        /* a shared expert of a width not a multiple of 32 (qwen35moe's fixture: 48): F32/F16 sh_down rows are padded
         * with zeros on upload (moe_upload), as gemma4's per-layer projection */
        const int es = m.w->type == T_F32 ? 4 : m.w->type == T_F16 ? 2 : 0;
        const bool padded = i == 3 && FS % 32 && es && m.w->ptr && m.w->rows == E && m.w->k == FS &&
                            m.w->bytes == E * FS * es;
        if (!padded && !weight_ok(*m.w, m.rows, m.k)) {
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

/* The routing grouped by expert, in device memory (written by k_moe_group / its host twin, read by every later
 * MoE launch; nothing comes back to the host). For P = T * K (token, slot) pairs p = t * K + j:
 *   pairs[P]     the pairs sorted by expert, each expert's in token order (the CPU block's order): sorted row r
 *                of every expert buffer (hb, g, u, a, ob) belongs to pair pairs[r];
 *   trow[P]      trow[t * K + i]: the sorted row of token t's i-th pair in ascending expert order (the combine's
 *                order of addition, the CPU's);
 *   off[NE + 1]  the exclusive scan of the per-expert counts (off[NE] = P);
 *   tiles[3 * n] (expert, first sorted row, rows <= tw) per tile of tw rows of one expert, by expert; n_tiles[0]
 *                of them. A grouped product's launch has moe_max_tiles(P, NE, tw) blocks in y: those past
 *                n_tiles do nothing. */
struct MoeGroup {
    int32_t *pairs, *trow, *off, *tiles, *n_tiles;
};

/* The most tiles P pairs over NE experts make at tw rows a tile: sum over the non-empty experts of
 * ceil(n_e / tw) <= (P + min(NE, P) * (tw - 1)) / tw (tw 1: P). */
static inline int moe_max_tiles(int P, int NE, int tw) {
    const int64_t nz = NE < P ? NE : P;
    return (int)(((int64_t)P + nz * (tw - 1)) / tw);
}

/* One product of a grouped launch (gate, up or down over every picked expert): w is expert 0's view of the stacked
 * tensor (rows: one expert's), es[] the bytes from one expert to the next in each section; a the activations of
 * the sorted rows (column r: sorted row r); y[r * ldy + row] (+ bias[e * bias_es + row]). */
struct MoeSeg {
    QW w;
    int64_t es[4];
    Act a;
    float *y;
    int64_t ldy;
    const float *bias;
    int64_t bias_es;
    int blk0, k256, gemv; /* first blockIdx.x; activations in 256-blocks; decode lanes of k_gemv (device only) */
};
struct MoeArgs {
    MoeSeg seg[2];
    int nseg;
    const int32_t *tiles, *n_tiles;
};

/* Expert e's view of a segment's stacked tensor. */
HD QW moe_expert_w(const MoeSeg &s, int64_t e) {
    QW v = s.w;
    v.qs += e * s.es[0];
    v.qh += e * s.es[1];
    v.sc += e * s.es[2];
    v.d = (const __half *)((const uint8_t *)s.w.d + e * s.es[3]);
    return v;
}

/* The activations from column c on (act_view's shift, for the formats of a k256 or 32-block type). */
HD Act moe_act_col(const Act &a, int64_t c, int k256) {
    Act r = a;
    r.qs += c * a.k;
    r.d += c * (k256 ? a.k / 256 : a.k / 32);
    if (r.s) r.s += c * (a.k / 32);
    if (r.bs) r.bs += c * (a.k / 16);
    if (r.f) r.f += c * a.k;
    return r;
}

constexpr int MOE_ROUTE_WARPS = 4;

/* Routing, a warp per token: logits [T][NE] (probabilities afterwards) -> sel, w [T][K]; moe_route's arithmetic
 * (the max over the lanes is exact, the exponentials per element, the double sum in index order by lane 0, the
 * top k by the lanes' partials of moe_topk, the weights by lane 0). */
__global__ void __launch_bounds__(MOE_ROUTE_WARPS * 32) k_moe_route(float *__restrict__ logits, int T, int NE, int K,
                                                                    int norm, float scale, int32_t *__restrict__ sel,
                                                                    float *__restrict__ w) {
    __shared__ MoePick picks[MOE_ROUTE_WARPS][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t t = (int64_t)blockIdx.x * MOE_ROUTE_WARPS + warp;
    if (t >= T) return; /* whole warp */
    float *v = logits + t * NE;
    int32_t *st = sel + t * K;
    float mx = -INFINITY; /* (a NaN is never larger, as moe_softmax's loop) */
    for (int i = lane; i < NE; i += 32) mx = v[i] > mx ? v[i] : mx;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float x = __shfl_xor_sync(0xffffffffu, mx, o);
        mx = x > mx ? x : mx;
    }
    if (mx == -INFINITY) {
        for (int i = lane; i < NE; i += 32) v[i] = 0.0f;
    } else {
        for (int i = lane; i < NE; i += 32) v[i] = expf(v[i] - mx);
        __syncwarp();
        float inv = 0.0f;
        if (lane == 0) {
            double sum = 0.0;
            for (int i = 0; i < NE; ++i) sum += v[i];
            inv = (float)(1.0 / sum);
        }
        inv = __shfl_sync(0xffffffffu, inv, 0);
        for (int i = lane; i < NE; i += 32) v[i] *= inv;
    }
    __syncwarp();
    for (int j = 0; j < K; ++j) {
        picks[warp][lane] = moe_pick_lane(v, NE, st, j, lane);
        __syncwarp();
        if (lane == 0) st[j] = moe_pick_combine(picks[warp], v);
        __syncwarp();
    }
    if (lane == 0) moe_weights(v, st, K, norm, scale, w + t * K);
}

constexpr int MOE_GROUP_THREADS = 1024;

/* The grouping (MoeGroup) of the P pairs' experts sel[P], one block of MOE_GROUP_THREADS; dynamic shared memory
 * 2 * (NE + 1) ints. A warp per expert counts its pairs with ballots (stable: 32 pairs at a time, in order), one
 * thread scans the counts, and each warp writes its expert's pairs, trow entries and tiles. A pair whose expert is
 * out of range (never: the top-k always picks one) is left out. */
__global__ void __launch_bounds__(MOE_GROUP_THREADS) k_moe_group(const int32_t *__restrict__ sel, int P, int K, int NE,
                                                                  int tw, MoeGroup g) {
    extern __shared__ int smem[];
    int *soff = smem, *stile = smem + NE + 1;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int e = warp; e < NE; e += nw) {
        int c = 0;
        for (int i0 = 0; i0 < P; i0 += 32) {
            const int i = i0 + lane;
            c += __popc(__ballot_sync(0xffffffffu, i < P && sel[i] == e));
        }
        if (lane == 0) soff[e] = c;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int s = 0, nt = 0;
        for (int e = 0; e < NE; ++e) {
            const int c = soff[e];
            soff[e] = s;
            stile[e] = nt;
            g.off[e] = s;
            s += c;
            nt += (c + tw - 1) / tw;
        }
        soff[NE] = s;
        g.off[NE] = s;
        g.n_tiles[0] = nt;
    }
    __syncthreads();
    for (int e = warp; e < NE; e += nw) {
        int base = soff[e];
        for (int i0 = 0; i0 < P; i0 += 32) {
            const int i = i0 + lane;
            const bool hit = i < P && sel[i] == e;
            const unsigned mask = __ballot_sync(0xffffffffu, hit);
            if (hit) {
                const int r = base + __popc(mask & ((1u << lane) - 1u)), t = i / K;
                g.pairs[r] = i;
                int rank = 0;
                for (int j = 0; j < K; ++j) rank += sel[t * K + j] < e;
                g.trow[t * K + rank] = r;
            }
            base += __popc(mask);
        }
        const int n = soff[e + 1] - soff[e];
        for (int j = lane; j * tw < n; j += 32) {
            const int ti = stile[e] + j;
            g.tiles[3 * ti] = e;
            g.tiles[3 * ti + 1] = soff[e] + j * tw;
            g.tiles[3 * ti + 2] = n - j * tw < tw ? n - j * tw : tw;
        }
    }
}

/* Sorted row i of hb = row pairs[i] / K of h, then hb's row into the int8 formats in ao. One block per row (P
 * blocks; a row whose pair is out of range does nothing). */
__global__ void __launch_bounds__(256) k_moe_gather(const float *__restrict__ h, const int32_t *__restrict__ pairs,
                                                    int K, int P, float *__restrict__ hb, const ActOut ao, int E) {
    const int64_t i = blockIdx.x, p = pairs[i];
    if (p < 0 || p >= P) return;
    const int64_t t = p / K;
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

/* The grouped product of every picked expert, k_matmul's warps (NC columns of a tile at a time) or, NC = 1 with
 * seg.gemv, k_gemv's batched lanes: blockIdx.x a block of MM_WARPS rows of a segment, blockIdx.y a tile. */
template <int NC>
__global__ void __launch_bounds__(MM_WARPS * 32) k_moe_matmul(const __grid_constant__ MoeArgs args) {
    const int tile = blockIdx.y;
    if (tile >= *args.n_tiles) return;
    const int bx = blockIdx.x;
    const MoeSeg &s = args.seg[args.nseg > 1 && bx >= args.seg[1].blk0 ? 1 : 0];
    const int64_t row = (int64_t)(bx - s.blk0) * MM_WARPS + (threadIdx.x >> 5);
    if (row >= s.w.rows) return; /* whole warp */
    const int e = args.tiles[3 * tile], r0 = args.tiles[3 * tile + 1], n = args.tiles[3 * tile + 2];
    const QW w = moe_expert_w(s, e);
    const float b = s.bias ? s.bias[(int64_t)e * s.bias_es + row] : 0.0f;
    const int lane = threadIdx.x & 31;
    if (NC == 1 && s.gemv) {
        float acc = gemv_lane_any<GEMV_BATCH>(w, row, moe_act_col(s.a, r0, s.k256), lane);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) s.y[(int64_t)r0 * s.ldy + row] = acc + b;
        return;
    }
    for (int c0 = 0; c0 < n; c0 += NC) {
        const int nc = n - c0 < NC ? n - c0 : NC;
        float acc[NC];
#pragma unroll
        for (int c = 0; c < NC; ++c) acc[c] = 0.0f;
        switch (w.type) { /* warp-uniform branch */
#define QSC_MOE_MM_CASE(T) case T: warp_row_dot<T, NC>(w, row, s.a, (int64_t)r0 + c0, nc, acc); break;
            QSC_FOR_TYPES(QSC_MOE_MM_CASE)
#undef QSC_MOE_MM_CASE
        default: break;
        }
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            const float v = warp_sum(acc[c]);
            if (lane == 0 && c < nc) s.y[((int64_t)r0 + c0 + c) * s.ldy + row] = v + b;
        }
    }
}

/* The grouped product on the tensor cores (prefill, tiles of MMA_BN rows): mma_block per (row block, tile). */
__global__ void __launch_bounds__(MMA_THREADS) k_moe_mma(const __grid_constant__ MoeArgs args) {
#if !defined(QSC_NO_MMA) && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800)
    __shared__ MmaSmem sm;
    const int tile = blockIdx.y;
    if (tile >= *args.n_tiles) return; /* block-uniform, before any barrier */
    const int bx = blockIdx.x;
    const MoeSeg &s = args.seg[args.nseg > 1 && bx >= args.seg[1].blk0 ? 1 : 0];
    const int e = args.tiles[3 * tile], r0 = args.tiles[3 * tile + 1], n = args.tiles[3 * tile + 2];
    MmaSeg sg;
    sg.w = moe_expert_w(s, e);
    sg.a = s.a;
    sg.y = s.y;
    sg.ldy = s.ldy;
    sg.bias = s.bias ? s.bias + (int64_t)e * s.bias_es : nullptr;
    sg.blk0 = s.blk0;
    const int64_t row0 = (int64_t)(bx - s.blk0) * MMA_BM;
    switch (sg.w.type) { /* block-uniform */
#define QSC_MOE_MMA_CASE(T) case T: mma_block<T>(sg, row0, r0, n, sm); break;
        QSC_FOR_MMA_TYPES(QSC_MOE_MMA_CASE)
#undef QSC_MOE_MMA_CASE
    default: break;
    }
#endif
}

/* out[t] = the sum over token t's pairs in ascending expert order of w[pair] * ob[its sorted row], from 0 (the CPU
 * block's order of addition). One block per token. */
__global__ void __launch_bounds__(256) k_moe_combine(const float *__restrict__ ob, const MoeGroup g, int K,
                                                     const float *__restrict__ w, float *__restrict__ out, int E) {
    const int64_t t = blockIdx.x;
    for (int c = threadIdx.x; c < E; c += blockDim.x) {
        float acc = 0.0f;
        for (int i = 0; i < K; ++i) {
            const int64_t r = g.trow[t * K + i];
            acc = moe_madd(acc, w[g.pairs[r]], ob[r * E + c]);
        }
        out[t * E + c] = acc;
    }
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

/* Scratch of the moe layers, sized for mb tokens, K picks and the largest group (allocated by moe_finalize):
 * per sorted row (P = mb * K of them) the gathered input hb, gate / up / activation g u a, the expert's output ob
 * and their int8 copies; the grouping; the shared expert's [mb] rows. */
struct MoeScratch {
    int64_t ne = 0, k = 0, fs = 0, kmax = 0;
    float *logits = nullptr, *wsel = nullptr, *hb = nullptr, *ob = nullptr, *g = nullptr, *u = nullptr, *a = nullptr;
    float *sg = nullptr, *su = nullptr, *sa = nullptr, *so = nullptr;
    int32_t *sel = nullptr;
    MoeGroup grp = {};
    int8_t *qs32 = nullptr, *qs256 = nullptr;
    float *d32 = nullptr, *s32 = nullptr, *d256 = nullptr;
    int *bs256 = nullptr;
};

#endif /* QSC_MOE_KERNELS */

/* ================================================================================================ 3. enqueue */
#if defined(QSC_MOE_ENQUEUE) && !defined(QSC_MOE_ENQUEUE_DONE)
#define QSC_MOE_ENQUEUE_DONE

extern "C" { /* (qsc_device.cu defines them inside its C API block) */
static int upload_matrix(qsc_model *m, const qs_weight &w, DevMat *dm, const char *what, char *err, size_t err_len);
static int upload_matrix_padded(qsc_model *m, const qs_weight &w, int64_t k_pad, DevMat *dm, const char *what,
                                char *err, size_t err_len);
static int upload_vector(qsc_model *m, const qs_vec &v, float **dst, char *err, size_t err_len);
}

/* Layer li's moe group onto the device (the stacked experts go up as its ffn gate / up / down). A shared expert of
 * FS not a multiple of 32 runs FS rounded up: sh_gate / sh_up with zero rows appended (their outputs 0 there, so
 * SwiGLU's too), sh_down (F32 / F16, moe_check) with zero columns. */
static int moe_upload(qsc_model *m, const qs_block &b, Layer &L, int li, char *err, size_t err_len) {
    MoeMat mm[4];
    MoeVec mv[5];
    int nv = 0, nm = moe_parts(b, L.moe, mm, mv, &nv);
    const int64_t FS = b.moe.n_ff_shexp, FSp = (FS + 31) / 32 * 32;
    L.moe.n_ff_shexp = (int)FSp;
    char what[64];
    for (int j = 0; j < nm; ++j) {
        snprintf(what, sizeof what, "layer %d: %s", li, mm[j].name);
        const qs_weight &w = *mm[j].w;
        int rc;
        if (FSp != FS && mm[j].dm == &L.moe.sh_down) {
            rc = upload_matrix_padded(m, w, FSp, mm[j].dm, what, err, err_len);
        } else if (FSp != FS && mm[j].dm != &L.moe.router) {
            std::vector<uint8_t> rows((size_t)(w.bytes / w.rows * FSp), 0);
            memcpy(rows.data(), w.ptr, (size_t)w.bytes);
            qs_weight pw = w;
            pw.ptr = rows.data();
            pw.rows = FSp;
            pw.bytes = (int64_t)rows.size();
            rc = upload_matrix(m, pw, mm[j].dm, what, err, err_len);
        } else {
            rc = upload_matrix(m, w, mm[j].dm, what, err, err_len);
        }
        if (rc) return rc;
    }
    for (int j = 0; j < nv; ++j) {
        int rc = upload_vector(m, *mv[j].v, mv[j].dst, err, err_len);
        if (rc) return rc;
    }
    return 0;
}

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
    const int64_t T = m->mb, P = T * s.k, E = m->cfg.E, F = m->cfg.max_f, FS = s.fs;
    int64_t kmax = E > F ? E : F;
    kmax = kmax > FS ? kmax : FS;
    s.kmax = kmax;
    MoeGroup &g = s.grp;
    int rc = 0;
    rc = rc ? rc : dalloc_t(m, &s.logits, T * s.ne, err, err_len);
    rc = rc ? rc : dalloc_t(m, &s.wsel, P, err, err_len);
    rc = rc ? rc : dalloc_t(m, &s.sel, P, err, err_len);
    rc = rc ? rc : dalloc_t(m, &g.pairs, P, err, err_len);
    rc = rc ? rc : dalloc_t(m, &g.trow, P, err, err_len);
    rc = rc ? rc : dalloc_t(m, &g.off, s.ne + 1, err, err_len);
    rc = rc ? rc : dalloc_t(m, &g.tiles, 3 * P, err, err_len); /* moe_max_tiles(P, NE, tw) <= P */
    rc = rc ? rc : dalloc_t(m, &g.n_tiles, 1, err, err_len);
    rc = rc ? rc : dalloc_t(m, &s.hb, P * E, err, err_len);
    rc = rc ? rc : dalloc_t(m, &s.ob, P * E, err, err_len);
    rc = rc ? rc : dalloc_t(m, &s.g, P * F, err, err_len);
    rc = rc ? rc : dalloc_t(m, &s.u, P * F, err, err_len);
    rc = rc ? rc : dalloc_t(m, &s.a, P * F, err, err_len);
    if (FS) {
        rc = rc ? rc : dalloc_t(m, &s.sg, T * FS, err, err_len);
        rc = rc ? rc : dalloc_t(m, &s.su, T * FS, err, err_len);
        rc = rc ? rc : dalloc_t(m, &s.sa, T * FS, err, err_len);
        rc = rc ? rc : dalloc_t(m, &s.so, T * E, err, err_len);
    }
    rc = rc ? rc : dalloc_t(m, &s.qs32, P * kmax, err, err_len);
    rc = rc ? rc : dalloc_t(m, &s.qs256, P * kmax, err, err_len);
    rc = rc ? rc : dalloc_t(m, &s.d32, P * kmax / 32, err, err_len);
    rc = rc ? rc : dalloc_t(m, &s.s32, P * kmax / 32, err, err_len);
    rc = rc ? rc : dalloc_t(m, &s.d256, P * kmax / 256 + 1, err, err_len);
    rc = rc ? rc : dalloc_t(m, &s.bs256, P * kmax / 16, err, err_len);
    return rc;
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

/* A grouped product's segment over the stacked tensor W of `rows` rows per expert (host: the type table). */
static MoeSeg moe_seg(const QW &W, int64_t rows, const Act &a, float *y, int64_t ldy, const float *bias) {
    const QW v0 = expert_view(W, 0, rows), v1 = expert_view(W, 1, rows);
    MoeSeg s = {};
    s.w = v0;
    s.es[0] = v1.qs - v0.qs;
    s.es[1] = v1.qh - v0.qh;
    s.es[2] = v1.sc - v0.sc;
    s.es[3] = (const uint8_t *)v1.d - (const uint8_t *)v0.d;
    s.a = a;
    s.y = y;
    s.ldy = ldy;
    s.bias = bias;
    s.bias_es = rows;
    s.k256 = type_act(W.type) == ACT_256;
    return s;
}

/* Rows per tile of a layer's grouping for T tokens, one decision for the device and the host twins: 1 for decode
 * (the grouped GEMV: a tile per picked expert), MMA_BN (the tensor-core tiles) where an expert matrix has an MMA
 * decode and the experts get MMA_MIN_COLS rows each on average (T * K >= MMA_MIN_COLS * NE: fewer would mostly fill
 * 64-row tiles with nothing), 8 (k_matmul<8>'s columns) otherwise. A first guess, not yet tuned on a GPU. */
static int moe_tile_width(const Layer &L, int T) {
    if (T == 1) return 1;
    const QW *ws[3] = {&L.gate.w, &L.up.w, &L.down.w};
    bool mma = false;
    for (const QW *w : ws) mma |= mma_type_ok(w->type, w->k);
    return mma && (int64_t)T * L.moe.n_used >= (int64_t)MMA_MIN_COLS * L.moe.n_expert ? MMA_BN : 8;
}

/* -------------------------------------------------------------------------- the launches and their host twins */
static void dev_moe_route(qsc_model *m, float *logits, int T, int NE, int K, int norm, float scale, int32_t *sel,
                          float *w) {
    k_moe_route<<<(T + MOE_ROUTE_WARPS - 1) / MOE_ROUTE_WARPS, MOE_ROUTE_WARPS * 32, 0, m->st>>>(logits, T, NE, K, norm,
                                                                                                 scale, sel, w);
    QSC_DBG(m->st, "k_moe_route", (T + MOE_ROUTE_WARPS - 1) / MOE_ROUTE_WARPS, MOE_ROUTE_WARPS * 32,
            "tokens %d, experts %d, used %d", T, NE, K);
}
static void dev_moe_group(qsc_model *m, const int32_t *sel, int P, int K, int NE, int tw, const MoeGroup &g) {
    k_moe_group<<<1, MOE_GROUP_THREADS, (size_t)(2 * (NE + 1)) * sizeof(int), m->st>>>(sel, P, K, NE, tw, g);
    QSC_DBG(m->st, "k_moe_group", 1, MOE_GROUP_THREADS, "pairs %d, experts %d, tile %d", P, NE, tw);
}
static void dev_moe_gather(qsc_model *m, const float *h, const int32_t *pairs, int K, int P, float *hb,
                           const ActOut &ao, int E) {
    k_moe_gather<<<P, 256, 0, m->st>>>(h, pairs, K, P, hb, ao, E);
    QSC_DBG(m->st, "k_moe_gather", P, 256, "pairs %d, n %d", P, E);
}
static void dev_moe_glu(qsc_model *m, const float *g, const float *u, float *a, const ActOut &ao, int rows, int n,
                        int oai) {
    k_moe_glu<<<rows, 256, 0, m->st>>>(g, u, a, ao, n, oai);
    QSC_DBG(m->st, "k_moe_glu", rows, 256, "rows %d, n %d", rows, n);
}
/* One grouped product over max_tiles tiles of tw rows: k_moe_matmul<1> for decode (k_gemv's lanes where the types
 * have them), k_moe_mma for MMA_BN-row tiles of MMA types on an sm_80+ device, k_moe_matmul<8> otherwise. */
static void dev_moe_matmul(qsc_model *m, const MoeArgs &in, int max_tiles, int tw) {
    const bool gemv_on = m->fast.gemv; /* the model's switches (qsc_fast.cuh), as its dense products */
    MoeArgs args = in;
    bool mma = tw == MMA_BN;
    for (int i = 0; i < args.nseg; ++i) {
        args.seg[i].gemv = tw == 1 && gemv_on && gemv_type_ok(args.seg[i].w.type);
        mma = mma && mma_type_ok(args.seg[i].w.type, args.seg[i].w.k);
    }
    mma = mma && m->fast.mma;
    const int per = mma ? MMA_BM : MM_WARPS;
    int blocks = 0;
    for (int i = 0; i < args.nseg; ++i) {
        args.seg[i].blk0 = blocks;
        blocks += (int)((args.seg[i].w.rows + per - 1) / per);
    }
    const dim3 grid((unsigned)blocks, (unsigned)max_tiles);
    if (mma) {
        k_moe_mma<<<grid, MMA_THREADS, 0, m->st>>>(args);
        QSC_DBG(m->st, "k_moe_mma", grid, MMA_THREADS, "segments %d, tiles %d", args.nseg, max_tiles);
    } else if (tw == 1) {
        k_moe_matmul<1><<<grid, MM_WARPS * 32, 0, m->st>>>(args);
        QSC_DBG(m->st, "k_moe_matmul<1>", grid, MM_WARPS * 32, "segments %d, tiles %d", args.nseg, max_tiles);
    } else {
        k_moe_matmul<8><<<grid, MM_WARPS * 32, 0, m->st>>>(args);
        QSC_DBG(m->st, "k_moe_matmul<8>", grid, MM_WARPS * 32, "segments %d, tiles %d", args.nseg, max_tiles);
    }
}
static void dev_moe_combine(qsc_model *m, const float *ob, const MoeGroup &g, int K, const float *w, float *out,
                            int T, int E) {
    k_moe_combine<<<T, 256, 0, m->st>>>(ob, g, K, w, out, E);
    QSC_DBG(m->st, "k_moe_combine", T, 256, "tokens %d, n %d", T, E);
}
static void dev_moe_shared_add(qsc_model *m, const float *h, const float *gate_inp, const float *so, float *out,
                               int T, int E) {
    k_moe_shared_add<<<T, 256, 0, m->st>>>(h, gate_inp, so, out, E);
    QSC_DBG(m->st, "k_moe_shared_add", T, 256, "tokens %d, n %d", T, E);
}

static void host_moe_route(qsc_model *m, float *logits, int T, int NE, int K, int norm, float scale, int32_t *sel,
                           float *w) {
    (void)m;
    for (int t = 0; t < T; ++t)
        moe_route(logits + (int64_t)t * NE, NE, K, norm, scale, sel + (int64_t)t * K, w + (int64_t)t * K);
}
/* k_moe_group's result, serially: a stable counting sort by expert. */
static void emu_moe_group(const int32_t *sel, int P, int K, int NE, int tw, const MoeGroup &g) {
    std::vector<int> fill((size_t)NE + 1, 0), tile0((size_t)NE + 1, 0);
    for (int i = 0; i < P; ++i)
        if (sel[i] >= 0 && sel[i] < NE) fill[(size_t)sel[i]]++;
    int s = 0, nt = 0;
    for (int e = 0; e < NE; ++e) {
        const int c = fill[(size_t)e];
        g.off[e] = fill[(size_t)e] = s;
        tile0[(size_t)e] = nt;
        s += c;
        nt += (c + tw - 1) / tw;
    }
    g.off[NE] = s;
    g.n_tiles[0] = nt;
    for (int i = 0; i < P; ++i) {
        const int e = sel[i];
        if (e < 0 || e >= NE) continue;
        const int r = fill[(size_t)e]++, t = i / K;
        g.pairs[r] = i;
        int rank = 0;
        for (int j = 0; j < K; ++j) rank += sel[t * K + j] < e;
        g.trow[t * K + rank] = r;
    }
    for (int e = 0; e < NE; ++e) {
        const int n = g.off[e + 1] - g.off[e];
        for (int j = 0; j * tw < n; ++j) {
            const int ti = tile0[(size_t)e] + j;
            g.tiles[3 * ti] = e;
            g.tiles[3 * ti + 1] = g.off[e] + j * tw;
            g.tiles[3 * ti + 2] = n - j * tw < tw ? n - j * tw : tw;
        }
    }
}
static void host_moe_group(qsc_model *m, const int32_t *sel, int P, int K, int NE, int tw, const MoeGroup &g) {
    (void)m;
    emu_moe_group(sel, P, K, NE, tw, g);
}
static void host_moe_gather(qsc_model *m, const float *h, const int32_t *pairs, int K, int P, float *hb,
                            const ActOut &ao, int E) {
    (void)m;
    for (int i = 0; i < P; ++i) {
        const int p = pairs[i];
        if (p < 0 || p >= P) continue;
        memcpy(hb + (int64_t)i * E, h + (int64_t)(p / K) * E, (size_t)E * sizeof(float));
        ActOut o = ao; /* row i's blocks */
        if (o.qs32) { o.qs32 += (int64_t)i * E; o.d32 += (int64_t)i * (E / 32); o.s32 += (int64_t)i * (E / 32); }
        if (o.qs256) { o.qs256 += (int64_t)i * E; o.d256 += (int64_t)i * (E / 256); o.bs256 += (int64_t)i * (E / 16); }
        emu_quantize(hb + (int64_t)i * E, o, 1, E);
    }
}
static void host_moe_glu(qsc_model *m, const float *g, const float *u, float *a, const ActOut &ao, int rows, int n,
                         int oai) {
    (void)m;
    for (int64_t i = 0; i < (int64_t)rows * n; ++i) a[i] = oai ? moe_swiglu_oai(g[i], u[i]) : moe_silu_mul(g[i], u[i]);
    emu_quantize(a, ao, rows, n);
}
static void host_moe_matmul(qsc_model *m, const MoeArgs &args, int max_tiles, int tw) {
    (void)m;
    (void)tw;
    const int nt = *args.n_tiles < max_tiles ? *args.n_tiles : max_tiles;
    for (int ti = 0; ti < nt; ++ti) {
        const int e = args.tiles[3 * ti], r0 = args.tiles[3 * ti + 1], n = args.tiles[3 * ti + 2];
        for (int i = 0; i < args.nseg; ++i) {
            const MoeSeg &s = args.seg[i];
            emu_matmul(moe_expert_w(s, e), moe_act_col(s.a, r0, s.k256), s.y + (int64_t)r0 * s.ldy, s.ldy,
                       s.bias ? s.bias + (int64_t)e * s.bias_es : nullptr, n);
        }
    }
}
static void host_moe_combine(qsc_model *m, const float *ob, const MoeGroup &g, int K, const float *w, float *out,
                             int T, int E) {
    (void)m;
    for (int64_t t = 0; t < T; ++t)
        for (int c = 0; c < E; ++c) {
            float acc = 0.0f;
            for (int i = 0; i < K; ++i) {
                const int64_t r = g.trow[t * K + i];
                acc = moe_madd(acc, w[g.pairs[r]], ob[r * E + c]);
            }
            out[t * E + c] = acc;
        }
}
static void host_moe_shared_add(qsc_model *m, const float *h, const float *gate_inp, const float *so, float *out,
                                int T, int E) {
    (void)m;
    for (int64_t t = 0; t < T; ++t) {
        float z = 0.0f; /* (block_sum's order differs: a few ulps in the gate) */
        for (int c = 0; c < E; ++c) z += h[t * E + c] * gate_inp[c];
        const float wt = 1.0f / (1.0f + expf(-z));
        for (int c = 0; c < E; ++c) out[t * E + c] = moe_madd(out[t * E + c], wt, so[t * E + c]);
    }
}

/* The moe FFN of m->h (T rows, quantized per moe_input_formats) into m->o, through the model's launch table: the
 * router's product, the routing and its grouping on the device (no copy to the host, no synchronization: a
 * one-token step is captured into the CUDA graph like a dense layer's), the shared expert, the picked rows
 * gathered, one grouped launch for every expert's gate and up and one for down (sizes from device memory, grids
 * for the worst case), SwiGLU between, then each token's experts added in the CPU's order. */
static int enqueue_moe(qsc_model *m, const Layer &L, int T, char *err, size_t err_len) {
    (void)err;
    (void)err_len;
    const Launch &op = *m->ops;
    const MoeLayer &ml = L.moe;
    MoeScratch &s = m->moe_s;
    const int E = m->cfg.E, F = L.F, NE = ml.n_expert, K = ml.n_used, FS = ml.n_ff_shexp, P = T * K;
    MatJob rj = {&ml.router.w, act_view(m, ml.router.w.type, m->h, E, 0), s.logits, NE, ml.b_router};
    op.matmul(m, &rj, 1, T);
    op.moe_route(m, s.logits, T, NE, K, ml.norm, ml.scale, s.sel, s.wsel);
    const int tw = moe_tile_width(L, T), max_tiles = moe_max_tiles(P, NE, tw);
    op.moe_group(m, s.sel, P, K, NE, tw, s.grp);
    if (FS) { /* the shared expert: it reads m->h's int8 copies; its down product is done before the gather below
                 reuses the moe int8 buffers */
        const QW &g = ml.sh_gate.w, &u = ml.sh_up.w, &d = ml.sh_down.w;
        MatJob gu[2] = {{&g, act_view(m, g.type, m->h, E, 0), s.sg, FS, nullptr},
                        {&u, act_view(m, u.type, m->h, E, 0), s.su, FS, nullptr}};
        op.matmul(m, gu, 2, T);
        op.moe_glu(m, s.sg, s.su, s.sa, moe_act_out(s, {d.type}), T, FS, 0);
        MatJob dj = {&d, moe_act(s, d.type, s.sa, FS), s.so, E, nullptr};
        op.matmul(m, &dj, 1, T);
    }
    const QW &G = L.gate.w, &U = L.up.w, &D = L.down.w;
    op.moe_gather(m, m->h, s.grp.pairs, K, P, s.hb, moe_act_out(s, {G.type, U.type}), E);
    MoeArgs gu = {};
    gu.seg[0] = moe_seg(G, F, moe_act(s, G.type, s.hb, E), s.g, F, ml.b_gate);
    gu.seg[1] = moe_seg(U, F, moe_act(s, U.type, s.hb, E), s.u, F, ml.b_up);
    gu.nseg = 2;
    gu.tiles = s.grp.tiles;
    gu.n_tiles = s.grp.n_tiles;
    op.moe_matmul(m, gu, max_tiles, tw);
    op.moe_glu(m, s.g, s.u, s.a, moe_act_out(s, {D.type}), P, F, ml.oai);
    MoeArgs dn = {};
    dn.seg[0] = moe_seg(D, E, moe_act(s, D.type, s.a, F), s.ob, E, ml.b_down);
    dn.nseg = 1;
    dn.tiles = s.grp.tiles;
    dn.n_tiles = s.grp.n_tiles;
    op.moe_matmul(m, dn, max_tiles, tw);
    op.moe_combine(m, s.ob, s.grp, K, s.wsel, m->o, T, E);
    if (FS) op.moe_shared_add(m, m->h, ml.sh_gate_inp, s.so, m->o, T, E);
    return 0;
}

#endif /* QSC_MOE_ENQUEUE */

/* ================================================================================= 4. single-layer test entry */
#if defined(QSC_MOE_ENTRY) && !defined(QSC_MOE_ENTRY_DONE)
#define QSC_MOE_ENTRY_DONE

/* One layer's moe FFN of h [n_tokens][n_embd] (enqueue_moe on a one-layer model holding only the layer's moe
 * group) on the device, or with `host` through the host twins (HOST_LAUNCH, host memory): the same grouping and
 * grouped products. Checked before any device call. */
static int moe_ffn_layer(const qs_block *b, const float *h, int n_tokens, float *out, bool host, char *err,
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
    m->host = host;
    m->ops = host ? &HOST_LAUNCH : &DEVICE_LAUNCH;
    m->layers.resize(1);
    if (!host) {
        CUDA_TRY(cudaSetDevice(m->device));
        CUDA_TRY(cudaStreamCreateWithFlags(&m->st, cudaStreamNonBlocking));
    }
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
    int rc = moe_upload(m, *b, L, 0, err, err_len);
    if (rc) return rc;
    rc = finalize(m, err, err_len);
    if (rc) return rc;
    const int T = n_tokens;
    const size_t bytes = (size_t)T * E * sizeof(float);
    if (host) {
        memcpy(m->h, h, bytes);
        emu_quantize(m->h, moe_input_formats(m, L.moe), T, (int)E);
        rc = enqueue_moe(m, L, T, err, err_len);
        if (!rc) memcpy(out, m->o, bytes);
        return rc;
    }
    CUDA_TRY(cudaMemcpyAsync(m->h, h, bytes, cudaMemcpyHostToDevice, m->st));
    k_quantize<<<T, 256, 0, m->st>>>(m->h, moe_input_formats(m, L.moe), (int)E);
    QSC_DBG(m->st, "k_quantize", T, 256, "rows %d, n %d", T, (int)E);
    rc = enqueue_moe(m, L, T, err, err_len);
    if (rc) return rc;
    CUDA_TRY(cudaGetLastError());
    CUDA_TRY(cudaMemcpyAsync(out, m->o, bytes, cudaMemcpyDeviceToHost, m->st));
    CUDA_TRY(cudaStreamSynchronize(m->st));
    return 0;
}

/* The grouping's arguments against its buffers' sizes (pairs/trow n_tokens * n_used, off n_expert + 1, tiles
 * 3 * n_tokens * n_used). */
static bool moe_group_args_ok(const int32_t *sel, int n_tokens, int n_used, int n_expert, int tw, char *err,
                              size_t err_len) {
    if (!sel || n_tokens <= 0 || n_tokens > 4096 || n_expert <= 0 || n_expert > QSC_MOE_MAX_EXPERTS || n_used < 1 ||
        n_used > n_expert || tw < 1 || tw > 256) {
        set_err(err, err_len, "no selection, or n_tokens %d / n_expert %d / n_used %d / tile %d out of range",
                n_tokens, n_expert, n_used, tw);
        return false;
    }
    for (int t = 0; t < n_tokens; ++t)
        for (int j = 0; j < n_used; ++j) {
            const int e = sel[t * n_used + j];
            bool dup = false;
            for (int i = 0; i < j; ++i) dup |= sel[t * n_used + i] == e;
            if (e < 0 || e >= n_expert || dup) {
                set_err(err, err_len, "token %d: slot %d picks expert %d (out of range or twice)", t, j, e);
                return false;
            }
        }
    return true;
}

extern "C" {

int qsc_kernel_moe_ffn(const qs_block *b, const float *h, int n_tokens, float *out, char *err, size_t err_len) {
    return moe_ffn_layer(b, h, n_tokens, out, false, err, err_len);
}

int qsc_host_moe_ffn(const qs_block *b, const float *h, int n_tokens, float *out, char *err, size_t err_len) {
    return moe_ffn_layer(b, h, n_tokens, out, true, err, err_len);
}

int qsc_host_moe_group(const int32_t *sel, int n_tokens, int n_used, int n_expert, int tile, int32_t *pairs,
                       int32_t *trow, int32_t *off, int32_t *tiles, int32_t *n_tiles, char *err, size_t err_len) {
    if (!moe_group_args_ok(sel, n_tokens, n_used, n_expert, tile, err, err_len)) return -1;
    const MoeGroup g = {pairs, trow, off, tiles, n_tiles};
    emu_moe_group(sel, n_tokens * n_used, n_used, n_expert, tile, g);
    return 0;
}

int qsc_kernel_moe_group(const int32_t *sel, int n_tokens, int n_used, int n_expert, int tile, int32_t *pairs,
                         int32_t *trow, int32_t *off, int32_t *tiles, int32_t *n_tiles, char *err, size_t err_len) {
    if (!moe_group_args_ok(sel, n_tokens, n_used, n_expert, tile, err, err_len)) return -1;
    const int P = n_tokens * n_used;
    Scratch s;
    int32_t *dsel;
    MoeGroup g;
    CUDA_TRY(s.put(&dsel, sel, P));
    CUDA_TRY(s.get(&g.pairs, P));
    CUDA_TRY(s.get(&g.trow, P));
    CUDA_TRY(s.get(&g.off, n_expert + 1));
    CUDA_TRY(s.get(&g.tiles, 3 * P));
    CUDA_TRY(s.get(&g.n_tiles, 1));
    k_moe_group<<<1, MOE_GROUP_THREADS, (size_t)(2 * (n_expert + 1)) * sizeof(int)>>>(dsel, P, n_used, n_expert,
                                                                                         tile, g);
    QSC_DBG(0, "k_moe_group", 1, MOE_GROUP_THREADS, "pairs %d, experts %d, tile %d", P, n_expert, tile);
    CUDA_TRY(cudaGetLastError());
    CUDA_TRY(cudaMemcpy(n_tiles, g.n_tiles, sizeof(int32_t), cudaMemcpyDeviceToHost));
    CUDA_TRY(cudaMemcpy(pairs, g.pairs, (size_t)P * sizeof(int32_t), cudaMemcpyDeviceToHost));
    CUDA_TRY(cudaMemcpy(trow, g.trow, (size_t)P * sizeof(int32_t), cudaMemcpyDeviceToHost));
    CUDA_TRY(cudaMemcpy(off, g.off, (size_t)(n_expert + 1) * sizeof(int32_t), cudaMemcpyDeviceToHost));
    CUDA_TRY(cudaMemcpy(tiles, g.tiles, (size_t)(3 * *n_tiles) * sizeof(int32_t), cudaMemcpyDeviceToHost));
    return 0;
}

} /* extern "C" */

#endif /* QSC_MOE_ENTRY */
