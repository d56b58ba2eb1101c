"""The CUDA library: finding and loading it (cffi ``dlopen``), its errors, the probe, the device's properties and
the weight types it runs, and the checks every array passes before a pointer to it reaches C.

The library (``build/cuda/libquantscope_cuda.so``, built by ``csrc/cuda/build.sh`` when ``nvcc`` exists; inside a
PyInstaller app, the bundled copy: :func:`library_path`) is never needed: :func:`cuda_status` says whether it can
run and, if not, why (no library, no driver, no device, ...), and callers fall back to the CPU. Its ABI is
:mod:`.cuda_abi`, read from its headers.
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
from .cuda_abi import CDEF

__all__ = [
    "CudaError",
    "CudaUnavailable",
    "build_info",
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
    (``qsc_type_supported``, read from its one type table, csrc/cuda/qsc_types.cuh's ``QSC_TYPE_LIST``); other types
    are dequantized to F32 on upload. Empty when the library cannot be loaded (no GPU type without a GPU)."""
    return _types_of(str(library_path()))


def build_info() -> str:
    """CUDA version and GPU architectures compiled into the library."""
    return ffi.string(_library().qsc_build_info()).decode()


# ------------------------------------------------------------------------------------- argument checks
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
