"""The native library's error codes and guarded reads of mapped memory, without numpy (the tokenizer's fast CLI
path imports this and not :mod:`numpy`)."""

from __future__ import annotations

from typing import Any

from ..filestate import FileChangedError
from . import ffi, lib


class KernelError(RuntimeError):
    """A native kernel reported failure (e.g. out of memory)."""


#: What the engine's error codes (``QS_ERR_*`` in csrc/qs_api_nn.h) mean.
NATIVE_ERRORS = {
    -1: "a size argument is out of range",
    -2: "out of memory",
    -3: "a weight type has no kernel or a row length is not a whole number of blocks",
    -4: "a weight buffer is shorter than its rows need",
    -5: "a norm or bias vector is missing or has the wrong length",
    -6: "the KV cache is smaller than n_ctx x n_head_kv x head_dim",
    -7: "a position lies outside the context",
    -8: "head counts, head dimension or RoPE dimension are invalid",
}


def native_error(what: str, rc: int) -> KernelError:
    """A :class:`KernelError` saying what failed and what the native code ``rc`` means."""
    return KernelError(f"{what} failed: {NATIVE_ERRORS.get(rc, 'unknown error')} ({rc})")


class MappedFileError(KernelError, FileChangedError):
    """A kernel's input (a memory-mapped file) stopped being readable mid-call: the file was truncated or replaced.

    The native guard turned the SIGBUS into this error; the process and the kernel pool are unharmed.
    """


MAPPED_FAULT = int(lib.QS_ERR_MAPPED_FAULT)
_MAPPED_MESSAGE = "mapped memory is no longer readable: the file changed or was truncated"


def check(rc: int, what: str) -> None:
    """Raise for a native return code: :class:`MappedFileError` for the guard's code, else :class:`KernelError`."""
    if rc == MAPPED_FAULT:
        raise MappedFileError(f"{what}: {_MAPPED_MESSAGE}")
    if rc != 0:
        raise native_error(what, rc)


def copy_bytes(buf: Any, start: int, end: int, what: str = "read") -> bytes:
    """``buf[start:end]`` (typically a memory-mapped file) copied under the fault guard: raises
    :class:`MappedFileError` instead of dying by SIGBUS when the file was truncated under it."""
    n = end - start
    if n <= 0:
        return b""
    out = bytearray(n)
    with memoryview(buf)[start:end] as view:
        src = ffi.from_buffer("uint8_t[]", view)
        try:
            check(lib.qs_copy_mapped(ffi.from_buffer("uint8_t[]", out, require_writable=True), src, n), what)
        finally:
            ffi.release(src)
    return bytes(out)


def exit_on_unguarded_fault(message: str | None, status: int = 2) -> None:
    """CLI mode: a SIGBUS outside the guarded kernels (numpy reading a truncated mapping) prints ``message`` (one
    line) and exits with ``status`` instead of killing the process by the signal; ``None`` turns that off."""
    lib.qs_guard_set_fatal_message(ffi.NULL if message is None else message.encode("utf-8", "replace") + b"\n",
                                   status)
