"""Fill-in-the-middle prompts for code models, built as llama-server's ``format_prompt_infill`` builds them.

The model's FIM tokens come from its metadata (``tokenizer.ggml.fim_pre_token_id`` …) or, as llama.cpp finds them
when the metadata lacks them, from their texts (``<|fim_prefix|>``, ``<fim_prefix>``, ``<PRE>`` …). The layout:
``[FIM_REP]myproject\\n`` (when the model has it), each extra file as ``[FIM_SEP]filename\\n`` and its text (or a
"--- snippet ---" separator without FIM_SEP), ``[FIM_SEP]filename\\n``, then ``[BOS][FIM_PRE]prefix prompt
[FIM_SUF]suffix[FIM_MID]`` (BOS where the vocabulary adds one). Nothing is cut to fit: a prompt longer than the
context is refused like any other. The middle ends, as in llama.cpp, at an end-of-generation token or at FIM_PAD,
FIM_REP or FIM_SEP (:attr:`FimTokens.ends`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..gguf import GGUFFile
from ..tokenizer import Tokenizer

#: role -> (metadata key, the token texts llama.cpp recognises when the key is missing)
ROLES = {
    "pre": ("tokenizer.ggml.fim_pre_token_id", ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>",
                                                "<PRE>", "▁<PRE>", "<|code_prefix|>", "<|prefix|>")),
    "suf": ("tokenizer.ggml.fim_suf_token_id", ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>",
                                                "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>")),
    "mid": ("tokenizer.ggml.fim_mid_token_id", ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>",
                                                "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>")),
    "rep": ("tokenizer.ggml.fim_rep_token_id", ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>",
                                                "<reponame>")),
    "sep": ("tokenizer.ggml.fim_sep_token_id", ("<|file_sep|>",)),
    "pad": ("tokenizer.ggml.fim_pad_token_id", ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")),
}
#: llama-server's separator of extra chunks for a model without FIM_SEP
SNIPPET = "\n\n--- snippet ---\n\n"


@dataclass(frozen=True)
class FimTokens:
    """A model's FIM token ids (rep, sep and pad optional)."""

    pre: int
    suf: int
    mid: int
    rep: int | None = None
    sep: int | None = None
    pad: int | None = None

    @property
    def ends(self) -> frozenset[int]:
        """The tokens that end a middle besides the end-of-generation ones (llama.cpp's: pad, repo, file
        separator)."""
        return frozenset(t for t in (self.pad, self.rep, self.sep) if t is not None)


def _find(f: GGUFFile, tok: Tokenizer, role: str) -> int | None:
    key, texts = ROLES[role]
    v = f.get(key)
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < tok.n_vocab:
        return v
    for t in texts:
        tid = tok.vocab.get(t)
        if tid is not None:
            return int(tid)
    return None


def find_fim(f: GGUFFile, tok: Tokenizer) -> FimTokens | str:
    """The model's :class:`FimTokens`, or a sentence naming the ones it lacks."""
    found = {r: _find(f, tok, r) for r in ROLES}
    missing = [r for r in ("pre", "suf", "mid") if found[r] is None]
    if missing:
        names = {"pre": "prefix", "suf": "suffix", "mid": "middle"}
        return ("the model has no fill-in-the-middle tokens (" + ", ".join(names[r] for r in missing)
                + " missing): it was not trained to fill in the middle")
    return FimTokens(**found)  # type: ignore[arg-type]


def infill_ids(tok: Tokenizer, fim: FimTokens, prefix: str, suffix: str, prompt: str = "",
               extra: list[tuple[str, str]] | None = None) -> list[int]:
    """The FIM prompt's token ids (the module's layout); texts are tokenized without special tokens parsed."""

    def enc(text: str) -> list[int]:
        return tok.encode(text, add_special=False, parse_special=False) if text else []

    head: list[int] = []
    if fim.rep is not None:
        head += [fim.rep, *enc("myproject\n")]
    for filename, text in extra or []:
        head += [fim.sep, *enc(filename + "\n")] if fim.sep is not None else enc(SNIPPET)
        head += enc(text)
    if fim.sep is not None:
        head += [fim.sep, *enc("filename\n")]
    bos = [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []
    return [*head, *bos, fim.pre, *enc(prefix), *enc(prompt), fim.suf, *enc(suffix), fim.mid]


__all__ = ["FimTokens", "find_fim", "infill_ids"]
