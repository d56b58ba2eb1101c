"""qwen3moe: qwen3 with every FFN a mixture of experts of expert_feed_forward_length each."""

from __future__ import annotations

from ...gguf import GGUFFile
from .base import Architecture, Common, experts, required_experts


def configure(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    return required_experts({"qk_norm": True, **experts(f, c, keys, f"{c['arch']}.expert_feed_forward_length")},
                            keys)


DESCRIPTION = Architecture("qwen3moe", configure)
