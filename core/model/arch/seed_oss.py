"""seed_oss: ByteDance Seed-OSS. qwen2's layout (NeoX RoPE, q/k/v biases bound when present) whose pre-FFN norm
is called post_attention_norm; scores scaled by 1/sqrt(head size) (llama.cpp reads no attention.scale for it)."""

from __future__ import annotations

from ...gguf import GGUFFile
from .base import Architecture, Common


def configure(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    return {}


DESCRIPTION = Architecture("seed_oss", configure, ffn_norm="post_attention_norm.weight")
