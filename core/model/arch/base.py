"""What a model description is (:class:`Architecture`) and the helpers several descriptions share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...gguf import GGUFFile
from ..config import MAX_EXPERTS, MAX_FF, ModelError, UnsupportedModel
from ..metadata import read_int, read_ints

#: The common hyperparameters read_config has read (ModelConfig field -> value), handed to each description.
Common = dict[str, object]
#: A description's reader: (file, common hyperparameters, GGUF key per field) -> the ModelConfig switches it sets.
Configure = Callable[[GGUFFile, Common, dict[str, str]], dict[str, object]]


@dataclass(frozen=True)
class Architecture:
    """Everything the engine knows about one ``general.architecture``: ``configure`` reads its own metadata keys
    and returns the :class:`~quantscope.core.model.config.ModelConfig` switches it sets; the flags say which
    optional tensors the binding looks for. Nothing outside the descriptions tests an architecture's name: the
    engine, the backends and the binding read these flags and the config's switches."""

    name: str
    configure: Configure
    rope_neox: bool = True  # NeoX RoPE (rotate the two halves of a head) rather than adjacent pairs
    fused_gate_up: bool = False  # ffn_up may hold gate then up (2 x n_ff rows) with no ffn_gate
    ffn_norm: str = "ffn_norm.weight"  # the pre-FFN norm's tensor (gpt-oss calls it post_attention_norm)
    rope_freqs: bool = False  # rope_freqs.weight (the RoPE frequency divisors) is bound when present
    longrope: bool = False  # rope_factors_long/short.weight (LongRoPE) are bound when present
    v_from_k: bool = False  # a layer without attn_v uses K's projection as V
    layer_output_scale: bool = False  # layer_output_scale.weight (one factor per layer) is bound when present
    expert_biases: bool = False  # attn_output.bias, ffn_gate_inp.bias and ffn_*_exps.bias bound when present
    bump: bool = False  # a bump file's config.json may name it (model_type): a plain llama-style layout
    # an embedding model of it (a pooling set) runs the decoder layers, its rows after the final norm pooled
    # (Qwen3-Embedding, EmbeddingGemma), not the BERT encoder's layers
    decoder_embedding: bool = False
    # its reranker (rank pooling) has llama.cpp's decoder rerank head: ``cls.output.weight`` alone on the last
    # token's row, the scores softmaxed (Qwen3-Reranker's yes/no rows of the LM head)
    decoder_rank_head: bool = False


def experts(f: GGUFFile, c: Common, keys: dict[str, str], ff_key: str = "", shared: bool = False) -> dict[str, object]:
    """The mixture-of-experts keys (none: a dense model): expert count and experts used per token;
    ``ff_key``: the experts' own FFN width (qwen3moe), one value or one per layer (all equal). Shared experts and
    gating functions other than llama.cpp's softmax for these architectures are refused."""
    a = c["arch"]
    n = read_int(f, keys["n_expert"], 0, lo=0, hi=MAX_EXPERTS)
    if not n:
        if f.has_tensor("blk.0.ffn_gate_inp.weight"):
            raise ModelError(f"{keys['n_expert']}: expected the number of experts (the file has "
                             "blk.0.ffn_gate_inp.weight), found none")
        return {}
    for key in (f"{a}.expert_shared_count", f"{a}.expert_shared_feed_forward_length"):
        if not shared and read_int(f, key, 0, lo=0, hi=MAX_FF):
            raise UnsupportedModel(f"{key}: shared experts are not supported by the engine")
    gating = read_int(f, f"{a}.expert_gating_func", 1, lo=0, hi=16)
    if gating != 1:
        raise UnsupportedModel(f"{a}.expert_gating_func: only softmax gating (1) is supported, found {gating}")
    # llama.cpp reads no expert_weights_scale / _norm for these architectures (the weights are always normalized,
    # never scaled), so neither do we
    out: dict[str, object] = {"n_expert": n, "n_expert_used": read_int(f, keys["n_expert_used"], hi=MAX_EXPERTS)}
    if ff_key:
        widths = read_ints(f, ff_key, c["n_layers"], hi=MAX_FF)  # type: ignore[arg-type]
        if len(set(widths)) > 1:
            raise UnsupportedModel(f"{ff_key}: experts of different widths per layer are not supported")
        out.update(n_ff=widths[0], layer_n_ff=())
    return out


def required_experts(out: dict[str, object], keys: dict[str, str]) -> dict[str, object]:
    """``out`` of an architecture whose every FFN is a mixture of experts: refused without an expert count."""
    if not out.get("n_expert"):
        raise ModelError(f"{keys['n_expert']}: expected the number of experts, found none")
    return out
