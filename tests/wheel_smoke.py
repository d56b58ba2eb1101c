"""The smoke test of an installed Quantscope wheel, on any OS (issue 46).

Run by the interpreter the wheel was installed into, from anywhere:

    python tests/wheel_smoke.py [--no-compiler] [--kernels] [--] [PYTEST ARGS]

1. ``quantscope`` must come from site-packages (not this source tree) with its native library loaded;
2. a small GGUF (F32, Q8_0, Q4_0, Q4_K tensors, written with gguf-py) goes through the console script:
   ``quantscope inspect`` and ``quantscope dump-block`` (the dequantized values are checked against gguf-py);
3. ``--kernels``: the kernel tests (every type, every ISA level this CPU has, against the scalar reference) run
   from the installed wheel with pytest;
4. ``--no-compiler``: fails when a C compiler is on PATH, so a pass proves the wheel needed none.

cibuildwheel runs it as its test command (pyproject.toml, [tool.cibuildwheel]); tests/run_wheel.sh runs it on the
Linux wheel built here, in a clean venv with nothing but that venv on PATH.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
COMPILERS = ("cc", "gcc", "clang", "cl", "clang-cl", "x86_64-linux-gnu-gcc", "aarch64-linux-gnu-gcc")


def fail(msg: str) -> None:
    print(f"wheel_smoke: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def console_script() -> str:
    """The installed ``quantscope`` launcher of this interpreter's environment."""
    name = "quantscope.exe" if os.name == "nt" else "quantscope"
    path = Path(sysconfig.get_path("scripts")) / name
    if not path.is_file():
        fail(f"no console script at {path}")
    return str(path)


def write_model(path: Path) -> dict[str, object]:
    """A small GGUF with one tensor per type the smoke test reads back; returns gguf-py's dequantized values."""
    import gguf
    import numpy as np
    from gguf.constants import GGMLQuantizationType as GQ

    rng = np.random.default_rng(46)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("wheel smoke")
    expected: dict[str, object] = {}
    for name, qtype in (("f32", GQ.F32), ("q8_0", GQ.Q8_0), ("q4_0", GQ.Q4_0), ("q4_k", GQ.Q4_K)):
        data = rng.standard_normal((4, 512)).astype(np.float32)
        if qtype == GQ.F32:
            w.add_tensor(name, data)
            expected[name] = data
            continue
        if qtype == GQ.Q4_K:  # gguf-py has no Q4_K quantizer: random blocks with finite, small d and dmin
            q = rng.integers(0, 256, size=(4, 2 * 144), dtype=np.uint8)
            scales = rng.uniform(0.001, 0.01, size=(4, 2, 2)).astype(np.float16).view(np.uint8).reshape(4, 2, 4)
            q.reshape(4, 2, 144)[:, :, :4] = scales
        else:
            q = gguf.quants.quantize(data, qtype)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)
        expected[name] = gguf.quants.dequantize(q, qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


def run(cmd: list[str]) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        fail(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-compiler", action="store_true", help="fail when a C compiler is on PATH")
    ap.add_argument("--kernels", action="store_true", help="run the kernel tests from the installed wheel")
    ap.add_argument("pytest_args", nargs="*")
    a = ap.parse_args()

    if a.no_compiler:
        found = [c for c in COMPILERS if shutil.which(c)]
        if found:
            fail(f"a C compiler is on PATH ({', '.join(found)}): the check needs PATH without one")

    import quantscope.core
    from quantscope.core.native import kernels

    where = Path(quantscope.core.__file__).resolve().parent
    site = {Path(sysconfig.get_path(k)).resolve() for k in ("purelib", "platlib")}
    if not any(d in where.parents for d in site):
        fail(f"quantscope was imported from {where}, not from this environment's site-packages (the wheel)")
    print(f"wheel_smoke: quantscope from {where.parent}; native ISA levels {', '.join(kernels.ISA_NAMES)} "
          f"({kernels.ARCH}), this CPU runs {kernels.isa()}")

    import numpy as np

    exe = console_script()
    with tempfile.TemporaryDirectory(prefix="qs-wheel-") as tmp:
        model = Path(tmp) / "smoke.gguf"
        expected = write_model(model)
        out = run([exe, "inspect", str(model)])
        for name in expected:
            if name not in out:
                fail(f"`quantscope inspect` does not list tensor {name}:\n{out}")
        for name in ("q8_0", "q4_0", "q4_k"):
            out = run([exe, "dump-block", str(model), name, "--block", "1", "--json"])
            import json

            got = np.asarray(json.loads(out)["values"], dtype=np.float32)
            row = np.asarray(expected[name], dtype=np.float32).reshape(-1)
            want = row[got.size : 2 * got.size]
            if not np.array_equal(got, want):
                fail(f"dump-block {name} block 1 differs from gguf-py's dequantization")
        print("wheel_smoke: inspect and dump-block ok (values equal gguf-py's)")

    if a.kernels:
        import pytest

        tests = [str(HERE / "test_native_kernels.py"), str(HERE / "test_native_nn.py")]
        rc = pytest.main(["-q", "-p", "no:cacheprovider", *tests, *a.pytest_args])
        if rc != 0:
            fail(f"the kernel tests failed (pytest exit {rc})")
    print("wheel_smoke: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
