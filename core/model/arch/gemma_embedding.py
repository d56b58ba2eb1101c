"""gemma-embedding: EmbeddingGemma, Gemma 3's layers (q/k RMSNorm, post-norms, GELU-gated FFN, embeddings times
sqrt(n_embd), queries scaled by 1/sqrt(head_dim)) with bidirectional attention: every token attends to every token
of its input, within window/2 positions either side on the sliding layers (llama.cpp's symmetric window; every
``sliding_window_pattern``-th layer, default 6, attends to all). The rows after the final norm are pooled (mean in
the published files) and go through the optional dense head ``dense_2`` then ``dense_3`` (two products, no
activation). An embedding model: core/engine/encoder.py runs it on the decoder layers."""

from __future__ import annotations

import math

from ...gguf import GGUFFile
from ..config import MAX_CTX, MAX_FF, ModelError
from ..metadata import read_bools, read_float, read_int
from .base import Architecture, Common
from .bert import pooling_of


def swa_layers(f: GGUFFile, key: str, n_layers: int, default: int) -> tuple[bool, ...]:
    """Which layers slide, as llama.cpp's ``load_swa_pattern``: one flag per layer, or a period n (every n-th
    layer attends to all, the others slide; 0: every layer slides)."""
    kv = f.metadata.get(key)
    if kv is not None and kv.count is not None:  # an array: one flag per layer
        return tuple(read_bools(f, key, n_layers))
    n = read_int(f, key, default, lo=0, hi=MAX_CTX)
    return tuple(n == 0 or i % n < n - 1 for i in range(n_layers))


def configure(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    a, E = c["arch"], c["n_embd"]
    for key, want in (("dense_2_feat_in", E), ("dense_3_feat_out", E)):
        if f"{a}.{key}" in f.metadata and read_int(f, f"{a}.{key}", hi=MAX_FF) != want:
            raise ModelError(f"{a}.{key}: expected {want} (= {keys['n_embd']}), found {f.get(f'{a}.{key}')}")
    return {"sliding_window": read_int(f, keys["sliding_window"], hi=MAX_CTX),
            "swa_layers": swa_layers(f, keys["swa_layers"], c["n_layers"], 6),  # type: ignore[arg-type]
            "rope_base_swa": read_float(f, f"{a}.rope.freq_base_swa", 10000.0, 1e30),
            "embed_scale": math.sqrt(E), "gelu": True, "qk_norm": True,  # type: ignore[arg-type]
            "post_norms": True, "attn_scale": 1.0 / math.sqrt(c["head_dim"]),  # type: ignore[arg-type]
            "causal": False, "pooling": pooling_of(f, a)}


DESCRIPTION = Architecture("gemma-embedding", configure, decoder_embedding=True)
