"""cffi (API mode) build of Quantscope's native library: ``quantscope.core.native._quantscope_native``.

Run by ``pip install`` through setup.py's ``cffi_modules``, or in place by ``python csrc/build_ffi.py``
(``--sanitize`` for an ASan/UBSan build). Per-ISA code uses function target attributes, never global ISA
flags, so the library loads on any x86-64 CPU and dispatches at run time.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import cffi

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SOURCES = sorted(p.name for p in HERE.glob("*.c"))
API_HEADERS = [*sorted(HERE.glob("qs_api_*.h")), HERE / "gguf_scan.h"]


def _cdef() -> str:
    text = []
    for h in API_HEADERS:
        lines = [ln for ln in h.read_text().splitlines() if not ln.lstrip().startswith("#")]
        text.append("\n".join(lines))
    return "\n".join(text)


def make_builder(sanitize: bool = False, absolute: bool = False) -> cffi.FFI:
    ffi = cffi.FFI()
    ffi.cdef(_cdef())
    args = ["-O2", "-std=gnu11", "-fno-strict-aliasing", "-pthread", "-Wall", "-Wno-unused-function"]
    link = ["-pthread"]
    if sanitize:
        args = ["-O1", "-g", "-std=gnu11", "-fno-strict-aliasing", "-pthread", "-fsanitize=address,undefined",
                "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer"]
        link = ["-pthread", "-fsanitize=address,undefined"]
    ffi.set_source(
        "quantscope.core.native._quantscope_native",
        '#include "qs.h"\n#include "gguf_scan.h"\n',
        sources=[str((HERE if absolute else Path("csrc")) / s) for s in SOURCES],
        include_dirs=[str(HERE if absolute else Path("csrc"))],
        extra_compile_args=args,
        extra_link_args=link,
    )
    return ffi


ffibuilder = make_builder()


def build_inplace(sanitize: bool = False) -> Path:
    """Compile into build/ and copy the extension next to core/native/__init__.py (for development)."""
    import shutil

    os.chdir(ROOT)
    tmp = ROOT / "build" / ("cffi-asan" if sanitize else "cffi")
    out = make_builder(sanitize, absolute=True).compile(tmpdir=str(tmp), verbose=False)
    target = ROOT / "core" / "native" / Path(out).name
    if sanitize:
        target = ROOT / "build" / "asan" / "quantscope" / "core" / "native" / Path(out).name
        target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(out, target.with_suffix(".tmp"))
    os.replace(target.with_suffix(".tmp"), target)
    return target


if __name__ == "__main__":
    print(build_inplace(sanitize="--sanitize" in sys.argv))
