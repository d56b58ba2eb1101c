"""Reference dequantization is bit-exact with gguf-py on synthetic rows of every type and on the real models."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as GQ
from gguf.quants import dequantize as gguf_dequantize

from quantscope.core.gguf import GGUFFile
from quantscope.core.quant import dequantize, ggml_type
from quantscope.core.quant.dequant import DEQUANTIZERS

REQUIRED = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
            "IQ4_NL", "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0",
            "MXFP4", "NVFP4"]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = np.ascontiguousarray(b, dtype=np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_every_required_type_has_a_reference():
    assert set(REQUIRED) <= set(DEQUANTIZERS)


def realistic_blocks(name: str, n_rows: int, blocks_per_row: int, rng: np.random.Generator) -> np.ndarray:
    """Random code bytes with small finite fp16 scales at the type's scale offsets."""
    t = ggml_type(name)
    raw = rng.integers(0, 256, size=(n_rows, blocks_per_row, t.block_bytes), dtype=np.uint8)
    for off in t.fp16_scales:  # tests/test_quant_types.py checks them against the block decoders
        scale = (rng.random((n_rows, blocks_per_row)) * 0.02 - 0.01).astype(np.float16)
        raw[:, :, off : off + 2] = scale.view(np.uint8).reshape(n_rows, blocks_per_row, 2)
    if name == "IQ1_M":  # d's 16 bits are the top nibbles of the four scale words
        d = (rng.random((n_rows, blocks_per_row)) * 0.02 - 0.01).astype(np.float16).view(np.uint16).astype(np.uint32)
        words = raw[:, :, 48:56].copy().view("<u2").astype(np.uint32) & 0x0FFF
        for i in range(4):
            words[:, :, i] |= ((d >> (4 * i)) & 15) << 12
        raw[:, :, 48:56] = words.astype("<u2").view(np.uint8)
    if name == "MXFP4":  # E8M0 exponents around 2^-6
        raw[:, :, 0] = rng.integers(118, 124, (n_rows, blocks_per_row))
    if name == "NVFP4":  # UE4M3 scales between 2^-6 and 2^-4
        raw[:, :, 0:4] = rng.integers(8, 24, (n_rows, blocks_per_row, 4))
    return raw.reshape(n_rows, blocks_per_row * t.block_bytes)


@pytest.mark.parametrize("name", REQUIRED)
def test_synthetic_rows_bit_exact(name):
    rng = np.random.default_rng(sum(name.encode()))
    t = ggml_type(name)
    blocks_per_row = max(1, 512 // t.block_elems)
    raw = realistic_blocks(name, 37, blocks_per_row, rng)
    ours = dequantize(raw, t)
    assert ours.shape == (37, blocks_per_row * t.block_elems)
    assert ours.dtype == np.float32
    assert same_bits(ours, gguf_dequantize(raw, GQ[name]))


@pytest.mark.parametrize("name", REQUIRED)
def test_arbitrary_bytes_bit_exact_including_nan_and_inf(name):
    """Fully random bytes (NaN/Inf/subnormal scales included): still the same bits as gguf-py."""
    rng = np.random.default_rng(1234 + len(name))
    t = ggml_type(name)
    raw = rng.integers(0, 256, size=(16, t.block_bytes * 4), dtype=np.uint8)
    assert same_bits(dequantize(raw, t), gguf_dequantize(raw, GQ[name]))


def test_flat_buffer_and_leading_dims():
    rng = np.random.default_rng(3)
    raw = realistic_blocks("Q4_K", 6, 2, rng)
    flat = dequantize(raw.reshape(-1), "Q4_K")
    assert flat.shape == (6 * 512,)
    assert same_bits(flat.reshape(6, 512), dequantize(raw, "Q4_K"))
    cube = dequantize(raw.reshape(2, 3, -1), ggml_type(12))
    assert cube.shape == (2, 3, 512)


def test_rejects_bad_input():
    with pytest.raises(ValueError, match="multiple"):
        dequantize(np.zeros(145, np.uint8), "Q4_K")
    with pytest.raises(TypeError, match="uint8"):
        dequantize(np.zeros(144, np.int8), "Q4_K")
    with pytest.raises(NotImplementedError, match="Q1_0"):
        dequantize(np.zeros(18, np.uint8), "Q1_0")


def combos(f: GGUFFile):
    """First tensor of every (type, shape) combination among the quantized tensors."""
    seen: OrderedDict[tuple[str, tuple[int, ...]], object] = OrderedDict()
    for t in f.tensors:
        if t.type is not None and t.type.is_quantized:
            seen.setdefault((t.type.name, t.ne), t)
    return list(seen.values())


def test_smollm2_every_quantized_tensor(model_path):
    with GGUFFile(model_path("smollm2")) as f:
        quantized = [t for t in f.tensors if t.type.is_quantized]
        assert {t.type.name for t in quantized} == {"Q4_1", "Q8_0"}
        assert len(quantized) == 211
        for t in quantized:
            rows = f.tensor_rows(t)
            assert same_bits(dequantize(rows, t.type), gguf_dequantize(rows, GQ(t.type_id))), t.name


@pytest.mark.parametrize("name", ["gemma3", "qwen2.5-coder"])
def test_every_type_shape_combination(name, model_path):
    with GGUFFile(model_path(name)) as f:
        chosen = combos(f)
        assert {t.type.name for t in chosen} >= {"Q4_K", "Q6_K", "Q5_0", "Q8_0"}
        for t in chosen:
            rows = f.tensor_rows(t)
            assert same_bits(dequantize(rows, t.type), gguf_dequantize(rows, GQ(t.type_id))), t.name
        f32 = next(t for t in f.tensors if t.type.name == "F32")
        assert same_bits(dequantize(f.tensor_rows(f32), "F32").reshape(-1), f.tensor_array(f32).reshape(-1))
