"""Importance matrices: llama.cpp's imatrix files, read and turned into per-column weights (docs/quantize.md#imatrix).

An importance matrix holds, for every matrix a model multiplies activations by, the sum over a text of each input
column's squared activation (``in_sum2``) and how many activation rows went into it (``counts``, one per expert for
3-D expert tensors). The quantizers weigh each column's error by ``in_sum2 / count``: the columns that carry large
activations get the smallest error.

Two formats exist, and :func:`read_imatrix` takes both:

* **GGUF** (current llama-imatrix): tensors ``NAME.in_sum2`` (F32, ``ne = [n_cols, n_mat]``) and ``NAME.counts``
  (F32, ``ne = [1, n_mat]``), metadata ``imatrix.datasets`` (strings), ``imatrix.chunk_count`` and
  ``imatrix.chunk_size``. A file without all three keys is refused by llama-quantize, and here too.
* **legacy .dat**: ``int32 n_entries``, then per entry ``int32 name_len, name, int32 ncall, int32 nval,
  float32 values[nval]`` (values already divided by the count and multiplied by ``ncall``), then optionally
  ``int32 chunk_count, int32 len, dataset``.

Every count and length is checked against the file before anything is allocated (a legacy file is mapped, not
read whole: a large file that is no imatrix is refused after its first bytes); every importance value must be a
finite number in 0..:data:`MAX_IMPORTANCE` (NaN, infinities and 3e38 would quantize to NaN/inf scales). A problem
is an :class:`ImatrixError` naming the entry.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..base.ggml_types import ggml_type
from ..base.gguf_constants import DEFAULT_ALIGNMENT, ValueType
from ..gguf import GGUFError, GGUFFile
from ..gguf.writer import DataSection, GGUFHeader, ggml_dims, write_gguf

MAX_NAME_BYTES = 1 << 16
#: the largest importance value accepted (sums of squared activations; far beyond any real model's, far below
#: what overflows the quantizers' float32 error sums)
MAX_IMPORTANCE = 1e30


class ImatrixError(ValueError):
    """The file is not a readable importance matrix."""


@dataclass
class ImatrixEntry:
    """One matrix's statistics: ``sums`` (n_mat x n_cols, flat) and one count per sub-matrix (expert)."""

    sums: np.ndarray
    counts: np.ndarray  # int64

    @property
    def n_mat(self) -> int:
        return int(self.counts.size)

    @property
    def n_cols(self) -> int:
        return self.sums.size // max(self.counts.size, 1)


@dataclass
class Imatrix:
    """A loaded importance matrix (either format)."""

    path: Path
    entries: dict[str, ImatrixEntry]
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0
    chunk_size: int = 0
    is_legacy: bool = False

    def weights(self, name: str) -> np.ndarray | None:
        """The quantizer's importance weights for tensor ``name`` (all experts, flat), llama-quantize's way:
        GGUF sums divided by their expert's count (1 where the count is 0); legacy values divided by ``ncall``."""
        e = self.entries.get(name)
        if e is None:
            return None
        if self.is_legacy:
            ncall = int(e.counts[0]) if e.counts.size else 0
            return (e.sums / np.float32(ncall)).astype(np.float32) if ncall > 0 else e.sums.copy()
        out = np.empty_like(e.sums)
        n = e.n_cols
        for j in range(e.n_mat):
            cnt = np.float32(e.counts[j])
            seg = e.sums[j * n:(j + 1) * n]
            out[j * n:(j + 1) * n] = seg / cnt if cnt > 0 else np.float32(1.0)
        return out

    def summary(self) -> dict[str, object]:
        return {"path": str(self.path), "format": "legacy" if self.is_legacy else "gguf", "entries": len(self.entries),
                "datasets": self.datasets, "chunk_count": self.chunk_count, "chunk_size": self.chunk_size}

    def entry_stats(self) -> list[dict[str, object]]:
        """Per entry, in the order of ``entries``: ``name``, ``n_cols``, ``n_mat`` (experts), ``count`` (the
        largest), and the ``mean``, ``max`` and number of ``zeros`` of its importance weights over every expert
        (``quantscope imatrix``'s rows)."""
        rows: list[dict[str, object]] = []
        for name, e in self.entries.items():
            w = self.weights(name)
            assert w is not None
            rows.append({"name": name, "n_cols": e.n_cols, "n_mat": e.n_mat,
                         "count": int(e.counts.max()) if e.counts.size else 0,
                         "mean": float(w.mean()) if w.size else 0.0, "max": float(w.max()) if w.size else 0.0,
                         "zeros": int((w == 0).sum())})
        return rows


def read_imatrix(path: str | os.PathLike[str]) -> Imatrix:
    """Read an imatrix file (GGUF, or legacy when it is not a GGUF); a FIFO, device or folder is refused
    (:class:`~quantscope.core.fsutil.PathRefused`) before anything blocks."""
    from ..fsutil import open_input, pread

    p = Path(path)
    fd = open_input(p)
    try:
        magic = pread(fd, 4, 0)
        if magic == b"GGUF":
            return _read_gguf(p)
        return _read_legacy(p, fd)
    finally:
        os.close(fd)


def _check_values(p: Path, name: str, values: np.ndarray) -> None:
    """Importance values must be finite, not negative and at most :data:`MAX_IMPORTANCE`."""
    with np.errstate(invalid="ignore"):
        bad = ~(np.isfinite(values) & (values >= 0) & (values <= MAX_IMPORTANCE))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ImatrixError(f"{p}: {name} has an importance value {float(values[i]):g} (column {i}); values must be "
                           f"finite numbers in 0..{MAX_IMPORTANCE:g} (NaN, infinities or huge values would quantize "
                           "to NaN/inf scales)")


def _read_gguf(p: Path) -> Imatrix:
    try:
        f = GGUFFile(p)
    except GGUFError as exc:
        raise ImatrixError(f"{p}: {exc}") from None
    with f:
        if not f.tensors:
            raise ImatrixError(f"{p}: no data (the file holds no tensors)")
        missing = [k for k in ("imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size") if k not in f]
        if missing:
            raise ImatrixError(f"{p}: missing imatrix metadata ({', '.join(missing)}); llama-quantize refuses it too")
        ds = f.metadata["imatrix.datasets"]
        datasets = [str(x) for x in ds.value] if ds.type_label == "ARRAY[STRING]" else []
        pairs: dict[str, list[object]] = {}
        for t in f.tensors:
            for suffix, slot in ((".in_sum2", 0), (".counts", 1)):
                if t.name.endswith(suffix) and len(t.name) > len(suffix):
                    pairs.setdefault(t.name[: -len(suffix)], [None, None])[slot] = t
        entries: dict[str, ImatrixEntry] = {}
        for name in sorted(pairs):
            s, c = pairs[name]
            if s is None or c is None:
                raise ImatrixError(f"{p}: {name} has {'no counts' if c is None else 'no sums'}")
            if s.type_name != "F32" or c.type_name != "F32":  # type: ignore[attr-defined]
                raise ImatrixError(f"{p}: the sums and counts of {name} must be F32")
            sums = np.array(f.tensor_array(s), dtype=np.float32).reshape(-1)  # type: ignore[arg-type]
            counts_f = np.array(f.tensor_array(c), dtype=np.float32).reshape(-1)  # type: ignore[arg-type]
            if counts_f.size == 0 or sums.size % counts_f.size:
                raise ImatrixError(f"{p}: {name} has {sums.size} sums for {counts_f.size} counts")
            if not np.all(np.isfinite(counts_f)) or np.any(np.abs(counts_f) > 2.0**62):
                raise ImatrixError(f"{p}: {name} has counts that are not finite numbers")
            counts = np.array([_lround(float(v)) for v in counts_f], dtype=np.int64)
            _check_values(p, name, sums)
            entries[name] = ImatrixEntry(sums, counts)
        return Imatrix(p, entries, datasets, _u32(f.get("imatrix.chunk_count")), _u32(f.get("imatrix.chunk_size")))


def _u32(v: object) -> int:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else 0


def _lround(v: float) -> int:
    """C's lround: halves away from zero."""
    import math

    return math.floor(v + 0.5) if v >= 0 else -math.floor(-v + 0.5)


def _read_legacy(p: Path, fd: int) -> Imatrix:
    import mmap

    size = os.fstat(fd).st_size
    if size < 4:
        raise ImatrixError(f"{p}: not an imatrix file (neither GGUF nor a legacy file with entries)")
    try:
        mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as exc:
        raise ImatrixError(f"{p}: cannot map the file: {exc}") from None
    view = memoryview(mm)
    try:
        return _parse_legacy(p, view, size)
    finally:
        try:
            view.release()
            mm.close()
        except BufferError:  # a view still refers to it: unmapped when collected
            pass


def _parse_legacy(p: Path, data: memoryview, size: int) -> Imatrix:
    """The legacy layout, parsed from the mapping (only the bytes walked are touched; values are copied)."""
    pos = 0

    def i32(what: str) -> int:
        nonlocal pos
        if pos + 4 > size:
            raise ImatrixError(f"{p}: ends inside {what} (byte {pos} of {size})")
        (v,) = struct.unpack_from("<i", data, pos)
        pos += 4
        return int(v)

    n_entries = i32("the entry count")
    if n_entries < 1:
        raise ImatrixError(f"{p}: not an imatrix file (neither GGUF nor a legacy file with entries)")
    if n_entries > (size - 4) // 16:
        raise ImatrixError(f"{p}: {n_entries} entries cannot fit in {size} bytes; not an imatrix file")
    entries: dict[str, ImatrixEntry] = {}
    for i in range(n_entries):
        n = i32(f"entry {i + 1}'s name length")
        if n < 0 or n > MAX_NAME_BYTES or pos + n > size:
            raise ImatrixError(f"{p}: entry {i + 1}'s name length {n} is out of range")
        raw = bytes(data[pos:pos + n]).split(b"\0", 1)[0]
        pos += n
        name = raw.decode("utf-8", "replace")
        ncall = i32(f"{name}'s call count")
        nval = i32(f"{name}'s value count")
        if nval < 1 or pos + 4 * nval > size:
            raise ImatrixError(f"{p}: {name} claims {nval} values; {max(size - pos, 0) // 4} are left in the file")
        sums = np.frombuffer(data, dtype="<f4", count=nval, offset=pos).astype(np.float32)
        pos += 4 * nval
        _check_values(p, name, sums)
        entries[name] = ImatrixEntry(sums, np.array([ncall], dtype=np.int64))
    chunk_count = 0
    datasets: list[str] = []
    if pos < size:
        chunk_count = i32("the chunk count") if pos + 4 <= size else 0
        if pos + 4 <= size:
            n = i32("the dataset name length")
            if 0 < n <= size - pos:
                datasets.append(bytes(data[pos:pos + n]).split(b"\0", 1)[0].decode("utf-8", "replace"))
    return Imatrix(p, entries, datasets, chunk_count, 0, is_legacy=True)


def _imatrix_header(im: Imatrix) -> tuple[GGUFHeader, list[np.ndarray]]:
    """llama-imatrix's GGUF layout: ``general.type`` "imatrix", ``imatrix.datasets``, ``imatrix.chunk_count``,
    ``imatrix.chunk_size``; per entry, in name order, ``NAME.in_sum2`` (F32 ``[n_cols, n_mat]``) and
    ``NAME.counts`` (F32 ``[1, n_mat]``), dimensions counted as ggml counts them. Returns the header and the
    tensors' data in order."""
    header = GGUFHeader(DEFAULT_ALIGNMENT)
    header.add_string("general.type", "imatrix")
    header.add("imatrix.datasets", ValueType.ARRAY, im.datasets, ValueType.STRING)
    header.add_u32("imatrix.chunk_count", im.chunk_count & 0xFFFFFFFF)
    header.add_u32("imatrix.chunk_size", im.chunk_size & 0xFFFFFFFF)
    f32 = ggml_type("F32").id
    data: list[np.ndarray] = []
    for name in sorted(im.entries):
        e = im.entries[name]
        for suffix, ne, values in ((".in_sum2", (e.n_cols, e.n_mat), e.sums), (".counts", (1, e.n_mat), e.counts)):
            arr = np.ascontiguousarray(values, dtype="<f4")
            header.add_tensor(name + suffix, ggml_dims(ne), f32, arr.nbytes)
            data.append(arr)
    return header, data


def imatrix_bytes(im: Imatrix) -> bytes:
    """The whole file :func:`write_imatrix` writes, in memory."""
    header, data = _imatrix_header(im)
    out = bytearray(header.encode())
    section = DataSection.for_header(header, out.extend)
    for arr in data:
        section.tensor([arr.view(np.uint8).data])
    section.finish()
    return bytes(out)


def write_imatrix(im: Imatrix, path: str | os.PathLike[str], inputs: tuple[str | os.PathLike[str], ...] = ()) -> Path:
    """Write ``im`` in llama-imatrix's GGUF format, atomically (a temporary renamed into place)."""
    header, data = _imatrix_header(im)
    return write_gguf(path, header, ([a.view(np.uint8).data] for a in data), "imatrix output", list(inputs))
