"""Build llama.cpp's tools reproducibly, outside the repository: the peer of tests/bench/bench_vs_llama.py.

The source is the llama.cpp tree vendored in the PyPI sdist of llama-cpp-python (a pinned version), fetched with
pip (``pip download --no-deps --no-binary :all:``) unless ``--sdist`` names a downloaded one. It is unpacked into
``$XDG_CACHE_HOME/quantscope/llama.cpp-<version>/src`` (default ``~/.cache``) and built with CMake (Release,
GGML_NATIVE, no curl, static libraries; on macOS without Metal and Accelerate's BLAS, so llama.cpp runs on the
CPU cores as we do) into ``…/build``; only the targets in ``TARGETS`` are built. The same on x86-64 and ARM64
(Linux/aarch64, macOS/arm64): GGML_NATIVE picks ggml's NEON/dotprod/i8mm paths there. On an x86 CPU whose
/proc/cpuinfo advertises AMX, ``-mno-amx-tile -mno-amx-int8 -mno-amx-bf16`` are added to the C and C++
flags: ggml's AMX path runs tile instructions without asking the kernel for permission first and dies with
SIGILL. A stamp file records the configuration of a finished build; a later call with the same configuration
reuses it. Usage:

    python tests/bench/llamacpp_build.py [--sdist FILE] [--jobs N] [--version V]   # prints the bin folder
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from quantscope.core.cpu import is_x86

VERSION = "0.3.36"
TARGETS = ("llama-bench", "llama-perplexity", "llama-tokenize", "llama-quantize", "llama-imatrix", "llama-gguf-split")
AMX_OFF = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def cache_root(version: str = VERSION) -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "quantscope" / f"llama.cpp-{version}"


def parse_flags(cpuinfo: str) -> set[str]:
    """The ``flags`` of an x86 /proc/cpuinfo text (ARM64 kernels write ``Features`` instead: empty there)."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_flags() -> set[str]:
    """This x86 CPU's flags; empty off x86 and where /proc is missing (macOS)."""
    if not is_x86():
        return set()
    try:
        with open("/proc/cpuinfo") as fh:
            return parse_flags(fh.read())
    except OSError:
        return set()


def has_amx() -> bool:
    """Whether ggml's AMX path would be compiled in (x86 with amx_* flags; never on ARM)."""
    return any(f.startswith("amx") for f in cpu_flags())


def cmake_options(system: str = sys.platform, amx: bool | None = None) -> list[str]:
    """CMake options of the build. GGML_NATIVE everywhere (ARM64: -mcpu=native, ggml's own NEON/dotprod/i8mm
    paths); on macOS Metal and the BLAS backend (Accelerate) off, so both engines run on the CPU cores alone."""
    opts = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DBUILD_SHARED_LIBS=OFF",
            "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF"]
    if system == "darwin":
        opts += ["-DGGML_METAL=OFF", "-DGGML_BLAS=OFF"]
    if has_amx() if amx is None else amx:
        opts += [f"-DCMAKE_C_FLAGS={AMX_OFF}", f"-DCMAKE_CXX_FLAGS={AMX_OFF}"]
    return opts


def _say(msg: str) -> None:
    print(f"[llama.cpp] {msg}", file=sys.stderr, flush=True)


def fetch_sdist(version: str, dest: Path) -> Path:
    """The llama-cpp-python sdist of ``version`` in ``dest`` (downloaded with pip when not there yet)."""
    name = f"llama_cpp_python-{version}.tar.gz"
    if (dest / name).is_file():
        return dest / name
    dest.mkdir(parents=True, exist_ok=True)
    _say(f"downloading the llama-cpp-python {version} sdist with pip")
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    f"llama-cpp-python=={version}", "-d", str(dest)], check=True)
    if not (dest / name).is_file():
        raise SystemExit(f"pip did not produce {dest / name}")
    return dest / name


def unpack(sdist: Path, root: Path) -> Path:
    """``vendor/llama.cpp`` of the sdist as ``root/src`` (extracted to a temporary folder, then renamed)."""
    src = root / "src"
    if (src / "CMakeLists.txt").is_file():
        return src
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".unpack-") as tmp:
        _say(f"unpacking vendor/llama.cpp from {sdist.name}")
        with tarfile.open(sdist) as tf:
            top = tf.getnames()[0].split("/")[0]
            prefix = f"{top}/vendor/llama.cpp/"
            members = [m for m in tf.getmembers() if m.name.startswith(prefix)]
            if not members:
                raise SystemExit(f"{sdist} has no vendor/llama.cpp")
            tf.extractall(tmp, members=members, filter="data")
        if src.exists():
            shutil.rmtree(src)
        os.rename(Path(tmp) / prefix, src)
    return src


def build(sdist: Path | None = None, jobs: int = 2, version: str = VERSION) -> Path:
    """Build (or reuse) the tools; returns the folder holding the binaries."""
    root = cache_root(version)
    bdir = root / "build"
    bin_dir = bdir / "bin"
    stamp = root / "build.json"
    config = {"version": version, "options": cmake_options(), "targets": list(TARGETS)}
    if stamp.is_file() and all((bin_dir / t).is_file() for t in TARGETS):
        try:
            if json.loads(stamp.read_text()) == config:
                return bin_dir
        except (OSError, ValueError):
            pass
    stamp.unlink(missing_ok=True)
    src = unpack(sdist or fetch_sdist(version, root / "sdist"), root)
    _say(f"configuring ({' '.join(config['options'])})")
    subprocess.run(["cmake", "-S", str(src), "-B", str(bdir), *config["options"]], check=True)
    _say(f"building {', '.join(TARGETS)} with {jobs} jobs")
    subprocess.run(["cmake", "--build", str(bdir), "--config", "Release", "-j", str(jobs),
                    "--target", *TARGETS], check=True)
    missing = [t for t in TARGETS if not (bin_dir / t).is_file()]
    if missing:
        raise SystemExit(f"the build produced no {', '.join(missing)} in {bin_dir}")
    stamp.write_text(json.dumps(config, indent=1) + "\n")
    return bin_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sdist", type=Path, help="a downloaded llama_cpp_python-<version>.tar.gz")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--version", default=VERSION, help=f"llama-cpp-python version (default {VERSION})")
    args = ap.parse_args()
    print(build(args.sdist, args.jobs, args.version))


if __name__ == "__main__":
    main()
