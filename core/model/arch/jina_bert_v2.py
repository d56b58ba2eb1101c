"""jina-bert-v2: an encoder (jina-embeddings-v2): BERT's post-LayerNorm layers without position embeddings,
positions by ALiBi (each head's scores biased by -slope * |distance|, llama.cpp's max_bias 8), and a GEGLU FFN:
``ffn_up`` holding the gate's rows then the up's (llama.cpp's converter today), or ``ffn_gate`` beside ``ffn_up``
(older files), with the biases of up and down; an ``ffn_up`` of n_ff rows without a gate is BERT's plain GELU FFN.
An embedding model: core/engine/encoder.py runs it as llama.cpp's ``bert`` graph does for this architecture."""

from __future__ import annotations

from ...gguf import GGUFFile
from .base import Architecture, Common
from .bert import encoder

#: llama.cpp's f_max_alibi_bias for jina-bert-v2 (fixed in its loader, not read from the file)
MAX_ALIBI_BIAS = 8.0


def configure(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    return {**encoder(f, c), "gelu": True, "encoder_positions": "alibi", "alibi_max_bias": MAX_ALIBI_BIAS,
            "encoder_ffn": "any"}


DESCRIPTION = Architecture("jina-bert-v2", configure, rope_neox=False, fused_gate_up=True)
