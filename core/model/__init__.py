"""Model architectures: hyperparameters from GGUF metadata and weights bound zero-copy to the mapped file.

The package shows the structure: :mod:`.config` (``ModelConfig``, limits, errors, the GGUF key of each field),
:mod:`.metadata` (typed metadata reads), :mod:`.arch` (one description per architecture: its own keys and
flags; the only place an architecture's name is tested), :mod:`.read` (``read_config``), :mod:`.checks`
(``check_config``, ``check_weights``), :mod:`.weights` (the bound weights) and :mod:`.bind` (``bind_weights``).

Supported: llama (SmolLM2; Llama 3's ``rope_freqs.weight`` frequency factors), smollm3 (no RoPE on every
fourth layer), granite (embedding, attention, residual and logit multipliers), qwen2 (q/k/v biases), qwen3
(per-head q/k RMSNorm), phi3 (fused qkv and gate/up matrices, split into row views at binding), olmo2 (no
pre-norms, q/k RMSNorm over the projection, post norms), gemma2 (GEGLU, post norms, soft-capped scores and
logits, every other layer sliding) and gemma3 (scaled embeddings, GELU-tanh gated FFN, per-head q/k RMSNorm,
post-attention/post-FFN norms, sliding-window layers with their own RoPE base), mistral3 (llama with YaRN and
query temperature tuning), gemma4, qwen3moe, gpt-oss, qwen35, qwen35moe and seed_oss (qwen2's layout, its pre-FFN
norm named post_attention_norm). Linear, YaRN and LongRoPE scaling
are read for every architecture. A file whose tensors or RoPE-scaling metadata the engine would ignore is
refused. docs/engine.md section 1 tabulates them.
"""

from __future__ import annotations

from .arch import ARCHITECTURES, SUPPORTED_ARCHS, Architecture
from .bind import bind_weights
from .checks import check_config, check_weights
from .config import (
    MAX_CTX,
    MAX_EMBD,
    MAX_EXPERTS,
    MAX_FF,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_VOCAB,
    EmbeddingModel,
    ModelConfig,
    ModelError,
    UnsupportedModel,
    gguf_keys,
)
from .read import read_config
from .weights import GDNWeights, LayerWeights, ModelWeights, Weight

__all__ = [
    "ARCHITECTURES", "MAX_CTX", "MAX_EMBD", "MAX_EXPERTS", "MAX_FF", "MAX_HEADS", "MAX_HEAD_DIM", "MAX_LAYERS",
    "MAX_VOCAB", "SUPPORTED_ARCHS", "Architecture", "EmbeddingModel", "GDNWeights", "LayerWeights", "ModelConfig",
    "ModelError", "ModelWeights", "UnsupportedModel", "Weight", "bind_weights", "check_config", "check_weights",
    "gguf_keys", "read_config",
]
