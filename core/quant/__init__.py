"""The codecs: reference (numpy) dequantization and single-block decoders, with the ggml type table of
``core.base.ggml_types`` re-exported.

The type table is imported eagerly; the numpy-based decoders on first use (opening a file or tokenizing text does
not import numpy)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..base.ggml_types import GGML_TYPES, GGML_TYPES_BY_NAME, REMOVED_TYPE_IDS, GGMLType, ggml_type

if TYPE_CHECKING:
    from .blocks import BitSource, BlockField, DecodedBlock, can_decode, decode_block
    from .dequant import can_dequantize, dequantize

_LAZY = {
    "BitSource": "blocks", "BlockField": "blocks", "DecodedBlock": "blocks", "can_decode": "blocks",
    "decode_block": "blocks", "can_dequantize": "dequant", "dequantize": "dequant",
}

__all__ = [
    "GGML_TYPES",
    "GGML_TYPES_BY_NAME",
    "REMOVED_TYPE_IDS",
    "BitSource",
    "BlockField",
    "DecodedBlock",
    "GGMLType",
    "can_decode",
    "can_dequantize",
    "decode_block",
    "dequantize",
    "ggml_type",
]


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{mod}", __name__), name)
