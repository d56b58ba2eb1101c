"""Optional CUDA backend: the whole forward pass on an NVIDIA GPU, behind the CPU :class:`Session` API.

The library (``build/cuda/libquantscope_cuda.so``, built by ``csrc/cuda/build.sh`` when ``nvcc`` exists; inside a
PyInstaller app, the bundled copy: :func:`library_path`) is loaded with cffi's ``dlopen``; it is never needed:
:func:`cuda_status` says whether it can run and, if not, why (no library, no driver, no device, ...), and callers
fall back to the CPU. Weights are uploaded once, repacked but still quantized; types without GPU kernels are
dequantized to F32 on upload. Every size is validated here before a pointer reaches C.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Any

import cffi
import numpy as np

from ..base.ggml_types import GGMLType, ggml_type
from ..model import ARCHITECTURES, ModelConfig, UnsupportedModel, Weight
from ..native import ffi as cpu_ffi
from ..native import kernels as K
from ..native import nn
from .cuda_abi import CDEF
from .session import (
    ContextFull,
    ForwardTrace,
    Model,
    _Bound,
    _layer_matrices,
    check_activation_stats,
    head_scales,
    layer_description,
    layer_policy,
    ple_inputs,
)

__all__ = [
    "CudaError",
    "CudaSession",
    "CudaUnavailable",
    "cuda_status",
    "describe_cuda_error",
    "device_properties",
    "gpu_types",
    "library_path",
    "probe",
]

LIB_ENV = "QUANTSCOPE_CUDA_LIB"
#: the library's file name per OS (Windows: a DLL, as packaging/quantscope.spec bundles it; no CUDA on macOS)
LIB_NAME = "quantscope_cuda.dll" if sys.platform == "win32" else "libquantscope_cuda.so"
DEFAULT_LIB = Path(__file__).resolve().parents[2] / "build" / "cuda" / LIB_NAME

#: The largest head size the GPU attention takes (the CPU block's limit too).
MAX_HEAD = 1024
#: Activation types the device quantizers produce (ggml ids) and their (block elements, block bytes).
ACT_LAYOUT = {8: (32, 34), 9: (32, 36), 15: (256, 292)}


ffi = cffi.FFI()
ffi.cdef(CDEF)

_ERR_LEN = 512
_ERROR_HINTS = {
    35: "no CUDA driver (cudaErrorInsufficientDriver = 35): no NVIDIA driver is installed, or it is older than "
        "the CUDA 13 runtime the backend was built with",
    100: "no CUDA device (cudaErrorNoDevice = 100): the driver sees no NVIDIA GPU",
    209: "no kernel image for this GPU (cudaErrorNoKernelImageForDevice = 209): rebuild the backend with its "
         "architecture in QSC_ARCHS (csrc/cuda/build.sh)",
    222: "the driver is too old for the backend's PTX (cudaErrorUnsupportedPtxVersion = 222): update the driver",
}


class CudaError(RuntimeError):
    """A CUDA backend call failed (message from the library, CUDA error name and code included)."""


class CudaUnavailable(CudaError):
    """The CUDA backend cannot run here; the message says why."""


def describe_cuda_error(code: int, detail: str = "") -> str:
    """Human reason for a ``cudaError_t`` from the probe (35: no driver, 100: no device, ...)."""
    hint = _ERROR_HINTS.get(code, f"CUDA error {code}")
    return f"{hint} [{detail}]" if detail and code not in _ERROR_HINTS else hint


def library_path() -> Path:
    """Where the library is looked for: ``$QUANTSCOPE_CUDA_LIB``; in a frozen (PyInstaller) app the bundle's
    folder (``sys._MEIPASS``, where packaging/quantscope.spec puts it), then the executable's folder; otherwise
    ``build/cuda/libquantscope_cuda.so`` of the source tree. When none exists, the first place is named."""
    env = os.environ.get(LIB_ENV)
    if env:
        return Path(env)
    if not getattr(sys, "frozen", False):
        return DEFAULT_LIB
    bundle = getattr(sys, "_MEIPASS", None)
    places = [Path(bundle) / LIB_NAME] if bundle else []
    places.append(Path(sys.executable).resolve().parent / LIB_NAME)
    return next((p for p in places if p.is_file()), places[0])


@functools.cache
def _load(path: str) -> tuple[Any, str]:
    """``(lib, "")`` or ``(None, reason)``; loading is attempted once per path."""
    if not Path(path).is_file():
        return None, (f"the CUDA backend is not built ({path} not found; build it with csrc/cuda/build.sh, "
                      "which needs nvcc)")
    try:
        return ffi.dlopen(path), ""
    except OSError as exc:
        return None, f"the CUDA backend library could not be loaded: {exc}"


def _library(path: Path | None = None) -> Any:
    lib, why = _load(str(path or library_path()))
    if lib is None:
        raise CudaUnavailable(why)
    return lib


def _err() -> Any:
    return ffi.new(f"char[{_ERR_LEN}]")


def _msg(err: Any) -> str:
    return ffi.string(err).decode("utf-8", "replace")


def probe(path: Path | None = None) -> tuple[bool, str]:
    """Load the library at ``path`` and ask the CUDA runtime for a usable device: ``(available, reason)``.

    ``reason`` names the device when available, else why not. Never raises."""
    try:
        lib, why = _load(str(path or library_path()))
        if lib is None:
            return False, why
        err = _err()
        rc = int(lib.qsc_init(err, _ERR_LEN))
        if rc != 0:
            return False, describe_cuda_error(rc, _msg(err))
        buf = ffi.new("char[512]")
        lib.qsc_device_info(buf, 512)
        return True, _msg(buf)
    except Exception as exc:  # any failure means "no CUDA", with the reason shown
        return False, f"CUDA check failed: {type(exc).__name__}: {exc}"


@functools.cache
def cuda_status() -> tuple[bool, str]:
    """``(available, reason)`` for the default library, probed once per process."""
    return probe()


def device_properties() -> dict[str, Any]:
    """Name, compute capability, SMs, memory and peak DRAM bandwidth (GB/s) of the current device."""
    ok, why = cuda_status()
    if not ok:
        raise CudaUnavailable(why)
    p = ffi.new("qsc_device_props *")
    err = _err()
    if _library().qsc_device_props_get(p, err, _ERR_LEN) != 0:
        raise CudaError(_msg(err))
    return {"name": ffi.string(p.name).decode(), "compute": f"{p.major}.{p.minor}", "sm_count": p.sm_count,
            "total_mem": int(p.total_mem), "free_mem": int(p.free_mem), "peak_bw_gbs": float(p.peak_bw_gbs),
            "driver_version": p.driver_version, "runtime_version": p.runtime_version}


@functools.cache
def _types_of(path: str) -> frozenset[int]:
    lib, _ = _load(path)
    return frozenset(t for t in range(256) if lib.qsc_type_supported(t)) if lib is not None else frozenset()


def gpu_types() -> frozenset[int]:
    """The ggml ids of the weight types the GPU kernels run on as stored, as the library says
    (``qsc_type_supported``, read from its one type table, csrc/cuda/qsc_common.cuh's ``QSC_TYPES``); other types
    are dequantized to F32 on upload. Empty when the library cannot be loaded (no GPU type without a GPU)."""
    return _types_of(str(library_path()))


def build_info() -> str:
    """CUDA version and GPU architectures compiled into the library."""
    return ffi.string(_library().qsc_build_info()).decode()


# ---------------------------------------------------------------------------------------------------- validation
def _type(qtype: GGMLType | int | str) -> GGMLType:
    return qtype if isinstance(qtype, GGMLType) else ggml_type(qtype)


def _gpu_type(qtype: GGMLType | int | str) -> GGMLType:
    t = _type(qtype)
    types = gpu_types()
    if t.id not in types:
        names = ", ".join(ggml_type(i).name for i in sorted(types)) or "none: the library is not loaded"
        raise ValueError(f"{t.name} has no GPU kernel (GPU types: {names})")
    return t


def _matrix(w: np.ndarray, t: GGMLType, rows: int, k: int, padded: bool = False) -> np.ndarray:
    """Raw bytes of a ``rows`` x ``k`` matrix of type ``t``, checked (the GPU also needs k % 32 == 0, unless
    ``padded``: F32/F16 rows the library pads to 32 itself, gemma4's per-layer embedding projection)."""
    a = np.ascontiguousarray(w)
    if a.dtype != np.uint8:
        raise TypeError(f"weights must be raw uint8 bytes, got {a.dtype}")
    unit = 1 if padded and t.name in ("F32", "F16") else max(t.block_elems, 32)
    if rows <= 0 or k <= 0 or k % unit:
        raise ValueError(f"a {t.name} matrix needs rows > 0 and k a positive multiple of {unit}, got {rows} x {k}")
    if a.size != rows * t.row_bytes(k):
        raise ValueError(f"{rows} rows of {k} {t.name} elements are {rows * t.row_bytes(k)} bytes, got {a.size}")
    return a


def _floats(x: np.ndarray, what: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype != np.float32:
        raise TypeError(f"{what} must be float32, got {a.dtype}")
    if shape is not None and a.shape != shape:
        raise ValueError(f"{what} must have shape {shape}, got {a.shape}")
    return np.ascontiguousarray(a)


def _i32(x: np.ndarray | list[int], what: str, n: int) -> np.ndarray:
    a = np.ascontiguousarray(np.asarray(x, dtype=np.int64).reshape(-1))
    if a.size != n:
        raise ValueError(f"{what} must have {n} entries, got {a.size}")
    if a.size and (a.min() < -(2**31) or a.max() >= 2**31):
        raise ValueError(f"{what} must fit in int32")
    return a.astype(np.int32)


def _p(a: np.ndarray, ctype: str) -> Any:
    return ffi.cast(ctype, ffi.from_buffer(a, require_writable=False))


def _check(rc: int, err: Any, what: str) -> None:
    if rc != 0:
        raise CudaError(f"{what}: {_msg(err)} ({rc})")


def check_config(cfg: ModelConfig) -> None:
    """Refuse, with the reason, a model whose features or shapes the GPU kernels do not handle."""
    if cfg.arch not in ARCHITECTURES:
        raise UnsupportedModel(f"architecture {cfg.arch!r} is not supported by the engine")
    sizes = (cfg.n_layers, cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.n_ff, cfg.n_vocab)
    if min(sizes) <= 0:
        raise UnsupportedModel(f"non-positive model size in {sizes}")
    if cfg.n_embd % 32:
        raise UnsupportedModel(f"n_embd {cfg.n_embd} must be a multiple of 32 on the GPU")
    for li in range(cfg.n_layers):  # every layer its own heads, head size, FFN width and rotated size
        kv, hd, ff, rd = cfg.n_head_kv_at(li), cfg.head_dim_at(li), cfg.n_ff_at(li), cfg.rope_dim_at(li)
        where = f"layer {li}: " if cfg.n_layers > 1 else ""
        if kv <= 0 or cfg.n_head % kv:
            raise UnsupportedModel(f"{where}n_head {cfg.n_head} is not a multiple of n_head_kv {kv}")
        if not 0 < hd <= MAX_HEAD or cfg.n_head * hd % 32:
            raise UnsupportedModel(f"{where}head size {hd} has no CUDA path (at most {MAX_HEAD}, n_head x head size "
                                   "a multiple of 32)")
        if cfg.uses_rope(li) and (rd <= 0 or rd % 2 or rd > hd):
            raise UnsupportedModel(f"{where}rope_dim {rd} invalid for head_dim {hd}")
        if ff <= 0 or ff % 32:
            raise UnsupportedModel(f"{where}n_ff {ff} must be a positive multiple of 32 on the GPU")
    if max(sizes) >= 2**31:
        raise UnsupportedModel("model size does not fit in int32")


class Description:
    """A model's forward description in the CUDA library's types: ``model`` (``qsc_model_desc *``) and
    ``layers`` (``qs_block[]``, the CPU block's own descriptions, :func:`~.session.layer_description`, copied),
    with the host arrays their pointers reach kept alive (``keep``) and ``matrices``, every matrix's (type, rows,
    k) as it is uploaded. Built by :func:`model_description`."""

    def __init__(self, model: Any, layers: Any, n_layers: int, keep: list[Any],
                 matrices: list[tuple[GGMLType, int, int]]) -> None:
        self.model, self.layers, self.n_layers, self.keep, self.matrices = model, layers, n_layers, keep, matrices


def _bound(w: Weight, keep: list[Any], matrices: list[tuple[GGMLType, int, int]], padded: bool = False) -> _Bound:
    t, data = device_weight(w)
    raw = _matrix(data, t, w.rows, w.k, padded)
    keep.append(raw)
    matrices.append((t, w.rows, -(-w.k // 32) * 32 if padded else w.k))
    return _Bound(t.id, cpu_ffi.cast("uint8_t *", cpu_ffi.from_buffer(raw)), w.rows, w.k, int(raw.nbytes))


def model_description(model: Model, n_ctx: int, n_layers: int | None = None) -> tuple[Description, list[Any]]:
    """``model``'s forward description for the GPU, its weights as they are uploaded (:func:`device_weight`: types
    without GPU kernels dequantized to F32), and its layers' ``qs_block`` s as the CPU describes them. The library
    names what it refuses (:func:`check_description`); Python keeps no list of the device's features.
    ``n_layers``: only the first layers (partial offload, core/engine/split.py), head tied (its logits unused)."""
    c, mw = model.config, model.weights
    n = c.n_layers if n_layers is None else n_layers
    keep: list[Any] = []
    matrices: list[tuple[GGMLType, int, int]] = []
    rope_factors = mw.rope_factors(n_ctx)
    cpu_blocks = []
    for li, lw in enumerate(mw.layers[:n]):
        lb = {key: _bound(w, keep, matrices, padded=key == "ple_proj") for key, w in _layer_matrices(lw)}
        if lw.wv is lw.wk and "wk" in lb:
            lb["wv"] = lb["wk"]
        cpu_blocks.append(layer_description(c, li, lw, lb, rope_factors))
    size = ffi.sizeof("qs_block")
    if size != cpu_ffi.sizeof("qs_block"):
        raise CudaError(f"qs_block is {size} bytes here and {cpu_ffi.sizeof('qs_block')} in the CPU library")
    layers = ffi.new("qs_block[]", max(1, len(cpu_blocks)))
    for i, b in enumerate(cpu_blocks):
        ffi.memmove(layers + i, cpu_ffi.buffer(b), size)
    md = ffi.new("qsc_model_desc *")
    md.n_layers, md.n_vocab, md.eps, md.embed_scale = n, c.n_vocab, c.rms_eps, c.embed_scale
    md.final_softcap, md.logit_scale = c.final_softcap, c.logit_scale
    tied = mw.tied or n_layers is not None
    for field, w in (("tok_embd", mw.tok_embd), ("output", None if tied else mw.output)):
        if w is not None:
            bw = _bound(w, keep, matrices)
            d = getattr(md, field)
            d.ptr, d.type, d.bytes, d.rows, d.k = ffi.cast("uint8_t *", cpu_ffi.cast("uintptr_t", bw.ptr)), \
                bw.type_id, bw.nbytes, bw.rows, bw.k
    if tied:
        matrices.append(matrices[-1])  # the head reads the embedding's copy
    norm = _floats(mw.output_norm, "output_norm").reshape(-1)
    keep.append(norm)
    md.output_norm.ptr, md.output_norm.len = _p(norm, "float *"), norm.size
    kv_source = np.array([c.kv_source(li) for li in range(n)], np.int32)
    keep.append(kv_source)
    md.kv_source = _p(kv_source, "int32_t *")
    keep += cpu_blocks
    return Description(md, layers, len(cpu_blocks), keep, matrices), cpu_blocks


def check_description(desc: Description) -> None:
    """The C side's whole check of a description (host only, no device call): :class:`CudaError` with its
    reason (a feature the device lacks, a missing group, a size, type or byte count that does not add up)."""
    err = _err()
    if _library().qsc_check_model(desc.model, desc.layers, err, _ERR_LEN) != 0:
        raise CudaError(f"qsc_check_model: {_msg(err)}")


# ------------------------------------------------------------------------------------ host emulation (no GPU)
def packed_bytes(qtype: GGMLType | int | str, rows: int, k: int) -> int:
    """Device bytes of a ``rows`` x ``k`` matrix after repacking (for F32/F16/quantized GPU types)."""
    t = _gpu_type(qtype)
    n = int(_library().qsc_packed_bytes(t.id, rows, k))
    if n < 0:
        raise ValueError(f"{rows} x {k} {t.name} cannot be packed")
    return n


def host_dequantize(qtype: GGMLType | int | str, w: np.ndarray, rows: int, k: int) -> np.ndarray:
    """Repack + the device's element decode, run on the CPU: float32 ``(rows, k)``."""
    t = _gpu_type(qtype)
    a = _matrix(w, t, rows, k)
    out = np.empty((rows, k), np.float32)
    if _library().qsc_host_dequantize(t.id, _p(a, "uint8_t *"), rows, k, _p(out, "float *")) != 0:
        raise CudaError("qsc_host_dequantize failed")
    return out


def host_quantize(x: np.ndarray, act: GGMLType | int | str) -> np.ndarray:
    """The device's activation quantizer math on the CPU, in the CPU's byte layout (Q8_0, Q8_1 or Q8_K)."""
    t = _type(act)
    if t.id not in ACT_LAYOUT:
        raise ValueError(f"{t.name} is not a GPU activation type (Q8_0, Q8_1, Q8_K)")
    v = _floats(x, "x").reshape(-1)
    blk, nbytes = ACT_LAYOUT[t.id]
    if v.size == 0 or v.size % blk:
        raise ValueError(f"{t.name} needs a positive multiple of {blk} values, got {v.size}")
    out = np.empty(v.size // blk * nbytes, np.uint8)
    if _library().qsc_host_quantize(t.id, _p(v, "float *"), v.size, _p(out, "uint8_t *")) != 0:
        raise CudaError("qsc_host_quantize failed")
    return out


def host_matmat(qtype: GGMLType | int | str, w: np.ndarray, rows: int, k: int, x: np.ndarray) -> np.ndarray:
    """``X @ W.T`` through the device's repack, activation quantizers and int8 unit dots, run on the CPU."""
    t = _gpu_type(qtype)
    a = _matrix(w, t, rows, k)
    xa = _floats(x, "x")
    if xa.ndim != 2 or xa.shape[1] != k or xa.shape[0] == 0:
        raise ValueError(f"x must have shape (n > 0, {k}), got {xa.shape}")
    y = np.empty((xa.shape[0], rows), np.float32)
    rc = _library().qsc_host_matmat(t.id, _p(a, "uint8_t *"), rows, k, _p(xa, "float *"), xa.shape[0],
                                    _p(y, "float *"))
    if rc != 0:
        raise CudaError("qsc_host_matmat failed")
    return y


# ------------------------------------------------------------------------------------ single GPU kernels (tests)
def _gpu() -> Any:
    ok, why = cuda_status()
    if not ok:
        raise CudaUnavailable(why)
    return _library()


def gpu_matmat(qtype: GGMLType | int | str, w: np.ndarray, rows: int, k: int, x: np.ndarray) -> np.ndarray:
    """``X @ W.T`` with the device's quantize + matmul kernels (n_x = 1: the decode kernel, else prefill)."""
    t = _gpu_type(qtype)
    a = _matrix(w, t, rows, k)
    xa = _floats(x, "x")
    if xa.ndim != 2 or xa.shape[1] != k or not 0 < xa.shape[0] <= 8 * 65535:
        raise ValueError(f"x must have shape (n, {k}) with 0 < n <= 524280, got {xa.shape}")
    y = np.empty((xa.shape[0], rows), np.float32)
    err = _err()
    _check(_gpu().qsc_kernel_matmat(t.id, _p(a, "uint8_t *"), rows, k, _p(xa, "float *"), xa.shape[0],
                                    _p(y, "float *"), err, _ERR_LEN), err, "matmat")
    return y


def gpu_quantize(x: np.ndarray, act: GGMLType | int | str) -> np.ndarray:
    """The device's activation quantizer, returned in the CPU's byte layout."""
    t = _type(act)
    if t.id not in ACT_LAYOUT:
        raise ValueError(f"{t.name} is not a GPU activation type (Q8_0, Q8_1, Q8_K)")
    v = _floats(x, "x").reshape(-1)
    blk, nbytes = ACT_LAYOUT[t.id]
    if v.size == 0 or v.size % blk:
        raise ValueError(f"{t.name} needs a positive multiple of {blk} values, got {v.size}")
    out = np.empty(v.size // blk * nbytes, np.uint8)
    err = _err()
    _check(_gpu().qsc_kernel_quantize(t.id, _p(v, "float *"), v.size, _p(out, "uint8_t *"), err, _ERR_LEN), err,
           "quantize")
    return out


def gpu_get_rows(qtype: GGMLType | int | str, w: np.ndarray, rows: int, k: int, ids: np.ndarray,
                 scale: float = 1.0) -> np.ndarray:
    """Embedding lookup on the device: rows ``ids`` dequantized, times ``scale``."""
    t = _gpu_type(qtype)
    a = _matrix(w, t, rows, k)
    idx = np.asarray(ids, dtype=np.int64).reshape(-1)
    if idx.size == 0 or idx.min() < 0 or idx.max() >= rows:
        raise IndexError(f"row ids must be non-empty and lie in 0..{rows - 1}")
    i32 = idx.astype(np.int32)
    out = np.empty((idx.size, k), np.float32)
    err = _err()
    _check(_gpu().qsc_kernel_get_rows(t.id, _p(a, "uint8_t *"), rows, k, _p(i32, "int32_t *"), idx.size, scale,
                                      _p(out, "float *"), err, _ERR_LEN), err, "get_rows")
    return out


def gpu_rmsnorm(x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
    """Row-wise RMSNorm over the last dimension on the device."""
    xa = _floats(x, "x")
    n = xa.shape[-1]
    w = None if weight is None else _floats(weight, "weight", (n,))
    y = np.empty_like(xa)
    err = _err()
    _check(_gpu().qsc_kernel_rmsnorm(_p(xa, "float *"), ffi.NULL if w is None else _p(w, "float *"),
                                     _p(y, "float *"), xa.size // n, n, eps, err, _ERR_LEN), err, "rmsnorm")
    return y


def gpu_rope(x: np.ndarray, positions: np.ndarray, *, rot_dim: int | None = None, freq_base: float = 10000.0,
             neox: bool = False) -> np.ndarray:
    """RoPE on ``(n_tokens, n_heads, head_dim)`` float32 on the device; returns a new array."""
    xa = _floats(x, "x").copy()
    if xa.ndim != 3:
        raise ValueError("x must be (n_tokens, n_heads, head_dim)")
    n_tok, n_heads, hd = xa.shape
    rd = hd if rot_dim is None else rot_dim
    if rd <= 0 or rd % 2 or rd > hd:
        raise ValueError(f"rot_dim {rd} must be even and at most head_dim {hd}")
    pos = _i32(positions, "positions", n_tok)
    err = _err()
    _check(_gpu().qsc_kernel_rope(_p(xa, "float *"), n_tok, n_heads, hd, rd, _p(pos, "int32_t *"), freq_base,
                                  int(neox), err, _ERR_LEN), err, "rope")
    return xa


#: The gated units of the FFN by name: the ``mode`` of qsc_kernel_glu / qsc_host_glu.
GLU_MODES = {"swiglu": 0, "gelu": 1, "swiglu_oai": 2}


def _glu_args(gate: np.ndarray, up: np.ndarray, mode: str | bool) -> tuple[np.ndarray, np.ndarray, int]:
    g = _floats(gate, "gate")
    u = _floats(up, "up", g.shape)
    name = ("gelu" if mode else "swiglu") if isinstance(mode, bool) else mode
    if name not in GLU_MODES or g.size == 0:
        raise ValueError(f"gated unit {mode!r} on {g.size} values: one of {', '.join(GLU_MODES)} on at least one")
    return g, u, GLU_MODES[name]


def gpu_glu(gate: np.ndarray, up: np.ndarray, gelu: bool | str) -> np.ndarray:
    """The gated unit on the device: SiLU (False / "swiglu"), GELU-tanh (True / "gelu") or gpt-oss's clamped
    SwiGLU ("swiglu_oai")."""
    g, u, mode = _glu_args(gate, up, gelu)
    n = g.shape[-1]
    out = np.empty_like(g)
    err = _err()
    _check(_gpu().qsc_kernel_glu(_p(g, "float *"), _p(u, "float *"), _p(out, "float *"), g.size // n, n, mode, err,
                                 _ERR_LEN), err, "glu")
    return out


def _attention_args(q: np.ndarray, q_pos: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, n_kv: int,
                    window: int, softcap: float, sinks: np.ndarray | None) -> tuple[Any, ...]:
    qa = _floats(q, "q")
    if qa.ndim != 3:
        raise ValueError("q must be (n_q, n_heads, head_dim)")
    n_q, n_heads, hd = qa.shape
    if k_cache.dtype not in (np.float32, np.float16) or v_cache.dtype != k_cache.dtype:
        raise TypeError("k_cache and v_cache must both be float32 or both float16")
    if k_cache.ndim != 3 or k_cache.shape != v_cache.shape or k_cache.shape[2] != hd:
        raise ValueError(f"caches must be (n_ctx, n_kv_heads, {hd}) and equal")
    n_kv_heads = k_cache.shape[1]
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads {n_heads} is not a multiple of n_kv_heads {n_kv_heads}")
    if not 0 < hd <= MAX_HEAD:
        raise ValueError(f"head_dim {hd} must lie in 1..{MAX_HEAD}")
    if not 0 < n_kv <= k_cache.shape[0]:
        raise ValueError(f"n_kv {n_kv} outside 1..{k_cache.shape[0]}")
    if not 0 <= window < 2**31 or not (np.isfinite(softcap) and softcap >= 0):
        raise ValueError(f"window {window} / soft-cap {softcap} out of range")
    pos = _i32(q_pos, "q_pos", n_q)
    if pos.size and pos.min() < 0:
        raise ValueError("query positions must be >= 0")
    sk = None if sinks is None else _floats(sinks, "sinks", (n_heads,))
    if sk is not None and not np.isfinite(sk).all():
        raise ValueError("sinks must be finite")
    kc = np.ascontiguousarray(k_cache[:n_kv])
    vc = np.ascontiguousarray(v_cache[:n_kv])
    return qa, pos, kc, vc, sk, (n_q, n_heads, hd, n_kv_heads)


def gpu_attention(q: np.ndarray, q_pos: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, n_kv: int, *,
                  scale: float, window: int = 0, softcap: float = 0.0,
                  sinks: np.ndarray | None = None) -> np.ndarray:
    """Attention over a ``(n_ctx, n_kv_heads, head_dim)`` F32/F16 cache on the device (as core.native.nn's, with
    its soft-cap and sinks; any head size up to :data:`MAX_HEAD`)."""
    qa, pos, kc, vc, sk, (n_q, n_heads, hd, n_kv_heads) = _attention_args(q, q_pos, k_cache, v_cache, n_kv, window,
                                                                         softcap, sinks)
    out = np.empty_like(qa)
    err = _err()
    _check(_gpu().qsc_kernel_attention_ext(_p(qa, "float *"), n_q, _p(pos, "int32_t *"), n_heads, hd,
                                           _p(kc, "void *"), _p(vc, "void *"), int(kc.dtype == np.float16),
                                           n_kv_heads, n_kv, window, scale, softcap,
                                           ffi.NULL if sk is None else _p(sk, "float *"), _p(out, "float *"), err,
                                           _ERR_LEN), err, "attention")
    return out


def host_attention(q: np.ndarray, q_pos: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, n_kv: int, *,
                   scale: float, window: int = 0, softcap: float = 0.0,
                   sinks: np.ndarray | None = None) -> np.ndarray:
    """:func:`gpu_attention`'s arithmetic run on the CPU as the kernel runs it (8 online softmaxes over the keys
    round-robin, merged with the sink): the host emulation of k_attention."""
    qa, pos, kc, vc, sk, (n_q, n_heads, hd, n_kv_heads) = _attention_args(q, q_pos, k_cache, v_cache, n_kv, window,
                                                                         softcap, sinks)
    out = np.empty_like(qa)
    rc = _library().qsc_host_attention(_p(qa, "float *"), n_q, _p(pos, "int32_t *"), n_heads, hd, _p(kc, "void *"),
                                       _p(vc, "void *"), int(kc.dtype == np.float16), n_kv_heads, n_kv, window, scale,
                                       softcap, ffi.NULL if sk is None else _p(sk, "float *"), _p(out, "float *"))
    if rc != 0:
        raise CudaError("qsc_host_attention refused its arguments")
    return out


def rope_desc(rot_dim: int, *, base: float = 10000.0, neox: bool = False, freq_scale: float = 1.0,
              ext_factor: float = 0.0, corr: tuple[float, float] = (0.0, 0.0), mscale: float = 1.0,
              factors: np.ndarray | None = None, skip: bool = False) -> tuple[Any, list[Any]]:
    """A ``qs_rope_desc`` (the forward description's RoPE group) for the qk_post entry points, and the arrays its
    pointers reach (keep them alive while it is used)."""
    r = ffi.new("qs_rope_desc *")
    r.skip, r.dim, r.neox, r.base, r.freq_scale = int(skip), rot_dim, int(neox), base, freq_scale
    r.ext_factor, r.corr0, r.corr1, r.mscale = ext_factor, corr[0], corr[1], mscale
    keep: list[Any] = []
    if factors is not None:
        f = _floats(factors, "factors").reshape(-1)
        keep.append(f)
        r.freqs.ptr, r.freqs.len = _p(f, "float *"), f.size
    return r, keep


def _qk_post(host: bool, q: np.ndarray, k: np.ndarray | None, pos: np.ndarray, rope: Any, q_norm: np.ndarray | None,
             k_norm: np.ndarray | None, qk_full: bool, eps: float, temp_scale: float,
             temp_floor: int) -> tuple[np.ndarray, np.ndarray | None]:
    qa = _floats(q, "q").copy()
    if qa.ndim != 3:
        raise ValueError("q must be (n_tokens, n_head, head_dim)")
    T, H, hd = qa.shape
    ka = None if k is None else _floats(k, "k").copy()
    if ka is not None and (ka.ndim != 3 or ka.shape[0] != T or ka.shape[2] != hd):
        raise ValueError(f"k must be ({T}, n_head_kv, {hd})")
    KV = 0 if ka is None else ka.shape[1]
    if (q_norm is None) != (k_norm is None) or (q_norm is not None and ka is None):
        raise ValueError("q_norm and k_norm go together, with k")
    qn = None if q_norm is None else _floats(q_norm, "q_norm", ((H * hd) if qk_full else hd,))
    kn = None if k_norm is None else _floats(k_norm, "k_norm", ((KV * hd) if qk_full else hd,))
    p = _i32(pos, "pos", T)
    args = (_p(qa, "float *"), ffi.NULL if ka is None else _p(ka, "float *"), T, H, KV, hd,
            ffi.NULL if qn is None else _p(qn, "float *"), ffi.NULL if kn is None else _p(kn, "float *"), int(qk_full),
            eps, _p(p, "int32_t *"), rope, temp_scale, temp_floor)
    if host:
        if _library().qsc_host_qk_post(*args) != 0:
            raise CudaError("qsc_host_qk_post refused its arguments")
    else:
        err = _err()
        _check(_gpu().qsc_kernel_qk_post(*args, err, _ERR_LEN), err, "qk_post")
    return qa, ka


def host_qk_post(q: np.ndarray, k: np.ndarray | None, pos: np.ndarray, rope: Any, *, q_norm: np.ndarray | None = None,
                 k_norm: np.ndarray | None = None, qk_full: bool = False, eps: float = 1e-6, temp_scale: float = 0.0,
                 temp_floor: int = 1) -> tuple[np.ndarray, np.ndarray | None]:
    """What k_qk_post does to ``q`` (T, n_head, hd) and ``k`` (T, n_head_kv, hd) - q/k RMSNorms, RoPE as the
    ``qs_rope_desc`` ``rope`` says (:func:`rope_desc`), the query temperature - run on the CPU; new arrays."""
    return _qk_post(True, q, k, pos, rope, q_norm, k_norm, qk_full, eps, temp_scale, temp_floor)


def gpu_qk_post(q: np.ndarray, k: np.ndarray | None, pos: np.ndarray, rope: Any, *, q_norm: np.ndarray | None = None,
                k_norm: np.ndarray | None = None, qk_full: bool = False, eps: float = 1e-6, temp_scale: float = 0.0,
                temp_floor: int = 1) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`host_qk_post` on the device (the k_qk_post kernel itself)."""
    return _qk_post(False, q, k, pos, rope, q_norm, k_norm, qk_full, eps, temp_scale, temp_floor)


def host_glu(gate: np.ndarray, up: np.ndarray, mode: str) -> np.ndarray:
    """The device's gated unit (``mode`` of :data:`GLU_MODES`) run on the CPU."""
    g, u, m = _glu_args(gate, up, mode)
    out = np.empty_like(g)
    if _library().qsc_host_glu(_p(g, "float *"), _p(u, "float *"), _p(out, "float *"), g.size, m) != 0:
        raise CudaError("qsc_host_glu failed")
    return out


def _logits(host: bool, x: np.ndarray, logit_scale: float, softcap: float) -> np.ndarray:
    xa = _floats(x, "logits").copy()
    if xa.size == 0 or not (np.isfinite(softcap) and softcap >= 0) or not np.isfinite(logit_scale):
        raise ValueError(f"{xa.size} logits / soft-cap {softcap} / logit scale {logit_scale} out of range")
    if host:
        if _library().qsc_host_logits(_p(xa, "float *"), xa.size, logit_scale, softcap) != 0:
            raise CudaError("qsc_host_logits failed")
    else:
        err = _err()
        _check(_gpu().qsc_kernel_logits(_p(xa, "float *"), xa.size, logit_scale, softcap, err, _ERR_LEN), err,
               "logits")
    return xa


def host_logits(x: np.ndarray, logit_scale: float = 1.0, softcap: float = 0.0) -> np.ndarray:
    """The head's logit scale and final soft-cap as the device applies them, run on the CPU."""
    return _logits(True, x, logit_scale, softcap)


def gpu_logits(x: np.ndarray, logit_scale: float = 1.0, softcap: float = 0.0) -> np.ndarray:
    """:func:`host_logits` on the device."""
    return _logits(False, x, logit_scale, softcap)


def host_residual(x: np.ndarray, o: np.ndarray, post_w: np.ndarray | None, *, eps: float, rs: float = 1.0,
                  out_scale: float = 1.0) -> np.ndarray:
    """k_norm_quant's residual update run on the CPU: ``(x + rs * [RMSNorm](o) * post_w) * out_scale`` per row."""
    xa = _floats(x, "x").copy()
    if xa.ndim != 2 or xa.size == 0:
        raise ValueError("x must be (n_rows, n)")
    oa = _floats(o, "o", xa.shape)
    w = None if post_w is None else _floats(post_w, "post_w", (xa.shape[1],))
    if _library().qsc_host_residual(_p(xa, "float *"), _p(oa, "float *"), ffi.NULL if w is None else _p(w, "float *"),
                                    xa.shape[0], xa.shape[1], eps, rs, out_scale) != 0:
        raise CudaError("qsc_host_residual failed")
    return xa


# ---------------------------------------------------------------------------------------------------- sessions
def device_weight(w: Weight) -> tuple[GGMLType, np.ndarray]:
    """The type and raw bytes a weight is uploaded as: as stored for GPU types, else dequantized to F32."""
    t = w.type
    if t.id in gpu_types():
        return t, w.data
    if not K.can_dequantize(t):
        raise UnsupportedModel(f"{w.name} is {t.name}: neither a GPU kernel nor a dequantizer handles it")
    dense = K.dequantize(w.data.reshape(w.rows, -1), t).reshape(-1)
    return ggml_type("F32"), dense.view(np.uint8)


class CudaSession:
    """One conversation on the GPU, with the CPU :class:`~quantscope.core.engine.session.Session`'s API.

    The weights of ``model`` are uploaded when the session is created (one copy per session) and the KV cache
    lives on the device; :meth:`forward` returns the logits on the host. ``host_emulation``: the device's forward
    pass run on the CPU instead (every kernel replaced by its host twin, csrc/cuda/qsc_emul.cuh; no GPU needed,
    slow): what tests use to check the device code's whole forward on machines without a GPU.
    """

    def __init__(self, model: Model, n_ctx: int = 2048, kv_dtype: type = np.float16, max_batch: int = 512,
                 graphs: bool = True, host_emulation: bool = False) -> None:
        ok, why = (True, "") if host_emulation else cuda_status()
        if not ok:
            raise CudaUnavailable(why)
        if not 0 < n_ctx < 2**31 or not 0 < max_batch <= 4096:
            raise ValueError(f"n_ctx {n_ctx} / max_batch {max_batch} out of range")
        if kv_dtype not in (np.float16, np.float32):
            raise ValueError("kv_dtype must be numpy.float16 or numpy.float32")
        check_config(model.config)
        c = model.config
        desc, _ = model_description(model, n_ctx)
        check_description(desc)
        self.model = model
        self.config: ModelConfig = c
        self.n_ctx = n_ctx
        self.kv_dtype = kv_dtype
        self.n_past = 0
        self._checkpoint: int | None = None  # the position whose recurrent state the device saved
        self.weight_bytes_per_token = sum(packed_bytes(t, rows, k) for t, rows, k in desc.matrices)
        self._lib = _library()
        err = _err()
        create = self._lib.qsc_host_model_create if host_emulation else self._lib.qsc_model_create
        ptr = create(desc.model, desc.layers, n_ctx, int(kv_dtype == np.float16), max_batch, err, _ERR_LEN)
        if ptr == ffi.NULL:
            raise CudaError(f"{'qsc_host_model_create' if host_emulation else 'qsc_model_create'}: {_msg(err)}")
        self._m: Any = ptr
        self._stats: list[dict[str, np.ndarray]] | None = None
        try:
            self._lib.qsc_set_graphs(self._m, int(graphs))
        except BaseException:
            self.close()
            raise

    @property
    def kv_bytes(self) -> int:
        c = self.config
        per_pos = sum(c.n_head_kv_at(li) * c.head_dim_at(li) for li in range(c.n_layers) if c.kv_source(li) == li)
        return 2 * self.n_ctx * per_pos * np.dtype(self.kv_dtype).itemsize

    @property
    def device_bytes(self) -> int:
        """Device memory held: weights, KV cache and scratch."""
        return int(self._lib.qsc_model_device_bytes(self._m)) if self._m is not None else 0

    def set_graphs(self, enabled: bool) -> None:
        """Replay one-token steps from a CUDA graph (default) or launch every kernel each time."""
        self._lib.qsc_set_graphs(self._live(), int(enabled))

    def _live(self) -> Any:
        if self._m is None:
            raise CudaError("the session is closed")
        return self._m

    def reset(self) -> None:
        self.n_past = 0
        self._checkpoint = None

    def _state(self, op: int) -> None:
        err = _err()
        _check(self._lib.qsc_recurrent_state(self._live(), op, err, _ERR_LEN), err, "qsc_recurrent_state")

    def truncate(self, n: int) -> None:
        """Forget cached positions from ``n`` on (e.g. to rewind a turn). With delta-net layers, as the CPU
        session: ``n_past`` goes back to the checkpoint (:meth:`checkpoint`) if it is at or before ``n``, else to
        0 (the forward zeroes the state at position 0): read ``n_past`` after."""
        n = max(0, min(self.n_past, n))
        if not self.recurrent or n == self.n_past:
            self.n_past = n
            return
        ck = self._checkpoint
        if ck is not None and ck <= n:
            self._state(2)
            self.n_past = ck
        else:
            self.reset()

    def checkpoint(self) -> None:
        """Save the recurrent state at the current position (on the device), so that :meth:`truncate` can return
        to it; a no-op for attention-only models, whose cache rewinds to any position."""
        if self.recurrent:
            self._state(1)
            self._checkpoint = self.n_past

    @property
    def recurrent(self) -> bool:
        """Has the model gated delta-net layers, whose state cannot be rewound position by position?"""
        c = self.config
        return any(c.is_recurrent(li) for li in range(c.n_layers))

    def forward(self, tokens: list[int] | np.ndarray, all_logits: bool = False, logits: bool = True,
                trace: ForwardTrace | None = None) -> np.ndarray:
        """Run ``tokens`` at positions ``n_past…``; returns logits of the last token (or of every token).
        ``logits=False`` is accepted for the CPU session's interface; the head is computed anyway (cheap on a GPU).
        ``trace``: copy this call's residual stream and queries back from the device (:class:`ForwardTrace`, as
        the CPU's; ``after_layer`` is called for each layer once the device pass is done); off, nothing is
        copied."""
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        T = ids.size
        if T == 0:
            raise ValueError("forward needs at least one token")
        if self.n_past + T > self.n_ctx:
            raise ContextFull(f"context full: {self.n_past} + {T} tokens > {self.n_ctx}")
        V = self.config.n_vocab
        if ids.min() < 0 or ids.max() >= V:
            raise ValueError(f"token ids must lie in 0..{V - 1}")
        i32 = ids.astype(np.int32)
        out = np.empty((T, V) if all_logits else (V,), np.float32)
        c, m = self.config, self._live()
        err = _err()
        ple = None
        if self.config.ple_dim:  # gemma4: the per-layer inputs of these tokens, [T][n_layers][ple_dim]
            e = self.model.tok_embd
            x = K.get_rows(e.type, e.data, e.rows, e.k, ids, threads=self.model.threads)
            if self.config.embed_scale != 1.0:
                x *= np.float32(self.config.embed_scale)
            ple = np.ascontiguousarray(ple_inputs(self.model, ids, x).transpose(1, 0, 2))

        def run() -> None:
            if ple is not None:
                _check(self._lib.qsc_forward_ple(m, _p(i32, "int32_t *"), T, self.n_past, int(all_logits),
                                                 _p(out, "float *"), _p(ple, "float *"), ple.size, err, _ERR_LEN),
                       err, "forward")
            else:
                _check(self._lib.qsc_forward(m, _p(i32, "int32_t *"), T, self.n_past, int(all_logits),
                                             _p(out, "float *"), err, _ERR_LEN), err, "forward")

        if trace is None:
            run()
        else:
            resid = np.empty((c.n_layers + 1, T, c.n_embd), np.float32)
            queries = np.empty((c.n_layers, T, c.n_head, c.head_dim), np.float32)
            _check(self._lib.qsc_probe_trace(m, _p(resid, "float *"), _p(queries, "float *"), T, err, _ERR_LEN),
                   err, "probe trace")
            try:
                run()
            finally:
                self._lib.qsc_probe_trace(m, ffi.NULL, ffi.NULL, 0, ffi.NULL, 0)
            trace.resid, trace.positions = list(resid), np.arange(self.n_past, self.n_past + T, dtype=np.int32)
            trace.queries = {li: q for li, q in enumerate(queries) if not c.is_recurrent(li)}  # as the CPU's
            if trace.after_layer is not None:
                for li in range(c.n_layers):
                    trace.after_layer(li)
        if self._stats is not None and T > 1:
            self._add_stats()
        self.n_past += T
        return out

    # ---------------------------------------------------------------------------------------------- the probes
    def head(self, x: np.ndarray) -> np.ndarray:
        """Logits of residual-stream rows ``x`` (n, n_embd) on the device, by the forward pass's own final norm
        and output head (kernels and int8 activations: the last row of the stream a traced forward leaves gives
        that forward's logits); granite's scale and gemma2's soft-cap as the CPU's head applies them."""
        c = self.config
        xa = np.ascontiguousarray(x, dtype=np.float32)
        if xa.ndim != 2 or xa.shape[1] != c.n_embd or not 0 < xa.shape[0] < 2**31:
            raise ValueError(f"rows of {c.n_embd} values are needed, not {xa.shape}")
        out = np.empty((xa.shape[0], c.n_vocab), np.float32)
        err = _err()
        _check(self._lib.qsc_head(self._live(), _p(xa, "float *"), xa.shape[0], _p(out, "float *"), err, _ERR_LEN),
               err, "head")
        return head_scales(c, out)

    def cache_rows(self, layer: int, which: str = "k") -> np.ndarray:
        """Layer ``layer``'s cached K (``k``) or V (``v``) rows ``(n_past, n_head_kv, head_dim)`` copied back from
        the device, in the cache's type."""
        c = self.config
        if (isinstance(layer, bool) or not 0 <= layer < c.n_layers or which not in ("k", "v")
                or c.is_recurrent(layer)):  # a delta-net layer has a recurrent state instead
            raise ValueError(f"no {which!r} cache for layer {layer!r}")
        rows = np.empty((self.n_past, c.n_head_kv, c.head_dim), self.kv_dtype)
        err = _err()
        _check(self._lib.qsc_read_cache(self._live(), layer, int(which == "v"), self.n_past,
                                        ffi.cast("void *", ffi.from_buffer(rows)), rows.nbytes, err, _ERR_LEN),
               err, "read cache")
        return rows

    def attention_weights(self, layer: int, queries: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Layer ``layer``'s attention weights ``(T, n_head, n_past)`` for ``queries`` (a :class:`ForwardTrace`'s)
        at ``positions``: the layer's cached keys are copied back from the device and the CPU's native attention
        code computes the weights against them (as :meth:`Session.attention_weights`)."""
        c = self.config
        if isinstance(layer, bool) or not 0 <= layer < c.n_layers or c.is_recurrent(layer):
            raise ValueError(f"layer {layer} has no attention weights")
        keys = self.cache_rows(layer, "k")
        return nn.attention_probs(queries, positions, keys, self.n_past, scale=float(layer_policy(c, layer).attn.scale),
                                  window=c.layer_window(layer), softcap=c.attn_softcap,
                                  sinks=self.model.weights.layers[layer].sinks, threads=self.model.threads)

    def set_activation_stats(self, stats: list[dict[str, np.ndarray]] | None) -> None:
        """As :meth:`Session.set_activation_stats`: the device adds each product's squared inputs on prompts onto
        ``stats``' values (uploaded here), in the CPU block's order, and each prompt's forward copies the sums back
        into ``stats`` (per-expert statistics have no CUDA path)."""
        c = self.config
        init = None
        if stats is not None:
            check_activation_stats(stats, c.n_layers)
            sizes = {"attn": c.n_embd, "wo": c.n_head * c.head_dim, "ffn": c.n_embd, "down": c.n_ff}
            for li, d in enumerate(stats):
                if "count" in d:
                    raise ValueError("per-expert statistics have no CUDA path")
                for key, a in d.items():
                    if key in sizes and a.size != sizes[key]:
                        raise ValueError(f"layer {li} {key}: {a.size} values, not {sizes[key]}")
            init = np.zeros((c.n_layers, sum(sizes.values())), np.float32)
            for d, row in zip(stats, init, strict=True):
                for key, part in self._stats_parts():
                    if key in d:
                        row[part] = d[key]
        err = _err()
        _check(self._lib.qsc_stats_enable(self._live(), ffi.NULL if init is None else _p(init, "float *"),
                                          0 if init is None else init.size, err, _ERR_LEN), err, "statistics")
        self._stats = stats

    def _stats_parts(self) -> list[tuple[str, slice]]:
        """Where each product's sums lie in a layer's row of the device's statistics (qsc_probe.cuh)."""
        c = self.config
        E, QD, F = c.n_embd, c.n_head * c.head_dim, c.n_ff
        return [("attn", slice(0, E)), ("wo", slice(E, E + QD)), ("ffn", slice(E + QD, 2 * E + QD)),
                ("down", slice(2 * E + QD, 2 * E + QD + F))]

    def _add_stats(self) -> None:
        c = self.config
        parts = self._stats_parts()
        sums = np.empty((c.n_layers, parts[-1][1].stop), np.float32)
        err = _err()
        _check(self._lib.qsc_stats_read(self._live(), _p(sums, "float *"), sums.size, err, _ERR_LEN), err,
               "statistics")
        assert self._stats is not None
        for d, row in zip(self._stats, sums, strict=True):
            for key, part in parts:
                if key in d:
                    d[key][...] = row[part]

    def close(self) -> None:
        """Free the device memory now (also done when the session is garbage-collected)."""
        if getattr(self, "_m", None) is not None:
            self._lib.qsc_model_free(self._m)
            self._m = None

    def __del__(self) -> None:
        self.close()

    def __enter__(self) -> CudaSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

