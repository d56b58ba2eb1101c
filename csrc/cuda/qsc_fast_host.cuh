/* Host twins of the fast paths (qsc_fast.cuh), included at the end of qsc_host.cu: k_matmul_mma, k_gemv and k_flash
 * as grids of blocks on the CPU - the launchers' segment layout (mma_lay_out, mma_seg_of), each block's loads, the
 * warp code of qsc_mma.cuh / qsc_gemv.cuh / qsc_flash.cuh with all 32 lanes' state, the stores (mma_store's ldy and
 * bias) - which qsc_device.cu's host launch table runs where matmul_path / attention_path choose the fast path (the
 * emulated whole model, qsc_host_model_create), and k_attention's algorithm as it is today (per-warp online softmax
 * over keys taken round-robin, merged at the end). The test entry points below (declared in tests/test_cuda_mma.py,
 * test_cuda_flash.py, test_cuda_gemv.py and test_cuda_paths.py, not in qsc_api.h: not part of the backend's API) run
 * the same twins. */
#include <memory>

#define QSC_FAST_DECISIONS_ONLY
#include "qsc_fast.cuh" /* matmul_path, attention_path: the one dispatch, without the kernels */
#include "qsc_flash.cuh"
#include "qsc_gemv.cuh"
#include "qsc_mma.cuh"

/* One block of k_matmul_mma (its mma_block): every "thread" loads its share of a stage, then every warp runs
 * mma_stage with all 32 lanes' state (LANES = 32), then the stores. */
template <int TYPE>
static void host_mma_block(const MmaSeg &sg, int64_t row0, int64_t col0, int ncols, MmaSmem &s, MmaLane *lanes) {
    constexpr int NW = MMA_THREADS / 32;
    memset(&s, 0xFF, sizeof s); /* shared memory starts as garbage: NaN floats, -1 bytes, so a read of a field no
                                   load wrote shows in the results */
    MmaLane(*st)[32] = (MmaLane(*)[32])lanes;
    for (int wi = 0; wi < NW; ++wi) mma_zero<32>(st[wi]);
    for (int kb = 0; kb < (int)(sg.w.k / MmaTraits<TYPE>::SK); ++kb) {
        for (int tid = 0; tid < MMA_THREADS; ++tid) {
            mma_load_w<TYPE>(sg.w, row0, kb, s, tid, MMA_THREADS);
            mma_load_x<TYPE>(sg.a, col0, ncols, kb, s, tid, MMA_THREADS);
        }
        for (int wi = 0; wi < NW; ++wi) mma_stage<TYPE, 32>(s, wi, 0, st[wi]);
    }
    for (int wi = 0; wi < NW; ++wi) mma_store<32>(st[wi], wi, 0, row0, col0, sg.w.rows, ncols, sg.y, sg.ldy, sg.bias);
}

/* k_matmul_mma's grid: blockIdx.x over the segments' row blocks, blockIdx.y over the 64-column tiles (the last one
 * partial), as launch_matmul_mma lays them out. */
void emu_matmul_mma(MmaArgs args) {
    const int blocks = mma_lay_out(args, MMA_BM), ytiles = (args.ncols + MMA_BN - 1) / MMA_BN;
    std::unique_ptr<MmaSmem> sp(new MmaSmem());
    std::vector<MmaLane> lanes((size_t)(MMA_THREADS / 32) * 32);
    for (int bx = 0; bx < blocks; ++bx)
        for (int by = 0; by < ytiles; ++by) {
            const MmaSeg &sg = args.seg[mma_seg_of(args, bx)];
            const int64_t row0 = (int64_t)(bx - sg.blk0) * MMA_BM, col0 = (int64_t)by * MMA_BN;
            const int ncols = args.ncols - (int)col0 < MMA_BN ? args.ncols - (int)col0 : MMA_BN;
            switch (sg.w.type) {
#define QSC_HOST_MMA(T) case T: host_mma_block<T>(sg, row0, col0, ncols, *sp, lanes.data()); break;
                QSC_FOR_MMA_TYPES(QSC_HOST_MMA)
#undef QSC_HOST_MMA
            default: break;
            }
        }
}

/* k_gemv's grid: GEMV_WARPS rows per block, a row per warp: 32 lanes' partials, the butterfly, lane 0's store. */
void emu_gemv(MmaArgs args) {
    const int blocks = mma_lay_out(args, GEMV_WARPS);
    for (int bx = 0; bx < blocks; ++bx) {
        const MmaSeg &sg = args.seg[mma_seg_of(args, bx)];
        for (int warp = 0; warp < GEMV_WARPS; ++warp) {
            const int64_t row = (int64_t)(bx - sg.blk0) * GEMV_WARPS + warp;
            if (row >= sg.w.rows) continue;
            float part[32];
            for (int l = 0; l < 32; ++l) part[l] = gemv_lane_any<GEMV_BATCH>(sg.w, row, sg.a, l);
            sg.y[row] = fa_warp_sum<32>(part) + (sg.bias ? sg.bias[row] : 0.0f);
        }
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

bool emu_flash(const FaArgs &a, int hd, int kv_f16, const void *kc, const void *vc) {
#define QSC_HF(E)                                                                                                 \
    case E:                                                                                                       \
        if (kv_f16) host_flash<E, __half>(a, (const __half *)kc, (const __half *)vc);                            \
        else host_flash<E, float>(a, (const float *)kc, (const float *)vc);                                      \
        return true;
    if (hd % 32) return false;
    switch (hd / 32) {
        QSC_HF(1) QSC_HF(2) QSC_HF(3) QSC_HF(4)
    default: return false;
    }
#undef QSC_HF
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
    MmaArgs args = {};
    args.seg[0] = {q.w, act.view(type), y, rows, nullptr, 0};
    args.nseg = 1;
    args.ncols = n_x;
    emu_matmul_mma(args);
    return 0;
}

/* Flash attention (k_flash's blocks, tiles and recurrence) on host arrays; head sizes 32..128. */
int qsc_host_flash(const float *q, int n_q, const int32_t *q_pos, int n_heads, int head_dim, const void *k_cache,
                   const void *v_cache, int kv_f16, int n_kv_heads, int n_kv, int window, float scale, float softcap,
                   const float *sinks, float *out) {
    if (!attn_shape_ok(n_q, n_heads, head_dim, n_kv_heads, n_kv) || head_dim > 32 * FA_MAX_EPL) return -1;
    const FaArgs a = {q, q_pos, &n_kv, n_q, n_heads, n_kv_heads, window, scale, softcap, sinks, out};
    return emu_flash(a, head_dim, kv_f16, k_cache, v_cache) ? 0 : -1;
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
    if (batch == GEMV_BATCH) { /* k_gemv itself */
        MmaArgs args = {};
        args.seg[0] = {q.w, a, y, rows, nullptr, 0};
        args.nseg = 1;
        args.ncols = 1;
        emu_gemv(args);
        return 0;
    }
    for (int64_t r = 0; r < rows; ++r) {
        float part[32];
        for (int l = 0; l < 32; ++l) part[l] = gemv_lane_any<1>(q.w, r, a, l);
        y[r] = fa_warp_sum<32>(part);
    }
    return 0;
}

/* A product launch of n (1..3) matrices through the forward's dispatch: matrix i (type types[i], rows[i] x k, its
 * raw file blocks w[i]) times the n_x columns of x, into y[i][col * ldy[i] + row] (+ bias[i][row] where bias[i] is
 * not NULL), as the launch tables run it: `path` QSC_PATH_MATMUL (k_matmul's twin), _GEMV or _MMA (the twins of
 * the split launch), or -1 for the path matmul_path chooses with the environment's switches. Returns the path run,
 * or -1 where the one asked for does not apply (matmul_path, all switches on, would not take it) or the arguments
 * are bad. */
int qsc_host_matmul_launch(int path, int n, const int *types, const uint8_t *const *w, const int64_t *rows, int64_t k,
                           const float *x, int n_x, float *const *y, const int64_t *ldy, const float *const *bias) {
    if (n < 1 || n > 3 || n_x <= 0 || path < -1 || path > QSC_PATH_MMA) return -1;
    std::vector<std::unique_ptr<HostQW>> qs;
    for (int i = 0; i < n; ++i) {
        qs.emplace_back(new HostQW(types[i], w[i], rows[i], k));
        if (!qs.back()->ok || ldy[i] < rows[i]) return -1;
    }
    HostAct act(x, n_x, k);
    MmaArgs args = {};
    for (int i = 0; i < n; ++i) args.seg[i] = {qs[(size_t)i]->w, act.view(types[i]), y[i], ldy[i], bias[i], 0};
    args.nseg = n;
    args.ncols = n_x;
    const int can = matmul_path(FastPaths{}, args);
    if (path < 0) path = matmul_path(fast_paths_env(true), args);
    else if (path != QSC_PATH_MATMUL && path != can) return -1;
    switch (path) {
    case QSC_PATH_GEMV: emu_gemv(args); break;
    case QSC_PATH_MMA: emu_matmul_mma(args); break;
    default:
        for (int i = 0; i < n; ++i) emu_matmul(args.seg[i].w, args.seg[i].a, y[i], ldy[i], bias[i], n_x);
    }
    return path;
}

} /* extern "C" */
