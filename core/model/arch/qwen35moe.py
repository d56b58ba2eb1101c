"""qwen35moe: qwen35 with every FFN a mixture of experts (expert_feed_forward_length wide, softmax routing, weights
normalized) plus a shared expert of expert_shared_feed_forward_length (default feed_forward_length) whose output
is gated by sigmoid(h . ffn_gate_inp_shexp)."""

from __future__ import annotations

from ...gguf import GGUFFile
from ..config import MAX_EXPERTS, MAX_FF, UnsupportedModel
from ..metadata import read_int
from . import qwen35
from .base import Architecture, Common, experts, required_experts


def configure(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    a = c["arch"]
    if read_int(f, f"{a}.expert_shared_count", 1, lo=0, hi=MAX_EXPERTS) != 1:
        raise UnsupportedModel(f"{a}.expert_shared_count: only one shared expert is supported")
    out = required_experts({**qwen35.configure(f, c, keys),
                            **experts(f, c, keys, f"{a}.expert_feed_forward_length", shared=True)}, keys)
    out["n_ff_shexp"] = read_int(f, f"{a}.expert_shared_feed_forward_length", c["n_ff"], hi=MAX_FF)
    return out


DESCRIPTION = Architecture("qwen35moe", configure, ffn_norm="post_attention_norm.weight")
