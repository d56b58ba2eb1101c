"""Quantscope's CUDA backend against llama.cpp's CUDA llama-bench on the same synthetic files, interleaved (issue 37).

Everything on the GPU machine, in one call (meant to finish in under 9 minutes on a 16-core H100 host):

1. llama-bench built with ``GGML_CUDA`` for this GPU's architecture from the pinned llama.cpp source (the version of
   tests/bench/llamacpp_build.py): ``--llama-src DIR``, else the unpacked source that script leaves in
   ``~/.cache/quantscope/llama.cpp-<version>/src``. A device machine reaches no registry, so make the source travel:
   ``--prepare-source DIR`` (on a machine that has it) writes a trimmed copy (ggml with its CPU and CUDA backends,
   src, common, vendor, include, cmake, tools/llama-bench: about 40 MB) to carry. The build goes to
   ``<source>/../build-cuda-sm<arch>`` and is reused while its stamp matches.
2. The synthetic Q4_K_M files (core/synthetic.py; ``--models 1b,8b`` by default) written into the model cache, with
   the vocabulary of ``--vocab`` (default ``$QUANTSCOPE_VOCAB_SOURCE``, else the SmolLM2 catalogue model).
3. Per file, ``--reps`` rounds whose order alternates: ours (``quantscope bench model FILE --backend cuda -p P -n N
   -r 1 --json``, a process each; with ``--baseline`` also ours with QUANTSCOPE_CUDA_MMA=0 QUANTSCOPE_CUDA_FLASH=0
   QUANTSCOPE_CUDA_GEMV=0: k_matmul and k_attention only, the kernels before issue 37) and
   ``llama-bench -ngl 99 -p P -n N -r 1 -o json``.
4. A table of medians: prefill and decode tokens/s, the ratios ours / llama.cpp, decode GB/s (the bytes one decoded
   token reads, as tests/bench/bench_vs_llama.py counts them, times tokens/s) and its share of the device's peak
   DRAM bandwidth. ``--json FILE`` keeps every sample.

Time budget (estimated, not yet measured): the llama.cpp CUDA build about 5 minutes on 16 cores (reused when its
folder survives), the 8B file about a minute, each engine run 10-30 s (loading dominates), so 2 rounds of 2 engines
on 2 files fit 9 minutes; ``--baseline`` adds a third engine. Carry ``build/cuda`` (this library, built here) so the
GPU machine need not build it. Without a usable CUDA GPU it prints one line saying why and exits with status 1
(``--prepare-source`` needs none).
Usage:

    python tests/bench/bench_gpu_vs_llama.py [--models 1b,8b] [-p 512] [-n 128] [--reps 2] [--baseline]
                                             [--llama-src DIR] [--vocab GGUF] [--jobs N] [--json out.json]
    python tests/bench/bench_gpu_vs_llama.py --prepare-source build/llama-src
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import llamacpp_build
from bench_vs_llama import model_facts, parse_llama, parse_ours

from quantscope.core import synthetic

#: what of llama.cpp's tree the CUDA llama-bench needs (everything else stays behind)
KEEP_TOP = ("CMakeLists.txt", "LICENSE", "cmake", "include", "src", "common", "vendor", "licenses")
KEEP_GGML_BACKENDS = ("ggml-cpu", "ggml-cuda")
TOOLS_CMAKE = "find_package(Threads REQUIRED)\nllama_add_compile_flags()\nadd_subdirectory(llama-bench)\n"


def say(msg: str) -> None:
    print(f"[bench-gpu] {msg}", file=sys.stderr, flush=True)


def prepare_source(src: Path, dest: Path) -> Path:
    """A trimmed copy of the llama.cpp tree ``src`` in ``dest`` (written beside it, then renamed into place)."""
    if not (src / "CMakeLists.txt").is_file():
        raise SystemExit(f"bench_gpu_vs_llama: no llama.cpp source in {src} (run tests/bench/llamacpp_build.py)")
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in KEEP_TOP:
        p = src / name
        if p.is_dir():
            shutil.copytree(p, tmp / name)
        elif p.is_file():
            shutil.copy2(p, tmp / name)
    ignore_backends = shutil.ignore_patterns(*(d.name for d in (src / "ggml" / "src").iterdir()
                                               if d.is_dir() and d.name.startswith("ggml-")
                                               and d.name not in KEEP_GGML_BACKENDS))
    shutil.copytree(src / "ggml", tmp / "ggml", ignore=ignore_backends)
    (tmp / "tools").mkdir()
    shutil.copytree(src / "tools" / "llama-bench", tmp / "tools" / "llama-bench")
    (tmp / "tools" / "CMakeLists.txt").write_text(TOOLS_CMAKE)
    if dest.exists():
        shutil.rmtree(dest)
    os.rename(tmp, dest)
    return dest


def cuda_arch() -> str:
    from quantscope.core.engine import cuda_library as cl

    return cl.device_properties()["compute"].replace(".", "")


def build_llama_bench(src: Path, arch: str, jobs: int) -> Path:
    """llama-bench with GGML_CUDA for ``arch``, built (or reused) beside ``src``."""
    bdir = src.parent / f"build-cuda-sm{arch}"
    exe = bdir / "bin" / "llama-bench"
    opts = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={arch}",
            "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
            "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF",
            "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_TOOLS=ON"]
    stamp = bdir / "quantscope-build.json"
    config = {"src": str(src), "options": opts}
    if exe.is_file() and stamp.is_file() and json.loads(stamp.read_text()) == config:
        return exe
    t0 = time.monotonic()
    say(f"building llama-bench (CUDA sm_{arch}) with {jobs} jobs from {src}")
    subprocess.run(["cmake", "-S", str(src), "-B", str(bdir), *opts], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(bdir), "-j", str(jobs), "--target", "llama-bench"], check=True,
                   stdout=subprocess.DEVNULL)
    if not exe.is_file():
        raise SystemExit(f"bench_gpu_vs_llama: the build left no {exe}")
    stamp.write_text(json.dumps(config) + "\n")
    say(f"llama-bench built in {time.monotonic() - t0:.0f} s")
    return exe


def ours_cmd(path: Path, a: argparse.Namespace) -> list[str]:
    return [sys.executable, "-m", "quantscope.cli", "bench", "model", str(path), "-p", str(a.n_prompt), "-n",
            str(a.n_gen), "-r", "1", "--json", "--backend", "cuda"]


def llama_cmd(exe: Path, path: Path, a: argparse.Namespace) -> list[str]:
    return [str(exe), "-m", str(path), "-ngl", "99", "-p", str(a.n_prompt), "-n", str(a.n_gen), "-r", "1", "-o",
            "json"]


def run(cmd: list[str], env: dict[str, str] | None, timeout: float) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise RuntimeError((p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-1])
    return p.stdout


def bench_file(name: str, path: Path, exe: Path, a: argparse.Namespace) -> dict[str, Any]:
    facts = model_facts(path, a.n_prompt + a.n_gen)
    base_env = dict(os.environ, QUANTSCOPE_CUDA_MMA="0", QUANTSCOPE_CUDA_FLASH="0", QUANTSCOPE_CUDA_GEMV="0")
    variants: dict[str, tuple[list[str], dict[str, str] | None]] = {"ours": (ours_cmd(path, a), None)}
    if a.baseline:
        variants["ours-today"] = (ours_cmd(path, a), base_env)
    variants["llama.cpp"] = (llama_cmd(exe, path, a), None)
    samples: dict[str, list[dict[str, Any]]] = {k: [] for k in variants}
    errors: dict[str, str] = {}
    for rep in range(a.reps):
        order = list(variants) if rep % 2 == 0 else list(reversed(variants))
        for key in order:
            if key in errors:
                continue
            cmd, env = variants[key]
            try:
                text = run(cmd, env, a.timeout)
                s = parse_llama(text) if key == "llama.cpp" else parse_ours(text)
            except (RuntimeError, ValueError, KeyError, IndexError, subprocess.TimeoutExpired) as exc:
                errors[key] = str(exc)
                say(f"{name} {key}: {exc}")
                continue
            samples[key].append(s)
            say(f"{name} round {rep + 1}/{a.reps} {key}: pp {s.get('pp', 0):.0f} tg {s.get('tg', 0):.1f} t/s")

    def med(key: str, field: str) -> float:
        vals = [s[field] for s in samples[key] if field in s]
        return statistics.median(vals) if vals else float("nan")

    engines = {k: {"pp": med(k, "pp"), "tg": med(k, "tg")} for k in variants}
    for e in engines.values():
        e["decode_gbs"] = facts["decode_bytes"] * e["tg"] / 1e9
    return {"model": name, **facts, "engines": engines, "samples": samples, "errors": errors}


def render(results: list[dict[str, Any]], peak: float, a: argparse.Namespace) -> str:
    pp, tg = f"pp{a.n_prompt}", f"tg{a.n_gen}"
    lines = [f"{'file':<8} {'MiB':>6} {'engine':<11} {pp + ' t/s':>12} {'x llama':>8} {tg + ' t/s':>11} "
             f"{'x llama':>8} {'GB/s':>7} {'% peak':>7}"]
    for r in results:
        ref = r["engines"]["llama.cpp"]
        for key, e in r["engines"].items():
            lines.append(f"{r['model']:<8} {r['size'] / 2**20:6.0f} {key:<11} {e['pp']:12.0f} "
                         f"{e['pp'] / ref['pp']:8.2f} {e['tg']:11.1f} {e['tg'] / ref['tg']:8.2f} "
                         f"{e['decode_gbs']:7.0f} {100 * e['decode_gbs'] / peak:7.1f}")
        for key, why in r["errors"].items():
            lines.append(f"{r['model']:<8} {key}: failed: {why}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="1b,8b", help="synthetic shapes or GGUF paths, comma-separated")
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--baseline", action="store_true", help="also ours with the issue-37 kernels off")
    ap.add_argument("--llama-src", type=Path, default=llamacpp_build.cache_root() / "src")
    ap.add_argument("--vocab", type=Path, default=os.environ.get("QUANTSCOPE_VOCAB_SOURCE") or None)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per engine run")
    ap.add_argument("--json", type=Path, help="write every sample here")
    ap.add_argument("--prepare-source", type=Path, metavar="DIR",
                    help="write a trimmed copy of --llama-src to DIR (to carry to a GPU machine) and stop")
    a = ap.parse_args()
    if a.prepare_source:
        print(prepare_source(a.llama_src, a.prepare_source))
        return 0
    from quantscope.core.engine import cuda_library as cl

    ok, why = cl.cuda_status()
    if not ok:
        print(f"bench_gpu_vs_llama: no usable CUDA GPU here ({why}); run it on a GPU machine", file=sys.stderr)
        return 1
    for tool in ("cmake", "nvcc"):
        if shutil.which(tool) is None:
            print(f"bench_gpu_vs_llama: {tool} is not installed; llama-bench cannot be built", file=sys.stderr)
            return 1
    t0 = time.monotonic()
    props = cl.device_properties()
    peak = props["peak_bw_gbs"]
    exe = build_llama_bench(a.llama_src.resolve(), cuda_arch(), a.jobs)
    files: list[tuple[str, Path]] = []
    for m in (x.strip() for x in a.models.split(",") if x.strip()):
        if m in synthetic.SHAPES:
            say(f"synthetic {m}: {synthetic.synthetic_path(m)}")
            files.append((m, synthetic.ensure_synthetic(m, vocab_source=a.vocab)))
        elif Path(m).is_file():
            files.append((Path(m).stem, Path(m)))
        else:
            print(f"bench_gpu_vs_llama: {m} is neither a synthetic shape nor a file", file=sys.stderr)
            return 1
    results = [bench_file(name, path, exe, a) for name, path in files]
    print(f"device: {why}; peak DRAM bandwidth {peak:.0f} GB/s\nlibrary: {cl.build_info()}")
    print(render(results, peak, a))
    print(f"total {time.monotonic() - t0:.0f} s")
    if a.json:
        a.json.write_text(json.dumps({"device": why, "peak_gbs": peak, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
