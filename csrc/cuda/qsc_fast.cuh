/* The fast paths: for prefill the int8 tensor-core GEMM (qsc_mma.cuh) and flash attention (qsc_flash.cuh), for
 * decode a GEMV with its loads batched (qsc_gemv.cuh). Each kernel is a thin shell around the __host__ __device__
 * code that its host twin (qsc_fast_host.cuh) runs on the CPU: the same grid and segment bookkeeping, the same
 * loads, the same warp code with LANES = 32 instead of 1, the same stores.
 *
 * Dispatch: the decision functions below (matmul_path, attention_path, attention_quantize_apart) are the one choice
 * of kernel; qsc_device.cu's two launch tables both ask them (dev_matmul / dev_attention launch the kernel chosen,
 * host_matmul / host_attention run its twin), so a host-emulated model (qsc_host_model_create) takes per call the
 * path the device takes:
 *   GEMV   one column (decode, and the last-row lm_head of a prefill), every matrix of a type gemv_type_ok knows.
 *   GEMM   ncols >= MMA_MIN_COLS (prefill; 2..15 columns keep k_matmul<8>), every matrix of the launch of a type
 *          with an MMA decode (MMA 1 in qsc_types.cuh's list) and k % 256 == 0, and (device) the running image was
 *          compiled for sm_80+ (its PTX version, so a library built with QSC_ARCHS="75" JIT-compiled on a newer GPU
 *          keeps k_matmul too) on an sm_80+ device; the host emulates an sm_80+ device. -DQSC_NO_MMA leaves the
 *          kernel out altogether (both tables keep k_matmul).
 *   flash  T >= FLASH_MIN_T query tokens and head sizes 32..128; its output is quantized by a k_quantize launch
 *          after it (k_attention quantizes in the same kernel where the int8 blocks fall inside a head).
 * The MMA path runs k_matmul_mma_pipe on the device (the activation tiles double-buffered by cp.async, the fragments
 * loaded by ldmatrix; the same arithmetic in the same order, so its host twin is k_matmul_mma's);
 * QUANTSCOPE_CUDA_MMA_PIPE=0 keeps the plain k_matmul_mma (plain loads, one buffer), to bisect a fault or compare.
 * QUANTSCOPE_CUDA_MMA=0 / QUANTSCOPE_CUDA_FLASH=0 / QUANTSCOPE_CUDA_GEMV=0 in the environment turn each off, for A/B
 * benchmarks (tests/bench/bench_gpu_vs_llama.py) and tests (tests/test_cuda_paths.py): read when a model is made
 * (qsc_model_create and qsc_host_model_create alike), and at each call of the single-kernel entry points.
 * Every choice is counted (qsc_path_counts below, for tests: which paths a forward took). Thresholds are first
 * guesses, not yet tuned on a GPU.
 *
 * qsc_fast_host.cuh includes this file with QSC_FAST_DECISIONS_ONLY: the decisions without the kernels. */
#pragma once

#include <stdlib.h>

#include "qsc_flash.cuh"
#include "qsc_gemv.cuh"
#include "qsc_mma.cuh"

constexpr int MMA_MIN_COLS = 16, FLASH_MIN_T = 16;

/* The kernels a launch can take (qsc_path_name: their names). */
enum {
    QSC_PATH_MATMUL = 0, /* k_matmul<1> / k_matmul<8> */
    QSC_PATH_GEMV,       /* k_gemv */
    QSC_PATH_MMA,        /* k_matmul_mma */
    QSC_PATH_ATTENTION,  /* k_attention */
    QSC_PATH_FLASH,      /* k_flash */
    QSC_PATH_QUANTIZE,   /* a k_quantize launch after the attention (after k_flash, or k_attention unfused) */
    QSC_PATH_N
};

/* Which fast paths a model may take: the environment's switches when it was made, and the hardware. */
struct FastPaths {
    bool mma = true, flash = true, gemv = true;
    bool mma_pipe = true; /* the device's MMA kernel: k_matmul_mma_pipe (cp.async, ldmatrix) or k_matmul_mma */
};

static bool env_off(const char *name) {
    const char *e = getenv(name);
    return e && e[0] == '0' && e[1] == '\0';
}

/* The switches as the environment sets them now; mma_hw: the device can run k_matmul_mma (the host: true). */
static FastPaths fast_paths_env(bool mma_hw) {
    FastPaths f;
#ifdef QSC_NO_MMA
    f.mma = false;
    (void)mma_hw;
#else
    f.mma = mma_hw && !env_off("QUANTSCOPE_CUDA_MMA");
#endif
    f.mma_pipe = !env_off("QUANTSCOPE_CUDA_MMA_PIPE");
    f.flash = !env_off("QUANTSCOPE_CUDA_FLASH");
    f.gemv = !env_off("QUANTSCOPE_CUDA_GEMV");
    return f;
}

/* The kernel of a product launch (QSC_PATH_MATMUL, _GEMV or _MMA): its matrices' types and widths, its columns. */
static int matmul_path(const FastPaths &fp, const MmaArgs &a) {
    if (a.nseg < 1 || a.nseg > 3) return QSC_PATH_MATMUL;
    bool gemv = fp.gemv && a.ncols == 1, mma = fp.mma && a.ncols >= MMA_MIN_COLS;
    for (int i = 0; i < a.nseg; ++i) {
        gemv = gemv && gemv_type_ok(a.seg[i].w.type);
        mma = mma && mma_type_ok(a.seg[i].w.type, a.seg[i].w.k);
    }
    return gemv ? QSC_PATH_GEMV : mma ? QSC_PATH_MMA : QSC_PATH_MATMUL;
}

/* The kernel of an attention launch over T query tokens (QSC_PATH_ATTENTION or _FLASH). */
static int attention_path(const FastPaths &fp, int T, int H, int KV, int hd) {
    const bool flash = fp.flash && T >= FLASH_MIN_T && hd % 32 == 0 && hd >= 32 && hd <= 32 * FA_MAX_EPL && KV > 0 &&
                       H % KV == 0;
    return flash ? QSC_PATH_FLASH : QSC_PATH_ATTENTION;
}

/* Does a k_quantize launch follow the attention kernel of `path` (ao: the formats its output goes to)? k_flash never
 * quantizes; k_attention does in the same kernel when the int8 blocks fall inside a head. */
static bool attention_quantize_apart(int path, int hd, const ActOut &ao) {
    if (!ao.qs32 && !ao.qs256) return false;
    if (path == QSC_PATH_FLASH) return true;
    return (ao.qs32 && hd % 32) || (ao.qs256 && hd % 256);
}

#ifndef QSC_FAST_DECISIONS_ONLY
#include <atomic>

/* Every choice the launch tables made in this process, by path (dev_ and host_ entries alike; a CUDA graph's replays
 * are not choices). */
static std::atomic<long long> g_path_count[QSC_PATH_N];

static int took(int path) {
    g_path_count[path].fetch_add(1, std::memory_order_relaxed);
    return path;
}

extern "C" {
/* Test entry points (declared by tests/test_cuda_paths.py, not in qsc_api.h): the paths' names, and the counts of
 * the choices made so far (out[0 .. n-1]; reset: zero them after reading). Both return QSC_PATH_N. */
const char *qsc_path_name(int path) {
    static const char *names[QSC_PATH_N] = {"matmul", "gemv", "mma", "attention", "flash", "quantize"};
    return path >= 0 && path < QSC_PATH_N ? names[path] : nullptr;
}
int qsc_path_counts(long long *out, int n, int reset) {
    for (int i = 0; i < QSC_PATH_N; ++i) {
        const long long v = reset ? g_path_count[i].exchange(0) : g_path_count[i].load();
        if (out && i < n) out[i] = v;
    }
    return QSC_PATH_N;
}
}

/* ------------------------------------------------------------------------------------------------ GEMM */
template <int TYPE, bool LDM = false>
__device__ __forceinline__ void mma_block(const MmaSeg &sg, int64_t row0, int64_t col0, int ncols, MmaSmem &s) {
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    MmaLane st[1];
    mma_zero<1>(st);
    const int nst = (int)(sg.w.k / MmaTraits<TYPE>::SK);
    for (int kb = 0; kb < nst; ++kb) {
        __syncthreads(); /* the previous stage's tiles are read by every warp */
        mma_load_w<TYPE>(sg.w, row0, kb, s, tid, MMA_THREADS);
        mma_load_x<TYPE>(sg.a, col0, ncols, kb, s, tid, MMA_THREADS);
        __syncthreads();
        mma_stage<TYPE, 1, LDM>(s, warp, lane, st);
    }
    mma_store<1>(st, warp, lane, row0, col0, sg.w.rows, ncols, sg.y, sg.ldy, sg.bias);
}

/* The pipelined block (sm_80+): the int8 activation tile of stage kb + 1 is copied by cp.async into the other of two
 * buffers (s.b, b2) while stage kb's weights are decoded and its tile multiplied; fragments by ldmatrix. Per stage:
 * barrier (every warp is done with stage kb - 1, whose buffer the next copy overwrites), issue stage kb + 1's copy
 * (columns past ncols: zero-filled by a source size of 0), decode stage kb's weights and load its activation scales,
 * wait for stage kb's group (cp.async.wait_group 1), barrier, multiply. The float types (whose activations are
 * converted, not copied) run mma_block with ldmatrix. */
#if !defined(QSC_NO_MMA) && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800)
__device__ __forceinline__ void mma_cp16(int8_t *dst, const int8_t *src, bool fill) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(fill ? 16 : 0));
}
__device__ __forceinline__ void mma_x_async(const Act &a, int64_t col0, int ncols, int kb, int8_t *bt, int tid) {
    for (int idx = tid; idx < MMA_BN * (MMA_KT / 16); idx += MMA_THREADS) {
        const int c = idx / (MMA_KT / 16), h = idx % (MMA_KT / 16);
        const bool in = c < ncols;
        mma_cp16(bt + c * MMA_LD + 16 * h, in ? a.qs + (col0 + c) * a.k + (int64_t)kb * MMA_KT + 16 * h : a.qs, in);
    }
    asm volatile("cp.async.commit_group;");
}
template <int TYPE>
__device__ __forceinline__ void mma_block_pipe(const MmaSeg &sg, int64_t row0, int64_t col0, int ncols, MmaSmem &s,
                                               int8_t *b2) {
    using TR = MmaTraits<TYPE>;
    if constexpr (TR::FLOAT) {
        mma_block<TYPE, true>(sg, row0, col0, ncols, s);
    } else {
        const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
        int8_t *buf[2] = {&s.b[0][0], b2};
        MmaLane st[1];
        mma_zero<1>(st);
        const int nst = (int)(sg.w.k / MMA_KT);
        mma_x_async(sg.a, col0, ncols, 0, buf[0], tid);
        for (int kb = 0; kb < nst; ++kb) {
            __syncthreads();
            if (kb + 1 < nst) mma_x_async(sg.a, col0, ncols, kb + 1, buf[(kb + 1) & 1], tid);
            else asm volatile("cp.async.commit_group;"); /* an empty group: wait_group 1 still means stage kb */
            mma_load_w<TYPE>(sg.w, row0, kb, s, tid, MMA_THREADS);
            mma_load_xq<TR::K256, false>(sg.a, col0, ncols, kb, s, tid, MMA_THREADS);
            asm volatile("cp.async.wait_group 1;");
            __syncthreads();
            mma_stage<TYPE, 1, true>(s, warp, lane, st, buf[kb & 1]);
        }
        mma_store<1>(st, warp, lane, row0, col0, sg.w.rows, ncols, sg.y, sg.ldy, sg.bias);
    }
}
#endif

__global__ void __launch_bounds__(MMA_THREADS) k_matmul_mma(const __grid_constant__ MmaArgs args) {
#if !defined(QSC_NO_MMA) && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800)
    __shared__ MmaSmem s;
    const int bx = blockIdx.x;
    const MmaSeg &sg = args.seg[mma_seg_of(args, bx)];
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

/* k_matmul_mma with mma_block_pipe: MmaSmem and the second activation buffer in dynamic shared memory. */
constexpr size_t MMA_PIPE_SMEM = sizeof(MmaSmem) + (size_t)MMA_BN * MMA_LD;
__global__ void __launch_bounds__(MMA_THREADS) k_matmul_mma_pipe(const __grid_constant__ MmaArgs args) {
#if !defined(QSC_NO_MMA) && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800)
    extern __shared__ __align__(16) int8_t mma_dyn[];
    MmaSmem &s = *reinterpret_cast<MmaSmem *>(mma_dyn);
    int8_t *b2 = mma_dyn + sizeof(MmaSmem);
    const int bx = blockIdx.x;
    const MmaSeg &sg = args.seg[mma_seg_of(args, bx)];
    const int64_t row0 = (int64_t)(bx - sg.blk0) * MMA_BM, col0 = (int64_t)blockIdx.y * MMA_BN;
    const int ncols = min(MMA_BN, args.ncols - (int)col0);
    switch (sg.w.type) { /* block-uniform */
#define QSC_MMA_CASE(T) case T: mma_block_pipe<T>(sg, row0, col0, ncols, s, b2); break;
        QSC_FOR_MMA_TYPES(QSC_MMA_CASE)
#undef QSC_MMA_CASE
    default: break;
    }
#endif
}

/* Can this device run k_matmul_mma (an sm_80+ device, and this image compiled for sm_80+)? Asked once. */
static bool mma_hw_available() {
#ifdef QSC_NO_MMA
    return false;
#else
    static const bool ok = [] {
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

/* May k_matmul_mma_pipe have its dynamic shared memory (asked once, when the first device model or single-kernel
 * call is set up: never inside a stream capture)? */
static bool mma_pipe_ready() {
    static const bool ok = cudaFuncSetAttribute(k_matmul_mma_pipe, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                (int)MMA_PIPE_SMEM) == cudaSuccess;
    return ok;
}

/* The fast paths a model (host: a host-emulated one) or a single-kernel call may take, as of now. */
static FastPaths fast_paths(bool host) {
    FastPaths f = fast_paths_env(host || mma_hw_available());
    if (!host) f.mma_pipe = f.mma_pipe && f.mma && mma_pipe_ready();
    return f;
}

/* y = W x for up to three matrices on the tensor cores (matmul_path chose QSC_PATH_MMA): k_matmul_mma_pipe where
 * `pipe` (FastPaths::mma_pipe: switched on, and its shared memory allowed by fast_paths), else k_matmul_mma.
 * Returns `pipe` (the debug mode's kernel name). */
static bool launch_matmul_mma(MmaArgs args, cudaStream_t st, bool pipe) {
    const int blocks = mma_lay_out(args, MMA_BM);
    const dim3 grid(blocks, (args.ncols + MMA_BN - 1) / MMA_BN);
    if (pipe) k_matmul_mma_pipe<<<grid, MMA_THREADS, MMA_PIPE_SMEM, st>>>(args);
    else k_matmul_mma<<<grid, MMA_THREADS, 0, st>>>(args);
    return pipe;
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

/* Flash attention of T query tokens (attention_path chose QSC_PATH_FLASH: hd in 32..128, a multiple of 32). */
static void launch_flash(const FaArgs &a, int hd, int kv_f16, const void *kc, const void *vc, cudaStream_t st) {
    const int64_t rows = (int64_t)a.T * (a.H / a.KV);
    const dim3 grid((unsigned)((rows + FA_ROWS - 1) / FA_ROWS), (unsigned)a.KV);
#define QSC_FA(E)                                                                                                 \
    case E:                                                                                                       \
        if (kv_f16) k_flash<E, __half><<<grid, FA_WARPS * 32, 0, st>>>(a, (const __half *)kc, (const __half *)vc); \
        else k_flash<E, float><<<grid, FA_WARPS * 32, 0, st>>>(a, (const float *)kc, (const float *)vc);          \
        break;
    switch (hd / 32) {
        QSC_FA(1) QSC_FA(2) QSC_FA(3) QSC_FA(4)
    default: break;
    }
#undef QSC_FA
}

/* ------------------------------------------------------------------------------------------------ decode GEMV */
__global__ void __launch_bounds__(GEMV_WARPS * 32, 6) k_gemv(const __grid_constant__ MmaArgs args) {
    const int bx = blockIdx.x, lane = threadIdx.x & 31;
    const MmaSeg &sg = args.seg[mma_seg_of(args, bx)];
    const int64_t row = (int64_t)(bx - sg.blk0) * GEMV_WARPS + (threadIdx.x >> 5);
    if (row >= sg.w.rows) return; /* whole warp */
    float acc = gemv_lane_any<GEMV_BATCH>(sg.w, row, sg.a, lane);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) sg.y[row] = acc + (sg.bias ? sg.bias[row] : 0.0f);
}

/* y = W x for one column and up to three matrices (matmul_path chose QSC_PATH_GEMV). */
static void launch_gemv(MmaArgs args, cudaStream_t st) {
    const int blocks = mma_lay_out(args, GEMV_WARPS);
    k_gemv<<<blocks, GEMV_WARPS * 32, 0, st>>>(args);
}

#endif /* QSC_FAST_DECISIONS_ONLY */
