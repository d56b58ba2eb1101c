"""What a decoded block is made of (fields, bit sources, the decoded block) and the helpers every block decoder
builds it with: the bottom of the block decoders, imported by core/quant/blocks.py and core/quant/iq_blocks.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..base.ggml_types import GGMLType
from .dequant import dequantize


@dataclass(frozen=True)
class BitSource:
    """``n_bits`` bits of block byte ``byte`` starting at bit ``bit_lo`` land at bit ``value_bit`` of a value."""

    byte: int
    bit_lo: int
    n_bits: int
    value_bit: int


@dataclass(frozen=True)
class BlockField:
    """A named field of a block: ``size`` bytes at ``offset`` (within the block), decoded ``value``."""

    name: str
    offset: int
    size: int
    kind: str
    value: Any
    description: str


@dataclass
class DecodedBlock:
    """One block, decoded.

    Per element ``i``: ``values[i] == multiplier[i] * code[i] + offset[i]`` (float32, bit-exact), where
    ``code`` is the signed integer the format multiplies (e.g. ``q - 8`` for Q4_0), ``raw_code`` the bits as
    stored, ``group`` the scale group (sub-block) and ``code_byte``/``code_shift`` where its low bits live.
    """

    type: GGMLType
    raw: bytes
    fields: list[BlockField]
    values: np.ndarray
    raw_code: np.ndarray
    code: np.ndarray
    multiplier: np.ndarray
    offset: np.ndarray
    group: np.ndarray
    code_byte: np.ndarray
    code_shift: np.ndarray
    code_bits: int
    formula: str
    group_size: int
    scales: dict[str, list[int]] = field(default_factory=dict)
    scale_sources: dict[str, list[list[BitSource]]] = field(default_factory=dict)
    explain_terms: Callable[[int], str] | None = None

    def field(self, name: str) -> BlockField:
        """The field called ``name``."""
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    def explain(self, i: int) -> str:
        """The dequantization of element ``i`` written out with its numbers."""
        terms = self.explain_terms(i) if self.explain_terms else f"{self.multiplier[i]:.7g} · {int(self.code[i])}"
        return f"x[{i}] = {terms} = {self.values[i]:.7g}"


def signed(op: str, v: float) -> str:
    """``op v`` ("+" or "−") with ``v``'s sign folded in: ``+ -0.86`` reads ``− 0.86``, ``− -0.5`` reads ``+ 0.5``
    (a term of an explained formula; ``v`` to 7 significant digits)."""
    neg = (v < 0) != (op == "−")
    return f"{'−' if neg else '+'} {abs(v):.7g}"


def fp16(raw: bytes, off: int) -> float:
    """The IEEE binary16 at byte ``off``."""
    return float(np.frombuffer(raw, dtype="<f2", count=1, offset=off)[0])


def fp16_field(raw: bytes, name: str, off: int, desc: str) -> BlockField:
    """An fp16 field: its bits and value."""
    bits = int.from_bytes(raw[off : off + 2], "little")
    return BlockField(name, off, 2, "fp16", {"bits": bits, "float": fp16(raw, off)}, desc)


def bytes_field(raw: bytes, name: str, off: int, n: int, desc: str, signed: bool = False) -> BlockField:
    """``n`` bytes (signed or not) as a list field."""
    arr = np.frombuffer(raw, dtype=np.int8 if signed else np.uint8, count=n, offset=off)
    return BlockField(name, off, n, "i8[]" if signed else "u8[]", [int(v) for v in arr], desc)


def build_block(
    t: GGMLType, raw: bytes, fields: list[BlockField], code: np.ndarray, raw_code: np.ndarray,
    mult: np.ndarray, offs: np.ndarray, group: np.ndarray, code_byte: np.ndarray, code_shift: np.ndarray,
    code_bits: int, formula: str, group_size: int, **extra: Any,
) -> DecodedBlock:
    """The decoded block, its values from the reference dequantizer (one source of truth)."""
    values = dequantize(np.frombuffer(raw, dtype=np.uint8).reshape(1, -1), t)[0]
    return DecodedBlock(
        t, raw, fields, values, raw_code.astype(np.int16), code.astype(np.int16), mult.astype(np.float32),
        offs.astype(np.float32), group.astype(np.int16), code_byte.astype(np.int16), code_shift.astype(np.int8),
        code_bits, formula, group_size, **extra,
    )


__all__ = ["BitSource", "BlockField", "DecodedBlock", "build_block", "bytes_field", "fp16", "fp16_field"]
