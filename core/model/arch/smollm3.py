"""smollm3: llama without RoPE on every fourth layer (llama.cpp's fixed n_no_rope_layer_step)."""

from __future__ import annotations

from ...gguf import GGUFFile
from .base import Architecture, Common


def configure(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    return {"no_rope_step": 4}


DESCRIPTION = Architecture("smollm3", configure, rope_neox=False)
