"""GGUF container vocabulary: magic, value types and the ``general.file_type`` enum."""

from __future__ import annotations

from enum import IntEnum

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
SUPPORTED_VERSIONS = (2, 3)

#: Largest string accepted anywhere in the header (llama.cpp's cap).
MAX_STRING_BYTES = 1 << 30
#: Largest metadata array (llama.cpp's cap, in elements).
MAX_ARRAY_ELEMENTS = 1 << 30
#: ggml tensors have at most this many dimensions.
MAX_DIMS = 4
#: Tensor names longer than this are rejected (llama.cpp: < 64; we accept what gguf-py accepts, within reason).
MAX_TENSOR_NAME_BYTES = 1 << 16


class ValueType(IntEnum):
    """Metadata value type ids (``gguf_type``)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


#: ``struct``/``array`` type code of each fixed-size value type (BOOL: one byte, 0 or 1). The one table every
#: reader and writer of metadata values derives its formats from.
STRUCT_CODES: dict[ValueType, str] = {
    ValueType.UINT8: "B", ValueType.INT8: "b", ValueType.UINT16: "H", ValueType.INT16: "h",
    ValueType.UINT32: "I", ValueType.INT32: "i", ValueType.FLOAT32: "f", ValueType.BOOL: "B",
    ValueType.UINT64: "Q", ValueType.INT64: "q", ValueType.FLOAT64: "d",
}
#: numpy dtype strings (little-endian) of the fixed-size value types.
SCALAR_DTYPES: dict[ValueType, str] = {t: "<" + c for t, c in STRUCT_CODES.items()}


class FileType(IntEnum):
    """``general.file_type``: llama.cpp's ``llama_ftype`` (the *file* type, not a tensor type)."""

    ALL_F32 = 0
    MOSTLY_F16 = 1
    MOSTLY_Q4_0 = 2
    MOSTLY_Q4_1 = 3
    MOSTLY_Q4_1_SOME_F16 = 4
    MOSTLY_Q4_2 = 5
    MOSTLY_Q4_3 = 6
    MOSTLY_Q8_0 = 7
    MOSTLY_Q5_0 = 8
    MOSTLY_Q5_1 = 9
    MOSTLY_Q2_K = 10
    MOSTLY_Q3_K_S = 11
    MOSTLY_Q3_K_M = 12
    MOSTLY_Q3_K_L = 13
    MOSTLY_Q4_K_S = 14
    MOSTLY_Q4_K_M = 15
    MOSTLY_Q5_K_S = 16
    MOSTLY_Q5_K_M = 17
    MOSTLY_Q6_K = 18
    MOSTLY_IQ2_XXS = 19
    MOSTLY_IQ2_XS = 20
    MOSTLY_Q2_K_S = 21
    MOSTLY_IQ3_XS = 22
    MOSTLY_IQ3_XXS = 23
    MOSTLY_IQ1_S = 24
    MOSTLY_IQ4_NL = 25
    MOSTLY_IQ3_S = 26
    MOSTLY_IQ3_M = 27
    MOSTLY_IQ2_S = 28
    MOSTLY_IQ2_M = 29
    MOSTLY_IQ4_XS = 30
    MOSTLY_IQ1_M = 31
    MOSTLY_BF16 = 32
    MOSTLY_Q4_0_4_4 = 33
    MOSTLY_Q4_0_4_8 = 34
    MOSTLY_Q4_0_8_8 = 35
    MOSTLY_TQ1_0 = 36
    MOSTLY_TQ2_0 = 37
    MOSTLY_MXFP4_MOE = 38
    MOSTLY_NVFP4 = 39
    MOSTLY_Q1_0 = 40
    GUESSED = 1024


def file_type_name(value: int) -> str:
    """Name of a ``general.file_type`` value, e.g. 15 -> ``MOSTLY_Q4_K_M``; unknown values say so."""
    try:
        return FileType(value).name
    except ValueError:
        return f"unknown file type {value}"
