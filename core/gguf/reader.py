"""GGUF reader over ``mmap``: header, metadata and tensor index without decoding arrays.

Numeric metadata arrays are zero-copy numpy views into the mapping; string arrays are :class:`StringArray`
views whose per-element index is built on first use. Every count, length and offset is checked against the
file before it is used; problems raise :class:`GGUFError` with the byte offset and what was expected.

A model split by llama-gguf-split (``NAME-00001-of-00003.gguf`` …) opens as one :class:`GGUFFile` from any of its
shards: metadata from the first, the tensors of every shard in order, each :class:`TensorInfo` knowing its shard
(``shard``; ``data_offset`` is relative to that shard's file). docs/shards.md describes the format and the checks.
"""

from __future__ import annotations

import mmap
import os
import struct
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..base.ggml_types import GGML_TYPES, REMOVED_TYPE_IDS, GGMLType
from ..base.gguf_constants import (
    DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    MAX_ARRAY_ELEMENTS,
    MAX_DIMS,
    MAX_STRING_BYTES,
    MAX_TENSOR_NAME_BYTES,
    SCALAR_DTYPES,
    STRUCT_CODES,
    SUPPORTED_VERSIONS,
    ValueType,
    file_type_name,
)
from ..fsutil import PathRefused, open_input, release_mapped_pages
from ..native import ffi, lib
from ..shardnames import shard_path, shard_prefix
from .errors import GGUFError, NeedMoreBytes
from .strings import StringArray

if TYPE_CHECKING:
    import numpy as np

_SCALAR_STRUCT: dict[ValueType, struct.Struct] = {t: struct.Struct("<" + c) for t, c in STRUCT_CODES.items()}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_MIN_KV_BYTES = 8 + 1 + 4 + 1  # key length + 1-byte key + type + smallest value
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 4 + 8  # name length + 1-byte name + n_dims + type + offset
_MIN_ELEM_BYTES = {ValueType.STRING: 8, ValueType.ARRAY: 12}
_SCAN_MESSAGES = {
    1: ("string array ends inside a length field", "8 bytes of string length"),
    2: ("string runs past the end of the file", "a length that fits in the file"),
    3: ("string length exceeds the 1 GiB cap", "a plausible string length"),
    4: ("string is not valid UTF-8", "UTF-8 text"),
    -9: ("the file changed while it was being read", "an unchanged file"),  # the native SIGBUS guard's code
}
# (fixed) integer limit for element counts and byte sizes: ggml uses int64_t
_INT64_MAX = (1 << 63) - 1

#: ``array`` type codes of the numeric value types (BOOL as bytes), for numpy-free reads of numeric arrays.
_ARRAY_CODES = STRUCT_CODES


class _Numbers:
    """A numeric metadata array not yet made a numpy view: its bytes (a view of the file that keeps the mapping alive
    as a numpy view would), element type and count. Opening a file does not import numpy."""

    __slots__ = ("count", "etype", "view")

    def __init__(self, view: memoryview, etype: ValueType, count: int) -> None:
        self.view = view
        self.etype = etype
        self.count = count

    def numpy(self) -> np.ndarray:
        import numpy as np

        arr = np.frombuffer(self.view, dtype=SCALAR_DTYPES[self.etype], count=self.count)
        return arr.view(np.bool_) if self.etype == ValueType.BOOL else arr


def _materialize(v: Any) -> Any:
    if isinstance(v, _Numbers):
        return v.numpy()
    if isinstance(v, list):
        return [_materialize(x) for x in v]
    return v


@dataclass(frozen=True)
class MetadataValue:
    """One metadata entry.

    ``value`` is a Python ``int``/``float``/``bool``/``str`` for scalars, a read-only numpy view for numeric
    arrays (``bool`` dtype for BOOL; made on first access), a :class:`StringArray` for string arrays, or a list of
    those for arrays of arrays. ``offset`` is where the entry (its key) starts; ``value_offset`` where its value
    does.
    """

    key: str
    type: ValueType
    _value: Any
    offset: int
    value_offset: int
    end: int
    elem_type: ValueType | None = None

    @property
    def value(self) -> Any:
        v = self._value
        if isinstance(v, (_Numbers, list)):
            v = _materialize(v)
            object.__setattr__(self, "_value", v)
        return v

    def numbers(self) -> array[Any] | None:
        """A numeric array's elements as an ``array.array`` copy (read under the fault guard, no numpy); ``None``
        when the value is not a numeric array."""
        v = self._value
        if self.type != ValueType.ARRAY or self.elem_type not in _ARRAY_CODES:
            return None
        from ..native.mapped import copy_bytes

        out = array(_ARRAY_CODES[self.elem_type])
        if isinstance(v, _Numbers):
            out.frombytes(copy_bytes(v.view, 0, len(v.view), f"metadata {self.key}"))
        else:
            out.frombytes(v.tobytes())
        return out

    @property
    def count(self) -> int | None:
        """Element count of an array, ``None`` for scalars."""
        if self.type != ValueType.ARRAY:
            return None
        return self._value.count if isinstance(self._value, _Numbers) else len(self._value)

    @property
    def type_label(self) -> str:
        """``UINT32``, ``STRING``, ``ARRAY[STRING]``..."""
        if self.type == ValueType.ARRAY:
            assert self.elem_type is not None
            return f"ARRAY[{self.elem_type.name}]"
        return self.type.name


@dataclass
class TensorInfo:
    """One tensor-info record. ``ne`` is in ggml order (``ne[0]`` = row length); ``shape`` is numpy order."""

    name: str
    ne: tuple[int, ...]
    type_id: int
    offset: int
    data_start: int
    info_offset: int
    type: GGMLType | None
    n_elements: int
    n_bytes: int | None
    problem: str | None = None
    problem_offset: int | None = field(default=None, repr=False)
    shard: int = 0

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy shape (reversed ``ne``)."""
        return tuple(reversed(self.ne))

    @property
    def type_name(self) -> str:
        """The ggml type name, or ``unknown type N`` / ``removed type N (...)``."""
        if self.type is not None:
            return self.type.name
        if self.type_id in REMOVED_TYPE_IDS:
            return f"removed type {self.type_id} ({REMOVED_TYPE_IDS[self.type_id]})"
        return f"unknown type {self.type_id}"

    @property
    def data_offset(self) -> int:
        """Offset of the tensor's first byte in its file (its shard's, in a split model: see ``shard``)."""
        return self.data_start + self.offset

    @property
    def row_len(self) -> int:
        """Elements per row (``ne[0]``; 1 for a 0-d tensor)."""
        return self.ne[0] if self.ne else 1

    @property
    def n_rows(self) -> int:
        """Number of rows (product of ``ne[1:]``)."""
        n = 1
        for d in self.ne[1:]:
            n *= d
        return n

    @property
    def row_bytes(self) -> int | None:
        """Bytes per row, or ``None`` for an unknown type."""
        return None if self.type is None else self.type.row_bytes(self.row_len)

    @property
    def bits_per_weight(self) -> float | None:
        """Storage bits per element, or ``None`` for an unknown type."""
        return None if self.type is None else self.type.bits_per_weight


def _align_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


class _Cursor:
    """Bounds-checked little-endian reads from a buffer: ``size`` is the file's, ``avail`` the bytes the buffer holds
    (less than ``size`` when only a remote file's first bytes were fetched: a read past them is
    :class:`NeedMoreBytes`)."""

    __slots__ = ("avail", "buf", "pos", "size")

    def __init__(self, buf: Any, size: int, pos: int = 0, avail: int | None = None) -> None:
        self.buf = buf
        self.size = size
        self.pos = pos
        self.avail = size if avail is None else avail

    def need(self, n: int, what: str) -> None:
        if n > self.avail - self.pos and n <= self.size - self.pos:
            raise NeedMoreBytes(f"the header goes on past the first {self.avail} bytes ({what})", self.pos,
                                self.pos + n)
        if n > self.size - self.pos:
            raise GGUFError(
                f"file ends after {self.size - self.pos} of the {n} bytes of {what}",
                self.pos,
                f"{n} bytes of {what}",
            )

    def unpack(self, st: struct.Struct, what: str) -> Any:
        self.need(st.size, what)
        (v,) = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return v

    def u32(self, what: str) -> int:
        return self.unpack(_U32, what)

    def u64(self, what: str) -> int:
        return self.unpack(_U64, what)

    def string(self, what: str, max_len: int = MAX_STRING_BYTES) -> str:
        start = self.pos
        n = self.u64(f"{what} length")
        if n > max_len:
            raise GGUFError(f"{what} length {n} is implausible", start, f"at most {max_len} bytes")
        self.need(n, what)
        raw = self.buf[self.pos : self.pos + n]
        try:
            s = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GGUFError(f"{what} is not valid UTF-8 ({exc.reason})", self.pos + exc.start, "UTF-8 text") from None
        self.pos += n
        return s

#: llama.cpp's split keys: this shard's index (0-based), the number of shards, the tensors of the whole set
SPLIT_NO = "split.no"
SPLIT_COUNT = "split.count"
SPLIT_TENSORS_COUNT = "split.tensors.count"
_INT_TYPES = frozenset({ValueType.UINT8, ValueType.INT8, ValueType.UINT16, ValueType.INT16, ValueType.UINT32,
                        ValueType.INT32, ValueType.UINT64, ValueType.INT64})


class ShardError(GGUFError):
    """A shard of a split model is missing, unreadable or not part of the set; ``path`` is the file concerned and
    leads the message."""

    def __init__(self, path: str | os.PathLike[str], message: str, offset: int | None = None,
                 expected: str | None = None) -> None:
        self.path = Path(path)
        super().__init__(message, offset, expected)
        self.args = (f"{os.fspath(path)}: {self.args[0]}",)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ShardError, (self.path, self.message, self.offset, self.expected))


@dataclass(frozen=True)
class ShardInfo:
    """One file of an opened model (a plain file is a set of one): where its header ends and its data starts, and
    which of the model's tensors (``first_tensor`` .. ``first_tensor + n_tensors``) it holds."""

    index: int
    path: Path | None
    file_size: int
    version: int
    alignment: int
    header_end: int
    data_start: int
    first_tensor: int
    n_tensors: int


def _split_value(f: GGUFFile, key: str, where: Path) -> int | None:
    """An integer split key of ``f`` (``None`` when absent); any other type is refused."""
    kv = f.metadata.get(key)
    if kv is None:
        return None
    if kv.type not in _INT_TYPES:
        raise ShardError(where, f"{key} has type {kv.type_label}", kv.value_offset - 4, "an integer (UINT16)")
    return int(kv.value)


class GGUFFile:
    """An opened GGUF file (or in-memory buffer).

    ``strict`` (default) raises on the first tensor whose byte range is unaligned, out of the file or
    overlapping another; with ``strict=False`` such tensors are kept with ``problem`` set and listed in
    :attr:`problems`. Tensors of unknown/removed type ids never stop the file from opening.

    A shard of a split model (``split.count`` above 1) opens the whole set (``whole_set=False``: that file
    alone): :attr:`path`, :attr:`metadata`, :attr:`version`, :attr:`alignment`, :attr:`header_end` and
    :attr:`data_start` are the first shard's, :attr:`file_size` is the sum of the shards' sizes, :attr:`tensors`
    are every shard's in order, and :attr:`shards` describes each file. A missing or inconsistent shard raises
    :class:`ShardError` naming the file.
    """

    def __init__(self, source: str | os.PathLike[str] | bytes | bytearray | memoryview, *, strict: bool = True,
                 whole_set: bool = True, file_size: int | None = None):
        self.path: Path | None = None
        self._mmap: mmap.mmap | None = None
        self._fd: int | None = None
        self._parts: list[GGUFFile] = []  # a split model's shards, each opened alone (empty for one file)
        if isinstance(source, (bytes, bytearray, memoryview)):
            view = memoryview(source)
            self._buf: Any = view.cast("B") if view.format != "B" or view.ndim != 1 else source
            self.file_size = view.nbytes
            if file_size is not None:  # the first bytes of a file of file_size bytes (a remote file's header)
                if file_size < view.nbytes:
                    raise ValueError(f"file_size {file_size} is less than the {view.nbytes} bytes given")
                self.file_size = file_size
        else:
            self.path = Path(source)
            self._open_mmap(self.path)
        self._avail = len(self._buf)  # the bytes at hand: file_size except for a prefix
        self.problems: list[GGUFError] = []
        self.metadata: dict[str, MetadataValue] = {}
        self.tensors: list[TensorInfo] = []
        self._by_name: dict[str, TensorInfo] = {}
        self._cbuf: Any = None
        try:
            try:
                self._parse(strict)
            finally:
                if self._cbuf is not None:
                    ffi.release(self._cbuf)
                    self._cbuf = None
            if whole_set and self.path is not None:
                self._open_set(strict)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ opening
    def _open_mmap(self, path: Path) -> None:
        try:
            fd = open_input(path)  # refuses FIFOs, devices, sockets and directories without blocking
        except PathRefused as exc:
            raise GGUFError(f"cannot open {exc}") from None
        try:
            size = os.fstat(fd).st_size
            self.file_size = size
            if size == 0:
                self._buf = b""
            else:
                self._mmap = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
                self._buf = self._mmap
        finally:
            os.close(fd)

    def close(self) -> None:
        """Unmap the file (every shard). numpy views handed out keep the mapping alive until they are dropped."""
        parts, self._parts = self._parts, []
        for p in parts:
            p.close()
        m, self._mmap = self._mmap, None
        self._buf = b""
        if m is not None:
            try:
                m.close()
            except BufferError:
                pass  # views still exported; the mapping is released with the last of them

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ split models
    def _open_set(self, strict: bool) -> None:
        """When this file is a shard of a split model, open the other shards and become the whole set."""
        assert self.path is not None
        opened = self.path
        try:
            count = _split_value(self, SPLIT_COUNT, opened)
        except ShardError as exc:  # llama.cpp refuses such a file too; the explorer shows it as a plain file
            if strict:
                raise
            self.problems.append(exc)
            return
        if count is None or count in (0, 1):  # not split; 0 is what llama-gguf-split --merge leaves
            return
        if not 1 < count <= 0xFFFF:
            raise ShardError(opened, f"{SPLIT_COUNT} is {count}", self.metadata[SPLIT_COUNT].value_offset,
                             "a shard count of 0..65535")
        no = _split_value(self, SPLIT_NO, opened)
        if no is None:
            raise ShardError(opened, f"{SPLIT_COUNT} is {count} but {SPLIT_NO} is missing", None,
                             "both keys in every shard")
        if not 0 <= no < count:
            raise ShardError(opened, f"{SPLIT_NO} is {no}", self.metadata[SPLIT_NO].value_offset,
                             f"a shard index 0..{count - 1} ({SPLIT_COUNT} is {count})")
        prefix = shard_prefix(opened, no, count)
        if prefix is None:  # a link to a shard: its siblings lie beside the file it names
            prefix = shard_prefix(os.path.realpath(opened), no, count)
        if prefix is None:
            raise ShardError(opened, f"shard {no + 1} of a model split in {count} files, but its name does not end "
                             f"in -{no + 1:05d}-of-{count:05d}.gguf, so the other shards cannot be found (was it "
                             "renamed?)")
        me = object.__new__(GGUFFile)  # what was parsed so far becomes one of the parts
        me.__dict__.update(self.__dict__)
        me.path = shard_path(prefix, no, count)  # itself, or the shard a link named
        self._mmap = None
        self._parts = [me]  # close() closes whatever was opened when a later shard fails
        parts: dict[int, GGUFFile] = {no: me}
        for i in range(count):
            if i == no:
                continue
            p = shard_path(prefix, i, count)
            if not os.path.lexists(p):
                raise ShardError(p, f"missing: shard {i + 1} of the {count} files of the split model "
                                 f"{opened.name} belongs to")
            try:
                part = GGUFFile(p, strict=strict, whole_set=False)
            except GGUFError as exc:
                raise ShardError(p, f"shard {i + 1} of {count} cannot be read: {exc.message}", exc.offset,
                                 exc.expected) from None
            self._parts.append(part)
            parts[i] = part
        self._parts = [parts[i] for i in range(count)]
        self._join(self._parts, count)

    def _join(self, parts: list[GGUFFile], count: int) -> None:
        first = parts[0]
        assert first.path is not None
        n_total = _split_value(first, SPLIT_TENSORS_COUNT, first.path)
        if n_total is None:
            raise ShardError(first.path, f"{SPLIT_TENSORS_COUNT} is missing from the first shard", None,
                             "the total tensor count of the split model")
        arch = first.architecture
        by_name: dict[str, TensorInfo] = {}
        tensors: list[TensorInfo] = []
        problems: list[GGUFError] = []
        shards: list[ShardInfo] = []
        for i, part in enumerate(parts):
            path = part.path
            assert path is not None
            c = _split_value(part, SPLIT_COUNT, path)
            if c != count:
                raise ShardError(path, f"{SPLIT_COUNT} is {c}, but {first.path.name} says {count}: a shard of "
                                 "another split of the model?", None, f"{count}")
            no = _split_value(part, SPLIT_NO, path)
            if no != i:
                raise ShardError(path, f"{SPLIT_NO} is {no}, but the file is named as shard {i + 1} (index {i})")
            n = _split_value(part, SPLIT_TENSORS_COUNT, path)
            if n is not None and n != n_total:
                raise ShardError(path, f"{SPLIT_TENSORS_COUNT} is {n}, but {first.path.name} says {n_total}: a shard "
                                 "of another split or model?")
            a = part.architecture
            if i and a is not None and a != arch:
                raise ShardError(path, f"general.architecture is {a!r}, but {first.path.name} says {arch!r}: a "
                                 "shard of another model")
            shards.append(ShardInfo(i, path, part.file_size, part.version, part.alignment, part.header_end,
                                    part.data_start, len(tensors), len(part.tensors)))
            for t in part.tensors:
                other = by_name.get(t.name)
                if other is not None:
                    raise ShardError(path, f"tensor {t.name!r} is also in {parts[other.shard].path}",
                                     t.info_offset, "each tensor in one shard only")
                t.shard = i
                by_name[t.name] = t
                tensors.append(t)
            problems += [ShardError(path, e.message, e.offset, e.expected) for e in part.problems]
        if len(tensors) != n_total:
            held = ", ".join(f"{s.n_tensors} in {s.path.name if s.path else '?'}" for s in shards)
            raise ShardError(first.path, f"{SPLIT_TENSORS_COUNT} is {n_total}, but the {count} shards hold "
                             f"{len(tensors)} tensors ({held}): a missing, foreign or damaged shard?")
        self.path = first.path
        self.version = first.version
        self.metadata = first.metadata
        self.alignment = first.alignment
        self.header_end = first.header_end
        self.data_start = first.data_start
        self._buf = first._buf
        self.file_size = sum(s.file_size for s in shards)
        self.tensors = tensors
        self._by_name = by_name
        self.problems = problems
        self._shards = shards

    @property
    def shards(self) -> list[ShardInfo]:
        """The files the model is read from, in order (one for a plain file or buffer)."""
        s = self.__dict__.get("_shards")
        if s is None:
            s = [ShardInfo(0, self.path, self.file_size, self.version, self.alignment, self.header_end,
                           self.data_start, 0, len(self.tensors))]
            self._shards = s
        return s

    @property
    def paths(self) -> list[Path]:
        """Every file the model is read from (empty for a buffer): what a writer must not overwrite."""
        return [s.path for s in self.shards if s.path is not None]

    @property
    def is_split(self) -> bool:
        """Whether the model was opened from more than one file."""
        return len(self._parts) > 1

    def _part_buf(self, t: TensorInfo) -> Any:
        return self._parts[t.shard]._buf if self._parts else self._buf

    # ------------------------------------------------------------------ parsing
    def _parse(self, strict: bool) -> None:
        size = self.file_size
        if size < 24:
            raise GGUFError(f"file is only {size} bytes", 0, "a 24-byte GGUF header")
        if self._avail < 24:
            raise NeedMoreBytes(f"the header goes on past the first {self._avail} bytes", 0, 24)
        cur = _Cursor(self._buf, size, avail=self._avail)
        magic = bytes(self._buf[0:4])
        if magic != GGUF_MAGIC:
            raise GGUFError(f"bad magic {magic!r}", 0, "b'GGUF'")
        cur.pos = 4
        version = cur.u32("version")
        if version not in SUPPORTED_VERSIONS:
            if version & 0xFFFF == 0 and version != 0:
                raise GGUFError(
                    f"big-endian GGUF (version field reads 0x{version:08x}); Quantscope reads little-endian "
                    "files only - convert it with gguf_convert_endian.py",
                    4,
                    "a little-endian version 2 or 3",
                )
            if version == 1:
                raise GGUFError(
                    "GGUF v1 (2023, 32-bit counts) is no longer supported; re-convert the model with a current "
                    "llama.cpp",
                    4,
                    "version 2 or 3",
                )
            raise GGUFError(f"unsupported GGUF version {version}", 4, "version 2 or 3")
        self.version = version
        n_tensors = cur.u64("tensor count")
        n_kv = cur.u64("metadata count")
        remaining = size - cur.pos
        if n_kv > remaining // _MIN_KV_BYTES:
            raise GGUFError(
                f"metadata count {n_kv} cannot fit in the {remaining} bytes left", 16,
                f"at most {remaining // _MIN_KV_BYTES} entries",
            )
        if n_tensors > remaining // _MIN_TENSOR_INFO_BYTES:
            raise GGUFError(
                f"tensor count {n_tensors} cannot fit in the {remaining} bytes left", 8,
                f"at most {remaining // _MIN_TENSOR_INFO_BYTES} tensors",
            )

        for _ in range(n_kv):
            kv = self._read_kv(cur)
            if kv.key in self.metadata:
                raise GGUFError(f"duplicate metadata key {kv.key!r}", kv.offset, "unique keys")
            self.metadata[kv.key] = kv

        self.alignment = DEFAULT_ALIGNMENT
        al = self.metadata.get("general.alignment")
        if al is not None:
            if al.type != ValueType.UINT32:
                raise GGUFError(
                    f"general.alignment has type {al.type_label}", al.value_offset - 4, "type UINT32"
                )
            if al.value == 0 or al.value & (al.value - 1):
                raise GGUFError(
                    f"general.alignment is {al.value}", al.value_offset, "a power of two greater than zero"
                )
            self.alignment = al.value

        infos = [self._read_tensor_info(cur) for _ in range(n_tensors)]
        self.header_end = cur.pos
        data_start = _align_up(cur.pos, self.alignment)
        if data_start > size and n_tensors:
            raise GGUFError(
                f"data section would start at {data_start}, past the end of the {size}-byte file",
                cur.pos,
                "padding up to the alignment",
            )
        self.data_start = data_start
        for t in infos:
            t.data_start = data_start
        self._check_tensors(infos, strict)
        self.tensors = infos
        self._by_name = {t.name: t for t in infos}

    def _c_buffer(self) -> Any:
        if self._cbuf is None:
            self._cbuf = ffi.from_buffer("uint8_t[]", self._buf)
        return self._cbuf

    def _read_kv(self, cur: _Cursor) -> MetadataValue:
        start = cur.pos
        key = cur.string("metadata key")
        if not key:
            raise GGUFError("empty metadata key", start, "a non-empty key")
        type_pos = cur.pos
        vtype = self._value_type(cur.u32(f"value type of {key!r}"), type_pos, key)
        value_pos = cur.pos
        elem_type = None
        if vtype == ValueType.ARRAY:
            value, elem_type = self._read_array(cur, key)
        else:
            value = self._read_scalar(cur, vtype, key)
        return MetadataValue(key, vtype, value, start, value_pos, cur.pos, elem_type)

    @staticmethod
    def _value_type(raw: int, pos: int, key: str) -> ValueType:
        try:
            return ValueType(raw)
        except ValueError:
            raise GGUFError(f"unknown value type {raw} for {key!r}", pos, "a value type 0..12") from None

    def _read_scalar(self, cur: _Cursor, vtype: ValueType, key: str) -> Any:
        if vtype == ValueType.STRING:
            return cur.string(f"string value of {key!r}")
        pos = cur.pos
        v = cur.unpack(_SCALAR_STRUCT[vtype], f"{vtype.name} value of {key!r}")
        if vtype == ValueType.BOOL:
            if v > 1:
                raise GGUFError(f"BOOL value {v} for {key!r}", pos, "0 or 1")
            return bool(v)
        return v

    def _read_array(self, cur: _Cursor, key: str, depth: int = 0) -> tuple[Any, ValueType]:
        type_pos = cur.pos
        etype = self._value_type(cur.u32(f"array element type of {key!r}"), type_pos, key)
        count_pos = cur.pos
        count = cur.u64(f"array length of {key!r}")
        remaining = self.file_size - cur.pos
        min_elem = _MIN_ELEM_BYTES.get(etype) or _SCALAR_STRUCT[etype].size
        if count > MAX_ARRAY_ELEMENTS or count * min_elem > remaining:
            raise GGUFError(
                f"array {key!r} claims {count} {etype.name} elements, more than the {remaining} bytes left hold",
                count_pos,
                f"at most {min(MAX_ARRAY_ELEMENTS, remaining // min_elem)} elements",
            )
        if etype == ValueType.STRING:
            start = cur.pos
            cbuf = self._c_buffer()
            out_end = ffi.new("uint64_t *")
            err_pos = ffi.new("uint64_t *")
            err_index = ffi.new("uint64_t *")
            code = lib.qs_scan_strings(
                cbuf + start, self._avail - start, count, MAX_STRING_BYTES, 1,
                ffi.NULL, out_end, err_pos, err_index,
            )
            if code in (1, 2) and self._avail < self.file_size:  # past the bytes at hand, not past the file
                raise NeedMoreBytes(f"the header goes on past the first {self._avail} bytes ({key!r})", start)
            if code:
                what, expected = _SCAN_MESSAGES[code]
                raise GGUFError(f"{key!r}[{err_index[0]}]: {what}", start + err_pos[0], expected)
            cur.pos = start + out_end[0]
            return StringArray(self._buf, start, count, cur.pos), etype
        if etype == ValueType.ARRAY:
            if depth >= 8:
                raise GGUFError(f"arrays nested too deeply in {key!r}", type_pos, "at most 8 levels")
            return [self._read_array(cur, key, depth + 1)[0] for _ in range(count)], etype
        nbytes = count * _SCALAR_STRUCT[etype].size
        cur.need(nbytes, f"array {key!r}")
        view = memoryview(self._buf)[cur.pos : cur.pos + nbytes]
        if etype == ValueType.BOOL and count:
            raw = view.tobytes()
            if raw.translate(None, b"\x00\x01"):
                bad = next(i for i, b in enumerate(raw) if b > 1)
                raise GGUFError(f"BOOL element {bad} of {key!r} is {raw[bad]}", cur.pos + bad, "0 or 1")
        cur.pos += nbytes
        return _Numbers(view, etype, count), etype

    def _read_tensor_info(self, cur: _Cursor) -> TensorInfo:
        start = cur.pos
        name = cur.string("tensor name", MAX_TENSOR_NAME_BYTES)
        if not name:
            raise GGUFError("empty tensor name", start, "a non-empty name")
        if name in self._by_name:
            raise GGUFError(f"duplicate tensor name {name!r}", start, "unique tensor names")
        ndim_pos = cur.pos
        n_dims = cur.u32(f"dimension count of {name!r}")
        if n_dims > MAX_DIMS:
            raise GGUFError(f"tensor {name!r} has {n_dims} dimensions", ndim_pos, f"at most {MAX_DIMS}")
        ne: list[int] = []
        n_el = 1
        for i in range(n_dims):
            p = cur.pos
            d = cur.u64(f"dimension {i} of {name!r}")
            if d > _INT64_MAX:
                raise GGUFError(f"dimension {i} of {name!r} is {d}", p, "a value below 2^63")
            n_el *= d
            if n_el > _INT64_MAX:
                raise GGUFError(f"element count of {name!r} overflows 64 bits", p, "fewer than 2^63 elements")
            ne.append(d)
        type_pos = cur.pos
        type_id = cur.u32(f"type of {name!r}")
        off_pos = cur.pos
        offset = cur.u64(f"data offset of {name!r}")
        gtype = GGML_TYPES.get(type_id)
        info = TensorInfo(name, tuple(ne), type_id, offset, 0, start, gtype, n_el, None)
        if gtype is None:
            info.problem = info.type_name
            info.problem_offset = type_pos
        else:
            row = ne[0] if ne else 1
            if row % gtype.block_elems:
                info.problem = f"row length {row} is not a multiple of {gtype.name}'s block of {gtype.block_elems}"
                info.problem_offset = type_pos
            else:
                info.n_bytes = n_el // gtype.block_elems * gtype.block_bytes
        info.problem_offset = info.problem_offset if info.problem else off_pos
        self._by_name[name] = info
        return info

    def _check_tensors(self, infos: list[TensorInfo], strict: bool) -> None:
        data_size = self.file_size - self.data_start
        for t in infos:
            if t.problem is not None:
                err = GGUFError(f"tensor {t.name!r}: {t.problem}", t.problem_offset)
                if t.type is None:  # unknown type: report, keep opening
                    self.problems.append(err)
                    continue
                self._tensor_problem(err, strict)
                continue
            off_pos = t.problem_offset
            if t.offset % self.alignment:
                t.problem = f"data offset {t.offset} is not a multiple of the alignment {self.alignment}"
            elif t.n_bytes is not None and (t.offset > data_size or t.n_bytes > data_size - t.offset):
                t.problem = (
                    f"data [{t.data_offset}, {t.data_offset + t.n_bytes}) lies outside the {self.file_size}-byte "
                    "file (truncated or corrupted)"
                )
            elif t.n_bytes is None and t.offset > data_size:
                t.problem = f"data offset {t.offset} lies past the end of the file"
            if t.problem is not None:
                self._tensor_problem(GGUFError(f"tensor {t.name!r}: {t.problem}", off_pos), strict)
        # Overlaps: sweep by offset, comparing each tensor with the furthest-reaching one before it (zero-size
        # tensors occupy nothing and can neither overlap nor hide an overlap).
        placed = sorted((t for t in infos if t.problem is None and t.n_bytes), key=lambda t: t.offset)
        reach: TensorInfo | None = None
        for t in placed:
            assert t.n_bytes is not None
            if reach is not None and reach.offset + (reach.n_bytes or 0) > t.offset:
                end = reach.data_offset + (reach.n_bytes or 0)
                t.problem = f"data overlaps tensor {reach.name!r} ([{reach.data_offset}, {end}))"
                self._tensor_problem(GGUFError(f"tensor {t.name!r}: {t.problem}", t.problem_offset), strict)
                continue
            if reach is None or t.offset + t.n_bytes > reach.offset + (reach.n_bytes or 0):
                reach = t

    def _tensor_problem(self, err: GGUFError, strict: bool) -> None:
        if strict:
            raise err
        self.problems.append(err)

    # ------------------------------------------------------------------ queries
    def __contains__(self, key: str) -> bool:
        return key in self.metadata

    def get(self, key: str, default: Any = None) -> Any:
        """Value of a metadata key, or ``default``."""
        kv = self.metadata.get(key)
        return default if kv is None else kv.value

    @property
    def architecture(self) -> str | None:
        """``general.architecture``."""
        v = self.get("general.architecture")
        return v if isinstance(v, str) else None

    def arch_get(self, suffix: str, default: Any = None) -> Any:
        """``{architecture}.{suffix}``, e.g. ``arch_get('block_count')``."""
        return self.get(f"{self.architecture}.{suffix}", default)

    @property
    def file_type(self) -> int | None:
        """``general.file_type`` (the llama_ftype enum value)."""
        v = self.get("general.file_type")
        return int(v) if isinstance(v, int) else None

    @property
    def file_type_name(self) -> str | None:
        """``general.file_type`` named with the *file-type* enum, e.g. ``MOSTLY_Q4_K_M``."""
        ft = self.file_type
        return None if ft is None else file_type_name(ft)

    def tensor(self, name: str) -> TensorInfo:
        """The tensor called ``name`` (``KeyError`` naming it otherwise)."""
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no tensor named {name!r}") from None

    def has_tensor(self, name: str) -> bool:
        return name in self._by_name

    def _usable(self, t: TensorInfo) -> int:
        if t.problem is not None or t.n_bytes is None:
            raise GGUFError(f"tensor {t.name!r} cannot be read: {t.problem}", t.problem_offset)
        return t.n_bytes

    def _fetched(self, t: TensorInfo, offset: int, n: int) -> None:
        """Refuse to read tensor data a remote file's header-only buffer does not hold."""
        if not self._parts and offset + n > self._avail:
            raise GGUFError(f"tensor {t.name!r}: its data was not fetched (only the file's first {self._avail} "
                            "bytes are at hand)", offset)

    def tensor_bytes(self, t: TensorInfo | str) -> np.ndarray:
        """The tensor's raw bytes as a read-only ``uint8`` view (no copy)."""
        if isinstance(t, str):
            t = self.tensor(t)
        import numpy as np

        n = self._usable(t)
        self._fetched(t, t.data_offset, n)
        return np.frombuffer(self._part_buf(t), dtype=np.uint8, count=n, offset=t.data_offset)

    def entry_bytes(self, key: str) -> bytes:
        """One metadata entry exactly as stored (key, type and value), read under the fault guard: what a writer
        copies to keep an entry byte for byte."""
        kv = self.metadata[key]
        from ..native.mapped import copy_bytes

        return copy_bytes(self._buf, kv.offset, kv.end, f"metadata {key}")

    def tensor_rows(self, t: TensorInfo | str) -> np.ndarray:
        """Raw bytes shaped ``(n_rows, row_bytes)`` (what ``gguf.quants.dequantize`` takes)."""
        if isinstance(t, str):
            t = self.tensor(t)
        raw = self.tensor_bytes(t)
        assert t.row_bytes is not None
        return raw.reshape(t.n_rows, t.row_bytes) if t.row_bytes else raw.reshape(t.n_rows, 0)

    def tensor_array(self, t: TensorInfo | str) -> np.ndarray:
        """Typed zero-copy view of a non-block tensor (F32, F16, F64, I*; BF16 as ``uint16``) in numpy shape."""
        if isinstance(t, str):
            t = self.tensor(t)
        self._fetched(t, t.data_offset, self._usable(t))
        assert t.type is not None
        dtype = t.type.dtype
        if dtype is None:
            raise TypeError(f"{t.name} is {t.type.name}, a block format: use tensor_rows() or dequantize()")
        import numpy as np

        return np.frombuffer(self._part_buf(t), dtype=dtype, count=t.n_elements,
                             offset=t.data_offset).reshape(t.shape)

    def release_pages(self, offset: int, length: int, shard: int = 0) -> None:
        """Drop this process's mapping of whole pages inside ``[offset, offset+length)`` of file ``shard`` (a
        tensor's: ``t.data_offset``, ``shard=t.shard``; they stay in the page cache), so streaming a large file
        keeps resident memory bounded. No-op for in-memory buffers."""
        m = self._parts[shard]._mmap if self._parts and 0 <= shard < len(self._parts) else self._mmap
        if m is None or length <= 0:
            return
        page = mmap.PAGESIZE
        a = (offset + page - 1) // page * page
        b = (offset + length) // page * page
        if b > a:
            release_mapped_pages(m, a, b - a)

    def block_location(self, t: TensorInfo | str, row: int, block: int) -> tuple[int, int]:
        """Offset in the tensor's file (``t.shard``'s) and byte size of block ``block`` of row ``row`` (flattened
        rows)."""
        if isinstance(t, str):
            t = self.tensor(t)
        self._usable(t)
        assert t.type is not None and t.row_bytes is not None
        n_blocks = t.row_len // t.type.block_elems
        if not 0 <= row < t.n_rows:
            raise IndexError(f"row {row} out of range: {t.name} has {t.n_rows} rows")
        if not 0 <= block < n_blocks:
            raise IndexError(f"block {block} out of range: rows of {t.name} have {n_blocks} blocks")
        return t.data_offset + row * t.row_bytes + block * t.type.block_bytes, t.type.block_bytes

    def block_bytes(self, t: TensorInfo | str, row: int, block: int) -> bytes:
        """The raw bytes of one block."""
        if isinstance(t, str):
            t = self.tensor(t)
        off, n = self.block_location(t, row, block)
        self._fetched(t, off, n)
        return bytes(self._part_buf(t)[off : off + n])


def open_gguf(path: str | os.PathLike[str], *, strict: bool = True, whole_set: bool = True) -> GGUFFile:
    """Open a GGUF file, or the split model it is a shard of (see :class:`GGUFFile`)."""
    return GGUFFile(path, strict=strict, whole_set=whole_set)
