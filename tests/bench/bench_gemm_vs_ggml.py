"""F16 and BF16 matrix products side by side with ggml's (issue 52): one thread, process CPU time (so a shared
machine's other processes do not count), best of ``--reps``, on the shapes of a model's layer at a prompt of
``--n`` tokens and a decode GEMV.

Usage: python tests/bench/bench_gemm_vs_ggml.py [--shapes 4864x896,896x4864] [--n 512] [--reps 5]
    [--gemv 19456x4864] [--llama-build DIR]
Ours: the repacked layout's kernels through :class:`kernels.Repacked` (vdpbf16ps for BF16 where the CPU has
AVX512_BF16, and its AVX-512F fallback beside it); ggml's: ``ggml_mul_mat`` of the static llama.cpp oracle build
(tests/bench/llamacpp_build.py; tinyBLAS on x86), tests/bench/gemm_vs_ggml.c compiled against it. Both times
include rounding the activations (ggml: to the weight's type; ours: BF16 only). Whole-model ratios come from
bench_vs_llama.py on an idle machine; this separates the products. Figures only.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import llamacpp_build  # noqa: E402

from quantscope.core.cpu import cpu_name  # noqa: E402
from quantscope.core.native import kernels as K  # noqa: E402


def compile_harness(build: Path, out: Path) -> Path:
    src = build.parent / "src"
    libs = [str(build / "ggml" / "src" / x) for x in ("libggml.a", "libggml-cpu.a", "libggml-base.a")]
    subprocess.run(["gcc", "-O2", "-o", str(out), str(HERE / "gemm_vs_ggml.c"), f"-I{src / 'ggml' / 'include'}",
                    *libs, "-lstdc++", "-lm", "-fopenmp", "-lpthread", "-ldl"], check=True)
    return out


def weights(name: str, dense: np.ndarray) -> np.ndarray:
    if name == "F16":
        return dense.astype(np.float16).view(np.uint8)
    return (dense.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)  # truncated: the time does not care


def ours(name: str, rows: int, k: int, n: int, reps: int, bf16_dot: bool = True) -> float:
    """GFLOP/s of our repacked product, one thread, process CPU time, best of reps."""
    rng = np.random.default_rng(1)
    rp = K.Repacked(name, weights(name, rng.standard_normal((rows, k), dtype=np.float32) * 0.05), rows, k)
    x = rng.standard_normal((n, k)).astype(np.float32)
    best = float("inf")
    with K.bf16_dot(bf16_dot):
        for _ in range(reps):
            t = time.process_time()
            rp.matmat(x, threads=1)
            best = min(best, time.process_time() - t)
    return 2.0 * rows * k * n / best / 1e9


def ggml(exe: Path, rows: int, k: int, n: int, reps: int) -> dict[str, float]:
    out = subprocess.run([str(exe), str(rows), str(k), str(n), str(reps)], check=True, capture_output=True,
                         text=True).stdout
    return {line.split()[1]: float(line.split()[6]) for line in out.splitlines() if line.startswith("ggml ")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="4864x896,896x4864")
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--gemv", default="19456x4864")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--llama-build", type=Path, default=llamacpp_build.cache_root() / "build")
    a = ap.parse_args()
    print(f"CPU: {cpu_name()}, ISA {K.isa()}, AVX512_BF16 {K.has_avx512_bf16()}; GFLOP/s, 1 thread, CPU time")
    with tempfile.TemporaryDirectory() as tmp:
        exe = compile_harness(a.llama_build, Path(tmp) / "gemm_vs_ggml")
        jobs = [(*map(int, s.split("x")), a.n) for s in a.shapes.split(",")] + \
               [(*map(int, s.split("x")), 1) for s in a.gemv.split(",") if s]
        for rows, k, n in jobs:
            g = ggml(exe, rows, k, n, a.reps)
            f16, bf16 = ours("F16", rows, k, n, a.reps), ours("BF16", rows, k, n, a.reps)
            bf16_f = ours("BF16", rows, k, n, a.reps, bf16_dot=False)
            print(f"{rows}x{k} n={n}: F16 ours {f16:.1f} ggml {g['F16']:.1f} ({f16 / g['F16']:.2f}x); BF16 ours "
                  f"{bf16:.1f} (AVX-512F fallback {bf16_f:.1f}) ggml {g['BF16']:.1f} ({bf16 / g['BF16']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
