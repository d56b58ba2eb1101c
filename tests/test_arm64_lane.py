"""The ARM64 lane's slim part (issue 45), run by ``./dev test``: csrc compiles for aarch64 with clang without a
warning (Debian's gcc compiles it in the wheel build, whose warnings fail the test too), the aarch64 wheel
cross-builds, and a small selection of the kernel and engine tests passes on it under qemu-aarch64 at each ARM64
level (cortex-a72: NEON, neoverse-n1: + dotprod, max: + i8mm): tests/run_arm64.sh's ``--quick`` selection.
The whole lane is ``./dev test-arm64``.

Needs gcc-aarch64-linux-gnu, qemu-user and clang (``./dev test`` installs them when root): without them the tests
fail in CI and are skipped elsewhere, naming the packages.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

from .host_lanes import linux_host_only, missing_tools

REPO = Path(__file__).resolve().parent.parent
TOOLS = ("aarch64-linux-gnu-gcc", "qemu-aarch64", "clang")
CPUS = ("max", "neoverse-n1", "cortex-a72")

pytestmark = [
    linux_host_only,
    pytest.mark.slow,
    pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the lane cross-builds on x86-64"),
]


def _need_tools() -> None:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        msg = f"the ARM64 lane needs {', '.join(missing)}: apt-get install gcc-aarch64-linux-gnu qemu-user clang"
        missing_tools(msg)


def test_csrc_compiles_for_aarch64_with_clang_without_warnings() -> None:
    """Every csrc file through clang's aarch64 back end (its target-feature checks run there, not in the parser),
    warnings as errors: the contract of the NEON files, which must also vanish cleanly where clang lacks the
    dotprod/i8mm attributes (clang < 16)."""
    _need_tools()
    flags = ["--target=aarch64-linux-gnu", "-O2", "-std=gnu11", "-Wall", "-Werror", "-Wno-unused-function", "-Icsrc"]
    failed = []
    for src in sorted((REPO / "csrc").glob("*.c")):
        r = subprocess.run(["clang", *flags, "-c", "-o", os.devnull, f"csrc/{src.name}"], cwd=REPO,
                           capture_output=True, text=True, timeout=300)
        if r.returncode:
            first = next((ln for ln in r.stderr.splitlines() if "error" in ln), r.stderr.strip()[:300])
            failed.append(f"{src.name}: {first}")
    assert not failed, "clang --target=aarch64-linux-gnu:\n" + "\n".join(failed)


def test_quick_lane_passes_at_every_arm64_level() -> None:
    """tests/run_arm64.sh test --quick: the wheel cross-built with aarch64-linux-gnu-gcc (no warning), its library
    an aarch64 ELF loaded by Debian's arm64 CPython under qemu, and the quick selection passing on each CPU."""
    _need_tools()
    r = subprocess.run([str(REPO / "tests" / "run_arm64.sh"), "test", "--quick"], cwd=REPO, capture_output=True,
                       text=True, timeout=1200)
    out = r.stdout + r.stderr
    tail = "\n".join(out.splitlines()[-60:])
    assert r.returncode == 0, f"tests/run_arm64.sh test --quick failed (exit {r.returncode}):\n{tail}"
    warnings = [ln for ln in out.splitlines() if ": warning:" in ln]
    assert not warnings, "aarch64-linux-gnu-gcc warned:\n" + "\n".join(warnings[:20])
    summary = out[out.index("run_arm64: summary"):]
    for cpu in CPUS:
        line = next((ln for ln in summary.splitlines() if ln.strip().startswith(f"{cpu}:")), "")
        assert " passed" in line and "failed" not in line and "error" not in line, f"{cpu}: {line or 'no result'}"
