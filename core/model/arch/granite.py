"""granite: llama with four multipliers; ``rope.scaling.finetuned = false`` turns RoPE off."""

from __future__ import annotations

import math

import numpy as np

from ...gguf import GGUFFile
from ..config import ModelError
from ..metadata import REQUIRED, read_float
from .base import Architecture, Common


def configure(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    a = c["arch"]
    finetuned = f.metadata.get(f"{a}.rope.scaling.finetuned")
    rope_on = True if finetuned is None else finetuned.value
    if not isinstance(rope_on, bool | np.bool_):
        raise ModelError(f"{a}.rope.scaling.finetuned: expected a bool, found {finetuned.type_label}")  # type: ignore[union-attr]
    return {"no_rope_step": 0 if rope_on else 1,
            "embed_scale": read_float(f, f"{a}.embedding_scale", 1.0, 1e6),
            "attn_scale": read_float(f, f"{a}.attention.scale", 1.0 / math.sqrt(c["head_dim"]), 1e6),  # type: ignore[arg-type]
            "residual_scale": read_float(f, f"{a}.residual_scale", 1.0, 1e6),
            "logit_scale": read_float(f, f"{a}.logit_scale", REQUIRED, 1e6)}  # type: ignore[arg-type]


DESCRIPTION = Architecture("granite", configure, rope_neox=False)
