"""The i-quants, ternary and FP4 types (core/quant/iquants.py): the numpy reference equals gguf-py's dequantization
bit for bit on random blocks (scales of every kind: normal, zero, subnormal, infinite, NaN) and on real blocks that
llama-quantize wrote (tests/data/iq_blocks, recorded by tests/record_iq_blocks.py); the code books equal gguf-py's."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as G

from quantscope.core.quant import can_dequantize, dequantize, ggml_type
from quantscope.core.quant import iquants as IQ

TYPES = ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0", "MXFP4", "NVFP4"]
#: byte offset of the fp16 super-block scale (None: the format has none there)
F16_AT = {"IQ2_XXS": 0, "IQ2_XS": 0, "IQ2_S": 0, "IQ3_XXS": 0, "IQ3_S": 0, "IQ1_S": 0, "TQ1_0": 52, "TQ2_0": 64}
DATA = Path(__file__).parent / "data" / "iq_blocks"


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    bits = [x.astype(np.float32).view(np.uint32) for x in (a, b)]
    return a.shape == b.shape and np.array_equal(*bits)


def _oracle(raw: np.ndarray, name: str) -> np.ndarray:
    return gguf.quants.dequantize(raw, G[name]).astype(np.float32).reshape(raw.shape[0], -1)


@pytest.mark.parametrize("name", TYPES)
def test_random_blocks_equal_gguf_py(name):
    t = ggml_type(name)
    rng = np.random.default_rng(sum(name.encode()))
    raw = rng.integers(0, 256, (512, t.block_bytes), dtype=np.uint8)
    at = F16_AT.get(name)
    if at is not None:  # a spread of scales, then the special ones
        scales = rng.uniform(-4, 4, 512).astype(np.float16)
        scales[:6] = [0.0, -0.0, 6e-8, np.inf, np.nan, 65504.0]
        raw[:, at : at + 2] = scales.view(np.uint8).reshape(-1, 2)
    assert can_dequantize(name)
    got = dequantize(raw, name)
    assert got.shape == (512, t.block_elems) and got.dtype == np.float32
    assert _same_bits(got, _oracle(raw, name)), name
    # a tensor's rows: several blocks per row give the same values
    rows = dequantize(raw.reshape(64, -1), name)
    assert _same_bits(rows.reshape(512, -1), got)


def test_code_books_and_sign_table_equal_gguf_py():
    for name, cls in {"IQ2_XXS": gguf.quants.IQ2_XXS, "IQ2_XS": gguf.quants.IQ2_XS, "IQ2_S": gguf.quants.IQ2_S,
                      "IQ3_XXS": gguf.quants.IQ3_XXS, "IQ3_S": gguf.quants.IQ3_S, "IQ1_S": gguf.quants.IQ1_S}.items():
        cls.init_grid()
        assert np.array_equal(IQ.grid(name), cls.grid.reshape(cls.grid_shape)), name
    assert IQ.sign_table().tobytes() == gguf.quants.IQ2_XXS.ksigns
    # the rule behind the table: 7 stored sign bits, the 8th makes the number of minus signs even
    assert all(bin(v).count("1") % 2 == 0 for v in IQ.sign_table().tolist())
    assert IQ.grid("IQ1_S").shape == (2048, 8) and set(np.unique(IQ.grid("IQ1_S")).tolist()) == {-1.0, 0.0, 1.0}


def test_fp4_and_e8m0_scales():
    e = np.arange(256, dtype=np.uint8)
    half = IQ.e8m0_half(e)
    assert half[127] == 0.5 and half[128] == 1.0
    assert half[1] == np.float32(2.0**-127) and half[0] == np.float32(2.0**-128)
    assert np.array_equal(half, gguf.quants.MXFP4.e8m0_to_fp32_half(e))
    x = np.arange(256, dtype=np.uint8)
    assert np.array_equal(IQ.ue4m3_half(x), gguf.quants.NVFP4.ue4m3_to_fp32(x).astype(np.float32))
    assert IQ.ue4m3_half(np.array([0x38], np.uint8))[0] == 0.5  # exponent 7, mantissa 0: 1.0, halved


def test_ternary_digits():
    """TQ1_0 stores 5 trits per byte as ceil(256 * v / 243); every value 0..242 round-trips through the decoder."""
    v = np.arange(243)
    trits = np.stack([(v // 3 ** (4 - k)) % 3 for k in range(5)], axis=1)
    q = ((v * 256 + 242) // 243).astype(np.uint8)
    block = np.zeros((243, 54), np.uint8)
    block[:, 0] = q  # byte 0 holds digits of elements 0, 32, 64, 96, 128
    got = IQ.tq1_0_trits(block)[:, [0, 32, 64, 96, 128]]
    assert np.array_equal(got, trits)


@pytest.mark.parametrize("name", TYPES)
def test_real_blocks_from_llama_quantize(name):
    """Blocks of SmolLM2's ffn_down as llama-quantize wrote them (importance matrix where the type needs one)."""
    meta = json.loads((DATA / "meta.json").read_text())
    if name not in meta["types"]:
        pytest.fail(f"no recorded blocks of {name}: run tests/record_iq_blocks.py", pytrace=False)
    t = ggml_type(name)
    raw = np.frombuffer((DATA / f"{name}.bin").read_bytes(), np.uint8).reshape(-1, t.block_bytes)
    got = dequantize(raw, name)
    assert _same_bits(got, _oracle(raw, name))
    assert np.isfinite(got).all() and np.abs(got).max() > 0
