"""gemma2: scaled embeddings, GEGLU, post norms, soft-capped scores and logits, even layers sliding."""

from __future__ import annotations

import math

from ...gguf import GGUFFile
from ..metadata import read_float, read_int
from .base import Architecture, Common


def configure(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    a = c["arch"]
    return {"rope_base_swa": c["rope_base"],
            "sliding_window": read_int(f, keys["sliding_window"], 4096, lo=0), "swa_pattern": 2,
            "embed_scale": math.sqrt(c["n_embd"]), "gelu": True, "post_norms": True,  # type: ignore[arg-type]
            "attn_scale": 1.0 / math.sqrt(c["head_dim"]),  # type: ignore[arg-type]
            "attn_softcap": read_float(f, f"{a}.attn_logit_softcapping", 50.0, 1e30),
            "final_softcap": read_float(f, f"{a}.final_logit_softcapping", 30.0, 1e30)}


DESCRIPTION = Architecture("gemma2", configure)
