"""qwen3: qwen2's layout without biases, with per-head q/k RMSNorm."""

from __future__ import annotations

from ...gguf import GGUFFile
from .base import Architecture, Common


def configure(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    return {"qk_norm": True}


DESCRIPTION = Architecture("qwen3", configure)
