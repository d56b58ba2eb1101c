/* The fast paths (device only; included by qsc_device.cu after qsc_kernels.cuh): for prefill the int8 tensor-core
 * GEMM (qsc_mma.cuh) and flash attention (qsc_flash.cuh), for decode a GEMV with its loads batched (qsc_gemv.cuh),
 * with the launchers the forward pass asks first. Each kernel is
 * a thin shell around the __host__ __device__ code that tests/test_cuda_mma.py and tests/test_cuda_flash.py run on
 * the host (qsc_fast_host.cuh): the same loads, the same warp code with LANES = 1, the same stores.
 *
 * Dispatch (launch_matmul_mma / launch_flash return false to keep today's kernels):
 *   GEMM   ncols >= MMA_MIN_COLS (prefill; decode keeps k_matmul's GEMV), every matrix of the launch of a type with
 *          an MMA decode (MMA 1 in qsc_types.cuh's list) and k % 256 == 0, and the running image was compiled for
 *          sm_80+ (its PTX version, so a
 *          library built with QSC_ARCHS="75" JIT-compiled on a newer GPU keeps k_matmul too), on an sm_80+ device.
 *          Compile with -DQSC_NO_MMA to leave the kernel out altogether.
 *   flash  T >= FLASH_MIN_T query tokens and head sizes 32..128.
 *   GEMV   one column (decode, and the last-row lm_head of a prefill), every matrix of a type gemv_type_ok knows.
 * QUANTSCOPE_CUDA_MMA=0 / QUANTSCOPE_CUDA_FLASH=0 / QUANTSCOPE_CUDA_GEMV=0 in the environment (read once per
 * process) turn each off, for A/B benchmarks (tests/bench/bench_gpu_vs_llama.py). Thresholds are first guesses, not yet tuned on a GPU. */
#pragma once

#include <stdlib.h>

#include "qsc_flash.cuh"
#include "qsc_gemv.cuh"
#include "qsc_mma.cuh"

constexpr int MMA_MIN_COLS = 16, FLASH_MIN_T = 16;

static bool env_off(const char *name) {
    const char *e = getenv(name);
    return e && e[0] == '0' && e[1] == '\0';
}

/* ------------------------------------------------------------------------------------------------ GEMM */
struct MmaSeg {
    QW w;
    Act a;
    float *y;
    int64_t ldy;
    const float *bias;
    int blk0; /* first blockIdx.x of this segment */
};
struct MmaArgs {
    MmaSeg seg[3];
    int nseg, ncols;
};

template <int TYPE>
__device__ __forceinline__ void mma_block(const MmaSeg &sg, int64_t row0, int64_t col0, int ncols, MmaSmem &s) {
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    MmaLane st[1];
    mma_zero<1>(st);
    const int nst = (int)(sg.w.k / MMA_KT);
    for (int kb = 0; kb < nst; ++kb) {
        __syncthreads(); /* the previous stage's tiles are read by every warp */
        mma_load_w<TYPE>(sg.w, row0, kb, s, tid, MMA_THREADS);
        mma_load_x<MmaTraits<TYPE>::K256>(sg.a, col0, ncols, kb, s, tid, MMA_THREADS);
        __syncthreads();
        mma_stage<TYPE, 1>(s, warp, lane, st);
    }
    mma_store<1>(st, warp, lane, row0, col0, sg.w.rows, ncols, sg.y, sg.ldy, sg.bias);
}

__global__ void __launch_bounds__(MMA_THREADS) k_matmul_mma(const __grid_constant__ MmaArgs args) {
#if !defined(QSC_NO_MMA) && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800)
    __shared__ MmaSmem s;
    const int bx = blockIdx.x;
    int si = 0;
    if (args.nseg > 1 && bx >= args.seg[1].blk0) si = 1;
    if (args.nseg > 2 && bx >= args.seg[2].blk0) si = 2;
    const MmaSeg &sg = args.seg[si];
    const int64_t row0 = (int64_t)(bx - sg.blk0) * MMA_BM, col0 = (int64_t)blockIdx.y * MMA_BN;
    const int ncols = min(MMA_BN, args.ncols - (int)col0);
    switch (sg.w.type) { /* block-uniform */
#define QSC_MMA_CASE(T) case T: mma_block<T>(sg, row0, col0, ncols, s); break;
        QSC_FOR_MMA_TYPES(QSC_MMA_CASE)
#undef QSC_MMA_CASE
    default: break;
    }
#endif
}

static bool mma_available() {
#ifdef QSC_NO_MMA
    return false;
#else
    static const bool ok = [] {
        if (env_off("QUANTSCOPE_CUDA_MMA")) return false;
        int dev = 0, major = 0;
        cudaFuncAttributes fa;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
            cudaFuncGetAttributes(&fa, k_matmul_mma) != cudaSuccess)
            return false;
        return major >= 8 && fa.ptxVersion >= 80;
    }();
    return ok;
#endif
}

/* y = W x for up to three matrices on the tensor cores; false (nothing launched) where the path does not apply. */
static bool launch_matmul_mma(const MmaSeg *segs, int n, int ncols, cudaStream_t st) {
    if (ncols < MMA_MIN_COLS || n < 1 || n > 3) return false;
    for (int i = 0; i < n; ++i)
        if (!mma_type_ok(segs[i].w.type, segs[i].w.k)) return false;
    if (!mma_available()) return false;
    MmaArgs args = {};
    int blocks = 0;
    for (int i = 0; i < n; ++i) {
        args.seg[i] = segs[i];
        args.seg[i].blk0 = blocks;
        blocks += (int)((segs[i].w.rows + MMA_BM - 1) / MMA_BM);
    }
    args.nseg = n;
    args.ncols = ncols;
    k_matmul_mma<<<dim3(blocks, (ncols + MMA_BN - 1) / MMA_BN), MMA_THREADS, 0, st>>>(args);
    return true;
}

/* ------------------------------------------------------------------------------------------------ flash */
template <int EPL, typename KT>
__global__ void __launch_bounds__(FA_WARPS * 32) k_flash(const FaArgs a, const KT *__restrict__ kc,
                                                         const KT *__restrict__ vc) {
    constexpr int HDIM = 32 * EPL;
    __shared__ float sk[FA_BKV * (HDIM + 1)], sv[FA_BKV * HDIM], sq[FA_WARPS][HDIM];
    const int bx = blockIdx.x, kvh = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int n_kv = *a.n_kv_p;
    int lo, hi;
    fa_block_range(a, bx, &lo, &hi);
    FaRow<EPL> st[FA_RPW][1];
    float qr[FA_RPW][EPL];
    int rt[FA_RPW], rh[FA_RPW], rq[FA_RPW];
    bool rv[FA_RPW];
#pragma unroll
    for (int r = 0; r < FA_RPW; ++r) {
        rv[r] = fa_row(a, bx, kvh, warp * FA_RPW + r, &rt[r], &rh[r], &rq[r]);
        fa_row_init<EPL, 1>(st[r]);
#pragma unroll
        for (int i = 0; i < EPL; ++i) qr[r][i] = rv[r] ? a.q[((int64_t)rt[r] * a.H + rh[r]) * HDIM + EPL * lane + i] : 0.0f;
    }
    for (int k0 = lo; k0 <= hi; k0 += FA_BKV) {
        __syncthreads(); /* every warp is done with the previous tile */
        fa_load_tile<EPL, KT>(kc, vc, a.KV, kvh, k0, hi, sk, sv, tid, FA_WARPS * 32);
        __syncthreads();
#pragma unroll
        for (int r = 0; r < FA_RPW; ++r) {
            if (!rv[r] || k0 > fa_hi(rq[r], n_kv) || k0 + FA_BKV - 1 < fa_lo(rq[r], a.window)) continue;
#pragma unroll
            for (int i = 0; i < EPL; ++i) sq[warp][EPL * lane + i] = qr[r][i];
            __syncwarp();
            fa_row_tile<EPL, 1>(sq[warp], sk, sv, k0, rq[r], n_kv, a.window, a.scale, a.softcap, lane, st[r]);
            __syncwarp();
        }
    }
#pragma unroll
    for (int r = 0; r < FA_RPW; ++r)
        if (rv[r]) fa_row_store<EPL, 1>(a, rt[r], rh[r], lane, st[r]);
}

/* Flash attention of T query tokens; false (nothing launched) where the path does not apply. */
static bool launch_flash(const FaArgs &a, int hd, int kv_f16, const void *kc, const void *vc, cudaStream_t st) {
    static const bool on = !env_off("QUANTSCOPE_CUDA_FLASH");
    if (!on || a.T < FLASH_MIN_T || hd % 32 || hd < 32 || hd > 32 * FA_MAX_EPL || a.KV <= 0 || a.H % a.KV) return false;
    const int64_t rows = (int64_t)a.T * (a.H / a.KV);
    const dim3 grid((unsigned)((rows + FA_ROWS - 1) / FA_ROWS), (unsigned)a.KV);
#define QSC_FA(E)                                                                                                 \
    case E:                                                                                                       \
        if (kv_f16) k_flash<E, __half><<<grid, FA_WARPS * 32, 0, st>>>(a, (const __half *)kc, (const __half *)vc); \
        else k_flash<E, float><<<grid, FA_WARPS * 32, 0, st>>>(a, (const float *)kc, (const float *)vc);          \
        break;
    switch (hd / 32) {
        QSC_FA(1) QSC_FA(2) QSC_FA(3) QSC_FA(4)
    default: return false;
    }
#undef QSC_FA
    return true;
}

/* ------------------------------------------------------------------------------------------------ decode GEMV */
__global__ void __launch_bounds__(GEMV_WARPS * 32, 6) k_gemv(const __grid_constant__ MmaArgs args) {
    const int bx = blockIdx.x, lane = threadIdx.x & 31;
    int si = 0;
    if (args.nseg > 1 && bx >= args.seg[1].blk0) si = 1;
    if (args.nseg > 2 && bx >= args.seg[2].blk0) si = 2;
    const MmaSeg &sg = args.seg[si];
    const int64_t row = (int64_t)(bx - sg.blk0) * GEMV_WARPS + (threadIdx.x >> 5);
    if (row >= sg.w.rows) return; /* whole warp */
    float acc = gemv_lane_any<GEMV_BATCH>(sg.w, row, sg.a, lane);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) sg.y[row] = acc + (sg.bias ? sg.bias[row] : 0.0f);
}

/* y = W x for one column and up to three matrices; false (nothing launched) where the path does not apply. */
static bool launch_gemv(const MmaSeg *segs, int n, int ncols, cudaStream_t st) {
    static const bool on = !env_off("QUANTSCOPE_CUDA_GEMV");
    if (!on || ncols != 1 || n < 1 || n > 3) return false;
    for (int i = 0; i < n; ++i)
        if (!gemv_type_ok(segs[i].w.type)) return false;
    MmaArgs args = {};
    int blocks = 0;
    for (int i = 0; i < n; ++i) {
        args.seg[i] = segs[i];
        args.seg[i].blk0 = blocks;
        blocks += (int)((segs[i].w.rows + GEMV_WARPS - 1) / GEMV_WARPS);
    }
    args.nseg = n;
    args.ncols = 1;
    k_gemv<<<blocks, GEMV_WARPS * 32, 0, st>>>(args);
    return true;
}
