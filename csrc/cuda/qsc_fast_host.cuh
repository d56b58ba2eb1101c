/* Host emulation of the fast paths (qsc_fast.cuh), included at the end of qsc_host.cu: the int8 MMA tile loop with
 * the fragment layouts of qsc_mma.cuh, flash attention with the recurrence of qsc_flash.cuh, the decode GEMV's lanes
 * (qsc_gemv.cuh), and k_attention's algorithm as it is today (per-warp online softmax over keys taken round-robin,
 * merged at the end), run on the CPU for tests/test_cuda_mma.py, test_cuda_flash.py and test_cuda_gemv.py. Declared
 * in those tests, not in qsc_api.h: test entry points of this library, not part of the backend's API. */
#include <memory>

#include "qsc_flash.cuh"
#include "qsc_gemv.cuh"
#include "qsc_mma.cuh"

/* The block's work, block by block: every "thread" loads its share, then every warp runs mma_stage with all 32
 * lanes' state (LANES = 32), then the stores. */
template <int TYPE> static void host_mma_mm(const QW &w, const Act &a, int n_x, float *y) {
    std::unique_ptr<MmaSmem> sp(new MmaSmem());
    MmaSmem &s = *sp;
    memset(&s, 0xFF, sizeof s); /* shared memory starts as garbage: NaN floats, -1 bytes, so a read of a field no
                                   load wrote shows in the results */
    constexpr int NW = MMA_THREADS / 32;
    std::vector<MmaLane> lanes(NW * 32);
    for (int64_t row0 = 0; row0 < w.rows; row0 += MMA_BM)
        for (int col0 = 0; col0 < n_x; col0 += MMA_BN) {
            const int ncols = n_x - col0 < MMA_BN ? n_x - col0 : MMA_BN;
            MmaLane(*st)[32] = (MmaLane(*)[32])lanes.data();
            for (int wi = 0; wi < NW; ++wi) mma_zero<32>(st[wi]);
            for (int kb = 0; kb < (int)(w.k / MMA_KT); ++kb) {
                for (int tid = 0; tid < MMA_THREADS; ++tid) {
                    mma_load_w<TYPE>(w, row0, kb, s, tid, MMA_THREADS);
                    mma_load_x<MmaTraits<TYPE>::K256>(a, col0, ncols, kb, s, tid, MMA_THREADS);
                }
                for (int wi = 0; wi < NW; ++wi) mma_stage<TYPE, 32>(s, wi, 0, st[wi]);
            }
            for (int wi = 0; wi < NW; ++wi) mma_store<32>(st[wi], wi, 0, row0, col0, w.rows, ncols, y, w.rows, nullptr);
        }
}

template <int EPL, typename KT> static void host_flash(const FaArgs &a, const KT *kc, const KT *vc) {
    constexpr int HDIM = 32 * EPL;
    std::vector<float> sk(FA_BKV * (HDIM + 1)), sv(FA_BKV * HDIM), sq(HDIM);
    const int n_kv = *a.n_kv_p;
    const int64_t rows = (int64_t)a.T * (a.H / a.KV);
    for (int kvh = 0; kvh < a.KV; ++kvh)
        for (int bx = 0; bx < (int)((rows + FA_ROWS - 1) / FA_ROWS); ++bx) {
            int lo, hi;
            fa_block_range(a, bx, &lo, &hi);
            std::vector<FaRow<EPL>> st((size_t)FA_ROWS * 32);
            int rt[FA_ROWS], rh[FA_ROWS], rq[FA_ROWS];
            bool rv[FA_ROWS];
            for (int r = 0; r < FA_ROWS; ++r) {
                rv[r] = fa_row(a, bx, kvh, r, &rt[r], &rh[r], &rq[r]);
                fa_row_init<EPL, 32>(*(FaRow<EPL>(*)[32])&st[(size_t)r * 32]);
            }
            for (int k0 = lo; k0 <= hi; k0 += FA_BKV) {
                for (int tid = 0; tid < FA_WARPS * 32; ++tid)
                    fa_load_tile<EPL, KT>(kc, vc, a.KV, kvh, k0, hi, sk.data(), sv.data(), tid, FA_WARPS * 32);
                for (int r = 0; r < FA_ROWS; ++r) { /* row r = warp r / FA_RPW's row r % FA_RPW */
                    if (!rv[r] || k0 > fa_hi(rq[r], n_kv) || k0 + FA_BKV - 1 < fa_lo(rq[r], a.window)) continue;
                    memcpy(sq.data(), a.q + ((int64_t)rt[r] * a.H + rh[r]) * HDIM, HDIM * sizeof(float));
                    fa_row_tile<EPL, 32>(sq.data(), sk.data(), sv.data(), k0, rq[r], n_kv, a.window, a.scale,
                                         a.softcap, 0, *(FaRow<EPL>(*)[32])&st[(size_t)r * 32]);
                }
            }
            for (int r = 0; r < FA_ROWS; ++r)
                if (rv[r]) fa_row_store<EPL, 32>(a, rt[r], rh[r], 0, *(const FaRow<EPL>(*)[32])&st[(size_t)r * 32]);
        }
}

/* k_attention (qsc_kernels.cuh) as it computes: per (token, head), 8 warps take keys lo + w, lo + w + 8, ...; a
 * score is the butterfly sum over lanes of each lane's EPL products; the warps' states are merged at the end. */
template <typename KT>
static void host_kattn(const float *q, int T, const int *q_pos, int H, int KV, int hd, const KT *kc, const KT *vc,
                       int n_kv, int window, float scale, float *out) {
    constexpr int NW = 8;
    const int EPL = hd / 32;
    std::vector<float> acc((size_t)NW * hd);
    for (int t = 0; t < T; ++t)
        for (int h = 0; h < H; ++h) {
            const int kvh = h / (H / KV), qp = q_pos[t];
            const int hi = fa_hi(qp, n_kv), lo = fa_lo(qp, window);
            const float *qv = q + ((int64_t)t * H + h) * hd;
            float m[NW], l[NW];
            for (int w = 0; w < NW; ++w) {
                m[w] = -INFINITY;
                l[w] = 0.0f;
                for (int e = 0; e < hd; ++e) acc[(size_t)w * hd + e] = 0.0f;
                for (int j = lo + w; j <= hi; j += NW) {
                    const int64_t base = ((int64_t)j * KV + kvh) * hd;
                    float part[32];
                    for (int ln = 0; ln < 32; ++ln) {
                        part[ln] = 0.0f;
                        for (int i = 0; i < EPL; ++i)
                            part[ln] += qv[ln * EPL + i] * fa_to_f(kc[base + ln * EPL + i]);
                    }
                    const float s = fa_warp_sum<32>(part) * scale;
                    const float mn = fmaxf(m[w], s);
                    const float alpha = expf(m[w] - mn), p = expf(s - mn);
                    l[w] = l[w] * alpha + p;
                    for (int e = 0; e < hd; ++e)
                        acc[(size_t)w * hd + e] = acc[(size_t)w * hd + e] * alpha + p * fa_to_f(vc[base + e]);
                    m[w] = mn;
                }
            }
            float M = -INFINITY;
            for (int w = 0; w < NW; ++w) M = fmaxf(M, m[w]);
            for (int e = 0; e < hd; ++e) {
                float L = 0.0f, o = 0.0f;
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

static bool attn_shape_ok(int n_q, int n_heads, int head_dim, int n_kv_heads, int n_kv) {
    return n_q > 0 && n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0 && head_dim > 0 &&
           head_dim % 32 == 0 && head_dim <= 256 && n_kv > 0;
}

extern "C" {

/* The fragment layout functions, for the test that checks them against the PTX ISA's table: which = 0..5 for
 * A row, A column, B row, B column, C row, C column of element i of lane `lane`. */
int qsc_host_mma_layout(int which, int lane, int i) {
    switch (which) {
    case 0: return mma_a_row(lane, i);
    case 1: return mma_a_col(lane, i);
    case 2: return mma_b_row(lane, i);
    case 3: return mma_b_col(lane, i);
    case 4: return mma_c_row(lane, i);
    case 5: return mma_c_col(lane, i);
    default: return -1;
    }
}

/* C[j][i] = sum_k A[i][k] B[j][k] (A: m x k, B: n x k int8; m % 16, n % 8, k % ks == 0, ks 16 or 32), 16 x 8 tile
 * by tile, each through the fragment loads and the emulated warp-wide mma. */
int qsc_host_mma_i8(const int8_t *a, const int8_t *b, int m, int n, int k, int ks, int32_t *c) {
    if (m <= 0 || n <= 0 || k <= 0 || m % 16 || n % 8 || (ks != 16 && ks != 32) || k % ks) return -1;
    for (int i0 = 0; i0 < m; i0 += 16)
        for (int j0 = 0; j0 < n; j0 += 8) {
            int acc[32][4] = {};
            for (int k0 = 0; k0 < k; k0 += ks) {
                int fa[32][4] = {}, fb[32][2] = {};
                for (int l = 0; l < 32; ++l) {
                    if (ks == 32) {
                        mma_frag_a<32>(l, a, k, i0, k0, fa[l]);
                        mma_frag_b<32>(l, b, k, j0, k0, fb[l]);
                    } else {
                        mma_frag_a<16>(l, a, k, i0, k0, fa[l]);
                        mma_frag_b<16>(l, b, k, j0, k0, fb[l]);
                    }
                }
                if (ks == 32) mma_tile<32, 32>(fa, fb, acc);
                else mma_tile<16, 32>(fa, fb, acc);
            }
            for (int l = 0; l < 32; ++l)
                for (int i = 0; i < 4; ++i)
                    c[(int64_t)(j0 + mma_c_col(l, i)) * m + i0 + mma_c_row(l, i)] = acc[l][i];
        }
    return 0;
}

/* X W^T through the MMA tile loop (the prefill GEMM); -1 for types / widths that keep k_matmul. */
int qsc_host_matmat_mma(int type, const uint8_t *w, int64_t rows, int64_t k, const float *x, int n_x, float *y) {
    if (n_x <= 0 || !mma_type_ok(type, k)) return -1;
    HostQW q(type, w, rows, k);
    if (!q.ok) return -1;
    HostAct act(x, n_x, k);
    Act a = act.view(type);
    switch (type) {
#define QSC_HOST_MMA(T) case T: host_mma_mm<T>(q.w, a, n_x, y); break;
        QSC_FOR_MMA_TYPES(QSC_HOST_MMA)
#undef QSC_HOST_MMA
    default: return -1;
    }
    return 0;
}

/* Flash attention (k_flash's blocks, tiles and recurrence) on host arrays; head sizes 32..128. */
int qsc_host_flash(const float *q, int n_q, const int32_t *q_pos, int n_heads, int head_dim, const void *k_cache,
                   const void *v_cache, int kv_f16, int n_kv_heads, int n_kv, int window, float scale, float softcap,
                   const float *sinks, float *out) {
    if (!attn_shape_ok(n_q, n_heads, head_dim, n_kv_heads, n_kv) || head_dim > 32 * FA_MAX_EPL) return -1;
    FaArgs a = {q, q_pos, &n_kv, n_q, n_heads, n_kv_heads, window, scale, softcap, sinks, out};
#define QSC_HF(E)                                                                                                 \
    case E:                                                                                                       \
        if (kv_f16) host_flash<E, __half>(a, (const __half *)k_cache, (const __half *)v_cache);                  \
        else host_flash<E, float>(a, (const float *)k_cache, (const float *)v_cache);                            \
        break;
    switch (head_dim / 32) {
        QSC_HF(1) QSC_HF(2) QSC_HF(3) QSC_HF(4)
    default: return -1;
    }
#undef QSC_HF
    return 0;
}

/* k_attention's algorithm on host arrays (the kernel the flash path replaces for prefill). */
int qsc_host_kattn(const float *q, int n_q, const int32_t *q_pos, int n_heads, int head_dim, const void *k_cache,
                   const void *v_cache, int kv_f16, int n_kv_heads, int n_kv, int window, float scale, float *out) {
    if (!attn_shape_ok(n_q, n_heads, head_dim, n_kv_heads, n_kv)) return -1;
    if (kv_f16)
        host_kattn<__half>(q, n_q, q_pos, n_heads, n_kv_heads, head_dim, (const __half *)k_cache,
                           (const __half *)v_cache, n_kv, window, scale, out);
    else
        host_kattn<float>(q, n_q, q_pos, n_heads, n_kv_heads, head_dim, (const float *)k_cache,
                          (const float *)v_cache, n_kv, window, scale, out);
    return 0;
}

/* y = W x (one column) the way k_gemv computes it: each lane's partial with `batch` units' loads at a time (1 is
 * k_matmul<1>'s order), then the warp's butterfly sum. */
int qsc_host_gemv(int type, const uint8_t *w, int64_t rows, int64_t k, const float *x, int batch, float *y) {
    if (!gemv_type_ok(type) || (batch != 1 && batch != GEMV_BATCH)) return -1;
    HostQW q(type, w, rows, k);
    if (!q.ok) return -1;
    HostAct act(x, 1, k);
    Act a = act.view(type);
    for (int64_t r = 0; r < rows; ++r) {
        float part[32];
        for (int l = 0; l < 32; ++l)
            part[l] = batch == 1 ? gemv_lane_any<1>(q.w, r, a, l) : gemv_lane_any<GEMV_BATCH>(q.w, r, a, l);
        y[r] = fa_warp_sum<32>(part);
    }
    return 0;
}

} /* extern "C" */
