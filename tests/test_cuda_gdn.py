"""Qwen3.5's gated delta-net layers and gated attention outputs on the CUDA backend (csrc/cuda/qsc_gdn.cuh).

Everywhere the library is built: the device's delta-net math (the depthwise conv with its state, the gates, the
column-by-column recurrence, the RMSNorm x SiLU output gate), compiled for the host, against the CPU block
(csrc/qs_block.c's gdn_mixer) on the same layer description, prefill then decode, outputs and both states; the
gated attention's split and gate; the C check of the group; the GPU-sized qwen35 / qwen35moe fixtures pass the
device check. On a GPU (skipped with the reason otherwise): those fixtures against the CPU engine, prefill, decode
and a branch rewound to a checkpoint.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from quantscope.core.engine import Model
from quantscope.core.engine import cuda_backend as cb
from quantscope.core.engine import cuda_description as cd
from quantscope.core.engine import cuda_library as cl
from quantscope.core.gguf import GGUFFile
from quantscope.core.native import ffi as cpu_ffi
from quantscope.core.native import lib as cpu_lib
from quantscope.core.quant import ggml_type

from . import test_cuda
from .test_cuda import cos_rel, weight_bytes
from .test_cuda_moe import cuda_block

cuda_lib, gpu = test_cuda.cuda_lib, test_cuda.gpu  # the fixtures: the built library, a usable GPU


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
    err = cl.ffi.new("char[512]")
    rc = cl._library().qsc_host_gdn_mixer(cuda_block(cpu_block), cl._p(x, "float *"), x.shape[0],
                                          cl._p(out, "float *"), err, 512)
    assert rc == 0, cl.ffi.string(err).decode()
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
    lib, err = cl._library(), cl.ffi.new("char[512]")
    x = np.zeros((1, 64), np.float32)
    out = np.empty_like(x)

    def run() -> tuple[int, str]:
        rc = lib.qsc_host_gdn_mixer(cuda_block(L.block), cl._p(x, "float *"), 1, cl._p(out, "float *"), err, 512)
        return rc, cl.ffi.string(err).decode()

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


def test_host_qgate_splits_and_gates_as_the_cpu(cuda_lib):
    """wq's output holds each head's query then its gate: the query (+ its bias) goes to q, the attention output
    is multiplied by sigmoid(gate) (qs_block.c's q_gate path, float32)."""
    rng = np.random.default_rng(4)
    T, H, hd = 3, 4, 32
    qg = rng.standard_normal((T, H, 2, hd)).astype(np.float32)
    att = rng.standard_normal((T, H * hd)).astype(np.float32)
    bq = rng.standard_normal(H * hd).astype(np.float32)
    q, out = np.empty((T, H * hd), np.float32), np.empty((T, H * hd), np.float32)
    rc = cl._library().qsc_host_qgate(cl._p(qg, "float *"), cl._p(bq, "float *"), cl._p(att, "float *"), T, H, hd,
                                      cl._p(q, "float *"), cl._p(out, "float *"))
    assert rc == 0
    assert np.array_equal(q, qg[:, :, 0].reshape(T, -1) + bq)
    gate = qg[:, :, 1].reshape(T, -1)
    assert np.allclose(out, att / (np.float32(1) + np.exp(-gate)), rtol=1e-6, atol=0)


# --------------------------------------------------------------------- the qwen35 fixtures, GPU-sized (head 32)
GPU_FIXTURES = [("qwen35", "F32"), ("qwen35", "Q8_0"), ("qwen35moe", "F32")]


@pytest.fixture(scope="module")
def gpu_sized_fixture(tmp_path_factory):
    from . import arch_fixtures as af

    made: dict[tuple[str, str], Model] = {}

    def get(name: str, quant: str) -> Model:
        if (name, quant) not in made:
            spec = af.SPECS[name]
            ff = spec.expert_ff
            spec = dataclasses.replace(spec, expert_ff=ff and max(64, ff),
                                       extra_kv={**spec.extra_kv, "ssm.state_size": 32, "ssm.inner_size": 128,
                                                 "expert_shared_feed_forward_length": 64} if ff else
                                       {**spec.extra_kv, "ssm.state_size": 32, "ssm.inner_size": 128})
            path = tmp_path_factory.mktemp("gpu-fixtures") / f"{name}-{quant}.gguf"
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(af, "N_EMBD", 128)
                mp.setattr(af, "HEAD_DIM", 32)
                mp.setattr(af, "Q35_SSM", (4, 32, 2, 4))
                mp.setitem(af.SPECS, name, spec)
                af.write_fixture(name, path, quant)
            made[(name, quant)] = Model(GGUFFile(path))
        return made[(name, quant)]

    return get


@pytest.mark.parametrize("name,quant", GPU_FIXTURES)
def test_gpu_sized_qwen35_fixtures_pass_the_gpu_check(cuda_lib, gpu_sized_fixture, name, quant):
    model = gpu_sized_fixture(name, quant)
    c = model.config
    assert c.head_dim == 32 and c.ssm_state == 32
    assert any(c.is_recurrent(li) for li in range(c.n_layers)) and not all(c.is_recurrent(li)
                                                                           for li in range(c.n_layers))
    cd.check_config(c)
    desc, _ = cd.model_description(model, 64)
    cd.check_description(desc)


def assert_close_to_cpu(got: np.ndarray, cpu: np.ndarray) -> None:
    """No float64 reference runs delta-net layers: the GPU against the CPU engine, which differ by the order of
    their float sums (and, quantized, by 8-bit activations rounded from slightly different values)."""
    cos, _ = cos_rel(got.reshape(-1, cpu.shape[-1]), cpu.reshape(-1, cpu.shape[-1]))
    assert cos.min() > 0.99 and np.median(cos) > 0.999, cos
    assert (got.reshape(cos.size, -1).argmax(1) == cpu.reshape(cos.size, -1).argmax(1)).mean() >= 0.9


def _backend(request: pytest.FixtureRequest, host: bool) -> None:
    """The built library (host emulation of the device's forward) or a usable GPU (else skipped)."""
    request.getfixturevalue("cuda_lib" if host else "gpu")


@pytest.mark.parametrize("host", [True, False], ids=["host-emulation", "gpu"])
@pytest.mark.parametrize("name,quant", GPU_FIXTURES)
def test_qwen35_fixtures_on_the_device_forward_match_cpu(request, gpu_sized_fixture, name, quant, host):
    """Delta-net layers (their state in the device session) and gated attention: prefill of 40 tokens, then 8
    decode steps (on a GPU a CUDA graph replaying the state's kernels), against the CPU engine; on the host the
    device's forward with every kernel replaced by its host twin (qwen35moe's experts included)."""
    _backend(request, host)
    model = gpu_sized_fixture(name, quant)
    ids = [int(i) for i in np.random.default_rng(9).integers(3, model.config.n_vocab, 48)]
    cpu = model.session(64).forward(ids, all_logits=True)
    with cb.CudaSession(model, 64, host_emulation=host) as s:
        assert s.recurrent
        got = np.concatenate([s.forward(ids[:40], all_logits=True), np.stack([s.forward([t]) for t in ids[40:]])])
    assert_close_to_cpu(got, cpu)


@pytest.mark.parametrize("host", [True, False], ids=["host-emulation", "gpu"])
def test_qwen35_chunked_prefill_and_branches_follow_the_cpu(request, gpu_sized_fixture, host):
    """The state carries across prefill chunks (max_batch 8); a checkpoint after the prompt, decode, then truncate
    back into the decoded part returns to the checkpoint, and the other branch's logits are the CPU session's
    doing the same; a truncate before the checkpoint starts over from position 0."""
    _backend(request, host)
    model = gpu_sized_fixture("qwen35", "F32")
    rng = np.random.default_rng(10)
    ids = [int(i) for i in rng.integers(3, model.config.n_vocab, 24)]
    alt = [int(i) for i in rng.integers(3, model.config.n_vocab, 4)]
    cpu = model.session(64)
    with cb.CudaSession(model, 64, max_batch=8, host_emulation=host) as s:
        outs = []
        for sess in (cpu, s):
            first = sess.forward(ids[:20])
            sess.checkpoint()
            for t in ids[20:]:
                sess.forward([t])
            sess.truncate(22)
            assert sess.n_past == 20
            branch = np.stack([sess.forward([t]) for t in alt])
            sess.truncate(5)
            assert sess.n_past == 0
            again = sess.forward(ids[:20])
            outs.append((first, branch, again))
        (c_first, c_branch, c_again), (g_first, g_branch, g_again) = outs
    assert_close_to_cpu(g_first[None], c_first[None])
    assert_close_to_cpu(g_branch, c_branch)
    assert np.array_equal(c_again, c_first)  # the CPU restarts from zeros
    assert np.allclose(g_again, g_first, rtol=1e-5, atol=1e-5 * np.abs(g_first).max())


def test_estimate_covers_a_qwen35_session(cuda_lib, gpu_sized_fixture):
    """The device estimate counts the delta-net state, its checkpoint, the mixer's and the gated attention's
    scratch: at least what a (host-emulated) session allocates for them, and not far above it."""
    from quantscope.core.engine import cuda_fit as fit

    model = gpu_sized_fixture("qwen35", "F32")
    est = fit.device_estimate(model, 64, max_batch=64)
    with cb.CudaSession(model, 64, max_batch=64, host_emulation=True) as s:
        s.forward([3 + i % 100 for i in range(64)], all_logits=True)  # a full chunk: every buffer allocated
        held = s.device_bytes
    assert held <= est.weights + est.kv + est.scratch <= 1.3 * held


def test_recurrent_state_operations(cuda_lib, gpu_sized_fixture):
    """qsc_recurrent_state says whether a model has a recurrent state and refuses an unknown operation; a
    checkpoint is restored exactly (host emulation: the same logits after returning to it)."""
    model = gpu_sized_fixture("qwen35", "F32")
    lib, err = cl._library(), cl.ffi.new("char[512]")
    with cb.CudaSession(model, 64, host_emulation=True) as s:
        assert lib.qsc_recurrent_state(s._m, 3, err, 512) == 1
        assert lib.qsc_recurrent_state(s._m, 4, err, 512) < 0 and "not 0..3" in cl.ffi.string(err).decode()
        s.forward([5, 6, 7])
        s.checkpoint()
        a = s.forward([8])
        s.forward([9, 10])
        s.truncate(3)
        assert s.n_past == 3
        assert np.array_equal(s.forward([8]), a)
