"""Lazy, indexable view over a GGUF string array (no Python object per element until asked for)."""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, overload

from ..base.gguf_constants import MAX_STRING_BYTES
from ..native import ffi, lib
from ..native.mapped import copy_bytes
from .errors import GGUFError

if TYPE_CHECKING:
    import numpy as np


class StringArray(Sequence[str]):
    """``count`` gguf_strings laid out back to back in ``buf`` starting at byte ``start``.

    The reader has already walked (and UTF-8-validated) the array natively to find where it ends; the
    per-element offsets index is built on first element access, in C, as one ``uint64`` array (no numpy: the
    tokenizer's command-line path does not import it).
    """

    __slots__ = ("_buf", "_count", "_end", "_index", "_start")

    def __init__(self, buf: Any, start: int, count: int, end: int, index: array[int] | None = None) -> None:
        self._buf = buf
        self._start = start
        self._count = count
        self._end = end
        self._index = index

    def detached(self) -> StringArray:
        """The same array over its own copy of the bytes (made under the fault guard): it outlives the file's mapping
        and cannot fault (the tokenizer's pieces, decoded one at a time on access)."""
        return StringArray(self.copy(), 0, self._count, self.nbytes, self._offsets())

    @property
    def buffer(self) -> Any:
        """The buffer the elements are read from (the file's mapping, or a :meth:`detached` copy)."""
        return self._buf

    @property
    def start(self) -> int:
        """File offset of the first element's length field."""
        return self._start

    @property
    def end(self) -> int:
        """File offset just past the last element."""
        return self._end

    @property
    def nbytes(self) -> int:
        """Bytes the array occupies in the file (length fields included)."""
        return self._end - self._start

    def __len__(self) -> int:
        return self._count

    def _offsets(self) -> array[int]:
        """Offset (from :attr:`start`) of each element's length field, and of the end: ``count + 1`` entries."""
        if self._index is None:
            index = array("Q", bytes(8 * (self._count + 1)))
            span = memoryview(self._buf)[self._start : self._end]
            cbuf = ffi.from_buffer("uint8_t[]", span)
            out_end = ffi.new("uint64_t *")
            err_pos = ffi.new("uint64_t *")
            err_index = ffi.new("uint64_t *")
            code = lib.qs_scan_strings(
                cbuf, len(span), self._count, MAX_STRING_BYTES, 0,
                ffi.cast("uint64_t *", ffi.from_buffer(index, require_writable=True)), out_end, err_pos, err_index,
            )
            ffi.release(cbuf)
            span.release()
            if code != 0:  # the buffer changed under us (it is validated at open)
                raise GGUFError("string array changed since the file was opened", self._start + err_pos[0])
            self._index = index
        return self._index

    def offsets(self) -> array[int]:
        """Where each element's length field lies in :meth:`copy` (``count + 1`` entries, the last = :attr:`nbytes`);
        the array is shared: do not modify it."""
        return self._offsets()

    def offset_of(self, i: int) -> int:
        """File offset of element ``i``'s length field."""
        return self._start + int(self._offsets()[self._norm(i)])

    def raw(self, i: int) -> bytes:
        """The UTF-8 bytes of element ``i``."""
        off = self._offsets()
        i = self._norm(i)
        a = self._start + int(off[i]) + 8
        b = self._start + int(off[i + 1])
        return bytes(self._buf[a:b])

    def lengths(self) -> np.ndarray:
        """Byte length of every element (one vectorised pass over the index)."""
        import numpy as np

        off = np.frombuffer(self._offsets(), np.uint64).astype(np.int64)
        return np.diff(off) - 8

    def _norm(self, i: int) -> int:
        n = self._count
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"string index {i} out of range for {n} elements")
        return i

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self._count))]
        return self.raw(i).decode("utf-8")

    def __iter__(self) -> Iterator[str]:
        """Every element in order, decoded from one guarded copy of the array's bytes: a whole-vocabulary read
        (the tokenizer) of a file truncated under it raises ``MappedFileError`` instead of dying by SIGBUS."""
        off = self._offsets()
        blob = self.copy()
        for k in range(self._count):
            yield blob[int(off[k]) + 8 : int(off[k + 1])].decode("utf-8")

    def to_list(self) -> list[str]:
        """Every element as a ``str`` (allocates one object per element); one guarded copy, as :meth:`__iter__`."""
        offs = self._offsets().tolist()
        blob = self.copy()
        return [blob[a + 8 : b].decode("utf-8") for a, b in itertools.pairwise(offs)]

    def copy(self) -> bytes:
        """The array's bytes (length fields included), copied under the fault guard: a file truncated under the read
        raises ``MappedFileError`` instead of killing the process by SIGBUS."""
        return copy_bytes(self._buf, self._start, self._end, "string array")

    def __repr__(self) -> str:
        return f"StringArray(count={self._count}, bytes={self.nbytes})"
