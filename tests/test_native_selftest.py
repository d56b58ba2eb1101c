"""The native library's build checks (issue 46, tests/run_native_checks.sh): every csrc/*.c and the C self-test
(csrc/selftest/qs_selftest.c: the kernel tests' checks against the scalar reference, at every ISA level) compile
with -Wall -Werror under gcc and clang for x86-64, the aarch64 cross compilers and MinGW-w64, and the self-test
passes natively, under qemu-aarch64 (Cortex-A72: NEON, Neoverse N1: + dotprod, max: + i8mm) and under Wine.

The cross lanes need gcc-aarch64-linux-gnu and qemu-user, or gcc-mingw-w64-x86-64 and wine64: without them they
are skipped naming the packages, and fail under CI=1. The ARM64 Python lane (tests/run_arm64.sh) is separate."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from .host_lanes import linux_host_only, missing_tools

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "run_native_checks.sh"
X86 = platform.machine() in ("x86_64", "AMD64")

pytestmark = [pytest.mark.slow, linux_host_only]


def _need(tools: dict[str, str]) -> None:
    """Skip (fail under CI) unless every tool is on PATH; tools maps a tool to its Debian package."""
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        msg = f"no {', '.join(missing)}: apt-get install {' '.join(sorted({tools[t] for t in missing}))}"
        missing_tools(msg)


def _run(lane: str, *args: str) -> dict[str, str]:
    """Run one lane; assert it passed; the summary's level list per run ('windows', 'aarch64/max', ...)."""
    r = subprocess.run(["bash", str(SCRIPT), lane, "--require", *args], cwd=REPO, capture_output=True, text=True,
                       timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    runs = dict(re.findall(r"^lane (\S+): ok \(\d+ s\) selftest: \d+ checks, 0 failed, levels: (\S+)$", r.stdout, re.M))
    assert runs, out[-4000:]
    return runs


def _x86_levels() -> str:
    """The levels this x86-64 CPU has, from the kernel's flags (not from the library's own detection)."""
    flags: set[str] = set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    else:  # another OS: the library's detection is all there is
        from quantscope.core.native import kernels as K

        return ",".join(K.ISA_NAMES[: K.ISA_NAMES.index(K.isa_detected()) + 1])
    levels = ["scalar"]
    if {"avx2", "fma", "f16c"} <= flags:
        levels.append("avx2")
        if {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= flags:
            levels.append("avx512")
    return ",".join(levels)


def _clang_major() -> int:
    out = subprocess.run(["clang", "-dumpversion"], capture_output=True, text=True).stdout.strip()
    return int(out.split(".")[0]) if out else 0


@pytest.mark.parametrize("lane", ["native", "clang"])
def test_host_build_and_selftest(lane: str) -> None:
    _need({"gcc" if lane == "native" else "clang": "gcc" if lane == "native" else "clang"})
    runs = _run(lane)
    want = _x86_levels() if X86 else None
    assert list(runs) == [lane]
    if want is not None:
        assert runs[lane] == want
    assert runs[lane].startswith("scalar")
    if lane == "native":  # --isa limits the levels to scalar (the reference) and the one named; a level not here: 2
        exe = REPO / "build" / "native-checks" / "native" / "qs_selftest"
        best = runs[lane].split(",")[-1]
        r = subprocess.run([str(exe), "--isa", best, "--quick"], capture_output=True, text=True, timeout=300)
        want_levels = "scalar" if best == "scalar" else f"scalar,{best}"
        assert r.returncode == 0 and r.stdout.splitlines()[-1].endswith(f"levels: {want_levels}")
        r = subprocess.run([str(exe), "--isa", "sse9"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "sse9 is not on this CPU" in r.stderr


@pytest.mark.skipif(not X86, reason="the cross lanes run on an x86-64 host")
def test_aarch64_gcc_under_qemu_at_each_level() -> None:
    _need({"aarch64-linux-gnu-gcc": "gcc-aarch64-linux-gnu", "qemu-aarch64": "qemu-user"})
    runs = _run("aarch64", "--quick")  # the full run takes ~45 s of emulation, three times
    assert runs == {"aarch64/cortex-a72": "scalar,neon", "aarch64/neoverse-n1": "scalar,neon,dotprod",
                    "aarch64/max": "scalar,neon,dotprod,i8mm"}


@pytest.mark.skipif(not X86, reason="the cross lanes run on an x86-64 host")
def test_aarch64_clang_under_qemu() -> None:
    _need({"clang": "clang", "aarch64-linux-gnu-gcc": "gcc-aarch64-linux-gnu", "qemu-aarch64": "qemu-user"})
    runs = _run("aarch64-clang")
    # clang before 16 builds no dotprod / i8mm kernels without those baselines (csrc/qs_arch.h): NEON is its best
    want = "scalar,neon,dotprod,i8mm" if _clang_major() >= 16 else "scalar,neon"
    assert runs == {"aarch64-clang/max": want}


@pytest.mark.skipif(not X86, reason="the cross lanes run on an x86-64 host")
def test_windows_mingw_under_wine() -> None:
    _need({"x86_64-w64-mingw32-gcc": "gcc-mingw-w64-x86-64"})
    if shutil.which("wine64") is None and shutil.which("wine") is None:
        _need({"wine64": "wine64"})
    runs = _run("windows")
    assert runs == {"windows": _x86_levels()}


def _need_zig() -> None:
    try:
        import ziglang  # noqa: F401
    except ImportError:
        missing_tools("no zig: pip install ziglang (in the test extra on Linux)")


@pytest.mark.skipif(not X86, reason="the cross lanes run on an x86-64 host")
def test_aarch64_with_a_current_clang_builds_and_runs_every_level() -> None:
    """zig's clang (22) builds the dotprod and i8mm kernels through target attributes (QS_CLANG_TARGETS), which
    Debian's clang 14 cannot: the self-test passes at each level under qemu."""
    _need_zig()
    _need({"qemu-aarch64": "qemu-user"})
    runs = _run("zig-aarch64", "--quick")
    assert runs == {"zig-aarch64/cortex-a72": "scalar,neon", "zig-aarch64/neoverse-n1": "scalar,neon,dotprod",
                    "zig-aarch64/max": "scalar,neon,dotprod,i8mm"}


@pytest.mark.parametrize("lane", ["macos", "windows-arm64"])
def test_macos_and_windows_arm64_build_and_link(lane: str) -> None:
    """No macOS or Windows on ARM64 here: csrc and the self-test compile at -Wall -Werror and link into a Mach-O
    (arm64 and x86_64) or an ARM64 PE executable with zig's clang and those systems' C headers and libraries."""
    _need_zig()
    r = subprocess.run(["bash", str(SCRIPT), lane, "--require"], cwd=REPO, capture_output=True, text=True,
                       timeout=1200)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    built = dict(re.findall(r"^lane (\S+): ok \(\d+ s\) built and linked, not run here: (.+)$", r.stdout, re.M))
    targets = (["macos/aarch64-macos", "macos/x86_64-macos"] if lane == "macos"
               else ["windows-arm64/aarch64-windows-gnu"])
    assert sorted(built) == targets, r.stdout
    exes = {t: REPO / "build" / "native-checks" / lane / t.split("/")[1] for t in targets}
    for t, d in exes.items():
        exe = next(d.glob("qs_selftest*"))
        head = exe.read_bytes()[:0x200]
        if "macos" in t:  # Mach-O 64-bit magic, then the CPU type (arm64 0x0100000c, x86_64 0x01000007)
            assert head[:4] == b"\xcf\xfa\xed\xfe"
            assert int.from_bytes(head[4:8], "little") == (0x0100000C if t.endswith("aarch64-macos") else 0x01000007)
        else:  # PE: the machine field of the COFF header is ARM64 (0xAA64)
            pe = int.from_bytes(head[0x3C:0x40], "little")
            assert head[:2] == b"MZ" and exe.read_bytes()[pe : pe + 6] == b"PE\0\0\x64\xaa"


def test_a_missing_toolchain_is_named_and_fails_only_when_required(tmp_path: Path) -> None:
    """With the cross compiler off PATH the lane says which package to install: SKIP, or FAIL under --require."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("bash", "grep", "date", "tail", "head", "cat", "mkdir", "rm", "basename", "dirname"):
        found = shutil.which(tool)
        if found:
            (bindir / tool).symlink_to(found)
    env = {**os.environ, "PATH": str(bindir)}
    env.pop("CI", None)
    r = subprocess.run(["bash", str(SCRIPT), "windows"], cwd=REPO, capture_output=True, text=True, env=env)
    skip = "lane windows: SKIP: no x86_64-w64-mingw32-gcc (apt-get install gcc-mingw-w64-x86-64)"
    assert r.returncode == 0 and skip in r.stdout
    r = subprocess.run(["bash", str(SCRIPT), "windows", "--require"], cwd=REPO, capture_output=True, text=True, env=env)
    assert r.returncode == 1 and "lane windows: FAIL: no x86_64-w64-mingw32-gcc" in r.stdout
    r = subprocess.run(["bash", str(SCRIPT), "windows"], cwd=REPO, capture_output=True, text=True,
                       env={**env, "CI": "1"})
    assert r.returncode == 1 and "FAIL: no x86_64-w64-mingw32-gcc" in r.stdout
