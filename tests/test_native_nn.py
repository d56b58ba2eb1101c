"""Float kernels of the engine against float64 numpy references, on every ISA level."""

from __future__ import annotations

import numpy as np
import pytest

from quantscope.core.native import kernels as K
from quantscope.core.native import nn

LEVELS = K.ISA_NAMES[: K.ISA_NAMES.index(K.isa_detected()) + 1]


def close(a, b, rtol=2e-6, atol=1e-6):
    return np.allclose(a, b, rtol=rtol, atol=atol)


@pytest.mark.parametrize("level", LEVELS)
def test_rmsnorm(level):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 896)).astype(np.float32) * 3
    w = rng.standard_normal(896).astype(np.float32)
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64**2).mean(axis=1, keepdims=True) + 1e-6) * w
    with K.forced_isa(level):
        assert close(nn.rmsnorm(x, w, 1e-6), ref, rtol=1e-5)
        assert close(nn.rmsnorm(x[:, :13], None, 1e-5), x64[:, :13] / np.sqrt((x64[:, :13] ** 2).mean(1, keepdims=True)
                                                                               + 1e-5), rtol=1e-5)
        y = x.copy()
        nn.rmsnorm(y, w, 1e-6, out=y)  # in place
        assert close(y, ref, rtol=1e-5)


def rope_ref(x, pos, base, neox, rot_dim, scale=1.0):
    out = x.astype(np.float64).copy()
    half = rot_dim // 2
    inv = base ** (-2.0 * np.arange(half) / rot_dim)
    for t, p in enumerate(pos):
        ang = p * scale * inv
        c, s = np.cos(ang), np.sin(ang)
        a = np.arange(half) if neox else 2 * np.arange(half)
        b = a + half if neox else a + 1
        row = out[t]
        x0, x1 = row[:, a].copy(), row[:, b].copy()
        row[:, a] = x0 * c - x1 * s
        row[:, b] = x0 * s + x1 * c
    return out


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("rot_dim", [64, 48])
def test_rope(neox, rot_dim):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 3, 64)).astype(np.float32)
    pos = np.array([0, 1, 17, 4095], np.int32)
    ref = rope_ref(x, pos, 1e6, neox, rot_dim)
    for level in LEVELS:
        with K.forced_isa(level):
            y = nn.rope(x.copy(), pos, rot_dim=rot_dim, freq_base=1e6, neox=neox)
        assert close(y, ref, rtol=1e-5, atol=2e-5)
    assert np.array_equal(nn.rope(x.copy(), np.zeros(4, np.int32), freq_base=1e4), x)  # position 0: identity


def test_softmax_and_masked_rows():
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((6, 300)) * 10).astype(np.float32)
    x[2, 100:] = -np.inf
    x[3, :] = -np.inf
    ref = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True).clip(-1e30))
    ref[3] = 0
    ref = ref / np.where(ref.sum(1, keepdims=True) == 0, 1, ref.sum(1, keepdims=True))
    for level in LEVELS:
        with K.forced_isa(level):
            y = nn.softmax(x.copy())
        assert close(y, ref, rtol=1e-5, atol=1e-7)
        assert np.all(y[3] == 0) and np.allclose(y[[0, 1, 2, 4, 5]].sum(1), 1, atol=1e-5)


def test_gated_activations():
    rng = np.random.default_rng(3)
    g = (rng.standard_normal(4867) * 4).astype(np.float32)
    u = rng.standard_normal(4867).astype(np.float32)
    g64, u64 = g.astype(np.float64), u.astype(np.float64)
    silu = g64 / (1 + np.exp(-g64)) * u64
    gelu = 0.5 * g64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (g64 + 0.044715 * g64**3))) * u64
    for level in LEVELS:
        with K.forced_isa(level):
            assert close(nn.swiglu(g, u), silu, rtol=1e-5, atol=1e-6)
            assert close(nn.geglu_tanh(g, u), gelu, rtol=1e-5, atol=1e-6)
    gc, uc = np.minimum(g64, 7.0), np.clip(u64, -7.0, 7.0)  # gpt-oss's clamped variant (the gate above 7 is common)
    assert close(nn.swiglu_oai(g, u), gc / (1 + np.exp(-1.702 * gc)) * (uc + 1), rtol=1e-5, atol=1e-6)


def test_layernorm_and_plain_gelu():
    """BERT's kernels against float64: LayerNorm with weight and bias (either absent), in place too; GELU-tanh."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((7, 384)) * 3 + 1.5).astype(np.float32)
    w, b = rng.standard_normal(384).astype(np.float32), rng.standard_normal(384).astype(np.float32)
    x64 = x.astype(np.float64)
    norm = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-12)
    assert close(nn.layernorm(x, w, b, 1e-12), norm * w + b, rtol=1e-5, atol=1e-5)
    assert close(nn.layernorm(x, None, None, 1e-12), norm, rtol=1e-5, atol=1e-5)
    assert close(nn.layernorm(x, w, None, 1e-12), norm * w, rtol=1e-5, atol=1e-5)
    y = x.copy()
    nn.layernorm(y, w, b, 1e-12, out=y)
    assert close(y, norm * w + b, rtol=1e-5, atol=1e-5)
    assert np.allclose(nn.layernorm(np.full((2, 8), 3.0, np.float32), None, b[:8], 1e-5), b[:8])  # constant rows
    with pytest.raises(ValueError, match="bias has 3 elements"):
        nn.layernorm(x, w, b[:3], 1e-12)
    g = (rng.standard_normal(4867) * 4).astype(np.float32)
    g64 = g.astype(np.float64)
    assert close(nn.gelu_tanh(g), 0.5 * g64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (g64 + 0.044715 * g64**3))),
                 rtol=1e-5, atol=1e-6)


def attention_ref(q, q_pos, k, v, n_kv, scale, window, sinks=None):
    n_q, n_heads, _ = q.shape
    group = n_heads // k.shape[1]
    out = np.zeros(q.shape, np.float64)
    for i in range(n_q):
        for h in range(n_heads):
            keys = [p for p in range(n_kv) if p <= q_pos[i] and (window <= 0 or p > q_pos[i] - window)]
            if not keys:
                continue
            kk = k[keys, h // group].astype(np.float64)
            vv = v[keys, h // group].astype(np.float64)
            s = kk @ q[i, h].astype(np.float64) * scale
            m = s.max() if sinks is None else max(s.max(), float(sinks[h]))
            p = np.exp(s - m)
            den = p.sum() + (0.0 if sinks is None else np.exp(float(sinks[h]) - m))
            out[i, h] = (p / den) @ vv
    return out


def test_attention_sinks():
    """gpt-oss's sinks: a per-head logit in each softmax's denominator, unscaled, never masked, with no value;
    a sink far above the scores leaves almost nothing of the values, one far below changes nothing."""
    rng = np.random.default_rng(9)
    n_ctx, n_kv_heads, n_heads, hd = 30, 2, 4, 32
    k = rng.standard_normal((n_ctx, n_kv_heads, hd)).astype(np.float16)
    v = rng.standard_normal((n_ctx, n_kv_heads, hd)).astype(np.float16)
    q = rng.standard_normal((3, n_heads, hd)).astype(np.float32)
    q_pos = np.array([0, 11, 25], np.int32)
    sinks = np.array([-1.0, 0.5, 2.0, 40.0], np.float32)
    for level in LEVELS:
        with K.forced_isa(level):
            for window in (0, 4):
                y = nn.attention(q, q_pos, k, v, 26, scale=0.2, window=window, sinks=sinks, threads=2)
                assert close(y, attention_ref(q, q_pos, k, v, 26, 0.2, window, sinks), rtol=1e-4, atol=1e-5)
                assert np.abs(y[:, 3]).max() < 1e-9  # the sink of 40 takes (almost) all the mass
    plain = nn.attention(q, q_pos, k, v, 26, scale=0.2)
    low = nn.attention(q, q_pos, k, v, 26, scale=0.2, sinks=np.full(4, -200.0, np.float32))
    assert np.array_equal(plain, low)
    with pytest.raises(K.KernelError, match="out of range"):
        nn.attention(q, q_pos, k, v, 26, scale=0.2, sinks=np.array([0, 0, 0, np.nan], np.float32))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("window", [0, 5])
def test_attention_gqa_causal_window(dtype, window):
    rng = np.random.default_rng(4)
    n_ctx, n_kv_heads, n_heads, hd = 40, 2, 6, 64
    k = rng.standard_normal((n_ctx, n_kv_heads, hd)).astype(dtype)
    v = rng.standard_normal((n_ctx, n_kv_heads, hd)).astype(dtype)
    q = rng.standard_normal((4, n_heads, hd)).astype(np.float32)
    q_pos = np.array([0, 9, 20, 29], np.int32)
    ref = attention_ref(q, q_pos, k, v, 30, 0.125, window)
    for level in LEVELS:
        with K.forced_isa(level):
            for threads in (1, 2):
                y = nn.attention(q, q_pos, k, v, 30, scale=0.125, window=window, threads=threads)
                assert close(y, ref, rtol=1e-4, atol=1e-5), (level, threads)


@pytest.mark.parametrize("n_heads", [8, 96])
def test_attention_decode_head_groups(n_heads):
    """One query, one KV head: the group's query heads are split across tasks (and at most 64 per task); every
    split gives the same bits, and peaked scores (exp underflowing to 0) still match the reference."""
    rng = np.random.default_rng(n_heads)
    n_ctx, hd = 50, 64
    k = rng.standard_normal((n_ctx, 1, hd)).astype(np.float16)
    v = rng.standard_normal((n_ctx, 1, hd)).astype(np.float16)
    q = rng.standard_normal((1, n_heads, hd)).astype(np.float32)
    q_pos = np.array([44], np.int32)
    for scale in (0.125, 40.0):
        ref = attention_ref(q, q_pos, k, v, 45, scale, 0)
        first = None
        for threads in (1, 2, 3):
            y = nn.attention(q, q_pos, k, v, 45, scale=scale, threads=threads)
            assert close(y, ref, rtol=1e-4, atol=1e-5), (scale, threads)
            if first is None:
                first = y
            assert np.array_equal(y, first)


def test_attention_validates():
    q = np.zeros((1, 4, 8), np.float32)
    k = np.zeros((3, 3, 8), np.float32)
    with pytest.raises(ValueError, match="multiple"):
        nn.attention(q, np.zeros(1, np.int32), k, k, 3, scale=1.0)
    k = np.zeros((3, 2, 8), np.float32)
    with pytest.raises(ValueError, match="n_kv"):
        nn.attention(q, np.zeros(1, np.int32), k, k, 4, scale=1.0)
    with pytest.raises(TypeError):
        nn.attention(q, np.zeros(1, np.int32), k, k.astype(np.float16), 3, scale=1.0)
