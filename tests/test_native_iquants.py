"""Native dequantization of the i-quants, ternary and FP4 types (csrc/qs_iquants.c) against the numpy reference
(which tests/test_iquants.py checks against gguf-py), at every ISA level, on random and real blocks; and the
engine running a model whose matrices use them, against the same model stored as float32."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from quantscope.core.engine import Model
from quantscope.core.gguf import GGUFFile
from quantscope.core.native import kernels as K
from quantscope.core.quant import dequantize, ggml_type

from .test_iquants import F16_AT, TYPES

LEVELS = K.ISA_NAMES[: K.ISA_NAMES.index(K.isa_detected()) + 1]
DATA = Path(__file__).parent / "data" / "iq_blocks"


def _equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit, except that any NaN equals any NaN (a NaN's sign bit after a multiply by -1 is the
    compiler's choice in C and the CPU's in numpy)."""
    same = (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))
    return a.shape == b.shape and bool(np.all(same))


def _random_blocks(name: str, n: int, rng: np.random.Generator, scale: float = 3.0) -> np.ndarray:
    t = ggml_type(name)
    raw = rng.integers(0, 256, (n, t.block_bytes), dtype=np.uint8)
    at = F16_AT.get(name)
    if at is not None:
        raw[:, at : at + 2] = rng.uniform(-scale, scale, n).astype(np.float16).view(np.uint8).reshape(-1, 2)
    if name == "IQ1_M":  # d's 16 bits are the top nibbles of the four scale words
        d = rng.uniform(-scale, scale, n).astype(np.float16).view(np.uint16).astype(np.uint32)
        words = raw[:, 48:56].copy().view("<u2").astype(np.uint32) & 0x0FFF
        for i in range(4):
            words[:, i] |= ((d >> (4 * i)) & 15) << 12
        raw[:, 48:56] = words.astype("<u2").view(np.uint8)
    return raw


@pytest.mark.parametrize("name", TYPES)
def test_native_equals_numpy_on_random_and_real_blocks(name):
    rng = np.random.default_rng(sum(name.encode()) + 7)
    raw = _random_blocks(name, 700, rng)
    at = F16_AT.get(name)
    if at is not None:
        raw[:4, at : at + 2] = np.array([0, np.inf, np.nan, 6e-8], np.float16).view(np.uint8).reshape(-1, 2)
    real = np.frombuffer((DATA / f"{name}.bin").read_bytes(), np.uint8).reshape(-1, raw.shape[1])
    assert K.can_dequantize(name)
    for blocks in (raw, real):
        ref = dequantize(blocks, name)
        for level in LEVELS:
            with K.forced_isa(level):
                got = K.dequantize(blocks.reshape(-1), name).reshape(ref.shape)
            assert _equal(got, ref), (name, level)


def _write(path: Path, mats: dict[str, tuple[np.ndarray, gguf.GGMLQuantizationType | None]]) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    E, H, KV, F, L = 256, 4, 2, 256, 1
    for key, val in (("context_length", 256), ("embedding_length", E), ("block_count", L),
                     ("feed_forward_length", F), ("attention.head_count", H), ("attention.head_count_kv", KV)):
        w.add_uint32(f"llama.{key}", val)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    for tname, (arr, qt) in mats.items():
        if qt is None:
            w.add_tensor(tname, arr)
        else:
            w.add_tensor(tname, arr, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("name", TYPES)
def test_the_engine_runs_a_model_of_each_type(name, tmp_path):
    """Every matrix of a one-layer llama (E = F = 256) in ``name``, random valid blocks; its twin holds the same
    values as F32 (the numpy reference's): the engine's logits agree, prefill and decode."""
    rng = np.random.default_rng(sum(name.encode()))
    t = ggml_type(name)
    E, F, V = 256, 256, 256
    shapes = {"blk.0.attn_q.weight": (E, E), "blk.0.attn_k.weight": (128, E), "blk.0.attn_v.weight": (128, E),
              "blk.0.attn_output.weight": (E, E), "blk.0.ffn_gate.weight": (F, E), "blk.0.ffn_up.weight": (F, E),
              "blk.0.ffn_down.weight": (E, F)}
    quant: dict[str, tuple[np.ndarray, gguf.GGMLQuantizationType | None]] = {}
    dense: dict[str, tuple[np.ndarray, gguf.GGMLQuantizationType | None]] = {}
    for tname, (rows, k) in shapes.items():
        raw = _random_blocks(name, rows * k // t.block_elems, rng, scale=0.02).reshape(rows, -1)
        if name in ("MXFP4",):
            raw[:, :: t.block_bytes] = rng.integers(118, 124, raw[:, :: t.block_bytes].shape)  # small exponents
        if name == "NVFP4":
            for s in range(4):
                raw[:, s :: t.block_bytes] = rng.integers(8, 24, raw[:, s :: t.block_bytes].shape)
        quant[tname] = (raw, gguf.GGMLQuantizationType[name])
        dense[tname] = (dequantize(raw, name).reshape(rows, k), None)
    common = {"token_embd.weight": (rng.standard_normal((V, E)).astype(np.float32) * 0.5, None),
              "output_norm.weight": (np.ones(E, np.float32), None),
              "blk.0.attn_norm.weight": (np.ones(E, np.float32), None),
              "blk.0.ffn_norm.weight": (np.ones(E, np.float32), None)}
    a = Model(GGUFFile(_write(tmp_path / "q.gguf", {**common, **quant})), threads=2)
    b = Model(GGUFFile(_write(tmp_path / "f.gguf", {**common, **dense})), threads=2)
    assert all(w.type.name == name for w in a.weights.layers[0].matrices())
    ids = [3, 17, 200, 45, 9, 128]
    la = a.session(16).forward(ids, all_logits=True)
    lb = b.session(16).forward(ids, all_logits=True)
    assert np.isfinite(la).all() and np.abs(lb).max() > 0
    # the engine's dots see Q8_K (Q8_0) activations, the float twin's float ones: they part by that rounding
    # (about 3 % of the logits' norm through this random layer; the dots themselves are checked exactly against
    # the scheme in tests/test_native_kernels.py)
    rel = np.linalg.norm(la - lb, axis=1) / np.linalg.norm(lb, axis=1)
    assert np.median(rel) < 0.06 and rel.max() < 0.4, (name, rel)
    assert (la.argmax(1) == lb.argmax(1)).mean() >= 4 / 6, name
    s = a.session(16)
    steps = np.stack([s.forward([i]) for i in ids])  # decode: row dots; the prompt above went through the GEMM
    # (they part by float summation order, and where that moves a later activation across a Q8 rounding step)
    part = np.linalg.norm(steps - la, axis=1) / np.linalg.norm(la, axis=1)
    assert part.max() < 0.02, (name, part)
    with K.prefill_gemm(False):  # with the row dots for the prompt too: the same bits
        lr = a.session(16).forward(ids, all_logits=True)
    assert np.array_equal(steps, lr)


@pytest.mark.parametrize("name", TYPES)
def test_simd_dots_and_the_decoded_row_path_equal_the_scalar_dot(name):
    """The dot kernels sum exact integers per group and do the scalar reference's float operations in its order:
    AVX2 and scalar give the same bits; so does a prefill product, which decodes each row once for all columns."""
    rng = np.random.default_rng(sum(name.encode()) + 99)
    t = ggml_type(name)
    k, rows = 1536, 6
    w = _random_blocks(name, rows * k // t.block_elems, rng, scale=0.05)
    real = np.frombuffer((DATA / f"{name}.bin").read_bytes(), np.uint8)[: k // t.block_elems * t.block_bytes]
    w = np.concatenate([w.reshape(rows, -1), real.reshape(1, -1)])
    x = rng.standard_normal((5, k)).astype(np.float32)
    act = K.activation_type(name)
    for level in LEVELS:
        with K.forced_isa(level), K.prefill_gemm(False):  # the GEMM's own test is in test_native_kernels.py
            ref = np.array([[K.vec_dot(name, w[r], K.quantize_activation(xi, act), k) for r in range(rows + 1)]
                            for xi in x], np.float32)
            assert np.array_equal(K.matmat(name, w.reshape(-1), rows + 1, k, x), ref), (name, level)
            assert np.array_equal(K.matvec(name, w.reshape(-1), rows + 1, k, x[0]), ref[0]), (name, level)
        if level == "scalar":
            scalar = ref
        assert np.array_equal(ref, scalar), (name, level)


PREFILL_TYPES = ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0"]


@pytest.mark.parametrize("name", PREFILL_TYPES)
def test_a_prompt_gives_the_bits_of_the_row_dots(name):
    """Many columns of a code type go through row groups decoded into a transient repacked layout
    (csrc/qs_repack.c, qs_iq_prefill): the same sums and float operations as the one-column dots, so the same bits,
    at each SIMD level, on random blocks and on real ones; sizes it cannot take are refused in C."""
    from quantscope.core.native import ffi, lib

    rng = np.random.default_rng(sum(name.encode()) + 5)
    t = ggml_type(name)
    rows, k = 32, 1536
    w = _random_blocks(name, rows * k // 256, rng, scale=0.05).reshape(rows, -1)
    real = np.frombuffer((DATA / f"{name}.bin").read_bytes(), np.uint8)[: k // 256 * t.block_bytes]
    w[7] = real  # one real row among the random ones
    x = rng.standard_normal((9, k)).astype(np.float32)
    act = K.activation_type(name)
    ref = np.array([[K.vec_dot(name, w[r], K.quantize_activation(xi, act), k) for r in range(rows)] for xi in x],
                   np.float32)
    for level in LEVELS[1:]:
        with K.forced_isa(level):
            assert lib.qs_iq_prefill_usable(t.id, rows, k) == 1
            assert np.array_equal(K.matmat(name, w.reshape(-1), rows, k, x), ref), (name, level)
    wp = ffi.from_buffer(w)
    xp = ffi.cast("float *", ffi.from_buffer(x))
    y = np.zeros((9, rows), np.float32)
    yp = ffi.cast("float *", ffi.from_buffer(y))
    assert lib.qs_iq_prefill(t.id, wp, rows - 8, k, xp, 9, yp, 1) == lib.QS_ERR_SIZE  # not whole row groups
    assert lib.qs_iq_prefill(t.id, wp, rows, k - 128, xp, 9, yp, 1) == lib.QS_ERR_SIZE  # not whole blocks
    assert lib.qs_iq_prefill(t.id, ffi.NULL, rows, k, xp, 9, yp, 1) == lib.QS_ERR_SIZE
    assert lib.qs_iq_prefill(ggml_type("Q4_K").id, wp, rows, k, xp, 9, yp, 1) == lib.QS_ERR_SIZE
    assert (y == 0).all()
