/* The debug mode (docs/engine.md §10): with QUANTSCOPE_CUDA_DEBUG=1 in the environment when a model is made (read
 * once, in model_create; a single-kernel entry point reads it per call), every kernel launch of the forward is
 * followed by cudaGetLastError + cudaStreamSynchronize + cudaGetLastError, and the first fault is kept on the model,
 * naming the kernel and its shapes:
 *     k_matmul_mma<Q4_K> (grid 64x4, 128 threads; rows 4096, k 4096, cols 65): an illegal memory access was
 *     encountered (cudaErrorIllegalAddress = 700)
 * The forward returns that line (and every later forward of the model too: a device fault poisons the context).
 * Without the variable nothing changes: QSC_DBG is one test of a thread-local pointer that is NULL.
 *
 * How a launch is checked: every `kernel<<<...>>>(...)` of the launch table's functions (qsc_device.cu's dev_*,
 * launch_matmul, launch_attention) and of qsc_moe.cuh / qsc_probe.cuh is followed by QSC_DBG(stream, name, grid,
 * block, "sizes", ...) (tests/test_cuda.py checks the sources for it; qsc_fast.cuh's launchers are checked by their
 * callers). The check uses the debug state of the model whose forward is running on this thread (QscDebugScope,
 * set by forward_impl under the model's lock), so launch helpers that take only a stream need no model. */
#pragma once

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct QscDebug {
    bool on = false;       /* QUANTSCOPE_CUDA_DEBUG was set when the model was made */
    char fault[512] = "";  /* the first fault, one line ("" none) */
};

/* The running forward's debug state (NULL: off, or no forward running on this thread). */
static thread_local QscDebug *qsc_dbg_cur = nullptr;

/* Makes d (when on) the running state for a scope; restores the previous one after. */
struct QscDebugScope {
    QscDebug *prev;
    explicit QscDebugScope(QscDebug *d) : prev(qsc_dbg_cur) { qsc_dbg_cur = d && d->on ? d : nullptr; }
    ~QscDebugScope() { qsc_dbg_cur = prev; }
    QscDebugScope(const QscDebugScope &) = delete;
    QscDebugScope &operator=(const QscDebugScope &) = delete;
};

static inline bool qsc_debug_env() {
    const char *e = getenv("QUANTSCOPE_CUDA_DEBUG");
    return e && e[0] && strcmp(e, "0") != 0;
}

static inline void qsc_dim_str(char *buf, size_t len, unsigned x, unsigned y, unsigned z) {
    if (z > 1) snprintf(buf, len, "%ux%ux%u", x, y, z);
    else if (y > 1) snprintf(buf, len, "%ux%u", x, y);
    else snprintf(buf, len, "%u", x);
}

/* "kernel (grid GX[xGY[xGZ]], BX[xBY] threads[; sizes]): error" into buf. */
static inline void qsc_debug_format(char *buf, size_t len, const char *kernel, unsigned gx, unsigned gy, unsigned gz,
                                    unsigned bx, unsigned by, unsigned bz, const char *sizes, const char *error) {
    char g[48], b[48];
    qsc_dim_str(g, sizeof g, gx, gy, gz);
    qsc_dim_str(b, sizeof b, bx, by, bz);
    snprintf(buf, len, "%s (grid %s, %s threads%s%s): %s", kernel, g, b, sizes && sizes[0] ? "; " : "",
             sizes ? sizes : "", error);
}

#ifdef __CUDACC__
/* After a launch on st in debug mode: the launch's own error, then the kernel's (stream synchronized); the first
 * fault is kept. fmt: the main sizes, printf-style. */
static void qsc_dbg_after(cudaStream_t st, const char *kernel, dim3 grid, dim3 block, const char *fmt, ...) {
    QscDebug *d = qsc_dbg_cur;
    if (!d || d->fault[0]) return;
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e == cudaSuccess) return;
    char sizes[256], error[192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sizes, sizeof sizes, fmt, ap);
    va_end(ap);
    snprintf(error, sizeof error, "%s (%s = %d)", cudaGetErrorString(e), cudaGetErrorName(e), (int)e);
    qsc_debug_format(d->fault, sizeof d->fault, kernel, grid.x, grid.y, grid.z, block.x, block.y, block.z, sizes,
                     error);
}

/* The check after one launch: nothing (one pointer test) unless a debug-mode forward runs on this thread. */
#define QSC_DBG(st, kernel, grid, block, ...)                                                                     \
    do {                                                                                                          \
        if (qsc_dbg_cur) qsc_dbg_after((st), (kernel), dim3(grid), dim3(block), __VA_ARGS__);                     \
    } while (0)
#endif
