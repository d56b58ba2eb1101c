"""Typed wrappers over the native kernels: numpy arrays in, zero-copy, every size validated before C sees it.

cffi releases the GIL around each call, so these can run in worker threads in parallel with the GUI.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..base.ggml_types import GGMLType, ggml_type
from . import ffi, lib
from .mapped import (  # noqa: F401 - re-exported: the kernels' error types live in the numpy-free module
    _MAPPED_MESSAGE,
    MAPPED_FAULT,
    NATIVE_ERRORS,
    KernelError,
    MappedFileError,
    check,
    exit_on_unguarded_fault,
    native_error,
)


def _isa_names() -> tuple[str, ...]:
    names = []
    while (name := lib.qs_isa_name(len(names))) != ffi.NULL:
        names.append(ffi.string(name).decode())
    return tuple(names)


#: The instruction-set levels of this build's CPU family, lowest first: ``scalar, avx2, avx512`` on x86-64,
#: ``scalar, neon, dotprod, i8mm`` on ARM64.
ISA_NAMES = _isa_names()
#: The CPU family the library was built for: ``x86_64``, ``arm64`` or ``generic``.
ARCH = ffi.string(lib.qs_arch_name()).decode()

#: Activation (vec-dot) type id -> bytes per ``block`` elements.
_ACT_LAYOUT = {0: (1, 4), 1: (1, 2), 30: (1, 2), 8: (32, 34), 9: (32, 36), 15: (256, 292)}


def check_last_fault(what: str) -> None:
    """After a call without an error return (``qs_read_probe``, ``qs_utf8_invalid_at``): raise if it faulted."""
    if lib.qs_guard_last_fault():
        raise MappedFileError(f"{what}: {_MAPPED_MESSAGE}")


def copy_mapped(a: np.ndarray, what: str = "read", out: np.ndarray | None = None) -> np.ndarray:
    """A copy of ``a`` (typically a view of a memory-mapped file) made under the fault guard: numpy code then works
    on memory that cannot vanish. Raises :class:`MappedFileError` when the file was truncated under it. ``out``: a
    contiguous buffer of ``a``'s dtype and size to copy into."""
    src = np.asarray(a)
    if not src.flags.c_contiguous:
        src = np.ascontiguousarray(src)  # strided views are small (single blocks): copied by numpy
        return src if src is not a else src.copy()
    if out is not None and (out.dtype != src.dtype or out.shape != src.shape or not out.flags.c_contiguous):
        raise ValueError("out must match the source's dtype and shape")
    out = np.empty_like(src) if out is None else out
    if src.nbytes:
        check(lib.qs_copy_mapped(ffi.cast("uint8_t *", ffi.from_buffer(out, require_writable=True)),
                                 ffi.cast("uint8_t *", ffi.from_buffer(src)), src.nbytes), what)
    return out


def isa_detected() -> str:
    """Best instruction set this CPU supports (one of :data:`ISA_NAMES`)."""
    return ISA_NAMES[lib.qs_isa_detected()]


def has_vbmi() -> bool:
    """Whether this CPU has AVX512_VBMI, which the AVX-512 lattice i-quant dots need (else AVX2 runs them)."""
    return bool(lib.qs_cpu_has_vbmi())


def has_avx512_bf16() -> bool:
    """Whether this CPU has AVX512_BF16: the repacked BF16 kernels of the AVX-512 level use vdpbf16ps."""
    return bool(lib.qs_cpu_has_avx512bf16())


@contextmanager
def bf16_dot(on: bool) -> Iterator[bool]:
    """Run a block with the AVX-512 BF16 kernels on vdpbf16ps (where the CPU has it) or on the AVX-512F fallback;
    yields whether vdpbf16ps is on, and restores the previous state."""
    prev = lib.qs_bf16_dot_set(1 if on else 0)
    try:
        yield bool(lib.qs_bf16_dot_set(-1))
    finally:
        lib.qs_bf16_dot_set(prev)


def isa() -> str:
    """Instruction set the kernels use now."""
    return ISA_NAMES[lib.qs_isa_get()]


def set_isa(level: str | int) -> str:
    """Force a lower instruction set (clamped to what the CPU has); returns the level now active."""
    if isinstance(level, str) and level not in ISA_NAMES:
        raise ValueError(f"unknown instruction set {level!r} on {ARCH} (one of {', '.join(ISA_NAMES)})")
    n = ISA_NAMES.index(level) if isinstance(level, str) else int(level)
    return ISA_NAMES[lib.qs_isa_set(n)]


@contextmanager
def forced_isa(level: str | int) -> Iterator[str]:
    """Run a block with the kernels limited to ``level``; restores the previous level."""
    prev = lib.qs_isa_get()
    try:
        yield set_isa(level)
    finally:
        lib.qs_isa_set(prev)


@contextmanager
def prefill_gemm(on: bool) -> Iterator[None]:
    """Run a block with the tiled prefill GEMM switched on or off (off: row-by-row dot kernels)."""
    prev = lib.qs_gemm_set(1 if on else 0)
    try:
        yield
    finally:
        lib.qs_gemm_set(prev)


def default_threads() -> int:
    """Threads a call uses when none is given (online CPUs)."""
    return int(lib.qs_threads_default())


def _t(qtype: GGMLType | int | str) -> GGMLType:
    return qtype if isinstance(qtype, GGMLType) else ggml_type(qtype)


def _in(arr: np.ndarray, dtype: Any, what: str) -> np.ndarray:
    a = np.asarray(arr)
    if a.dtype != np.dtype(dtype):
        raise TypeError(f"{what} must be {np.dtype(dtype)}, got {a.dtype}")
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    return a


def _ptr(a: np.ndarray, ctype: str) -> Any:
    return ffi.cast(ctype, ffi.from_buffer(a, require_writable=False)) if a.size else ffi.NULL


def _out(a: np.ndarray, ctype: str) -> Any:
    return ffi.cast(ctype, ffi.from_buffer(a, require_writable=True)) if a.size else ffi.NULL


def can_dequantize(qtype: GGMLType | int | str) -> bool:
    """True when the native library dequantizes this type."""
    return bool(lib.qs_can_dequantize(_t(qtype).id))


def dequantize(raw: np.ndarray, qtype: GGMLType | int | str, *, threads: int = 0,
               out: np.ndarray | None = None) -> np.ndarray:
    """Native dequantization; same contract (and bits) as :func:`quantscope.core.quant.dequantize`. ``out``: a
    contiguous float32 buffer of at least the result's size to write into (its leading part is returned)."""
    t = _t(qtype)
    if not lib.qs_can_dequantize(t.id):
        raise NotImplementedError(f"no native dequantizer for {t.name}")
    a = _in(raw, np.uint8, "raw")
    if a.ndim == 0 or a.shape[-1] % t.block_bytes:
        raise ValueError(f"last dimension must hold whole {t.name} blocks of {t.block_bytes} bytes")
    n_blocks = a.size // t.block_bytes
    shape = (*a.shape[:-1], a.shape[-1] // t.block_bytes * t.block_elems)
    if out is None:
        out = np.empty(shape, dtype=np.float32)
    else:
        need = n_blocks * t.block_elems
        if out.dtype != np.float32 or not out.flags.c_contiguous or out.size < need:
            raise ValueError(f"out must be a contiguous float32 buffer of at least {need} values")
        out = out.reshape(-1)[:need].reshape(shape)
    if n_blocks:
        check(lib.qs_dequantize(t.id, _ptr(a, "uint8_t *"), _out(out, "float *"), n_blocks, threads),
              f"dequantize {t.name}")
    return out


def activation_type(qtype: GGMLType | int | str) -> GGMLType | None:
    """The activation type a weight type's dot product pairs with, or ``None`` (dequantize + float fallback)."""
    act = lib.qs_vec_dot_type(_t(qtype).id)
    return None if act < 0 else ggml_type(act)


def quantize_activation(x: np.ndarray, act: GGMLType | int | str) -> np.ndarray:
    """Quantize a float32 vector to an activation type (Q8_0, Q8_1, Q8_K, F16, BF16, F32) exactly as ggml's ref."""
    t = _t(act)
    if t.id not in _ACT_LAYOUT:
        raise ValueError(f"{t.name} is not an activation type")
    v = _in(x, np.float32, "x").reshape(-1)
    blk, nbytes = _ACT_LAYOUT[t.id]
    if v.size % blk:
        raise ValueError(f"{t.name} needs a multiple of {blk} values, got {v.size}")
    out = np.empty(v.size // blk * nbytes, dtype=np.uint8)
    if lib.qs_quantize_activation(t.id, _ptr(v, "float *"), _out(out, "uint8_t *"), v.size) != 0:
        raise KernelError(f"quantize {t.name} failed")
    return out


def vec_dot(qtype: GGMLType | int | str, w_row: np.ndarray, xq: np.ndarray, n: int) -> float:
    """Dot product of one weight row (raw bytes) with an activation already quantized to its partner type."""
    t = _t(qtype)
    act = activation_type(t)
    if act is None:
        raise NotImplementedError(f"no direct dot kernel for {t.name}")
    w = _in(w_row, np.uint8, "w_row").reshape(-1)
    x = _in(xq, np.uint8, "xq").reshape(-1)
    if n % t.block_elems or w.size != t.row_bytes(n):
        raise ValueError(f"a {t.name} row of {n} elements is {t.row_bytes(n)} bytes, got {w.size}")
    blk, nbytes = _ACT_LAYOUT[act.id]
    if n % blk or x.size != n // blk * nbytes:
        raise ValueError(f"{act.name} activation of {n} elements is {n // blk * nbytes} bytes, got {x.size}")
    out = ffi.new("float *")
    check(lib.qs_vec_dot(t.id, n, _ptr(w, "uint8_t *"), _ptr(x, "uint8_t *"), out), f"vec_dot {t.name}")
    return float(out[0])


def _weights(w: np.ndarray, t: GGMLType, n_rows: int, k: int) -> np.ndarray:
    a = _in(w, np.uint8, "weights")
    if k <= 0 or k % t.block_elems:
        raise ValueError(f"row length {k} is not a positive multiple of {t.name}'s block of {t.block_elems}")
    if a.size != n_rows * t.row_bytes(k):
        raise ValueError(f"{n_rows} rows of {k} {t.name} elements are {n_rows * t.row_bytes(k)} bytes, got {a.size}")
    return a


def matmat(qtype: GGMLType | int | str, w: np.ndarray, n_rows: int, k: int, x: np.ndarray, *,
           threads: int = 0) -> np.ndarray:
    """``Y = X @ W.T`` for quantized ``W`` (``n_rows`` × ``k``, raw bytes) and float32 ``X`` (``n_x`` × ``k``).

    Activations are quantized to the weight type's partner as ggml does; returns float32 ``(n_x, n_rows)``.
    """
    t = _t(qtype)
    if not lib.qs_can_dequantize(t.id):
        raise NotImplementedError(f"no native kernel for {t.name}")
    wa = _weights(w, t, n_rows, k)
    xa = _in(x, np.float32, "x")
    if xa.ndim != 2 or xa.shape[1] != k:
        raise ValueError(f"x must have shape (n, {k}), got {xa.shape}")
    y = np.empty((xa.shape[0], n_rows), dtype=np.float32)
    rc = lib.qs_matmat(t.id, _ptr(wa, "uint8_t *"), n_rows, k, _ptr(xa, "float *"), xa.shape[0],
                       _out(y, "float *"), threads)
    check(rc, f"matmat {t.name}")
    return y


def matvec(qtype: GGMLType | int | str, w: np.ndarray, n_rows: int, k: int, x: np.ndarray, *,
           threads: int = 0, out: np.ndarray | None = None) -> np.ndarray:
    """``y = W @ x`` for quantized ``W`` (``n_rows`` × ``k``) and float32 ``x`` of length ``k``."""
    t = _t(qtype)
    if not lib.qs_can_dequantize(t.id):
        raise NotImplementedError(f"no native kernel for {t.name}")
    wa = _weights(w, t, n_rows, k)
    xa = _in(x, np.float32, "x").reshape(-1)
    if xa.size != k:
        raise ValueError(f"x must have {k} elements, got {xa.size}")
    if out is None:
        out = np.empty(n_rows, dtype=np.float32)
    elif out.dtype != np.float32 or out.size != n_rows or not out.flags.c_contiguous:
        raise ValueError(f"out must be a contiguous float32 array of {n_rows}")
    rc = lib.qs_matvec(t.id, _ptr(wa, "uint8_t *"), n_rows, k, _ptr(xa, "float *"), _out(out, "float *"), threads)
    check(rc, f"matvec {t.name}")
    return out


def get_rows(qtype: GGMLType | int | str, table: np.ndarray, n_rows: int, row_len: int, ids: np.ndarray, *,
             threads: int = 0) -> np.ndarray:
    """Embedding lookup: dequantize rows ``ids`` of a ``n_rows`` × ``row_len`` table of any supported type.

    The rows are read in C under the fault guard (the table is usually a view of the mapped file)."""
    t = _t(qtype)
    if not lib.qs_can_dequantize(t.id):
        raise NotImplementedError(f"no native dequantizer for {t.name}")
    tab = _weights(table, t, n_rows, row_len)
    idx = np.ascontiguousarray(np.asarray(ids, dtype=np.int64).reshape(-1))
    if idx.size and (idx.min() < 0 or idx.max() >= n_rows):
        raise IndexError(f"row ids must lie in 0..{n_rows - 1}")
    out = np.empty((idx.size, row_len), dtype=np.float32)
    if idx.size:
        check(lib.qs_get_rows(t.id, _ptr(tab, "uint8_t *"), n_rows, row_len, _ptr(idx, "int64_t *"), idx.size,
                              _out(out, "float *"), threads), f"get_rows {t.name}")
    return out


# ---------------------------------------------------------------- repacked weights (docs/engine.md#repacked-weights)

#: Rows of one repacked group: repacking needs a multiple of this many rows.
REPACK_ROWS = 16


def can_repack(qtype: GGMLType | int | str, n_rows: int, k: int) -> bool:
    """True when a weight of this type and shape has a repacked (16-row interleaved) layout."""
    return int(lib.qs_repack_bytes(_t(qtype).id, n_rows, k)) > 0


class RepackCancelled(RuntimeError):
    """Repacking was cancelled through its ``cancel`` callback."""


class Repacked:
    """A weight's repacked copy in anonymous, huge-page-backed memory (freed when this object goes away).

    ``type_id`` is the id the native matmul and block accept for it; ``ptr`` its address.
    """

    def __init__(self, qtype: GGMLType | int | str, w: np.ndarray, n_rows: int, k: int, *, threads: int = 0,
                 progress: Any = None, cancel: Any = None, release_source: bool = False) -> None:
        """Repack ``w`` (raw ggml rows). ``progress(done_bytes)`` is called as row groups complete; ``cancel()``
        returning true stops with :class:`RepackCancelled`. ``release_source``: drop this process's pages of a
        file-mapped ``w`` as each chunk is copied (:func:`drop_pages`), so the file's copy and the repacked one
        are never both resident. Raises ``ValueError`` when the shape has no layout."""
        t = _t(qtype)
        wa = _weights(w, t, n_rows, k)
        nbytes = int(lib.qs_repack_bytes(t.id, n_rows, k))
        if nbytes <= 0:
            raise ValueError(f"{t.name} {n_rows}x{k} has no repacked layout")
        raw = lib.qs_alloc_huge(nbytes)
        if raw == ffi.NULL:
            raise MemoryError(f"cannot allocate {nbytes} bytes for a repacked {t.name} weight")
        self.ptr = ffi.gc(ffi.cast("uint8_t *", raw), lambda p, n=nbytes: lib.qs_free_huge(p, n), size=nbytes)
        self.type = t
        self.type_id = int(lib.qs_repack_type(t.id))
        self.rows, self.k, self.nbytes = n_rows, k, nbytes
        groups = n_rows // REPACK_ROWS
        step = max(1, min(groups, (8 << 20) // max(1, t.row_bytes(k) * REPACK_ROWS)))  # ~8 MiB of source per call
        src = _ptr(wa, "uint8_t *")
        flat, rb = wa.reshape(-1), t.row_bytes(k) * REPACK_ROWS
        for g0 in range(0, groups, step):
            if cancel is not None and cancel():
                raise RepackCancelled("repacking cancelled")
            g1 = min(groups, g0 + step)
            check(lib.qs_repack(t.id, src, wa.size, n_rows, k, self.ptr, nbytes, g0, g1, threads), f"repack {t.name}")
            if release_source:
                drop_pages(flat[g0 * rb : g1 * rb])
            if progress is not None:
                progress(g1 * REPACK_ROWS * t.row_bytes(k))
        if release_source:
            drop_pages(wa)  # the pages the chunks straddled

    def matmat(self, x: np.ndarray, *, threads: int = 0) -> np.ndarray:
        """``Y = X @ W.T`` on the repacked weight (same contract as :func:`matmat`)."""
        xa = _in(x, np.float32, "x")
        if xa.ndim != 2 or xa.shape[1] != self.k:
            raise ValueError(f"x must have shape (n, {self.k}), got {xa.shape}")
        y = np.empty((xa.shape[0], self.rows), dtype=np.float32)
        rc = lib.qs_matmat(self.type_id, self.ptr, self.rows, self.k, _ptr(xa, "float *"), xa.shape[0],
                           _out(y, "float *"), threads)
        check(rc, f"matmat repacked {self.type.name}")
        return y


def _file_mapped(a: np.ndarray) -> bool:
    """``a`` is a read-only view of an ``mmap`` (on anonymous or copy-on-write memory, MADV_DONTNEED would
    discard the data itself)."""
    if a.flags.writeable:
        return False
    b: Any = a
    while isinstance(b, np.ndarray | memoryview):
        b = b.base if isinstance(b, np.ndarray) else b.obj
    return isinstance(b, mmap.mmap)


def drop_pages(a: np.ndarray) -> None:
    """Release this process's pages of a read-only file-mapped array (they are read again from the file if used);
    no-op for any other array."""
    if a.size and a.flags.c_contiguous and _file_mapped(a):
        lib.qs_drop_pages(_ptr(a, "uint8_t *"), a.nbytes)


def can_quantize(qtype: GGMLType | int | str) -> bool:
    """True when :func:`quantize_rows` has a native quantizer for this type (ggml's bytes)."""
    return bool(lib.qs_can_quantize(_t(qtype).id))


class NonFiniteRows(ValueError):
    """Rows handed to a quantizer hold a NaN or an infinity; ``row`` is the first such row."""

    def __init__(self, row: int) -> None:
        super().__init__(f"row {row} holds a value that is not a finite number")
        self.row = row


def quantize_rows(qtype: GGMLType | int | str, rows: np.ndarray, imatrix: np.ndarray | None = None, *,
                  threads: int = 0, out: np.ndarray | None = None) -> np.ndarray:
    """Quantize float32 rows ``(n_rows, n_per_row)`` into ``qtype`` exactly as ggml's quantizer does.

    ``imatrix``: ``None`` or one importance weight per column (ggml's weighted search; types without one ignore
    it). Returns the raw bytes, shape ``(n_rows, row_bytes)`` (in ``out`` when given: a C-contiguous uint8 buffer
    of at least that size). Raises :class:`NonFiniteRows` when a row holds a NaN or an infinity.
    """
    t = _t(qtype)
    if not lib.qs_can_quantize(t.id):
        raise ValueError(f"no quantizer for {t.name}")
    x = _in(rows, np.float32, "rows")
    if x.ndim == 1:
        x = x.reshape(1, -1)
    if x.ndim != 2:
        raise ValueError(f"rows must be 2-D, got shape {x.shape}")
    n_rows, n = x.shape
    if n % t.block_elems:
        raise ValueError(f"{t.name} rows need a multiple of {t.block_elems} values, got {n}")
    qw = ffi.NULL
    if imatrix is not None:
        im = _in(imatrix, np.float32, "imatrix").reshape(-1)
        if im.size != n:
            raise ValueError(f"the importance vector has {im.size} values for rows of {n}")
        qw = _ptr(im, "float *")
    need = n_rows * t.row_bytes(n)
    if out is None:
        out = np.empty(need, dtype=np.uint8)
    elif out.dtype != np.uint8 or not out.flags.c_contiguous or out.size < need:
        raise ValueError(f"out must be a contiguous uint8 buffer of at least {need} bytes")
    res = out.reshape(-1)[:need].reshape(n_rows, t.row_bytes(n))
    got = lib.qs_quantize_rows(t.id, _ptr(x, "float *"), n_rows, n, qw, _out(res, "uint8_t *"), need, threads)
    if got == -4:
        bad = ~np.isfinite(x)
        raise NonFiniteRows(int(np.argwhere(bad.any(axis=1))[0][0]))
    if got != need:
        raise KernelError(f"quantize {t.name} failed ({got})")
    return res
