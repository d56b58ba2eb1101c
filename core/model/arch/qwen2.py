"""qwen2: llama's layout with NeoX RoPE (its q/k/v biases are bound when present)."""

from __future__ import annotations

from ...gguf import GGUFFile
from .base import Architecture, Common


def configure(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    return {}


DESCRIPTION = Architecture("qwen2", configure, bump=True)
