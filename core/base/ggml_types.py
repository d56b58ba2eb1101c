"""The ggml tensor type table: one row per type id (name, block elements, block bytes, vec-dot partner, and for
the plain types their numpy dtype, description and non-finite bit pattern; for the block types the byte offsets of
their fp16 scales). Every per-type fact Python needs lives here rather than in a side table next to its user."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GGMLType:
    """Traits of one ggml tensor type.

    ``block_elems`` elements are stored in ``block_bytes`` bytes; ``vec_dot`` names the activation type
    ggml's CPU backend pairs it with in a dot product (``None`` for activation-only/integer types).
    Plain (one element per block) types carry ``dtype``, the little-endian numpy dtype of their storage (BF16 as
    its 16 bits, ``"<u2"``: numpy has no bfloat16), and ``description``; the float ones ``inf_nan_bits``, the
    exponent bits that are all set exactly in infinities and NaNs. ``fp16_scales`` are the byte offsets of a
    block's IEEE binary16 scale fields (``d``, ``dmin``...; empty where the scale is not one whole fp16 field).
    """

    id: int
    name: str
    block_elems: int
    block_bytes: int
    vec_dot: str | None = None
    activation_only: bool = False
    dtype: str | None = None
    description: str = ""
    inf_nan_bits: int = 0
    fp16_scales: tuple[int, ...] = ()

    @property
    def bits_per_weight(self) -> float:
        """Storage cost in bits per element."""
        return 8.0 * self.block_bytes / self.block_elems

    @property
    def is_quantized(self) -> bool:
        """True for block formats (more than one element per block)."""
        return self.block_elems > 1

    @property
    def is_exact(self) -> bool:
        """Integer and float64 types: values that are their own (shown exactly, cast to float32 to compute)."""
        return self.dtype is not None and self.name not in ("F32", "F16", "BF16")

    def row_bytes(self, ne0: int) -> int:
        """Bytes of one row of ``ne0`` elements (``ne0`` must be a multiple of ``block_elems``)."""
        return (ne0 // self.block_elems) * self.block_bytes

    def __str__(self) -> str:
        return self.name


_ROWS: list[GGMLType] = [
    GGMLType(0, "F32", 1, 4, "F32", dtype="<f4", description="IEEE binary32", inf_nan_bits=0x7F800000),
    GGMLType(1, "F16", 1, 2, "F16", dtype="<f2", description="IEEE binary16", inf_nan_bits=0x7C00),
    GGMLType(2, "Q4_0", 32, 18, "Q8_0", fp16_scales=(0,)),
    GGMLType(3, "Q4_1", 32, 20, "Q8_1", fp16_scales=(0, 2)),
    GGMLType(6, "Q5_0", 32, 22, "Q8_0", fp16_scales=(0,)),
    GGMLType(7, "Q5_1", 32, 24, "Q8_1", fp16_scales=(0, 2)),
    GGMLType(8, "Q8_0", 32, 34, "Q8_0", fp16_scales=(0,)),
    GGMLType(9, "Q8_1", 32, 36, None, activation_only=True, fp16_scales=(0, 2)),
    GGMLType(10, "Q2_K", 256, 84, "Q8_K", fp16_scales=(80, 82)),
    GGMLType(11, "Q3_K", 256, 110, "Q8_K", fp16_scales=(108,)),
    GGMLType(12, "Q4_K", 256, 144, "Q8_K", fp16_scales=(0, 2)),
    GGMLType(13, "Q5_K", 256, 176, "Q8_K", fp16_scales=(0, 2)),
    GGMLType(14, "Q6_K", 256, 210, "Q8_K", fp16_scales=(208,)),
    GGMLType(15, "Q8_K", 256, 292, None, activation_only=True),
    GGMLType(16, "IQ2_XXS", 256, 66, "Q8_K", fp16_scales=(0,)),
    GGMLType(17, "IQ2_XS", 256, 74, "Q8_K", fp16_scales=(0,)),
    GGMLType(18, "IQ3_XXS", 256, 98, "Q8_K", fp16_scales=(0,)),
    GGMLType(19, "IQ1_S", 256, 50, "Q8_K", fp16_scales=(0,)),
    GGMLType(20, "IQ4_NL", 32, 18, "Q8_0", fp16_scales=(0,)),
    GGMLType(21, "IQ3_S", 256, 110, "Q8_K", fp16_scales=(0,)),
    GGMLType(22, "IQ2_S", 256, 82, "Q8_K", fp16_scales=(0,)),
    GGMLType(23, "IQ4_XS", 256, 136, "Q8_K", fp16_scales=(0,)),
    GGMLType(24, "I8", 1, 1, dtype="<i1", description="signed 8-bit integer"),
    GGMLType(25, "I16", 1, 2, dtype="<i2", description="signed 16-bit integer"),
    GGMLType(26, "I32", 1, 4, dtype="<i4", description="signed 32-bit integer"),
    GGMLType(27, "I64", 1, 8, dtype="<i8", description="signed 64-bit integer"),
    GGMLType(28, "F64", 1, 8, dtype="<f8", description="IEEE binary64 (the plot shows it rounded to binary32)",
             inf_nan_bits=0x7FF0000000000000),
    GGMLType(29, "IQ1_M", 256, 56, "Q8_K"),
    GGMLType(30, "BF16", 1, 2, "BF16", dtype="<u2", description="bfloat16 (upper half of a binary32)",
             inf_nan_bits=0x7F80),
    GGMLType(34, "TQ1_0", 256, 54, "Q8_K", fp16_scales=(52,)),
    GGMLType(35, "TQ2_0", 256, 66, "Q8_K", fp16_scales=(64,)),
    GGMLType(39, "MXFP4", 32, 17, "Q8_0"),
    GGMLType(40, "NVFP4", 64, 36, "Q8_0"),
    GGMLType(41, "Q1_0", 128, 18, "Q8_0"),
    GGMLType(42, "Q2_0", 64, 18, "Q8_0"),
]

#: Type id -> traits, for every id a current ggml accepts in a file.
GGML_TYPES: dict[int, GGMLType] = {t.id: t for t in _ROWS}
#: Type name -> traits.
GGML_TYPES_BY_NAME: dict[str, GGMLType] = {t.name: t for t in _ROWS}
#: Ids that once existed and are no longer valid in files (block size 0 in ggml).
REMOVED_TYPE_IDS: dict[int, str] = {
    4: "Q4_2",
    5: "Q4_3",
    31: "Q4_0_4_4",
    32: "Q4_0_4_8",
    33: "Q4_0_8_8",
    36: "IQ4_NL_4_4",
    37: "IQ4_NL_4_8",
    38: "IQ4_NL_8_8",
}


def ggml_type(key: int | str) -> GGMLType:
    """Look a type up by id or name; raises ``KeyError`` naming the unknown id."""
    if isinstance(key, str):
        try:
            return GGML_TYPES_BY_NAME[key.upper()]
        except KeyError:
            raise KeyError(f"unknown ggml type {key!r}") from None
    try:
        return GGML_TYPES[key]
    except KeyError:
        if key in REMOVED_TYPE_IDS:
            raise KeyError(f"removed ggml type {key} ({REMOVED_TYPE_IDS[key]})") from None
        raise KeyError(f"unknown type {key}") from None
