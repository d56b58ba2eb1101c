"""Numbers the explorer shows about a GGUF file beyond its header: tensor statistics, histograms and heatmaps,
KV-cache memory, integrity checks, a NaN/Inf scan of block scales, and the geometry of a decoded block.

Plain numpy over :class:`~quantscope.core.gguf.GGUFFile`; no Qt. Long computations stream the tensor in chunks
of rows (bounded memory), dequantize them with the native kernels (which release the GIL, so a GUI thread keeps
running), report ``progress(done, total)`` in bytes and stop at the next chunk when ``cancel.cancelled`` is set,
raising :class:`AnalysisCancelled`.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

import numpy as np

from .filestate import FileChangedError
from .fsutil import open_input
from .gguf import GGUFFile, StringArray, TensorInfo
from .jobs import CancelFlag, Cancelled, check_cancel
from .native import kernels as native
from .quant import DecodedBlock, GGMLType, can_decode, decode_block, ggml_type
from .quant import can_dequantize as ref_can_dequantize
from .quant import dequantize as ref_dequantize

Progress = Callable[[int, int], None]

#: Plain (one element per "block") integer types, dequantized by a dtype cast.
_INT_DTYPES = {"I8": "<i1", "I16": "<i2", "I32": "<i4", "I64": "<i8", "F64": "<f8"}


class AnalysisCancelled(Cancelled):
    """A long computation stopped because its cancel token was set."""


def _check(cancel: CancelFlag | None) -> None:
    check_cancel(cancel, AnalysisCancelled)


# ---------------------------------------------------------------------------------------------- dequantization
def can_read_values(t: TensorInfo) -> bool:
    """True when the tensor's values can be computed (known, supported type and no problem)."""
    if t.type is None or t.problem is not None or t.n_bytes is None:
        return False
    name = t.type.name
    return name in _INT_DTYPES or native.can_dequantize(t.type) or ref_can_dequantize(t.type)


def dequantize_rows(f: GGUFFile, t: TensorInfo, start: int, stop: int, *, threads: int = 1) -> np.ndarray:
    """Rows ``[start, stop)`` of ``t`` (flattened over ``ne[1:]``) as float32 of shape ``(stop-start, ne0)``.

    Native kernels where they exist, else the numpy reference; integer and F64 tensors are cast."""
    if not can_read_values(t):
        raise NotImplementedError(f"{t.name}: values of {t.type_name} cannot be computed"
                                  + (f" ({t.problem})" if t.problem else ""))
    assert t.type is not None
    start, stop = max(0, start), min(t.n_rows, stop)
    rows = f.tensor_rows(t)[start:stop]
    name = t.type.name
    if name in _INT_DTYPES:
        return native.copy_mapped(rows, t.name).view(_INT_DTYPES[name]).astype(np.float32)
    if native.can_dequantize(t.type):
        return native.dequantize(rows, t.type, threads=threads)
    return ref_dequantize(native.copy_mapped(rows, t.name), t.type)  # numpy reads a copy: a truncation cannot kill


def _rows_per_chunk(t: TensorInfo, chunk_elems: int) -> int:
    return max(1, chunk_elems // max(1, t.row_len))


# ---------------------------------------------------------------------------------------------- statistics
@dataclass(frozen=True)
class TensorStats:
    """Summary of a tensor's dequantized values. min/max/mean/std are over the finite values (NaN when none)."""

    n_elements: int
    n_nan: int
    n_inf: int
    n_zero: int
    min: float
    max: float
    mean: float
    std: float

    @property
    def n_finite(self) -> int:
        return self.n_elements - self.n_nan - self.n_inf


@dataclass(frozen=True)
class Histogram:
    """``counts[i]`` finite values fell in ``[edges[i], edges[i+1])`` (the last bin is closed)."""

    counts: np.ndarray
    edges: np.ndarray

    @property
    def centers(self) -> np.ndarray:
        return (self.edges[:-1] + self.edges[1:]) / 2


@dataclass(frozen=True)
class HeatCell:
    """The matrix region one heatmap pixel covers (rows ``row0..row1-1``, columns ``col0..col1-1``)."""

    i: int
    j: int
    row0: int
    row1: int
    col0: int
    col1: int
    mean: float
    rms: float


@dataclass(frozen=True)
class Heatmap:
    """A downsampled view of rows ``[row0, row0+n_rows)`` × columns ``[col0, col0+n_cols)`` of a tensor's 2-D
    matrix (``n_rows`` = rows over ``ne[1:]``, columns = ``ne[0]``).

    Pixel ``(i, j)`` covers ``row_step`` rows × ``col_step`` columns; ``mean`` holds the mean of its finite
    values and ``rms`` the root mean square (both NaN where a cell has none). With steps of 1 ``mean`` is the
    matrix itself.
    """

    mean: np.ndarray
    rms: np.ndarray
    row0: int
    col0: int
    n_rows: int
    n_cols: int
    row_step: int
    col_step: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.mean.shape  # type: ignore[return-value]

    @property
    def exact(self) -> bool:
        """True when every pixel is one element."""
        return self.row_step == 1 and self.col_step == 1

    def cell_at(self, row: int, col: int) -> HeatCell | None:
        """The pixel covering matrix element ``(row, col)``, or ``None`` outside the map."""
        i = (row - self.row0) // self.row_step
        j = (col - self.col0) // self.col_step
        h, w = self.shape
        if not (0 <= i < h and 0 <= j < w) or row < self.row0 or col < self.col0:
            return None
        r0 = self.row0 + i * self.row_step
        c0 = self.col0 + j * self.col_step
        return HeatCell(i, j, r0, min(r0 + self.row_step, self.row0 + self.n_rows), c0,
                        min(c0 + self.col_step, self.col0 + self.n_cols), float(self.mean[i, j]),
                        float(self.rms[i, j]))

    def levels(self, image: str = "mean", percentile: float = 99.5) -> tuple[float, float]:
        """Colour limits: symmetric ``±p`` (the ``percentile`` of ``|mean|``) or ``[0, p]`` for ``rms``."""
        a = self.rms if image == "rms" else self.mean
        finite = np.abs(a[np.isfinite(a)])
        top = float(np.percentile(finite, percentile)) if finite.size else 1.0
        top = top if top > 0 else (float(finite.max()) if finite.size and finite.max() > 0 else 1.0)
        return (0.0, top) if image == "rms" else (-top, top)


@dataclass(frozen=True)
class TensorAnalysis:
    """Statistics, histogram and heatmap of one tensor, and how long they took."""

    tensor: str
    stats: TensorStats
    histogram: Histogram
    heatmap: Heatmap
    seconds: float


def _steps(n: int, limit: int) -> int:
    return max(1, math.ceil(n / max(1, limit)))


def analyze_tensor(f: GGUFFile, t: TensorInfo | str, *, bins: int = 128, heat_size: tuple[int, int] = (512, 512),
                   threads: int = 1, chunk_elems: int = 1 << 20, progress: Progress | None = None,
                   cancel: CancelFlag | None = None) -> TensorAnalysis:
    """Stream the tensor twice: statistics and the heatmap, then the histogram over ``[min, max]``.

    ``heat_size`` = (max rows, max columns) of the heatmap. Progress is in elements, over both passes."""
    t0 = time.perf_counter()
    if isinstance(t, str):
        t = f.tensor(t)
    n_rows, row_len = t.n_rows, t.row_len
    total = 2 * t.n_elements
    chunk = _rows_per_chunk(t, chunk_elems)
    rs, cs = _steps(n_rows, heat_size[0]), _steps(row_len, heat_size[1])
    chunk = max(rs, chunk // rs * rs)  # whole heatmap rows per chunk
    acc = _HeatAccumulator(n_rows, row_len, rs, cs, 0, 0)
    n_nan = n_inf = n_zero = 0
    vmin, vmax = math.inf, -math.inf
    s1 = s2 = 0.0
    done = 0
    with np.errstate(invalid="ignore", over="ignore"):
        for a in range(0, n_rows, chunk):
            _check(cancel)
            x = dequantize_rows(f, t, a, a + chunk, threads=threads)
            fin = np.isfinite(x)
            n_bad = x.size - int(np.count_nonzero(fin))
            if n_bad:
                nan = int(np.count_nonzero(np.isnan(x)))
                n_nan += nan
                n_inf += n_bad - nan
                xf = x[fin]
            else:
                xf = x.reshape(-1)
            if xf.size:
                vmin = min(vmin, float(xf.min()))
                vmax = max(vmax, float(xf.max()))
                s1 += float(np.sum(xf, dtype=np.float64))
                s2 += float(np.dot(xf, xf))
                n_zero += int(np.count_nonzero(xf == 0))
            acc.add(a, x, fin if n_bad else None)
            done += x.size
            if progress:
                progress(done, total)
        n_fin = t.n_elements - n_nan - n_inf
        if n_fin:
            mean = s1 / n_fin
            std = math.sqrt(max(0.0, s2 / n_fin - mean * mean))
        else:
            mean = std = vmin = vmax = math.nan
        stats = TensorStats(t.n_elements, n_nan, n_inf, n_zero, vmin, vmax, mean, std)
        lo, hi = (vmin, vmax) if n_fin else (-1.0, 1.0)
        if hi <= lo:
            lo, hi = lo - 0.5, hi + 0.5
        counts = np.zeros(bins, dtype=np.int64)
        scale = bins / (hi - lo)
        for a in range(0, n_rows, chunk):
            _check(cancel)
            x = dequantize_rows(f, t, a, a + chunk, threads=threads).reshape(-1)
            fin = np.isfinite(x)
            if not fin.all():
                x = x[fin]
            y = x.astype(np.float64)
            y -= lo
            y *= scale
            np.clip(y, 0, bins - 0.5, out=y)
            counts += np.bincount(y.astype(np.uint8 if bins <= 256 else np.intp), minlength=bins)
            done += min(chunk, n_rows - a) * row_len
            if progress:
                progress(done, total)
    hist = Histogram(counts, np.linspace(lo, hi, bins + 1))
    return TensorAnalysis(t.name, stats, hist, acc.result(), time.perf_counter() - t0)


class _HeatAccumulator:
    """Sums, sums of squares and finite counts per heatmap pixel, filled chunk by chunk of rows."""

    def __init__(self, n_rows: int, n_cols: int, row_step: int, col_step: int, row0: int, col0: int) -> None:
        self.n_rows, self.n_cols, self.rs, self.cs = n_rows, n_cols, row_step, col_step
        self.row0, self.col0 = row0, col0
        h, w = math.ceil(n_rows / row_step), math.ceil(n_cols / col_step)
        self.s1 = np.zeros((h, w), np.float64)
        self.s2 = np.zeros((h, w), np.float64)
        self.n = np.zeros((h, w), np.int64)
        self.col_starts = np.arange(0, n_cols, col_step)

    def add(self, row: int, x: np.ndarray, finite: np.ndarray | None) -> None:
        """Add rows ``row..row+len(x)-1`` (relative to ``row0``); ``row`` must be a multiple of the row step.

        Rows are reduced first (whole contiguous rows at a time), then the much smaller result by columns."""
        starts = np.arange(0, x.shape[0], self.rs)
        if finite is not None:
            x = np.where(finite, x, np.float32(0))
        r1 = np.add.reduceat(x, starts, axis=0, dtype=np.float64)
        r2 = np.add.reduceat(np.square(x), starts, axis=0, dtype=np.float64)
        i0 = row // self.rs
        i1 = i0 + starts.size
        self.s1[i0:i1] += np.add.reduceat(r1, self.col_starts, axis=1)
        self.s2[i0:i1] += np.add.reduceat(r2, self.col_starts, axis=1)
        if finite is None:
            widths = np.diff(np.append(self.col_starts, x.shape[1]))
            heights = np.diff(np.append(starts, x.shape[0]))
            self.n[i0:i1] += heights[:, None] * widths[None, :]
        else:
            cnt = np.add.reduceat(finite, starts, axis=0, dtype=np.int64)
            self.n[i0:i1] += np.add.reduceat(cnt, self.col_starts, axis=1)

    def result(self) -> Heatmap:
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = (self.s1 / self.n).astype(np.float32)
            rms = np.sqrt(self.s2 / self.n).astype(np.float32)
        return Heatmap(mean, rms, self.row0, self.col0, self.n_rows, self.n_cols, self.rs, self.cs)


def heatmap(f: GGUFFile, t: TensorInfo | str, *, rows: tuple[int, int] | None = None,
            cols: tuple[int, int] | None = None, size: tuple[int, int] = (512, 512), threads: int = 1,
            chunk_elems: int = 1 << 20, progress: Progress | None = None,
            cancel: CancelFlag | None = None) -> Heatmap:
    """Heatmap of a region (default: the whole matrix) downsampled to at most ``size`` = (rows, columns)."""
    if isinstance(t, str):
        t = f.tensor(t)
    r0, r1 = rows or (0, t.n_rows)
    c0, c1 = cols or (0, t.row_len)
    r0, r1 = max(0, r0), min(t.n_rows, r1)
    c0, c1 = max(0, c0), min(t.row_len, c1)
    if r1 <= r0 or c1 <= c0:
        raise ValueError(f"empty region rows {r0}..{r1}, columns {c0}..{c1} of {t.name}")
    nr, nc = r1 - r0, c1 - c0
    rs, cs = _steps(nr, size[0]), _steps(nc, size[1])
    chunk = _rows_per_chunk(t, chunk_elems)
    chunk = max(rs, chunk // rs * rs)
    acc = _HeatAccumulator(nr, nc, rs, cs, r0, c0)
    with np.errstate(invalid="ignore", over="ignore"):
        for a in range(0, nr, chunk):
            _check(cancel)
            x = dequantize_rows(f, t, r0 + a, r0 + min(nr, a + chunk), threads=threads)[:, c0:c1]
            fin = np.isfinite(x)
            acc.add(a, x, None if fin.all() else fin)
            if progress:
                progress(min(nr, a + chunk) * nc, nr * nc)
    return acc.result()


def element_location(t: TensorInfo, row: int, col: int) -> tuple[int, int]:
    """``(block, element)``: which block of row ``row`` holds column ``col``, and its index in that block."""
    if t.type is None:
        raise ValueError(f"{t.name} has an unknown type")
    if not (0 <= row < t.n_rows and 0 <= col < t.row_len):
        raise IndexError(f"({row}, {col}) is outside {t.name}'s {t.n_rows} × {t.row_len} matrix")
    return divmod(col, t.type.block_elems)


def blocks_per_row(t: TensorInfo) -> int:
    """Blocks in one row of ``t`` (0 for an unknown type)."""
    return 0 if t.type is None else t.row_len // t.type.block_elems


# ---------------------------------------------------------------------------------------------- grouping
_BLOCK_RE = re.compile(r"^(blk\.\d+)\.")


def block_group(name: str) -> str:
    """The layer a tensor belongs to (``blk.7``), or ``""`` for tensors outside the repeated blocks."""
    m = _BLOCK_RE.match(name)
    return m.group(1) if m else ""


def group_sort_key(group: str) -> tuple[int, int]:
    """Sort key putting non-layer tensors first, then ``blk.0``, ``blk.1`` … numerically."""
    return (0, 0) if not group else (1, int(group.split(".")[1]))


def weights_by_layer(f: GGUFFile) -> list[tuple[str, int]]:
    """Tensor bytes per layer (``""`` = outside the blocks), in layer order."""
    acc: dict[str, int] = {}
    for t in f.tensors:
        g = block_group(t.name)
        acc[g] = acc.get(g, 0) + (t.n_bytes or 0)
    return sorted(acc.items(), key=lambda kv: group_sort_key(kv[0]))


# ---------------------------------------------------------------------------------------------- memory
KV_TYPES = ("F16", "BF16", "F32", "Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0")


@dataclass(frozen=True)
class MemoryPlan:
    """Memory to run a model: weights (as stored) plus the KV cache for ``context`` tokens.

    KV cache = layers × context × kv_heads × (key_length + value_length) elements of ``kv_type``; an upper
    bound for sliding-window models (``note`` says so)."""

    context: int
    kv_type: str
    weights_bytes: int
    kv_bytes: int
    kv_bytes_per_token: int
    n_layers: int
    n_kv_heads: int
    key_length: int
    value_length: int
    note: str = ""
    state_bytes: int = 0  # recurrent layers (qwen35's gated delta-net): conv inputs + state matrices, float32
    n_recurrent: int = 0  # layers with a recurrent state instead of a KV cache (not in n_layers)

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.state_bytes


def metadata_int(v: object) -> int | None:
    """An integer metadata value as ``int``; ``None`` for anything else (bool, float, string, array, absent)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        return None
    return int(v)


def _int_key(f: GGUFFile, suffix: str) -> int | None:
    """A non-negative integer hyperparameter (the maximum of a per-layer array), else ``None``."""
    v = f.arch_get(suffix) if f.architecture else None
    if isinstance(v, np.ndarray):  # per-layer arrays (e.g. head_count_kv on some models): take the maximum
        v = v.max() if v.size and v.dtype.kind in "iu" else None
    n = metadata_int(v)
    return n if n is not None and n >= 0 else None


def memory_plan(f: GGUFFile, context: int | None = None, kv_type: str = "F16") -> MemoryPlan:
    """Weights plus KV cache for ``context`` tokens (default: the model's context length)."""
    weights = sum(t.n_bytes or 0 for t in f.tensors)
    n_layers = _int_key(f, "block_count") or len({block_group(t.name) for t in f.tensors} - {""})
    heads = _int_key(f, "attention.head_count") or 0
    kv_heads = _int_key(f, "attention.head_count_kv") or heads
    embed = _int_key(f, "embedding_length") or 0
    head_dim = embed // heads if heads else 0
    k_len = _int_key(f, "attention.key_length") or head_dim
    v_len = _int_key(f, "attention.value_length") or head_dim
    ctx = context if context is not None else (_int_key(f, "context_length") or 0)
    if ctx < 0:
        raise ValueError(f"context must be non-negative, got {ctx}")
    kt = ggml_type(kv_type)
    n_rec, state = _recurrent_state(f)
    n_layers = max(0, n_layers - n_rec)
    per_row_k = _kv_row_bytes(kt, k_len)
    per_row_v = _kv_row_bytes(kt, v_len)
    per_token = n_layers * kv_heads * (per_row_k + per_row_v)
    note = ""
    window = _int_key(f, "attention.sliding_window")
    if window:
        note = (f"{f.architecture} uses sliding-window attention (window {window}) on some layers; llama.cpp "
                "keeps a smaller cache for those, so this is an upper bound")
    return MemoryPlan(ctx, kt.name, weights, per_token * ctx, per_token, n_layers, kv_heads, k_len, v_len, note,
                      state, n_rec)


def _recurrent_state(f: GGUFFile) -> tuple[int, int]:
    """(layers, bytes) of the recurrent state llama.cpp keeps per sequence (float32): layers with an
    ``ssm_conv1d`` tensor hold their last ``conv_kernel - 1`` conv inputs and, for the gated delta-net
    (``ssm.time_step_rank`` heads), a state_size x state_size matrix per head, else (Mamba) inner_size x
    state_size values. (0, 0) for models without such layers."""
    convs = [t for t in f.tensors if t.name.endswith(".ssm_conv1d.weight") and len(t.ne) == 2]
    if not convs:
        return 0, 0
    k = _int_key(f, "ssm.conv_kernel") or convs[0].ne[0]
    d_state = _int_key(f, "ssm.state_size") or 0
    heads = _int_key(f, "ssm.time_step_rank") or 0
    inner = _int_key(f, "ssm.inner_size") or 0
    per = max(0, k - 1) * convs[0].ne[1] + (heads * d_state * d_state if heads else inner * d_state)
    return len(convs), 4 * len(convs) * per


def _kv_row_bytes(t: GGMLType, n: int) -> int:
    if n % t.block_elems:  # ggml pads: whole blocks
        n = (n // t.block_elems + 1) * t.block_elems
    return t.row_bytes(n)


# ---------------------------------------------------------------------------------------------- integrity
@dataclass(frozen=True)
class Check:
    """One integrity check: ``ok`` True (passed), False (failed) or None (informational)."""

    name: str
    ok: bool | None
    detail: str


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
    placed = sorted((t for t in f.tensors if t.n_bytes and not t.problem), key=lambda t: t.offset)
    end = f.data_start
    gap_bytes = 0
    for t in placed:
        if t.data_offset > end:
            gap_bytes += t.data_offset - end
        end = max(end, t.data_offset + (t.n_bytes or 0))
    used = sum(t.n_bytes or 0 for t in placed)
    trailing = f.file_size - end
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


# ---------------------------------------------------------------------------------------------- scale scan
@dataclass(frozen=True)
class BadScale:
    """A non-finite scale (or value, for float tensors): ``field`` of block ``block`` of ``tensor``."""

    tensor: str
    block: int
    field: str
    bits: int


@dataclass
class ScaleScan:
    """Result of :func:`scan_scales`."""

    tensors_scanned: int = 0
    blocks_scanned: int = 0
    n_bad: int = 0
    bad: list[BadScale] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0


@cache
def scale_fields(type_name: str) -> tuple[tuple[str, int], ...]:
    """``(field name, byte offset)`` of every fp16 scale in a block of ``type_name`` (from its decoder)."""
    t = ggml_type(type_name)
    if not t.is_quantized or not can_decode(t):
        return ()
    return tuple((fd.name, fd.offset) for fd in decode_block(t, bytes(t.block_bytes)).fields if fd.kind == "fp16")


_FLOAT_BITS = {"F16": ("<u2", 0x7C00), "BF16": ("<u2", 0x7F80), "F32": ("<u4", 0x7F800000),
               "F64": ("<u8", 0x7FF0000000000000)}


def scan_scales(f: GGUFFile, *, chunk_bytes: int = 8 << 20, max_report: int = 100,
                progress: Progress | None = None, cancel: CancelFlag | None = None) -> ScaleScan:
    """Find NaN/Inf fp16 scales in every quantized block (and NaN/Inf values in float tensors).

    Bit tests on the raw bytes (exponent all ones), no dequantization; progress in bytes."""
    t0 = time.perf_counter()
    res = ScaleScan()
    todo = [t for t in f.tensors if t.type is not None and not t.problem and t.n_bytes]
    total = sum(t.n_bytes or 0 for t in todo)
    done = 0
    for t in todo:
        assert t.type is not None
        name = t.type.name
        raw = f.tensor_bytes(t)
        if name in _FLOAT_BITS:
            dt, mask = _FLOAT_BITS[name]
            fields: tuple[tuple[str, int], ...] = (("value", 0),)
            width = np.dtype(dt).itemsize
        else:
            fields = scale_fields(name)
            dt, mask, width = "<u2", 0x7C00, t.type.block_bytes
            if not fields:
                res.skipped.append(f"{t.name} ({name}: no fp16 scale fields known)")
                done += t.n_bytes or 0
                continue
        step = max(width, chunk_bytes // width * width)
        for a in range(0, raw.size, step):
            _check(cancel)
            blocks = native.copy_mapped(raw[a : a + step], t.name).reshape(-1, width)  # guarded read
            for fname, off in fields:
                size = np.dtype(dt).itemsize
                vals = np.ascontiguousarray(blocks[:, off : off + size]).view(dt).reshape(-1)
                bad = np.flatnonzero((vals & np.array(mask, dtype=dt)) == np.array(mask, dtype=dt))
                if bad.size:
                    res.n_bad += int(bad.size)
                    for k in bad[: max(0, max_report - len(res.bad))]:
                        res.bad.append(BadScale(t.name, a // width + int(k), fname, int(vals[k])))
            res.blocks_scanned += blocks.shape[0]
            done += blocks.size
            if progress:
                progress(done, total)
        res.tensors_scanned += 1
    res.seconds = time.perf_counter() - t0
    return res


# ---------------------------------------------------------------------------------------------- block geometry
@dataclass(frozen=True)
class Fp16Parts:
    """An IEEE binary16 value split into sign, biased exponent and mantissa."""

    bits: int
    sign: int
    exponent: int
    mantissa: int
    value: float

    @property
    def kind(self) -> str:
        if self.exponent == 31:
            return "NaN" if self.mantissa else "Inf"
        return "subnormal" if self.exponent == 0 and self.mantissa else "normal"


def fp16_parts(bits: int) -> Fp16Parts:
    """Split the 16 bits of an fp16 into its fields (value = (-1)^s · 2^(e-15) · 1.m)."""
    bits &= 0xFFFF
    value = float(np.array([bits], dtype="<u2").view("<f2")[0])
    return Fp16Parts(bits, bits >> 15, (bits >> 10) & 31, bits & 1023, value)


@dataclass(frozen=True)
class BitOwner:
    """Bit ``bit`` of a block byte feeds bit ``value_bit`` of scale ``name[index]``."""

    name: str
    index: int
    value_bit: int


def scale_bit_owners(b: DecodedBlock) -> dict[tuple[int, int], BitOwner]:
    """``(byte, bit) -> BitOwner`` for every bit of the packed scales (from ``b.scale_sources``)."""
    out: dict[tuple[int, int], BitOwner] = {}
    for name, per_value in b.scale_sources.items():
        for index, sources in enumerate(per_value):
            for s in sources:
                for k in range(s.n_bits):
                    out[(s.byte, s.bit_lo + k)] = BitOwner(name, index, s.value_bit + k)
    return out


@dataclass(frozen=True)
class CodeLayout:
    """Where each element's (low) code bits live: ``slot_bits``-wide slots of ``code_bytes``.

    ``element_at[(byte, shift)]`` is the element stored at that slot; ``bytes`` lists the code bytes in order."""

    slot_bits: int
    bytes: tuple[int, ...]
    element_at: dict[tuple[int, int], int]

    @property
    def slots_per_byte(self) -> int:
        return 8 // self.slot_bits


def code_layout(b: DecodedBlock) -> CodeLayout | None:
    """The code grid of a quantized block (``None`` for plain float blocks)."""
    if b.code_bits == 0:
        return None
    shifts = {int(s) for s in b.code_shift}
    width = 8
    for s in shifts:
        width = math.gcd(width, s) if s else width
    width = min(width, b.code_bits)
    while 8 % width:
        width -= 1
    element_at = {(int(b.code_byte[i]), int(b.code_shift[i])): i for i in range(len(b.values))}
    return CodeLayout(width, tuple(sorted({int(x) for x in b.code_byte})), element_at)


def field_at(b: DecodedBlock, byte: int) -> str:
    """Name of the field holding block byte ``byte``."""
    for fd in b.fields:
        if fd.offset <= byte < fd.offset + fd.size:
            return fd.name
    return ""


# ---------------------------------------------------------------------------------------------- strings
def find_in_strings(arr: StringArray, needle: str, *, ignore_case: bool = True, path: str | None = None,
                    limit: int | None = None) -> np.ndarray:
    """Indices of the elements of ``arr`` containing ``needle`` (ascending, at most ``limit``).

    With ``path`` (the file holding the array) it searches the array's bytes in one pass (case folding is then
    ASCII-only); otherwise it decodes every element."""
    if not needle:
        n = len(arr) if limit is None else min(limit, len(arr))
        return np.arange(n, dtype=np.int64)
    if path is not None:
        with os.fdopen(open_input(path), "rb") as fh:  # a FIFO swapped in for the file is refused, not waited on
            fh.seek(arr.start)
            blob = fh.read(arr.nbytes)
        if len(blob) != arr.nbytes:
            raise FileChangedError(f"{path}: the file is shorter than when it was opened")
        lengths = arr.lengths()
        starts = np.cumsum(np.concatenate([[0], lengths[:-1] + 8])) + 8  # first text byte of each element
        ends = starts + lengths
        pat = re.compile(re.escape(needle.encode("utf-8")), re.IGNORECASE if ignore_case else 0)
        hits = np.fromiter((m.start() for m in pat.finditer(blob)), dtype=np.int64)
        if not hits.size:
            return hits
        k = np.searchsorted(starts, hits, side="right") - 1
        ok = (k >= 0) & (hits + len(needle.encode("utf-8")) <= ends[np.clip(k, 0, None)])
        found = np.unique(k[ok])
    else:
        key = needle.casefold() if ignore_case else needle
        found = np.fromiter((i for i, s in enumerate(arr) if key in (s.casefold() if ignore_case else s)),
                            dtype=np.int64)
    return found if limit is None else found[:limit]
