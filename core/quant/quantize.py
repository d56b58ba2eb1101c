"""Quantize a GGUF file like llama-quantize, byte for byte (docs/quantize.md).

:func:`plan_quantize` decides every tensor's type (:mod:`.mixture`), checks everything that could fail later (types
without a quantizer, requantization, importance data that does not fit, rows the type cannot hold) and lays out
the output header; :func:`write_quantized` streams the tensors through the native quantizers into a temporary that
is renamed into place only when complete.

The output matches llama-quantize's for the same input, preset and options:

* metadata: the input's entries in their order, then ``general.quantization_version`` (2) and
  ``general.file_type`` (moved to the end), the ``split.*`` keys removed, then with an imatrix
  ``quantize.imatrix.file``, ``.dataset``, ``.entries_count`` and ``.chunks_count``;
* tensors in llama-quantize's order (:func:`.mixture.tensor_order`), dimensions as ggml counts them (trailing 1s
  dropped), data aligned to 32 bytes (or the input's ``general.alignment``: llama-quantize keeps that key but
  aligns to 32, which makes a broken file; here the file stays consistent);
* data: tensors already in their target type copied; the others converted to float32 (F16 and BF16 exactly,
  quantized inputs through the dequantizer, only with ``allow_requantize``) and quantized row by row with the
  tensor's importance weights (per expert for 3-D tensors).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from ..base.ggml_types import ggml_type
from ..base.gguf_constants import DEFAULT_ALIGNMENT, ValueType
from ..fsutil import OutputSet
from ..gguf import GGUFFile, TensorInfo
from ..gguf.writer import DataSection, GGUFHeader, encode_entry, ggml_dims, pad_to
from .imatrix import Imatrix
from .mixture import MixtureOptions, ModelShape, Preset, TypeChoice, choose_types, get_preset, requires_imatrix

QUANTIZATION_VERSION = 2
#: rows are converted and quantized in pieces of at most this many float32 values (64 MiB)
CHUNK_VALUES = 1 << 24
_REPLACED = ("general.quantization_version", "general.file_type", "split.count", "split.no", "split.tensors.count")
_IMATRIX_KEYS = ("quantize.imatrix.file", "quantize.imatrix.dataset", "quantize.imatrix.entries_count",
                 "quantize.imatrix.chunks_count")


class QuantizeError(ValueError):
    """The file cannot be quantized as asked (the message says why and what to change)."""


class QuantizeCancelled(Exception):
    """The caller cancelled; nothing was written."""


class Cancel(Protocol):
    @property
    def cancelled(self) -> bool: ...


@dataclass(frozen=True)
class QuantizeOptions:
    """llama-quantize's options. ``tensor_types`` are ``(regex, type)`` pairs, first match wins."""

    preset: str
    imatrix: Imatrix | None = None
    imatrix_label: str = ""  # the path as the user gave it (written into the metadata, like llama-quantize)
    tensor_types: tuple[tuple[str, str], ...] = ()
    output_tensor_type: str | None = None
    token_embedding_type: str | None = None
    allow_requantize: bool = False
    pure: bool = False
    leave_output_tensor: bool = False
    threads: int = 0


@dataclass(frozen=True)
class TensorJob:
    """One output tensor: the input tensor, its type choice, its output size and offset."""

    info: TensorInfo
    choice: TypeChoice
    out_bytes: int
    offset: int
    has_imatrix: bool

    @property
    def converts(self) -> bool:
        return self.choice.target != self.choice.source


@dataclass
class QuantizePlan:
    """Everything :func:`write_quantized` needs, and what a dry run shows."""

    preset: Preset
    jobs: list[TensorJob]
    header: bytes
    alignment: int
    in_bytes: int
    out_bytes: int
    n_elements: int
    warnings: list[str] = field(default_factory=list)

    @property
    def file_bytes(self) -> int:
        return len(self.header) + sum(_pad(j.out_bytes, self.alignment) for j in self.jobs)

    def bits_per_weight(self, out: bool = True) -> float:
        return 8.0 * (self.out_bytes if out else self.in_bytes) / max(self.n_elements, 1)

    def type_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for j in self.jobs:
            counts[j.choice.target] = counts.get(j.choice.target, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


@dataclass(frozen=True)
class QuantizeProgress:
    done_bytes: int
    total_bytes: int
    tensor: str
    index: int
    count: int


def _pad(n: int, a: int) -> int:
    return pad_to(n, a)


def _first(v: object, default: int) -> int:
    """A hyperparameter that may be per-layer (an array): its first element."""
    if v is None:
        return default
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return int(v)
    try:
        arr = np.asarray(v).reshape(-1)
        return int(arr[0]) if arr.size else default
    except (TypeError, ValueError):
        return default


def model_shape(f: GGUFFile) -> ModelShape:
    """The hyperparameters the mixture rules read (defaults where a key is absent, as llama.cpp's)."""
    arch = f.architecture or ""
    n_head = _first(f.arch_get("attention.head_count"), 0)
    n_head_kv = _first(f.arch_get("attention.head_count_kv"), n_head)
    n_layer = _first(f.arch_get("block_count"), 0)
    n_expert = _first(f.arch_get("expert_count"), 0)
    is_70b = arch == "llama" and n_layer == 80 and n_head != n_head_kv
    return ModelShape(arch, n_layer, n_expert, n_head, n_head_kv, is_70b)


def _kv_u32(key: str, v: int) -> bytes:
    return encode_entry(key, ValueType.UINT32, v & 0xFFFFFFFF)


def _kv_str(key: str, v: bytes) -> bytes:
    return encode_entry(key, ValueType.STRING, v)


def _truncated(s: str, limit: int = 127) -> bytes:
    """llama-quantize copies these strings into a 128-byte field: at most 127 bytes survive."""
    return s.encode("utf-8", "surrogateescape")[:limit]


def _check_target(name: str, target: str, ncols: int) -> None:
    from ..native import kernels as K

    t = ggml_type(target)
    if target in ("F32", "F16", "BF16"):
        return
    if not K.can_quantize(t):
        raise QuantizeError(f"{name}: Quantscope has no quantizer for {target} yet (it has: "
                            f"{', '.join(supported_types())}); choose another type or --tensor-type override")
    if ncols % t.block_elems:
        raise QuantizeError(f"{name}: rows of {ncols} values are not whole {target} blocks of {t.block_elems}")


def supported_types() -> list[str]:
    """The tensor types :func:`write_quantized` can produce."""
    from ..base.ggml_types import GGML_TYPES
    from ..native import kernels as K

    return ["F32", "F16", "BF16"] + [t.name for t in GGML_TYPES.values() if t.is_quantized and K.can_quantize(t)]


def _type_option(v: str | None, what: str) -> str | None:
    if v is None:
        return None
    try:
        return ggml_type(v.upper()).name
    except KeyError:
        raise QuantizeError(f"{what}: unknown ggml type {v!r}") from None


def plan_quantize(f: GGUFFile, opts: QuantizeOptions) -> QuantizePlan:
    """Decide every tensor's type and the output layout; raises :class:`QuantizeError` for anything that would
    fail while writing."""
    try:
        preset = get_preset(opts.preset)
    except ValueError as exc:
        raise QuantizeError(str(exc)) from None
    if f.architecture is None:
        raise QuantizeError("the file has no general.architecture; llama-quantize cannot load it either")
    bad = [t for t in f.tensors if t.problem or t.type is None or t.n_bytes is None]
    if bad:
        raise QuantizeError(f"tensor {bad[0].name}: {bad[0].problem or 'unknown type ' + str(bad[0].type_id)}")
    if f.version < 2:
        raise QuantizeError("GGUF v1 input: convert it with a current llama.cpp first")
    tt = tuple((p.lower(), _type_option(t, f"--tensor-type {p}") or t) for p, t in opts.tensor_types)
    mopts = MixtureOptions(tensor_types=tt, output_tensor_type=_type_option(opts.output_tensor_type,
                           "--output-tensor-type"), token_embedding_type=_type_option(opts.token_embedding_type,
                           "--token-embedding-type"), pure=opts.pure, quantize_output=not opts.leave_output_tensor,
                           has_imatrix=opts.imatrix is not None and bool(opts.imatrix.entries))
    shape = model_shape(f)
    try:
        choices = choose_types([(t.name, t.ne, t.type_name) for t in f.tensors], shape, preset, mopts)
    except ValueError as exc:
        raise QuantizeError(str(exc)) from None
    by_name = {t.name: t for t in f.tensors}
    warnings: list[str] = []
    alignment = f.alignment if f.alignment else DEFAULT_ALIGNMENT
    planned: list[tuple[TensorInfo, TypeChoice, int, bool]] = []
    for ch in choices:
        t = by_name[ch.name]
        tgt = ggml_type(ch.target)
        if t.ne[0] % tgt.block_elems:
            raise QuantizeError(f"{t.name}: rows of {t.ne[0]} values are not whole {ch.target} blocks")
        out_bytes = t.n_elements // t.ne[0] * tgt.row_bytes(t.ne[0]) if t.ne[0] else 0
        has_im = False
        if ch.target != ch.source:
            _check_target(t.name, ch.target, t.ne[0])
            if ggml_type(ch.source).is_quantized and not opts.allow_requantize:
                raise QuantizeError(f"{t.name} is {ch.source}: requantizing is disabled (pass --allow-requantize; "
                                    "the result carries both rounding errors)")
            if ggml_type(ch.source).is_quantized:
                from ..native import kernels as K

                if not K.can_dequantize(ch.source):
                    raise QuantizeError(f"{t.name}: cannot dequantize {ch.source}")
            w = opts.imatrix.entries.get(t.name) if opts.imatrix is not None else None
            if w is not None:
                n_mat = t.ne[2] if len(t.ne) > 2 else 1
                if w.sums.size == t.ne[0] * n_mat:
                    has_im = True
                elif t.name in ("token_embd.weight", "per_layer_token_embd.weight"):
                    warnings.append(f"{t.name}: the imatrix entry has {w.sums.size} values, not {t.ne[0] * n_mat}; "
                                    "quantized without it")
                else:
                    raise QuantizeError(f"{t.name}: the imatrix entry has {w.sums.size} values; the tensor needs "
                                        f"{t.ne[0] * n_mat} (another model's imatrix?)")
            elif opts.imatrix is not None:
                warnings.append(f"{t.name}: no importance data in the imatrix")
            if requires_imatrix(t.name, ch.target, preset) and not has_im:
                raise QuantizeError(f"{t.name} -> {ch.target} needs an importance matrix (--imatrix); without one "
                                    "the result is garbage, so llama-quantize refuses too")
        if ch.reason == "fallback":
            warnings.append(f"{t.name}: rows of {t.ne[0]} do not fit {ch.fell_back_from}; using {ch.target}")
        planned.append((t, ch, out_bytes, has_im))
    header = _metadata(f, preset, opts, alignment)
    jobs = [TensorJob(t, ch, n, header.add_tensor(t.name, ggml_dims(t.ne), ggml_type(ch.target).id, n), has_im)
            for t, ch, n, has_im in planned]
    return QuantizePlan(preset, jobs, header.encode(), alignment, sum(j.info.n_bytes or 0 for j in jobs),
                        sum(j.out_bytes for j in jobs), sum(j.info.n_elements for j in jobs), warnings)


def _metadata(f: GGUFFile, preset: Preset, opts: QuantizeOptions, alignment: int) -> GGUFHeader:
    """The output's metadata: the input's (less the replaced keys) and llama-quantize's additions."""
    im = opts.imatrix
    drop = set(_REPLACED) | (set(_IMATRIX_KEYS) if im is not None else set())
    kvs = [f.entry_bytes(key) for key in f.metadata if key not in drop]
    kvs.append(_kv_u32("general.quantization_version", QUANTIZATION_VERSION))
    kvs.append(_kv_u32("general.file_type", int(preset.ftype)))
    if im is not None:
        kvs.append(_kv_str("quantize.imatrix.file", _truncated(opts.imatrix_label or str(im.path))))
        if im.datasets:
            kvs.append(_kv_str("quantize.imatrix.dataset", _truncated(im.datasets[0])))
        kvs.append(_kv_u32("quantize.imatrix.entries_count", len(im.entries)))
        if im.chunk_count > 0:
            kvs.append(_kv_u32("quantize.imatrix.chunks_count", im.chunk_count))
    header = GGUFHeader(alignment)
    for kv in kvs:
        header.add_raw(kv)
    return header


class _Buffers:
    """Work buffers reused across chunks and tensors (fresh 64 MiB arrays would cost a page fault per 4 KiB)."""

    def __init__(self) -> None:
        self.f32 = np.empty(0, np.float32)
        self.raw = np.empty(0, np.uint8)
        self.out = np.empty(0, np.uint8)

    @staticmethod
    def grow(a: np.ndarray, n: int) -> np.ndarray:
        return a if a.size >= n else np.empty(max(n, a.size * 5 // 4), a.dtype)


def _float_rows(f: GGUFFile, t: TensorInfo, row0: int, n_rows: int, threads: int, buf: _Buffers) -> np.ndarray:
    """Rows [row0, row0 + n_rows) of a tensor as float32. F32 rows are copied out of the mapping under the fault
    guard; F16, BF16 and the block types go through the native dequantizers (guarded, and ggml's values)."""
    from ..native import kernels as K

    src = ggml_type(t.type_name)
    rb = src.row_bytes(t.ne[0])
    view = f.tensor_bytes(t)[row0 * rb:(row0 + n_rows) * rb]
    n = n_rows * t.ne[0]
    buf.f32 = buf.grow(buf.f32, n)
    dst = buf.f32[:n]
    if src.name == "F32":
        K.copy_mapped(view.view(np.float32), f"tensor {t.name}", out=dst)
        return dst.reshape(n_rows, t.ne[0])
    return K.dequantize(view.reshape(n_rows, rb), src, threads=threads, out=dst).reshape(n_rows, t.ne[0])


def _encode(target: str, rows: np.ndarray, weights: np.ndarray | None, threads: int, buf: _Buffers) -> np.ndarray:
    from ..native import kernels as K

    if target == "F32":
        return rows.reshape(-1).view(np.uint8)
    if target in ("F16", "BF16"):
        return K.quantize_activation(rows.reshape(-1), target)
    t = ggml_type(target)
    need = rows.shape[0] * t.row_bytes(rows.shape[1])
    buf.out = buf.grow(buf.out, need)
    return K.quantize_rows(t, rows, weights, threads=threads, out=buf.out[:need])


def write_quantized(f: GGUFFile, plan: QuantizePlan, out: str | os.PathLike[str], opts: QuantizeOptions,
                    progress: Callable[[QuantizeProgress], None] | None = None,
                    cancel: Cancel | None = None) -> Path:
    """Write the planned file to ``out`` atomically (a temporary renamed into place); returns the path."""
    report = progress or (lambda _p: None)
    total = plan.out_bytes
    done = 0
    n_jobs = len(plan.jobs)
    buf = _Buffers()
    inputs = [*f.paths, *([opts.imatrix.path] if opts.imatrix is not None else [])]  # every shard, the imatrix
    with OutputSet([("output", out)], inputs=inputs) as outs:
        outs.open("output")
        outs.write_bytes("output", plan.header)
        data = DataSection(lambda b: outs.write_bytes("output", b), plan.alignment, (j.out_bytes for j in plan.jobs))
        for i, job in enumerate(plan.jobs):
            t = job.info
            report(QuantizeProgress(done, total, t.name, i, len(plan.jobs)))
            if not job.converts:
                _copy(f, t, data, cancel)
            else:
                weights = opts.imatrix.weights(t.name) if job.has_imatrix and opts.imatrix is not None else None
                _convert(f, t, job, weights, data, opts.threads, cancel,
                         lambda n, name=t.name, k=i, d=done: report(QuantizeProgress(d + n, total, name, k, n_jobs)),
                         buf)
            data.end_tensor()
            f.release_pages(t.data_offset, t.n_bytes or 0, shard=t.shard)  # resident memory: about one tensor
            done += job.out_bytes
        data.finish()
        report(QuantizeProgress(done, total, "", len(plan.jobs), len(plan.jobs)))
        outs.commit()
        return outs.target("output")


def _cancelled(cancel: Cancel | None) -> None:
    if cancel is not None and cancel.cancelled:
        raise QuantizeCancelled("quantization was cancelled; nothing was written")


def _copy(f: GGUFFile, t: TensorInfo, data: DataSection, cancel: Cancel | None) -> None:
    from ..native import kernels as K

    n = t.n_bytes or 0
    step = 64 << 20
    for a in range(0, n, step):
        _cancelled(cancel)
        b = min(n, a + step)
        data.write(K.copy_mapped(f.tensor_bytes(t)[a:b], f"tensor {t.name}").data)


def _convert(f: GGUFFile, t: TensorInfo, job: TensorJob, weights: np.ndarray | None, data: DataSection, threads: int,
             cancel: Cancel | None, step: Callable[[int], None], buf: _Buffers) -> None:
    from ..native import kernels as K

    ncols = t.ne[0]
    n_rows = t.n_elements // ncols if ncols else 0
    per_mat = t.ne[1] if len(t.ne) > 1 else 1  # rows per expert: the imatrix changes at these boundaries
    chunk = max(1, CHUNK_VALUES // max(ncols, 1))
    target = job.choice.target
    written = 0
    row = 0
    while row < n_rows:
        _cancelled(cancel)
        mat = row // per_mat
        end = min(n_rows, row + chunk, (mat + 1) * per_mat)
        rows = _float_rows(f, t, row, end - row, threads, buf)
        w = weights[mat * ncols:(mat + 1) * ncols] if weights is not None else None
        try:
            enc = _encode(target, rows, w, threads, buf)
        except K.NonFiniteRows as exc:
            raise QuantizeError(f"{t.name} has a value that is not a finite number in row {row + exc.row}; "
                                "quantized blocks cannot hold it (llama-quantize rejects the result too)") from None
        _check_encoded(t.name, target, enc, row)
        if written + enc.nbytes > job.out_bytes:
            raise QuantizeError(f"{t.name}: wrote {written + enc.nbytes} bytes, expected {job.out_bytes}")
        data.write(enc.data)
        written += enc.nbytes
        step(written)
        row = end
    if written != job.out_bytes:
        raise QuantizeError(f"{t.name}: wrote {written} bytes, expected {job.out_bytes}")


def _check_encoded(tensor: str, target: str, data: np.ndarray, row0: int) -> None:
    """Refuse encoded rows that decode to NaN or infinity, as llama-quantize validates its output: a block type's
    fp16 scales (an importance weighting or values that overflow them), or F16/BF16 values beyond their range.
    Bit tests on the bytes (exponent all ones); F32 rows were checked finite before encoding."""
    from .scales import scale_fields

    if target == "F32":
        return
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    if target in ("F16", "BF16"):
        mask = np.uint16(ggml_type(target).inf_nan_bits)
        vals = raw.view("<u2")
        bad = np.flatnonzero((vals & mask) == mask)
        if bad.size:
            raise QuantizeError(f"{tensor}: value {int(bad[0])} of rows {row0}… does not fit {target} (it becomes "
                                "infinite); llama-quantize rejects such a file too")
        return
    t = ggml_type(target)
    fields = scale_fields(target)
    if not fields or not t.block_bytes:
        return
    blocks = raw.reshape(-1, t.block_bytes)
    for name, off in fields:
        vals = np.ascontiguousarray(blocks[:, off:off + 2]).view("<u2").reshape(-1)
        bad = np.flatnonzero((vals & np.uint16(0x7C00)) == np.uint16(0x7C00))
        if bad.size:
            raise QuantizeError(f"{tensor}: block {int(bad[0])} (from row {row0}) quantized to a {name} scale that "
                                "is not a finite number (NaN or infinity): the importance matrix or the values "
                                "overflow the format; nothing was written (llama-quantize rejects it too)")


def quantize_file(src: str | os.PathLike[str], dst: str | os.PathLike[str], opts: QuantizeOptions,
                  progress: Callable[[QuantizeProgress], None] | None = None,
                  cancel: Cancel | None = None) -> QuantizePlan:
    """Plan and write in one call; returns the plan (sizes, types, warnings)."""
    with GGUFFile(src) as f:
        plan = plan_quantize(f, opts)
        write_quantized(f, plan, dst, opts, progress, cancel)
        return plan
