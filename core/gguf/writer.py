"""The one GGUF encoder: header, typed metadata, tensor infos, alignment and the padded data section.

Every writer (edit, split, quantize, imatrix, synthetic) builds a :class:`GGUFHeader` — metadata entries typed
(:meth:`~GGUFHeader.add`) or copied byte for byte from a source file (:meth:`~GGUFHeader.add_raw`), then the
tensors in data order (:meth:`~GGUFHeader.add_tensor`, which assigns each its offset) — and streams the tensors'
bytes through a :class:`DataSection`, which pads each tensor to the alignment and checks every size. Nothing here
holds more than one chunk of tensor data; :func:`write_gguf` writes a whole file through
:class:`~quantscope.core.fsutil.OutputSet` (a temporary renamed into place).

Layout (GGUF v3, little-endian): ``b"GGUF"``, u32 version, u64 tensor count, u64 entry count; each entry is a
string key, a u32 value type and the value (strings: u64 length and UTF-8 bytes; arrays: u32 element type, u64
count, the elements, an element that is itself an array carrying its own element type and count); each tensor
info is its name, u32 dimension count, u64 dimensions, u32 ggml type and u64 offset within the data section;
zeros up to a multiple of the alignment; then every tensor's bytes followed by zeros up to the alignment.
"""

from __future__ import annotations

import os
import struct
import sys
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, overload

from ..base.gguf_constants import DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS, STRUCT_CODES, ValueType
from .strings import StringArray

#: the GGUF version every writer produces
VERSION = 3
ALIGNMENT_KEY = "general.alignment"
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_INT64_MAX = (1 << 63) - 1

Buffer = bytes | bytearray | memoryview


class GGUFWriteError(ValueError):
    """A value, tensor or size the writer cannot encode; the message says which."""


class TypedArray(NamedTuple):
    """An element of a nested array (an ARRAY whose elements are ARRAYs): its own element type and values."""

    elem_type: ValueType
    values: Sequence[Any]


class ArrayPatch(Sequence[Any]):
    """An array with some elements replaced, over its unchanged base (a file's string array is not copied)."""

    __slots__ = ("base", "patches")

    def __init__(self, base: Sequence[Any], patches: Mapping[int, Any]) -> None:
        if isinstance(base, ArrayPatch):
            patches = {**base.patches, **patches}
            base = base.base
        self.base = base
        self.patches = dict(patches)

    def __len__(self) -> int:
        return len(self.base)

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...
    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        n = len(self)
        k = i + n if i < 0 else i
        if not 0 <= k < n:
            raise IndexError(f"index {i} out of range for {n} elements")
        return self.patches[k] if k in self.patches else self.base[k]

    def __repr__(self) -> str:
        return f"ArrayPatch({len(self)} elements, {len(self.patches)} replaced)"


def pad_to(n: int, alignment: int) -> int:
    """``n`` rounded up to a multiple of ``alignment``."""
    return (n + alignment - 1) // alignment * alignment


def ggml_dims(ne: Sequence[int]) -> tuple[int, ...]:
    """The dimensions ggml writes: trailing 1s dropped, at least one."""
    n = len(ne)
    while n > 1 and ne[n - 1] == 1:
        n -= 1
    return tuple(ne[:n]) if n else (1,)


def encode_string(s: str | bytes) -> bytes:
    """A GGUF string: u64 byte length, then the bytes (``str`` as UTF-8; lone surrogates kept as their bytes)."""
    raw = s.encode("utf-8", "surrogateescape") if isinstance(s, str) else bytes(s)
    return _U64.pack(len(raw)) + raw


def itemsize_ok(a: array[Any]) -> bool:
    """``array`` item sizes are platform-dependent for some codes: use the array's bytes only when they match."""
    return a.itemsize == struct.calcsize(f"<{a.typecode}")


def _pack_numbers(etype: ValueType, seq: Sequence[Any]) -> bytes:
    code = STRUCT_CODES[etype]
    if isinstance(seq, ArrayPatch) and isinstance(seq.base, array):
        a = array(seq.base.typecode, seq.base)
        for i, v in seq.patches.items():
            a[i] = int(v) if etype == ValueType.BOOL else v
        seq = a
    if etype == ValueType.BOOL and any(v not in (0, 1) for v in seq):
        raise GGUFWriteError("an ARRAY[BOOL] element is not 0 or 1")
    if isinstance(seq, array) and seq.typecode == code and itemsize_ok(seq):
        a = seq
        if sys.byteorder == "big":
            a = array(code, a)
            a.byteswap()
        return a.tobytes()
    vals = [int(v) for v in seq] if etype == ValueType.BOOL else list(seq)
    try:
        return struct.pack(f"<{len(vals)}{code}", *vals)
    except struct.error as exc:
        raise GGUFWriteError(f"an ARRAY[{etype.name}] element does not fit: {exc}") from None


def _pack_strings(seq: Sequence[Any]) -> bytes:
    if isinstance(seq, StringArray):
        return seq.copy()
    if isinstance(seq, ArrayPatch) and isinstance(seq.base, StringArray):
        blob = seq.base.copy()
        offs = seq.base.offsets()
        parts: list[bytes] = []
        pos = 0
        for i in sorted(seq.patches):
            parts.append(blob[pos : int(offs[i])])
            parts.append(encode_string(seq.patches[i]))
            pos = int(offs[i + 1])
        parts.append(blob[pos:])
        return b"".join(parts)
    return b"".join(encode_string(s) for s in seq)


def _array_body(elem_type: ValueType, values: Sequence[Any], depth: int) -> bytes:
    etype = ValueType(elem_type)
    head = _U32.pack(etype) + _U64.pack(len(values))
    if etype == ValueType.STRING:
        return head + _pack_strings(values)
    if etype == ValueType.ARRAY:
        if depth >= 8:
            raise GGUFWriteError("arrays nested more than 8 levels deep")
        parts = []
        for v in values:
            if not isinstance(v, TypedArray):
                raise GGUFWriteError("each element of an ARRAY[ARRAY] must be a TypedArray (its element type and "
                                     "values)")
            parts.append(_array_body(v.elem_type, v.values, depth + 1))
        return head + b"".join(parts)
    return head + _pack_numbers(etype, values)


def encode_value(vtype: ValueType, value: Any, elem_type: ValueType | None = None) -> bytes:
    """A value as stored after its type id (no type id). ``STRING``: ``str`` or ``bytes``; ``ARRAY``: a sequence
    of ``elem_type`` elements (``TypedArray`` elements when ``elem_type`` is ``ARRAY``); ``BOOL``: ``bool``/0/1.
    Numbers out of the type's range raise :class:`GGUFWriteError`."""
    vtype = ValueType(vtype)
    if vtype == ValueType.STRING:
        return encode_string(value)
    if vtype == ValueType.ARRAY:
        if elem_type is None:
            raise GGUFWriteError("an ARRAY value needs an element type")
        return _array_body(elem_type, value, 0)
    if vtype == ValueType.BOOL:
        if value not in (0, 1):  # True/False too
            raise GGUFWriteError(f"a BOOL value must be 0 or 1, not {value!r}")
        return bytes((int(value),))
    try:
        return struct.pack(f"<{STRUCT_CODES[vtype]}", value)
    except struct.error as exc:
        raise GGUFWriteError(f"a {vtype.name} value {value!r} does not fit: {exc}") from None


def encode_typed(vtype: ValueType, value: Any, elem_type: ValueType | None = None) -> bytes:
    """The u32 type id followed by :func:`encode_value`."""
    return _U32.pack(ValueType(vtype)) + encode_value(vtype, value, elem_type)


def encode_entry(key: str, vtype: ValueType, value: Any, elem_type: ValueType | None = None) -> bytes:
    """One metadata entry as written: key, type id, value."""
    return encode_string(key.encode("utf-8")) + encode_typed(vtype, value, elem_type)


def encode_tensor_info(name: str, ne: Sequence[int], type_id: int, offset: int) -> bytes:
    """One tensor info: name, dimension count, the dimensions as given, ggml type id, offset in the data."""
    if not name:
        raise GGUFWriteError("a tensor needs a name")
    if len(ne) > MAX_DIMS:
        raise GGUFWriteError(f"tensor {name!r}: {len(ne)} dimensions; ggml has at most {MAX_DIMS}")
    for d in ne:
        if not 0 <= d <= _INT64_MAX:
            raise GGUFWriteError(f"tensor {name!r}: dimension {d} is outside 0..2^63-1")
    return (encode_string(name.encode("utf-8")) + struct.pack(f"<I{len(ne)}Q", len(ne), *ne)
            + struct.pack("<IQ", type_id, offset))


class GGUFHeader:
    """Everything before the data section: metadata entries in order, then tensor infos in data order.

    ``alignment`` is the data alignment; a typed ``general.alignment`` entry sets it (it must be a UINT32 power of
    two) and must come before the first tensor, whose offsets it decides. A key or tensor name given twice is
    refused (llama.cpp refuses such a file)."""

    def __init__(self, alignment: int = DEFAULT_ALIGNMENT, version: int = VERSION) -> None:
        self._check_alignment(alignment)
        self.alignment = alignment
        self.version = version
        self.entries: list[bytes] = []
        self.infos: list[bytes] = []
        self._keys: set[bytes] = set()
        self._names: set[str] = set()
        #: ``n_bytes`` of every tensor, in data order
        self.sizes: list[int] = []
        self.data_size = 0

    @staticmethod
    def _check_alignment(a: int) -> None:
        if not isinstance(a, int) or a <= 0 or a & (a - 1):
            raise GGUFWriteError(f"alignment {a!r} is not a positive power of two")

    def _check_key(self, raw_key: bytes) -> None:
        if raw_key in self._keys:
            raise GGUFWriteError(f"metadata key {raw_key.decode('utf-8', 'replace')!r} given twice")

    def add(self, key: str, vtype: ValueType, value: Any, elem_type: ValueType | None = None) -> None:
        """A typed entry."""
        raw_key = key.encode("utf-8")
        self._check_key(raw_key)
        if key == ALIGNMENT_KEY:
            if vtype != ValueType.UINT32:
                raise GGUFWriteError(f"{ALIGNMENT_KEY} must be a UINT32, not {ValueType(vtype).name}")
            if self.sizes:
                raise GGUFWriteError(f"{ALIGNMENT_KEY} must come before the tensors")
            self._check_alignment(value)
            self.alignment = value
        self.entries.append(encode_entry(key, vtype, value, elem_type))
        self._keys.add(raw_key)

    def add_u32(self, key: str, value: int) -> None:
        self.add(key, ValueType.UINT32, value)

    def add_string(self, key: str, value: str | bytes) -> None:
        self.add(key, ValueType.STRING, value)

    def add_raw(self, entry: bytes) -> None:
        """An entry already encoded (key, type, value), e.g. copied from a source file byte for byte."""
        entry = bytes(entry)
        n = _U64.unpack_from(entry)[0] if len(entry) >= 8 else -1
        if not 0 < n <= len(entry) - 12:
            raise GGUFWriteError("an encoded entry must start with its key (u64 length, bytes) and a type")
        self._check_key(entry[8 : 8 + n])
        self.entries.append(entry)
        self._keys.add(entry[8 : 8 + n])

    def add_tensor(self, name: str, ne: Sequence[int], type_id: int, n_bytes: int) -> int:
        """A tensor info (``ne`` written as given: pass :func:`ggml_dims` to drop trailing 1s); returns its
        offset in the data section."""
        if n_bytes < 0:
            raise GGUFWriteError(f"tensor {name!r}: negative size {n_bytes}")
        if name in self._names:
            raise GGUFWriteError(f"tensor {name!r} given twice")
        offset = self.data_size
        self.infos.append(encode_tensor_info(name, ne, type_id, offset))
        self._names.add(name)
        self.sizes.append(n_bytes)
        self.data_size += pad_to(n_bytes, self.alignment)
        return offset

    def encode(self, *, pad_without_tensors: bool = True) -> bytes:
        """The header bytes, padded to the alignment (gguf-py leaves a file without tensors unpadded:
        ``pad_without_tensors=False``)."""
        head = (GGUF_MAGIC + struct.pack("<IQQ", self.version, len(self.infos), len(self.entries))
                + b"".join(self.entries) + b"".join(self.infos))
        if self.infos or pad_without_tensors:
            head += bytes(pad_to(len(head), self.alignment) - len(head))
        return head


class DataSection:
    """The data section, streamed: tensor bytes in header order, each tensor padded to the alignment.

    ``write(buf)`` puts bytes in the output; ``sizes`` are the tensors' byte counts in data order
    (:meth:`for_header` takes both from a :class:`GGUFHeader`). Per tensor call :meth:`write` (or :meth:`count`
    for bytes the caller put there itself, e.g. with ``copy_file_range``) until its size, then
    :meth:`end_tensor`; :meth:`finish`
    checks that every tensor was written."""

    def __init__(self, write: Callable[[Buffer], object], alignment: int, sizes: Iterable[int]) -> None:
        self._sizes = list(sizes)
        self._alignment = alignment
        self._write = write
        self._index = 0
        self._done = 0

    @classmethod
    def for_header(cls, header: GGUFHeader, write: Callable[[Buffer], object]) -> DataSection:
        return cls(write, header.alignment, header.sizes)

    def _current(self) -> int:
        if self._index >= len(self._sizes):
            raise GGUFWriteError(f"more tensors written than the header's {len(self._sizes)}")
        return self._sizes[self._index]

    def count(self, n: int) -> None:
        """``n`` bytes of the current tensor were written by the caller."""
        self._done += n
        if self._done > self._current():
            raise GGUFWriteError(f"tensor {self._index}: {self._done:,} bytes written, its size is "
                                 f"{self._current():,}")

    def write(self, data: Buffer) -> None:
        """Bytes of the current tensor."""
        n = memoryview(data).nbytes
        self.count(n)
        if n:
            self._write(data)

    def end_tensor(self) -> int:
        """Check the current tensor is complete, write its padding; returns the padding's size."""
        size = self._current()
        if self._done != size:
            raise GGUFWriteError(f"tensor {self._index}: {self._done:,} bytes written, expected {size:,}")
        pad = pad_to(size, self._alignment) - size
        if pad:
            self._write(bytes(pad))
        self._index += 1
        self._done = 0
        return pad

    def tensor(self, chunks: Iterable[Buffer]) -> int:
        """A whole tensor from its chunks, padded; returns the padding's size."""
        for c in chunks:
            self.write(c)
        return self.end_tensor()

    def finish(self) -> None:
        if self._index != len(self._sizes):
            raise GGUFWriteError(f"{self._index} of {len(self._sizes)} tensors written")


def write_gguf(path: str | os.PathLike[str], header: GGUFHeader, tensors: Iterable[Iterable[Buffer]],
               label: str = "output", inputs: Iterable[str | os.PathLike[str]] = (), *,
               pad_without_tensors: bool = True) -> Path:
    """Write a whole file atomically (a temporary renamed into place): the header, then each tensor's chunks in
    header order. Returns the path written."""
    from ..fsutil import OutputSet

    with OutputSet([(label, path)], inputs) as outs:
        outs.open(label)
        outs.write_bytes(label, header.encode(pad_without_tensors=pad_without_tensors))
        data = DataSection.for_header(header, lambda b: outs.write_bytes(label, b))
        for chunks in tensors:
            data.tensor(chunks)
        data.finish()
        outs.commit()
        return outs.target(label)


__all__ = [
    "ALIGNMENT_KEY", "STRUCT_CODES", "VERSION", "ArrayPatch", "DataSection", "GGUFHeader", "GGUFWriteError",
    "TypedArray", "encode_entry", "encode_string", "encode_tensor_info", "encode_typed", "encode_value",
    "ggml_dims", "itemsize_ok", "pad_to", "write_gguf",
]
