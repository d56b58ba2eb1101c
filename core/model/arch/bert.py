"""bert: an encoder (BERT, bge, e5, all-MiniLM): absolute position and token type embeddings, LayerNorm with bias
after each residual (the embeddings' too), GELU FFN with biases, attention over the whole sequence. An embedding
model: core/engine/encoder.py runs it; the generative engine refuses it (``pooling`` set)."""

from __future__ import annotations

from ...gguf import GGUFFile
from ..config import ModelError
from ..metadata import read_float, read_int
from .base import Architecture, Common

#: llama.cpp's LLAMA_POOLING_TYPE_* values of ``{arch}.pooling_type``
POOLING_TYPES = ("none", "mean", "cls", "last", "rank")


def pooling_of(f: GGUFFile, arch: str) -> str:
    """``{arch}.pooling_type`` as a name (absent: llama.cpp's default for an encoder, none)."""
    key = f"{arch}.pooling_type"
    v = read_int(f, key, 0, lo=0, hi=len(POOLING_TYPES) - 1) if key in f.metadata else 0
    return POOLING_TYPES[v]


def encoder(f: GGUFFile, c: Common) -> dict[str, object]:
    """What every BERT-style encoder reads: the LayerNorm epsilon (in ``rms_eps``), non-causal attention (a
    causal one refused) and the pooling."""
    a = c["arch"]
    if f.get(f"{a}.attention.causal") not in (None, False):
        raise ModelError(f"{a}.attention.causal: a causal BERT is not supported (expected false or absent)")
    return {"rms_eps": read_float(f, f"{a}.attention.layer_norm_epsilon", 1e-12, 1.0),
            "pooling": pooling_of(f, a)}  # type: ignore[arg-type]


def configure(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    return {**encoder(f, c), "gelu": True}


DESCRIPTION = Architecture("bert", configure, rope_neox=False)
