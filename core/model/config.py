"""The model's hyperparameters: :class:`ModelConfig` (every switch the forward pass reads, each layer's policy
derived from them), the engine's limits, the errors, and the GGUF key behind each field (what messages name)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


class UnsupportedModel(ValueError):
    """The file's architecture (or one of its tensors) is not something the engine can run."""


class ModelError(UnsupportedModel):
    """A hyperparameter is mistyped or out of range, or disagrees with the tensors: the message names the key, the
    expected and the found value. A subclass of :class:`UnsupportedModel`, so callers catching that catch both."""


class EmbeddingModel(UnsupportedModel):
    """The file is an embedding model (it pools rows into vectors): the text generation engine does not run it;
    :mod:`quantscope.core.engine.encoder` does."""


#: Upper bounds the engine accepts (the native block checks the same limits again on every call).
MAX_EMBD = 1 << 20
MAX_FF = 1 << 22
MAX_HEADS = 4096
MAX_HEAD_DIM = 1024
MAX_LAYERS = 4096
MAX_CTX = (1 << 31) - 1
MAX_VOCAB = 1 << 24
MAX_EXPERTS = 4096  # csrc/qs_block.c checks the same bound

@dataclass(frozen=True)
class ModelConfig:
    """Everything the forward pass needs to know about the architecture."""

    arch: str
    n_layers: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    rms_eps: float
    rope_base: float
    rope_neox: bool
    rope_dim: int
    rope_base_swa: float = 10000.0
    sliding_window: int = 0
    swa_pattern: int = 0  # gemma3: every swa_pattern-th layer is global, the others slide
    embed_scale: float = 1.0
    gelu: bool = False
    qk_norm: bool = False
    post_norms: bool = False
    attn_scale: float = 0.0
    no_rope_step: int = 0  # smollm3: every no_rope_step-th layer has no RoPE (0: every layer rotates)
    qk_norm_full: bool = False  # olmo2: the q/k RMSNorm spans the whole projection, not each head
    pre_norms: bool = True  # olmo2 has none: attention and FFN read the residual stream directly
    attn_softcap: float = 0.0  # gemma2: scaled attention scores s -> cap * tanh(s / cap) (0: none)
    final_softcap: float = 0.0  # gemma2: the same on the output logits
    residual_scale: float = 1.0  # granite: attention and FFN outputs scaled before the residual add
    rope_orig_ctx: int = 0  # rope.scaling.original_context_length (0: n_ctx_train): LongRoPE's and YaRN's
    rope_mscale: float = 1.0  # the rotated part of q and k is multiplied by this (llama.cpp's yarn_attn_factor)
    rope_freq_scale: float = 1.0  # linear / YaRN scaling: 1 / rope.scaling.factor (sliding layers keep 1)
    rope_ext_factor: float = 0.0  # 1 with YaRN
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    attn_temp_scale: float = 0.0  # mistral3: queries scaled by 1 + t * ln(floor(pos / rope_orig_ctx) + 1)
    logit_scale: float = 1.0  # granite: logits divided by this
    # gemma4: per-layer shapes (empty: every layer has the scalars above), an explicit sliding-layer list, V
    # RMS-normalized without a weight, the layers from kv_from_start on reading an earlier layer's KV cache, and
    # per-layer token embeddings of ple_dim values
    layer_n_head_kv: tuple[int, ...] = ()
    layer_head_dim: tuple[int, ...] = ()
    layer_n_ff: tuple[int, ...] = ()
    layer_rope_dim: tuple[int, ...] = ()
    swa_layers: tuple[bool, ...] = ()
    v_norm: bool = False
    kv_from_start: int = 0
    ple_dim: int = 0
    rope_freqs_global_only: bool = False  # rope_freqs.weight applies to the global (non-sliding) layers only
    # mixture of experts (Mixtral-style llama, qwen3moe): n_expert gated FFNs of n_ff each per layer, n_expert_used
    # of them per token (softmax router, top-k, weights normalized to 1 then times expert_weights_scale; 0: 1)
    n_expert: int = 0
    n_expert_used: int = 0
    expert_weights_scale: float = 0.0
    # gpt-oss: attention sinks, the clamped SwiGLU (g = min(g, 7), u = clamp(u, -7, 7), g * sigmoid(1.702 g) *
    # (u + 1)), the sliding layers' RoPE scaled like the others; its biases (attention output, router, experts) are
    # bound when present. (Its softmax over the picked router logits is the normalized softmax of the others.)
    attn_sinks: bool = False
    swiglu_oai: bool = False
    rope_scale_swa: bool = False
    # qwen35: the attention layers' attn_q holds each head's query and an output gate (sigmoid-gated attention
    # output); the layers flagged in recurrent_layers are gated delta-net layers (docs/engine.md, "Gated delta-net
    # layers"): a depthwise causal conv of ssm_conv taps, ssm_k_heads key and ssm_v_heads value heads of ssm_state
    q_gate: bool = False
    recurrent_layers: tuple[bool, ...] = ()
    ssm_conv: int = 0
    ssm_state: int = 0
    ssm_k_heads: int = 0
    ssm_v_heads: int = 0
    n_ff_shexp: int = 0  # qwen35moe: a shared expert of this width beside the routed ones (0: none)
    #: an embedding model's pooling of the last layer's rows ("none", "mean", "cls", "last", "rank"); "" for the
    #: text generation models. A model with a pooling is an encoder (core/engine/encoder.py): it does not generate
    pooling: str = ""
    #: False: every token attends to every token of its input (EmbeddingGemma; the sliding layers within
    #: sliding_window / 2 positions either side), not to the earlier ones only
    causal: bool = True
    #: an encoder's positions: "absolute" (position_embd rows added to the embeddings: BERT), "rope" (q and k
    #: rotated: nomic-bert), "alibi" (scores biased by -slope * distance, alibi_max_bias: jina-bert-v2)
    encoder_positions: str = "absolute"
    alibi_max_bias: float = 0.0
    #: an encoder's FFN: "plain" (up, GELU, down: BERT), "gated" (gate and up, SwiGLU or with ``gelu`` GEGLU:
    #: nomic-bert), "any" (gated by ffn_gate or by gate-then-up rows in ffn_up, else plain: jina-bert-v2)
    encoder_ffn: str = "plain"

    @property
    def is_embedding(self) -> bool:
        """Is this an embedding (encoder) model, which pools rows instead of predicting tokens?"""
        return bool(self.pooling)

    def n_head_kv_at(self, layer: int) -> int:
        return self.layer_n_head_kv[layer] if self.layer_n_head_kv else self.n_head_kv

    def head_dim_at(self, layer: int) -> int:
        return self.layer_head_dim[layer] if self.layer_head_dim else self.head_dim

    def n_ff_at(self, layer: int) -> int:
        return self.layer_n_ff[layer] if self.layer_n_ff else self.n_ff

    def rope_dim_at(self, layer: int) -> int:
        return self.layer_rope_dim[layer] if self.layer_rope_dim else self.rope_dim

    def kv_source(self, layer: int) -> int:
        """The layer whose KV cache ``layer`` attends to: itself, or for gemma4's shared layers the last earlier
        layer of the same kind (llama.cpp: kv_from_start - 2 for sliding layers, - 1 for global ones)."""
        if not self.kv_from_start or layer < self.kv_from_start:
            return layer
        return self.kv_from_start - (2 if self.is_sliding(layer) else 1)

    def is_sliding(self, layer: int) -> bool:
        """Does ``layer`` use the sliding window (and the local RoPE base)?"""
        if self.swa_layers:
            return self.sliding_window > 0 and self.swa_layers[layer]
        return self.swa_pattern > 0 and self.sliding_window > 0 and (layer + 1) % self.swa_pattern != 0

    def layer_rope_base(self, layer: int) -> float:
        return self.rope_base_swa if self.is_sliding(layer) else self.rope_base

    def layer_window(self, layer: int) -> int:
        return self.sliding_window if self.is_sliding(layer) else 0

    def layer_rope_freq_scale(self, layer: int) -> float:
        """llama.cpp scales the RoPE frequencies of the global layers only (sliding layers keep their own), except
        for gpt-oss, whose sliding layers copy the global scaling."""
        return 1.0 if self.is_sliding(layer) and not self.rope_scale_swa else self.rope_freq_scale

    def original_ctx(self) -> int:
        return self.rope_orig_ctx or self.n_ctx_train

    def yarn_corr_dims(self, layer: int) -> tuple[float, float]:
        """ggml's YaRN correction dimensions for ``layer``'s RoPE base (ggml_rope_yarn_corr_dims, float32)."""
        base = np.float32(self.layer_rope_base(layer))
        n = np.float32(self.rope_dim_at(layer))
        orig = np.float32(self.original_ctx())

        def corr(beta: float) -> float:
            with np.errstate(all="ignore"):  # a base of 1 (or a hostile one) divides by zero: clamped below
                return float(n * np.log(orig / (np.float32(beta) * np.float32(2 * math.pi)))
                             / (np.float32(2) * np.log(base)))

        def finite(v: float, lo: float, hi: float) -> float:
            return lo if math.isnan(v) else min(max(v, lo), hi)

        start = finite(corr(self.rope_beta_fast), -1e9, 1e9)
        end = finite(corr(self.rope_beta_slow), -1e9, 1e9)
        return float(max(0, math.floor(start))), float(min(self.rope_dim_at(layer) - 1, math.ceil(end)))

    def is_recurrent(self, layer: int) -> bool:
        """Is ``layer`` a gated delta-net (linear attention) layer, with a recurrent state instead of a KV cache?"""
        return bool(self.recurrent_layers) and self.recurrent_layers[layer]

    @property
    def ssm_channels(self) -> int:
        """The delta-net's conv channels: queries and keys of the key heads, values of the value heads."""
        return (2 * self.ssm_k_heads + self.ssm_v_heads) * self.ssm_state

    def recurrent_state_bytes(self) -> int:
        """Bytes of a session's recurrent state (float32 conv inputs and delta-net matrices of every recurrent
        layer): fixed, whatever the context length."""
        n = sum(self.is_recurrent(i) for i in range(self.n_layers))
        per = (self.ssm_conv - 1) * self.ssm_channels + self.ssm_v_heads * self.ssm_state * self.ssm_state
        return 4 * n * per

    def uses_rope(self, layer: int) -> bool:
        """Does ``layer`` rotate q and k (smollm3 leaves every fourth layer without positions)?"""
        return self.no_rope_step <= 0 or (layer + 1) % self.no_rope_step != 0



def gguf_keys(arch: str, derived_head_dim: bool = False) -> dict[str, str]:
    """The GGUF metadata key behind each :class:`ModelConfig` field (what error messages name);
    ``derived_head_dim``: the file has no key_length, the head dimension is embedding_length / head_count."""
    p = arch + "."
    keys = {
        "n_layers": p + "block_count", "n_embd": p + "embedding_length", "n_head": p + "attention.head_count",
        "n_head_kv": p + "attention.head_count_kv", "head_dim": p + "attention.key_length",
        "n_ff": p + "feed_forward_length", "n_vocab": "token_embd.weight rows", "n_ctx_train": p + "context_length",
        "rms_eps": p + "attention.layer_norm_rms_epsilon", "rope_base": p + "rope.freq_base",
        "rope_dim": p + "rope.dimension_count", "sliding_window": p + "attention.sliding_window",
        "rope_base_swa": p + "rope.freq_base (sliding layers)",
        "layer_n_head_kv": p + "attention.head_count_kv", "layer_n_ff": p + "feed_forward_length",
        "layer_head_dim": p + "attention.key_length / key_length_swa",
        "layer_rope_dim": p + "rope.dimension_count / dimension_count_swa",
        "swa_layers": p + "attention.sliding_window_pattern", "kv_from_start": p + "attention.shared_kv_layers",
        "ple_dim": p + "embedding_length_per_layer_input",
        "n_expert": p + "expert_count", "n_expert_used": p + "expert_used_count",
    }
    if derived_head_dim:
        keys["head_dim"] = f"{p}embedding_length / {p}attention.head_count"
    return keys

