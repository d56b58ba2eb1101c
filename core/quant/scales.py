"""A scan of every quantized block's fp16 scales (and every float tensor's values) for NaN and infinity: bit tests
on the raw bytes, no dequantization, in chunks with progress and cancel."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cache

import numpy as np

from ..base.ggml_types import ggml_type
from ..gguf import GGUFFile
from ..jobs import CancelFlag, Cancelled, Progress, check_cancel
from ..native import kernels as native
from .blocks import can_decode, decode_block


class ScanCancelled(Cancelled):
    """The scan stopped because its cancel token was set."""


@dataclass(frozen=True)
class BadScale:
    """A non-finite scale (or value, for float tensors): ``field`` of block ``block`` of ``tensor``."""

    tensor: str
    block: int
    field: str
    bits: int


@dataclass
class ScaleScan:
    """Result of :func:`scan_scales`."""

    tensors_scanned: int = 0
    blocks_scanned: int = 0
    n_bad: int = 0
    bad: list[BadScale] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0


@cache
def scale_fields(type_name: str) -> tuple[tuple[str, int], ...]:
    """``(field name, byte offset)`` of every fp16 scale in a block of ``type_name`` (from its decoder)."""
    t = ggml_type(type_name)
    if not t.is_quantized or not can_decode(t):
        return ()
    return tuple((fd.name, fd.offset) for fd in decode_block(t, bytes(t.block_bytes)).fields if fd.kind == "fp16")


def scan_scales(f: GGUFFile, *, chunk_bytes: int = 8 << 20, max_report: int = 100,
                progress: Progress | None = None, cancel: CancelFlag | None = None) -> ScaleScan:
    """Find NaN/Inf fp16 scales in every quantized block (and NaN/Inf values in float tensors).

    Bit tests on the raw bytes (exponent all ones), no dequantization; progress in bytes."""
    t0 = time.perf_counter()
    res = ScaleScan()
    todo = [t for t in f.tensors if t.type is not None and not t.problem and t.n_bytes]
    total = sum(t.n_bytes or 0 for t in todo)
    done = 0
    for t in todo:
        assert t.type is not None
        name = t.type.name
        raw = f.tensor_bytes(t)
        if t.type.inf_nan_bits:  # a float type: every value's exponent bits
            width = t.type.block_bytes
            dt, mask = f"<u{width}", t.type.inf_nan_bits
            fields: tuple[tuple[str, int], ...] = (("value", 0),)
        else:
            fields = scale_fields(name)
            dt, mask, width = "<u2", 0x7C00, t.type.block_bytes
            if not fields:
                res.skipped.append(f"{t.name} ({name}: no fp16 scale fields known)")
                done += t.n_bytes or 0
                continue
        step = max(width, chunk_bytes // width * width)
        for a in range(0, raw.size, step):
            check_cancel(cancel, ScanCancelled)
            blocks = native.copy_mapped(raw[a : a + step], t.name).reshape(-1, width)  # guarded read
            for fname, off in fields:
                size = np.dtype(dt).itemsize
                vals = np.ascontiguousarray(blocks[:, off : off + size]).view(dt).reshape(-1)
                bad = np.flatnonzero((vals & np.array(mask, dtype=dt)) == np.array(mask, dtype=dt))
                if bad.size:
                    res.n_bad += int(bad.size)
                    for k in bad[: max(0, max_report - len(res.bad))]:
                        res.bad.append(BadScale(t.name, a // width + int(k), fname, int(vals[k])))
            res.blocks_scanned += blocks.shape[0]
            done += blocks.size
            if progress:
                progress(done, total)
        res.tensors_scanned += 1
    res.seconds = time.perf_counter() - t0
    return res


