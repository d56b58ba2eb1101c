/* Flash-decoding: attention for decode (T <= FD_MAX_T query tokens) with the cache's key range split across blocks.
 *
 * k_attention runs one block per (query head, token): at depth each block walks n_kv keys alone (a warp per key),
 * H blocks in all, and every key row is read once per query head. Here a block takes one (KV head, split, token) and
 * the G = H / KV query heads of the group together (up to FdShape::GB of them; more heads: more blocks), so a key
 * and value row is read once for the group, with 16-byte loads (F16 and F32 caches), and the visible range
 * [lo, hi] of the token (causal, sliding window) is cut into n_split chunks handled by n_split blocks:
 *
 *   k_fdec        per block: the group's queries into shared memory; tiles of BK keys: K and V rows -> shared
 *                 (floats), scores (one thread per (head, key): scale, soft-cap), the tile's max per head, weights
 *                 p = exp(s - m), then acc = alpha acc + sum_j p_j V_j (a thread per 4 elements of a head), l too;
 *                 the block's partial (acc, m, l) per head to the scratch [T][H][n_split][hd + 2];
 *   k_fdec_merge  per (head, token): M = max(m_s, sink), f_s = exp(m_s - M), L = sum_s l_s f_s (+ exp(sink - M)),
 *                 out = sum_s f_s acc_s / L, splits in order; then the output's int8 blocks for the next product
 *                 (ActOut) as k_attention does (blocks inside a head; otherwise k_quantize after).
 *
 * Graph-safe: n_kv and the positions are read from device memory; the split count is fixed when the launch is
 * made, from the context size, the group count and the SM count (fd_splits), never from n_kv; each split's chunk
 * is ceil(visible / n_split) rounded up to FD_ALIGN keys, so at a shallow depth the later splits find nothing and
 * write an empty partial (m = -inf, l = 0) that the merge skips.
 *
 * Every step is a __host__ __device__ function of (tid, nthr) between two barriers, written once: the device kernel
 * calls it with its thread index, the host twin (emu_flashdec: a host model's forward and qsc_host_flashdec) with
 * every tid in turn, so the host runs the same tiles, partials and merge order (dots and sums as fmaf, in the same
 * order; only expf / tanhf may differ in the last bits).
 *
 * Sections, each compiled once however often the file is included: 1. the shared part (always): shapes, the split
 * bookkeeping, FdArgs, the steps, the choice (fd_use) and the host twin's prototype; QSC_FD_KERNELS: the kernels and
 * launch_flashdec (qsc_device.cu, after qsc_kernels.cuh); QSC_FD_HOST: the host twin and qsc_host_flashdec (end of
 * qsc_host.cu); QSC_FD_ENTRY: qsc_kernel_flashdec (end of qsc_device.cu, after Scratch).
 *
 * QUANTSCOPE_CUDA_FLASHDEC=0 in the environment (read once per process) keeps k_attention for decode, in both the
 * device's and the host model's launch tables. */
#include <stdlib.h>
#include <string.h>

#include "qsc_common.cuh"
#include "qsc_flash.cuh" /* fa_lo, fa_hi, fa_score, fa_alpha, fa_p: the recurrence's pieces, shared with prefill */

#ifndef QSC_FD_MATH
#define QSC_FD_MATH

/* FD_MAX_T: the most query tokens a call takes (prefill's k_flash starts at 16); FD_THREADS per block; split count
 * at most FD_MAX_SPLIT, and T * n_split at most FD_MAX_PARTS (the scratch's bound); a split covers at least
 * FD_SPLIT_KEYS positions of the full context; FD_BLOCKS_PER_SM blocks per SM wanted; the host model counts as a GPU
 * of FD_HOST_SMS SMs (an H100's 132), so it splits as the device does. */
constexpr int FD_MAX_T = 15, FD_THREADS = 128, FD_MAX_SPLIT = 128, FD_MAX_PARTS = 128, FD_SPLIT_KEYS = 128,
              FD_ALIGN = 32, FD_BLOCKS_PER_SM = 4, FD_HOST_SMS = 132;

/* Per largest head size of an instantiation (64, 128, 256, 512, 1024): keys per tile BK, query heads per block GB,
 * outputs per thread NACC (in groups of 4 consecutive elements of a head); shared memory stays near 40 KB. */
template <int HMAX> struct FdShape {
    static constexpr int BK = HMAX <= 64 ? 64 : 4096 / HMAX;
    static constexpr int GB = HMAX <= 256 ? 8 : 2048 / HMAX;
    static constexpr int NACC = 4 * ((GB * HMAX / 4 + FD_THREADS - 1) / FD_THREADS);
};

HD int fd_hmax(int hd) { return hd <= 64 ? 64 : hd <= 128 ? 128 : hd <= 256 ? 256 : hd <= 512 ? 512 : 1024; }
HD int fd_gb(int hd) {
    switch (fd_hmax(hd)) {
    case 64: return FdShape<64>::GB;
    case 128: return FdShape<128>::GB;
    case 256: return FdShape<256>::GB;
    case 512: return FdShape<512>::GB;
    default: return FdShape<1024>::GB;
    }
}

/* Head sizes the 16-byte loads take: a row of hd elements is a whole number of 16-byte chunks. */
HD bool fd_shape_ok(int hd, int kv_f16) { return hd > 0 && hd <= QSC_MAX_HEAD && hd % (kv_f16 ? 8 : 4) == 0; }

/* The split count for T tokens of a layer (KV heads, G query heads per KV head, head size hd) in a context of n_ctx
 * positions on n_sm SMs: enough blocks for FD_BLOCKS_PER_SM per SM, within the bounds above. */
HD int fd_splits(int T, int n_ctx, int KV, int G, int hd, int n_sm) {
    const int gb = fd_gb(hd), n_gb = (G + gb - 1) / gb;
    const int64_t blocks = (int64_t)KV * n_gb * T;
    const int64_t want = ((int64_t)FD_BLOCKS_PER_SM * (n_sm > 0 ? n_sm : 1) + blocks - 1) / blocks;
    int cap = (n_ctx + FD_SPLIT_KEYS - 1) / FD_SPLIT_KEYS;
    cap = cap < FD_MAX_SPLIT ? cap : FD_MAX_SPLIT;
    cap = cap < FD_MAX_PARTS / T ? cap : FD_MAX_PARTS / T;
    cap = cap > 1 ? cap : 1;
    return want < 1 ? 1 : want > cap ? cap : (int)want;
}

struct FdArgs {
    const float *q;     /* [T][H][hd] */
    const int *q_pos;   /* [T] */
    const int *n_kv_p;  /* the cache length, in device memory */
    int T, H, KV, hd, window, n_split;
    float scale, softcap;
    const float *sinks; /* [H] or NULL */
    float *part;        /* [T][H][n_split][hd + 2]: acc[hd], m, l */
    float *out;         /* [T][H][hd] */
};

/* Where a model's flash-decoding runs: its scratch (NULL: none, k_attention), context size and SM count. */
struct FdPlan {
    float *part;
    int n_ctx, n_sm;
};

/* Keys [*lo, *hi] of split s for token t (empty: *lo > *hi). */
HD void fd_range(const FdArgs &a, int t, int s, int n_kv, int *lo, int *hi) {
    const int qp = a.q_pos[t];
    const int L = fa_lo(qp, a.window), H = fa_hi(qp, n_kv);
    if (L > H) {
        *lo = 1;
        *hi = 0;
        return;
    }
    const int n = H - L + 1;
    int chunk = (n + a.n_split - 1) / a.n_split;
    chunk = (chunk + FD_ALIGN - 1) / FD_ALIGN * FD_ALIGN;
    const int64_t l = (int64_t)L + (int64_t)s * chunk;
    *lo = l > H ? H + 1 : (int)l;
    *hi = *lo + chunk - 1 < H ? *lo + chunk - 1 : H;
}

HD float *fd_part(const FdArgs &a, int t, int h, int s) {
    return a.part + (((int64_t)t * a.H + h) * a.n_split + s) * (a.hd + 2);
}

/* 16 bytes of a cache row as floats (8 halves or 4 floats). */
HD int fd_cvt16(const __half *p, float *d) {
    const int4 v = ld_i4(p);
    __half h[8];
    memcpy(h, &v, 16);
#pragma unroll
    for (int i = 0; i < 8; ++i) d[i] = h2f(h[i]);
    return 8;
}
HD int fd_cvt16(const float *p, float *d) {
    const float4 v = ld_f4(p);
    d[0] = v.x;
    d[1] = v.y;
    d[2] = v.z;
    d[3] = v.w;
    return 4;
}

/* 16 bytes of shared memory (the tiles, the queries: every offset a multiple of 4 floats from a 16-byte aligned
 * array; the host checks it, so a misaligned offset fails there before it faults on a GPU). */
HD float4 fd_ld4(const float *p) {
#ifdef __CUDA_ARCH__
    return *(const float4 *)p;
#else
    if ((uintptr_t)p % 16) abort();
    return ld_f4(p);
#endif
}

/* ------------------------------------------------------------------------------------------------ the steps */
/* The gb query rows of heads h0.. of token t (contiguous in q) into sq[gb][hd]. */
HD void fd_load_q(const FdArgs &a, int t, int h0, int gb, float *sq, int tid, int nthr) {
    const float *qt = a.q + ((int64_t)t * a.H + h0) * a.hd;
    for (int i = tid; i < gb * a.hd; i += nthr) sq[i] = qt[i];
}

/* Keys k0 .. k0 + nk - 1 of KV head kvh: K into sk[j][hd + 4] (rows 16-byte aligned, 8 consecutive rows' 16-byte
 * reads in distinct banks), V into sv[j][hd], one 16-byte chunk of the cache per step. */
template <typename KT>
HD void fd_load_tile(const KT *kc, const KT *vc, int KV, int kvh, int hd, int k0, int nk, float *sk, float *sv,
                     int tid, int nthr) {
    constexpr int EPC = 16 / (int)sizeof(KT);
    const int C = hd / EPC;
    for (int idx = tid; idx < nk * C; idx += nthr) {
        const int j = idx / C, e0 = (idx % C) * EPC;
        const int64_t off = ((int64_t)(k0 + j) * KV + kvh) * hd + e0;
        float kf[EPC], vf[EPC];
        fd_cvt16(kc + off, kf);
        fd_cvt16(vc + off, vf);
#pragma unroll
        for (int i = 0; i < EPC; ++i) {
            sk[j * (hd + 4) + e0 + i] = kf[i];
            sv[j * hd + e0 + i] = vf[i];
        }
    }
}

/* ss[g][j] = the scaled, soft-capped score of head g and key j (-inf past nk). */
HD void fd_scores(const float *sq, const float *sk, float *ss, int gb, int hd, int nk, int bk, float scale,
                  float softcap, int tid, int nthr) {
    for (int idx = tid; idx < gb * bk; idx += nthr) {
        const int g = idx / bk, j = idx % bk;
        float s = -INFINITY;
        if (j < nk) {
            float d = 0.0f;
            const float *qg = sq + g * hd, *kj = sk + j * (hd + 4);
            for (int e = 0; e < hd; e += 4) {
                const float4 x = fd_ld4(qg + e), y = fd_ld4(kj + e);
                d = fmaf(x.x, y.x, d);
                d = fmaf(x.y, y.y, d);
                d = fmaf(x.z, y.z, d);
                d = fmaf(x.w, y.w, d);
            }
            s = fa_score(d, scale, softcap);
        }
        ss[idx] = s;
    }
}

/* Head g's running max over the tile: the new max and the rescale of what it accumulated (m: the head's state). */
HD void fd_tile_max(const float *ss_g, int nk, float *m, float *m_new, float *alpha) {
    float mt = -INFINITY;
    for (int j = 0; j < nk; ++j) mt = fmaxf(mt, ss_g[j]);
    const float mn = fmaxf(*m, mt);
    *alpha = fa_alpha(*m, mn);
    *m_new = mn;
    *m = mn;
}

/* Scores -> weights p = exp(s - m_new) in place. */
HD void fd_probs(float *ss, const float *m_new, int gb, int nk, int bk, int tid, int nthr) {
    for (int idx = tid; idx < gb * bk; idx += nthr)
        if (idx % bk < nk) ss[idx] = fa_p(ss[idx], m_new[idx / bk]);
}

/* The thread's outputs: groups o = tid + i nthr of 4 elements (head 4 o / hd, elements 4 o % hd ..),
 * acc = alpha acc + sum_j p_j V_j; the thread of head g = tid < gb also carries that head's sum l. */
template <int NACC>
HD void fd_accum(float *acc, float *l, const float *ss, const float *sv, const float *alpha, int gb, int hd, int nk,
                 int bk, int tid, int nthr) {
#pragma unroll
    for (int i = 0; i < NACC / 4; ++i) {
        const int o = 4 * (tid + i * nthr);
        if (o >= gb * hd) break;
        const int g = o / hd, e = o % hd;
        const float *p = ss + g * bk;
        const float al = alpha[g];
        float x0 = acc[4 * i] * al, x1 = acc[4 * i + 1] * al, x2 = acc[4 * i + 2] * al, x3 = acc[4 * i + 3] * al;
        for (int j = 0; j < nk; ++j) {
            const float pj = p[j];
            const float4 v = fd_ld4(sv + j * hd + e);
            x0 = fmaf(pj, v.x, x0);
            x1 = fmaf(pj, v.y, x1);
            x2 = fmaf(pj, v.z, x2);
            x3 = fmaf(pj, v.w, x3);
        }
        acc[4 * i] = x0;
        acc[4 * i + 1] = x1;
        acc[4 * i + 2] = x2;
        acc[4 * i + 3] = x3;
    }
    if (tid < gb) {
        const float *p = ss + tid * bk;
        float x = *l * alpha[tid];
        for (int j = 0; j < nk; ++j) x += p[j];
        *l = x;
    }
}

/* The block's partial: the thread's outputs, and (thread g < gb) head g's m and l; an empty split (no key: m = -inf)
 * writes m and l only (the merge never reads its outputs). */
template <int NACC>
HD void fd_store(const FdArgs &a, int t, int h0, int s, int gb, bool empty, const float *acc, float m, float l,
                 int tid, int nthr) {
#pragma unroll
    for (int i = 0; i < NACC / 4; ++i) {
        const int o = 4 * (tid + i * nthr);
        if (empty || o >= gb * a.hd) break;
        float *p = fd_part(a, t, h0 + o / a.hd, s) + o % a.hd;
        for (int k = 0; k < 4; ++k) p[k] = acc[4 * i + k];
    }
    if (tid < gb) {
        float *p = fd_part(a, t, h0 + tid, s);
        p[a.hd] = m;
        p[a.hd + 1] = l;
    }
}

/* The merge of head h of token t, from its splits' m[s] and l[s] (loaded side by side): the max M (the sink
 * included), each split's factor f = exp(m - M) (0 for an empty split), and L = sum_s l_s f_s (+ exp(sink - M)). */
HD float fd_merge_max(const float *m, int n, const float *sinks, int h) {
    float M = sinks ? sinks[h] : -INFINITY;
    for (int s = 0; s < n; ++s) M = fmaxf(M, m[s]);
    return M;
}
HD float fd_merge_factor(float m, float M) { return m == -INFINITY ? 0.0f : expf(m - M); }
HD float fd_merge_sum(const float *l, const float *f, int n, const float *sinks, int h, float M) {
    float L = sinks ? expf(sinks[h] - M) : 0.0f;
    for (int s = 0; s < n; ++s) L = fmaf(l[s], f[s], L);
    return L;
}

/* Element e of head h's output (splits in order; an empty split's acc was never written: skipped). */
HD float fd_merge_elem(const FdArgs &a, int t, int h, int e, const float *f, float L) {
    float o = 0.0f;
    for (int s = 0; s < a.n_split; ++s)
        if (f[s] != 0.0f) o = fmaf(fd_part(a, t, h, s)[e], f[s], o);
    return L > 0.0f ? o / L : 0.0f;
}

/* ------------------------------------------------------------------------------------------------ the choice */
static inline bool fd_enabled() {
    static const bool on = [] {
        const char *e = getenv("QUANTSCOPE_CUDA_FLASHDEC");
        return !(e && e[0] == '0' && e[1] == '\0');
    }();
    return on;
}

/* Flash-decoding for this call (both launch tables ask it): a few tokens, a head the 16-byte loads take, scratch. */
static inline bool fd_use(int T, const AttnArgs &A, int kv_f16, const FdPlan &p) {
    return p.part && T >= 1 && T <= FD_MAX_T && A.KV > 0 && A.H % A.KV == 0 && fd_shape_ok(A.hd, kv_f16) &&
           fd_enabled();
}

static inline FdArgs fd_args(const AttnArgs &A, const FdPlan &p, int T, const float *q, const int *pos,
                             const int *nkv, float *out) {
    FdArgs a;
    a.q = q;
    a.q_pos = pos;
    a.n_kv_p = nkv;
    a.T = T;
    a.H = A.H;
    a.KV = A.KV;
    a.hd = A.hd;
    a.window = A.window;
    a.n_split = fd_splits(T, p.n_ctx, A.KV, A.H / A.KV, A.hd, p.n_sm);
    a.scale = A.scale;
    a.softcap = A.softcap;
    a.sinks = A.sinks;
    a.part = p.part;
    a.out = out;
    return a;
}

/* The scratch floats of a model (qsc_device.cu's finalize; core/engine/cuda_fit.py counts the same): T * n_split <=
 * FD_MAX_PARTS partials of every head of the widest layer (hw = max over layers of H (hd + 2)), whatever the context
 * and the batch. */
static inline int64_t fd_scratch_floats(int64_t hw) { return (int64_t)FD_MAX_PARTS * hw; }

/* The host twin (QSC_FD_HOST, compiled in qsc_host.cu): the kernels' blocks one by one, then the merge. */
void emu_flashdec(const FdArgs &a, int kv_f16, const void *kc, const void *vc);

#endif /* QSC_FD_MATH */

/* ================================================================================================ device kernels */
#if defined(QSC_FD_KERNELS) && !defined(QSC_FD_KERNELS_DONE)
#define QSC_FD_KERNELS_DONE

/* Block (split blockIdx.x, KV head and head chunk blockIdx.y, token blockIdx.z). */
template <int HMAX, typename KT>
__global__ void __launch_bounds__(FD_THREADS) k_fdec(const FdArgs a, const KT *__restrict__ kc,
                                                     const KT *__restrict__ vc) {
    using S = FdShape<HMAX>;
    constexpr int BK = S::BK, GB = S::GB, NACC = S::NACC;
    __shared__ __align__(16) float sk[BK * (HMAX + 4)];
    __shared__ __align__(16) float sv[BK * HMAX];
    __shared__ __align__(16) float sq[GB * HMAX];
    __shared__ float ss[GB * BK], smn[GB], sal[GB];
    const int tid = threadIdx.x, s = blockIdx.x, t = blockIdx.z, hd = a.hd;
    const int G = a.H / a.KV, n_gb = (G + GB - 1) / GB;
    const int kvh = blockIdx.y / n_gb, gc = blockIdx.y % n_gb;
    const int h0 = kvh * G + gc * GB, gb = min(GB, G - gc * GB);
    int lo, hi;
    fd_range(a, t, s, *a.n_kv_p, &lo, &hi);
    if (lo <= hi) fd_load_q(a, t, h0, gb, sq, tid, FD_THREADS);
    float acc[NACC];
#pragma unroll
    for (int i = 0; i < NACC; ++i) acc[i] = 0.0f;
    float m = -INFINITY, l = 0.0f; /* head tid's (tid < gb) */
    for (int k0 = lo; k0 <= hi; k0 += BK) {
        const int nk = min(BK, hi - k0 + 1);
        __syncthreads(); /* the previous tile is used up (and sq is written, the first time) */
        fd_load_tile<KT>(kc, vc, a.KV, kvh, hd, k0, nk, sk, sv, tid, FD_THREADS);
        __syncthreads();
        fd_scores(sq, sk, ss, gb, hd, nk, BK, a.scale, a.softcap, tid, FD_THREADS);
        __syncthreads();
        if (tid < gb) fd_tile_max(ss + tid * BK, nk, &m, &smn[tid], &sal[tid]);
        __syncthreads();
        fd_probs(ss, smn, gb, nk, BK, tid, FD_THREADS);
        __syncthreads();
        fd_accum<NACC>(acc, &l, ss, sv, sal, gb, hd, nk, BK, tid, FD_THREADS);
    }
    fd_store<NACC>(a, t, h0, s, gb, lo > hi, acc, m, l, tid, FD_THREADS);
}

/* Block (head blockIdx.x, token blockIdx.y): the splits' partials merged, the output written and, when asked (ao,
 * int8 blocks inside a head), quantized for the next product as k_attention does. */
__global__ void __launch_bounds__(FD_THREADS) k_fdec_merge(const FdArgs a, const ActOut ao) {
    __shared__ float sm[FD_MAX_SPLIT], sl[FD_MAX_SPLIT], sf[FD_MAX_SPLIT], sm_out[QSC_MAX_HEAD];
    const int h = blockIdx.x, t = blockIdx.y, hd = a.hd, n = a.n_split;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    constexpr int NW = FD_THREADS / 32;
    for (int s = threadIdx.x; s < n; s += FD_THREADS) { /* the splits' m and l, loaded side by side */
        const float *p = fd_part(a, t, h, s);
        sm[s] = p[hd];
        sl[s] = p[hd + 1];
    }
    __syncthreads();
    const float M = fd_merge_max(sm, n, a.sinks, h); /* every thread, the same */
    for (int s = threadIdx.x; s < n; s += FD_THREADS) sf[s] = fd_merge_factor(sm[s], M);
    __syncthreads();
    const float L = fd_merge_sum(sl, sf, n, a.sinks, h, M);
    for (int e = threadIdx.x; e < hd; e += FD_THREADS) {
        const float r = fd_merge_elem(a, t, h, e, sf, L);
        a.out[((int64_t)t * a.H + h) * hd + e] = r;
        sm_out[e] = r;
    }
    if (!ao.qs32 && !ao.qs256) return;
    __syncthreads();
    quant_head_row<NW>(sm_out, ((int64_t)t * a.H + h) * hd, hd, ao, warp, lane); /* as k_attention */
}

/* The two launches (and k_quantize when the int8 blocks straddle heads); the caller checked fd_use. */
static void launch_flashdec(const FdArgs &a, int kv_f16, const void *kc, const void *vc, const ActOut &ao,
                            cudaStream_t st) {
    const int G = a.H / a.KV, gb = fd_gb(a.hd);
    const dim3 grid((unsigned)a.n_split, (unsigned)(a.KV * ((G + gb - 1) / gb)), (unsigned)a.T);
#define QSC_FD(HM)                                                                                                \
    case HM:                                                                                                      \
        if (kv_f16) k_fdec<HM, __half><<<grid, FD_THREADS, 0, st>>>(a, (const __half *)kc, (const __half *)vc);   \
        else k_fdec<HM, float><<<grid, FD_THREADS, 0, st>>>(a, (const float *)kc, (const float *)vc);             \
        QSC_DBG(st, kv_f16 ? "k_fdec<" #HM ", half>" : "k_fdec<" #HM ", float>", grid, FD_THREADS,                \
                "tokens %d, heads %d/%d, head_dim %d, splits %d", a.T, a.H, a.KV, a.hd, a.n_split);             \
        break;
    switch (fd_hmax(a.hd)) {
        QSC_FD(64) QSC_FD(128) QSC_FD(256) QSC_FD(512) QSC_FD(1024)
    default: break;
    }
#undef QSC_FD
    const bool fused = (!ao.qs32 || a.hd % 32 == 0) && (!ao.qs256 || a.hd % 256 == 0);
    k_fdec_merge<<<dim3((unsigned)a.H, (unsigned)a.T), FD_THREADS, 0, st>>>(a, fused ? ao : ActOut{});
    QSC_DBG(st, "k_fdec_merge", dim3((unsigned)a.H, (unsigned)a.T), FD_THREADS, "tokens %d, heads %d, splits %d", a.T,
            a.H, a.n_split);
    if (!fused && (ao.qs32 || ao.qs256)) {
        k_quantize<<<a.T, 256, 0, st>>>(a.out, ao, a.H * a.hd);
        QSC_DBG(st, "k_quantize", a.T, 256, "rows %d, n %d", a.T, a.H * a.hd);
    }
}

#endif /* QSC_FD_KERNELS */

/* ================================================================================================ host twin */
#if defined(QSC_FD_HOST) && !defined(QSC_FD_HOST_DONE)
#define QSC_FD_HOST_DONE

#include <vector>

/* k_fdec's blocks one after another, each step for every tid in turn (the barriers between them), then
 * k_fdec_merge's blocks. */
template <int HMAX, typename KT> static void fd_host(const FdArgs &a, const KT *kc, const KT *vc) {
    using S = FdShape<HMAX>;
    constexpr int BK = S::BK, GB = S::GB, NACC = S::NACC, NT = FD_THREADS;
    std::vector<float> sk(BK * (HMAX + 4)), sv(BK * HMAX), sq(GB * HMAX), ss(GB * BK), smn(GB), sal(GB);
    std::vector<float> acc((size_t)NT * NACC), m(GB), l(GB);
    const int n_kv = *a.n_kv_p, hd = a.hd, G = a.H / a.KV, n_gb = (G + GB - 1) / GB;
    for (int t = 0; t < a.T; ++t)
        for (int y = 0; y < a.KV * n_gb; ++y)
            for (int s = 0; s < a.n_split; ++s) {
                const int kvh = y / n_gb, gc = y % n_gb;
                const int h0 = kvh * G + gc * GB, gb = GB < G - gc * GB ? GB : G - gc * GB;
                int lo, hi;
                fd_range(a, t, s, n_kv, &lo, &hi);
                for (int tid = 0; tid < NT; ++tid) fd_load_q(a, t, h0, gb, sq.data(), tid, NT);
                for (float &x : acc) x = 0.0f;
                for (int g = 0; g < GB; ++g) {
                    m[g] = -INFINITY;
                    l[g] = 0.0f;
                }
                for (int k0 = lo; k0 <= hi; k0 += BK) {
                    const int nk = BK < hi - k0 + 1 ? BK : hi - k0 + 1;
                    for (int tid = 0; tid < NT; ++tid)
                        fd_load_tile<KT>(kc, vc, a.KV, kvh, hd, k0, nk, sk.data(), sv.data(), tid, NT);
                    for (int tid = 0; tid < NT; ++tid)
                        fd_scores(sq.data(), sk.data(), ss.data(), gb, hd, nk, BK, a.scale, a.softcap, tid, NT);
                    for (int g = 0; g < gb; ++g) fd_tile_max(ss.data() + g * BK, nk, &m[g], &smn[g], &sal[g]);
                    for (int tid = 0; tid < NT; ++tid) fd_probs(ss.data(), smn.data(), gb, nk, BK, tid, NT);
                    for (int tid = 0; tid < NT; ++tid)
                        fd_accum<NACC>(acc.data() + (size_t)tid * NACC, tid < GB ? &l[tid] : nullptr, ss.data(),
                                       sv.data(), sal.data(), gb, hd, nk, BK, tid, NT);
                }
                for (int tid = 0; tid < NT; ++tid)
                    fd_store<NACC>(a, t, h0, s, gb, lo > hi, acc.data() + (size_t)tid * NACC, tid < GB ? m[tid] : 0.0f,
                                   tid < GB ? l[tid] : 0.0f, tid, NT);
            }
    const int n = a.n_split;
    std::vector<float> f((size_t)n), mm((size_t)n), ll((size_t)n);
    for (int t = 0; t < a.T; ++t)
        for (int h = 0; h < a.H; ++h) {
            for (int s = 0; s < n; ++s) {
                mm[s] = fd_part(a, t, h, s)[hd];
                ll[s] = fd_part(a, t, h, s)[hd + 1];
            }
            const float M = fd_merge_max(mm.data(), n, a.sinks, h);
            for (int s = 0; s < n; ++s) f[s] = fd_merge_factor(mm[s], M);
            const float L = fd_merge_sum(ll.data(), f.data(), n, a.sinks, h, M);
            for (int e = 0; e < hd; ++e)
                a.out[((int64_t)t * a.H + h) * hd + e] = fd_merge_elem(a, t, h, e, f.data(), L);
        }
}

void emu_flashdec(const FdArgs &a, int kv_f16, const void *kc, const void *vc) {
#define QSC_FDH(HM)                                                                                               \
    case HM:                                                                                                      \
        if (kv_f16) fd_host<HM, __half>(a, (const __half *)kc, (const __half *)vc);                              \
        else fd_host<HM, float>(a, (const float *)kc, (const float *)vc);                                        \
        break;
    switch (fd_hmax(a.hd)) {
        QSC_FDH(64) QSC_FDH(128) QSC_FDH(256) QSC_FDH(512) QSC_FDH(1024)
    default: break;
    }
#undef QSC_FDH
}

/* The arguments of both test entry points, checked; *n_split resolved (<= 0: fd_splits with n_kv as the context and
 * n_sm SMs). */
static bool fd_entry_ok(int n_q, const int32_t *q_pos, int n_heads, int head_dim, int kv_f16, int n_kv_heads,
                        int n_kv, int window, float softcap, int n_sm, int *n_split) {
    if (n_q <= 0 || n_q > FD_MAX_T || n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads ||
        !fd_shape_ok(head_dim, kv_f16) || n_kv <= 0 || window < 0 || !(softcap >= 0.0f) || *n_split > FD_MAX_SPLIT)
        return false;
    for (int i = 0; i < n_q; ++i)
        if (q_pos[i] < 0) return false;
    if (*n_split <= 0) *n_split = fd_splits(n_q, n_kv, n_kv_heads, n_heads / n_kv_heads, head_dim, n_sm);
    return true;
}

extern "C" int qsc_host_flashdec(const float *q, int n_q, const int32_t *q_pos, int n_heads, int head_dim,
                                 const void *k_cache, const void *v_cache, int kv_f16, int n_kv_heads, int n_kv,
                                 int window, float scale, float softcap, const float *sinks, int n_split, float *out) {
    if (!fd_entry_ok(n_q, q_pos, n_heads, head_dim, kv_f16, n_kv_heads, n_kv, window, softcap, FD_HOST_SMS, &n_split))
        return -1;
    std::vector<float> part((size_t)n_q * n_heads * n_split * (head_dim + 2), NAN); /* unwritten: NaN */
    FdArgs a = {q, (const int *)q_pos, &n_kv, n_q, n_heads, n_kv_heads, head_dim, window, n_split, scale, softcap,
                sinks, part.data(), out};
    emu_flashdec(a, kv_f16, k_cache, v_cache);
    return n_split;
}

#endif /* QSC_FD_HOST */

/* ================================================================================================ device entry */
#if defined(QSC_FD_ENTRY) && !defined(QSC_FD_ENTRY_DONE)
#define QSC_FD_ENTRY_DONE

extern "C" int qsc_kernel_flashdec(const float *q, int n_q, const int32_t *q_pos, int n_heads, int head_dim,
                                   const void *k_cache, const void *v_cache, int kv_f16, int n_kv_heads, int n_kv,
                                   int window, float scale, float softcap, const float *sinks, int n_split,
                                   float *out, char *err, size_t err_len) {
    int dev = 0, n_sm = 0;
    CUDA_TRY(cudaGetDevice(&dev));
    CUDA_TRY(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
    bool ok = n_q > 0 && n_q <= FD_MAX_T && n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0 &&
              fd_shape_ok(head_dim, kv_f16) && n_kv > 0 && window >= 0 && softcap >= 0.0f && n_split <= FD_MAX_SPLIT;
    for (int i = 0; ok && i < n_q; ++i) ok = q_pos[i] >= 0;
    if (!ok) {
        set_err(err, err_len, "bad shape (tokens 1..%d, head size a multiple of 16 bytes up to %d, splits <= %d)",
                FD_MAX_T, QSC_MAX_HEAD, FD_MAX_SPLIT);
        return -1;
    }
    if (n_split <= 0) n_split = fd_splits(n_q, n_kv, n_kv_heads, n_heads / n_kv_heads, head_dim, n_sm);
    Scratch s;
    float *dq, *dout, *dsinks = nullptr, *dpart;
    int *dpos, *dnkv;
    uint8_t *dk, *dv;
    const int64_t kv_bytes = (int64_t)n_kv * n_kv_heads * head_dim * (kv_f16 ? 2 : 4);
    const int64_t nq = (int64_t)n_q * n_heads * head_dim;
    CUDA_TRY(s.put(&dq, q, nq));
    CUDA_TRY(s.put(&dpos, (const int *)q_pos, n_q));
    CUDA_TRY(s.put(&dnkv, &n_kv, 1));
    CUDA_TRY(s.put(&dk, (const uint8_t *)k_cache, kv_bytes));
    CUDA_TRY(s.put(&dv, (const uint8_t *)v_cache, kv_bytes));
    if (sinks) CUDA_TRY(s.put(&dsinks, sinks, n_heads));
    CUDA_TRY(s.get(&dout, nq));
    CUDA_TRY(s.get(&dpart, (int64_t)n_q * n_heads * n_split * (head_dim + 2)));
    CUDA_TRY(cudaMemset(dpart, 0xFF, (size_t)n_q * n_heads * n_split * (head_dim + 2) * sizeof(float))); /* NaN */
    const FdArgs a = {dq, dpos, dnkv, n_q, n_heads, n_kv_heads, head_dim, window, n_split, scale, softcap, dsinks,
                      dpart, dout};
    launch_flashdec(a, kv_f16, dk, dv, ActOut{}, 0);
    CUDA_TRY(cudaGetLastError());
    CUDA_TRY(cudaMemcpy(out, dout, (size_t)nq * sizeof(float), cudaMemcpyDeviceToHost));
    return n_split;
}

#endif /* QSC_FD_ENTRY */
