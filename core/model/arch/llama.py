"""llama: Llama 1-3 (rope_freqs.weight bound when present); with expert_count, Mixtral's mixture of experts
(feed_forward_length is each expert's width)."""

from __future__ import annotations

from ...gguf import GGUFFile
from .base import Architecture, Common, experts


def configure(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    return experts(f, c, keys)


DESCRIPTION = Architecture("llama", configure, rope_neox=False, rope_freqs=True, bump=True)
