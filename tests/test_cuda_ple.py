"""gemma4's per-layer embeddings on the CUDA backend (csrc/cuda/qsc_ple.cuh).

Everywhere the library is built: the device's per-layer embedding step (x += RMSNorm(proj(GELU-tanh(gate x) *
inputs)) * post_norm), compiled for the host, against the CPU block (the end of csrc/qs_block.c's block_forward)
on the same layer description; the C check of the group.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from quantscope.core.engine import cuda_backend as cb
from quantscope.core.native import ffi as cpu_ffi
from quantscope.core.native import lib as cpu_lib
from quantscope.core.quant import ggml_type

from . import test_cuda
from .test_cuda import weight_bytes
from .test_cuda_moe import cuda_block

cuda_lib = test_cuda.cuda_lib  # the fixture: the built library


class PleLayer:
    """One CPU ``qs_block`` whose attention and FFN add nothing (zero matrices, no norms) and which has a
    per-layer embedding group, with the arrays its pointers reach."""

    def __init__(self, rng: np.random.Generator, *, E: int = 64, P: int = 32, wtype: str = "F32") -> None:
        self.keep: list[Any] = []
        self.E, self.P = E, P
        b = self.block = cpu_ffi.new("qs_block *")
        b.n_embd, b.eps = E, 1e-6
        a = b.attn
        a.n_head = a.n_head_kv = 1
        a.head_dim = 32
        for field, shape in (("wq", (32, E)), ("wk", (32, E)), ("wv", (32, E)), ("wo", (E, 32))):
            self._weight(getattr(a, field), np.zeros(shape, np.float32).view(np.uint8).reshape(-1), "F32", *shape)
        a.scale, a.n_ctx = 1.0, 16
        for field in ("k_cache", "v_cache"):
            arr = np.zeros(16 * 32 * 4, np.uint8)
            self.keep.append(arr)
            setattr(a, field, cpu_ffi.cast("void *", cpu_ffi.from_buffer(arr)))
        a.k_cache_bytes = a.v_cache_bytes = 16 * 32 * 4
        b.rope.dim, b.rope.base = 32, 10000.0
        f = b.ffn
        f.n_ff = 32
        for field, shape in (("gate", (32, E)), ("up", (32, E)), ("down", (E, 32))):
            self._weight(getattr(f, field), np.zeros(shape, np.float32).view(np.uint8).reshape(-1), "F32", *shape)
        p = b.ple
        p.dim = P
        self._weight(p.gate, weight_bytes(wtype, P, E, rng), wtype, P, E)
        self._weight(p.proj, weight_bytes(wtype, E, P, rng), wtype, E, P)
        post = 1.0 + rng.standard_normal(E).astype(np.float32) * 0.1
        self.keep.append(post)
        p.post_norm.ptr, p.post_norm.len = cpu_ffi.cast("float *", cpu_ffi.from_buffer(post)), E

    def _weight(self, w: Any, data: np.ndarray, tname: str, rows: int, k: int) -> None:
        data = np.ascontiguousarray(data)
        self.keep.append(data)
        w.ptr = cpu_ffi.cast("uint8_t *", cpu_ffi.from_buffer(data))
        w.type, w.bytes, w.rows, w.k = ggml_type(tname).id, data.nbytes, rows, k

    def inputs(self, ple_in: np.ndarray) -> None:
        ple_in = np.ascontiguousarray(ple_in, np.float32)
        self.keep.append(ple_in)
        self.block.ple.inputs = cpu_ffi.cast("float *", cpu_ffi.from_buffer(ple_in))
        self.block.ple.inputs_len = ple_in.size

    def cpu(self, x: np.ndarray) -> np.ndarray:
        y = np.ascontiguousarray(x, np.float32).copy()
        T = y.shape[0]
        pos = np.arange(T, dtype=np.int32)
        rc = cpu_lib.qs_block_forward(self.block, cpu_ffi.cast("float *", cpu_ffi.from_buffer(y)), T,
                                      cpu_ffi.cast("int32_t *", cpu_ffi.from_buffer(pos)), 0, 1)
        assert rc == 0, rc
        return y

    def host(self, x: np.ndarray) -> np.ndarray:
        y = np.ascontiguousarray(x, np.float32).copy()
        err = cb.ffi.new("char[512]")
        rc = cb._library().qsc_host_ple(cuda_block(self.block), cb._p(y, "float *"), y.shape[0], err, 512)
        assert rc == 0, cb.ffi.string(err).decode()
        return y


@pytest.mark.parametrize("wtype,P,T", [("F32", 32, 1), ("F32", 64, 7), ("Q8_0", 32, 5), ("Q4_K", 256, 3)])
def test_host_ple_matches_the_cpu_block(cuda_lib, wtype, P, T):
    rng = np.random.default_rng(P + T)
    E = 256 if wtype == "Q4_K" else 64
    L = PleLayer(rng, E=E, P=P, wtype=wtype)
    x = rng.standard_normal((T, E)).astype(np.float32)
    L.inputs(rng.standard_normal((T, P)).astype(np.float32))
    want, got = L.cpu(x), L.host(x)
    assert not np.allclose(want, x)  # the step really adds something
    scale = float(np.abs(want - x).max())
    assert float(np.abs(got - want).max()) <= 2e-5 * max(scale, float(np.abs(x).max()))


def test_host_ple_refuses_bad_groups(cuda_lib):
    rng = np.random.default_rng(1)
    L = PleLayer(rng)
    x = np.zeros((2, 64), np.float32)
    lib, err = cb._library(), cb.ffi.new("char[512]")

    def run() -> tuple[int, str]:
        rc = lib.qsc_host_ple(cuda_block(L.block), cb._p(x, "float *"), 2, err, 512)
        return rc, cb.ffi.string(err).decode()

    L.inputs(np.zeros((1, 32), np.float32))  # one token's inputs for two tokens
    rc, why = run()
    assert rc != 0 and "inputs" in why
    L.inputs(np.zeros((2, 32), np.float32))
    assert run()[0] == 0
    L.block.ple.post_norm.len = 63
    rc, why = run()
    assert rc != 0 and "post norm" in why
    L.block.ple.post_norm.len = 64
    L.block.ple.gate.rows = 31
    rc, why = run()
    assert rc != 0 and "gate" in why
