"""gpt-oss: OpenAI's gpt-oss. Every FFN a mixture of experts (expert_feed_forward_length wide, biased, the clamped
SwiGLU, weighed by a softmax over the picked router logits), attention with biases and per-head sinks, the even
layers sliding over ``attention.sliding_window`` positions with the same (YaRN) RoPE as the others
(docs/engine.md). Its pre-FFN norm is called post_attention_norm."""

from __future__ import annotations

from ...gguf import GGUFFile
from ..config import MAX_CTX
from ..metadata import read_int
from .base import Architecture, Common, experts, required_experts


def configure(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    return required_experts({
        "rope_base_swa": c["rope_base"], "swa_pattern": 2, "rope_scale_swa": True,
        "sliding_window": read_int(f, keys["sliding_window"], hi=MAX_CTX), "attn_sinks": True, "swiglu_oai": True,
        **experts(f, c, keys, f"{c['arch']}.expert_feed_forward_length")}, keys)


DESCRIPTION = Architecture("gpt-oss", configure, ffn_norm="post_attention_norm.weight", expert_biases=True)
