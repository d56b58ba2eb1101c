"""Quantize to a size, not a preset: each tensor's type chosen by measured cost under a byte budget
(docs/quantize.md, section 8).

:func:`plan_target` lists each quantizable tensor's candidate types, measures their costs
(:func:`.sensitivity.tensor_costs`), solves for the least total cost within the budget (:func:`.budget.solve`) and
turns the choice into ``--tensor-type`` rules, one anchored pattern per tensor, that the ordinary quantizer
(:func:`.quantize.plan_quantize`) -- and llama-quantize given the same rules -- turns into the file.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..gguf import GGUFFile
from .budget import BudgetError, Solution, solve
from .imatrix import Imatrix
from .mixture import PRESETS, allows_quantization, fallback_type, get_preset, requires_imatrix
from .quantize import QuantizeError, QuantizeOptions, QuantizePlan, plan_quantize, supported_types
from .sensitivity import Progress, TensorCosts, tensor_costs
from .types import ggml_type

#: the candidate types when none are given
DEFAULT_TYPES = ("Q2_K", "Q3_K", "Q4_0", "IQ4_NL", "IQ4_XS", "Q4_K", "Q5_0", "Q5_K", "Q6_K", "Q8_0")
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40,
          "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40,
          "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
#: the preset whose general.file_type a mix takes, by its most common type (any preset with a quantized default
#: would do: every quantizable tensor has its own rule)
_PRESET_OF = {"Q2_K": "Q2_K", "Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M", "Q6_K": "Q6_K", "Q8_0": "Q8_0",
              "Q4_0": "Q4_0", "Q4_1": "Q4_1", "Q5_0": "Q5_0", "Q5_1": "Q5_1", "IQ4_XS": "IQ4_XS", "IQ4_NL": "IQ4_NL",
              "IQ3_S": "IQ3_S", "IQ3_XXS": "IQ3_XXS", "IQ2_XXS": "IQ2_XXS", "IQ2_XS": "IQ2_XS", "IQ1_S": "IQ1_S",
              "IQ1_M": "IQ1_M", "TQ1_0": "TQ1_0", "TQ2_0": "TQ2_0", "MXFP4": "MXFP4_MOE"}


def parse_size(text: str) -> int:
    """``4.2G``, ``900M``, ``1.5GiB``, ``4200MB``, ``123456`` -> bytes. K/M/G/T and KiB/MiB/GiB/TiB are powers of
    1024, KB/MB/GB/TB powers of 1000; the result must be a positive whole number of bytes."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*", text)
    if m is None:
        raise ValueError(f"{text!r} is not a size (e.g. 4.2G, 900M, 1.5GiB, 4200MB or a byte count)")
    unit = m.group(2).upper()
    if unit not in _UNITS:
        raise ValueError(f"{text!r}: unknown unit {m.group(2)!r} (B, K, M, G, T, KiB..TiB or KB..TB)")
    v = float(m.group(1)) * _UNITS[unit]
    if not math.isfinite(v) or v < 1:
        raise ValueError(f"{text!r} is not a positive size")
    if v > 1 << 60:
        raise ValueError(f"{text!r} is too large")
    return int(v)


def check_types(names: Sequence[str]) -> list[str]:
    """Candidate type names, upper-cased and checked: known to ggml, with a quantizer here and a kernel the engine
    runs (the costs are measured by running it); duplicates dropped."""
    from ..native import lib

    have = set(supported_types())
    out: list[str] = []
    for n in names:
        n = n.strip().upper()
        if not n:
            continue
        try:
            t = ggml_type(n)
        except KeyError:
            raise ValueError(f"unknown ggml type {n!r}") from None
        if t.name not in have:
            raise ValueError(f"Quantscope has no quantizer for {t.name} (it has: {', '.join(sorted(have))})")
        if not lib.qs_can_dequantize(t.id):
            raise ValueError(f"the engine cannot run {t.name}, so its cost cannot be measured")
        if t.name not in out:
            out.append(t.name)
    if not out:
        raise ValueError("no candidate type given (e.g. Q3_K,Q4_K,Q5_K,Q6_K)")
    return out


def rule_pattern(name: str) -> str:
    """An anchored regular expression that matches exactly ``name`` (white space and ``=`` written as ``\\xNN``, so
    that a rule is one word of a ``--tensor-type-file`` and splits at its only ``=``)."""
    parts = []
    for ch in name:
        if ch.isspace() or ch == "=" or not ch.isprintable():
            code = ord(ch)
            parts.append(f"\\x{code:02x}" if code < 256 else f"\\u{code:04x}")
        else:
            parts.append(re.escape(ch))
    return "^" + "".join(parts) + "$"


def rules_text(rules: Sequence[tuple[str, str]]) -> str:
    """The rule file: one ``PATTERN=TYPE`` per line (llama-quantize's ``--tensor-type`` argument)."""
    return "".join(f"{p}={t}\n" for p, t in rules)


@dataclass
class TargetPlan:
    """The chosen mix and everything a dry run shows."""

    plan: QuantizePlan
    options: QuantizeOptions
    choices: dict[str, str]  # tensor -> type
    costs: dict[str, TensorCosts]
    rules: list[tuple[str, str]]
    budget: int  # the byte limit solved for (file bytes, or tensor bytes for a bits-per-weight target)
    smallest: int  # the smallest mix's size, in the same measure
    predicted_cost: float  # the sum of the chosen costs (the predicted mean KL divergence, nats)
    solution: Solution
    timings: dict[str, float] = field(default_factory=dict)


def _candidates(f: GGUFFile, types: Sequence[str], has_imatrix: bool) -> list[tuple[str, list[str]]]:
    arch = f.architecture or ""
    preset = get_preset("Q8_0")
    out = []
    for t in f.tensors:
        if not allows_quantization(t.name, t.ne, arch):
            continue
        fit = [q for q in types if t.ne[0] % ggml_type(q).block_elems == 0
               and (has_imatrix or not requires_imatrix(t.name, q, preset))]
        if not fit:  # llama-quantize's fallback for rows the blocks do not divide: a fixed choice
            smallest = min(types, key=lambda q: ggml_type(q).block_bytes / ggml_type(q).block_elems)
            try:
                fit = [fallback_type(smallest, t.ne[0])[0]]
            except ValueError:
                fit = ["F16"]
        out.append((t.name, fit))
    if not out:
        raise QuantizeError("the file has no tensor llama-quantize would quantize")
    return out


def _options(rules: Sequence[tuple[str, str]], imatrix: Imatrix | None, imatrix_label: str, allow_requantize: bool,
             threads: int) -> QuantizeOptions:
    counts: dict[str, int] = {}
    for _, q in rules:
        counts[q] = counts.get(q, 0) + 1
    top = max(counts, key=lambda q: counts[q]) if counts else "Q8_0"
    preset = _PRESET_OF.get(top, "Q8_0")
    assert preset in PRESETS
    return QuantizeOptions(preset, imatrix, imatrix_label, tuple(rules), allow_requantize=allow_requantize,
                           threads=threads)


def plan_target(f: GGUFFile, chunks: np.ndarray, *, size: int | None = None, bpw: float | None = None,
                types: Sequence[str] = DEFAULT_TYPES, imatrix: Imatrix | None = None, imatrix_label: str = "",
                allow_requantize: bool = False, cache_dir: str | os.PathLike[str] | None = None,
                exact: bool = False, threads: int = 0, progress: Progress | None = None) -> TargetPlan:
    """The least-cost mix within ``size`` file bytes (or ``bpw`` bits per weight over every tensor, as
    llama-quantize counts them); raises :class:`.quantize.QuantizeError` (one line) when it cannot be done."""
    if (size is None) == (bpw is None):
        raise QuantizeError("give a target size or a target bits per weight, not both")
    has_im = imatrix is not None and bool(imatrix.entries)
    cands = _candidates(f, check_types(types), has_im)
    quantizable = {n for n, _ in cands}
    n_elements = sum(t.n_elements for t in f.tensors)
    f32_bytes = 4 * n_elements
    if bpw is not None and not (math.isfinite(bpw) and 0 < bpw <= 32):
        raise QuantizeError(f"--target-bpw {bpw:g} is outside (0, 32] (32 is F32)")
    if size is not None and size <= 0:
        raise QuantizeError("the target size must be positive")
    # the smallest mix: validates every tensor (requantizing, imatrix shapes) before any measuring
    by_name = {t.name: t for t in f.tensors}

    def nbytes(name: str, q: str) -> int:
        t = by_name[name]
        return t.n_elements // t.ne[0] * ggml_type(q).row_bytes(t.ne[0])

    small_rules = [(rule_pattern(n), min(qs, key=lambda q, n=n: nbytes(n, q))) for n, qs in cands]
    small = plan_quantize(f, _options(small_rules, imatrix, imatrix_label, allow_requantize, threads))
    align = small.alignment
    fixed = [j for j in small.jobs if j.info.name not in quantizable]
    if size is not None:
        if size > len(small.header) + f32_bytes:
            raise QuantizeError(f"the target of {size:,} bytes is larger than the model in F32 "
                                f"({len(small.header) + f32_bytes:,} bytes)")
        smallest = small.file_bytes
        budget = size - len(small.header) - sum(-(-j.out_bytes // align) * align for j in fixed)
        target = size
    else:
        assert bpw is not None
        smallest = small.out_bytes
        target = int(bpw * n_elements / 8)
        budget = target - sum(j.out_bytes for j in fixed)
    if target < smallest:
        what = f"{size:,} bytes" if size is not None else f"{bpw:g} bits per weight ({target:,} bytes of tensors)"
        raise QuantizeError(f"the target of {what} is below the smallest mix of these types ({smallest:,} bytes, "
                            f"{8 * small.out_bytes / n_elements:.3f} bpw)")
    timings: dict[str, float] = {}
    costs = tensor_costs(f, cands, chunks, imatrix=imatrix if has_im else None, cache_dir=cache_dir, exact=exact,
                         threads=threads, progress=progress, timings=timings)
    import time

    t0 = time.perf_counter()
    names = [c.name for c in costs]
    opts_of = [sorted(c.costs) for c in costs]

    def item_bytes(name: str, q: str) -> int:
        n = nbytes(name, q)
        return -(-n // align) * align if size is not None else n

    items = [[(item_bytes(c.name, q), c.costs[q]) for q in qs] for c, qs in zip(costs, opts_of, strict=True)]
    try:
        sol = solve(items, budget)
    except BudgetError as exc:  # the own type (copied) may be smaller than the candidates: still refused above
        raise QuantizeError(str(exc)) from None
    timings["solve"] = time.perf_counter() - t0
    choices = {n: qs[i] for n, qs, i in zip(names, opts_of, sol.choice, strict=True)}
    rules = [(rule_pattern(n), q) for n, q in choices.items()]
    opts = _options(rules, imatrix, imatrix_label, allow_requantize, threads)
    plan = plan_quantize(f, opts)
    got = plan.file_bytes if size is not None else plan.out_bytes
    if got > target:  # the solver's arithmetic and the writer's layout disagree: a bug, never a silent overrun
        raise QuantizeError(f"internal error: the mix takes {got:,} bytes, over the target of {target:,}")
    return TargetPlan(plan, opts, choices, {c.name: c for c in costs}, rules, target, smallest, sol.cost, sol,
                      timings)
