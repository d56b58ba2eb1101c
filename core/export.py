"""Export what a GGUF file holds to standard formats: a tensor as ``.npy``, a decoded block as CSV or JSON, the
metadata (and tensor index) as JSON.

Every writer goes through :class:`~quantscope.core.fsutil.OutputSet`: a temporary in the target folder renamed into
place at the end, never the input file, never a FIFO or device; a failure or a cancel leaves nothing behind.
Tensors are streamed block range by block range (the ``.npy`` header first, then the data), so memory stays
bounded whatever the tensor's size; ``progress(done, total)`` is in bytes written.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .fsutil import OutputSet, PathRefused, json_text
from .gguf import GGUFFile, StringArray, TensorInfo
from .jobs import CancelFlag, Cancelled, Progress, check_cancel
from .quant import DecodedBlock

#: Bytes of output per chunk of a tensor export.
CHUNK_BYTES = 8 << 20
BLOCK_FORMATS = ("csv", "json")
#: The columns of a block's CSV (see :func:`block_csv_rows`).
BLOCK_CSV_COLUMNS = ("section", "name", "index", "value", "bits", "offset", "size", "kind", "description")
METADATA_FORMAT = "quantscope-metadata"


class ExportCancelled(Cancelled):
    """An export stopped because its cancel token was set; nothing was written at the target path."""


@dataclass(frozen=True)
class NpyExport:
    """A written ``.npy``: where, its dtype (numpy ``descr``) and shape, and the bytes of data after the header."""

    path: Path
    dtype: str
    shape: tuple[int, ...]
    data_bytes: int
    raw: bool


def _tensor(f: GGUFFile, t: TensorInfo | str) -> TensorInfo:
    return f.tensor(t) if isinstance(t, str) else t


def npy_layout(t: TensorInfo, raw: bool = False) -> tuple[np.dtype, tuple[int, ...]]:
    """The dtype and shape a tensor's ``.npy`` has.

    Dequantized: float32 in the tensor's numpy shape (``ne`` reversed). ``raw``: block types as their bytes,
    ``uint8`` of shape (rows, bytes per row); element types (F32, F16, BF16 as ``uint16``, F64, I8…I64) in their
    own dtype and the numpy shape. Raises ``ValueError`` when the tensor cannot be exported."""
    if t.type is None or t.problem is not None or t.n_bytes is None:
        raise ValueError(f"{t.name} cannot be read: {t.problem or t.type_name}")
    if not raw:
        from .analysis import can_read_values

        if not can_read_values(t):
            raise ValueError(f"{t.name}: values of {t.type_name} cannot be computed (export it with raw=True)")
        return np.dtype("<f4"), t.shape
    if t.type.is_quantized:
        assert t.row_bytes is not None
        return np.dtype(np.uint8), (t.n_rows, t.row_bytes)
    if t.type.dtype is None:  # pragma: no cover - every element type has one (BF16 as its 16 bits)
        raise ValueError(f"{t.name}: no raw dtype for {t.type.name}")
    return np.dtype(t.type.dtype), t.shape


def npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """The ``.npy`` header (format 1.0, or 2.0 when it needs more than 64 KiB) for C-order data."""
    from numpy.lib import format as npf

    d = {"descr": npf.dtype_to_descr(dtype), "fortran_order": False, "shape": tuple(int(x) for x in shape)}
    buf = io.BytesIO()
    try:
        npf.write_array_header_1_0(buf, d)
    except ValueError:  # header too long for format 1.0
        buf = io.BytesIO()
        npf.write_array_header_2_0(buf, d)
    return buf.getvalue()


def _value_chunks(f: GGUFFile, t: TensorInfo, threads: int) -> Iterator[tuple[np.ndarray, int]]:
    """The tensor's values as float32, in runs of whole blocks (any row length): (values, bytes of input read)."""
    from .native import kernels as native
    from .quant import dequantize as ref_dequantize

    assert t.type is not None and t.n_bytes is not None
    bb = t.type.block_bytes
    step = max(1, CHUNK_BYTES // 4 // t.type.block_elems) * bb
    raw = f.tensor_bytes(t)
    for a in range(0, t.n_bytes, step):
        part = raw[a : min(t.n_bytes, a + step)]
        if t.type.is_exact:  # integers and F64: their values, cast
            assert t.type.dtype is not None
            x = native.copy_mapped(part, f"tensor {t.name}").view(t.type.dtype).astype(np.float32)
        elif native.can_dequantize(t.type):
            x = native.dequantize(part, t.type, threads=threads)
        else:
            x = ref_dequantize(native.copy_mapped(part, f"tensor {t.name}"), t.type)
        yield x.astype("<f4", copy=False), part.size


def _raw_chunks(f: GGUFFile, t: TensorInfo) -> Iterator[tuple[np.ndarray, int]]:
    from .native import kernels as native

    assert t.n_bytes is not None
    raw = f.tensor_bytes(t)
    for a in range(0, t.n_bytes, CHUNK_BYTES):
        part = native.copy_mapped(raw[a : min(t.n_bytes, a + CHUNK_BYTES)], f"tensor {t.name}")
        yield part, part.size


def _inputs(f: GGUFFile) -> list[Path]:
    return [f.path] if f.path is not None else []


def _outs(f: GGUFFile, label: str, out: str | os.PathLike[str]) -> OutputSet:
    """The output set for ``out`` (checked against ``f``'s file); a name ending in a slash is refused (``Path``
    would drop the slash and write a file where a folder was meant)."""
    text = os.fspath(out)
    if isinstance(text, str) and text.endswith(("/", os.sep)):
        raise PathRefused(f"{label} {text!r}: not a file name (it ends with a slash)")
    return OutputSet([(label, out)], inputs=_inputs(f))


def export_tensor_npy(f: GGUFFile, tensor: TensorInfo | str, out: str | os.PathLike[str], *, raw: bool = False,
                      threads: int = 1, progress: Progress | None = None, cancel: CancelFlag | None = None,
                      label: str = "output") -> NpyExport:
    """Write ``tensor`` as a ``.npy`` at ``out`` (see :func:`npy_layout` for the dtype and shape), streamed and
    atomic. ``progress`` in bytes of data written; a set ``cancel`` raises :class:`ExportCancelled` and leaves
    nothing. ``label`` names the output in refusals (``-o``). Raises ``KeyError`` for an unknown tensor,
    ``ValueError`` for one that cannot be exported, :class:`~quantscope.core.fsutil.PathRefused` for a bad
    output path."""
    t = _tensor(f, tensor)
    dtype, shape = npy_layout(t, raw)
    total = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    with _outs(f, label, out) as outs:
        outs.open(label)
        outs.write_bytes(label, npy_header(dtype, shape))
        done = 0
        read = 0
        for x, n_in in (_raw_chunks(f, t) if raw else _value_chunks(f, t, threads)):
            check_cancel(cancel, ExportCancelled)
            outs.write_bytes(label, np.ascontiguousarray(x).reshape(-1).view(np.uint8))  # type: ignore[arg-type]
            done += x.nbytes
            f.release_pages(t.data_offset + read, n_in)
            read += n_in
            if progress is not None:
                progress(done, total)
        if done != total:
            raise RuntimeError(f"{t.name}: wrote {done} bytes of data, expected {total}")
        check_cancel(cancel, ExportCancelled)
        outs.commit()
        return NpyExport(outs.target(label), dtype.str, tuple(shape), total, raw)


# ------------------------------------------------------------------------------------------------ blocks
def _num(v: Any) -> str:
    if isinstance(v, (bool, np.bool_)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return repr(float(v))  # shortest text that reads back to the same float (nan, inf as such)
    return str(int(v)) if isinstance(v, (int, np.integer)) else str(v)


def block_csv_rows(b: DecodedBlock, *, tensor: str, row: int, block: int,
                   file_offset: int) -> list[list[str]]:
    """One decoded block as rows of :data:`BLOCK_CSV_COLUMNS` (a long table, one value per row).

    ``section`` is ``block`` (tensor, row, block, type, file_offset, formula), ``field`` (one row per value of a
    field: ``index`` is its position in a list field, empty for a single value; fp16/e8m0 fields give the float in
    ``value`` and the stored bits in ``bits``), ``scale`` (the unpacked scales, by name and index) or ``element``
    (per element ``index``: ``value``, ``raw_code``, ``code``, ``multiplier``, ``offset`` and ``group``, where
    ``value = multiplier * code + offset``). Floats are written as the shortest text that reads back exactly."""
    rows: list[list[str]] = []

    def add(section: str, name: str, index: Any = "", value: Any = "", bits: Any = "", offset: Any = "",
            size: Any = "", kind: str = "", description: str = "") -> None:
        rows.append([section, name, str(index), value if isinstance(value, str) else _num(value), str(bits),
                     str(offset), str(size), kind, description])

    for name, v in (("tensor", tensor), ("row", row), ("block", block), ("type", b.type.name),
                    ("file_offset", file_offset), ("formula", b.formula)):
        add("block", name, value=v if isinstance(v, str) else _num(v))
    for fd in b.fields:
        common = {"offset": fd.offset, "size": fd.size, "kind": fd.kind, "description": fd.description}
        if isinstance(fd.value, dict) and "bits" in fd.value:
            add("field", fd.name, value=_num(fd.value["float"]), bits=fd.value["bits"], **common)
        elif isinstance(fd.value, list):
            for i, x in enumerate(fd.value):
                add("field", fd.name, i, _num(x), **common)
        else:
            add("field", fd.name, value=_num(fd.value), **common)
    for name, vals in b.scales.items():
        for i, x in enumerate(vals):
            add("scale", name, i, _num(x))
    columns = (("value", b.values), ("raw_code", b.raw_code), ("code", b.code), ("multiplier", b.multiplier),
               ("offset", b.offset), ("group", b.group))
    for i in range(len(b.values)):
        for name, arr in columns:
            add("element", name, i, _num(arr[i]))
    return rows


def block_format(out: str | os.PathLike[str], fmt: str | None = None) -> str:
    """``csv`` or ``json``: ``fmt``, else the output's suffix; ``ValueError`` otherwise."""
    kind = (fmt or Path(out).suffix.lstrip(".")).lower()
    if kind not in BLOCK_FORMATS:
        raise ValueError(f"{os.fspath(out)}: say the block format with a .csv or .json name (or a format)")
    return kind


def export_block(f: GGUFFile, tensor: TensorInfo | str, row: int, block: int, out: str | os.PathLike[str], *,
                 fmt: str | None = None, label: str = "output") -> Path:
    """Write block ``block`` of row ``row`` of ``tensor``, decoded, as CSV (:func:`block_csv_rows`) or JSON (what
    ``quantscope dump-block --json`` prints); ``fmt`` defaults to the output's suffix. ``IndexError`` for a row or
    block out of range, ``ValueError`` for a tensor without a block decoder."""
    from .blockdump import block_to_json
    from .quant import can_decode, decode_block

    kind = block_format(out, fmt)
    t = _tensor(f, tensor)
    if t.type is None or t.problem is not None:
        raise ValueError(f"{t.name} cannot be decoded: {t.problem or t.type_name}")
    if not can_decode(t.type):
        raise ValueError(f"{t.name}: no block decoder for {t.type.name}")
    off, _ = f.block_location(t, row, block)
    b = decode_block(t.type, _block_bytes(f, t, row, block))
    if kind == "json":
        text = json_text(block_to_json(b, tensor=t.name, row=row, block=block, file_offset=off)) + "\n"
    else:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(BLOCK_CSV_COLUMNS)
        w.writerows(block_csv_rows(b, tensor=t.name, row=row, block=block, file_offset=off))
        text = buf.getvalue()
    with _outs(f, label, out) as outs:
        outs.write_text(label, text)
        outs.commit()
        return outs.target(label)


def _block_bytes(f: GGUFFile, t: TensorInfo, row: int, block: int) -> bytes:
    """One block's bytes, copied under the fault guard."""
    from .native import kernels as native

    off, n = f.block_location(t, row, block)
    rel = off - t.data_offset
    return native.copy_mapped(f.tensor_bytes(t)[rel : rel + n], f"tensor {t.name}").tobytes()


# ------------------------------------------------------------------------------------------------ metadata
def plain_value(v: Any) -> Any:
    """A metadata value as JSON-ready Python (arrays copied under the fault guard)."""
    if isinstance(v, np.ndarray):
        from .native import kernels as native

        return native.copy_mapped(v, "metadata array").tolist()
    if isinstance(v, StringArray):
        return v.to_list()
    if isinstance(v, list):
        return [plain_value(x) for x in v]
    return v


def metadata_entries(f: GGUFFile) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(key, {"type": "UINT32" | "ARRAY[STRING]" | …, "value": …})`` for every metadata entry, in file order;
    arrays in full."""
    for key, kv in f.metadata.items():
        yield key, {"type": kv.type_label, "value": plain_value(kv.value)}


def tensor_index(f: GGUFFile) -> list[dict[str, Any]]:
    """The tensor table: name, type, numpy shape, ``ne``, absolute data offset, bytes (and a problem if any)."""
    out = []
    for t in f.tensors:
        d: dict[str, Any] = {"name": t.name, "type": t.type_name, "shape": list(t.shape), "ne": list(t.ne),
                             "offset": t.data_offset, "n_bytes": t.n_bytes}
        if t.problem:
            d["problem"] = t.problem
        out.append(d)
    return out


def export_metadata(f: GGUFFile, out: str | os.PathLike[str], *, tensors: bool = True,
                    cancel: CancelFlag | None = None, label: str = "output") -> Path:
    """Write the metadata (every value in full) and, with ``tensors``, the tensor index as strict JSON::

        {"format": "quantscope-metadata", "version": 1, "gguf_version": 3, "alignment": 32,
         "metadata": {"general.architecture": {"type": "STRING", "value": "qwen2"}, ...},
         "tensors": [{"name": ..., "type": ..., "shape": [...], "ne": [...], "offset": ..., "n_bytes": ...}]}

    One entry is converted at a time (memory: the largest value). NaN and infinities are the strings ``"nan"``,
    ``"inf"``, ``"-inf"``."""
    with _outs(f, label, out) as outs:
        outs.open(label)
        head = {"format": METADATA_FORMAT, "version": 1, "gguf_version": f.version, "alignment": f.alignment,
                "n_tensors": len(f.tensors), "n_metadata": len(f.metadata)}
        outs.write_text(label, "{\n" + "".join(f" {json_text(k)}: {json_text(v, None)},\n" for k, v in head.items())
                        + ' "metadata": {')
        sep = "\n"
        for key, entry in metadata_entries(f):
            check_cancel(cancel, ExportCancelled)
            outs.write_text(label, f"{sep}  {json_text(key)}: {json_text(entry, None)}")
            sep = ",\n"
        outs.write_text(label, "\n }")
        if tensors:
            outs.write_text(label, ',\n "tensors": [')
            sep = "\n"
            for d in tensor_index(f):
                outs.write_text(label, f"{sep}  {json_text(d, None)}")
                sep = ",\n"
            outs.write_text(label, "\n ]")
        outs.write_text(label, "\n}\n")
        check_cancel(cancel, ExportCancelled)
        outs.commit()
        return outs.target(label)
