"""The prefill GEMM on int8 tensor cores (csrc/cuda/qsc_mma.cuh, launched from qsc_fast.cuh).

Everywhere the library is built: the mma.sync fragment layouts against the PTX ISA's table, the emulated warp-wide
MMA against a plain int32 matrix product, and the whole tile loop (the kernel's loads, fragments, integer scales and
float epilogues, run on the host) against today's k_matmul emulation and the CPU kernels.
On a GPU (skipped with the reason otherwise): the device GEMM, which ``gpu_matmat`` reaches from 16 columns on.
"""

from __future__ import annotations

import cffi
import numpy as np
import pytest

from quantscope.core.engine import cuda_kernels as ck
from quantscope.core.native import kernels as K
from quantscope.core.quant import dequantize, ggml_type

from . import test_cuda
from .test_cuda import close_to_cpu, rel_l2, weight_bytes
from .test_native_kernels import activations

#: every type with the MMA bit in csrc/cuda/qsc_types.cuh's QSC_TYPE_LIST: every type prefill meets (F16 and
#: BF16 on the 16-bit float tensor cores, the others on int8; F32 keeps k_matmul)
MMA_TYPES = ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL",
             "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0", "MXFP4",
             "NVFP4"]
cuda_lib, gpu = test_cuda.cuda_lib, test_cuda.gpu  # the session fixtures, shared
CDEF = """
int qsc_host_mma_layout(int which, int lane, int i);
int qsc_host_mma_i8(const int8_t *a, const int8_t *b, int m, int n, int k, int ks, int32_t *c);
int qsc_host_matmat_mma(int type, const uint8_t *w, int64_t rows, int64_t k, const float *x, int n_x, float *y);
"""


@pytest.fixture(scope="module")
def lib(cuda_lib):
    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    return ffi, ffi.dlopen(str(cuda_lib))


def mma_i8(lib, a: np.ndarray, b: np.ndarray, ks: int) -> np.ndarray:
    ffi, L = lib
    a, b = np.ascontiguousarray(a, np.int8), np.ascontiguousarray(b, np.int8)
    c = np.empty((b.shape[0], a.shape[0]), np.int32)
    rc = L.qsc_host_mma_i8(ffi.from_buffer("int8_t[]", a), ffi.from_buffer("int8_t[]", b), a.shape[0], b.shape[0],
                           a.shape[1], ks, ffi.from_buffer("int32_t[]", c))
    assert rc == 0
    return c


def matmat_mma(lib, name: str, w: np.ndarray, rows: int, k: int, x: np.ndarray) -> np.ndarray | None:
    ffi, L = lib
    x = np.ascontiguousarray(x, np.float32)
    y = np.full((x.shape[0], rows), np.nan, np.float32)
    rc = L.qsc_host_matmat_mma(ggml_type(name).id, ffi.from_buffer("uint8_t[]", w), rows, k,
                               ffi.from_buffer("float[]", x), x.shape[0], ffi.from_buffer("float[]", y))
    return y if rc == 0 else None


# ------------------------------------------------------------------------------------ fragment layouts
def test_fragment_layouts_are_the_ptx_tables(lib):
    """PTX ISA, "Matrix Fragments for mma.m16n8k32" (.s8): groupID = lane >> 2, threadID_in_group = lane % 4;
    A: row groupID for a_i with i < 4 or 8 <= i < 12, else groupID + 8; column 4 tid + (i & 3), + 16 for i >= 8.
    B: row 4 tid + (i & 3), + 16 for i >= 4; column groupID. C: row groupID for c0, c1, else + 8; column
    2 tid + (i & 1). m16n8k16 (.s8) is the same for its 8 A and 4 B elements."""
    _, L = lib
    for lane in range(32):
        g, t = lane >> 2, lane % 4
        for i in range(16):
            assert L.qsc_host_mma_layout(0, lane, i) == (g if i < 4 or 8 <= i < 12 else g + 8), (lane, i)
            assert L.qsc_host_mma_layout(1, lane, i) == 4 * t + (i & 3) + (16 if i >= 8 else 0), (lane, i)
        for i in range(8):
            assert L.qsc_host_mma_layout(2, lane, i) == 4 * t + (i & 3) + (16 if i >= 4 else 0), (lane, i)
            assert L.qsc_host_mma_layout(3, lane, i) == g
        for i in range(4):
            assert L.qsc_host_mma_layout(4, lane, i) == (g if i < 2 else g + 8)
            assert L.qsc_host_mma_layout(5, lane, i) == 2 * t + (i & 1)
    # every element of A (16 x 32), B (32 x 8) and C (16 x 8) is held by exactly one (lane, i)
    for which, n_i, shape in ((0, 16, (16, 32)), (2, 8, (32, 8)), (4, 4, (16, 8))):
        seen = {(L.qsc_host_mma_layout(which, ln, i), L.qsc_host_mma_layout(which + 1, ln, i))
                for ln in range(32) for i in range(n_i)}
        assert len(seen) == 32 * n_i == shape[0] * shape[1]


def test_f16_fragments_are_the_s8_fragments_bytes(lib):
    """PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type" (.f16 / .bf16): A element i of a lane
    is row groupID (+ 8 for i in 2, 3, 6, 7), column 2 tid + (i & 1) (+ 8 for i >= 4); B element i is row 2 tid +
    (i & 1) (+ 8 for i >= 2), column groupID; C as the s8 MMA's. Its 16-bit element i occupies bytes 2i, 2i + 1 of
    the lane's registers, which the s8 m16n8k32 layout puts at the same row and at byte columns 2 col, 2 col + 1:
    the float tiles are loaded with the int8 fragment loads (qsc_mma.cuh)."""
    _, L = lib
    for lane in range(32):
        g, t = lane >> 2, lane % 4
        for i in range(8):
            row, col = g + (8 if i in (2, 3, 6, 7) else 0), 2 * t + (i & 1) + (8 if i >= 4 else 0)
            for byte in (2 * i, 2 * i + 1):
                assert L.qsc_host_mma_layout(0, lane, byte) == row, (lane, i)
                assert L.qsc_host_mma_layout(1, lane, byte) == 2 * col + byte - 2 * i, (lane, i)
        for i in range(4):
            row = 2 * t + (i & 1) + (8 if i >= 2 else 0)
            for byte in (2 * i, 2 * i + 1):
                assert L.qsc_host_mma_layout(2, lane, byte) == 2 * row + byte - 2 * i, (lane, i)
                assert L.qsc_host_mma_layout(3, lane, byte) == g


@pytest.mark.parametrize("ks", [16, 32])
def test_emulated_mma_is_the_int32_matrix_product(lib, ks):
    rng = np.random.default_rng(ks)
    m, n, k = 48, 24, 4 * ks
    a = rng.integers(-128, 128, (m, k), dtype=np.int64).astype(np.int8)
    b = rng.integers(-128, 128, (n, k), dtype=np.int64).astype(np.int8)
    a[0, :] = -128  # extremes: the largest magnitude products
    b[0, :] = -128
    got = mma_i8(lib, a, b, ks)
    assert np.array_equal(got, b.astype(np.int32) @ a.astype(np.int32).T)


def test_emulated_mma_refuses_ragged_shapes(lib):
    ffi, L = lib
    a = np.zeros(64 * 64, np.int8)
    c = np.zeros(64 * 64, np.int32)
    pa, pc = ffi.from_buffer("int8_t[]", a), ffi.from_buffer("int32_t[]", c)
    for m, n, k, ks in ((15, 8, 32, 32), (16, 7, 32, 32), (16, 8, 48, 32), (16, 8, 32, 8)):
        assert L.qsc_host_mma_i8(pa, pa, m, n, k, ks, pc) == -1


# ------------------------------------------------------------------------------------ the tile loop
@pytest.mark.parametrize("name", MMA_TYPES)
def test_mma_gemm_matches_k_matmul_and_cpu(lib, name):
    """Rows and columns that are not multiples of the 64 x 64 block tile, two K stages or more; the host twin of the
    tile loop against today's k_matmul emulation and the CPU kernels (same values to float rounding)."""
    rng = np.random.default_rng(sum(name.encode()) + 37)
    t = ggml_type(name)
    rows = 100
    for k in (512, 1280):
        w = weight_bytes(name, rows, k, rng)
        x = np.stack([activations(rng, k, outliers=False) for _ in range(70)])
        x[3] = 0.0  # an all-zero activation row
        x[5], x[6] = 1.0, -0.5  # constant rows: every Q8_K value -128, block sums -2048 (the mins' extreme)
        got = matmat_mma(lib, name, w, rows, k, x)
        assert got is not None and np.isfinite(got).all()
        dp4a = ck.host_matmat(t, w, rows, k, x)  # today's k_matmul, emulated
        assert close_to_cpu(got, dp4a), (name, k, np.abs(got - dp4a).max())
        assert close_to_cpu(got, K.matmat(t, w, rows, k, x)), (name, k)
        ref = x.astype(np.float64) @ dequantize(w.reshape(rows, -1), t).astype(np.float64).T
        assert rel_l2(got, ref) < 2e-2, (name, k)
        assert not got[3].any()


def test_mma_gemm_refuses_what_keeps_k_matmul(lib):
    rng = np.random.default_rng(2)
    x = np.ones((4, 288), np.float32)
    assert matmat_mma(lib, "Q8_0", weight_bytes("Q8_0", 3, 288, rng), 3, 288, x) is None  # k % 256 != 0
    x = np.ones((4, 256), np.float32)
    assert matmat_mma(lib, "F32", weight_bytes("F32", 3, 256, rng), 3, 256, x) is None  # no fp32 tensor-core path
    x = np.ones((4, 384), np.float32)
    assert matmat_mma(lib, "F16", weight_bytes("F16", 3, 384, rng), 3, 384, x) is None  # k % 256 != 0


# ------------------------------------------------------------------------------------ GPU
@pytest.mark.parametrize("name", MMA_TYPES)
def test_gpu_mma_gemm_matches_cpu(gpu, name):
    """From 16 columns on, gpu_matmat runs the tensor-core GEMM on sm_80+ (k_matmul elsewhere): both must agree
    with the CPU kernels and with the host emulation of the tile loop."""
    rng = np.random.default_rng(sum(name.encode()) + 38)
    t = ggml_type(name)
    rows, k = 100, 1280
    w = weight_bytes(name, rows, k, rng)
    x = np.stack([activations(rng, k, outliers=False) for _ in range(70)])
    for n_x in (16, 64, 70):
        got = ck.gpu_matmat(t, w, rows, k, x[:n_x])
        assert close_to_cpu(got, K.matmat(t, w, rows, k, x[:n_x])), (name, n_x)


@pytest.mark.parametrize("name", MMA_TYPES)
def test_gpu_mma_pipe_is_the_plain_kernel(gpu, name, monkeypatch):
    """k_matmul_mma_pipe (the activation tiles double-buffered by cp.async, columns past the last zero-filled by the
    copy; fragments by ldmatrix) does k_matmul_mma's arithmetic in k_matmul_mma's order: the same floats, bit for
    bit, with QUANTSCOPE_CUDA_MMA_PIPE=0 (read at each call) as without, over partial tiles and 1..5 stages of each
    buffer parity."""
    rng = np.random.default_rng(sum(name.encode()) + 39)
    t = ggml_type(name)
    rows = 100
    for k in (256, 512, 1280):
        w = weight_bytes(name, rows, k, rng)
        x = np.stack([activations(rng, k, outliers=False) for _ in range(130)])
        for n_x in (16, 17, 63, 65, 130):
            monkeypatch.delenv("QUANTSCOPE_CUDA_MMA_PIPE", raising=False)
            piped = ck.gpu_matmat(t, w, rows, k, x[:n_x])
            monkeypatch.setenv("QUANTSCOPE_CUDA_MMA_PIPE", "0")
            plain = ck.gpu_matmat(t, w, rows, k, x[:n_x])
            assert np.array_equal(piped, plain), (name, k, n_x, np.abs(piped - plain).max())
