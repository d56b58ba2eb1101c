"""olmo2: no pre-norms; q/k RMSNorm over the whole projection; post-attention and post-FFN norms."""

from __future__ import annotations

from ...gguf import GGUFFile
from ..config import UnsupportedModel
from ..metadata import read_int
from .base import Architecture, Common


def configure(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    if read_int(f, keys["sliding_window"], 0, lo=0):
        raise UnsupportedModel(f"{keys['sliding_window']}: OLMo 3's sliding-window layers are not supported "
                               "by the engine")
    return {"qk_norm": True, "qk_norm_full": True, "post_norms": True, "pre_norms": False}


DESCRIPTION = Architecture("olmo2", configure)
