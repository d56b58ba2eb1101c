"""phi3: fused qkv / gate+up (split at binding); Phi-3.5/4 LongRoPE: rope_factors_long/short.weight, chosen by the
session's context against ``rope.scaling.original_context_length``, and ``rope.scaling.attn_factor``."""

from __future__ import annotations

from ...gguf import GGUFFile
from .base import Architecture, Common


def configure(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    return {}


DESCRIPTION = Architecture("phi3", configure, fused_gate_up=True, longrope=True)
