"""qwen3: qwen2's layout without biases, with per-head q/k RMSNorm. A file with ``qwen3.pooling_type`` (not 0) is
an embedding model (Qwen3-Embedding: last-token pooling of the final-norm rows, causal attention; with rank
pooling, 4, Qwen3-Reranker's yes/no head), which core/engine/encoder.py runs; without it (or 0: none) a text
generation model."""

from __future__ import annotations

from ...gguf import GGUFFile
from .base import Architecture, Common
from .bert import pooling_of


def configure(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    pooling = pooling_of(f, c["arch"])  # type: ignore[arg-type]
    return {"qk_norm": True, "pooling": "" if pooling == "none" else pooling}


DESCRIPTION = Architecture("qwen3", configure, decoder_embedding=True, decoder_rank_head=True)
