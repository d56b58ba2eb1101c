"""Model architectures: hyperparameters from GGUF metadata and weights bound zero-copy to the mapped file.

Supported: llama (SmolLM2; Llama 3's ``rope_freqs.weight`` frequency factors), smollm3 (no RoPE on every
fourth layer), granite (embedding, attention, residual and logit multipliers), qwen2 (q/k/v biases), qwen3
(per-head q/k RMSNorm), phi3 (fused qkv and gate/up matrices, split into row views at binding), olmo2 (no
pre-norms, q/k RMSNorm over the projection, post norms), gemma2 (GEGLU, post norms, soft-capped scores and
logits, every other layer sliding) and gemma3 (scaled embeddings, GELU-tanh gated FFN, per-head q/k RMSNorm,
post-attention/post-FFN norms, sliding-window layers with their own RoPE base) and mistral3 (llama with
YaRN and query temperature tuning). Linear, YaRN and LongRoPE scaling are read for every architecture. A file
whose tensors or RoPE-scaling metadata the engine would ignore is refused. docs/engine.md section 1 tabulates
them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..gguf import GGUFFile, TensorInfo
from ..quant.types import GGMLType


class UnsupportedModel(ValueError):
    """The file's architecture (or one of its tensors) is not something the engine can run."""


class ModelError(UnsupportedModel):
    """A hyperparameter is mistyped or out of range, or disagrees with the tensors: the message names the key, the
    expected and the found value. A subclass of :class:`UnsupportedModel`, so callers catching that catch both."""


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


_REQUIRED = object()


def _show(v: object) -> str:
    text = repr(v.to_list()[:4] if hasattr(v, "to_list") else v)
    return text if len(text) <= 60 else text[:57] + "..."


def _raw(f: GGUFFile, key: str, default: object) -> tuple[object, str]:
    kv = f.metadata.get(key)
    if kv is None:
        if default is _REQUIRED:
            raise ModelError(f"{key}: expected a value, found none (the key is missing)")
        return default, ""
    return kv.value, kv.type_label


def _int(f: GGUFFile, key: str, default: object = _REQUIRED, lo: int = 1, hi: int = MAX_CTX) -> int:
    """Integer metadata ``key`` in ``lo..hi``; a bool, float, string or array is an error naming its type."""
    v, label = _raw(f, key, default)
    if isinstance(v, bool | np.bool_) or not isinstance(v, int | np.integer):
        raise ModelError(f"{key}: expected an integer, found {label or type(v).__name__} {_show(v)}")
    if not lo <= int(v) <= hi:
        raise ModelError(f"{key}: expected an integer in {lo}..{hi}, found {int(v)}")
    return int(v)


def _float(f: GGUFFile, key: str, default: float, hi: float = 1e30, zero_ok: bool = False) -> float:
    """Finite positive float metadata ``key`` at most ``hi`` (0 too with ``zero_ok``; an integer is accepted)."""
    v, label = _raw(f, key, default)
    if isinstance(v, bool | np.bool_) or not isinstance(v, int | float | np.integer | np.floating):
        raise ModelError(f"{key}: expected a number, found {label or type(v).__name__} {_show(v)}")
    x = float(v)
    if not (math.isfinite(x) and (0.0 <= x if zero_ok else 0.0 < x) and x <= hi):
        lo = "[0" if zero_ok else "(0"
        raise ModelError(f"{key}: expected a finite number in {lo}, {hi:g}], found {x!r}")
    return x


def _ints(f: GGUFFile, key: str, n: int, default: object = _REQUIRED, lo: int = 1, hi: int = MAX_CTX) -> list[int]:
    """Integer metadata ``key`` for each of ``n`` layers: one integer for all, or an array of ``n``."""
    kv = f.metadata.get(key)
    if kv is None or kv.count is None:
        return [_int(f, key, default, lo, hi)] * n
    v = kv.value
    items = v.tolist() if isinstance(v, np.ndarray) else list(v)
    if len(items) != n:
        raise ModelError(f"{key}: expected one value or {n} (one per layer), found an array of {len(items)}")
    for x in items:
        if isinstance(x, bool | np.bool_) or not isinstance(x, int | np.integer) or not lo <= int(x) <= hi:
            raise ModelError(f"{key}: expected integers in {lo}..{hi}, found {_show(x)}")
    return [int(x) for x in items]


def _bools(f: GGUFFile, key: str, n: int) -> list[bool]:
    """A required array of ``n`` booleans (one per layer)."""
    kv = f.metadata.get(key)
    if kv is None:
        raise ModelError(f"{key}: expected a value, found none (the key is missing)")
    v = kv.value
    items = v.tolist() if isinstance(v, np.ndarray) else []
    if kv.count is None or len(items) != n or not all(isinstance(x, bool) for x in items):
        raise ModelError(f"{key}: expected an array of {n} booleans (one per layer), found {kv.type_label} "
                         f"{_show(v)}")
    return [bool(x) for x in items]


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


def check_config(cfg: ModelConfig, keys: dict[str, str] | None = None) -> None:
    """Every hyperparameter in range and consistent with the others; :class:`ModelError` naming the key."""
    k = keys or gguf_keys(cfg.arch)
    if cfg.arch not in SUPPORTED_ARCHS:
        raise UnsupportedModel(f"architecture {cfg.arch!r} is not supported by the engine")
    limits = {"n_layers": MAX_LAYERS, "n_embd": MAX_EMBD, "n_head": MAX_HEADS, "n_head_kv": MAX_HEADS,
              "head_dim": MAX_HEAD_DIM, "n_ff": MAX_FF, "n_vocab": MAX_VOCAB, "n_ctx_train": MAX_CTX,
              "rope_dim": MAX_HEAD_DIM}
    for name, hi in limits.items():
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= hi:
            raise ModelError(f"{k[name]}: expected an integer in 1..{hi}, found {v!r}")
    for name in ("rms_eps", "rope_base", "rope_base_swa"):
        v = getattr(cfg, name)
        hi = 1.0 if name == "rms_eps" else 1e30
        if not (isinstance(v, int | float) and math.isfinite(v) and 0.0 < v <= hi):
            raise ModelError(f"{k[name]}: expected a finite number in (0, {hi:g}], found {v!r}")
    if cfg.n_head % cfg.n_head_kv:
        raise ModelError(f"{k['n_head_kv']}: expected a divisor of {k['n_head']} = {cfg.n_head}, "
                         f"found {cfg.n_head_kv}")
    if cfg.head_dim % 2:
        raise ModelError(f"{k['head_dim']}: expected an even head dimension, found {cfg.head_dim}")
    if cfg.rope_dim % 2 or cfg.rope_dim > cfg.head_dim:
        raise ModelError(f"{k['rope_dim']}: expected an even number at most the head dimension {cfg.head_dim} "
                         f"({k['head_dim']}), found {cfg.rope_dim}")
    if cfg.n_head * cfg.head_dim > MAX_FF:
        raise ModelError(f"{k['n_head']}: {cfg.n_head} heads of {cfg.head_dim} exceed {MAX_FF} values")
    if not 0 <= cfg.sliding_window <= MAX_CTX or not 0 <= cfg.swa_pattern <= MAX_LAYERS:
        raise ModelError(f"{k.get('sliding_window', 'sliding_window')}: expected 0..{MAX_CTX}, "
                         f"found {cfg.sliding_window}")
    for name in ("residual_scale", "logit_scale", "rope_mscale", "rope_freq_scale", "rope_beta_fast",
                 "rope_beta_slow"):
        v = getattr(cfg, name)
        if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
            raise ModelError(f"{cfg.arch} {name.replace('_', ' ')}: expected a finite number > 0, found {v!r}")
    if cfg.attn_temp_scale and not cfg.original_ctx():
        raise ModelError(f"{cfg.arch}.attention.temperature_scale needs a positive original context length")
    for name in ("attn_softcap", "final_softcap", "attn_temp_scale", "rope_ext_factor"):
        v = getattr(cfg, name)
        if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
            raise ModelError(f"{cfg.arch} {name.replace('_', ' ')}: expected a finite number >= 0, found {v!r}")
    if not 0 <= cfg.rope_orig_ctx <= MAX_CTX:
        raise ModelError(f"{cfg.arch}.rope.scaling.original_context_length: expected 0..{MAX_CTX}, "
                         f"found {cfg.rope_orig_ctx}")
    if not 0 <= cfg.no_rope_step <= MAX_LAYERS:
        raise ModelError(f"no-RoPE layer step: expected 0..{MAX_LAYERS}, found {cfg.no_rope_step}")
    if not (math.isfinite(cfg.embed_scale) and math.isfinite(cfg.attn_scale) and cfg.attn_scale >= 0):
        raise ModelError(f"{k['n_embd']}: derived scales are not finite")
    if isinstance(cfg.n_expert, bool) or not isinstance(cfg.n_expert, int) or not 0 <= cfg.n_expert <= MAX_EXPERTS:
        raise ModelError(f"{k['n_expert']}: expected an integer in 0..{MAX_EXPERTS}, found {cfg.n_expert!r}")
    if cfg.n_expert:
        if isinstance(cfg.n_expert_used, bool) or not isinstance(cfg.n_expert_used, int) \
                or not 1 <= cfg.n_expert_used <= cfg.n_expert:
            raise ModelError(f"{k['n_expert_used']}: expected an integer in 1..{cfg.n_expert} ({k['n_expert']}), "
                             f"found {cfg.n_expert_used!r}")
        v = cfg.expert_weights_scale
        if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
            raise ModelError(f"{cfg.arch}.expert_weights_scale: expected a finite number >= 0, found {v!r}")
        if cfg.gelu:
            raise UnsupportedModel(f"{cfg.arch}: experts with a GELU FFN are not supported by the engine")
    _check_layers(cfg, k)
    _check_recurrent(cfg)
    _check_shared_expert(cfg)


def _check_shared_expert(cfg: ModelConfig) -> None:
    v = cfg.n_ff_shexp
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_FF or (v and not cfg.n_expert):
        raise ModelError(f"{cfg.arch}.expert_shared_feed_forward_length: expected 0..{MAX_FF} with experts, "
                         f"found {v!r}")


def _check_recurrent(cfg: ModelConfig) -> None:
    """The gated delta-net hyperparameters (qwen35), each in range and against the others."""
    a = cfg.arch
    if not cfg.recurrent_layers:
        if cfg.ssm_conv or cfg.ssm_state or cfg.ssm_k_heads or cfg.ssm_v_heads:
            raise ModelError(f"{a}: delta-net sizes given without recurrent layers")
        return
    if len(cfg.recurrent_layers) != cfg.n_layers:
        raise ModelError(f"{a}.full_attention_interval: expected {cfg.n_layers} layer kinds, "
                         f"found {len(cfg.recurrent_layers)}")
    for name, key, hi in (("ssm_conv", "ssm.conv_kernel", 64), ("ssm_state", "ssm.state_size", MAX_HEAD_DIM),
                          ("ssm_k_heads", "ssm.group_count", MAX_HEADS),
                          ("ssm_v_heads", "ssm.time_step_rank", MAX_HEADS)):
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= hi:
            raise ModelError(f"{a}.{key}: expected an integer in 1..{hi}, found {v!r}")
    if cfg.ssm_v_heads % cfg.ssm_k_heads:
        raise ModelError(f"{a}.ssm.group_count: expected a divisor of {a}.ssm.time_step_rank = {cfg.ssm_v_heads}, "
                         f"found {cfg.ssm_k_heads}")
    if cfg.ssm_channels > MAX_FF:
        raise ModelError(f"{a}.ssm.*: {cfg.ssm_channels} conv channels exceed {MAX_FF}")


def _check_layers(cfg: ModelConfig, k: dict[str, str]) -> None:
    """The per-layer shapes (gemma4), the sliding-layer list and the KV sharing, each against the others."""
    L = cfg.n_layers
    for name in ("layer_n_head_kv", "layer_head_dim", "layer_n_ff", "layer_rope_dim", "swa_layers"):
        v = getattr(cfg, name)
        if v and len(v) != L:
            raise ModelError(f"{k.get(name, name)}: expected {L} values (one per layer), found {len(v)}")
    for i in range(L):
        kv, hd, ff, rd = cfg.n_head_kv_at(i), cfg.head_dim_at(i), cfg.n_ff_at(i), cfg.rope_dim_at(i)
        for name, v, hi in (("n_head_kv", kv, MAX_HEADS), ("head_dim", hd, MAX_HEAD_DIM), ("n_ff", ff, MAX_FF),
                            ("rope_dim", rd, MAX_HEAD_DIM)):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= hi:
                raise ModelError(f"{k.get('layer_' + name, k[name])}: expected an integer in 1..{hi} for layer {i}, "
                                 f"found {v!r}")
        if cfg.n_head % kv:
            raise ModelError(f"{k.get('layer_n_head_kv', k['n_head_kv'])}: expected a divisor of {k['n_head']} = "
                             f"{cfg.n_head} for layer {i}, found {kv}")
        if hd % 2 or rd % 2 or rd > hd:
            raise ModelError(f"{k.get('layer_rope_dim', k['rope_dim'])}: expected an even number at most the head "
                             f"dimension {hd} for layer {i}, found {rd}")
        if cfg.n_head * hd > MAX_FF:
            raise ModelError(f"{k['n_head']}: {cfg.n_head} heads of {hd} exceed {MAX_FF} values (layer {i})")
    if not 0 <= cfg.ple_dim <= MAX_EMBD:
        raise ModelError(f"{k.get('ple_dim', 'ple_dim')}: expected 0..{MAX_EMBD}, found {cfg.ple_dim}")
    if cfg.kv_from_start:
        if not 2 <= cfg.kv_from_start <= L:
            raise ModelError(f"{k.get('kv_from_start', 'kv_from_start')}: expected the layers with their own KV "
                             f"cache to number 2..{L}, found {cfg.kv_from_start}")
        for i in range(cfg.kv_from_start, L):
            j = cfg.kv_source(i)
            if (cfg.is_sliding(j) != cfg.is_sliding(i) or cfg.head_dim_at(j) != cfg.head_dim_at(i)
                    or cfg.n_head_kv_at(j) != cfg.n_head_kv_at(i)):
                raise ModelError(f"{k.get('kv_from_start', 'kv_from_start')}: layer {i} would read layer {j}'s KV "
                                 "cache, which has another kind or shape")


# ------------------------------------------------------------------------------ one description per architecture
# Each returns what its architecture adds to the common hyperparameters (the ModelConfig switches), reading and
# checking its own metadata keys. docs/engine.md section 1 tabulates them; docs/extending.md says how to add one.
Common = dict[str, object]


def _experts(f: GGUFFile, c: Common, keys: dict[str, str], ff_key: str = "", shared: bool = False) -> dict[str, object]:
    """The mixture-of-experts keys (none: a dense model): expert count and experts used per token;
    ``ff_key``: the experts' own FFN width (qwen3moe), one value or one per layer (all equal). Shared experts and
    gating functions other than llama.cpp's softmax for these architectures are refused."""
    a = c["arch"]
    n = _int(f, keys["n_expert"], 0, lo=0, hi=MAX_EXPERTS)
    if not n:
        if f.has_tensor("blk.0.ffn_gate_inp.weight"):
            raise ModelError(f"{keys['n_expert']}: expected the number of experts (the file has "
                             "blk.0.ffn_gate_inp.weight), found none")
        return {}
    for key in (f"{a}.expert_shared_count", f"{a}.expert_shared_feed_forward_length"):
        if not shared and _int(f, key, 0, lo=0, hi=MAX_FF):
            raise UnsupportedModel(f"{key}: shared experts are not supported by the engine")
    gating = _int(f, f"{a}.expert_gating_func", 1, lo=0, hi=16)
    if gating != 1:
        raise UnsupportedModel(f"{a}.expert_gating_func: only softmax gating (1) is supported, found {gating}")
    # llama.cpp reads no expert_weights_scale / _norm for these architectures (the weights are always normalized,
    # never scaled), so neither do we
    out: dict[str, object] = {"n_expert": n, "n_expert_used": _int(f, keys["n_expert_used"], hi=MAX_EXPERTS)}
    if ff_key:
        widths = _ints(f, ff_key, c["n_layers"], hi=MAX_FF)  # type: ignore[arg-type]
        if len(set(widths)) > 1:
            raise UnsupportedModel(f"{ff_key}: experts of different widths per layer are not supported")
        out.update(n_ff=widths[0], layer_n_ff=())
    return out


def _llama(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    """Llama 1-3 (rope_freqs.weight, when present, is bound by :func:`bind_weights`); with expert_count, Mixtral's
    mixture of experts (feed_forward_length is each expert's width)."""
    return {"rope_neox": False, **_experts(f, c, keys)}


def _qwen3moe(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    """qwen3 with every FFN a mixture of experts of expert_feed_forward_length each."""
    out = {"rope_neox": True, "qk_norm": True, **_experts(f, c, keys, f"{c['arch']}.expert_feed_forward_length")}
    if not out.get("n_expert"):
        raise ModelError(f"{keys['n_expert']}: expected the number of experts, found none")
    return out


def _gpt_oss(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    """OpenAI's gpt-oss: every FFN a mixture of experts (expert_feed_forward_length wide, biased, the clamped SwiGLU,
    weighed by a softmax over the picked router logits), attention with biases and per-head sinks, the even layers
    sliding over ``attention.sliding_window`` positions with the same (YaRN) RoPE as the others (docs/engine.md)."""
    out = {"rope_neox": True, "rope_base_swa": c["rope_base"], "swa_pattern": 2, "rope_scale_swa": True,
           "sliding_window": _int(f, keys["sliding_window"], hi=MAX_CTX), "attn_sinks": True, "swiglu_oai": True,
           **_experts(f, c, keys, f"{c['arch']}.expert_feed_forward_length")}
    if not out.get("n_expert"):
        raise ModelError(f"{keys['n_expert']}: expected the number of experts, found none")
    return out


def _granite(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    """Llama with four multipliers; ``rope.scaling.finetuned = false`` turns RoPE off."""
    a = c["arch"]
    finetuned = f.metadata.get(f"{a}.rope.scaling.finetuned")
    rope_on = True if finetuned is None else finetuned.value
    if not isinstance(rope_on, bool | np.bool_):
        raise ModelError(f"{a}.rope.scaling.finetuned: expected a bool, found {finetuned.type_label}")  # type: ignore[union-attr]
    return {"rope_neox": False, "no_rope_step": 0 if rope_on else 1,
            "embed_scale": _float(f, f"{a}.embedding_scale", 1.0, 1e6),
            "attn_scale": _float(f, f"{a}.attention.scale", 1.0 / math.sqrt(c["head_dim"]), 1e6),  # type: ignore[arg-type]
            "residual_scale": _float(f, f"{a}.residual_scale", 1.0, 1e6),
            "logit_scale": _float(f, f"{a}.logit_scale", _REQUIRED, 1e6)}  # type: ignore[arg-type]


def _smollm3(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    """Llama without RoPE on every fourth layer (llama.cpp's fixed n_no_rope_layer_step)."""
    return {"rope_neox": False, "no_rope_step": 4}


def _neox(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    """qwen2 (biases are bound when present)."""
    return {"rope_neox": True}


def _phi3(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    """Fused qkv / gate+up (split at binding); Phi-3.5/4 LongRoPE: rope_factors_long/short.weight, chosen by the
    session's context against ``rope.scaling.original_context_length``, and ``rope.scaling.attn_factor``."""
    return {"rope_neox": True}


def _mistral3(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    """Ministral 3: llama with YaRN (read for every architecture) and Llama 4's query temperature tuning."""
    temp = _float(f, f"{c['arch']}.attention.temperature_scale", 0.0, zero_ok=True)
    return {"rope_neox": False, "attn_temp_scale": temp}


def _qwen3(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    """qwen2's layout without biases, with per-head q/k RMSNorm."""
    return {"rope_neox": True, "qk_norm": True}


def _olmo2(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    """No pre-norms; q/k RMSNorm over the whole projection; post-attention and post-FFN norms."""
    if _int(f, keys["sliding_window"], 0, lo=0):
        raise UnsupportedModel(f"{keys['sliding_window']}: OLMo 3's sliding-window layers are not supported "
                               "by the engine")
    return {"rope_neox": True, "qk_norm": True, "qk_norm_full": True, "post_norms": True, "pre_norms": False}


def _gemma2(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    """Scaled embeddings, GEGLU, post norms, soft-capped scores and logits, even layers sliding."""
    a = c["arch"]
    return {"rope_neox": True, "rope_base_swa": c["rope_base"],
            "sliding_window": _int(f, keys["sliding_window"], 4096, lo=0), "swa_pattern": 2,
            "embed_scale": math.sqrt(c["n_embd"]), "gelu": True, "post_norms": True,  # type: ignore[arg-type]
            "attn_scale": 1.0 / math.sqrt(c["head_dim"]),  # type: ignore[arg-type]
            "attn_softcap": _float(f, f"{a}.attn_logit_softcapping", 50.0, 1e30),
            "final_softcap": _float(f, f"{a}.final_logit_softcapping", 30.0, 1e30)}


def _gemma3(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    """Gemma 2's layout with per-head q/k RMSNorm instead of soft-capping; 5 of every 6 layers slide (base
    10000 there)."""
    return {"rope_neox": True, "rope_base_swa": 10000.0, "sliding_window": _int(f, keys["sliding_window"], 0, lo=0),
            "swa_pattern": 6, "embed_scale": math.sqrt(c["n_embd"]), "gelu": True,  # type: ignore[arg-type]
            "qk_norm": True, "post_norms": True, "attn_scale": 1.0 / math.sqrt(c["head_dim"])}  # type: ignore[arg-type]


def _gemma4(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    """Gemma 4's dense text model: the layers listed in ``sliding_window_pattern`` slide (their own head size,
    rotated size and RoPE base), the others rotate with rope_freqs.weight (proportional RoPE); unscaled attention
    over q/k RMSNorm and a weightless V RMSNorm; the last ``shared_kv_layers`` layers read an earlier layer's
    cache; optional per-layer token embeddings; a per-layer output scale; final soft-capping."""
    a, n = c["arch"], c["n_layers"]
    swa = _bools(f, keys["swa_layers"], n)  # type: ignore[arg-type]
    hd_full = c["head_dim"]
    hd_swa = _int(f, f"{a}.attention.key_length_swa", hd_full, hi=MAX_HEAD_DIM)
    if _int(f, f"{a}.attention.value_length_swa", hd_swa, hi=MAX_HEAD_DIM) != hd_swa:
        raise ModelError(f"{a}.attention.value_length_swa: expected {hd_swa} (= {a}.attention.key_length_swa), "
                         f"found {f.get(a + '.attention.value_length_swa')}")
    rot_full = c["rope_dim"]
    rot_swa = _int(f, f"{a}.rope.dimension_count_swa", rot_full, hi=MAX_HEAD_DIM)
    shared = _int(f, keys["kv_from_start"], 0, lo=0, hi=MAX_LAYERS)
    if shared >= n:  # type: ignore[operator]
        raise ModelError(f"{keys['kv_from_start']}: expected fewer than {keys['n_layers']} = {n}, found {shared}")
    if f.has_tensor("blk.0.ffn_gate_inp.weight"):
        raise UnsupportedModel(f"{a}: the mixture-of-experts variant (ffn_gate_inp) is not supported by the engine")
    return {"rope_neox": True, "swa_layers": tuple(swa), "swa_pattern": 0,
            "sliding_window": _int(f, keys["sliding_window"], hi=MAX_CTX),
            "rope_base_swa": _float(f, f"{a}.rope.freq_base_swa", 10000.0, 1e30),
            "layer_head_dim": tuple(hd_swa if w else hd_full for w in swa),
            "layer_rope_dim": tuple(rot_swa if w else rot_full for w in swa),
            "kv_from_start": n - shared if shared else 0,  # type: ignore[operator]
            "ple_dim": _int(f, keys["ple_dim"], 0, lo=0, hi=MAX_EMBD),
            "embed_scale": math.sqrt(c["n_embd"]), "gelu": True, "qk_norm": True, "v_norm": True,  # type: ignore[arg-type]
            "post_norms": True, "attn_scale": 1.0, "rope_freqs_global_only": True,
            "final_softcap": _float(f, f"{a}.final_logit_softcapping", 30.0, 1e30)}


def _qwen35(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    """Qwen3.5: gated delta-net layers (every layer but each full_attention_interval-th, or those flagged by
    ``attention.recurrent_layers``) and gated attention layers with q/k RMSNorm and interleaved multi-section RoPE
    (text positions are the same in every section, so it is NeoX RoPE over rope.dimension_count values)."""
    a, n = c["arch"], c["n_layers"]
    if f.get(f"{a}.nextn_predict_layers"):
        raise UnsupportedModel(f"{a}.nextn_predict_layers: multi-token-prediction layers are not supported by the "
                               "engine")
    if f"{a}.attention.recurrent_layers" in f.metadata:
        rec = _bools(f, f"{a}.attention.recurrent_layers", n)  # type: ignore[arg-type]
    else:
        step = _int(f, f"{a}.full_attention_interval", 4, hi=MAX_LAYERS)
        rec = [(i + 1) % step != 0 for i in range(n)]  # type: ignore[arg-type]
    half = c["rope_dim"] // 2  # type: ignore[operator]
    sec_key = f"{a}.rope.dimension_sections"
    sec = _ints(f, sec_key, 4, lo=0, hi=MAX_HEAD_DIM) if sec_key in f.metadata else [half, 0, 0, 0]
    total = sum(sec)
    # a rotated pair whose section is the fourth (or none) would not rotate for text: llama.cpp gives it position 0
    if total <= 0 or any(not ((s % 3 == 0 and s < 3 * sec[0]) or (s % 3 == 1 and s < 3 * sec[1]) or
                              (s % 3 == 2 and s < 3 * sec[2])) for s in (i % total for i in range(half))):
        raise UnsupportedModel(f"{a}.rope.dimension_sections = {sec}: sections that leave rotated pairs to the "
                               "fourth (vision) section are not supported by the engine")
    inner = _int(f, f"{a}.ssm.inner_size", hi=MAX_FF)
    state = _int(f, f"{a}.ssm.state_size", hi=MAX_HEAD_DIM)
    v_heads = _int(f, f"{a}.ssm.time_step_rank", hi=MAX_HEADS)
    k_heads = _int(f, f"{a}.ssm.group_count", hi=MAX_HEADS)
    if inner != v_heads * state:  # type: ignore[operator]
        raise ModelError(f"{a}.ssm.inner_size: expected {a}.ssm.time_step_rank x {a}.ssm.state_size = "
                         f"{v_heads * state}, found {inner}")  # type: ignore[operator]
    if v_heads % k_heads:  # type: ignore[operator]
        raise ModelError(f"{a}.ssm.group_count: expected a divisor of {a}.ssm.time_step_rank = {v_heads}, "
                         f"found {k_heads}")
    return {"rope_neox": True, "qk_norm": True, "q_gate": True, "recurrent_layers": tuple(rec),
            "ssm_conv": _int(f, f"{a}.ssm.conv_kernel", hi=64), "ssm_state": state, "ssm_k_heads": k_heads,
            "ssm_v_heads": v_heads}


def _qwen35moe(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    """qwen35 with every FFN a mixture of experts (expert_feed_forward_length wide, softmax routing, weights
    normalized) plus a shared expert of expert_shared_feed_forward_length (default feed_forward_length) whose
    output is gated by sigmoid(h . ffn_gate_inp_shexp)."""
    a = c["arch"]
    if _int(f, f"{a}.expert_shared_count", 1, lo=0, hi=MAX_EXPERTS) != 1:
        raise UnsupportedModel(f"{a}.expert_shared_count: only one shared expert is supported")
    out = {**_qwen35(f, c, keys), **_experts(f, c, keys, f"{a}.expert_feed_forward_length", shared=True)}
    if not out.get("n_expert"):
        raise ModelError(f"{keys['n_expert']}: expected the number of experts, found none")
    out["n_ff_shexp"] = _int(f, f"{a}.expert_shared_feed_forward_length", c["n_ff"], hi=MAX_FF)
    return out


@dataclass(frozen=True)
class Architecture:
    """What the engine knows about one ``general.architecture``."""

    name: str
    configure: Callable[[GGUFFile, Common, dict[str, str]], dict[str, object]]
    fused_gate_up: bool = False  # ffn_up may hold gate then up (2 x n_ff rows) with no ffn_gate
    ffn_norm: str = "ffn_norm.weight"  # the pre-FFN norm's tensor (gpt-oss calls it post_attention_norm)


ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in (
    Architecture("llama", _llama), Architecture("granite", _granite), Architecture("smollm3", _smollm3),
    Architecture("qwen2", _neox), Architecture("qwen3", _qwen3), Architecture("phi3", _phi3, fused_gate_up=True),
    Architecture("olmo2", _olmo2), Architecture("gemma2", _gemma2), Architecture("gemma3", _gemma3),
    Architecture("mistral3", _mistral3), Architecture("gemma4", _gemma4), Architecture("qwen3moe", _qwen3moe),
    Architecture("gpt-oss", _gpt_oss, ffn_norm="post_attention_norm.weight"),
    Architecture("qwen35", _qwen35, ffn_norm="post_attention_norm.weight"),
    Architecture("qwen35moe", _qwen35moe, ffn_norm="post_attention_norm.weight"),
)}
SUPPORTED_ARCHS = tuple(ARCHITECTURES)


def _rope_scaling(f: GGUFFile, arch: str, n_ctx_train: int) -> Common:
    """``{arch}.rope.scaling.*`` as llama.cpp reads them for every architecture: the type (none, linear, yarn or
    longrope; absent means linear), the factor (absent or 0 means none), the original context, YaRN's betas and
    log multiplier, and the attention factor; returned as ModelConfig fields (docs/engine.md, "RoPE scaling")."""
    p = f"{arch}.rope.scaling."
    kind_kv = f.metadata.get(p + "type")
    kind = "linear" if kind_kv is None else kind_kv.value
    if kind not in ("none", "linear", "yarn", "longrope"):
        raise UnsupportedModel(f"{p}type = {_show(kind)}: RoPE scaling of this kind is not supported by the engine "
                               "(running without it would give wrong results)")
    for unsupported in ("yarn_ext_factor", "yarn_attn_factor"):
        if p + unsupported in f.metadata:
            raise UnsupportedModel(f"{p}{unsupported}: not supported by the engine")
    factor_key = p + "factor" if p + "factor" in f.metadata else f"{arch}.rope.scale_linear"  # the old name
    factor = _float(f, factor_key, 0.0, zero_ok=True)
    freq_scale = 1.0 if kind == "none" or factor == 0.0 else 1.0 / factor
    ext = 1.0 if kind == "yarn" else 0.0
    if ext and factor and 1.0 + 0.1 * math.log(factor) <= 0.0:  # YaRN's magnitude term would be 0 or negative
        raise ModelError(f"{factor_key}: expected a YaRN factor above {math.exp(-10):.3g}, found {factor!r}")
    attn = 1.0
    if ext:
        scale = 1.0 / freq_scale

        def mscale(s: float, m: float) -> float:
            return 1.0 if s <= 1.0 else 0.1 * m * math.log(s) + 1.0

        log_mul = _float(f, p + "yarn_log_multiplier", 0.0, zero_ok=True)
        attn = mscale(scale, 1.0) / mscale(scale, log_mul) if log_mul else mscale(scale, 1.0)
        attn *= 1.0 / (1.0 + 0.1 * math.log(scale))  # ggml's rope multiplies this back (yarn's magnitude)
    attn *= _float(f, p + "attn_factor", 1.0, 1e3)
    return {"rope_freq_scale": freq_scale, "rope_ext_factor": ext, "rope_mscale": attn,
            "rope_orig_ctx": _int(f, p + "original_context_length", n_ctx_train),
            "rope_beta_fast": _float(f, p + "yarn_beta_fast", 32.0, 1e6),
            "rope_beta_slow": _float(f, p + "yarn_beta_slow", 1.0, 1e6)}


def read_config(f: GGUFFile) -> ModelConfig:
    """Hyperparameters from metadata, each checked for type and range and against token_embd.weight; raises
    :class:`UnsupportedModel` naming the architecture, :class:`ModelError` naming a bad key."""
    arch = f.architecture or "?"
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedModel(f"architecture {arch!r} is not supported by the engine (supported: "
                               f"{', '.join(SUPPORTED_ARCHS)})")
    keys = gguf_keys(arch, derived_head_dim=f"{arch}.attention.key_length" not in f.metadata)
    n_embd = _int(f, keys["n_embd"], hi=MAX_EMBD)
    n_layers = _int(f, keys["n_layers"], hi=MAX_LAYERS)
    n_head = _int(f, keys["n_head"], hi=MAX_HEADS)
    kv_list = _ints(f, keys["n_head_kv"], n_layers, n_head, hi=MAX_HEADS)  # llama.cpp takes one or one per layer
    ff_list = _ints(f, keys["n_ff"], n_layers, hi=MAX_FF)
    n_head_kv, n_ff = kv_list[0], max(ff_list)
    n_ctx_train = _int(f, keys["n_ctx_train"], 4096)
    if not f.has_tensor("token_embd.weight"):
        raise UnsupportedModel("missing tensor token_embd.weight")
    emb = f.tensor("token_embd.weight")
    if len(emb.ne) != 2:
        raise ModelError(f"token_embd.weight: expected 2 dimensions, found shape {list(emb.ne)}")
    if emb.ne[0] != n_embd:
        raise ModelError(f"{keys['n_embd']}: expected {emb.ne[0]} (the row length of token_embd.weight), "
                         f"found {n_embd}")
    n_vocab = emb.ne[1]
    if not 0 < n_vocab <= MAX_VOCAB:
        raise ModelError(f"token_embd.weight: expected 1..{MAX_VOCAB} rows, found {n_vocab}")
    if f"{arch}.attention.key_length" in f.metadata:
        head_dim = _int(f, f"{arch}.attention.key_length", hi=MAX_HEAD_DIM)
    elif n_embd % n_head:
        raise ModelError(f"{keys['n_head']}: expected a divisor of {keys['n_embd']} = {n_embd} (no "
                         f"{arch}.attention.key_length given), found {n_head}")
    else:
        head_dim = n_embd // n_head
    vocab_key = f"{arch}.vocab_size"
    if vocab_key in f.metadata and _int(f, vocab_key, hi=MAX_VOCAB) != n_vocab:
        raise ModelError(f"{vocab_key}: expected {n_vocab} (the rows of token_embd.weight), "
                         f"found {f.get(vocab_key)}")
    tokens = f.metadata.get("tokenizer.ggml.tokens")
    if tokens is not None and tokens.count is not None and tokens.count > n_vocab:
        raise ModelError(f"tokenizer.ggml.tokens: expected at most {n_vocab} tokens (the rows of "
                         f"token_embd.weight), found {tokens.count}")
    common = dict(
        arch=arch, n_layers=n_layers, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
        n_ff=n_ff, n_vocab=n_vocab, n_ctx_train=n_ctx_train,
        rms_eps=_float(f, keys["rms_eps"], 1e-5, 1.0),
        rope_base=_float(f, keys["rope_base"], 10000.0, 1e30),
        rope_dim=_int(f, keys["rope_dim"], head_dim, hi=MAX_HEAD_DIM),
        layer_n_head_kv=tuple(kv_list) if len(set(kv_list)) > 1 else (),
        layer_n_ff=tuple(ff_list) if len(set(ff_list)) > 1 else (),
    )
    common.update(_rope_scaling(f, arch, n_ctx_train))
    description = ARCHITECTURES[arch]
    cfg = ModelConfig(**{**common, **description.configure(f, common, keys)})  # type: ignore[arg-type]
    check_config(cfg, keys)
    value_len = _int(f, f"{arch}.attention.value_length", head_dim, hi=MAX_HEAD_DIM)
    if value_len != head_dim:
        raise ModelError(f"{arch}.attention.value_length: expected {head_dim} (= {keys['head_dim']}), "
                         f"found {value_len}")
    _check_layer_count(f, n_layers, keys["n_layers"])
    return cfg


def _check_layer_count(f: GGUFFile, n_layers: int, key: str) -> None:
    """``block_count`` must equal the number of ``blk.N`` present, numbered 0..N-1."""
    present = {int(m.group(1)) for m in (_BLK.match(t.name) for t in f.tensors) if m}
    n = max(present) + 1 if present else 0
    if n != n_layers:
        found = f"blk.0..blk.{n - 1}" if present else "no blk.N tensors"
        raise ModelError(f"{key}: expected {n} (the layers present: {found}), found {n_layers}")
    missing = sorted(set(range(n)) - present)
    if missing:
        raise ModelError(f"{key}: {n_layers} layers, but blk.{missing[0]} has no tensors")


_BLK = re.compile(r"blk\.(\d+)\.")


@dataclass(frozen=True)
class Weight:
    """A weight matrix (``rows`` × ``k``, raw bytes of ``type``) or vector, viewed in the mapped file."""

    name: str
    type: GGMLType
    data: np.ndarray
    rows: int
    k: int

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


@dataclass
class GDNWeights:
    """A gated delta-net layer's own tensors beyond attn_qkv (the layer's wq) and ssm_out (its wo)."""

    z: Weight  # attn_gate: value heads x state rows (the output gate)
    beta: Weight  # ssm_beta: one row per value head
    alpha: Weight  # ssm_alpha
    conv: np.ndarray  # ssm_conv1d: [channels][taps], flattened
    dt_bias: np.ndarray  # ssm_dt.bias (value heads)
    a: np.ndarray  # ssm_a: -exp(A_log) (value heads)
    norm: np.ndarray  # ssm_norm (state)


@dataclass
class LayerWeights:
    attn_norm: np.ndarray | None
    wq: Weight
    wk: Weight | None  # None: the layer reads an earlier layer's KV cache (ModelConfig.kv_source)
    wv: Weight | None  # wk again where V is K's projection (gemma4 without attn_v)
    wo: Weight
    ffn_norm: np.ndarray | None
    w_gate: Weight
    w_up: Weight
    w_down: Weight
    bq: np.ndarray | None = None
    bk: np.ndarray | None = None
    bv: np.ndarray | None = None
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    post_attn_norm: np.ndarray | None = None
    post_ffn_norm: np.ndarray | None = None
    ple_gate: Weight | None = None  # gemma4's per-layer embedding: ple_dim x n_embd
    ple_proj: Weight | None = None  # n_embd x ple_dim
    ple_post_norm: np.ndarray | None = None
    out_scale: np.ndarray | None = None  # gemma4: the layer's output multiplied by this one value
    router: Weight | None = None  # experts: ffn_gate_inp (n_expert x n_embd); w_gate/w_up/w_down then hold every
    # expert's matrix back to back (ffn_*_exps)
    bo: np.ndarray | None = None  # gpt-oss: attn_output.bias (n_embd)
    sinks: np.ndarray | None = None  # attn_sinks.weight (n_head)
    b_router: np.ndarray | None = None  # ffn_gate_inp.bias (n_expert)
    b_gate: np.ndarray | None = None  # ffn_gate_exps.bias, ffn_up_exps.bias (n_expert x n_ff), ffn_down_exps.bias
    b_up: np.ndarray | None = None  # (n_expert x n_embd), expert-major
    b_down: np.ndarray | None = None
    gdn: GDNWeights | None = None  # qwen35's gated delta-net layers (wq is then attn_qkv, wo ssm_out; no wk, wv)
    sh_gate: Weight | None = None  # qwen35moe's shared expert: ffn_{gate,up}_shexp (n_ff_shexp x n_embd),
    sh_up: Weight | None = None  # ffn_down_shexp (n_embd x n_ff_shexp) and its gate ffn_gate_inp_shexp (n_embd)
    sh_down: Weight | None = None
    sh_gate_inp: np.ndarray | None = None

    def matrices(self) -> list[Weight]:
        """The distinct matrices of the layer (a V that is K's projection counted once)."""
        out: list[Weight] = []
        g = self.gdn
        for w in (self.wq, self.wk, self.wv, self.wo, self.w_gate, self.w_up, self.w_down, self.ple_gate,
                  self.ple_proj, self.router, *((g.z, g.beta, g.alpha) if g else ()), self.sh_gate, self.sh_up,
                  self.sh_down):
            if w is not None and all(w is not x for x in out):
                out.append(w)
        return out


@dataclass
class ModelWeights:
    config: ModelConfig
    tok_embd: Weight
    output: Weight
    output_norm: np.ndarray
    layers: list[LayerWeights]
    tied: bool
    rope_freqs: np.ndarray | None = None  # Llama 3: rope_dim/2 divisors of the RoPE frequencies
    rope_long: np.ndarray | None = None  # Phi-3.5/4 LongRoPE: divisors for contexts beyond rope_orig_ctx
    rope_short: np.ndarray | None = None  # ... and for contexts up to it
    ple_tok_embd: Weight | None = None  # gemma4: n_vocab rows of n_layers x ple_dim
    ple_model_proj: Weight | None = None  # n_layers * ple_dim x n_embd
    ple_proj_norm: np.ndarray | None = None  # ple_dim

    def rope_factors(self, n_ctx: int) -> np.ndarray | None:
        """The RoPE frequency divisors a session of ``n_ctx`` positions uses (llama.cpp's choice), or None."""
        if self.rope_freqs is not None or self.rope_long is None:
            return self.rope_freqs
        orig = self.config.rope_orig_ctx or self.config.n_ctx_train
        return self.rope_long if n_ctx > orig else self.rope_short

    @property
    def nbytes(self) -> int:
        n = self.tok_embd.nbytes + (0 if self.tied else self.output.nbytes)
        n += sum(w.nbytes for w in (self.ple_tok_embd, self.ple_model_proj) if w is not None)
        for lw in self.layers:
            n += sum(w.nbytes for w in lw.matrices())
        return n


def _weight(f: GGUFFile, name: str, ndim: int = 2) -> Weight:
    if not f.has_tensor(name):
        raise UnsupportedModel(f"missing tensor {name}")
    t: TensorInfo = f.tensor(name)
    if t.type is None:
        raise UnsupportedModel(f"tensor {name} has {t.type_name}")
    if len(t.ne) != ndim and not (ndim == 1 and len(t.ne) > 1 and t.n_rows == 1):
        raise ModelError(f"{name}: expected {ndim} dimension(s), found shape {list(t.ne)}")
    return Weight(name, t.type, f.tensor_bytes(t), t.n_rows, t.row_len)


def _vector(f: GGUFFile, name: str, optional: bool = False, ndim: int = 1) -> np.ndarray | None:
    """A float32 copy of a vector (``ndim`` 2: of a matrix's values in order: the experts' biases)."""
    if optional and not f.has_tensor(name):
        return None
    w = _weight(f, name, ndim=ndim)
    from ..native.kernels import copy_mapped  # a guarded copy: a truncated file raises instead of SIGBUS
    from ..quant import dequantize

    try:
        v = dequantize(copy_mapped(w.data, name).reshape(1, -1), w.type).reshape(-1)
    except (ValueError, NotImplementedError, KeyError) as exc:
        raise ModelError(f"{name}: a {w.type.name} vector the engine cannot read ({exc})") from None
    return np.ascontiguousarray(v, dtype=np.float32)


def _rows(w: Weight, parts: list[tuple[str, int]], rows_from: str) -> list[Weight]:
    """A fused matrix split into consecutive row blocks (zero-copy views): ``parts`` = (suffix, rows) each."""
    want = sum(n for _, n in parts)
    if w.rows != want:
        raise ModelError(f"{rows_from}: expected {w.name} to have {want} rows "
                         f"({' + '.join(f'{n} {s}' for s, n in parts)}), found {w.rows}")
    rb = w.type.row_bytes(w.k)
    out, r = [], 0
    for suffix, n in parts:
        out.append(Weight(f"{w.name}[{suffix}]", w.type, w.data[r * rb : (r + n) * rb], n, w.k))
        r += n
    return out


def _experts_weight(f: GGUFFile, name: str, shape: tuple[int, int, int], keys: dict[str, str]) -> Weight:
    """A 3-D expert tensor of ggml shape ``shape`` (row length, rows per expert, experts), viewed as one matrix of
    every expert's rows back to back."""
    if not f.has_tensor(name):
        raise UnsupportedModel(f"missing tensor {name}")
    t: TensorInfo = f.tensor(name)
    if t.type is None:
        raise UnsupportedModel(f"tensor {name} has {t.type_name}")
    if tuple(t.ne) != shape:
        raise ModelError(f"{name}: expected shape {list(shape)} ({keys['n_embd']}, {keys['n_ff']}, "
                         f"{keys['n_expert']}), found {list(t.ne)}")
    return Weight(name, t.type, f.tensor_bytes(t), t.n_rows, t.row_len)


def _attn_and_ffn(f: GGUFFile, cfg: ModelConfig, i: int) -> tuple[Weight | None, ...]:
    """q, k, v, gate and up of layer ``i``: separate tensors, or phi3's fused attn_qkv and gate+up; gemma4's
    layers that read an earlier layer's cache have no k and v, and a missing attn_v means V is K's projection."""
    b = f"blk.{i}."
    keys = gguf_keys(cfg.arch)
    heads = f"{keys['n_head']}, {keys['n_head_kv']}, {keys['head_dim']}"
    hd, kvh, n_ff = cfg.head_dim_at(i), cfg.n_head_kv_at(i), cfg.n_ff_at(i)
    wk: Weight | None
    wv: Weight | None
    if f.has_tensor(b + "attn_qkv.weight"):
        q_rows, kv_rows = cfg.n_head * hd, kvh * hd
        wq, wk, wv = _rows(_weight(f, b + "attn_qkv.weight"), [("q", q_rows), ("k", kv_rows), ("v", kv_rows)],
                           heads)
    elif cfg.kv_source(i) != i:
        wq, wk, wv = _weight(f, b + "attn_q.weight"), None, None
    else:
        wq, wk = _weight(f, b + "attn_q.weight"), _weight(f, b + "attn_k.weight")
        wv = wk if cfg.arch == "gemma4" and not f.has_tensor(b + "attn_v.weight") else _weight(f, b + "attn_v.weight")
    if cfg.n_expert:
        ne, E = cfg.n_expert, cfg.n_embd
        gate = _experts_weight(f, b + "ffn_gate_exps.weight", (E, n_ff, ne), keys)
        up = _experts_weight(f, b + "ffn_up_exps.weight", (E, n_ff, ne), keys)
    elif ARCHITECTURES[cfg.arch].fused_gate_up and not f.has_tensor(b + "ffn_gate.weight"):
        gate, up = _rows(_weight(f, b + "ffn_up.weight"), [("gate", n_ff), ("up", n_ff)], keys["n_ff"])
    else:
        gate, up = _weight(f, b + "ffn_gate.weight"), _weight(f, b + "ffn_up.weight")
    return wq, wk, wv, gate, up


#: Tensors a file may hold that llama.cpp ignores too (precomputed rotary tables of old conversions).
_IGNORABLE = re.compile(r"^blk\.\d+\.attn_rot_embd$")
#: LayerWeights vector field -> tensor name suffix.
_VECTOR_TENSORS = {"attn_norm": "attn_norm.weight", "ffn_norm": "ffn_norm.weight", "bq": "attn_q.bias",
                   "bk": "attn_k.bias", "bv": "attn_v.bias", "q_norm": "attn_q_norm.weight",
                   "k_norm": "attn_k_norm.weight", "post_attn_norm": "post_attention_norm.weight",
                   "post_ffn_norm": "post_ffw_norm.weight", "ple_post_norm": "post_norm.weight",
                   "out_scale": "layer_output_scale.weight", "bo": "attn_output.bias", "sinks": "attn_sinks.weight",
                   "b_router": "ffn_gate_inp.bias", "b_gate": "ffn_gate_exps.bias", "b_up": "ffn_up_exps.bias",
                   "b_down": "ffn_down_exps.bias", "sh_gate_inp": "ffn_gate_inp_shexp.weight"}


def _check_all_bound(f: GGUFFile, cfg: ModelConfig, used: set[str]) -> None:
    """Refuse a file with tensors the engine would silently ignore (their absence would change the results)."""
    extra = sorted(t.name for t in f.tensors if t.name not in used and not _IGNORABLE.match(t.name))
    if extra:
        more = f" and {len(extra) - 3} more" if len(extra) > 3 else ""
        raise UnsupportedModel(f"{cfg.arch}: the engine does not use the tensor(s) {', '.join(extra[:3])}{more}; "
                               "running without them would give wrong results")


def bind_weights(f: GGUFFile, config: ModelConfig | None = None) -> ModelWeights:
    """Bind every tensor the architecture uses; matrices stay quantized views of the file (zero copy). Every
    shape, length and type is checked against the config (:func:`check_weights`); a tensor left over is an
    error (:class:`UnsupportedModel`)."""
    cfg = config or read_config(f)
    layers = []
    ple = cfg.ple_dim > 0
    ffn_norm = ARCHITECTURES[cfg.arch].ffn_norm if cfg.arch in ARCHITECTURES else "ffn_norm.weight"
    oai = cfg.arch == "gpt-oss"
    for i in range(cfg.n_layers):
        b = f"blk.{i}."
        if cfg.is_recurrent(i):
            layers.append(_recurrent_layer(f, cfg, i, ffn_norm))
            continue
        wq, wk, wv, gate, up = _attn_and_ffn(f, cfg, i)
        shared = wk is None
        layers.append(LayerWeights(
            attn_norm=_vector(f, b + "attn_norm.weight", not cfg.pre_norms),
            wq=wq, wk=wk, wv=wv, wo=_weight(f, b + "attn_output.weight"),
            ffn_norm=_vector(f, b + ffn_norm, not cfg.pre_norms),
            w_gate=gate, w_up=up,
            w_down=_experts_weight(f, b + "ffn_down_exps.weight", (cfg.n_ff_at(i), cfg.n_embd, cfg.n_expert),
                                   gguf_keys(cfg.arch)) if cfg.n_expert else _weight(f, b + "ffn_down.weight"),
            router=_weight(f, b + "ffn_gate_inp.weight") if cfg.n_expert else None,
            bq=_vector(f, b + "attn_q.bias", True), bk=_vector(f, b + "attn_k.bias", True),
            bv=_vector(f, b + "attn_v.bias", True),
            # q/k norms only where the architecture has them: elsewhere a file's norms are left unbound, so
            # _check_all_bound refuses the file (llama.cpp refuses the tensor count) instead of applying them
            q_norm=_vector(f, b + "attn_q_norm.weight") if cfg.qk_norm else None,
            k_norm=None if shared or not cfg.qk_norm else _vector(f, b + "attn_k_norm.weight"),
            post_attn_norm=None if ffn_norm == "post_attention_norm.weight" else  # (gpt-oss: the FFN's norm)
            _vector(f, b + "post_attention_norm.weight", not cfg.post_norms),
            post_ffn_norm=_vector(f, b + "post_ffw_norm.weight", not cfg.post_norms),
            ple_gate=_weight(f, b + "inp_gate.weight") if ple else None,
            ple_proj=_weight(f, b + "proj.weight") if ple else None,
            ple_post_norm=_vector(f, b + "post_norm.weight") if ple else None,
            out_scale=_vector(f, b + "layer_output_scale.weight", True) if cfg.arch == "gemma4" else None,
            bo=_vector(f, b + "attn_output.bias", True) if oai else None,
            sinks=_vector(f, b + "attn_sinks.weight") if cfg.attn_sinks else None,
            b_router=_vector(f, b + "ffn_gate_inp.bias", True) if oai else None,
            b_gate=_vector(f, b + "ffn_gate_exps.bias", True, 2) if oai else None,
            b_up=_vector(f, b + "ffn_up_exps.bias", True, 2) if oai else None,
            b_down=_vector(f, b + "ffn_down_exps.bias", True, 2) if oai else None,
        ))
    if cfg.n_ff_shexp:
        for i, lw in enumerate(layers):
            b = f"blk.{i}."
            lw.sh_gate, lw.sh_up = _weight(f, b + "ffn_gate_shexp.weight"), _weight(f, b + "ffn_up_shexp.weight")
            lw.sh_down = _weight(f, b + "ffn_down_shexp.weight")
            lw.sh_gate_inp = _vector(f, b + "ffn_gate_inp_shexp.weight")
    emb = _weight(f, "token_embd.weight")
    tied = not f.has_tensor("output.weight")
    out = emb if tied else _weight(f, "output.weight")
    freqs = _vector(f, "rope_freqs.weight", True) if cfg.arch in ("llama", "mistral3", "gemma4") else None
    long = _vector(f, "rope_factors_long.weight", True) if cfg.arch == "phi3" else None
    short = _vector(f, "rope_factors_short.weight", True) if cfg.arch == "phi3" else None
    w = ModelWeights(cfg, emb, out, _vector(f, "output_norm.weight"), layers, tied,  # type: ignore[arg-type]
                     rope_freqs=freqs, rope_long=long, rope_short=short,
                     ple_tok_embd=_weight(f, "per_layer_token_embd.weight") if ple else None,
                     ple_model_proj=_weight(f, "per_layer_model_proj.weight") if ple else None,
                     ple_proj_norm=_vector(f, "per_layer_proj_norm.weight") if ple else None)
    check_weights(w, gguf_keys(cfg.arch, derived_head_dim=f"{cfg.arch}.attention.key_length" not in f.metadata))
    used = {"token_embd.weight", "output.weight", "output_norm.weight"}
    used |= {n for n, v in (("rope_freqs.weight", freqs), ("rope_factors_long.weight", long),
                            ("rope_factors_short.weight", short)) if v is not None}
    if ple:
        used |= {"per_layer_token_embd.weight", "per_layer_model_proj.weight", "per_layer_proj_norm.weight"}
    for i, lw in enumerate(layers):
        for x in lw.matrices():
            used.add(x.name.split("[", 1)[0])
        used |= {f"blk.{i}.{ffn_norm if fld == 'ffn_norm' else name}" for fld, name in _VECTOR_TENSORS.items()
                 if getattr(lw, fld) is not None}
        if lw.gdn is not None:
            used |= {f"blk.{i}.{n}" for n in ("ssm_conv1d.weight", "ssm_dt.bias", "ssm_a", "ssm_norm.weight")}
        elif lw.wk is None:  # llama.cpp loads and ignores a shared layer's own k/v (they are optional there)
            used |= {f"blk.{i}.{n}.weight" for n in ("attn_k", "attn_v", "attn_k_norm")}
    _check_all_bound(f, cfg, used)
    return w


def _recurrent_layer(f: GGUFFile, cfg: ModelConfig, i: int, ffn_norm: str) -> LayerWeights:
    """A gated delta-net layer (qwen35): its mixer's tensors, then the FFN as the attention layers have it."""
    b = f"blk.{i}."
    conv_name = b + "ssm_conv1d.weight"
    if f.has_tensor(conv_name) and tuple(f.tensor(conv_name).ne) != (cfg.ssm_conv, cfg.ssm_channels):
        raise ModelError(f"{cfg.arch}.ssm.conv_kernel, ssm.state_size, ssm.group_count, ssm.time_step_rank: "
                         f"expected {conv_name} of shape {[cfg.ssm_conv, cfg.ssm_channels]}, found "
                         f"{list(f.tensor(conv_name).ne)}")
    gdn = GDNWeights(z=_weight(f, b + "attn_gate.weight"), beta=_weight(f, b + "ssm_beta.weight"),
                     alpha=_weight(f, b + "ssm_alpha.weight"), conv=_vector(f, conv_name, ndim=2),  # type: ignore[arg-type]
                     dt_bias=_vector(f, b + "ssm_dt.bias"), a=_vector(f, b + "ssm_a"),  # type: ignore[arg-type]
                     norm=_vector(f, b + "ssm_norm.weight"))  # type: ignore[arg-type]
    if cfg.n_expert:
        keys, E, F, NE = gguf_keys(cfg.arch), cfg.n_embd, cfg.n_ff, cfg.n_expert
        ffn = dict(w_gate=_experts_weight(f, b + "ffn_gate_exps.weight", (E, F, NE), keys),
                   w_up=_experts_weight(f, b + "ffn_up_exps.weight", (E, F, NE), keys),
                   w_down=_experts_weight(f, b + "ffn_down_exps.weight", (F, E, NE), keys),
                   router=_weight(f, b + "ffn_gate_inp.weight"))
    else:
        ffn = dict(w_gate=_weight(f, b + "ffn_gate.weight"), w_up=_weight(f, b + "ffn_up.weight"),
                   w_down=_weight(f, b + "ffn_down.weight"))
    return LayerWeights(attn_norm=_vector(f, b + "attn_norm.weight"), wq=_weight(f, b + "attn_qkv.weight"), wk=None,
                        wv=None, wo=_weight(f, b + "ssm_out.weight"), ffn_norm=_vector(f, b + ffn_norm), gdn=gdn,
                        **ffn)  # type: ignore[arg-type]


def _check_recurrent_layer(c: ModelConfig, i: int, lw: LayerWeights, k: dict[str, str]) -> None:
    """A gated delta-net layer's matrices and vectors against the delta-net sizes (the FFN is checked as usual)."""
    b, a, E = f"blk.{i}.", c.arch, c.n_embd
    g = lw.gdn
    if g is None or lw.wk is not None or lw.wv is not None:
        raise ModelError(f"{b}: expected a gated delta-net layer ({a}.full_attention_interval), found attention")
    S, Hv, C = c.ssm_state, c.ssm_v_heads, c.ssm_channels
    sizes = f"{a}.ssm.state_size = {S}, ssm.group_count = {c.ssm_k_heads}, ssm.time_step_rank = {Hv}"
    _check_matrix(lw.wq, C, E, sizes, k["n_embd"])
    _check_matrix(lw.wo, E, Hv * S, k["n_embd"], sizes)
    _check_matrix(g.z, Hv * S, E, sizes, k["n_embd"])
    _check_matrix(g.beta, Hv, E, f"{a}.ssm.time_step_rank", k["n_embd"])
    _check_matrix(g.alpha, Hv, E, f"{a}.ssm.time_step_rank", k["n_embd"])
    _check_vector(b + "ssm_conv1d.weight", g.conv, C * c.ssm_conv, f"{a}.ssm.conv_kernel x channels ({sizes})")
    _check_vector(b + "ssm_dt.bias", g.dt_bias, Hv, f"{a}.ssm.time_step_rank")
    _check_vector(b + "ssm_a", g.a, Hv, f"{a}.ssm.time_step_rank")
    _check_vector(b + "ssm_norm.weight", g.norm, S, f"{a}.ssm.state_size")
    for name, v in (("ssm_conv1d.weight", g.conv), ("ssm_dt.bias", g.dt_bias), ("ssm_a", g.a),
                    ("ssm_norm.weight", g.norm)):
        if not np.isfinite(v).all():
            raise ModelError(f"{b}{name}: expected finite values")
    extra = [n for n, v in (("attn_q/k/v.bias", lw.bq), ("attn_q_norm", lw.q_norm), ("attn_k_norm", lw.k_norm),
                            ("attn_output.bias", lw.bo), ("attn_sinks", lw.sinks))
             if v is not None]
    if extra:
        raise ModelError(f"{b}{extra[0]}: not part of a gated delta-net layer")


def _native_kernel(t: GGMLType) -> bool:
    from ..native import lib

    return bool(lib.qs_can_dequantize(t.id))


def _check_matrix(w: Weight, rows: int, k: int, rows_from: str, k_from: str) -> None:
    if not _native_kernel(w.type):
        raise UnsupportedModel(f"{w.name} is {w.type.name}: the engine has no kernel for it")
    if (w.rows, w.k) != (rows, k):
        which = rows_from if w.rows != rows else k_from
        raise ModelError(f"{which}: expected {w.name} to be {rows} x {k} (rows x row length), found "
                         f"{w.rows} x {w.k}")
    if w.data.dtype != np.uint8 or w.data.ndim != 1 or not w.data.flags.c_contiguous:
        raise ModelError(f"{w.name}: expected contiguous raw bytes, found a {w.data.dtype} array of {w.data.shape}")
    if w.k % w.type.block_elems or w.data.size != w.rows * w.type.row_bytes(w.k):
        raise ModelError(f"{w.name}: expected {w.rows} rows of {w.k} {w.type.name} values in whole blocks of "
                         f"{w.type.block_elems}, found {w.data.size} bytes")


def _check_vector(name: str, v: np.ndarray | None, n: int, n_from: str, required: bool = True) -> None:
    if v is None:
        if required:
            raise ModelError(f"{name}: expected a vector of {n} values, found none")
        return
    if v.dtype != np.float32 or v.ndim != 1 or not v.flags.c_contiguous:
        raise ModelError(f"{name}: expected a contiguous float32 vector, found a {v.dtype} array of {v.shape}")
    if v.size != n:
        raise ModelError(f"{n_from}: expected {name} to hold {n} values, found {v.size}")


def check_weights(w: ModelWeights, keys: dict[str, str] | None = None) -> None:
    """Every matrix's shape and type and every vector's length against the (checked) config, so that nothing the
    native block is given can be indexed out of bounds; :class:`ModelError` names the key that disagrees."""
    c = w.config
    k = keys or gguf_keys(c.arch)
    check_config(c, k)
    E, H = c.n_embd, c.n_head
    if len(w.layers) != c.n_layers:
        raise ModelError(f"{k['n_layers']}: expected {len(w.layers)} (the layers bound), found {c.n_layers}")
    _check_matrix(w.tok_embd, c.n_vocab, E, k["n_vocab"], k["n_embd"])
    _check_matrix(w.output, c.n_vocab, E, k["n_vocab"], k["n_embd"])
    _check_vector("output_norm.weight", w.output_norm, E, k["n_embd"])
    if (w.rope_long is None) != (w.rope_short is None):
        raise ModelError("rope_factors_long/rope_factors_short.weight: expected both or neither, found one")
    # rope_freqs: rope_dim/2 divisors (gemma4: of its global layers, whose rotated size is rope_dim too)
    for name, v in (("rope_freqs", w.rope_freqs), ("rope_factors_long", w.rope_long),
                    ("rope_factors_short", w.rope_short)):
        _check_vector(f"{name}.weight", v, c.rope_dim // 2, k["rope_dim"] + " / 2", False)
        if v is not None and not (np.isfinite(v).all() and (v > 0).all()):
            raise ModelError(f"{name}.weight: expected finite positive frequency factors")
    P = c.ple_dim
    if P:
        _check_matrix(w.ple_tok_embd, c.n_vocab, c.n_layers * P, k["n_vocab"],  # type: ignore[arg-type]
                      f"{k['n_layers']} x {k['ple_dim']}")
        _check_matrix(w.ple_model_proj, c.n_layers * P, E, f"{k['n_layers']} x {k['ple_dim']}",  # type: ignore[arg-type]
                      k["n_embd"])
        _check_vector("per_layer_proj_norm.weight", w.ple_proj_norm, P, k["ple_dim"])
    elif w.ple_tok_embd is not None or w.ple_model_proj is not None:
        raise ModelError(f"{k['ple_dim']}: 0, but the file has per-layer token embeddings")
    for i, lw in enumerate(w.layers):
        b = f"blk.{i}."
        KV, hd, F = c.n_head_kv_at(i), c.head_dim_at(i), c.n_ff_at(i)
        heads = kv_heads = f"{k['n_head']} = {H}, {k['n_head_kv']} = {KV}, head dimension {k['head_dim']} = {hd}"
        if c.is_recurrent(i):
            _check_recurrent_layer(c, i, lw, k)
        elif lw.gdn is not None:
            raise ModelError(f"{b}: delta-net tensors bound to an attention layer")
        else:
            _check_matrix(lw.wq, (2 if c.q_gate else 1) * H * hd, E, heads + (" (query and gate)" if c.q_gate else ""),
                          k["n_embd"])
        if c.is_recurrent(i):
            pass
        elif (lw.wk is None) != (c.kv_source(i) != i) or (lw.wv is None) != (lw.wk is None):
            raise ModelError(f"{b}attn_k/attn_v.weight: expected {'none' if c.kv_source(i) != i else 'both'} "
                             f"({k['kv_from_start']})")
        if lw.wk is not None and lw.wv is not None:
            _check_matrix(lw.wk, KV * hd, E, kv_heads, k["n_embd"])
            _check_matrix(lw.wv, KV * hd, E, kv_heads, k["n_embd"])
        if not c.is_recurrent(i):
            _check_matrix(lw.wo, E, H * hd, k["n_embd"], heads)
        NE = c.n_expert or 1  # expert matrices hold n_expert matrices' rows back to back
        per = f" x {k['n_expert']} = {c.n_expert}" if c.n_expert else ""
        _check_matrix(lw.w_gate, NE * F, E, k["n_ff"] + per, k["n_embd"])
        _check_matrix(lw.w_up, NE * F, E, k["n_ff"] + per, k["n_embd"])
        _check_matrix(lw.w_down, NE * E, F, k["n_embd"] + per, k["n_ff"])
        if c.n_expert:
            if lw.router is None:
                raise ModelError(f"{b}ffn_gate_inp.weight: expected the expert router ({k['n_expert']}), found none")
            _check_matrix(lw.router, c.n_expert, E, k["n_expert"], k["n_embd"])
        elif lw.router is not None:
            raise ModelError(f"{k['n_expert']}: 0, but {b}ffn_gate_inp.weight is bound")
        if P:
            _check_matrix(lw.ple_gate, P, E, k["ple_dim"], k["n_embd"])  # type: ignore[arg-type]
            _check_matrix(lw.ple_proj, E, P, k["n_embd"], k["ple_dim"])  # type: ignore[arg-type]
            _check_vector(b + "post_norm.weight", lw.ple_post_norm, E, k["n_embd"])
        elif lw.ple_gate is not None or lw.ple_proj is not None:
            raise ModelError(f"{k['ple_dim']}: 0, but {b}inp_gate/proj.weight are bound")
        _check_vector(b + "layer_output_scale.weight", lw.out_scale, 1, "one value", False)
        if lw.out_scale is not None and not np.isfinite(lw.out_scale).all():
            raise ModelError(f"{b}layer_output_scale.weight: expected a finite value")
        _check_vector(b + "attn_norm.weight", lw.attn_norm, E, k["n_embd"], c.pre_norms)
        _check_vector(b + "ffn_norm.weight", lw.ffn_norm, E, k["n_embd"], c.pre_norms)
        if (lw.attn_norm is None) != (lw.ffn_norm is None):
            raise ModelError(f"{b}attn_norm/ffn_norm.weight: expected both or neither, found one")
        biases = (lw.bq, lw.bk, lw.bv)
        if any(x is not None for x in biases) and any(x is None for x in biases):
            raise ModelError(f"{b}attn_q/k/v.bias: expected all three biases or none, found "
                             f"{sum(x is not None for x in biases)}")
        _check_vector(b + "attn_q.bias", lw.bq, H * hd, heads, False)
        _check_vector(b + "attn_k.bias", lw.bk, KV * hd, kv_heads, False)
        _check_vector(b + "attn_v.bias", lw.bv, KV * hd, kv_heads, False)
        if (lw.q_norm is None) != (lw.k_norm is None) and lw.wk is not None:
            raise ModelError(f"{b}attn_q_norm/attn_k_norm.weight: expected both or neither, found one")
        qn, kn = (H * hd, KV * hd) if c.qk_norm_full else (hd, hd)
        attn = not c.is_recurrent(i)
        _check_vector(b + "attn_q_norm.weight", lw.q_norm, qn, heads if c.qk_norm_full else k["head_dim"],
                      c.qk_norm and attn)
        _check_vector(b + "attn_k_norm.weight", lw.k_norm, kn, kv_heads if c.qk_norm_full else k["head_dim"],
                      c.qk_norm and lw.wk is not None and attn)
        _check_vector(b + "post_attention_norm.weight", lw.post_attn_norm, E, k["n_embd"], c.post_norms)
        _check_vector(b + "attn_output.bias", lw.bo, E, k["n_embd"], False)
        _check_vector(b + "attn_sinks.weight", lw.sinks, H, k["n_head"], c.attn_sinks and attn)
        if lw.sinks is not None and not np.isfinite(lw.sinks).all():
            raise ModelError(f"{b}attn_sinks.weight: expected finite values")
        nx = k.get("n_expert", "expert_count")  # (a bump file's keys have none)
        exp = f" x {nx} = {c.n_expert}"
        for name, vec, n, what in (("ffn_gate_inp.bias", lw.b_router, c.n_expert, nx),
                                   ("ffn_gate_exps.bias", lw.b_gate, c.n_expert * F, k["n_ff"] + exp),
                                   ("ffn_up_exps.bias", lw.b_up, c.n_expert * F, k["n_ff"] + exp),
                                   ("ffn_down_exps.bias", lw.b_down, c.n_expert * E, k["n_embd"] + exp)):
            if vec is not None and not c.n_expert:
                raise ModelError(f"{nx}: 0, but {b}{name} is bound")
            _check_vector(b + name, vec, n, what, False)
        _check_vector(b + "post_ffw_norm.weight", lw.post_ffn_norm, E, k["n_embd"], c.post_norms)
        shared = (lw.sh_gate, lw.sh_up, lw.sh_down, lw.sh_gate_inp)
        if c.n_ff_shexp:
            FS, what = c.n_ff_shexp, f"{c.arch}.expert_shared_feed_forward_length"
            if any(x is None for x in shared):
                raise ModelError(f"{b}ffn_*_shexp: expected the shared expert ({what}), found none")
            _check_matrix(lw.sh_gate, FS, E, what, k["n_embd"])  # type: ignore[arg-type]
            _check_matrix(lw.sh_up, FS, E, what, k["n_embd"])  # type: ignore[arg-type]
            _check_matrix(lw.sh_down, E, FS, k["n_embd"], what)  # type: ignore[arg-type]
            _check_vector(b + "ffn_gate_inp_shexp.weight", lw.sh_gate_inp, E, k["n_embd"])
        elif any(x is not None for x in shared):
            raise ModelError(f"{b}ffn_*_shexp: a shared expert without {c.arch}.expert_shared_feed_forward_length")
