"""Numbers the explorer shows about a tensor's values: statistics, histograms and heatmaps of the dequantized
matrix, the geometry of a decoded block, and searching string arrays. (Integrity checks are in
:mod:`quantscope.core.gguf.checks`, memory planning in :mod:`quantscope.core.model.memory`, the scale scan in
:mod:`quantscope.core.quant.scales`, cancellation and rates in :mod:`quantscope.core.jobs`.)

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
from dataclasses import dataclass

import numpy as np

from .filestate import FileChangedError
from .fsutil import open_input
from .gguf import GGUFFile, StringArray, TensorInfo
from .jobs import CancelFlag, Cancelled, check_cancel
from .native import kernels as native
from .quant import DecodedBlock
from .quant import can_dequantize as ref_can_dequantize
from .quant import dequantize as ref_dequantize

Progress = Callable[[int, int], None]

class AnalysisCancelled(Cancelled):
    """A long computation stopped because its cancel token was set."""


def _check(cancel: CancelFlag | None) -> None:
    check_cancel(cancel, AnalysisCancelled)


# ---------------------------------------------------------------------------------------------- dequantization
def can_read_values(t: TensorInfo) -> bool:
    """True when the tensor's values can be computed (known, supported type and no problem)."""
    if t.type is None or t.problem is not None or t.n_bytes is None:
        return False
    return t.type.is_exact or native.can_dequantize(t.type) or ref_can_dequantize(t.type)


def dequantize_rows(f: GGUFFile, t: TensorInfo, start: int, stop: int, *, threads: int = 1) -> np.ndarray:
    """Rows ``[start, stop)`` of ``t`` (flattened over ``ne[1:]``) as float32 of shape ``(stop-start, ne0)``.

    Native kernels where they exist, else the numpy reference; integer and F64 tensors are cast."""
    if not can_read_values(t):
        raise NotImplementedError(f"{t.name}: values of {t.type_name} cannot be computed"
                                  + (f" ({t.problem})" if t.problem else ""))
    assert t.type is not None
    start, stop = max(0, start), min(t.n_rows, stop)
    rows = f.tensor_rows(t)[start:stop]
    if t.type.is_exact:
        assert t.type.dtype is not None
        return native.copy_mapped(rows, t.name).view(t.type.dtype).astype(np.float32)
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
