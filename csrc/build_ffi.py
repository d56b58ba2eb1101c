"""cffi (API mode) build of Quantscope's native library: ``quantscope.core.native._quantscope_native``.

Run by ``pip install`` through setup.py's ``cffi_modules``, or in place by ``python csrc/build_ffi.py``
(``--sanitize`` for an ASan/UBSan build). Per-ISA code uses function target attributes, never global ISA
flags, so the library loads on any x86-64 CPU and dispatches at run time.

Compilers: GCC or clang on Linux and macOS; on Windows clang-cl (setup.py puts it in place of MSVC's cl.exe, which
cannot compile GCC vector extensions or target attributes), with cl-style flags. OS calls are in csrc/qs_os.c.
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


def compiler_args(sanitize: bool = False, platform: str = sys.platform) -> tuple[list[str], list[str]]:
    """Compile and link arguments for ``platform`` (``sys.platform``'s values)."""
    if platform == "win32":
        # clang-cl: /clang: passes a GCC-style flag through; -Wall would mean -Weverything there (cl's /Wall)
        if sanitize:
            raise SystemExit("quantscope: error: the sanitizer build (--sanitize) is for Linux and macOS")
        return ["/O2", "/clang:-std=gnu11", "/clang:-fno-strict-aliasing", "-Wno-unused-function"], []
    if sanitize:
        return (["-O1", "-g", "-std=gnu11", "-fno-strict-aliasing", "-pthread", "-fsanitize=address,undefined",
                 "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer"],
                ["-pthread", "-fsanitize=address,undefined"])
    # GCC or clang (macOS: Apple clang; -pthread is implied there and harmless)
    return ["-O2", "-std=gnu11", "-fno-strict-aliasing", "-pthread", "-Wall", "-Wno-unused-function"], ["-pthread"]


def make_builder(sanitize: bool = False, absolute: bool = False) -> cffi.FFI:
    ffi = cffi.FFI()
    ffi.cdef(_cdef())
    args, link = compiler_args(sanitize)
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
    if sys.platform == "win32" and not sanitize:
        # through setup.py's build_ext, which puts clang-cl in place of cl.exe (cffi's own compile() would use cl)
        import subprocess

        subprocess.run([sys.executable, str(ROOT / "setup.py"), "build_ext", "--inplace"], check=True)
        return max((ROOT / "core" / "native").glob("_quantscope_native*.pyd"), key=lambda p: p.stat().st_mtime)
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
