"""What each candidate type of each tensor costs, measured on the model's output (docs/quantize.md, section 8).

The cost of giving tensor *t* type *q* is the mean KL divergence, over the positions of a calibration text, of the
model with only *t* quantized to *q* against the unquantized (reference) model: :class:`KLDMeter` keeps the
reference's residual stream at every layer and its log-probabilities, swaps one tensor's bytes in and runs only the
layers from that tensor's on. That costs about half a forward pass per (tensor, type); :func:`tensor_costs` measures
it for one type per tensor (the *anchor*: the smallest candidate, whose divergence stands farthest above the noise)
and extends it to the other types by the importance-weighted squared error of the requantized weights,

    cost(t, q) = KLD(t, anchor) * E(t, q) / E(t, anchor),   E(t, q) = sum_ij w_j (x_ij - q(x)_ij)^2,

(the second-order expansion of the divergence in a small weight change, with the tensor's own sensitivity measured
rather than assumed); ``exact=True`` measures every type instead. ``tests/bench/bench_target_size.py`` checks that
the extension ranks like the measurement. Measurements are cached by (file identity, calibration tokens, imatrix,
tensor, type), so a second run reuses them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..base.ggml_types import ggml_type
from ..filestate import content_identity
from ..gguf import GGUFFile
from ..model import ModelWeights, Weight
from .imatrix import Imatrix
from .mixture import layer_of

CACHE_VERSION = 1
#: rows of a tensor the weighted error is estimated on (evenly spaced; every row below this)
PROXY_ROWS = 4096

Progress = Callable[[int, int, str], None]


class CostCancelled(Exception):
    """The caller cancelled the measurement (what was measured so far is in the cache)."""


def file_identity(path: str | os.PathLike[str]) -> str:
    """A file's identity for the cache (:func:`~quantscope.core.filestate.content_identity`)."""
    return content_identity(os.fspath(path))


def calibration_identity(tokens: np.ndarray, imatrix: Imatrix | None) -> str:
    """The calibration chunks' token ids and the importance data the tensors are quantized with."""
    h = hashlib.sha256(f"v{CACHE_VERSION}:{tokens.shape}".encode())
    h.update(np.ascontiguousarray(tokens, dtype="<i8").tobytes())
    if imatrix is not None:
        for name in sorted(imatrix.entries):
            w = imatrix.weights(name)
            h.update(name.encode("utf-8", "surrogateescape"))
            if w is not None:
                h.update(np.ascontiguousarray(w, dtype="<f4").tobytes())
    return h.hexdigest()[:32]


class CostCache:
    """Measured divergences of one (file, calibration) pair, kept in a JSON file under ``directory``."""

    def __init__(self, directory: str | os.PathLike[str] | None, file_id: str, calib_id: str) -> None:
        self.path = Path(directory) / f"kld-{file_id}-{calib_id}.json" if directory is not None else None
        self.values: dict[str, float] = {}
        if self.path is not None and self.path.is_file():
            try:
                data = json.loads(self.path.read_text(encoding="utf-8"))
                if data.get("version") == CACHE_VERSION:
                    self.values = {str(k): float(v) for k, v in data.get("kld", {}).items()
                                   if isinstance(v, (int, float)) and math.isfinite(v)}
            except (OSError, ValueError, AttributeError):
                self.values = {}  # a damaged cache is measured again

    @staticmethod
    def key(tensor: str, qtype: str) -> str:
        return f"{tensor}|{qtype}"

    def get(self, tensor: str, qtype: str) -> float | None:
        return self.values.get(self.key(tensor, qtype))

    def put(self, tensor: str, qtype: str, value: float) -> None:
        self.values[self.key(tensor, qtype)] = float(value)

    def save(self) -> None:
        """Write through a temporary and a rename (a reader never sees half a file)."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".kld-", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"version": CACHE_VERSION, "kld": self.values}, fh)
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise


def _replace_weight(obj: object, name: str, raw: np.ndarray, qtype: str, seen: dict[int, object],
                    origin: int = 0) -> object:
    """``obj`` (a ModelWeights or part of it) with every matrix read from tensor ``name`` (or a row block of it,
    ``name[part]``, found by its address against ``origin``, the tensor's first byte) replaced by the same rows of
    ``raw`` in ``qtype``; shared objects stay shared."""
    if id(obj) in seen:
        return seen[id(obj)]
    out: object = obj
    if isinstance(obj, Weight):
        if obj.name == name or obj.name.startswith(name + "["):
            t = ggml_type(qtype)
            src_rb = obj.type.row_bytes(obj.k)
            base = np.asarray(raw).reshape(-1)
            row0 = 0
            if obj.name != name:  # a row block of a fused tensor: its first row from its offset in the tensor
                row0 = (obj.data.__array_interface__["data"][0] - origin) // src_rb
            rb = t.row_bytes(obj.k)
            out = Weight(obj.name, t, base[row0 * rb:(row0 + obj.rows) * rb], obj.rows, obj.k)
    elif isinstance(obj, list):
        items = [_replace_weight(x, name, raw, qtype, seen, origin) for x in obj]
        out = items if any(a is not b for a, b in zip(items, obj, strict=True)) else obj
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {}
        for fld in dataclasses.fields(obj):
            v = getattr(obj, fld.name)
            if isinstance(v, (Weight, list)) or (dataclasses.is_dataclass(v) and not isinstance(v, type)):
                nv = _replace_weight(v, name, raw, qtype, seen, origin)
                if nv is not v:
                    changes[fld.name] = nv
        out = dataclasses.replace(obj, **changes) if changes else obj  # type: ignore[type-var]
    seen[id(obj)] = out
    return out


def uses(weights: ModelWeights, name: str) -> bool:
    """Does the engine read tensor ``name`` (as a matrix)?"""
    probe = np.zeros(0, np.uint8)
    return _replace_weight(weights, name, probe, weights.tok_embd.type.name, {}) is not weights


class KLDMeter:
    """The reference model's output on calibration chunks, and the divergence from it of the same model with one
    tensor's bytes replaced."""

    def __init__(self, f: GGUFFile, chunks: np.ndarray, threads: int = 0,
                 cancel: Callable[[], bool] | None = None) -> None:
        """Run the reference over ``chunks``, one forward pass per chunk (``cancel`` is asked before each one and
        raises :class:`CostCancelled`)."""
        from ..engine.session import ForwardTrace, Model
        from ..tokenizer import Tokenizer

        self.model = Model(f, threads)
        self.threads = self.model.threads
        tok = Tokenizer(f)
        self.chunks = np.asarray(chunks, dtype=np.int64)
        if self.chunks.ndim != 2 or self.chunks.shape[1] < 2:
            raise ValueError("calibration chunks must be (n_chunks, n_ctx >= 2) token ids")
        self.n_ctx = int(self.chunks.shape[1])
        self.ids: list[list[int]] = []
        self.resid: list[list[np.ndarray]] = []
        self.base_logp: list[np.ndarray] = []
        session = self.model.session(self.n_ctx)
        for chunk in self.chunks:
            if cancel is not None and cancel():
                raise CostCancelled("measuring was cancelled")
            ids = [int(t) for t in chunk]
            if tok.add_bos and tok.bos_id is not None:
                ids[0] = tok.bos_id
            session.reset()
            trace = ForwardTrace()
            logits = session.forward(ids, all_logits=True, trace=trace)
            self.ids.append(ids)
            self.resid.append(trace.resid)
            self.base_logp.append(_log_softmax(logits))
        c = self.model.config
        self.resumable = not c.ple_dim and all(c.kv_source(i) == i for i in range(c.n_layers))

    def first_layer(self, name: str) -> int:
        """The first layer whose input a change of ``name`` alters: -1 for the embedding (all of them), n_layers
        for the output head alone."""
        n = self.model.config.n_layers
        if name == "output.weight" and not self.model.weights.tied:
            return n
        li = layer_of(name)
        return li if 0 <= li < n and self.resumable else -1

    def kld(self, name: str, raw: np.ndarray, qtype: str) -> float:
        """Mean KL(reference || model with tensor ``name`` as ``raw`` bytes of ``qtype``) over every position."""
        return self.kld_mix({name: (raw, qtype)})

    def kld_mix(self, swaps: dict[str, tuple[np.ndarray, str]], cancel: Callable[[], bool] | None = None) -> float:
        """Mean KL(reference || model with every tensor of ``swaps`` replaced by its (bytes, type)) over every
        position: a whole mix measured at once, not the sum of its tensors' costs (``cancel``: asked before each
        chunk)."""
        from ..engine.session import Model

        f = self.model.file
        assert f is not None
        weights = self.model.weights
        for name, (raw, qtype) in swaps.items():
            origin = f.tensor_bytes(f.tensor(name)).__array_interface__["data"][0]
            before = weights
            weights = _replace_weight(weights, name, raw, qtype, {}, origin)
            if weights is before:
                raise ValueError(f"the engine does not read tensor {name}")
        m = Model(None, self.threads, weights=weights)  # type: ignore[arg-type]
        s = m.session(self.n_ctx)
        first = min((self.first_layer(n) for n in swaps), default=m.config.n_layers)
        total, count = 0.0, 0
        for ids, resid, base in zip(self.ids, self.resid, self.base_logp, strict=True):
            if cancel is not None and cancel():
                raise CostCancelled("measuring was cancelled")
            if first < 0:
                s.reset()
                logits = s.forward(ids, all_logits=True)
            elif first == m.config.n_layers:
                logits = s.head(resid[-1])
            else:
                logits = s.forward_from(resid[first], first)
            ours = _log_softmax(logits)
            p = np.exp(base.astype(np.float64))
            total += float((p * (base - ours)).sum())
            count += base.shape[0]
        return max(total / count, 0.0)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    lg = np.asarray(logits, dtype=np.float64)
    mx = lg.max(axis=1, keepdims=True)
    return (lg - (mx + np.log(np.exp(lg - mx).sum(axis=1, keepdims=True)))).astype(np.float32)


def weighted_errors(values: np.ndarray, types: Sequence[str], imatrix: np.ndarray | None,
                    threads: int = 0) -> dict[str, float]:
    """E(q) = sum of w_j (x - q(x))^2 over ``values`` (rows x ne0) for each type (w = 1 without importance data)."""
    from .lab import requantize

    n_cols = values.shape[1]
    w = None
    if imatrix is not None:
        w = np.asarray(imatrix, np.float64).reshape(-1, n_cols)
    out = {}
    for q in types:
        _, y = requantize(values, q, imatrix, threads=threads)
        d2 = (values.astype(np.float64) - y) ** 2
        if w is None:
            out[q] = float(d2.sum())
        else:  # per expert: the rows split evenly over the weight vectors
            per = d2.reshape(w.shape[0], -1, n_cols)
            out[q] = float((per * w[:, None, :]).sum())
    return out


@dataclass
class TensorCosts:
    """One tensor's cost per candidate type, and how each was obtained."""

    name: str
    costs: dict[str, float]
    measured: dict[str, bool]  # True: KL divergence measured; False: extended by the weighted error
    errors: dict[str, float]  # the weighted squared error E(t, q)
    anchor: str


def tensor_costs(f: GGUFFile, candidates: Sequence[tuple[str, Sequence[str]]], chunks: np.ndarray, *,
                 imatrix: Imatrix | None = None, cache_dir: str | os.PathLike[str] | None = None,
                 exact: bool = False, threads: int = 0, progress: Progress | None = None,
                 cancel: Callable[[], bool] | None = None,
                 timings: dict[str, float] | None = None,
                 also: dict[str, Sequence[str]] | None = None) -> list[TensorCosts]:
    """The cost of every (tensor, type) in ``candidates`` (tensor name, its candidate types): the KL divergence
    measured at the anchor type (every type with ``exact``; and the types ``also`` names for a tensor), extended by
    the weighted error (module docstring). A candidate equal to the tensor's own type costs 0 (the bytes are
    copied)."""
    import time

    from .lab import requantize, sample_rows, tensor_values

    t_start = time.perf_counter()
    tm = timings if timings is not None else {}
    cache = CostCache(cache_dir, file_identity(f.paths[0]), calibration_identity(chunks, imatrix))
    meter: KLDMeter | None = None
    out: list[TensorCosts] = []
    todo = len(candidates)
    for k, (name, types) in enumerate(candidates):
        if cancel is not None and cancel():
            cache.save()
            raise CostCancelled("measuring was cancelled")
        if progress is not None:
            progress(k, todo, name)
        t = f.tensor(name)
        src = t.type_name
        keep = src in types  # the tensor's own type: copied, at no cost
        types = [q for q in types if q != src]
        w = imatrix.weights(name) if imatrix is not None else None
        if w is not None and w.size % t.ne[0]:
            w = None
        ordered = sorted(types, key=lambda q: ggml_type(q).row_bytes(t.ne[0]))
        if len(ordered) + keep <= 1:  # one option: nothing to choose, nothing to measure
            only = ordered[0] if ordered else src
            out.append(TensorCosts(name, {only: 0.0}, {only: False}, {}, only))
            continue
        t0 = time.perf_counter()
        values_all: np.ndarray | None = None
        errs = {q: cache.get("E:" + name, q) for q in ordered}
        if any(v is None for v in errs.values()):
            values_all = tensor_values(f, name, threads=threads)
            rows = sample_rows(values_all.shape[0], PROXY_ROWS, w.size // t.ne[0] if w is not None else 1)
            errs = dict(weighted_errors(values_all[rows], ordered, w, threads))
            for q, v in errs.items():
                cache.put("E:" + name, q, v)
        tm["error"] = tm.get("error", 0.0) + time.perf_counter() - t0
        anchor = ordered[0] if ordered else src
        extra = set((also or {}).get(name, ()))
        want = ordered if exact else ordered[:1] + [q for q in ordered[1:] if q in extra]
        kl: dict[str, float] = {}
        for q in want:
            v = cache.get(name, q)
            if v is None:
                t0 = time.perf_counter()
                if values_all is None:
                    values_all = tensor_values(f, name, threads=threads)
                if meter is None:
                    try:
                        meter = KLDMeter(f, chunks, threads, cancel)
                    except CostCancelled:
                        cache.save()
                        raise
                    tm["reference"] = time.perf_counter() - t0
                    t0 = time.perf_counter()
                raw, _ = requantize(values_all, q, w, threads=threads)
                v = meter.kld(name, raw, q)
                cache.put(name, q, v)
                tm["kld"] = tm.get("kld", 0.0) + time.perf_counter() - t0
                tm["kld_runs"] = tm.get("kld_runs", 0) + 1
            kl[q] = v
        costs: dict[str, float] = {src: 0.0} if keep else {}
        measured: dict[str, bool] = {src: True} if keep else {}
        for q in ordered:
            if q in kl:
                costs[q], measured[q] = kl[q], True
            else:
                ea, eq = errs.get(anchor) or 0.0, errs.get(q) or 0.0
                costs[q] = kl[anchor] * eq / ea if ea > 0 else 0.0
                measured[q] = False
        out.append(TensorCosts(name, costs, measured, {q: float(v or 0.0) for q, v in errs.items()}, anchor))
        if (k + 1) % 16 == 0:
            cache.save()
    cache.save()
    if progress is not None:
        progress(todo, todo, "")
    tm["total"] = time.perf_counter() - t_start
    return out


def mix_kld(f: GGUFFile, choices: dict[str, str], chunks: np.ndarray, *, imatrix: Imatrix | None = None,
            threads: int = 0, progress: Progress | None = None, cancel: Callable[[], bool] | None = None,
            meter: KLDMeter | None = None) -> float:
    """The measured mean KL divergence of the whole mix ``choices`` (tensor -> type; a tensor's own type is copied)
    against ``f`` on ``chunks``: every chosen tensor requantized (with the imatrix, as the writer would) and the
    model run once -- the check on the sum of the per-tensor costs the solver predicts."""
    from .lab import requantize, tensor_values

    swaps: dict[str, tuple[np.ndarray, str]] = {}
    todo = [(n, q) for n, q in choices.items() if q != f.tensor(n).type_name]
    for k, (name, q) in enumerate(todo):
        if cancel is not None and cancel():
            raise CostCancelled("measuring was cancelled")
        if progress is not None:
            progress(k, len(todo) + 1, name)
        t = f.tensor(name)
        w = imatrix.weights(name) if imatrix is not None else None
        if w is not None and w.size % t.ne[0]:
            w = None
        raw, _ = requantize(tensor_values(f, name, threads=threads), q, w, threads=threads)
        swaps[name] = (raw, q)
    if progress is not None:
        progress(len(todo), len(todo) + 1, "the whole mix")
    m = meter if meter is not None else KLDMeter(f, chunks, threads, cancel)
    out = m.kld_mix(swaps, cancel) if swaps else 0.0
    if progress is not None:
        progress(len(todo) + 1, len(todo) + 1, "")
    return out


def sensitivity_report(f: GGUFFile, costs: Sequence[TensorCosts]) -> dict[str, object]:
    """For people who choose the types by hand: per tensor, the KL divergence each type adds (measured or extended
    by the weighted error); per layer, the divergence each type adds to the layer's tensors together (the sum over
    the tensors that can take it, with their count); a JSON-ready dict."""
    types = sorted({q for c in costs for q in c.costs}, key=lambda q: (ggml_type(q).bits_per_weight, q))
    tensors = []
    layers: dict[int, dict[str, list[float]]] = {}
    names: dict[int, list[str]] = {}
    for c in costs:
        t = f.tensor(c.name)
        li = layer_of(c.name)
        tensors.append({"name": c.name, "layer": li, "type": t.type_name, "shape": list(t.ne), "anchor": c.anchor,
                        "kld": {q: {"value": c.costs[q], "measured": bool(c.measured.get(q))} for q in types
                                if q in c.costs}})
        names.setdefault(li, []).append(c.name)
        per = layers.setdefault(li, {})
        for q, v in c.costs.items():
            per.setdefault(q, []).append(v)
    rows = []
    for li in sorted(layers):
        rows.append({"layer": li, "tensors": len(names[li]),
                     "kld": {q: {"sum": math.fsum(layers[li][q]), "tensors": len(layers[li][q])} for q in types
                             if q in layers[li]}})
    return {"types": types, "tensors": tensors, "layers": rows}
