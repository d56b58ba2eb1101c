"""The dense architecture features of the CUDA backend (csrc/cuda/qsc_arch.cuh, qsc_kernels.cuh) against the CPU block.

Everywhere the library is built: the per-element math the kernels use (RoPE with frequency factors, linear and YaRN
scaling and the attention factor, NoPE, q/k norms per head and over the whole projection, the query temperature,
soft-capped scores with sinks, any head size, the gated units, the residual and logit multipliers) runs on the host
the way the kernels run it (qsc_host_*), and must give the CPU block's numbers; the description check accepts every
such feature and refuses values the device cannot use. On a GPU (skipped otherwise): the kernels themselves, against
the same CPU numbers (tests/run_gpu.sh).
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from quantscope.core.engine import cuda_description as cd
from quantscope.core.engine import cuda_kernels as ck
from quantscope.core.engine import cuda_library as cl
from quantscope.core.model import ModelConfig, UnsupportedModel
from quantscope.core.native import ffi as cpu_ffi
from quantscope.core.native import lib as cpu_lib
from quantscope.core.native import nn

from . import test_cuda

cuda_lib, gpu, synthetic_tiny = test_cuda.cuda_lib, test_cuda.gpu, test_cuda.synthetic_tiny  # its fixtures

#: RoPE variants of the architectures (rot_dim, description fields): (name, head size, rope_desc keyword arguments)
ROPES = [
    ("plain", 64, dict(rot_dim=64, base=10000.0)),
    ("neox-partial", 80, dict(rot_dim=48, base=1e6, neox=True)),  # phi/stablelm-like: a part of a head of 80
    ("llama3-factors", 16, dict(rot_dim=16, base=500000.0,
                                factors=np.array([1, 1, 1, 1.5, 2.5, 4, 8, 8], np.float32))),
    ("linear", 32, dict(rot_dim=32, base=1e6, neox=True, freq_scale=0.125)),  # gemma3's global layers
    ("yarn", 16, dict(rot_dim=16, base=10000.0, freq_scale=0.25, ext_factor=1.0, corr=(2.0, 6.0))),
    ("yarn-gpt-oss", 64, dict(rot_dim=64, base=150000.0, neox=True, freq_scale=1 / 32, ext_factor=1.0,
                              corr=(8.09, 17.4), mscale=1.0)),
    ("longrope", 16, dict(rot_dim=12, base=10000.0, neox=True, mscale=1.19,
                          factors=np.array([1.0, 1.2, 2.0, 4.0, 9.0, 16.0], np.float32))),
    ("mscale-zero-means-one", 32, dict(rot_dim=32, base=10000.0, mscale=0.0, freq_scale=0.0)),
]


def cpu_rope(x: np.ndarray, pos: np.ndarray, rot_dim: int, *, base: float, neox: bool = False,
             freq_scale: float = 1.0, ext_factor: float = 0.0, corr: tuple[float, float] = (0.0, 0.0),
             mscale: float = 1.0, factors: np.ndarray | None = None) -> np.ndarray:
    """The CPU block's qs_rope_ext on a copy of ``x`` (T, heads, hd), with its 0-means-1 scales."""
    y = np.ascontiguousarray(x, np.float32).copy()
    f = None if factors is None else np.ascontiguousarray(factors, np.float32)
    fp = cpu_ffi.NULL if f is None else cpu_ffi.cast("float *", cpu_ffi.from_buffer(f))
    rp = cpu_ffi.new("qs_rope_params *", (base, freq_scale or 1.0, int(neox), fp, ext_factor, corr[0], corr[1],
                                          mscale or 1.0))
    p = np.ascontiguousarray(pos, np.int32)
    rc = cpu_lib.qs_rope_ext(cpu_ffi.cast("float *", cpu_ffi.from_buffer(y)), y.shape[0], y.shape[1], y.shape[2],
                             rot_dim, cpu_ffi.cast("int32_t *", cpu_ffi.from_buffer(p)), rp)
    assert rc == 0
    return y


def close(got: np.ndarray, want: np.ndarray, tol: float = 2e-6) -> bool:
    """Equal to float rounding: the host build and the CPU library are the same formulas compiled twice (one may
    fuse a multiply-add the other does not)."""
    return bool(np.allclose(got, want, rtol=tol, atol=tol * max(1.0, float(np.abs(want).max()))))


POS = np.array([0, 1, 7, 31, 100, 513, 4000, 65535], np.int32)


# ------------------------------------------------------------------------------------ host emulation vs the CPU
@pytest.mark.parametrize(("name", "hd", "kw"), ROPES, ids=[r[0] for r in ROPES])
def test_host_rope_matches_the_cpu_block(cuda_lib, name, hd, kw):
    rng = np.random.default_rng(sum(name.encode()))
    q = rng.standard_normal((POS.size, 4, hd)).astype(np.float32)
    k = rng.standard_normal((POS.size, 2, hd)).astype(np.float32)
    kw = dict(kw)
    rot = kw.pop("rot_dim")
    rope, _keep = ck.rope_desc(rot, **kw)
    gq, gk = ck.host_qk_post(q, k, POS, rope)
    assert close(gq, cpu_rope(q, POS, rot, **kw)) and close(gk, cpu_rope(k, POS, rot, **kw)), name
    assert np.array_equal(gq[..., rot:], q[..., rot:])  # the values past the rotated ones stay


def test_host_rope_scalings_change_the_result(cuda_lib):
    """Each scaling the host emulation applies matters (the test above would notice it missing)."""
    rng = np.random.default_rng(1)
    q = rng.standard_normal((POS.size, 2, 16)).astype(np.float32)
    plain = ck.host_qk_post(q, None, POS, ck.rope_desc(16)[0])[0]
    for kw in (dict(freq_scale=0.25), dict(ext_factor=1.0, freq_scale=0.25, corr=(2.0, 6.0)), dict(mscale=1.19),
               dict(factors=np.full(8, 2.0, np.float32))):
        rope, _keep = ck.rope_desc(16, **kw)
        assert not np.allclose(ck.host_qk_post(q, None, POS, rope)[0], plain, atol=1e-3), kw


def test_host_nope_layers_are_not_rotated(cuda_lib):
    rng = np.random.default_rng(2)
    q = rng.standard_normal((POS.size, 4, 64)).astype(np.float32)
    k = rng.standard_normal((POS.size, 2, 64)).astype(np.float32)
    rope, _keep = ck.rope_desc(64, skip=True, factors=np.full(32, 2.0, np.float32))
    gq, gk = ck.host_qk_post(q, k, POS, rope)
    assert np.array_equal(gq, q) and np.array_equal(gk, k)


@pytest.mark.parametrize("full", [False, True], ids=["per-head", "whole-projection"])
def test_host_qk_norms_then_rope_match_the_cpu_block(cuda_lib, full):
    """qwen3/gemma3 (per head) and olmo2 (over the whole projection): RMSNorm with its weight, then RoPE."""
    rng = np.random.default_rng(3)
    T, H, KV, hd, eps = POS.size, 4, 2, 48, 1e-6
    q = (rng.standard_normal((T, H, hd)) * 3).astype(np.float32)
    k = (rng.standard_normal((T, KV, hd)) * 3).astype(np.float32)
    qn = rng.standard_normal(H * hd if full else hd).astype(np.float32)
    kn = rng.standard_normal(KV * hd if full else hd).astype(np.float32)
    rope, _keep = ck.rope_desc(hd, base=1e6, neox=True)
    gq, gk = ck.host_qk_post(q, k, POS, rope, q_norm=qn, k_norm=kn, qk_full=full, eps=eps)
    if full:
        wq = nn.rmsnorm(q.reshape(T, H * hd), qn, eps).reshape(T, H, hd)
        wk = nn.rmsnorm(k.reshape(T, KV * hd), kn, eps).reshape(T, KV, hd)
    else:
        wq, wk = nn.rmsnorm(q, qn, eps), nn.rmsnorm(k, kn, eps)
    assert close(gq, cpu_rope(wq, POS, hd, base=1e6, neox=True), 2e-5)
    assert close(gk, cpu_rope(wk, POS, hd, base=1e6, neox=True), 2e-5)
    other = ck.host_qk_post(q, k, POS, rope, q_norm=qn if not full else qn[:hd], k_norm=kn if not full else kn[:hd],
                            qk_full=False, eps=eps) if full else None
    assert other is None or not np.allclose(other[0], gq, atol=1e-3)  # the span of the norm matters


def test_host_query_temperature(cuda_lib):
    """Llama 4 / Ministral 3: queries (after RoPE) times 1 + scale * ln(floor(p / floor) + 1); keys untouched."""
    rng = np.random.default_rng(4)
    q = rng.standard_normal((POS.size, 2, 32)).astype(np.float32)
    k = rng.standard_normal((POS.size, 1, 32)).astype(np.float32)
    rope, _keep = ck.rope_desc(32)
    gq, gk = ck.host_qk_post(q, k, POS, rope, temp_scale=0.4, temp_floor=16)
    f = (np.log(np.floor(POS.astype(np.float64) / 16) + 1) * np.float64(np.float32(0.4)) + 1).astype(np.float32)
    assert close(gq, cpu_rope(q, POS, 32, base=10000.0) * f[:, None, None])
    assert close(gk, cpu_rope(k, POS, 32, base=10000.0))


ATTN = [  # (head size, window, soft-cap, sinks, KV dtype)
    (16, 0, 0.0, False, np.float32), (16, 5, 1.5, False, np.float16), (80, 0, 0.0, True, np.float32),
    (64, 16, 0.0, True, np.float16), (128, 0, 50.0, False, np.float32), (200, 3, 30.0, True, np.float32),
    (512, 0, 0.0, False, np.float16),
]


@pytest.mark.parametrize(("hd", "window", "softcap", "sinks", "dtype"), ATTN)
def test_host_attention_matches_the_cpu(cuda_lib, hd, window, softcap, sinks, dtype):
    """k_attention's arithmetic (8 online softmaxes merged, the sink joining at the merge, soft-capped scores) for
    head sizes that are not multiples of 32 or beyond 256, against the CPU's qs_attention_sinks."""
    rng = np.random.default_rng(hd + window)
    n_ctx, KV, H = 40, 2, 6
    k = rng.standard_normal((n_ctx, KV, hd)).astype(dtype)
    v = rng.standard_normal((n_ctx, KV, hd)).astype(dtype)
    q = (rng.standard_normal((5, H, hd)) * 0.5).astype(np.float32)
    q_pos = np.array([0, 3, 9, 20, 29], np.int32)
    sk = (rng.standard_normal(H) * 2).astype(np.float32) if sinks else None
    scale = 1 / np.sqrt(hd)
    want = nn.attention(q, q_pos, k, v, 30, scale=scale, window=window, softcap=softcap, sinks=sk)
    got = ck.host_attention(q, q_pos, k, v, 30, scale=scale, window=window, softcap=softcap, sinks=sk)
    assert np.allclose(got, want, rtol=1e-4, atol=1e-5), np.abs(got - want).max()
    if sinks or softcap:  # each matters
        plain = ck.host_attention(q, q_pos, k, v, 30, scale=scale, window=window)
        assert not np.allclose(plain, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["swiglu", "gelu", "swiglu_oai"])
def test_host_gated_units_match_the_cpu(cuda_lib, mode):
    rng = np.random.default_rng(5)
    g = (rng.standard_normal(4096) * 5).astype(np.float32)
    u = (rng.standard_normal(4096) * 5).astype(np.float32)
    g[:4], u[:4] = [8.0, -8.0, 7.0, 100.0], [9.0, -9.0, -100.0, 0.5]  # gpt-oss's clamps on both sides
    want = {"swiglu": nn.swiglu, "gelu": nn.geglu_tanh, "swiglu_oai": nn.swiglu_oai}[mode](g, u)
    tol = 2e-6 if mode == "swiglu_oai" else 1e-5  # the CPU's SiLU / GELU are SIMD approximations (test_native_nn)
    assert np.allclose(ck.host_glu(g, u, mode), want, rtol=tol, atol=tol)


@pytest.mark.parametrize(("scale", "cap"), [(0.5, 0.0), (1.0, 6.0), (0.25, 30.0), (0.0, 0.0)])
def test_host_logit_multiplier_and_final_softcap(cuda_lib, scale, cap):
    """granite's logits / logit_scale and gemma2's tanh(x / cap) * cap, as the CPU session's head does them."""
    x = (np.random.default_rng(6).standard_normal(1000) * 20).astype(np.float32)
    want = x / np.float32(scale) if scale not in (0.0, 1.0) else x.copy()
    if cap:
        want = np.tanh(want / np.float32(cap)) * np.float32(cap)
    assert np.allclose(ck.host_logits(x, scale, cap), want, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("post", [False, True])
def test_host_residual_multipliers(cuda_lib, post):
    """The residual update of the CPU block: post norm, times residual_scale, added, times the layer's out_scale."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    o = (rng.standard_normal((3, 256)) * 4).astype(np.float32)
    w = rng.standard_normal(256).astype(np.float32) if post else None
    got = ck.host_residual(x, o, w, eps=1e-6, rs=0.4, out_scale=0.5)
    oo = nn.rmsnorm(o, w, 1e-6) if post else o
    assert np.allclose(got, (x + oo * np.float32(0.4)) * np.float32(0.5), rtol=1e-5, atol=1e-6)


def test_host_entry_points_refuse_bad_arguments(cuda_lib):
    q = np.zeros((2, 2, 16), np.float32)
    with pytest.raises(cl.CudaError):  # frequency factors of the wrong count
        ck.host_qk_post(q, None, [0, 1], ck.rope_desc(16, factors=np.ones(7, np.float32))[0])
    with pytest.raises(cl.CudaError):  # a factor that is not a finite positive number
        ck.host_qk_post(q, None, [0, 1], ck.rope_desc(16, factors=np.array([1] * 7 + [0], np.float32))[0])
    with pytest.raises(cl.CudaError):
        ck.host_qk_post(q, None, [0, 1], ck.rope_desc(18)[0])  # rotates more than the head
    with pytest.raises(cl.CudaError):
        ck.host_qk_post(q, None, [0, -1], ck.rope_desc(16)[0])
    with pytest.raises(cl.CudaError):
        ck.host_qk_post(q, None, [0, 1], ck.rope_desc(16)[0], temp_scale=0.1, temp_floor=0)
    with pytest.raises(ValueError, match="go together"):
        ck.host_qk_post(q, q, [0, 1], ck.rope_desc(16)[0], q_norm=np.ones(16, np.float32))
    kc = np.zeros((4, 1, 16), np.float32)
    with pytest.raises(ValueError, match="sinks must be finite"):
        ck.host_attention(q, [0, 1], kc, kc, 2, scale=1.0, sinks=np.array([0, np.nan], np.float32))
    with pytest.raises(ValueError, match="soft-cap"):
        ck.host_attention(q, [0, 1], kc, kc, 2, scale=1.0, softcap=-1.0)
    with pytest.raises(ValueError, match=re.escape("1..1024")):
        ck.host_attention(np.zeros((1, 1, 1040), np.float32), [0], np.zeros((1, 1, 1040), np.float32),
                          np.zeros((1, 1, 1040), np.float32), 1, scale=1.0)
    with pytest.raises(ValueError, match="gated unit"):
        ck.host_glu(q, q, "relu")


# ------------------------------------------------------------------------------------ the description check
#: features of the CPU block that the GPU now computes: each set on layer 1 of the synthetic model's description
_ACCEPTED = [
    ("rope factors", lambda b, keep: _vec(b.rope.freqs, np.linspace(1, 8, b.rope.dim // 2), keep)),
    ("NoPE", lambda b, keep: setattr(b.rope, "skip", 1)),
    ("linear scaling", lambda b, keep: setattr(b.rope, "freq_scale", 0.25)),
    ("YaRN", lambda b, keep: [setattr(b.rope, f, v) for f, v in (("ext_factor", 1.0), ("corr0", 2.0),
                                                                  ("corr1", 6.0), ("mscale", 1.1))]),
    ("temperature", lambda b, keep: [setattr(b.attn, "temp_scale", 0.1), setattr(b.attn, "temp_floor", 8)]),
    ("soft-cap", lambda b, keep: setattr(b.attn, "softcap", 50.0)),
    ("multipliers", lambda b, keep: [setattr(b, "residual_scale", 0.2), setattr(b, "out_scale", 0.5)]),
    ("sinks", lambda b, keep: _vec(b.attn.sinks, np.zeros(b.attn.n_head), keep)),
    ("output bias", lambda b, keep: _vec(b.attn.bo, np.zeros(b.n_embd), keep)),
    ("whole-projection q/k norms", lambda b, keep: [
        setattr(b.attn, "qk_norm_full", 1), _vec(b.attn.q_norm, np.ones(b.attn.n_head * b.attn.head_dim), keep),
        _vec(b.attn.k_norm, np.ones(b.attn.n_head_kv * b.attn.head_dim), keep)]),
    ("clamped SwiGLU", lambda b, keep: setattr(b.ffn, "swiglu_oai", 1)),
    ("no pre-norms", lambda b, keep: [_vec(b.attn_norm, None, keep), _vec(b.ffn_norm, None, keep)]),
    ("V norms", lambda b, keep: setattr(b.attn, "v_norm", 1)),
]


def _vec(v, values, keep) -> None:
    if values is None:
        v.ptr, v.len = cl.ffi.NULL, 0
        return
    a = np.ascontiguousarray(values, np.float32)
    keep.append(a)
    v.ptr, v.len = cl.ffi.cast("float *", cl.ffi.from_buffer(a)), a.size


@pytest.mark.parametrize(("name", "change"), _ACCEPTED, ids=[a[0] for a in _ACCEPTED])
def test_the_description_check_accepts_the_dense_features(cuda_lib, synthetic_tiny, name, change):
    """Each feature the device used to refuse by name now passes qsc_check_model (what qsc_model_create runs before
    touching the device)."""
    desc, _ = cd.model_description(synthetic_tiny, 64)
    keep: list[object] = []
    change(desc.layers[1], keep)
    cd.check_description(desc)


_REFUSED = [
    (lambda b, keep: _vec(b.rope.freqs, np.ones(b.rope.dim // 2 - 1), keep), "layer 1: rope.freqs has"),
    (lambda b, keep: _vec(b.rope.freqs, [1.0] * (b.rope.dim // 2 - 1) + [0.0], keep), "RoPE frequency factor"),
    (lambda b, keep: _vec(b.attn.sinks, [0.0] * (b.attn.n_head - 1) + [np.inf], keep), "is not finite"),
    (lambda b, keep: setattr(b.attn, "softcap", -1.0), "layer 1: window"),
    (lambda b, keep: setattr(b.rope, "freq_scale", -0.5), "layer 1: RoPE scaling"),
    (lambda b, keep: setattr(b.rope, "ext_factor", float("nan")), "layer 1: RoPE scaling"),
    (lambda b, keep: [setattr(b.attn, "temp_scale", 0.1), setattr(b.attn, "temp_floor", 0)], "temperature"),
    (lambda b, keep: setattr(b, "residual_scale", float("inf")), "layer 1: residual scale"),
    (lambda b, keep: _vec(b.attn.bo, np.zeros(b.n_embd - 1), keep), "layer 1: attn.bo"),
    (lambda b, keep: [setattr(b.attn, "qk_norm_full", 1), _vec(b.attn.q_norm, np.ones(b.attn.head_dim), keep),
                      _vec(b.attn.k_norm, np.ones(b.attn.head_dim), keep)], "layer 1: attn.q_norm"),
    (lambda b, keep: setattr(b.attn, "head_dim", 2048), "layer 1: head size 2048"),
    (lambda b, keep: setattr(b, "n_embd", b.n_embd + 32), "layer 1: n_embd"),
    (lambda b, keep: _probe(b, keep), "layer 1: probes have no CUDA path"),
]


@pytest.mark.parametrize(("change", "message"), _REFUSED, ids=[m for _, m in _REFUSED])
def test_the_description_check_refuses_what_the_device_cannot_use(cuda_lib, synthetic_tiny, change, message):
    desc, _ = cd.model_description(synthetic_tiny, 64)
    keep: list[object] = []
    change(desc.layers[1], keep)
    with pytest.raises(cl.CudaError, match=re.escape(message)):
        cd.check_description(desc)


def test_shared_kv_caches_and_per_layer_embeddings_are_checked(cuda_lib, synthetic_tiny):
    """gemma4's layers reading an earlier layer's KV cache need a kv_source naming one with a cache of its own and
    the same shape; per-layer embeddings need their matrices and post norm, of one width in every layer."""
    desc, _ = cd.model_description(synthetic_tiny, 64)
    b1 = desc.layers[1]
    b1.attn.kv_reuse = 1
    src = np.array([0, 0], np.int32)
    desc.model.kv_source = cl.ffi.cast("int32_t *", cl.ffi.from_buffer(src))
    cd.check_description(desc)  # layer 1 attends to layer 0's cache
    for bad in ([0, 1], [0, 5], [0, -1]):
        src[:] = bad
        with pytest.raises(cl.CudaError, match=re.escape(f"layer 1: kv_source {bad[1]} is not an earlier layer")):
            cd.check_description(desc)
    src[:] = [0, 0]
    b1.attn.n_head_kv = desc.layers[0].attn.n_head_kv * 2 if desc.layers[0].attn.n_head % 2 == 0 else 1
    with pytest.raises(cl.CudaError, match="layer 1"):  # not the shape of layer 0's cache
        cd.check_description(desc)
    desc, _ = cd.model_description(synthetic_tiny, 64)
    desc.layers[0].ple.dim = 32
    with pytest.raises(cl.CudaError, match=re.escape("layer 0: kv_reuse 0 / per-layer embedding 32 (post norm")):
        cd.check_description(desc)


def _probe(b, keep) -> None:
    q = np.zeros(4096, np.float32)
    keep.append(q)
    b.probe.q, b.probe.q_len = cl.ffi.cast("float *", cl.ffi.from_buffer(q)), q.size


def test_final_softcap_and_logit_scale_are_checked(cuda_lib, synthetic_tiny):
    """The model-level scales have a GPU path (gemma2's final soft-cap, granite's logit scale); values the device
    cannot use are refused before any device call."""
    desc, _ = cd.model_description(synthetic_tiny, 64)
    desc.model.final_softcap, desc.model.logit_scale = 30.0, 4.0
    cd.check_description(desc)
    for cap, scale in ((float("nan"), 1.0), (-1.0, 1.0), (0.0, -2.0), (0.0, float("inf"))):
        desc.model.final_softcap, desc.model.logit_scale = cap, scale
        with pytest.raises(cl.CudaError, match="final soft-cap"):
            cd.check_description(desc)


def test_config_check_takes_any_head_size_and_per_layer_shapes():
    llama = ModelConfig("llama", 2, 64, 2, 1, 32, 128, 100, 512, 1e-5, 10000.0, False, 32)
    for ok in (dict(head_dim=16, rope_dim=16), dict(head_dim=80, rope_dim=80), dict(head_dim=512, rope_dim=64),
               dict(layer_n_ff=(128, 64)), dict(final_softcap=30.0, attn_softcap=50.0), dict(logit_scale=4.0),
               dict(residual_scale=0.2), dict(n_expert=4, n_expert_used=2)):
        cfg = dataclasses.replace(llama, **ok)
        cd.check_config(cfg)
    for bad, message in ((dict(head_dim=1040, rope_dim=64), "head size 1040"),
                         (dict(head_dim=24, rope_dim=24, n_head=2), "head size 24"),
                         (dict(layer_n_ff=(128, 48)), "layer 1: n_ff 48")):
        with pytest.raises(UnsupportedModel, match=re.escape(message)):
            cd.check_config(dataclasses.replace(llama, **bad))


# ------------------------------------------------------------------------------------ GPU: the kernels themselves
@pytest.mark.parametrize(("name", "hd", "kw"), ROPES, ids=[r[0] for r in ROPES])
def test_gpu_rope_matches_the_cpu_block(gpu, name, hd, kw):
    rng = np.random.default_rng(sum(name.encode()))
    q = rng.standard_normal((POS.size, 4, hd)).astype(np.float32)
    k = rng.standard_normal((POS.size, 2, hd)).astype(np.float32)
    kw = dict(kw)
    rot = kw.pop("rot_dim")
    rope, _keep = ck.rope_desc(rot, **kw)
    gq, gk = ck.gpu_qk_post(q, k, POS, rope, temp_scale=0.4, temp_floor=16)
    hq, hk = ck.host_qk_post(q, k, POS, rope, temp_scale=0.4, temp_floor=16)
    assert np.allclose(gq, hq, rtol=1e-5, atol=2e-5) and np.allclose(gk, hk, rtol=1e-5, atol=2e-5), name


@pytest.mark.parametrize("full", [False, True])
def test_gpu_qk_norms(gpu, full):
    rng = np.random.default_rng(8)
    q = (rng.standard_normal((5, 4, 48)) * 3).astype(np.float32)
    k = (rng.standard_normal((5, 2, 48)) * 3).astype(np.float32)
    qn = rng.standard_normal(4 * 48 if full else 48).astype(np.float32)
    kn = rng.standard_normal(2 * 48 if full else 48).astype(np.float32)
    rope, _keep = ck.rope_desc(48, neox=True)
    got = ck.gpu_qk_post(q, k, POS[:5], rope, q_norm=qn, k_norm=kn, qk_full=full)
    want = ck.host_qk_post(q, k, POS[:5], rope, q_norm=qn, k_norm=kn, qk_full=full)
    assert all(np.allclose(g, w, rtol=1e-5, atol=2e-5) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize(("hd", "window", "softcap", "sinks", "dtype"), ATTN)
def test_gpu_attention_matches_the_cpu(gpu, hd, window, softcap, sinks, dtype):
    rng = np.random.default_rng(hd + window)
    n_ctx, KV, H = 40, 2, 6
    k = rng.standard_normal((n_ctx, KV, hd)).astype(dtype)
    v = rng.standard_normal((n_ctx, KV, hd)).astype(dtype)
    q = (rng.standard_normal((5, H, hd)) * 0.5).astype(np.float32)
    q_pos = np.array([0, 3, 9, 20, 29], np.int32)
    sk = (rng.standard_normal(H) * 2).astype(np.float32) if sinks else None
    scale = 1 / np.sqrt(hd)
    want = nn.attention(q, q_pos, k, v, 30, scale=scale, window=window, softcap=softcap, sinks=sk)
    got = ck.gpu_attention(q, q_pos, k, v, 30, scale=scale, window=window, softcap=softcap, sinks=sk)
    assert np.allclose(got, want, rtol=1e-4, atol=1e-5), np.abs(got - want).max()


@pytest.mark.parametrize("mode", ["swiglu", "gelu", "swiglu_oai"])
def test_gpu_gated_units(gpu, mode):
    rng = np.random.default_rng(5)
    g = (rng.standard_normal((2, 4096)) * 5).astype(np.float32)
    u = (rng.standard_normal((2, 4096)) * 5).astype(np.float32)
    assert np.allclose(ck.gpu_glu(g, u, mode), ck.host_glu(g, u, mode), rtol=1e-5, atol=1e-6)


def test_gpu_logits(gpu):
    x = (np.random.default_rng(6).standard_normal(5000) * 20).astype(np.float32)
    assert np.allclose(ck.gpu_logits(x, 0.5, 6.0), ck.host_logits(x, 0.5, 6.0), rtol=1e-5, atol=1e-5)
