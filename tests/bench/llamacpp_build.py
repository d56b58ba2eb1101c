"""Build llama.cpp's tools reproducibly, outside the repository: the peer of tests/bench/bench_vs_llama.py.

The source is the llama.cpp tree vendored in the PyPI sdist of llama-cpp-python (a pinned version), fetched with
pip (``pip download --no-deps --no-binary :all:``) unless ``--sdist`` names a downloaded one. It is unpacked into
``$XDG_CACHE_HOME/quantscope/llama.cpp-<version>/src`` (default ``~/.cache``) and built with CMake (Release,
GGML_NATIVE, no curl, static libraries) into ``…/build``; only the targets in ``TARGETS`` are built. On a CPU
whose /proc/cpuinfo advertises AMX, ``-mno-amx-tile -mno-amx-int8 -mno-amx-bf16`` are added to the C and C++
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

VERSION = "0.3.36"
TARGETS = ("llama-bench", "llama-perplexity", "llama-tokenize", "llama-quantize", "llama-imatrix", "llama-gguf-split")
AMX_OFF = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def cache_root(version: str = VERSION) -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "quantscope" / f"llama.cpp-{version}"


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def has_amx() -> bool:
    return any(f.startswith("amx") for f in cpu_flags())


def cmake_options() -> list[str]:
    opts = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DBUILD_SHARED_LIBS=OFF",
            "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF"]
    if has_amx():
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
