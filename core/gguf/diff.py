"""Compare two GGUF files: metadata, tensor table and tensor values.

:func:`diff_files` reports metadata keys added, removed and changed (value type or value), tensors added, removed,
retyped and reshaped, and for every tensor present in both with the same shape how far B's values are from A's:
RMSE, max |Δ|, cosine similarity and relative error (RMSE / RMS of A), or ``exact`` when both have the same type
and the same bytes (found without dequantizing). Values are read in chunks of rows (float64 sums, bounded
memory); metadata arrays are compared through their stored bytes (length, a BLAKE2b digest and the first
differing element), never turned into Python objects. :func:`locate_difference` finds the row and block where two
tensors differ most; :func:`locate_blocks` adds both blocks there, decoded, and the window of values a
side-by-side view shows.

Progress is reported in bytes of tensor data read (both files); a set cancel token stops the job at the next
chunk with :class:`DiffCancelled`.
"""

from __future__ import annotations

import hashlib
import math
import re
import struct
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..base.gguf_constants import ValueType
from ..jobs import CancelFlag, Cancelled, Progress, check_cancel
from ..userregex import UserPattern
from .reader import GGUFFile, MetadataValue, TensorInfo
from .strings import StringArray

if TYPE_CHECKING:
    from ..quant.blocks import DecodedBlock

#: Values per chunk of a value comparison (per file): memory stays near 6 × 8 bytes × this.
CHUNK_VALUES = 1 << 20
#: Bytes per chunk of a byte comparison (tensor data or a metadata array).
CHUNK_BYTES = 8 << 20
#: Characters of a string value (and elements of an array) kept in a change's preview.
PREVIEW_CHARS = 200
PREVIEW_ITEMS = 8


class DiffCancelled(Cancelled):
    """A comparison stopped because its cancel token was set."""


# ------------------------------------------------------------------------------------------------ results
@dataclass
class MetadataChange:
    """One metadata key that differs. ``kind``: ``added`` (only in B), ``removed`` (only in A), ``type`` (the value
    type, or an array's element type, changed) or ``value``.

    ``value_a``/``value_b`` are previews (strings cut at :data:`PREVIEW_CHARS` characters, arrays as ``{type,
    count, head}``). For two strings or two arrays of the same type, ``first_diff`` is the first differing character
    or element (the shorter length when one is a prefix of the other) and ``at_a``/``at_b`` what is there (up to
    40 characters of a string; ``None`` past the end); arrays also carry ``count_a``/``count_b`` and
    ``digest_a``/``digest_b`` (BLAKE2b-128 of the elements' bytes as stored)."""

    key: str
    kind: str
    type_a: str | None = None
    type_b: str | None = None
    value_a: Any = None
    value_b: Any = None
    count_a: int | None = None
    count_b: int | None = None
    digest_a: str | None = None
    digest_b: str | None = None
    first_diff: int | None = None
    at_a: Any = None
    at_b: Any = None


@dataclass
class ValueDiff:
    """How far tensor B's dequantized values are from A's, over ``n_compared`` elements (``rows_compared`` of
    ``rows_total`` rows; fewer with ``max_rows``).

    The figures cover the positions where both values are finite (``nonfinite_a``/``nonfinite_b`` count the
    others). ``rel_error`` = RMSE / RMS(A) (``inf`` when A is all zero and B is not); ``cosine`` is 1 for two
    all-zero tensors, NaN when only one is. ``exact``: same type and the same bytes (all rows, whatever
    ``max_rows``), decided before any dequantization (``rms_a``/``rms_b`` are then ``None``: not computed).
    ``max_abs_at`` = (row, column) of the largest |Δ|; ``first_diff_row`` = the first row whose bytes differ
    (same type only)."""

    exact: bool
    rmse: float
    max_abs: float
    cosine: float
    rel_error: float
    rms_a: float | None
    rms_b: float | None
    n_compared: int
    rows_compared: int
    rows_total: int
    nonfinite_a: int = 0
    nonfinite_b: int = 0
    max_abs_at: tuple[int, int] | None = None
    first_diff_row: int | None = None

    @property
    def sampled(self) -> bool:
        return self.rows_compared < self.rows_total


@dataclass
class TensorDiff:
    """One tensor of either file. ``status``: ``added`` (only in B), ``removed`` (only in A), ``changed`` (type,
    shape or values differ), ``same`` (same type, shape and bytes) or ``unchecked`` (same type and shape, values not
    compared: ``values=False``, or they cannot be read, see ``note``). Shapes are numpy order (``ne`` reversed)."""

    name: str
    status: str
    type_a: str | None = None
    type_b: str | None = None
    shape_a: tuple[int, ...] | None = None
    shape_b: tuple[int, ...] | None = None
    values: ValueDiff | None = None
    note: str | None = None

    @property
    def retyped(self) -> bool:
        return self.type_a is not None and self.type_b is not None and self.type_a != self.type_b

    @property
    def reshaped(self) -> bool:
        return self.shape_a is not None and self.shape_b is not None and self.shape_a != self.shape_b


@dataclass
class FileSide:
    """What the report says about one file."""

    path: str | None
    version: int
    file_size: int
    n_tensors: int
    n_metadata: int


@dataclass
class FileDiff:
    """Result of :func:`diff_files`. ``metadata`` lists only the keys that differ (``metadata_same`` counts the
    others); ``tensors`` lists every tensor of either file that was considered (``tensor_filter`` limits them), A's
    order first, then B's new ones."""

    a: FileSide
    b: FileSide
    metadata: list[MetadataChange] = field(default_factory=list)
    metadata_same: int = 0
    tensors: list[TensorDiff] = field(default_factory=list)
    tensor_filter: str | None = None
    values_compared: bool = True
    max_rows: int | None = None

    @property
    def identical(self) -> bool:
        """No difference found in what was compared (with ``values_compared`` False: the headers only)."""
        return not self.metadata and all(t.status in ("same", "unchecked") for t in self.tensors)

    def counts(self) -> dict[str, int]:
        """Numbers for a summary line: metadata kinds, tensor statuses, retyped, reshaped, value-changed, exact."""
        out: dict[str, int] = {}
        for m in self.metadata:
            out[f"metadata_{m.kind}"] = out.get(f"metadata_{m.kind}", 0) + 1
        for t in self.tensors:
            out[f"tensors_{t.status}"] = out.get(f"tensors_{t.status}", 0) + 1
        out["tensors_retyped"] = sum(t.retyped for t in self.tensors)
        out["tensors_reshaped"] = sum(t.reshaped for t in self.tensors)
        out["tensors_exact"] = sum(1 for t in self.tensors if t.values is not None and t.values.exact)
        out["tensors_values_differ"] = sum(1 for t in self.tensors if t.values is not None and not t.values.exact)
        return out

    def to_dict(self) -> dict[str, Any]:
        """A plain dict that strict JSON encodes (NaN/±inf as the strings ``"nan"``, ``"inf"``, ``"-inf"``)."""
        from ..fsutil import json_safe

        d = asdict(self)
        d["identical"] = self.identical
        d["counts"] = self.counts()
        for td, t in zip(d["tensors"], self.tensors, strict=True):
            if t.values is not None:
                td["values"]["sampled"] = t.values.sampled
        return json_safe(d)  # type: ignore[return-value]

    def to_json(self, indent: int | None = 1) -> str:
        """Strict JSON text of :meth:`to_dict`."""
        from ..fsutil import json_text

        return json_text(self.to_dict(), indent=indent)


@dataclass
class DiffLocation:
    """Where two tensors of the same shape differ most: the ``region`` of a row (``lcm`` of both block sizes)
    with the largest sum of squared differences, and in it the element ``col`` with the largest |Δ|, which lies
    in block ``block_a`` of A (element ``element_a`` of it) and ``block_b`` of B."""

    tensor: str
    row: int
    col: int
    block_a: int
    block_b: int
    element_a: int
    element_b: int
    region: tuple[int, int]
    region_rmse: float
    abs_diff: float
    value_a: float
    value_b: float

    def to_dict(self) -> dict[str, Any]:
        from ..fsutil import json_safe

        return json_safe(asdict(self))  # type: ignore[return-value]


# ------------------------------------------------------------------------------------------------ metadata
def _cut(s: str) -> str:
    return s if len(s) <= PREVIEW_CHARS else s[:PREVIEW_CHARS] + "…"


def _element(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, str):
        return _cut(v)
    if isinstance(v, (np.ndarray, StringArray, list)):  # an inner array of an array of arrays
        kind = "STRING" if isinstance(v, StringArray) else "ARRAY" if isinstance(v, list) else v.dtype.name
        return {"type": kind, "count": len(v),
                "head": [_element(_guarded_item(v, i)) for i in range(min(len(v), PREVIEW_ITEMS))]}
    return v


def _preview(kv: MetadataValue) -> Any:
    if kv.type == ValueType.STRING:
        return _cut(kv.value)
    if kv.type != ValueType.ARRAY:
        return kv.value
    v = kv.value
    n = len(v)
    head = [_element(_guarded_item(v, i)) for i in range(min(n, PREVIEW_ITEMS))]
    assert kv.elem_type is not None
    return {"type": kv.elem_type.name, "count": n, "head": head}


def _guarded_item(v: Any, i: int) -> Any:
    """Element ``i`` of an array value; numeric elements are copied under the fault guard."""
    if isinstance(v, np.ndarray):
        from ..native.kernels import copy_mapped

        return copy_mapped(v[i : i + 1], "metadata array")[0]
    return v[i]


def _scalar_equal(t: ValueType, a: Any, b: Any) -> bool:
    if t in (ValueType.FLOAT32, ValueType.FLOAT64):  # bit for bit: NaN equals itself, -0.0 differs from 0.0
        fmt = "<f" if t == ValueType.FLOAT32 else "<d"
        return struct.pack(fmt, a) == struct.pack(fmt, b)
    return bool(a == b)


def _first_diff_str(a: str, b: str) -> int:
    n = min(len(a), len(b))
    lo = 0
    step = 4096
    while lo < n and a[lo : lo + step] == b[lo : lo + step]:
        lo += step
    for i in range(lo, min(n, lo + step)):
        if a[i] != b[i]:
            return i
    return n


class _ArrayBytes:
    """The stored element bytes of an array value, read in guarded chunks, and the element at a byte position."""

    def __init__(self, kv: MetadataValue, f: GGUFFile) -> None:
        v = kv.value
        self.kv = kv
        self.value = v
        self.count = len(v)
        self._blob: bytes | None = None
        if isinstance(v, np.ndarray):
            self.nbytes = v.nbytes
            self.itemsize = v.dtype.itemsize
        elif isinstance(v, StringArray):
            self.nbytes = v.nbytes
            self.itemsize = 0
        else:  # arrays of arrays (rare): the entry as stored, less key (8 + n), type (4), element type and count
            self._blob = f.entry_bytes(kv.key)[kv.value_offset - kv.offset + 12 :]
            self.nbytes = len(self._blob)
            self.itemsize = -1

    def read(self, a: int, b: int) -> bytes:
        b = min(b, self.nbytes)
        if a >= b:
            return b""
        if self._blob is not None:
            return self._blob[a:b]
        v = self.value
        if isinstance(v, np.ndarray):
            from ..native.kernels import copy_mapped

            flat = v.reshape(-1).view(np.uint8)
            return copy_mapped(flat[a:b], f"metadata {self.kv.key}").tobytes()
        from ..native.mapped import copy_bytes

        assert isinstance(v, StringArray)
        return copy_bytes(v.buffer, v.start + a, v.start + b, f"metadata {self.kv.key}")

    def element_at(self, pos: int) -> int | None:
        """Index of the element holding byte ``pos`` (``None`` for nested arrays)."""
        if self.itemsize > 0:
            return pos // self.itemsize
        if self.itemsize == 0:
            assert isinstance(self.value, StringArray)
            return bisect_right(self.value.offsets(), pos) - 1
        return None


def _compare_arrays(ka: MetadataValue, kb: MetadataValue, fa: GGUFFile, fb: GGUFFile) -> MetadataChange | None:
    xa, xb = _ArrayBytes(ka, fa), _ArrayBytes(kb, fb)
    ha, hb = hashlib.blake2b(digest_size=16), hashlib.blake2b(digest_size=16)
    first_byte: int | None = None
    pos = 0
    common = min(xa.nbytes, xb.nbytes)
    while pos < max(xa.nbytes, xb.nbytes):
        end = pos + CHUNK_BYTES
        ca, cb = xa.read(pos, end), xb.read(pos, end)
        ha.update(ca)
        hb.update(cb)
        if first_byte is None and pos < common:
            n = min(len(ca), len(cb))
            if ca[:n] != cb[:n]:
                d = np.flatnonzero(np.frombuffer(ca[:n], np.uint8) != np.frombuffer(cb[:n], np.uint8))
                first_byte = pos + int(d[0])
        pos = end
    if first_byte is None and xa.nbytes == xb.nbytes and xa.count == xb.count:
        return None
    first: int | None
    if first_byte is None:  # one is a prefix of the other
        first = min(xa.count, xb.count)
    elif xa.itemsize >= 0:
        first = xa.element_at(first_byte)
    else:
        first = next((i for i in range(min(xa.count, xb.count))
                      if not _nested_equal(xa.value[i], xb.value[i])), min(xa.count, xb.count))
    ch = MetadataChange(ka.key, "value", ka.type_label, kb.type_label, _preview(ka), _preview(kb), xa.count,
                        xb.count, ha.hexdigest(), hb.hexdigest(), first)
    if first is not None:
        ch.at_a = _element(_guarded_item(xa.value, first)) if first < xa.count else None
        ch.at_b = _element(_guarded_item(xb.value, first)) if first < xb.count else None
    return ch


def _nested_equal(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, StringArray) and isinstance(b, StringArray):
        return len(a) == len(b) and a.copy() == b.copy()
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_nested_equal(x, y) for x, y in zip(a, b, strict=True))
    return False


def compare_metadata(fa: GGUFFile, fb: GGUFFile) -> tuple[list[MetadataChange], int]:
    """The metadata keys that differ (A's order, then keys new in B) and how many are the same."""
    out: list[MetadataChange] = []
    same = 0
    for key, ka in fa.metadata.items():
        kb = fb.metadata.get(key)
        if kb is None:
            out.append(MetadataChange(key, "removed", type_a=ka.type_label, value_a=_preview(ka),
                                      count_a=ka.count))
            continue
        ch = _compare_kv(ka, kb, fa, fb)
        if ch is None:
            same += 1
        else:
            out.append(ch)
    for key, kb in fb.metadata.items():
        if key not in fa.metadata:
            out.append(MetadataChange(key, "added", type_b=kb.type_label, value_b=_preview(kb), count_b=kb.count))
    return out, same


def _compare_kv(ka: MetadataValue, kb: MetadataValue, fa: GGUFFile, fb: GGUFFile) -> MetadataChange | None:
    if ka.type_label != kb.type_label:
        return MetadataChange(ka.key, "type", ka.type_label, kb.type_label, _preview(ka), _preview(kb), ka.count,
                              kb.count)
    if ka.type == ValueType.ARRAY:
        return _compare_arrays(ka, kb, fa, fb)
    va, vb = ka.value, kb.value
    if ka.type == ValueType.STRING:
        if va == vb:
            return None
        i = _first_diff_str(va, vb)
        return MetadataChange(ka.key, "value", ka.type_label, kb.type_label, _cut(va), _cut(vb), first_diff=i,
                              at_a=va[i : i + 40] if i < len(va) else None,
                              at_b=vb[i : i + 40] if i < len(vb) else None)
    if _scalar_equal(ka.type, va, vb):
        return None
    return MetadataChange(ka.key, "value", ka.type_label, kb.type_label, va, vb)


# ------------------------------------------------------------------------------------------------ tensors
def _readable(f: GGUFFile, t: TensorInfo) -> str | None:
    """Why the values of ``t`` cannot be read (``None`` when they can)."""
    from ..analysis import can_read_values

    if t.problem is not None:
        return f"{t.name} in {_label(f)} cannot be read: {t.problem}"
    if not can_read_values(t):
        return f"no dequantizer for {t.type_name}"
    return None


def _label(f: GGUFFile) -> str:
    return str(f.path) if f.path is not None else "the buffer"


class _Progress:
    """Monotonic byte progress over a whole comparison."""

    def __init__(self, total: int, progress: Progress | None) -> None:
        self.total = total
        self.base = 0
        self.last = -1
        self.progress = progress

    def at(self, done: int) -> None:
        v = min(self.total, self.base + done)
        if self.progress is not None and v > self.last:
            self.last = v
            self.progress(v, self.total)

    def finish(self, n: int) -> None:
        self.base += n
        self.at(0)


def _bytes_first_diff(fa: GGUFFile, ta: TensorInfo, fb: GGUFFile, tb: TensorInfo, cancel: CancelFlag | None,
                      tick: Callable[[int], None]) -> int | None:
    """Offset of the first differing byte of two same-size tensors (``None``: identical)."""
    from ..native.kernels import copy_mapped

    n = ta.n_bytes or 0
    ra, rb = fa.tensor_bytes(ta), fb.tensor_bytes(tb)
    for a in range(0, n, CHUNK_BYTES):
        check_cancel(cancel, DiffCancelled)
        b = min(n, a + CHUNK_BYTES)
        ca = copy_mapped(ra[a:b], f"tensor {ta.name}")
        cb = copy_mapped(rb[a:b], f"tensor {tb.name}")
        if not np.array_equal(ca, cb):
            return a + int(np.flatnonzero(ca != cb)[0])
        fa.release_pages(ta.data_offset + a, b - a, ta.shard)  # resident memory stays near a chunk, not a tensor
        fb.release_pages(tb.data_offset + a, b - a, tb.shard)
        tick(2 * b)
    return None


def _row_runs(rows: np.ndarray, chunk: int) -> Iterator[tuple[int, int]]:
    """Contiguous stretches of the ascending ``rows``, each at most ``chunk`` rows."""
    if rows.size == 0:
        return
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    for a, b in zip([0, *breaks.tolist()], [*breaks.tolist(), rows.size], strict=True):
        r0, r1 = int(rows[a]), int(rows[b - 1]) + 1
        for s in range(r0, r1, chunk):
            yield s, min(r1, s + chunk)


class _Sums:
    def __init__(self) -> None:
        self.n = 0
        self.d2 = self.a2 = self.b2 = self.ab = 0.0
        self.max_abs = 0.0
        self.max_at: tuple[int, int] | None = None
        self.nonfinite_a = self.nonfinite_b = 0

    def add(self, row0: int, x: np.ndarray, y: np.ndarray) -> None:
        """Rows ``row0..`` of A (``x``) and B (``y``), float32 of shape (rows, ne0)."""
        fa, fb = np.isfinite(x), np.isfinite(y)
        both = fa & fb
        if both.all():
            a, b = x.reshape(-1).astype(np.float64), y.reshape(-1).astype(np.float64)
            idx = None
        else:
            self.nonfinite_a += int(x.size - np.count_nonzero(fa))
            self.nonfinite_b += int(y.size - np.count_nonzero(fb))
            idx = np.flatnonzero(both.reshape(-1))
            a, b = x.reshape(-1)[idx].astype(np.float64), y.reshape(-1)[idx].astype(np.float64)
        if not a.size:
            return
        d = b - a
        self.n += a.size
        self.d2 += float(np.dot(d, d))
        self.a2 += float(np.dot(a, a))
        self.b2 += float(np.dot(b, b))
        self.ab += float(np.dot(a, b))
        np.abs(d, out=d)
        k = int(np.argmax(d))
        if d[k] > self.max_abs or self.max_at is None:
            self.max_abs = float(d[k])
            flat = k if idx is None else int(idx[k])
            ne0 = x.shape[1]
            self.max_at = (row0 + flat // ne0, flat % ne0)

    def result(self, rows_compared: int, rows_total: int, first_diff_row: int | None) -> ValueDiff:
        n = self.n
        rmse = math.sqrt(self.d2 / n) if n else 0.0
        rms_a = math.sqrt(self.a2 / n) if n else 0.0
        rms_b = math.sqrt(self.b2 / n) if n else 0.0
        if self.a2 == 0 and self.b2 == 0:
            cos = 1.0
        elif self.a2 == 0 or self.b2 == 0:
            cos = math.nan
        else:
            cos = self.ab / math.sqrt(self.a2 * self.b2)
        rel = rmse / rms_a if rms_a > 0 else (0.0 if rmse == 0 else math.inf)
        return ValueDiff(False, rmse, self.max_abs, cos, rel, rms_a, rms_b, n, rows_compared, rows_total,
                         self.nonfinite_a, self.nonfinite_b, self.max_at, first_diff_row)


def _release(fa: GGUFFile, ta: TensorInfo, fb: GGUFFile, tb: TensorInfo, r0: int, r1: int) -> None:
    """Drop this process's mapping of rows ``[r0, r1)`` of both tensors."""
    for f, t in ((fa, ta), (fb, tb)):
        if t.row_bytes:
            f.release_pages(t.data_offset + r0 * t.row_bytes, (r1 - r0) * t.row_bytes, t.shard)


def _sampled_rows(t: TensorInfo, max_rows: int | None) -> np.ndarray:
    from ..quant.lab import n_matrices, sample_rows

    return sample_rows(t.n_rows, max_rows, n_matrices(t.ne))


def compare_values(fa: GGUFFile, ta: TensorInfo, fb: GGUFFile, tb: TensorInfo, *, max_rows: int | None = None,
                   threads: int = 1, progress: Progress | None = None,
                   cancel: CancelFlag | None = None) -> ValueDiff:
    """Compare two tensors of the same shape (see :class:`ValueDiff`); progress in bytes of both tensors.

    Same type: the bytes first (stopping at the first difference; identical → ``exact``, nothing dequantized),
    then only the chunks whose bytes differ are dequantized twice."""
    from ..analysis import dequantize_rows
    from ..native.kernels import copy_mapped

    if ta.ne != tb.ne:
        raise ValueError(f"{ta.name}: shapes {list(ta.shape)} and {list(tb.shape)} differ")
    for f, t in ((fa, ta), (fb, tb)):
        if t.problem is not None or t.n_bytes is None:
            raise ValueError(f"{t.name} in {_label(f)} cannot be read: {t.problem or t.type_name}")
    total = (ta.n_bytes or 0) + (tb.n_bytes or 0)
    prog = _Progress(total, progress)
    same_type = ta.type_id == tb.type_id
    first_row: int | None = None
    if same_type:
        first = _bytes_first_diff(fa, ta, fb, tb, cancel, prog.at)
        if first is None:
            prog.at(total)
            return ValueDiff(True, 0.0, 0.0, 1.0, 0.0, None, None, ta.n_elements, ta.n_rows, ta.n_rows)
        assert ta.row_bytes is not None
        first_row = first // ta.row_bytes if ta.row_bytes else 0
    for f, t in ((fa, ta), (fb, tb)):
        why = _readable(f, t)
        if why:
            raise ValueError(f"{why}: values not compared" + (" (the bytes differ)" if same_type else ""))
    rows = _sampled_rows(ta, max_rows)
    chunk = max(1, CHUNK_VALUES // max(1, ta.row_len))
    sums = _Sums()
    ra = fa.tensor_rows(ta) if same_type else None
    rb = fb.tensor_rows(tb) if same_type else None
    done_rows = rel_from = 0
    for r0, r1 in _row_runs(rows, chunk):
        check_cancel(cancel, DiffCancelled)
        x = dequantize_rows(fa, ta, r0, r1, threads=threads)
        if same_type and (r1 <= (first_row or 0) or np.array_equal(
                copy_mapped(ra[r0:r1], ta.name), copy_mapped(rb[r0:r1], tb.name))):  # type: ignore[index]
            y = x
        else:
            y = dequantize_rows(fb, tb, r0, r1, threads=threads)
        sums.add(r0, x, y)
        if (r1 - rel_from) * max(ta.row_bytes or 0, tb.row_bytes or 0) >= CHUNK_BYTES:
            _release(fa, ta, fb, tb, rel_from, r1)  # resident memory stays near a chunk (sampled rows too)
            rel_from = r1
        done_rows += r1 - r0
        prog.at(total * done_rows // max(1, rows.size))
    _release(fa, ta, fb, tb, rel_from, ta.n_rows)
    res = sums.result(int(rows.size), ta.n_rows, first_row)
    prog.at(total)
    return res


def _tensor_ok(t: TensorInfo) -> bool:
    return t.problem is None and t.type is not None


def diff_files(a: GGUFFile, b: GGUFFile, *, values: bool = True,
               tensor: str | re.Pattern[str] | UserPattern | None = None, max_rows: int | None = None,
               threads: int = 1, progress: Progress | None = None, cancel: CancelFlag | None = None) -> FileDiff:
    """Compare ``a`` (the reference) with ``b``; see :class:`FileDiff`.

    ``tensor``: a regular expression; only tensors whose name it finds (``re.search``) are compared. ``values``
    False compares the headers only (tensors of the same type and shape are ``unchecked``). ``max_rows``: compute
    the value figures on at most that many evenly spaced rows per tensor (the exact check still reads every
    byte). Progress: bytes of tensor data, both files."""
    if max_rows is not None and max_rows < 1:
        raise ValueError(f"max_rows must be at least 1, got {max_rows}")
    pat = UserPattern(tensor, "--tensor") if isinstance(tensor, str) else tensor  # time-bounded search
    meta, same = compare_metadata(a, b)
    out = FileDiff(_side(a), _side(b), meta, same, tensor_filter=None if pat is None else pat.pattern,
                   values_compared=values, max_rows=max_rows)

    def wanted(name: str) -> bool:
        return pat is None or pat.search(name) is not None

    pairs: list[tuple[TensorInfo, TensorInfo]] = []
    for ta in a.tensors:
        if not wanted(ta.name):
            continue
        if not b.has_tensor(ta.name):
            out.tensors.append(TensorDiff(ta.name, "removed", type_a=ta.type_name, shape_a=ta.shape))
            continue
        tb = b.tensor(ta.name)
        td = TensorDiff(ta.name, "unchecked", ta.type_name, tb.type_name, ta.shape, tb.shape)
        if td.reshaped:
            td.status = "changed"
            td.note = "shape changed: values not compared"
        elif values:
            if _tensor_ok(ta) and _tensor_ok(tb) and ta.n_bytes is not None and tb.n_bytes is not None:
                pairs.append((ta, tb))
            else:  # a problem in one file only (or a different one) is a difference; the same in both is not known
                td.status = "changed" if td.retyped or ta.problem != tb.problem else "unchecked"
                td.note = next(f"{t.name} in {_label(f)} cannot be read: {t.problem or t.type_name}"
                               for f, t in ((a, ta), (b, tb)) if not _tensor_ok(t) or t.n_bytes is None)
        elif td.retyped:
            td.status = "changed"
        out.tensors.append(td)
    for tb in b.tensors:
        if wanted(tb.name) and not a.has_tensor(tb.name):
            out.tensors.append(TensorDiff(tb.name, "added", type_b=tb.type_name, shape_b=tb.shape))
    if values:
        by_name = {t.name: t for t in out.tensors}
        prog = _Progress(sum((ta.n_bytes or 0) + (tb.n_bytes or 0) for ta, tb in pairs), progress)
        for ta, tb in pairs:
            check_cancel(cancel, DiffCancelled)
            td = by_name[ta.name]
            try:
                vd = compare_values(a, ta, b, tb, max_rows=max_rows, threads=threads,
                                    progress=lambda d, _t: prog.at(d), cancel=cancel)
            except ValueError as exc:  # no dequantizer: the bytes differ (or the types do)
                td.status = "changed"
                td.note = str(exc)
            else:
                td.values = vd
                td.status = "same" if vd.exact else "changed"
            prog.finish((ta.n_bytes or 0) + (tb.n_bytes or 0))
            a.release_pages(ta.data_offset, ta.n_bytes or 0, ta.shard)
            b.release_pages(tb.data_offset, tb.n_bytes or 0, tb.shard)
        prog.at(prog.total)
    return out


def _side(f: GGUFFile) -> FileSide:
    return FileSide(None if f.path is None else str(f.path), f.version, f.file_size, len(f.tensors),
                    len(f.metadata))


# ------------------------------------------------------------------------------------------------ locate
def _abs_diff(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """|y - x| with equal values (NaN with NaN, inf with inf) 0 and any other non-finite pair infinite."""
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(y - x)
    d[(x == y) | (np.isnan(x) & np.isnan(y))] = 0.0
    d[np.isnan(d)] = np.inf
    return d


def locate_difference(fa: GGUFFile, fb: GGUFFile, name: str, *, threads: int = 1, progress: Progress | None = None,
                      cancel: CancelFlag | None = None) -> DiffLocation | None:
    """Where tensor ``name`` differs most between the files (``None`` when its values are equal everywhere).

    Both tensors must have the same shape and readable values. Rows are scanned in chunks; the region is
    ``lcm(block A, block B)`` columns, so it holds whole blocks of both types."""
    from ..analysis import dequantize_rows

    ta, tb = fa.tensor(name), fb.tensor(name)
    if ta.ne != tb.ne:
        raise ValueError(f"{name}: shapes {list(ta.shape)} and {list(tb.shape)} differ")
    for f, t in ((fa, ta), (fb, tb)):
        why = _readable(f, t)
        if why:
            raise ValueError(why)
    assert ta.type is not None and tb.type is not None
    ba, bb = ta.type.block_elems, tb.type.block_elems
    g = math.lcm(ba, bb)
    ne0 = ta.row_len
    if ne0 == 0 or ta.n_rows == 0:
        return None
    starts = np.arange(0, ne0, g)
    chunk = max(1, CHUNK_VALUES // ne0)
    total = (ta.n_bytes or 0) + (tb.n_bytes or 0)
    first_row = 0
    if ta.type_id == tb.type_id:  # the rows before the first differing byte are equal: start there
        first = _bytes_first_diff(fa, ta, fb, tb, cancel, lambda _d: None)
        if first is None:
            return None
        assert ta.row_bytes
        first_row = first // ta.row_bytes
    best = (-1.0, 0, 0)  # (sse, row, region index)
    for r0 in range(first_row, ta.n_rows, chunk):
        check_cancel(cancel, DiffCancelled)
        r1 = min(ta.n_rows, r0 + chunk)
        x = dequantize_rows(fa, ta, r0, r1, threads=threads).astype(np.float64)
        y = dequantize_rows(fb, tb, r0, r1, threads=threads).astype(np.float64)
        d = _abs_diff(x, y)
        sse = np.add.reduceat(d * d, starts, axis=1)
        k = int(np.argmax(sse))
        i, j = divmod(k, sse.shape[1])
        if sse[i, j] > best[0]:
            best = (float(sse[i, j]), r0 + i, j)
        _release(fa, ta, fb, tb, r0, r1)
        if progress is not None:
            progress(total * r1 // ta.n_rows, total)
    sse, row, j = best
    if sse <= 0:
        return None
    c0, c1 = j * g, min(ne0, (j + 1) * g)
    x = dequantize_rows(fa, ta, row, row + 1)[0, c0:c1].astype(np.float64)
    y = dequantize_rows(fb, tb, row, row + 1)[0, c0:c1].astype(np.float64)
    d = _abs_diff(x, y)
    k = int(np.argmax(d))
    col = c0 + k
    return DiffLocation(name, row, col, col // ba, col // bb, col % ba, col % bb, (c0, c1),
                        math.sqrt(sse / (c1 - c0)), float(d[k]), float(x[k]), float(y[k]))


#: columns shown around a located element when its region is narrower
MIN_WINDOW = 16


@dataclass
class SideBlock:
    """One file's block at a located difference: where it is, decoded (``None`` without a field decoder), and the
    values of the shown window of columns."""

    type_name: str
    block: int  # in the row
    element: int  # of the located column, in the block
    block_elems: int
    offset: int  # in the file
    size: int
    decoded: DecodedBlock | None
    values: np.ndarray  # float32, columns window[0]..window[1]


@dataclass
class Located:
    """Where two tensors differ most (``loc``) and both blocks there; ``window`` = the columns shown (the region,
    or :data:`MIN_WINDOW` columns around the element when the region is narrower)."""

    loc: DiffLocation
    window: tuple[int, int]
    a: SideBlock
    b: SideBlock


def _window_values(f: GGUFFile, t: TensorInfo, row: int, w0: int, w1: int) -> np.ndarray:
    """Columns ``[w0, w1)`` of ``row``, block by block through the block decoder (the inspector's values)."""
    from ..quant.blocks import can_decode, decode_block

    assert t.type is not None
    be = t.type.block_elems
    if not can_decode(t.type):
        from ..analysis import dequantize_rows

        return dequantize_rows(f, t, row, row + 1)[0, w0:w1].astype(np.float32)
    b0, b1 = w0 // be, (w1 - 1) // be
    vals = np.concatenate([np.asarray(decode_block(t.type, f.block_bytes(t, row, b)).values, np.float32)
                           for b in range(b0, b1 + 1)])
    return vals[w0 - b0 * be : w1 - b0 * be]


def _side_block(f: GGUFFile, t: TensorInfo, row: int, block: int, element: int, w0: int, w1: int) -> SideBlock:
    from ..quant.blocks import can_decode, decode_block

    assert t.type is not None
    offset, size = f.block_location(t, row, block)
    decoded = decode_block(t.type, f.block_bytes(t, row, block)) if can_decode(t.type) else None
    return SideBlock(t.type.name, block, element, t.type.block_elems, offset, size, decoded,
                     _window_values(f, t, row, w0, w1))


def locate_blocks(fa: GGUFFile, fb: GGUFFile, name: str, *, threads: int = 0, progress: Progress | None = None,
                  cancel: CancelFlag | None = None) -> Located | None:
    """:func:`locate_difference` and both files' blocks there (``None`` when the values are equal everywhere)."""
    loc = locate_difference(fa, fb, name, threads=threads, progress=progress, cancel=cancel)
    if loc is None:
        return None
    ta, tb = fa.tensor(name), fb.tensor(name)
    w0, w1 = loc.region
    if w1 - w0 < MIN_WINDOW:
        w0 = loc.col // MIN_WINDOW * MIN_WINDOW
        w1 = min(ta.row_len, w0 + MIN_WINDOW)
    return Located(loc, (w0, w1), _side_block(fa, ta, loc.row, loc.block_a, loc.element_a, w0, w1),
                   _side_block(fb, tb, loc.row, loc.block_b, loc.element_b, w0, w1))
