"""Checks of a parsed file the views and the engine rely on: layout (alignment, offsets, bounds, overlaps, gaps),
tensor shapes, and metadata of the wrong type or an implausible value. Each is a :class:`Check` the Overview lists.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .reader import GGUFFile
from .strings import StringArray


def metadata_int(v: object) -> int | None:
    """An integer metadata value as ``int``; ``None`` for anything else (bool, float, string, array, absent)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        return None
    return int(v)


@dataclass(frozen=True)
class Check:
    """One integrity check: ``ok`` True (passed), False (failed) or None (informational)."""

    name: str
    ok: bool | None
    detail: str


def layout_problems(f: GGUFFile) -> list[str]:
    """The layout faults that make figures about the file wrong, one sentence each, worst first: tensors past the
    end of the file, overlapping tensors, a bad alignment or unaligned offsets, a data section past the end. Empty
    for a sound file. The Overview shows these at its top and ``quantscope inspect`` before anything else."""
    out: list[str] = []
    al = f.alignment
    if f.data_start > f.file_size:
        out.append(f"The data section starts at byte {f.data_start:,}, past the end of the {f.file_size:,}-byte "
                   "file.")
    outside = [t for t in f.tensors if t.problem and ("outside" in t.problem or "past the end" in t.problem)]
    if outside:
        out.append(f"{_n(len(outside), 'tensor')} of {len(f.tensors):,} run past the end of the file "
                   f"— e.g. {outside[0].name}: {outside[0].problem}.")
    overlaps = [t for t in f.tensors if t.problem and "overlaps" in t.problem]
    if overlaps:
        out.append(f"{_n(len(overlaps), 'tensor')} overlap another, e.g. {overlaps[0].name}: "
                   f"{overlaps[0].problem}.")
    if not (al > 0 and al & (al - 1) == 0):
        out.append(f"general.alignment = {al} is not a power of two.")
    else:
        unaligned = [t for t in f.tensors if t.offset % al]
        if unaligned:
            out.append(f"{_n(len(unaligned), 'tensor')} do not start on a {al}-byte boundary, e.g. "
                       f"{unaligned[0].name} at offset {unaligned[0].offset:,}.")
    return out


def _n(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def integrity_checks(f: GGUFFile) -> list[Check]:
    """Header and layout checks: alignment, tensor offsets, bounds, overlaps, types, gaps, vocabulary size."""
    out: list[Check] = []
    al = f.alignment
    out.append(Check("alignment", al > 0 and al & (al - 1) == 0,
                     f"general.alignment = {al}" + ("" if "general.alignment" in f else " (default)")))
    out.append(Check("data section", f.data_start % al == 0 and f.data_start <= f.file_size,
                     f"starts at byte {f.data_start:,} (header ends at {f.header_end:,})"))
    problems = {t.name: t.problem for t in f.tensors if t.problem}
    unaligned = [t for t in f.tensors if t.offset % al]
    out.append(Check("tensor offsets aligned", not unaligned,
                     f"all {len(f.tensors)} tensors start on a {al}-byte boundary" if not unaligned else
                     f"{len(unaligned)} unaligned, e.g. {unaligned[0].name} at offset {unaligned[0].offset:,}"))
    outside = [n for n, p in problems.items() if p and ("outside" in p or "past the end" in p)]
    out.append(Check("tensors inside the file", not outside,
                     "every tensor's bytes lie within the file" if not outside else
                     f"{len(outside)} tensors run past the end, e.g. {outside[0]}: {problems[outside[0]]}"))
    overlaps = [n for n, p in problems.items() if p and "overlaps" in p]
    out.append(Check("no overlaps", not overlaps,
                     "no two tensors share bytes" if not overlaps else
                     f"{len(overlaps)} overlapping, e.g. {overlaps[0]}: {problems[overlaps[0]]}"))
    unknown = [t for t in f.tensors if t.type is None]
    out.append(Check("known tensor types", not unknown,
                     "every tensor type id is known" if not unknown else
                     f"{len(unknown)} tensors of unknown type, e.g. {unknown[0].name}: {unknown[0].type_name}"))
    placed = sorted((t for t in f.tensors if t.n_bytes and not t.problem), key=lambda t: (t.shard, t.offset))
    ends = [s.data_start for s in f.shards]  # per file: a split model's offsets are in their shard
    gap_bytes = 0
    for t in placed:
        if t.data_offset > ends[t.shard]:
            gap_bytes += t.data_offset - ends[t.shard]
        ends[t.shard] = max(ends[t.shard], t.data_offset + (t.n_bytes or 0))
    used = sum(t.n_bytes or 0 for t in placed)
    trailing = sum(s.file_size - end for s, end in zip(f.shards, ends, strict=True))
    if outside or overlaps:  # the bytes do not add up: a count of padding would be made up
        out.append(Check("padding", None, "not measured: the tensors' bytes do not fit the file (see above)"))
    else:
        out.append(Check("padding", None, f"{used:,} tensor bytes, {gap_bytes:,} bytes of alignment padding, "
                         f"{trailing:,} bytes after the last tensor"))
    toks = f.get("tokenizer.ggml.tokens")
    if isinstance(toks, StringArray) and f.has_tensor("token_embd.weight"):
        emb = f.tensor("token_embd.weight")
        rows = emb.ne[1] if len(emb.ne) > 1 else 1
        out.append(Check("vocabulary matches embedding", len(toks) == rows,
                         f"{len(toks):,} tokens, token_embd has {rows:,} rows"))
    out.extend(shape_checks(f))
    out.extend(metadata_checks(f))
    return out


def shape_checks(f: GGUFFile) -> list[Check]:
    """Odd but legal tensor layouts: no tensors at all, zero dimensions."""
    if not f.tensors:
        return [Check("tensors", None, "no tensors (a vocabulary-only file?): nothing to inspect or run")]
    out: list[Check] = []
    empty = [t for t in f.tensors if 0 in t.ne]
    if empty:
        out.append(Check("tensor shapes", False, f"{len(empty)} tensors have a zero dimension, e.g. tensor "
                         f"{empty[0].name} with ne = {list(empty[0].ne)}"))
    return out


#: ``{arch}.`` suffixes holding a count or size (integer, or per-layer integer array for the marked ones)
_INT_SUFFIXES = {"context_length": False, "embedding_length": False, "block_count": False,
                 "feed_forward_length": True, "attention.head_count": True, "attention.head_count_kv": True,
                 "attention.key_length": False, "attention.value_length": False,
                 "attention.sliding_window": False, "rope.dimension_count": False, "vocab_size": False,
                 "expert_count": False, "expert_used_count": False}
_FLOAT_SUFFIXES = ("attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon", "rope.freq_base",
                   "rope.scaling.factor", "final_logit_softcapping", "attn_logit_softcapping")
_INT_KEYS = ("general.file_type", "general.alignment", "general.quantization_version",
             "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
             "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id")
_STR_KEYS = ("general.architecture", "general.name", "tokenizer.ggml.model", "tokenizer.ggml.pre",
             "tokenizer.chat_template")
_STR_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")
_NUM_ARRAYS = ("tokenizer.ggml.token_type", "tokenizer.ggml.scores")
#: the largest value a count may have before it is reported as implausible (and clamped by the views)
INT32_MAX = 2**31 - 1


def describe_value(v: object) -> str:
    """A short description of a metadata value's type for a message: ``a string ('4096')``, ``an array of 2``."""
    if isinstance(v, str):
        return f"a string ({v[:24]!r}{'…' if len(v) > 24 else ''})"
    if isinstance(v, (bool, np.bool_)):
        return f"a boolean ({bool(v)})"
    if isinstance(v, (float, np.floating)):
        return f"a float ({float(v):g})"
    if isinstance(v, (StringArray, np.ndarray, list)):
        return f"an array of {len(v):,}"
    if isinstance(v, (int, np.integer)):
        return f"an integer ({int(v)})"
    return type(v).__name__


def metadata_checks(f: GGUFFile) -> list[Check]:
    """Metadata the views and the engine read, of the wrong type or an implausible value: one failed check each
    (e.g. "llama.context_length is a string ('4096')"); empty arrays are listed as information."""
    out: list[Check] = []

    def bad(key: str, what: str) -> None:
        out.append(Check(key, False, f"{key} {what}"))

    toks = f.get("tokenizer.ggml.tokens")
    arch_v = f.get("general.architecture")
    arch = arch_v if isinstance(arch_v, str) else None
    for key in _STR_KEYS:
        v = f.get(key)
        if v is not None and not isinstance(v, str):
            bad(key, f"is {describe_value(v)}, not a string")
    for key in _INT_KEYS:
        v = f.get(key)
        if v is not None and metadata_int(v) is None:
            bad(key, f"is {describe_value(v)}, not an integer")
        elif v is not None and not 0 <= int(v) <= INT32_MAX:
            bad(key, f"= {int(v):,} is out of range")
        elif v is not None and key.endswith("_token_id") and isinstance(toks, StringArray) and int(v) >= len(toks):
            bad(key, f"= {int(v):,} is outside the vocabulary of {len(toks):,} tokens")
    if arch:
        for suffix, per_layer in _INT_SUFFIXES.items():
            key = f"{arch}.{suffix}"
            v = f.get(key)
            if v is None:
                continue
            if per_layer and isinstance(v, np.ndarray) and v.dtype.kind in "iu" and v.size:
                v = v.max() if v.min() >= 0 else v.min()
            n = metadata_int(v)
            if n is None:
                bad(key, f"is {describe_value(v)}, not an integer")
            elif n < 0:
                bad(key, f"= {n:,} is negative")
            elif n > INT32_MAX:
                bad(key, f"= {n:,} is larger than any plausible value (shown clamped to {INT32_MAX:,})")
        for suffix in _FLOAT_SUFFIXES:
            key = f"{arch}.{suffix}"
            v = f.get(key)
            if v is not None and (isinstance(v, (bool, np.bool_, str)) or not isinstance(v, (int, float, np.number))):
                bad(key, f"is {describe_value(v)}, not a number")
    for key in _STR_ARRAYS:
        v = f.get(key)
        if v is not None and not isinstance(v, StringArray):
            bad(key, f"is {describe_value(v)}, not an array of strings")
    for key in _NUM_ARRAYS:
        v = f.get(key)
        if v is not None and not (isinstance(v, np.ndarray) and v.dtype.kind in "iuf"):
            bad(key, f"is {describe_value(v)}, not a numeric array")
    toks = f.get("tokenizer.ggml.tokens")
    if isinstance(toks, StringArray):
        for key in _NUM_ARRAYS:
            v = f.get(key)
            if isinstance(v, np.ndarray) and len(v) != len(toks):
                bad(key, f"has {len(v):,} entries but tokenizer.ggml.tokens has {len(toks):,}")
    empty = [kv.key for kv in f.metadata.values() if kv.elem_type is not None and not len(kv.value)]
    if empty:
        out.append(Check("empty arrays", None, f"{len(empty)} metadata arrays have no elements: "
                         + ", ".join(empty[:5]) + (", …" if len(empty) > 5 else "")))
    return out


