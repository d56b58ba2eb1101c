"""Qwen3.5's gated delta-net layers on the CUDA backend (csrc/cuda/qsc_gdn.cuh).

Everywhere the library is built: the device's delta-net math (the depthwise conv with its state, the gates, the
column-by-column recurrence, the RMSNorm x SiLU output gate), compiled for the host, against the CPU block
(csrc/qs_block.c's gdn_mixer) on the same layer description, prefill then decode, outputs and both states; the C
check of the group. The whole-model GPU comparison is in tests/test_cuda_gdn_gpu.py's manner below (skipped
without a GPU).
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


class GdnLayer:
    """One CPU ``qs_block`` whose attention is a gated delta-net and whose FFN adds nothing (zero matrices, no
    norms: the mixer's input is x itself), with two copies of the recurrent state: the CPU's and the host
    emulation's."""

    def __init__(self, rng: np.random.Generator, *, E: int = 64, S: int = 32, Hk: int = 2, Hv: int = 4, K: int = 4,
                 wtype: str = "F32", state: bool = False) -> None:
        self.keep: list[Any] = []
        self.E, self.S, self.Hk, self.Hv, self.K = E, S, Hk, Hv, K
        Kd, Vd = Hk * S, Hv * S
        C = self.C = 2 * Kd + Vd
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
        g = b.gdn
        g.conv, g.state, g.k_heads, g.v_heads = K, S, Hk, Hv
        for field, rows, k in (("qkv", C, E), ("z", Vd, E), ("beta", Hv, E), ("alpha", Hv, E), ("out", E, Vd)):
            self._weight(getattr(g, field), weight_bytes(wtype, rows, k, rng), wtype, rows, k)
        self._vec(g.conv_w, rng.standard_normal(C * K).astype(np.float32) * 0.5)
        self._vec(g.dt_bias, rng.standard_normal(Hv).astype(np.float32))
        self._vec(g.a, -np.exp(rng.standard_normal(Hv).astype(np.float32) * 0.5))
        self._vec(g.norm, 1.0 + rng.standard_normal(S).astype(np.float32) * 0.1)
        self.conv_cpu = np.zeros((K - 1) * C, np.float32)
        self.ssm_cpu = np.zeros(Hv * S * S, np.float32)
        if state:  # a sequence already under way
            self.conv_cpu[:] = rng.standard_normal(self.conv_cpu.size) * 0.5
            self.ssm_cpu[:] = rng.standard_normal(self.ssm_cpu.size) * 0.1
        self.conv_host, self.ssm_host = self.conv_cpu.copy(), self.ssm_cpu.copy()

    def _weight(self, w: Any, data: np.ndarray, tname: str, rows: int, k: int) -> None:
        data = np.ascontiguousarray(data)
        self.keep.append(data)
        w.ptr = cpu_ffi.cast("uint8_t *", cpu_ffi.from_buffer(data))
        w.type, w.bytes, w.rows, w.k = ggml_type(tname).id, data.nbytes, rows, k

    def _vec(self, v: Any, data: np.ndarray) -> None:
        self.keep.append(data)
        v.ptr, v.len = cpu_ffi.cast("float *", cpu_ffi.from_buffer(data)), data.size

    def _bind(self, conv: np.ndarray, ssm: np.ndarray) -> None:
        g = self.block.gdn
        g.conv_state = cpu_ffi.cast("float *", cpu_ffi.from_buffer(conv)) if conv.size else cpu_ffi.NULL
        g.ssm_state = cpu_ffi.cast("float *", cpu_ffi.from_buffer(ssm))
        g.conv_state_len, g.ssm_state_len = conv.size, ssm.size

    def cpu(self, x: np.ndarray, n_past: int = 0) -> np.ndarray:
        """The mixer's output as the CPU block adds it to x (x + gdn(x) - x), the CPU's state advanced."""
        self._bind(self.conv_cpu, self.ssm_cpu)
        y = np.ascontiguousarray(x, np.float32).copy()
        T = y.shape[0]
        pos = np.arange(n_past, n_past + T, dtype=np.int32)
        rc = cpu_lib.qs_block_forward(self.block, cpu_ffi.cast("float *", cpu_ffi.from_buffer(y)), T,
                                      cpu_ffi.cast("int32_t *", cpu_ffi.from_buffer(pos)), n_past, 1)
        assert rc == 0, rc
        return y - x

    def host(self, x: np.ndarray) -> np.ndarray:
        """The mixer as the device computes it, compiled for the host, the host's state advanced."""
        self._bind(self.conv_host, self.ssm_host)
        return host_gdn(self.block, x)


def host_gdn(cpu_block: Any, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty_like(x)
    err = cb.ffi.new("char[512]")
    rc = cb._library().qsc_host_gdn_mixer(cuda_block(cpu_block), cb._p(x, "float *"), x.shape[0],
                                          cb._p(out, "float *"), err, 512)
    assert rc == 0, cb.ffi.string(err).decode()
    return out


def assert_close(got: np.ndarray, want: np.ndarray, rtol: float) -> None:
    """Float rounding apart: the two sum the projections and the squared norms in different orders."""
    scale = float(np.abs(want).max())
    assert scale > 0
    err = float(np.abs(got - want).max())
    assert err <= rtol * scale, (err, scale)


# ------------------------------------------------------------------------------ host emulation against the CPU
@pytest.mark.parametrize("wtype,S,Hk,Hv,K,state", [
    ("F32", 32, 2, 4, 4, False),
    ("F32", 32, 1, 3, 1, True),   # conv of one tap: no conv state at all
    ("Q8_0", 64, 2, 2, 4, True),
    ("F32", 128, 1, 2, 4, False),  # Qwen3.5's head size
])
def test_host_mixer_matches_the_cpu_block_prefill_then_decode(cuda_lib, wtype, S, Hk, Hv, K, state):
    rng = np.random.default_rng(S + Hv + K)
    L = GdnLayer(rng, E=64, S=S, Hk=Hk, Hv=Hv, K=K, wtype=wtype, state=state)
    n_past = 0
    for T in (5, 1, 1, 3, 1):  # a prompt, decoded tokens, another prompt chunk
        x = rng.standard_normal((T, 64)).astype(np.float32)
        want = L.cpu(x, n_past)
        got = L.host(x)
        assert_close(got, want, 2e-4)
        assert_close(L.ssm_host, L.ssm_cpu, 2e-5)
        if K > 1:
            assert_close(L.conv_host, L.conv_cpu, 1e-6)
        n_past += T
    assert np.abs(L.ssm_cpu).max() > 1e-3  # the state really moved


def test_host_conv_state_holds_the_last_inputs(cuda_lib):
    """After a call of fewer tokens than the conv's width the state is the old rows shifted plus the new ones:
    with a zero kernel the mixer's output is zero and the state is exactly the projection's last K - 1 rows."""
    rng = np.random.default_rng(5)
    L = GdnLayer(rng, K=4, state=True)
    L.block.gdn.conv_w.ptr[0:L.C * 4] = [0.0] * (L.C * 4)
    before = L.conv_host.reshape(3, L.C).copy()
    x = rng.standard_normal((1, 64)).astype(np.float32)
    L.host(x)
    after = L.conv_host.reshape(3, L.C)
    assert np.array_equal(after[:2], before[1:])
    L.cpu(x)
    assert np.array_equal(L.conv_cpu.reshape(3, L.C)[:2], before[1:])
    assert np.allclose(after[2], L.conv_cpu.reshape(3, L.C)[2], rtol=1e-5, atol=1e-6)


def test_host_mixer_refuses_bad_groups(cuda_lib):
    rng = np.random.default_rng(2)
    L = GdnLayer(rng)
    lib, err = cb._library(), cb.ffi.new("char[512]")
    x = np.zeros((1, 64), np.float32)
    out = np.empty_like(x)

    def run() -> tuple[int, str]:
        rc = lib.qsc_host_gdn_mixer(cuda_block(L.block), cb._p(x, "float *"), 1, cb._p(out, "float *"), err, 512)
        return rc, cb.ffi.string(err).decode()

    L._bind(L.conv_host, L.ssm_host)
    assert run()[0] == 0
    L.block.gdn.ssm_state_len -= 1
    rc, why = run()
    assert rc != 0 and "state" in why
    L._bind(L.conv_host, L.ssm_host)
    L.block.gdn.v_heads = 3  # not a multiple of k_heads 2
    rc, why = run()
    assert rc != 0 and "heads" in why
    L.block.gdn.v_heads = 4
    L.block.gdn.norm.len = 31
    rc, why = run()
    assert rc != 0 and "norm" in why
