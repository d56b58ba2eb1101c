"""ggml type table, reference (numpy) dequantization and single-block decoders."""

from .blocks import BitSource, BlockField, DecodedBlock, can_decode, decode_block
from .dequant import can_dequantize, dequantize
from .types import GGML_TYPES, GGML_TYPES_BY_NAME, REMOVED_TYPE_IDS, GGMLType, ggml_type

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
