"""The quantization lab: what each type loses on a tensor's values (llama.cpp's quantize-stats, issue 18).

A tensor's values (dequantized from the file, or taken from a higher-precision *reference* file of the same model)
are quantized into each candidate type with the native quantizers (ggml's bytes, with the importance weights when
given), dequantized again and compared with the originals: RMSE, max |error|, SNR, cosine similarity, the error
relative to the values' RMS, the importance-weighted RMSE and, on request, the RMSE of every quantization block.

Rows are processed in chunks of at most :data:`CHUNK_VALUES` values (sums in float64), so memory stays bounded
whatever the tensor's size; ``max_rows`` measures evenly spaced rows only (:func:`sample_rows`).

Importance weights are one per column (``ne0``), or ``n_mat * ne0`` for a 3-D (expert) tensor flattened to rows:
expert ``e``'s slice weighs rows ``[e * n_rows / n_mat, (e + 1) * n_rows / n_mat)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..base.ggml_types import GGMLType, ggml_type
from ..gguf import GGUFError, GGUFFile, TensorInfo
from ..userregex import UserPattern
from .imatrix import Imatrix
from .mixture import allows_quantization, n_dims

#: every type the native quantizers produce, cheapest bits per weight first, then the two 16-bit float types
CANDIDATE_TYPES: tuple[str, ...] = (
    "TQ1_0", "TQ2_0", "Q2_K", "Q3_K", "IQ4_XS", "MXFP4", "Q4_0", "IQ4_NL", "Q4_K", "Q4_1", "Q5_0", "Q5_K", "Q5_1",
    "Q6_K", "Q8_0", "F16", "BF16",
)
#: values per chunk (the float64 temporaries of a chunk take 16 MiB each)
CHUNK_VALUES = 1 << 21
_FLOAT_TYPES = ("F16", "BF16")

Progress = Callable[[int, int, str], None]
CancelCheck = Callable[[], bool]


class LabCancelled(Exception):
    """The caller's ``cancel`` returned True; nothing is returned."""


@dataclass(frozen=True)
class ErrorStats:
    """How far ``type``'s round trip (quantize, dequantize) lands from the original values.

    The ``sum_*`` fields and ``n_values`` are the float64 sums the figures come from (they let results be combined:
    :func:`summarize`); ``sum_w`` is ``None`` without importance weights.
    """

    type: str
    bits_per_weight: float
    rmse: float
    max_abs: float
    snr_db: float  # 10*log10(sum x^2 / sum (x-y)^2); inf when exact
    cosine: float  # of the flattened original and requantized values
    rel_rmse: float  # rmse / rms(x)
    weighted_rmse: float | None  # sqrt(sum w*(x-y)^2 / sum w), w the importance weight of each value's column
    block_rmse: np.ndarray | None = field(default=None, compare=False, repr=False)  # float32 (n_rows, n_blocks)
    n_values: int = 0
    sum_x2: float = field(default=0.0, repr=False)
    sum_y2: float = field(default=0.0, repr=False)
    sum_xy: float = field(default=0.0, repr=False)
    sum_d2: float = field(default=0.0, repr=False)
    sum_wd2: float = field(default=0.0, repr=False)
    sum_w: float | None = field(default=None, repr=False)

    @property
    def exact(self) -> bool:
        """True when every value came back unchanged."""
        return self.max_abs == 0.0


@dataclass(frozen=True)
class TensorStats:
    """One tensor's figures for each type that fits its rows (in the order asked).

    ``shape`` is ``ne`` (ggml order); ``source_type`` the type the values were read from (the reference file's
    tensor when ``from_reference``); ``rows_measured`` the rows behind the figures (fewer than the tensor's with
    ``max_rows``); ``skipped`` the asked types whose blocks do not divide ``ne0``.
    """

    name: str
    shape: tuple[int, ...]
    source_type: str
    n_elements: int
    errors: tuple[ErrorStats, ...]
    rows_measured: int = 0
    from_reference: bool = False
    skipped: tuple[str, ...] = ()


@dataclass(frozen=True)
class TypeSummary:
    """One type over a whole file: the tensors' sums weighted by their element counts (a sampled tensor counts for
    all its elements). ``n_tensors``/``n_elements``: the tensors the type fits."""

    stats: ErrorStats
    n_tensors: int
    n_elements: int


# ----------------------------------------------------------------------------------------------------------- types


def _candidate(q: str) -> GGMLType:
    try:
        t = ggml_type(str(q).strip())
    except KeyError:
        raise ValueError(f"unknown ggml type {q!r} (candidates: {', '.join(CANDIDATE_TYPES)})") from None
    if t.name not in CANDIDATE_TYPES:
        raise ValueError(f"{t.name}: Quantscope has no quantizer for it (candidates: {', '.join(CANDIDATE_TYPES)})")
    return t


def candidate_types(types: Iterable[str]) -> list[str]:
    """The canonical names of ``types`` (case-insensitive, duplicates dropped, order kept); ValueError for a type
    that is unknown or has no quantizer."""
    out: list[str] = []
    for q in types:
        name = _candidate(q).name
        if name not in out:
            out.append(name)
    return out


def fits(qtype: str, ne0: int) -> bool:
    """True when rows of ``ne0`` values are whole blocks of ``qtype``."""
    return ne0 > 0 and ne0 % ggml_type(qtype).block_elems == 0


def n_matrices(ne: Sequence[int]) -> int:
    """The matrices of a tensor (``ne[2]`` for a 3-D expert tensor, else 1)."""
    return int(ne[2]) if n_dims(ne) >= 3 else 1


def sample_rows(n_rows: int, max_rows: int | None, n_groups: int = 1) -> np.ndarray:
    """The (flattened) row numbers measured with ``max_rows``: all rows, or evenly spaced ones, the same number from
    each of ``n_groups`` equal groups (experts; at least one each), in order, so an ``n_groups * ne0`` importance
    vector still maps the sampled rows to their experts."""
    if max_rows is not None and max_rows < 1:
        raise ValueError(f"max_rows must be at least 1, got {max_rows}")
    if max_rows is None or max_rows >= n_rows or n_groups < 1 or n_rows % n_groups:
        return np.arange(n_rows, dtype=np.int64)
    per = n_rows // n_groups
    k = max(1, max_rows // n_groups)
    if k >= per:
        return np.arange(n_rows, dtype=np.int64)
    local = (2 * np.arange(k, dtype=np.int64) + 1) * per // (2 * k)  # centred in k equal stretches: increasing
    return (np.arange(n_groups, dtype=np.int64)[:, None] * per + local[None, :]).reshape(-1)


# ----------------------------------------------------------------------------------------------------- in memory


def _rows(values: np.ndarray) -> np.ndarray:
    a = np.asarray(values)
    if a.ndim == 1:
        a = a.reshape(1, -1)
    if a.ndim != 2:
        raise ValueError(f"values must be 2-D (rows x ne0), got shape {a.shape}")
    if a.dtype.kind not in "fiu":
        raise ValueError(f"values must be numbers, got {a.dtype}")
    if a.shape[0] == 0 or a.shape[1] == 0:
        raise ValueError(f"no values to measure (shape {a.shape})")
    return a


def _weights(imatrix: np.ndarray | None, n_rows: int, n_cols: int, what: str = "") -> np.ndarray | None:
    """The importance weights as (n_groups, n_cols) float32, checked."""
    if imatrix is None:
        return None
    w = np.asarray(imatrix, dtype=np.float32).reshape(-1)
    pre = f"{what}: " if what else ""
    if w.size == 0 or w.size % n_cols or n_rows % (w.size // n_cols):
        raise ValueError(f"{pre}the importance vector has {w.size} values; rows of {n_cols} need {n_cols} or "
                         f"{n_cols} per expert with the {n_rows} rows split evenly (another model's imatrix?)")
    if not np.isfinite(w).all() or (w < 0).any():
        raise ValueError(f"{pre}the importance weights must be finite and not negative")
    return np.ascontiguousarray(w.reshape(-1, n_cols))


class _NonFinite(Exception):
    def __init__(self, row: int) -> None:
        super().__init__(row)
        self.row = row


def _finite(x: np.ndarray, row0: int) -> None:
    ok = np.isfinite(x)
    if not ok.all():
        raise _NonFinite(row0 + int(np.argwhere(~ok.all(axis=1))[0][0]))


def _nonfinite_error(row: int, what: str = "") -> ValueError:
    pre = f"{what}: " if what else ""
    return ValueError(f"{pre}row {row} holds a value that is not a finite number (NaN or infinity); quantized "
                      "blocks cannot hold it")


def _encode(x: np.ndarray, t: GGMLType, w: np.ndarray | None, threads: int, out: np.ndarray | None = None
            ) -> np.ndarray:
    from ..native import kernels as K

    if t.name in _FLOAT_TYPES:
        raw = K.quantize_activation(x.reshape(-1), t.name).reshape(x.shape[0], -1)
        if out is not None:
            dst = out.reshape(-1)[:raw.size].reshape(raw.shape)
            dst[...] = raw
            return dst
        return raw
    return K.quantize_rows(t, x, w, threads=threads, out=out)


def _decode(raw: np.ndarray, t: GGMLType, threads: int, out: np.ndarray | None = None) -> np.ndarray:
    from ..native import kernels as K

    return K.dequantize(raw, t, threads=threads, out=out)


def _groups(n_rows: int, w: np.ndarray | None) -> list[tuple[int, int, np.ndarray | None]]:
    if w is None:
        return [(0, n_rows, None)]
    per = n_rows // w.shape[0]
    return [(g * per, (g + 1) * per, w[g]) for g in range(w.shape[0])]


def requantize(values: np.ndarray, qtype: str, imatrix: np.ndarray | None = None, *,
               threads: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``values`` quantized into ``qtype`` (with the importance weights when given) and dequantized again: the raw
    bytes ``(n_rows, row_bytes)`` and the float32 values, same shape as ``values``."""
    from ..native import kernels as K

    x = _rows(values)
    t = _candidate(qtype)
    n_rows, n_cols = x.shape
    if not fits(t.name, n_cols):
        raise ValueError(f"rows of {n_cols} values are not whole {t.name} blocks of {t.block_elems}")
    w = _weights(imatrix, n_rows, n_cols)
    raw = np.empty((n_rows, t.row_bytes(n_cols)), np.uint8)
    y = np.empty((n_rows, n_cols), np.float32)
    for a, b, wg in _groups(n_rows, w):
        step = max(1, CHUNK_VALUES // n_cols)
        for r in range(a, b, step):
            e = min(b, r + step)
            xc = np.ascontiguousarray(x[r:e], dtype=np.float32)
            try:
                _finite(xc, r)
                _encode(xc, t, wg, threads, out=raw[r:e].reshape(-1))
            except _NonFinite as exc:
                raise _nonfinite_error(exc.row) from None
            except K.NonFiniteRows as exc:
                raise _nonfinite_error(r + exc.row) from None
            _decode(raw[r:e], t, threads, out=y[r:e].reshape(-1))
    return raw, y


# --------------------------------------------------------------------------------------------------- measuring


def _stats(t: GGMLType, n: int, sx2: float, sy2: float, sxy: float, sd2: float, max_abs: float, swd2: float,
           sw: float | None, block: np.ndarray | None) -> ErrorStats:
    rmse = math.sqrt(sd2 / n) if n else 0.0
    exact = max_abs == 0.0
    if exact:
        snr, cos = math.inf, 1.0
    else:
        snr = 10.0 * math.log10(sx2 / sd2) if sx2 > 0 and sd2 > 0 else (-math.inf if sd2 > 0 else math.inf)
        cos = max(-1.0, min(1.0, sxy / math.sqrt(sx2 * sy2))) if sx2 > 0 and sy2 > 0 else 0.0
    rms_x = math.sqrt(sx2 / n) if n else 0.0
    rel = rmse / rms_x if rms_x > 0 else (0.0 if rmse == 0 else math.inf)
    if sw is None:
        wr: float | None = None
    else:
        wr = math.sqrt(swd2 / sw) if sw > 0 else math.nan
    bpw = 16.0 if t.name in _FLOAT_TYPES else t.bits_per_weight
    return ErrorStats(t.name, bpw, rmse, max_abs, snr, cos, rel, wr, block, n, sx2, sy2, sxy, sd2, swd2, sw)


class _Acc:
    """One type's running sums over the chunks of one set of rows."""

    def __init__(self, t: GGMLType, n_rows: int, n_cols: int, weighted: bool, blocks: bool) -> None:
        self.t = t
        self.be = 1 if t.name in _FLOAT_TYPES else t.block_elems
        self.n = 0
        self.sx2 = self.sy2 = self.sxy = self.sd2 = self.max_abs = self.swd2 = 0.0
        self.sw: float | None = 0.0 if weighted else None
        self.block = np.empty((n_rows, n_cols // self.be), np.float32) if blocks else None

    def add(self, x64: np.ndarray, sx2: float, y: np.ndarray, row0: int, w: np.ndarray | None) -> None:
        r, n = x64.shape
        y64 = y.astype(np.float64)
        self.n += r * n
        self.sx2 += sx2
        self.sy2 += float(np.dot(y64.reshape(-1), y64.reshape(-1)))
        self.sxy += float(np.dot(x64.reshape(-1), y64.reshape(-1)))
        d = np.subtract(y64, x64, out=y64)
        self.max_abs = max(self.max_abs, float(d.max()), float(-d.min()))
        d2 = np.square(d, out=d)
        self.sd2 += float(d2.sum())
        if w is not None and self.sw is not None:
            self.swd2 += float(np.dot(d2.sum(axis=0), w.astype(np.float64)))
            self.sw += float(w.sum(dtype=np.float64)) * r
        if self.block is not None:
            self.block[row0:row0 + r] = np.sqrt(d2.reshape(r, n // self.be, self.be).mean(axis=2))

    def result(self) -> ErrorStats:
        return _stats(self.t, self.n, self.sx2, self.sy2, self.sxy, self.sd2, self.max_abs, self.swd2, self.sw,
                      self.block)


Chunk = tuple[int, np.ndarray, "np.ndarray | None"]  # first row (of the measured rows), float32 rows, weights


def _run(chunks: Iterable[Chunk], types: Sequence[GGMLType], n_rows: int, n_cols: int, weighted: bool,
         blocks: bool, threads: int, tick: Callable[[int, str], None], cancel: CancelCheck | None) -> list[ErrorStats]:
    """Every type's figures over the chunks (each chunk read once, then quantized into every type)."""
    from ..native import kernels as K

    accs = [_Acc(t, n_rows, n_cols, weighted, blocks) for t in types]
    raw_buf = np.empty(0, np.uint8)
    y_buf = np.empty(0, np.float32)
    for row0, x, w in chunks:
        _check_cancel(cancel)
        _finite(x, row0)
        x64 = x.astype(np.float64)
        sx2 = float(np.dot(x64.reshape(-1), x64.reshape(-1)))
        for acc in accs:
            _check_cancel(cancel)
            t = acc.t
            need = x.shape[0] * (2 * n_cols if t.name in _FLOAT_TYPES else t.row_bytes(n_cols))
            if raw_buf.size < need:
                raw_buf = np.empty(need, np.uint8)
            if y_buf.size < x.size:
                y_buf = np.empty(x.size, np.float32)
            try:
                raw = _encode(x, t, w, threads, out=raw_buf[:need])
            except K.NonFiniteRows as exc:
                raise _NonFinite(row0 + exc.row) from None
            y = _decode(raw, t, threads, out=y_buf[:x.size])
            acc.add(x64, sx2, y, row0, w)
            tick(x.size, t.name)
    return [a.result() for a in accs]


def _check_cancel(cancel: CancelCheck | None) -> None:
    if cancel is not None and cancel():
        raise LabCancelled("the measurement was cancelled")


def _memory_chunks(x: np.ndarray, w: np.ndarray | None) -> Iterator[Chunk]:
    n_rows, n_cols = x.shape
    step = max(1, CHUNK_VALUES // n_cols)
    for a, b, wg in _groups(n_rows, w):
        for r in range(a, b, step):
            e = min(b, r + step)
            yield r, np.ascontiguousarray(x[r:e], dtype=np.float32), wg


def _ticker(progress: Progress | None, total: int, done: int = 0) -> Callable[[int, str], None]:
    state = [done]

    def tick(n: int, label: str) -> None:
        state[0] += n
        if progress is not None:
            progress(state[0], total, label)

    return tick


def requantize_errors(values: np.ndarray, types: Sequence[str], imatrix: np.ndarray | None = None, *,
                      blocks: bool = False, threads: int = 0, progress: Progress | None = None,
                      cancel: CancelCheck | None = None) -> list[ErrorStats]:
    """The figures of each type in ``types`` (in that order) whose blocks divide the rows; the others are left out.

    ``progress(done, total, type)`` counts values requantized (a value once per type); ``cancel()`` returning True
    raises :class:`LabCancelled`. A value that is not finite is a ValueError naming its row.
    """
    x = _rows(values)
    n_rows, n_cols = x.shape
    ts = [ggml_type(q) for q in candidate_types(types) if fits(q, n_cols)]
    w = _weights(imatrix, n_rows, n_cols)
    tick = _ticker(progress, x.size * len(ts))
    if not ts:
        return []
    try:
        return _run(_memory_chunks(x, w), ts, n_rows, n_cols, w is not None, blocks, threads, tick, cancel)
    except _NonFinite as exc:
        raise _nonfinite_error(exc.row) from None


def error_stats(values: np.ndarray, qtype: str, imatrix: np.ndarray | None = None, *, blocks: bool = False,
                threads: int = 0) -> ErrorStats:
    """The figures of one type (ValueError when its blocks do not divide the rows)."""
    x = _rows(values)
    t = _candidate(qtype)
    if not fits(t.name, x.shape[1]):
        raise ValueError(f"rows of {x.shape[1]} values are not whole {t.name} blocks of {t.block_elems}")
    return requantize_errors(x, [t.name], imatrix, blocks=blocks, threads=threads)[0]


# ------------------------------------------------------------------------------------------------------- files


def _matrix(f: GGUFFile, name: str, what: str = "") -> TensorInfo:
    try:
        t = f.tensor(name)
    except KeyError:
        raise ValueError(f"no tensor named {name!r}{' in ' + what if what else ''}") from None
    if t.problem or t.type is None or t.n_bytes is None:
        raise ValueError(f"{name}: cannot be read: {t.problem or t.type_name}")
    if n_dims(t.ne) not in (2, 3):
        raise ValueError(f"{name} has {n_dims(t.ne)} dimension(s) ({'x'.join(map(str, t.ne))}); the lab measures "
                         "2-D and 3-D weights")
    from ..native import kernels as K

    if not K.can_dequantize(t.type):
        raise ValueError(f"{name}: cannot read {t.type_name} values")
    return t


def _same_shape(a: Sequence[int], b: Sequence[int]) -> bool:
    na, nb = n_dims(a), n_dims(b)
    return na == nb and tuple(a[:na]) == tuple(b[:nb])


def _source(f: GGUFFile, t: TensorInfo, reference: GGUFFile | None) -> tuple[GGUFFile, TensorInfo]:
    if reference is None:
        return f, t
    label = str(reference.path) if reference.path is not None else "the reference file"
    r = _matrix(reference, t.name, label)
    if not _same_shape(r.ne, t.ne):
        raise ValueError(f"{t.name}: the reference's tensor is {'x'.join(map(str, r.ne))}, this file's "
                         f"{'x'.join(map(str, t.ne))} (another model?)")
    return reference, r


def _read_rows(f: GGUFFile, t: TensorInfo, rows: np.ndarray, out: np.ndarray, threads: int) -> None:
    """Rows ``rows`` (ascending) of ``t`` as float32 into ``out`` (len(rows), ne0), through the guarded kernels."""
    from ..native import kernels as K

    src = t.type
    assert src is not None
    n_cols = t.ne[0]
    rb = src.row_bytes(n_cols)
    try:
        data = f.tensor_bytes(t)
    except GGUFError as exc:
        raise ValueError(str(exc)) from None
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    starts = [0, *breaks.tolist()]
    ends = [*breaks.tolist(), len(rows)]
    for a, b in zip(starts, ends, strict=True):
        r0, n = int(rows[a]), b - a
        view = data[r0 * rb:(r0 + n) * rb]
        dst = out[a:b].reshape(-1)
        if src.name == "F32":
            K.copy_mapped(view.view(np.float32), f"tensor {t.name}", out=dst)
        else:
            K.dequantize(view.reshape(n, rb), src, threads=threads, out=dst)


def tensor_values(f: GGUFFile, name: str, *, reference: GGUFFile | None = None, max_rows: int | None = None,
                  threads: int = 0) -> np.ndarray:
    """A 2-D or 3-D tensor's values as float32 ``(n_rows, ne0)`` (3-D flattened to rows): dequantized from ``f``, or
    read from ``reference`` (same name and shape required). With ``max_rows``: the rows :func:`sample_rows`
    picks."""
    t = _matrix(f, name)
    sf, st = _source(f, t, reference)
    rows = sample_rows(t.n_rows, max_rows, n_matrices(t.ne))
    out = np.empty((rows.size, t.ne[0]), np.float32)
    _read_rows(sf, st, rows, out, threads)
    return out


def _file_chunks(f: GGUFFile, t: TensorInfo, rows: np.ndarray, n_groups: int, w: np.ndarray | None,
                 threads: int) -> Iterator[Chunk]:
    n_cols = t.ne[0]
    step = max(1, CHUNK_VALUES // n_cols)
    buf = np.empty((min(step, rows.size), n_cols), np.float32)
    per = rows.size // n_groups
    for g in range(n_groups):
        wg = w[g] if w is not None else None
        for a in range(g * per, (g + 1) * per, step):
            b = min((g + 1) * per, a + step)
            x = buf[:b - a]
            _read_rows(f, t, rows[a:b], x, threads)
            yield a, x, wg


@dataclass
class _Job:
    info: TensorInfo
    src_file: GGUFFile
    src: TensorInfo
    rows: np.ndarray
    weights: np.ndarray | None
    types: list[GGMLType]
    skipped: tuple[str, ...]


def quantizable_tensors(f: GGUFFile, pattern: str | None = None) -> list[TensorInfo]:
    """The 2-D/3-D weights llama-quantize would quantize, whose name the regex ``pattern`` finds (file order)."""
    rx = UserPattern(pattern, "") if pattern else None  # time-bounded (a ValueError when bad or slow)
    arch = f.architecture or ""
    return [t for t in f.tensors if is_quantizable(t, arch) and (rx is None or rx.search(t.name))]


def is_quantizable(t: TensorInfo, arch: str) -> bool:
    """True for a 2-D/3-D weight llama-quantize would quantize (in a model of architecture ``arch``)."""
    return n_dims(t.ne) in (2, 3) and allows_quantization(t.name, t.ne, arch)


def file_stats(f: GGUFFile, types: Sequence[str], *, pattern: str | None = None, imatrix: Imatrix | None = None,
               reference: GGUFFile | None = None, max_rows: int | None = None, threads: int = 0,
               progress: Progress | None = None, cancel: CancelCheck | None = None) -> list[TensorStats]:
    """Every quantizable weight's figures for each type (quantize-stats' table), in file order.

    Everything (reference tensors and shapes, importance-vector sizes, readable types) is checked before the first
    tensor is measured. ``progress(done, total, tensor)`` counts values requantized over all tensors and types.
    """
    names = candidate_types(types)
    jobs: list[_Job] = []
    for t in quantizable_tensors(f, pattern):
        t = _matrix(f, t.name)
        sf, st = _source(f, t, reference)
        n_mat = n_matrices(t.ne)
        rows = sample_rows(t.n_rows, max_rows, n_mat)
        w = None
        if imatrix is not None:
            wv = imatrix.weights(t.name)
            if wv is not None:
                if wv.size != t.ne[0] * n_mat:
                    raise ValueError(f"{t.name}: the imatrix entry has {wv.size} values; the tensor needs "
                                     f"{t.ne[0] * n_mat} (another model's imatrix?)")
                w = _weights(wv, rows.size, t.ne[0], t.name)
        ok = [ggml_type(q) for q in names if fits(q, t.ne[0])]
        jobs.append(_Job(t, sf, st, rows, w, ok, tuple(q for q in names if not fits(q, t.ne[0]))))
    total = sum(j.rows.size * j.info.ne[0] * len(j.types) for j in jobs)
    done = 0
    out: list[TensorStats] = []
    for j in jobs:
        t = j.info
        _check_cancel(cancel)
        errors: list[ErrorStats] = []
        if j.types:
            tick = _ticker(None if progress is None else (lambda d, tot, _q, n=t.name: progress(d, tot, n)),
                           total, done)
            n_groups = j.weights.shape[0] if j.weights is not None else n_matrices(t.ne)
            try:
                errors = _run(_file_chunks(j.src_file, j.src, j.rows, n_groups, j.weights, threads), j.types,
                              j.rows.size, t.ne[0], j.weights is not None, False, threads, tick, cancel)
            except _NonFinite as exc:
                raise _nonfinite_error(int(j.rows[exc.row]), t.name) from None
            finally:
                j.src_file.release_pages(j.src.data_offset, j.src.n_bytes or 0, shard=j.src.shard)
            done += j.rows.size * t.ne[0] * len(j.types)
        out.append(TensorStats(t.name, tuple(t.ne), j.src.type_name, t.n_elements, tuple(errors), int(j.rows.size),
                               reference is not None, j.skipped))
    if progress is not None:
        progress(total, total, "")
    return out


def summarize(stats: Sequence[TensorStats], types: Sequence[str] | None = None) -> list[TypeSummary]:
    """Each type's whole-file figures: every tensor's sums scaled to its element count, then combined (max |error|
    is the largest). ``types``: the order (default: as they first appear); a type no tensor fits is left out."""
    order = candidate_types(types) if types is not None else []
    for s in stats:
        for e in s.errors:
            if e.type not in order:
                order.append(e.type)
    out: list[TypeSummary] = []
    for q in order:
        n = n_t = 0
        sx2 = sy2 = sxy = sd2 = swd2 = mx = 0.0
        sw: float | None = None
        for s in stats:
            e = next((e for e in s.errors if e.type == q), None)
            if e is None or e.n_values == 0:
                continue
            k = s.n_elements / e.n_values
            n += s.n_elements
            n_t += 1
            sx2 += k * e.sum_x2
            sy2 += k * e.sum_y2
            sxy += k * e.sum_xy
            sd2 += k * e.sum_d2
            mx = max(mx, e.max_abs)
            if e.sum_w is not None:
                sw = (sw or 0.0) + k * e.sum_w
                swd2 += k * e.sum_wd2
        if n_t:
            out.append(TypeSummary(_stats(ggml_type(q), n, sx2, sy2, sxy, sd2, mx, swd2, sw, None), n_t, n))
    return out


def stats_json(e: ErrorStats) -> dict[str, object]:
    """The figures as a JSON-ready dict (no block array, no sums)."""
    return {"type": e.type, "bits_per_weight": e.bits_per_weight, "rmse": e.rmse, "max_abs": e.max_abs,
            "snr_db": e.snr_db, "cosine": e.cosine, "rel_rmse": e.rel_rmse, "weighted_rmse": e.weighted_rmse,
            "n_values": e.n_values}


# ------------------------------------------------------------------------------------------ for viewers (the GUI)


@dataclass(frozen=True)
class BlockPair:
    """One quantization block before and after the round trip: the original values, ``qtype``'s raw bytes of the
    block (what :func:`~quantscope.core.quant.decode_block` takes) and the values they dequantize to."""

    qtype: str
    row: int
    block: int
    original: np.ndarray  # float32 (block_elems,)
    raw: bytes
    requantized: np.ndarray  # float32 (block_elems,)

    @property
    def columns(self) -> tuple[int, int]:
        """The block's columns ``[first, end)`` in its row."""
        n = self.original.size
        return self.block * n, (self.block + 1) * n

    @property
    def rmse(self) -> float:
        """The block's RMSE (the :attr:`ErrorStats.block_rmse` entry)."""
        d = self.requantized.astype(np.float64) - self.original
        return math.sqrt(float(np.dot(d, d)) / d.size) if d.size else 0.0

    @property
    def worst_element(self) -> tuple[int, float]:
        """(element, |error|) of the element that moved most."""
        d = np.abs(self.requantized.astype(np.float64) - self.original)
        i = int(np.argmax(d)) if d.size else 0
        return i, float(d[i]) if d.size else 0.0


def requantize_block(values: np.ndarray, qtype: str, row: int, block: int, imatrix: np.ndarray | None = None, *,
                     threads: int = 0) -> BlockPair:
    """Block ``block`` of row ``row`` of ``values`` (rows x ne0, as :func:`requantize_errors` measured them) quantized
    into ``qtype``: only that row is requantized (rows are quantized independently, so its bytes are the ones the
    whole tensor's round trip has), with the importance weights of the row's expert when ``imatrix`` is given."""
    x = _rows(values)
    t = _candidate(qtype)
    n_rows, n_cols = x.shape
    if not fits(t.name, n_cols):
        raise ValueError(f"rows of {n_cols} values are not whole {t.name} blocks of {t.block_elems}")
    be = t.block_elems
    if not (0 <= row < n_rows and 0 <= block < n_cols // be):
        raise ValueError(f"no block {block} in row {row} ({n_rows} rows of {n_cols // be} {t.name} blocks)")
    w = _weights(imatrix, n_rows, n_cols)
    wg = None if w is None else w[row // (n_rows // w.shape[0])]
    raw, y = requantize(x[row:row + 1], t.name, wg, threads=threads)
    bb = t.block_bytes
    a, b = block * be, (block + 1) * be
    return BlockPair(t.name, row, block, np.asarray(x[row, a:b], np.float32).copy(),
                     raw[0, block * bb:(block + 1) * bb].tobytes(), y[0, a:b].copy())


def worst_block(block_rmse: np.ndarray) -> tuple[int, int, float]:
    """(row, block, RMSE) of the largest entry of a :attr:`ErrorStats.block_rmse` array (NaN ignored)."""
    a = np.asarray(block_rmse, np.float64)
    if a.size == 0 or not np.isfinite(a).any():
        raise ValueError("no block errors to look at")
    i = int(np.nanargmax(np.where(np.isfinite(a), a, -np.inf)))
    r, b = divmod(i, a.shape[1])
    return r, b, float(a[r, b])


def stats_report(stats: Sequence[TensorStats], summary: Sequence[TypeSummary], **meta: object) -> dict[str, object]:
    """``quant-stats --json``'s document: ``meta`` (file, reference, imatrix, max_rows, types, seconds…) then every
    tensor's figures and the per-type summary (pass it to :func:`~quantscope.core.fsutil.json_text`)."""
    return {**meta,
            "tensors": [{"name": s.name, "shape": list(s.shape), "source_type": s.source_type,
                         "n_elements": s.n_elements, "rows_measured": s.rows_measured, "skipped": list(s.skipped),
                         "errors": [stats_json(e) for e in s.errors]} for s in stats],
            "summary": [{**stats_json(u.stats), "n_tensors": u.n_tensors, "n_elements": u.n_elements}
                        for u in summary]}


CSV_COLUMNS = ("scope", "tensor", "shape", "source_type", "type", "bits_per_weight", "rmse", "max_abs", "snr_db",
               "cosine", "rel_rmse", "weighted_rmse", "n_values", "rows_measured", "n_tensors", "n_elements")


def stats_csv(stats: Sequence[TensorStats], summary: Sequence[TypeSummary]) -> str:
    """The figures as CSV (:data:`CSV_COLUMNS`): one ``tensor`` line per tensor and type, then one ``summary`` line
    per type (tensor ``*``); infinities as ``inf``, a missing weighted RMSE empty."""
    import csv
    import io

    def num(v: float | None) -> str:
        return "" if v is None else repr(float(v))

    def cells(e: ErrorStats) -> list[str]:
        return [e.type, num(e.bits_per_weight), num(e.rmse), num(e.max_abs), num(e.snr_db), num(e.cosine),
                num(e.rel_rmse), num(e.weighted_rmse), str(e.n_values)]

    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(CSV_COLUMNS)
    for s in stats:
        shape = "x".join(str(d) for d in s.shape[:n_dims(s.shape)])
        for e in s.errors:
            out.writerow(["tensor", s.name, shape, s.source_type, *cells(e), str(s.rows_measured), "",
                          str(s.n_elements)])
    for u in summary:
        out.writerow(["summary", "*", "", "", *cells(u.stats), "", str(u.n_tensors), str(u.n_elements)])
    return buf.getvalue()
