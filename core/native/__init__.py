"""Bindings to Quantscope's native C library (built by ``pip install`` through cffi).

Import failure names the build step instead of surfacing a bare ``ModuleNotFoundError``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["NativeUnavailableError", "ffi", "lib"]


class NativeUnavailableError(ImportError):
    """The compiled extension could not be loaded."""


try:
    from ._quantscope_native import ffi as _ffi
    from ._quantscope_native import lib as _lib
except ImportError as exc:  # pragma: no cover - exercised only on broken installs
    raise NativeUnavailableError(
        "Quantscope's native library (quantscope.core.native._quantscope_native) is not built: "
        f"{exc}. Build it with `pip install -e .` (or `./dev setup`) from the source tree; it needs gcc "
        "and the Python headers (Debian: apt-get install gcc python3-dev)."
    ) from exc

ffi: Any = _ffi
lib: Any = _lib
