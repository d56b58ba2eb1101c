"""The model descriptions: one module per ``general.architecture``, each defining ``DESCRIPTION`` (an
:class:`~.base.Architecture`: its metadata reader and its flags). Adding an architecture that needs no new kernel
is one module here plus its line below (docs/extending.md). The only place architecture names are tested."""

from __future__ import annotations

from . import (
    bert,
    gemma2,
    gemma3,
    gemma4,
    gemma_embedding,
    gpt_oss,
    granite,
    jina_bert_v2,
    llama,
    mistral3,
    nomic_bert,
    olmo2,
    phi3,
    qwen2,
    qwen3,
    qwen3moe,
    qwen35,
    qwen35moe,
    seed_oss,
    smollm3,
)
from .base import Architecture, Common

#: The description modules, in the order error messages list the architectures.
MODULES = (llama, granite, smollm3, qwen2, qwen3, phi3, olmo2, gemma2, gemma3, mistral3, gemma4, qwen3moe, gpt_oss,
           qwen35, qwen35moe, seed_oss, bert, nomic_bert, jina_bert_v2,
           gemma_embedding)
ARCHITECTURES: dict[str, Architecture] = {m.DESCRIPTION.name: m.DESCRIPTION for m in MODULES}
SUPPORTED_ARCHS = tuple(ARCHITECTURES)
#: The architecture a bump file's config.json means when it names no model_type.
BUMP_DEFAULT = llama.DESCRIPTION.name

__all__ = ["ARCHITECTURES", "BUMP_DEFAULT", "MODULES", "SUPPORTED_ARCHS", "Architecture", "Common", "description"]


def description(name: str) -> Architecture:
    """The description of architecture ``name``; :class:`UnsupportedModel` if the engine has none."""
    try:
        return ARCHITECTURES[name]
    except KeyError:
        from ..config import UnsupportedModel

        raise UnsupportedModel(f"architecture {name!r} is not supported by the engine") from None
