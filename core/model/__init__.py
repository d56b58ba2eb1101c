"""Model architectures: hyperparameters from GGUF metadata and weights bound zero-copy to the mapped file.

Supported: llama (SmolLM2), qwen2 (q/k/v biases) and gemma3 (scaled embeddings, GELU-tanh gated FFN, per-head
q/k RMSNorm, post-attention/post-FFN norms, sliding-window layers with their own RoPE base).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..gguf import GGUFFile, TensorInfo
from ..quant.types import GGMLType

SUPPORTED_ARCHS = ("llama", "qwen2", "gemma3")


class UnsupportedModel(ValueError):
    """The file's architecture (or one of its tensors) is not something the engine can run."""


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

    def is_sliding(self, layer: int) -> bool:
        """Does ``layer`` use the sliding window (and the local RoPE base)?"""
        return self.swa_pattern > 0 and self.sliding_window > 0 and (layer + 1) % self.swa_pattern != 0

    def layer_rope_base(self, layer: int) -> float:
        return self.rope_base_swa if self.is_sliding(layer) else self.rope_base

    def layer_window(self, layer: int) -> int:
        return self.sliding_window if self.is_sliding(layer) else 0


def _get(f: GGUFFile, key: str, default: object = None) -> object:
    v = f.get(key, default)
    return v.item() if isinstance(v, np.generic) else v


def read_config(f: GGUFFile) -> ModelConfig:
    """Hyperparameters from metadata; raises :class:`UnsupportedModel` naming the architecture."""
    arch = f.architecture or "?"
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedModel(f"architecture {arch!r} is not supported by the engine (supported: "
                               f"{', '.join(SUPPORTED_ARCHS)})")
    p = arch + "."
    n_embd = int(_get(f, p + "embedding_length"))  # type: ignore[arg-type]
    n_head = int(_get(f, p + "attention.head_count"))  # type: ignore[arg-type]
    n_head_kv = int(_get(f, p + "attention.head_count_kv", n_head))  # type: ignore[arg-type]
    head_dim = int(_get(f, p + "attention.key_length", n_embd // n_head))  # type: ignore[arg-type]
    emb = f.tensor("token_embd.weight")
    if not 0 < head_dim <= 1024 or head_dim % 2:
        raise UnsupportedModel(f"head dimension {head_dim} is not supported (even, at most 1024)")
    common = dict(
        arch=arch,
        n_layers=int(_get(f, p + "block_count")),  # type: ignore[arg-type]
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        n_ff=int(_get(f, p + "feed_forward_length")),  # type: ignore[arg-type]
        n_vocab=emb.ne[1],
        n_ctx_train=int(_get(f, p + "context_length", 4096)),  # type: ignore[arg-type]
        rms_eps=float(_get(f, p + "attention.layer_norm_rms_epsilon", 1e-5)),  # type: ignore[arg-type]
        rope_base=float(_get(f, p + "rope.freq_base", 10000.0)),  # type: ignore[arg-type]
        rope_dim=int(_get(f, p + "rope.dimension_count", head_dim)),  # type: ignore[arg-type]
    )
    if arch == "llama":
        return ModelConfig(**common, rope_neox=False)  # type: ignore[arg-type]
    if arch == "qwen2":
        return ModelConfig(**common, rope_neox=True)  # type: ignore[arg-type]
    # gemma3
    return ModelConfig(
        **common,  # type: ignore[arg-type]
        rope_neox=True,
        rope_base_swa=10000.0,
        sliding_window=int(_get(f, p + "attention.sliding_window", 0)),  # type: ignore[arg-type]
        swa_pattern=6,
        embed_scale=math.sqrt(n_embd),
        gelu=True,
        qk_norm=True,
        post_norms=True,
        attn_scale=1.0 / math.sqrt(head_dim),
    )


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
class LayerWeights:
    attn_norm: np.ndarray
    wq: Weight
    wk: Weight
    wv: Weight
    wo: Weight
    ffn_norm: np.ndarray
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


@dataclass
class ModelWeights:
    config: ModelConfig
    tok_embd: Weight
    output: Weight
    output_norm: np.ndarray
    layers: list[LayerWeights]
    tied: bool

    @property
    def nbytes(self) -> int:
        n = self.tok_embd.nbytes + (0 if self.tied else self.output.nbytes)
        for lw in self.layers:
            n += sum(w.nbytes for w in (lw.wq, lw.wk, lw.wv, lw.wo, lw.w_gate, lw.w_up, lw.w_down))
        return n


def _weight(f: GGUFFile, name: str) -> Weight:
    if not f.has_tensor(name):
        raise UnsupportedModel(f"missing tensor {name}")
    t: TensorInfo = f.tensor(name)
    if t.type is None:
        raise UnsupportedModel(f"tensor {name} has {t.type_name}")
    return Weight(name, t.type, f.tensor_bytes(t), t.n_rows, t.row_len)


def _vector(f: GGUFFile, name: str, optional: bool = False) -> np.ndarray | None:
    if optional and not f.has_tensor(name):
        return None
    w = _weight(f, name)
    from ..native.kernels import copy_mapped  # a guarded copy: a truncated file raises instead of SIGBUS
    from ..quant import dequantize

    return np.ascontiguousarray(dequantize(copy_mapped(w.data, name).reshape(1, -1), w.type).reshape(-1),
                                dtype=np.float32)


def bind_weights(f: GGUFFile, config: ModelConfig | None = None) -> ModelWeights:
    """Bind every tensor the architecture uses; matrices stay quantized views of the file (zero copy)."""
    cfg = config or read_config(f)
    layers = []
    for i in range(cfg.n_layers):
        b = f"blk.{i}."
        layers.append(LayerWeights(
            attn_norm=_vector(f, b + "attn_norm.weight"),  # type: ignore[arg-type]
            wq=_weight(f, b + "attn_q.weight"), wk=_weight(f, b + "attn_k.weight"),
            wv=_weight(f, b + "attn_v.weight"), wo=_weight(f, b + "attn_output.weight"),
            ffn_norm=_vector(f, b + "ffn_norm.weight"),  # type: ignore[arg-type]
            w_gate=_weight(f, b + "ffn_gate.weight"), w_up=_weight(f, b + "ffn_up.weight"),
            w_down=_weight(f, b + "ffn_down.weight"),
            bq=_vector(f, b + "attn_q.bias", True), bk=_vector(f, b + "attn_k.bias", True),
            bv=_vector(f, b + "attn_v.bias", True),
            q_norm=_vector(f, b + "attn_q_norm.weight", not cfg.qk_norm),
            k_norm=_vector(f, b + "attn_k_norm.weight", not cfg.qk_norm),
            post_attn_norm=_vector(f, b + "post_attention_norm.weight", not cfg.post_norms),
            post_ffn_norm=_vector(f, b + "post_ffw_norm.weight", not cfg.post_norms),
        ))
    emb = _weight(f, "token_embd.weight")
    tied = not f.has_tensor("output.weight")
    out = emb if tied else _weight(f, "output.weight")
    return ModelWeights(cfg, emb, out, _vector(f, "output_norm.weight"), layers, tied)  # type: ignore[arg-type]
