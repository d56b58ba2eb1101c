"""BUMPWGT3 byte layout (docs/bump.md §1-3): header, dtype code tables of the two profiles, section names."""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = b"BUMPWGT3"
VERSION = 3
MODEL_TYPE = 1
HEADER_SIZE = 128
CHECKSUM_OFFSET = 0x40
#: <8s magic, u32 version, u32 model_type, u32 layers, u32 vocab, u32 embed, u32 context, u32 heads, u32 head_dim,
#: u64 aligned_embed, u64 aligned_head, u64 aligned_context, 32s checksum, 32s reserved>
HEADER = struct.Struct("<8sIIIIIIIIQQQ32s32s")
assert HEADER.size == HEADER_SIZE

PER_LAYER = ("ln1_gamma", "ln2_gamma", "wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo", "w1", "b1", "w2", "b2")

#: type name -> dtype code, per profile.
PROFILES: dict[str, dict[str, int]] = {
    "ckernel": {"F32": 0, "BF16": 1, "F16": 2, "Q4_0": 5, "Q4_1": 6, "Q4_K": 7, "Q6_K": 8, "Q8_0": 9, "Q5_0": 11,
                "Q5_1": 12},
    "seed": {"F32": 0, "BF16": 1, "F16": 2, "Q4_K": 6, "Q6_K": 7},
}
#: Weight types each profile accepts (Q4_0/Q4_1 have codes but no converter or runtime takes them).
ACCEPTED_WEIGHTS: dict[str, tuple[str, ...]] = {
    "ckernel": ("Q4_K", "Q6_K", "F32", "Q8_0", "Q5_0", "Q5_1"),
    "seed": ("Q4_K", "Q6_K", "F32"),
}
DEFAULT_PROFILE = "ckernel"


def code_to_type(profile: str) -> dict[int, str]:
    """Inverse table of a profile: dtype code -> type name."""
    return {v: k for k, v in PROFILES[profile].items()}


@dataclass(frozen=True)
class BumpHeader:
    """The 128-byte header."""

    num_layers: int
    vocab_size: int
    embed_dim: int
    context_len: int
    num_heads: int
    head_dim: int
    aligned_embed_dim: int
    aligned_head_dim: int
    aligned_context: int
    checksum: bytes = b"\0" * 32
    version: int = VERSION
    model_type: int = MODEL_TYPE
    magic: bytes = MAGIC
    reserved: bytes = b"\0" * 32  # bytes 0x60..0x7f, zero in every valid file (outside the checksum)

    def pack(self) -> bytes:
        return HEADER.pack(self.magic, self.version, self.model_type, self.num_layers, self.vocab_size,
                           self.embed_dim, self.context_len, self.num_heads, self.head_dim, self.aligned_embed_dim,
                           self.aligned_head_dim, self.aligned_context, self.checksum, self.reserved)

    @classmethod
    def unpack(cls, raw: bytes) -> BumpHeader:
        (magic, version, model_type, layers, vocab, embed, ctx, heads, hd, a_e, a_h, a_c, checksum,
         reserved) = HEADER.unpack(raw[:HEADER_SIZE])
        return cls(layers, vocab, embed, ctx, heads, hd, a_e, a_h, a_c, checksum, version, model_type, magic,
                   reserved)

    def field_problems(self) -> list[str]:
        """Header fields outside the checksum that disagree with the format or with each other."""
        out = []
        if self.model_type != MODEL_TYPE:
            out.append(f"header: model_type {self.model_type} at byte 0x0c; expected {MODEL_TYPE}")
        if self.aligned_embed_dim != self.embed_dim:
            out.append(f"header: aligned_embed_dim {self.aligned_embed_dim} at byte 0x28 differs from embed_dim "
                       f"{self.embed_dim} (this layout has no padding)")
        if self.aligned_head_dim != self.head_dim:
            out.append(f"header: aligned_head_dim {self.aligned_head_dim} at byte 0x30 differs from head_dim "
                       f"{self.head_dim} (this layout has no padding)")
        if self.aligned_context != align_context(self.context_len):
            out.append(f"header: aligned_context {self.aligned_context} at byte 0x38 is not context "
                       f"{self.context_len} rounded up to 16")
        if any(self.reserved):
            first = next(i for i, x in enumerate(self.reserved) if x)
            out.append(f"header: reserved bytes 0x60..0x7f are not zero (first non-zero at byte {0x60 + first:#x})")
        return out


def align_context(c: int) -> int:
    """Context length rounded up to a multiple of 16."""
    return (c + 15) // 16 * 16
