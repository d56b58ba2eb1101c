"""gemma3: Gemma 2's layout with per-head q/k RMSNorm instead of soft-capping; 5 of every 6 layers slide (base
10000 there)."""

from __future__ import annotations

import math

from ...gguf import GGUFFile
from ..metadata import read_int
from .base import Architecture, Common


def configure(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    return {"rope_base_swa": 10000.0, "sliding_window": read_int(f, keys["sliding_window"], 0, lo=0),
            "swa_pattern": 6, "embed_scale": math.sqrt(c["n_embd"]), "gelu": True,  # type: ignore[arg-type]
            "qk_norm": True, "post_norms": True, "attn_scale": 1.0 / math.sqrt(c["head_dim"])}  # type: ignore[arg-type]


DESCRIPTION = Architecture("gemma3", configure)
