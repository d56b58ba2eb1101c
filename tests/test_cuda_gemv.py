"""The decode GEMV with batched loads (csrc/cuda/qsc_gemv.cuh, launched from qsc_fast.cuh for one column).

Everywhere the library is built: each lane's partial sum and the warp's butterfly, run on the host, with the loads of
4 units issued before their dots against 1 at a time (k_matmul<1>'s order): the same floats, bit for bit; and both
against the k_matmul emulation and the CPU kernels. On a GPU, ``gpu_matmat`` with one column runs it (see
tests/test_cuda.py::test_gpu_matmat_matches_cpu).
"""

from __future__ import annotations

import cffi
import numpy as np
import pytest

from quantscope.core.engine import cuda_kernels as ck
from quantscope.core.native import kernels as K
from quantscope.core.quant import ggml_type

from . import test_cuda
from .test_cuda import GPU_KERNEL_TYPES, close_to_cpu, weight_bytes
from .test_native_kernels import activations

cuda_lib = test_cuda.cuda_lib  # the session fixture, shared
CDEF = "int qsc_host_gemv(int type, const uint8_t *w, int64_t rows, int64_t k, const float *x, int batch, float *y);"


@pytest.fixture(scope="module")
def lib(cuda_lib):
    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    return ffi, ffi.dlopen(str(cuda_lib))


def gemv(lib, name: str, w: np.ndarray, rows: int, k: int, x: np.ndarray, batch: int) -> np.ndarray | None:
    ffi, L = lib
    x = np.ascontiguousarray(x, np.float32)
    y = np.full(rows, np.nan, np.float32)
    rc = L.qsc_host_gemv(ggml_type(name).id, ffi.from_buffer("uint8_t[]", w), rows, k, ffi.from_buffer("float[]", x),
                         batch, ffi.from_buffer("float[]", y))
    return y if rc == 0 else None


@pytest.mark.parametrize("name", GPU_KERNEL_TYPES)
def test_batched_loads_change_no_float(lib, name):
    """Widths whose unit counts leave partial batches (and lanes with no unit at all in the last one)."""
    rng = np.random.default_rng(sum(name.encode()) + 5)
    t = ggml_type(name)
    rows = 7
    for k in ((1280, 4352) if t.block_elems == 256 else (96, 9600)):
        w = weight_bytes(name, rows, k, rng)
        x = activations(rng, k)
        one, four = gemv(lib, name, w, rows, k, x, 1), gemv(lib, name, w, rows, k, x, 4)
        assert one is not None and four is not None
        assert np.array_equal(one, four), (name, k)
        assert close_to_cpu(four, ck.host_matmat(t, w, rows, k, x[None])[0]), (name, k)
        assert close_to_cpu(four, K.matmat(t, w, rows, k, x[None])[0]), (name, k)


def test_gemv_refuses_other_types_and_batches(lib):
    rng = np.random.default_rng(1)
    x = np.ones(256, np.float32)
    assert gemv(lib, "Q4_K", weight_bytes("Q4_K", 2, 256, rng), 2, 256, x, 3) is None
    assert gemv(lib, "Q5_K", np.zeros(2 * 176, np.uint8), 2, 256, x, 4) is None
