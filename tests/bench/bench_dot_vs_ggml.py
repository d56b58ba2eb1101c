"""One-thread row-dot kernels side by side with ggml's, on real rows of a file: TSC cycles per 256-element block on
x86-64, nanoseconds on ARM64 (no portable cycle counter there), best of 15 interleaved passes; the same rows and the
same activation (Q8_K; Q8_0 for the 32-element types).

Usage: python tests/bench/bench_dot_vs_ggml.py --file GGUF|random [--types IQ3_S,IQ2_XS] [--rows 2048]
    [--llama-build DIR]
ggml's kernels come from the static libraries of the llama.cpp oracle build (tests/bench/llamacpp_build.py, the
llama-cpp-python sdist's vendor/llama.cpp); tests/bench/dot_vs_ggml.c is compiled against them with gcc (``cc`` and
the macOS linker's -force_load on macOS). Our kernel is the one of the highest ISA level (AVX-512/AVX2 on x86-64,
dotprod/NEON on ARM64) at most ``--isa`` that this CPU has and this build defines for the type. Whole-model
ratios come from bench_vs_llama.py; this separates the dot kernel from threading and the rest of the graph. Figures
only. The relative difference of the summed dots is printed as a check that both read the rows alike. ``--file
random`` times random blocks (2048 rows of 4096) for types no file at hand holds: the time does not depend on the
values.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import llamacpp_build  # noqa: E402

from quantscope.core import native  # noqa: E402
from quantscope.core.base.ggml_types import ggml_type  # noqa: E402
from quantscope.core.cpu import cpu_name, is_x86  # noqa: E402
from quantscope.core.gguf import GGUFFile  # noqa: E402
from quantscope.core.native import kernels as K  # noqa: E402

#: types with a SIMD row dot on both sides (AVX2 and NEON), by activation type
TYPES = {**dict.fromkeys(("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "IQ4_XS", "TQ1_0",
                          "TQ2_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"), "q8_K"),
         **dict.fromkeys(("Q4_0", "Q5_0", "Q8_0", "IQ4_NL", "MXFP4", "NVFP4"), "q8_0")}
#: types whose AVX-512 dot needs AVX512_VBMI (the engine runs the AVX2 one on CPUs without it)
VBMI_TYPES = ("IQ3_S", "IQ2_XS", "IQ3_XXS", "IQ2_XXS", "TQ1_0")


def openmp_library(build: Path) -> str | None:
    """The OpenMP runtime CMake found for ggml (macOS: Homebrew's libomp, when there was one), from its cache."""
    try:
        for line in (build / "CMakeCache.txt").read_text(errors="replace").splitlines():
            key, _, value = line.partition("=")
            if key.startswith(("OpenMP_omp_LIBRARY", "OpenMP_libomp_LIBRARY")) and value.endswith((".dylib", ".a")):
                return value
    except OSError:
        pass
    return None


def compile_harness(build: Path, out: Path) -> Path:
    libs = [str(build / "ggml" / "src" / "libggml-cpu.a"), str(build / "ggml" / "src" / "libggml-base.a")]
    pylib = sysconfig.get_config_var("LIBDIR")
    python = [f"-L{pylib}", f"-lpython{sysconfig.get_config_var('LDVERSION')}", f"-Wl,-rpath,{pylib}"]
    if sys.platform == "darwin":  # Apple's linker: -force_load per archive; ggml-cpu may use Accelerate's vDSP
        omp = openmp_library(build)
        link = [*(f"-Wl,-force_load,{a}" for a in libs), *python, "-lc++", "-framework", "Accelerate",
                *([omp] if omp else [])]
        cc = "cc"
    else:
        link = ["-rdynamic", "-Wl,--whole-archive", *libs, "-Wl,--no-whole-archive", "-Wl,--no-as-needed", *python,
                "-ldl", "-lm", "-lstdc++", "-fopenmp", "-lpthread"]
        cc = "gcc"
    subprocess.run([cc, "-O2", "-o", str(out), str(HERE / "dot_vs_ggml.c"), *link], check=True)
    return out


def our_kernels(name: str, ceiling: str) -> tuple[str, ...]:
    """The ISA suffixes to try for ``name``'s dot, best first: this CPU's levels up to ``ceiling`` (``best``: its
    highest), scalar left out; on x86 AVX-512 only where the type's kernel can run (VBMI)."""
    top = K.ISA_NAMES.index(K.isa_detected())
    if ceiling != "best":
        top = min(top, K.ISA_NAMES.index(ceiling))
    levels = tuple(reversed(K.ISA_NAMES[1 : top + 1]))
    if "avx512" in levels and name in VBMI_TYPES and not K.has_vbmi():
        levels = tuple(x for x in levels if x != "avx512")
    return levels


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", required=True)
    ap.add_argument("--types", default="IQ3_S,IQ2_XS")
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--isa", choices=("best", *K.ISA_NAMES[1:]), default="best",
                    help="the highest level of our kernel (best: the one the engine runs here; x86-64: avx2, "
                         "avx512; ARM64: neon, dotprod, i8mm)")
    ap.add_argument("--llama-build", type=Path, default=llamacpp_build.cache_root() / "build")
    args = ap.parse_args()
    so = Path(native.__file__).parent
    sos = sorted(so.glob("_quantscope_native*.so"), key=lambda p: p.stat().st_mtime)
    if not sos:
        raise SystemExit("the native library is not built")
    if K.ISA_NAMES == ("scalar",):
        raise SystemExit(f"this build ({K.ARCH}) has no SIMD kernels to compare with ggml's")
    unit = "cycles per 256-element block (TSC)" if is_x86() else "nanoseconds per 256-element block"
    print(f"CPU: {cpu_name()} ({K.ARCH}, {K.isa_detected()}); one thread; {unit}, best of 15")
    print(f"{'type':<8} {'tensor':<28} {'ours':>8} {'ggml':>8} {'ggml/ours':>9}  {'rel. diff':<10} our kernel")
    with tempfile.TemporaryDirectory() as tmp:
        exe = compile_harness(args.llama_build, Path(tmp) / "dot_vs_ggml")
        f = GGUFFile(args.file) if args.file != "random" else None
        for name in args.types.split(","):
            if name not in TYPES:
                raise SystemExit(f"{name}: not one of {', '.join(TYPES)}")
            gt = ggml_type(name)
            if f is None:
                tname, off, rows, k = "(random blocks)", -gt.block_bytes, args.rows, 4096
            else:
                t = next((t for t in f.tensors if t.type_name == name and len(t.ne) == 2 and t.row_len % 256 == 0),
                         None)
                if t is None:
                    print(f"{name:<8} (no such tensor in the file)")
                    continue
                tname, off, rows, k = t.name, t.data_offset, min(args.rows, t.n_rows), t.row_len
            sym = name.lower()[:-2] + "_K" if name.endswith("_K") else name.lower()  # q6_K, iq3_s
            act = TYPES[name]
            kernels = our_kernels(name, args.isa)
            if not kernels:
                print(f"{name:<8} (this CPU has no SIMD level at most {args.isa})")
                continue
            for isa in kernels:
                kern = f"qs_dot_{sym}_{isa}"
                res = subprocess.run([str(exe), str(sos[-1]), args.file, str(off), str(rows), str(k),
                                      str(gt.row_bytes(k)), kern, f"ggml_vec_dot_{sym}_{act}", act],
                                     capture_output=True, text=True)
                if res.returncode == 0 or "missing symbol (qs_dot" not in res.stderr:
                    break
            if res.returncode != 0:
                print(f"{name:<8} failed: {res.stderr.strip()}")
                continue
            ours, ggml, rel = res.stdout.split()
            o, g = float(ours), float(ggml)
            print(f"{name:<8} {tname:<28} {o:8.1f} {g:8.1f} {g / o:9.3f}  {rel:<10} {kern}")
        if f is not None:
            f.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
