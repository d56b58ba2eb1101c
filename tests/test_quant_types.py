"""The one Python type table (core/quant/types.py): its per-type facts agree with the decoders, numpy and
gguf-py, so no side table is needed next to their users."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from quantscope.core.base.ggml_types import GGML_TYPES, GGMLType
from quantscope.core.quant import blocks
from quantscope.core.quant.scales import scale_fields

TYPES = list(GGML_TYPES.values())


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_fp16_scale_offsets_are_the_decoders_fp16_fields(t: GGMLType) -> None:
    if not blocks.can_decode(t):
        assert t.name in ("Q8_1", "Q8_K", "Q1_0", "Q2_0"), f"{t.name}: no decoder to check the table against"
        return
    assert t.fp16_scales == tuple(off for _, off in scale_fields(t.name))
    assert all(0 <= off <= t.block_bytes - 2 for off in t.fp16_scales)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_plain_types_carry_dtype_description_and_nonfinite_bits(t: GGMLType) -> None:
    assert (t.dtype is not None) == (not t.is_quantized)
    if t.dtype is None:
        assert not t.description and not t.inf_nan_bits and not t.is_exact
        return
    assert np.dtype(t.dtype).itemsize == t.block_bytes and t.description
    assert t.is_exact == (t.name.startswith("I") or t.name == "F64")
    if t.name.startswith("I"):
        assert np.dtype(t.dtype).kind == "i" and not t.inf_nan_bits
        return
    width = t.block_bytes
    inf = np.array([np.inf], np.float32 if t.name == "BF16" else t.dtype).view(f"<u{4 if t.name == 'BF16' else width}")
    expected = int(inf[0]) >> 16 if t.name == "BF16" else int(inf[0])
    assert t.inf_nan_bits == expected


def test_block_sizes_match_gguf_py() -> None:
    for t in TYPES:
        q = gguf.GGMLQuantizationType[t.name] if t.name in gguf.GGMLQuantizationType.__members__ else None
        if q is None or q not in gguf.GGML_QUANT_SIZES or t.name == "Q8_1":  # gguf-py keeps Q8_1's old float
            continue  # d and s (40 bytes); ggml's block_q8_1 holds two fp16 (36)
        assert int(q) == t.id
        assert gguf.GGML_QUANT_SIZES[q] == (t.block_elems, t.block_bytes), t.name
