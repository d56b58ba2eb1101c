"""KV cache types (issue 52): F32, F16, BF16, Q8_0 and Q4_0 caches, written with ggml's reference rounding and read
directly by the flash-style attention (online softmax over tiles of the cache), on every ISA level.

The rounding is checked against numpy twins of ggml's quantize_row_q8_0_ref / q4_0_ref; the attention against a
float64 two-pass softmax over the dequantized caches, with the query rounded as the K dot reads it (Q8_0 for the
block types, BF16 for BF16: llama.cpp's vec_dot_type); a model's logits with a quantized cache against its F16
cache's (bounded KL divergence and top-1 agreement). Nothing timed.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from quantscope.cli.main import main
from quantscope.core.engine.generate import Engine
from quantscope.core.gguf import GGUFFile
from quantscope.core.model.memory import memory_plan
from quantscope.core.native import kernels as K
from quantscope.core.native import nn

from .test_native_nn import LEVELS, attention_ref

TYPES = tuple(nn.KV_CACHE_TYPES)


def q8_0_ref(x: np.ndarray) -> bytes:
    """ggml's quantize_row_q8_0_ref in numpy: per 32 values d = amax / 127 (stored as f16), q = roundf(x / d)."""
    out = bytearray()
    for b in x.astype(np.float32).reshape(-1, 32):
        d = np.float32(np.abs(b).max() / np.float32(127))
        inv = np.float32(1) / d if d else np.float32(0)
        v = (b * inv).astype(np.float32).astype(np.float64)
        q = np.sign(v) * np.floor(np.abs(v) + 0.5)  # roundf: half away from zero
        out += np.float16(d).tobytes() + q.astype(np.int8).tobytes()
    return bytes(out)


def q4_0_ref(x: np.ndarray) -> bytes:
    """ggml's quantize_row_q4_0_ref: d = (the value of largest magnitude) / -8, codes min(15, (int8)(x / d + 8.5)),
    element j in the low nibble of byte j, j + 16 in its high nibble."""
    out = bytearray()
    for b in x.astype(np.float32).reshape(-1, 32):
        mx = b[np.argmax(np.abs(b))]
        d = np.float32(mx / np.float32(-8))
        inv = np.float32(1) / d if d else np.float32(0)
        c = np.minimum(15, np.trunc((b * inv).astype(np.float32) + np.float32(8.5))).astype(np.uint8)
        out += np.float16(d).tobytes() + (c[:16] | (c[16:] << 4)).astype(np.uint8).tobytes()
    return bytes(out)


def as_read(q: np.ndarray, k_type: str) -> np.ndarray:
    """The query as the K dot of a ``k_type`` cache reads it (the cache's own rounding for BF16 / Q8_0; Q4_0 keys
    read a Q8_0 query)."""
    rt = {"bf16": "bf16", "q8_0": "q8_0", "q4_0": "q8_0"}.get(k_type)
    if rt is None:
        return q
    n, h, hd = q.shape
    c = nn.kv_cache_zeros(rt, n, h, hd)
    nn.kv_store(c, rt, 0, q.reshape(-1, hd))
    return nn.kv_load(c, rt, hd)


def filled(kind: str, x: np.ndarray) -> np.ndarray:
    c = nn.kv_cache_zeros(kind, *x.shape)
    nn.kv_store(c, kind, 0, x.reshape(-1, x.shape[2]))
    return c


def test_rows_are_rounded_as_ggml_rounds_them():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((6, 2, 64)) * rng.uniform(0.01, 30, (6, 2, 1))).astype(np.float32)
    x[0, 0, :32] = 0.0  # an all-zero block: d = 0
    x[1, 1, 5] = 1e4  # one outlier
    assert filled("q8_0", x).tobytes() == q8_0_ref(x)
    assert filled("q4_0", x).tobytes() == q4_0_ref(x)
    assert np.array_equal(nn.kv_load(filled("f32", x), "f32", 64), x)
    assert np.array_equal(nn.kv_load(filled("f16", x), "f16", 64), x.astype(np.float16).astype(np.float32))
    bf = nn.kv_load(filled("bf16", x), "bf16", 64)
    assert np.abs(bf - x).max() <= np.abs(x).max() * 2**-8
    # the dequantized blocks are the twins' d * q
    q8 = np.frombuffer(q8_0_ref(x), np.uint8).reshape(-1, 34)
    d = q8[:, :2].copy().view(np.float16).astype(np.float32)
    assert np.array_equal(nn.kv_load(filled("q8_0", x), "q8_0", 64).reshape(-1, 32), d * q8[:, 2:].view(np.int8))
    # sizes: ggml's rows
    assert [nn.kv_row_bytes(t, 128) for t in ("f32", "f16", "bf16", "q8_0", "q4_0")] == [512, 256, 256, 136, 72]
    with pytest.raises(ValueError, match="multiple of 32"):
        nn.kv_row_bytes("q8_0", 80)
    with pytest.raises(ValueError, match="KV cache type must be one of"):
        nn.kv_cache_type("q5_1")


@pytest.mark.parametrize("level", LEVELS)
def test_attention_reads_every_cache_type_directly(level):
    """Every (K, V) type pair, GQA, a window and sinks, on this ISA level: the float64 reference on the dequantized
    caches with the query as the K dot reads it."""
    rng = np.random.default_rng(7)
    n_ctx, n_kv_heads, n_heads, hd = 70, 2, 6, 64
    k = rng.standard_normal((n_ctx, n_kv_heads, hd)).astype(np.float32)
    v = rng.standard_normal((n_ctx, n_kv_heads, hd)).astype(np.float32)
    q = rng.standard_normal((3, n_heads, hd)).astype(np.float32)
    q_pos = np.array([0, 33, 64], np.int32)
    sinks = np.array([-1.0, 0.5, 2.0, 0.0, 1.0, -3.0], np.float32)
    with K.forced_isa(level):
        for kt, vt in itertools.product(TYPES, TYPES):
            kc, vc = filled(kt, k), filled(vt, v)
            kd, vd = nn.kv_load(kc, kt, hd), nn.kv_load(vc, vt, hd)
            for window, sk in ((0, None), (9, sinks)):
                y = nn.attention(q, q_pos, kc, vc, 65, scale=0.125, window=window, sinks=sk, threads=2,
                                 k_type=kt, v_type=vt)
                ref = attention_ref(as_read(q, kt), q_pos, kd, vd, 65, 0.125, window, sk)
                assert np.allclose(y, ref, rtol=1e-4, atol=2e-5), (level, kt, vt, window)


@pytest.mark.parametrize("kind", TYPES)
def test_flash_attention_equals_the_two_pass_softmax_over_a_long_cache(kind):
    """Over 3000 cached positions (about a hundred tiles), peaked and flat scores: the online softmax's output is
    the two-pass weights (the probe's, computed apart) times the cache's values, on every ISA level."""
    rng = np.random.default_rng(3)
    n_ctx, hd = 3000, 64
    k = rng.standard_normal((n_ctx, 1, hd)).astype(np.float32)
    v = rng.standard_normal((n_ctx, 1, hd)).astype(np.float32)
    k[2500] *= 6.0  # a late maximum: the running sums are rescaled
    q = rng.standard_normal((2, 4, hd)).astype(np.float32)
    q_pos = np.array([1999, 2999], np.int32)
    kc, vc = filled(kind, k), filled(kind, v)
    vd = nn.kv_load(vc, kind, hd)[:, 0].astype(np.float64)
    for scale in (0.125, 2.0):
        w = nn.attention_probs(q, q_pos, kc, n_ctx, scale=scale, k_type=kind).astype(np.float64)
        ref = w @ vd
        for level in LEVELS:
            with K.forced_isa(level):
                y = nn.attention(q, q_pos, kc, vc, n_ctx, scale=scale, k_type=kind, v_type=kind)
            assert np.allclose(y, ref, rtol=1e-4, atol=1e-5), (kind, scale, level)


def test_hadamard_rotation_is_llamas():
    """The rotation of a quantized cache's rows: Sylvester's Walsh-Hadamard matrix / sqrt(n) (llama.cpp's
    ggml_gen_hadamard), run by run; its own inverse; K's runs the largest power of two dividing the head size, V's 64,
    none for the float types or a head size not a multiple of 64 (llama.cpp's attn_rot_k / attn_rot_v)."""
    from quantscope.core.native import ffi, lib

    def sylvester(n: int) -> np.ndarray:
        h = np.ones((1, 1))
        while h.shape[0] < n:
            h = np.block([[h, h], [h, -h]])
        return h / np.sqrt(n)

    rng = np.random.default_rng(5)
    for nrot in (64, 128, 256):
        x = rng.standard_normal(3 * nrot).astype(np.float32)
        y = x.copy()
        assert lib.qs_hadamard(ffi.cast("float *", ffi.from_buffer(y)), y.size, nrot) == 0
        assert np.allclose(y, (x.reshape(3, nrot).astype(np.float64) @ sylvester(nrot)).reshape(-1), atol=1e-5)
        assert lib.qs_hadamard(ffi.cast("float *", ffi.from_buffer(y)), y.size, nrot) == 0
        assert np.allclose(y, x, atol=1e-5)
    assert lib.qs_hadamard(ffi.cast("float *", ffi.from_buffer(x)), 96, 48) != 0  # not a power of two
    rot = {(t, hd, k): lib.qs_kv_rotation(nn.KV_CACHE_TYPES[t], hd, k) for t in TYPES for hd in (64, 96, 128, 192)
           for k in (0, 1)}
    assert rot[("q8_0", 128, 1)] == 128 and rot[("q4_0", 192, 1)] == 64 and rot[("q4_0", 128, 0)] == 64
    assert rot[("q8_0", 96, 1)] == 0 and all(rot[(t, 128, 1)] == 0 for t in ("f32", "f16", "bf16"))


@pytest.fixture(scope="module")
def smollm2(model_path):
    e = Engine(model_path("smollm2"), n_ctx=256, threads=2, backend="cpu")
    yield e
    e.close()


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64) - x.max(1, keepdims=True)
    return x - np.log(np.exp(x).sum(1, keepdims=True))


@pytest.mark.parametrize("types,max_kld,min_top1", [(("bf16", "bf16"), 0.016, 0.9), (("q8_0", "q8_0"), 0.018, 0.88),
                                                    (("q8_0", "q4_0"), 0.04, 0.84), (("q4_0", "q4_0"), 0.2, 0.75)])
def test_a_quantized_cache_stays_close_to_f16(smollm2, types, max_kld, min_top1):
    """SmolLM2 on 200 tokens: the cache type's logits against the F16 cache's (mean KL divergence, top-1
    agreement; bounds 4x the values measured, 0.0041, 0.0046, 0.0104, 0.052, with the rotation of the quantized
    caches); a prompt and its tokens one by one agree."""
    from pathlib import Path

    text = (Path(__file__).parent / "data" / "english.txt").read_text(encoding="utf-8")
    ids = smollm2.tokenizer.encode(text)[:200]
    base = log_softmax(smollm2.model.session(256).forward(ids, all_logits=True))
    s = smollm2.model.session(256, types[0], v_type=types[1])
    assert s.cache_types == types
    got = s.forward(ids, all_logits=True)
    kld = (np.exp(base) * (base - log_softmax(got))).sum(1)
    assert kld.mean() < max_kld, kld.mean()
    assert (got.argmax(1) == base.argmax(1)).mean() >= min_top1
    s.truncate(190)  # decode steps over the same cache: the prompt's logits again
    step = np.stack([s.forward([t]) for t in ids[190:]])
    assert np.allclose(step, got[190:], rtol=1e-3, atol=2e-3)
    f16 = smollm2.model.session(256).kv_bytes
    assert s.kv_bytes < f16 if types != ("bf16", "bf16") else s.kv_bytes == f16


def test_engine_and_cli_take_the_cache_types(model_path, capsys, tmp_path):
    path = model_path("smollm2")
    with pytest.raises(ValueError, match="F16 KV cache only"):
        Engine(path, backend="cuda", cache_types=("q8_0", "q8_0"))
    e = Engine(path, n_ctx=64, threads=2, backend="auto", cache_types=("q8_0", "q4_0"))
    try:
        assert e.backend == "cpu" and e.session.cache_types == ("q8_0", "q4_0")
        assert e.new_session(32).cache_types == ("q8_0", "q4_0")
    finally:
        e.close()
    rc = main(["generate", str(path), "-p", "The capital of France is", "-n", "4", "--temp", "0", "-c", "64",
               "-t", "2", "--backend", "cpu", "-ctk", "q8_0", "--cache-type-v", "Q4_0"])
    out = capsys.readouterr()
    assert rc == 0 and out.out.strip() and "KV cache q8_0/q4_0" in out.err
    assert main(["generate", str(path), "-p", "x", "-ctk", "q5_1"]) != 0
    assert "invalid choice: 'q5_1'" in capsys.readouterr().err
    assert main(["generate", str(path), "-p", "x", "-ctk", "q8_0", "--backend", "cuda"]) != 0
    assert "CUDA backend holds an F16 KV cache only" in capsys.readouterr().err


def test_memory_plan_counts_k_and_v_types(model_path):
    with GGUFFile(model_path("qwen2.5-coder")) as f:
        f16 = memory_plan(f, 4096)
        q8 = memory_plan(f, 4096, "Q8_0")
        mixed = memory_plan(f, 4096, "Q8_0", "Q4_0")
    assert q8.kv_bytes == f16.kv_bytes * 34 // 64
    assert mixed.kv_bytes == f16.kv_bytes * (34 + 18) // 128 and mixed.kv_type == "Q8_0/Q4_0"
