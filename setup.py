"""Build hook for the cffi extension (everything else lives in pyproject.toml).

On Windows the extension is compiled with clang-cl, not MSVC's cl.exe: cl cannot compile the GCC vector extensions
and per-function target attributes of the kernels. clang-cl takes cl's flags and writes MSVC-compatible objects, so
MSVC's link.exe and the Windows SDK stay as they are; only the compiler is swapped (csrc/build_ffi.py gives it
cl-style flags there).
"""

import os
import re
import shutil
import subprocess
import sys

import cffi  # noqa: F401  -- fail loudly if the build requirement is missing
from setuptools import setup
from setuptools.command.build_ext import build_ext


def find_clang_cl(search_path: str = "") -> str | None:
    """clang-cl.exe on ``search_path``, PATH, or in LLVM's default install folder."""
    for path in (search_path, os.environ.get("PATH", "")):
        if path and (exe := shutil.which("clang-cl", path=path)):
            return exe
    default = os.path.join(os.environ.get("ProgramFiles", r"C:\Program Files"), "LLVM", "bin", "clang-cl.exe")
    return default if os.path.isfile(default) else None


CLANG_CL_MIN = 19  # before 19, clang-cl's <immintrin.h> declares no intrinsics beyond the command line's ISA


def clang_major(exe: str) -> int:
    """The major version ``exe --version`` reports, or 0."""
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60).stdout
    except OSError:
        return 0
    m = re.search(r"clang version (\d+)", out)
    return int(m.group(1)) if m else 0


def use_clang_cl(compiler) -> None:
    """Make an MSVC compiler object compile with clang-cl (found beside Visual Studio's own tools, on PATH, or in
    LLVM's install folder); exits with one error line when there is none, or only an old one."""
    if not getattr(compiler, "initialized", True):
        compiler.initialize()
    exe = find_clang_cl(getattr(compiler, "_paths", ""))
    if exe is None:
        sys.exit("quantscope: error: building the native library on Windows needs clang-cl (LLVM): MSVC's cl.exe "
                 "cannot compile its GCC vector extensions and target attributes; install LLVM "
                 f"{CLANG_CL_MIN} or newer (winget install LLVM.LLVM) and build again")
    if (major := clang_major(exe)) < CLANG_CL_MIN:
        sys.exit(f"quantscope: error: {exe} is clang {major or '(unknown version)'}; the native library needs "
                 f"clang-cl {CLANG_CL_MIN} or newer (older ones hide the AVX2/AVX-512 intrinsics from "
                 "per-function target attributes): install a newer LLVM (winget install LLVM.LLVM)")
    compiler.cc = exe
    # whole-program optimisation would make the objects LLVM bitcode, which MSVC's link.exe cannot read
    for opts in (getattr(compiler, "compile_options", None), getattr(compiler, "compile_options_debug", None)):
        if opts is not None:
            opts[:] = [o for o in opts if o != "/GL"]
    for name in dir(compiler):
        flags = getattr(compiler, name, None)
        if name.startswith("ldflags_") and isinstance(flags, list):
            flags[:] = [f for f in flags if f != "/LTCG"]


class BuildExt(build_ext):
    """build_ext with clang-cl in place of cl.exe on Windows (unchanged elsewhere)."""

    def build_extensions(self) -> None:
        if self.compiler.compiler_type == "msvc":
            use_clang_cl(self.compiler)
        super().build_extensions()


setup(cffi_modules=["csrc/build_ffi.py:ffibuilder"], cmdclass={"build_ext": BuildExt})
