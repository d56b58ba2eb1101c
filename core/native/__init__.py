"""Bindings to Quantscope's native C library (built by ``pip install`` through cffi).

Import failure names the build step instead of surfacing a bare ``ModuleNotFoundError``.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["NativeUnavailableError", "ffi", "lib"]


class NativeUnavailableError(ImportError):
    """The compiled extension could not be loaded."""


def _load_override(path: str) -> Any:
    """Load the extension from an explicit file (the sanitizer build, see tests/run_sanitized.sh)."""
    import importlib.machinery
    import importlib.util

    name = f"{__name__}._quantscope_native"
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


try:
    if os.environ.get("QUANTSCOPE_NATIVE_SO"):
        _mod = _load_override(os.environ["QUANTSCOPE_NATIVE_SO"])
        _ffi, _lib = _mod.ffi, _mod.lib
    else:
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
