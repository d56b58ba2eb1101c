"""Quantscope's CUDA backend against llama.cpp's CUDA llama-bench on the same synthetic files, interleaved (issue 37).

Everything on the GPU machine, in one call (meant to finish in under 9 minutes on a 16-core H100 host):

1. llama-bench built with ``GGML_CUDA`` for this GPU's architecture from the pinned llama.cpp source (the version of
   tests/bench/llamacpp_build.py): ``--llama-src DIR``, else the unpacked source that script leaves in
   ``~/.cache/quantscope/llama.cpp-<version>/src``. A device machine reaches no registry, so make the source travel:
   ``--prepare-source DIR`` (on a machine that has it) writes a trimmed copy (ggml with its CPU and CUDA backends,
   src, common, vendor, include, cmake, tools/llama-bench: about 40 MB) to carry. The build goes to
   ``<source>/../build-cuda-sm<arch>`` and is reused while its stamp matches.
2. The synthetic Q4_K_M files (core/synthetic.py; ``--models 1b,8b,moe`` by default: dense 1B and 8B and the
   Qwen3-30B-A3B-shaped MoE) written into the model cache, with the vocabulary of ``--vocab`` (default
   ``$QUANTSCOPE_VOCAB_SOURCE``, else the SmolLM2 catalogue model).
3. Per file, ``--reps`` rounds whose order alternates, each engine in two calls (a process each): decode at every
   depth of ``-d`` (llama-bench's ``-d``: the tests run after that many tokens are already in the KV cache, filled
   by an untimed prefill; default 0,4096,16384,32768) and prefill of each size of ``-p`` (default 512,4096) from an
   empty cache. Ours: ``quantscope bench model FILE --backend cuda -p 0 -n N -d D,... -r 1 --json`` and ``... -p P
   -n 0`` per P (with ``--baseline`` also ours with QUANTSCOPE_CUDA_MMA=0 QUANTSCOPE_CUDA_FLASH=0
   QUANTSCOPE_CUDA_GEMV=0: k_matmul and k_attention only, the kernels before issue 37); llama.cpp: ``llama-bench
   -ngl 99 -p 0 -n N -d D,... -r 1 -o json`` and ``llama-bench -ngl 99 -p P,... -n 0 -r 1 -o json``.
4. A table of medians, a row per engine and test (``tg128 @ d4096``, ``pp4096``): tokens/s, the ratio ours /
   llama.cpp, and for decode the GB/s it reads (the weights one decoded token reads, as tests/bench/bench_vs_llama.py
   counts them, plus the fp16 KV cache of the positions it attends to: depth + n/2 on average) and its share of the
   device's peak DRAM bandwidth (cudaDeviceProp). ``--json FILE`` keeps every sample.

Time budget (estimated, not yet measured): the llama.cpp CUDA build about 5 minutes on 16 cores (reused when its
folder survives), the 8B file about a minute and the MoE two, each engine run 10-60 s (loading and the 52K tokens
of untimed depth fill dominate); ``--baseline`` adds a third engine. ``--timeout`` bounds every engine run. Carry
``build/cuda`` (this library, built here) so the GPU machine need not build it. Without a usable CUDA GPU it prints
one line saying why and exits with status 1 (``--prepare-source`` needs none).
Usage:

    python tests/bench/bench_gpu_vs_llama.py [--models 1b,8b,moe] [-p 512,4096] [-n 128]
                                             [-d 0,4096,16384,32768] [--reps 1] [--baseline]
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import llamacpp_build
from bench_vs_llama import model_facts

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


def int_list(text: str) -> list[int]:
    """``512,4096`` -> [512, 4096] (non-negative integers, as llama-bench's lists)."""
    vals = [int(x) for x in text.split(",") if x.strip()]
    if not vals or min(vals) < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of non-negative integers")
    return vals


def csv(vals: list[int]) -> str:
    return ",".join(map(str, vals))


def ours_cmds(path: Path, a: argparse.Namespace) -> list[list[str]]:
    """Ours: decode at every depth in one call, then one call per prefill size (depth 0)."""
    base = [sys.executable, "-m", "quantscope.cli", "bench", "model", str(path), "-r", "1", "--json", "--backend",
            a.backend]
    cmds = [[*base, "-p", "0", "-n", str(a.n_gen), "-d", csv(a.depth)]] if a.n_gen else []
    return cmds + [[*base, "-p", str(p), "-n", "0"] for p in a.n_prompt if p]


def llama_cmds(exe: Path, path: Path, a: argparse.Namespace) -> list[list[str]]:
    """llama-bench (its ``-d``): decode at every depth in one call, every prefill size (depth 0) in another."""
    base = [str(exe), "-m", str(path), "-ngl", "99", "-r", "1", "-o", "json"]
    cmds = [[*base, "-p", "0", "-n", str(a.n_gen), "-d", csv(a.depth)]] if a.n_gen else []
    pps = [p for p in a.n_prompt if p]
    return cmds + ([[*base, "-p", csv(pps), "-n", "0"]] if pps else [])


def run(cmd: list[str], env: dict[str, str] | None, timeout: float) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise RuntimeError((p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-1])
    return p.stdout


def test_name(test: str, n: int, depth: int) -> str:
    return f"{test}{n}" + (f" @ d{depth}" if depth else "")


def parse_ours_rows(text: str) -> dict[str, float]:
    """``quantscope bench model --json`` -> {test name: tokens/s}."""
    return {r["test"]: float(r["tokens_per_s"]) for r in json.loads(text)}


def parse_llama_rows(text: str) -> dict[str, float]:
    """``llama-bench -o json`` -> {test name: tokens/s} under our names (``tg128 @ d4096``, ``pp512``)."""
    out = {}
    for r in json.loads(text):
        test, n = ("pp", r["n_prompt"]) if r["n_prompt"] and not r["n_gen"] else ("tg", r["n_gen"])
        out[test_name(test, int(n), int(r.get("n_depth", 0)))] = float(r["avg_ts"])
    return out


def tests_of(a: argparse.Namespace) -> list[tuple[str, int, int]]:
    """The table's tests in order: (kind, tokens, depth)."""
    tg = [("tg", a.n_gen, d) for d in a.depth] if a.n_gen else []
    return tg + [("pp", p, 0) for p in a.n_prompt if p]


def bench_file(name: str, path: Path, exe: Path | None, a: argparse.Namespace) -> dict[str, Any]:
    facts = model_facts(path, 1)  # kv_bytes: the fp16 K and V of one position, every layer
    base_env = dict(os.environ, QUANTSCOPE_CUDA_MMA="0", QUANTSCOPE_CUDA_FLASH="0", QUANTSCOPE_CUDA_GEMV="0")
    variants: dict[str, tuple[list[list[str]], dict[str, str] | None]] = {"ours": (ours_cmds(path, a), None)}
    if a.baseline:
        variants["ours-today"] = (ours_cmds(path, a), base_env)
    if exe is not None:
        variants["llama.cpp"] = (llama_cmds(exe, path, a), None)
    samples: dict[str, list[dict[str, float]]] = {k: [] for k in variants}
    errors: dict[str, str] = {}
    for rep in range(a.reps):
        order = list(variants) if rep % 2 == 0 else list(reversed(variants))
        for key in order:
            cmds, env = variants[key]
            s: dict[str, float] = {}
            for cmd in cmds:
                if key in errors:
                    break
                try:
                    text = run(cmd, env, a.timeout)
                    s |= parse_llama_rows(text) if key == "llama.cpp" else parse_ours_rows(text)
                except (RuntimeError, ValueError, KeyError, IndexError, subprocess.TimeoutExpired) as exc:
                    errors[key] = f"{' '.join(cmd[-6:])}: {exc}"
                    say(f"{name} {key}: {errors[key]}")
            if s:
                samples[key].append(s)
                say(f"{name} round {rep + 1}/{a.reps} {key}: " + ", ".join(f"{t} {v:.1f}" for t, v in s.items()))

    def med(key: str, test: str) -> float:
        vals = [s[test] for s in samples[key] if test in s]
        return statistics.median(vals) if vals else float("nan")

    engines: dict[str, dict[str, dict[str, float]]] = {}
    for key in variants:
        engines[key] = {}
        for kind, n, d in tests_of(a):
            t = test_name(kind, n, d)
            e = {"tokens_per_s": med(key, t)}
            if kind == "tg":  # the weights once per token, the cache up to its position (d + n/2 on average)
                e["bytes_per_token"] = facts["decode_bytes"] + facts["kv_bytes"] * (d + n / 2)
                e["gbs"] = e["bytes_per_token"] * e["tokens_per_s"] / 1e9
            engines[key][t] = e
    return {"model": name, **facts, "engines": engines, "samples": samples, "errors": errors}


def render(results: list[dict[str, Any]], peak: float, a: argparse.Namespace) -> str:
    lines = [f"{'file':<8} {'MiB':>6} {'test':<16} {'engine':<11} {'t/s':>10} {'x llama':>8} {'GB/s':>7} "
             f"{'% peak':>7}"]
    for r in results:
        ref = r["engines"].get("llama.cpp")  # absent: --llama-bench none
        for kind, n, d in tests_of(a):
            t = test_name(kind, n, d)
            for key, tests in r["engines"].items():
                e = tests[t]
                bw = (f"{e['gbs']:7.0f} {100 * e['gbs'] / peak:7.1f}" if "gbs" in e and e["gbs"] == e["gbs"]
                      else f"{'':>7} {'':>7}")
                ratio = f"{e['tokens_per_s'] / ref[t]['tokens_per_s']:8.2f}" if ref else f"{'-':>8}"
                lines.append(f"{r['model']:<8} {r['size'] / 2**20:6.0f} {t:<16} {key:<11} {e['tokens_per_s']:10.1f} "
                             f"{ratio} {bw}")
        for key, why in r["errors"].items():
            lines.append(f"{r['model']:<8} {key}: failed: {why}")
    return "\n".join(lines)


def model_files(a: argparse.Namespace) -> Iterator[tuple[str, Path]]:
    """The files of ``--models``, each written (a synthetic shape) only when its turn comes."""
    for m in (x.strip() for x in a.models.split(",") if x.strip()):
        if m in synthetic.SHAPES:
            say(f"synthetic {m}: {synthetic.synthetic_path(m)}")
            yield m, synthetic.ensure_synthetic(m, vocab_source=a.vocab)
        elif Path(m).is_file():
            yield Path(m).stem, Path(m)
        else:
            raise SystemExit(f"bench_gpu_vs_llama: {m} is neither a synthetic shape nor a file")


def rehearse(a: argparse.Namespace) -> int:
    """The same runs and table on the CPU: ours with --backend cpu, llama.cpp's CPU llama-bench."""
    exe = llamacpp_build.cache_root() / "build" / "bin" / "llama-bench"
    if not exe.is_file():
        print(f"bench_gpu_vs_llama: no {exe} (build it with tests/bench/llamacpp_build.py)", file=sys.stderr)
        return 1
    results = [bench_file(name, path, exe, a) for name, path in model_files(a)]
    print(render(results, float("nan"), a))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="1b,8b,moe", help="synthetic shapes or GGUF paths, comma-separated")
    ap.add_argument("-p", "--n-prompt", type=int_list, default=[512, 4096], help="prefill sizes (depth 0)")
    ap.add_argument("-n", "--n-gen", type=int, default=128, help="decode tokens per depth (0: no decode test)")
    ap.add_argument("-d", "--depth", type=int_list, default=[0, 4096, 16384, 32768],
                    help="decode after this many tokens in the KV cache (llama-bench -d)")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--baseline", action="store_true", help="also ours with the issue-37 kernels off")
    ap.add_argument("--llama-src", type=Path, default=llamacpp_build.cache_root() / "src")
    ap.add_argument("--llama-bench", metavar="EXE|none",
                    help="a prebuilt CUDA llama-bench to use instead of building one from --llama-src "
                    "(tests/bench/gpu_speed_table.sh --prepare-bench); none: our rows only")
    ap.add_argument("--vocab", type=Path, default=os.environ.get("QUANTSCOPE_VOCAB_SOURCE") or None)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per engine run")
    ap.add_argument("--json", type=Path, help="write every sample here")
    ap.add_argument("--backend", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: a rehearsal on a machine without a GPU (ours on the CPU against llama.cpp's CPU "
                    "llama-bench of tests/bench/llamacpp_build.py, no bandwidth share)")
    ap.add_argument("--prepare-source", type=Path, metavar="DIR",
                    help="write a trimmed copy of --llama-src to DIR (to carry to a GPU machine) and stop")
    a = ap.parse_args()
    if a.prepare_source:
        print(prepare_source(a.llama_src, a.prepare_source))
        return 0
    from quantscope.core.engine import cuda_library as cl

    if a.backend == "cpu":
        return rehearse(a)
    ok, why = cl.cuda_status()
    if not ok:
        print(f"bench_gpu_vs_llama: no usable CUDA GPU here ({why}); run it on a GPU machine", file=sys.stderr)
        return 1
    t0 = time.monotonic()
    props = cl.device_properties()
    peak = props["peak_bw_gbs"]
    exe: Path | None
    if a.llama_bench == "none":
        exe = None
    elif a.llama_bench:
        exe = Path(a.llama_bench).resolve()
        if not os.access(exe, os.X_OK):
            print(f"bench_gpu_vs_llama: {exe} is not an executable llama-bench", file=sys.stderr)
            return 1
    else:
        for tool in ("cmake", "nvcc"):
            if shutil.which(tool) is None:
                print(f"bench_gpu_vs_llama: {tool} is not installed; llama-bench cannot be built", file=sys.stderr)
                return 1
        exe = build_llama_bench(a.llama_src.resolve(), cuda_arch(), a.jobs)
    print(f"device: {why}; peak DRAM bandwidth {peak:.0f} GB/s\nlibrary: {cl.build_info()}")
    print(f"llama.cpp: {exe or 'not run (--llama-bench none)'} (llama-cpp-python {llamacpp_build.VERSION}'s source)",
          flush=True)
    results = []
    for i, (name, path) in enumerate(model_files(a)):  # a model's rows as soon as it is done (a time limit may stop us)
        results.append(bench_file(name, path, exe, a))
        table = render(results[-1:], peak, a).splitlines()
        print("\n".join(table if i == 0 else table[1:]), flush=True)
        if a.json:
            a.json.write_text(json.dumps({"device": why, "peak_gbs": peak, "results": results}, indent=1) + "\n")
    print(f"total {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
