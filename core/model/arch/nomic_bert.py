"""nomic-bert: an encoder (nomic-embed-text v1, v1.5): BERT's post-LayerNorm layers with rotary positions (NeoX
halves, ``rope.freq_base``) instead of position embeddings, q/k/v fused in ``attn_qkv`` without biases, and a SwiGLU
FFN (gate and up, no biases). An embedding model: core/engine/encoder.py runs it as llama.cpp's ``bert`` graph
does for this architecture."""

from __future__ import annotations

from ...gguf import GGUFFile
from .base import Architecture, Common
from .bert import encoder


def configure(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    return {**encoder(f, c), "encoder_positions": "rope", "encoder_ffn": "gated"}


DESCRIPTION = Architecture("nomic-bert", configure, rope_neox=True)
