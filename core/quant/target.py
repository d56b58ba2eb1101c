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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..base.ggml_types import ggml_type
from ..gguf import GGUFFile
from .budget import BudgetError, Option, Solution, solve
from .imatrix import Imatrix
from .mixture import PRESETS, allows_quantization, fallback_type, get_preset, requires_imatrix
from .quantize import QuantizeError, QuantizeOptions, QuantizePlan, plan_quantize, supported_types
from .sensitivity import Progress, TensorCosts, tensor_costs

#: the candidate types when none are given: every type Q3_K_M, Q4_K_M and Q5_K_M give a tensor, their fallbacks for
#: rows the 256-blocks do not divide included (Q4_0, Q5_0, Q5_1, Q8_0), so that each of those presets' mixes is one
#: the solver can choose; Q4_1 beside Q5_1; the 4-bit non-linear types
DEFAULT_TYPES = ("Q2_K", "Q3_K", "Q4_0", "Q4_1", "IQ4_NL", "IQ4_XS", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0")
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
    by_file: bool = True  # the budget counts the file's bytes (a target size), else the tensors' (bits per weight)


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


@dataclass
class Mix:
    """One solve of the budget: each quantizable tensor's type, the file's bytes and the predicted divergence."""

    choices: dict[str, str]  # tensor -> type
    file_bytes: int  # the file the mix makes (header, every tensor padded to the alignment)
    tensor_bytes: int  # the tensors alone (what bits per weight count)
    cost: float  # the sum of the chosen costs: the predicted mean KL divergence, nats
    solution: Solution | None  # None for a preset's mix


@dataclass
class TargetSpace:
    """One file's quantizable tensors, their candidate types and their sizes: everything a budget solve needs besides
    the measured costs. Made by :func:`target_space` (which validates the file and the types); solving is fast
    (no file access), so a view can solve at every move of a slider."""

    f: GGUFFile
    candidates: list[tuple[str, list[str]]]  # (tensor, the types the solver may give it)
    imatrix: Imatrix | None
    imatrix_label: str
    allow_requantize: bool
    threads: int
    header_bytes: int
    alignment: int
    fixed_file_bytes: int  # the tensors llama-quantize never quantizes, padded
    fixed_tensor_bytes: int  # the same, unpadded
    n_elements: int
    smallest_file_bytes: int
    smallest_tensor_bytes: int

    def tensor_bytes(self, name: str, qtype: str) -> int:
        t = self.f.tensor(name)
        return t.n_elements // t.ne[0] * ggml_type(qtype).row_bytes(t.ne[0])

    def padded(self, n: int) -> int:
        a = self.alignment
        return -(-n // a) * a

    @property
    def largest_file_bytes(self) -> int:
        """The file of the largest candidate everywhere."""
        return self.header_bytes + self.fixed_file_bytes + sum(
            max(self.padded(self.tensor_bytes(n, q)) for q in qs) for n, qs in self.candidates)

    def bpw(self, tensor_bytes: int) -> float:
        return 8.0 * tensor_bytes / max(self.n_elements, 1)

    def measure_candidates(self, presets: Sequence[str] = ()) -> list[tuple[str, list[str]]]:
        """The (tensor, types) to measure: the candidates, and each tensor's type in each of ``presets`` (so that a
        preset's mix can be costed on the same scale; presets that cannot be planned are left out)."""
        extra: dict[str, list[str]] = {}
        for p in presets:
            for n, q in self.preset_types(p).items():
                extra.setdefault(n, []).append(q)
        return [(n, list(dict.fromkeys([*qs, *extra.get(n, [])]))) for n, qs in self.candidates]

    def preset_types(self, preset: str) -> dict[str, str]:
        """Each quantizable tensor's type in ``preset`` (llama-quantize's rules, this imatrix); {} when the preset
        cannot be planned (a type without a quantizer or a kernel here, an imatrix it needs)."""
        from ..native import lib

        try:
            plan = plan_quantize(self.f, QuantizeOptions(preset, self.imatrix, self.imatrix_label,
                                                         allow_requantize=self.allow_requantize,
                                                         threads=self.threads))
        except (QuantizeError, ValueError):
            return {}
        names = {n for n, _ in self.candidates}
        out = {j.info.name: j.choice.target for j in plan.jobs if j.info.name in names}
        if not all(lib.qs_can_dequantize(ggml_type(q).id) for q in set(out.values()) if q not in ("F32", "F16")):
            return {}
        return out

    def _items(self, costs: Sequence[TensorCosts], by_file: bool) -> tuple[list[list[str]], list[list[Option]]]:
        allowed = dict(self.candidates)
        if [c.name for c in costs] != list(allowed):
            raise ValueError("the costs are not those of this file's candidates")
        opts_of = []
        for c in costs:
            qs = sorted(q for q in c.costs if q in allowed[c.name])
            if not qs:
                raise ValueError(f"no cost of {c.name} for any of its candidate types")
            opts_of.append(qs)

        def b(name: str, q: str) -> int:
            n = self.tensor_bytes(name, q)
            return self.padded(n) if by_file else n

        items = [[(b(c.name, q), c.costs[q]) for q in qs] for c, qs in zip(costs, opts_of, strict=True)]
        return opts_of, items

    def solve(self, costs: Sequence[TensorCosts], *, size: int | None = None, bpw: float | None = None) -> Mix:
        """The least-cost mix within ``size`` file bytes (or ``bpw`` bits per weight over every tensor, as
        llama-quantize counts them); raises :class:`.quantize.QuantizeError` (one line) when it cannot be done."""
        if (size is None) == (bpw is None):
            raise QuantizeError("give a target size or a target bits per weight, not both")
        if bpw is not None and not (math.isfinite(bpw) and 0 < bpw <= 32):
            raise QuantizeError(f"--target-bpw {bpw:g} is outside (0, 32] (32 is F32)")
        if size is not None:
            if size <= 0:
                raise QuantizeError("the target size must be positive")
            if size > self.header_bytes + 4 * self.n_elements:
                raise QuantizeError(f"the target of {size:,} bytes is larger than the model in F32 "
                                    f"({self.header_bytes + 4 * self.n_elements:,} bytes)")
            target, smallest = size, self.smallest_file_bytes
            budget = size - self.header_bytes - self.fixed_file_bytes
        else:
            assert bpw is not None
            target, smallest = int(bpw * self.n_elements / 8), self.smallest_tensor_bytes
            budget = target - self.fixed_tensor_bytes
        if target < smallest:
            what = f"{size:,} bytes" if size is not None else f"{bpw:g} bits per weight ({target:,} bytes of tensors)"
            raise QuantizeError(f"the target of {what} is below the smallest mix of these types ({smallest:,} "
                                f"bytes, {self.bpw(self.smallest_tensor_bytes):.3f} bpw)")
        opts_of, items = self._items(costs, size is not None)
        try:
            sol = solve(items, budget)
        except BudgetError as exc:
            raise QuantizeError(str(exc)) from None
        choices = {c.name: qs[i] for c, qs, i in zip(costs, opts_of, sol.choice, strict=True)}
        return self._mix(choices, costs, sol)

    def _mix(self, choices: dict[str, str], costs: Sequence[TensorCosts], sol: Solution | None) -> Mix:
        tb = sum(self.tensor_bytes(n, q) for n, q in choices.items())
        fb = sum(self.padded(self.tensor_bytes(n, q)) for n, q in choices.items())
        by = {c.name: c for c in costs}
        cost = math.fsum(by[n].costs[q] for n, q in choices.items())
        return Mix(choices, self.header_bytes + self.fixed_file_bytes + fb, self.fixed_tensor_bytes + tb, cost, sol)

    def preset_mix(self, preset: str, costs: Sequence[TensorCosts]) -> Mix | None:
        """``preset``'s mix on the same scale as the solves (its bytes and its predicted divergence); None when it
        cannot be planned or a type it gives was not measured (see :meth:`measure_candidates`)."""
        types = self.preset_types(preset)
        by = {c.name: c for c in costs}
        if not types or any(q not in by[n].costs for n, q in types.items()):
            return None
        return self._mix(types, costs, None)

    def front(self, costs: Sequence[TensorCosts], points: int = 48) -> list[Mix]:
        """The size/divergence front: the best mix at ``points`` file sizes evenly spread from the smallest mix to
        the largest (each point a mix; the costs fall as the bytes grow)."""
        lo, hi = self.smallest_file_bytes, self.largest_file_bytes
        sizes = sorted({round(lo + (hi - lo) * k / max(points - 1, 1)) for k in range(points)})
        out: list[Mix] = []
        for s in sizes:
            m = self.solve(costs, size=max(s, lo))
            if not out or m.file_bytes != out[-1].file_bytes:
                out.append(m)
        return out

    def plan(self, mix: Mix, costs: Sequence[TensorCosts], budget: int, timings: dict[str, float] | None = None,
             by_file: bool = True) -> TargetPlan:
        """The quantize plan of ``mix`` (its rules fed to the ordinary quantizer): what the writer takes."""
        rules = [(rule_pattern(n), q) for n, q in mix.choices.items()]
        opts = _options(rules, self.imatrix, self.imatrix_label, self.allow_requantize, self.threads)
        plan = plan_quantize(self.f, opts)
        got = plan.file_bytes if by_file else plan.out_bytes
        if got > budget:  # the solver's arithmetic and the writer's layout disagree: a bug, never a silent overrun
            raise QuantizeError(f"internal error: the mix takes {got:,} bytes, over the target of {budget:,}")
        want = mix.file_bytes if by_file else mix.tensor_bytes
        if got != want:
            raise QuantizeError(f"internal error: the mix was predicted at {want:,} bytes, the writer lays out "
                                f"{got:,}")
        assert mix.solution is not None
        smallest = self.smallest_file_bytes if by_file else self.smallest_tensor_bytes
        return TargetPlan(plan, opts, dict(mix.choices), {c.name: c for c in costs}, rules, budget, smallest,
                          mix.cost, mix.solution, dict(timings or {}), by_file)


def target_space(f: GGUFFile, *, types: Sequence[str] = DEFAULT_TYPES, imatrix: Imatrix | None = None,
                 imatrix_label: str = "", allow_requantize: bool = False, threads: int = 0) -> TargetSpace:
    """Validate the file and the candidate types (the smallest mix is planned: every tensor, the requantizing, the
    imatrix shapes) before any measuring; raises :class:`.quantize.QuantizeError` or ValueError (one line)."""
    has_im = imatrix is not None and bool(imatrix.entries)
    im = imatrix if has_im else None
    cands = _candidates(f, check_types(types), has_im)
    quantizable = {n for n, _ in cands}
    n_elements = sum(t.n_elements for t in f.tensors)
    by_name = {t.name: t for t in f.tensors}

    def nbytes(name: str, q: str) -> int:
        t = by_name[name]
        return t.n_elements // t.ne[0] * ggml_type(q).row_bytes(t.ne[0])

    small_rules = [(rule_pattern(n), min(qs, key=lambda q, n=n: nbytes(n, q))) for n, qs in cands]
    small = plan_quantize(f, _options(small_rules, im, imatrix_label, allow_requantize, threads))
    align = small.alignment
    fixed = [j for j in small.jobs if j.info.name not in quantizable]
    return TargetSpace(f, cands, im, imatrix_label, allow_requantize, threads, len(small.header), align,
                       sum(-(-j.out_bytes // align) * align for j in fixed), sum(j.out_bytes for j in fixed),
                       n_elements, small.file_bytes, small.out_bytes)


def plan_target(f: GGUFFile, chunks: np.ndarray, *, size: int | None = None, bpw: float | None = None,
                types: Sequence[str] = DEFAULT_TYPES, imatrix: Imatrix | None = None, imatrix_label: str = "",
                allow_requantize: bool = False, cache_dir: str | os.PathLike[str] | None = None,
                exact: bool = False, threads: int = 0, progress: Progress | None = None) -> TargetPlan:
    """The least-cost mix within ``size`` file bytes (or ``bpw`` bits per weight over every tensor, as
    llama-quantize counts them); raises :class:`.quantize.QuantizeError` (one line) when it cannot be done."""
    if (size is None) == (bpw is None):
        raise QuantizeError("give a target size or a target bits per weight, not both")
    if bpw is not None and not (math.isfinite(bpw) and 0 < bpw <= 32):
        raise QuantizeError(f"--target-bpw {bpw:g} is outside (0, 32] (32 is F32)")
    if size is not None and size <= 0:
        raise QuantizeError("the target size must be positive")
    space = target_space(f, types=types, imatrix=imatrix, imatrix_label=imatrix_label,
                         allow_requantize=allow_requantize, threads=threads)
    costs_stub = [TensorCosts(n, {q: 0.0 for q in qs}, {}, {}, qs[0]) for n, qs in space.candidates]
    space.solve(costs_stub, size=size, bpw=bpw)  # refuses an impossible target before any measuring
    timings: dict[str, float] = {}
    costs = tensor_costs(f, space.candidates, chunks, imatrix=space.imatrix, cache_dir=cache_dir, exact=exact,
                         threads=threads, progress=progress, timings=timings)
    import time

    t0 = time.perf_counter()
    mix = space.solve(costs, size=size, bpw=bpw)
    timings["solve"] = time.perf_counter() - t0
    target = size if size is not None else int(bpw * space.n_elements / 8)  # type: ignore[operator]
    return space.plan(mix, costs, target, timings, by_file=size is not None)


@dataclass
class Refinement:
    """What :func:`refine_target` did: the mix after it, and the measured divergence of that whole mix."""

    plan: TargetPlan
    measured_kld: float  # the whole mix, measured on the calibration chunks
    predicted_before: float  # the solver's prediction before the refining
    swapped: list[tuple[str, str, str]]  # (tensor, type before, type after)
    newly_measured: int  # (tensor, type) pairs whose estimate was replaced by a measurement
    rounds: int


def refine_target(tp: TargetPlan, space: TargetSpace, chunks: np.ndarray, *, top: int = 8, rounds: int = 2,
                  candidates: Sequence[tuple[str, Sequence[str]]] | None = None,
                  cache_dir: str | os.PathLike[str] | None = None, progress: Progress | None = None,
                  cancel: Callable[[], bool] | None = None) -> Refinement:
    """After the solve: measure the chosen types whose cost was only estimated (the ``top`` largest estimates each
    round), solve again with the measurements, until the mix stops changing or ``rounds`` are done; then measure the
    whole mix's divergence once (the check on the sum of per-tensor costs). ``candidates`` are the (tensor, types)
    the costs were measured for (default: the space's)."""
    from .sensitivity import mix_kld

    cands = [(n, list(q)) for n, q in (candidates if candidates is not None else space.candidates)]
    by_file = tp.by_file
    size, bpw = (tp.budget, None) if by_file else (None, 8 * tp.budget / max(space.n_elements, 1))
    costs = [tp.costs[n] for n, _ in space.candidates]
    mix = Mix(dict(tp.choices), tp.plan.file_bytes, tp.plan.out_bytes, tp.predicted_cost, tp.solution)
    also: dict[str, list[str]] = {}
    fresh, done_rounds = 0, 0
    for _ in range(max(rounds, 0)):
        est = sorted(((c.costs[mix.choices[c.name]], c.name) for c in costs
                      if not c.measured.get(mix.choices[c.name])), reverse=True)[:max(top, 0)]
        if not est:
            break
        done_rounds += 1
        for _v, n in est:
            also.setdefault(n, []).append(mix.choices[n])
        fresh += len(est)
        full = tensor_costs(space.f, cands, chunks, imatrix=space.imatrix, cache_dir=cache_dir,
                            threads=space.threads, progress=progress, cancel=cancel, also=also)
        by = {c.name: c for c in full}
        costs = [by[n] for n, _ in space.candidates]
        new = space.solve(costs, size=size, bpw=bpw)
        changed = new.choices != mix.choices
        mix = new
        if not changed:
            break
    swapped = [(n, tp.choices[n], q) for n, q in mix.choices.items() if tp.choices[n] != q]
    measured = mix_kld(space.f, mix.choices, chunks, imatrix=space.imatrix, threads=space.threads,
                       progress=progress, cancel=cancel)
    plan = space.plan(mix, costs, tp.budget, tp.timings, by_file=by_file)
    return Refinement(plan, measured, tp.predicted_cost, swapped, fresh, done_rounds)
