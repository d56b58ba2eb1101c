"""mistral3: Ministral 3, llama with YaRN (read for every architecture) and Llama 4's query temperature tuning."""

from __future__ import annotations

from ...gguf import GGUFFile
from ..metadata import read_float
from .base import Architecture, Common


def configure(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    return {"attn_temp_scale": read_float(f, f"{c['arch']}.attention.temperature_scale", 0.0, zero_ok=True)}


DESCRIPTION = Architecture("mistral3", configure, rope_neox=False, rope_freqs=True)
