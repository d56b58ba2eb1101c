"""What the CPU kernels run with: the instruction set in use, the best one this CPU has, the default thread count,
and the CPU's name. The GUI asks here (gui -> core -> native: the views never reach into the native layer); the
CLI and the benchmarks in tests/bench print :func:`cpu_name`."""

from __future__ import annotations

import functools
import platform
import subprocess
import sys
from collections import Counter

#: ARM64 ``CPU implementer`` codes of /proc/cpuinfo (MIDR_EL1 bits 31..24) -> vendor.
ARM_IMPLEMENTERS = {0x41: "Arm", 0x42: "Broadcom", 0x43: "Cavium", 0x46: "Fujitsu", 0x48: "HiSilicon",
                    0x4E: "NVIDIA", 0x50: "APM", 0x51: "Qualcomm", 0x53: "Samsung", 0x56: "Marvell", 0x61: "Apple",
                    0x6D: "Microsoft", 0xC0: "Ampere"}
#: (implementer, ``CPU part``) -> core name, as util-linux's lscpu names them.
ARM_PARTS = {
    **{(0x41, part): name for part, name in {
        0xD03: "Cortex-A53", 0xD04: "Cortex-A35", 0xD05: "Cortex-A55", 0xD06: "Cortex-A65", 0xD07: "Cortex-A57",
        0xD08: "Cortex-A72", 0xD09: "Cortex-A73", 0xD0A: "Cortex-A75", 0xD0B: "Cortex-A76", 0xD0C: "Neoverse-N1",
        0xD0D: "Cortex-A77", 0xD0E: "Cortex-A76AE", 0xD40: "Neoverse-V1", 0xD41: "Cortex-A78", 0xD42: "Cortex-A78AE",
        0xD44: "Cortex-X1", 0xD46: "Cortex-A510", 0xD47: "Cortex-A710", 0xD48: "Cortex-X2", 0xD49: "Neoverse-N2",
        0xD4A: "Neoverse-E1", 0xD4B: "Cortex-A78C", 0xD4C: "Cortex-X1C", 0xD4D: "Cortex-A715", 0xD4E: "Cortex-X3",
        0xD4F: "Neoverse-V2", 0xD80: "Cortex-A520", 0xD81: "Cortex-A720", 0xD82: "Cortex-X4", 0xD84: "Neoverse-V3",
        0xD85: "Cortex-X925", 0xD87: "Cortex-A725", 0xD8E: "Neoverse-N3"}.items()},
    (0x46, 0x001): "A64FX", (0x48, 0xD01): "Kunpeng-920", (0x4E, 0x004): "Carmel", (0x51, 0x001): "Oryon",
    (0x61, 0x022): "Icestorm (M1)", (0x61, 0x023): "Firestorm (M1)", (0x61, 0x024): "Icestorm (M1 Pro)",
    (0x61, 0x025): "Firestorm (M1 Pro)", (0x61, 0x028): "Icestorm (M1 Max)", (0x61, 0x029): "Firestorm (M1 Max)",
    (0x61, 0x032): "Blizzard (M2)", (0x61, 0x033): "Avalanche (M2)", (0xC0, 0xAC3): "Ampere-1",
    (0xC0, 0xAC4): "Ampere-1a",
}


def _fields(text: str) -> list[tuple[str, str]]:
    return [(k.strip(), v.strip()) for k, sep, v in (ln.partition(":") for ln in text.splitlines()) if sep]


def _joined(names: list[str]) -> str:
    """One name, or the distinct ones with their counts (big.LITTLE: ``4x Cortex-A76 + 4x Cortex-A55``)."""
    counts = Counter(names)
    return names[0] if len(counts) == 1 else " + ".join(f"{n}x {name}" for name, n in counts.items())


def _int(v: str) -> int | None:
    try:
        return int(v, 0)
    except ValueError:
        return None


def parse_cpuinfo(text: str) -> str | None:
    """The CPU's name in a Linux /proc/cpuinfo text, or None when it names none: ``model name`` (x86-64), else the
    ARM64 cores' ``CPU implementer`` / ``CPU part`` (an unknown part as ``Arm part 0xd99``), with the board's
    ``Model`` (Raspberry Pi) in brackets."""
    fields = _fields(text)
    model = next((v for k, v in fields if k == "model name" and v), None)
    if model and not model.startswith("ARMv"):  # 32-bit ARM kernels: "ARMv7 Processor rev 3 (v7l)", not a name
        return model
    cores: list[str] = []
    impl: int | None = None
    for k, v in fields:
        if k == "CPU implementer":
            impl = _int(v)
        elif k == "CPU part" and impl is not None and (part := _int(v)) is not None:
            vendor = ARM_IMPLEMENTERS.get(impl, f"implementer {impl:#x}")
            cores.append(ARM_PARTS.get((impl, part), f"{vendor} part {part:#05x}"))
            impl = None
    board = next((v for k, v in fields if k == "Model" and v), None)
    if not cores:
        return board or model
    return f"{_joined(cores)} ({board})" if board else _joined(cores)


def parse_lscpu(text: str) -> str | None:
    """The ``Model name`` of lscpu's output (each distinct one of a big.LITTLE CPU), or None when it has none."""
    names = [v for k, v in _fields(text) if k == "Model name" and v and v != "-"]
    return " + ".join(dict.fromkeys(names)) or None


def _run(*cmd: str) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def clean_name(text: object) -> str | None:
    """A CPU name as the OS stores it with its padding removed (Windows' ``ProcessorNameString`` and macOS'
    brand string may carry runs of spaces); None when nothing is left."""
    return " ".join(str(text).split()) or None


def _windows_cpu_name() -> str | None:
    """Windows: ``ProcessorNameString`` of ``HKLM\\HARDWARE\\DESCRIPTION\\System\\CentralProcessor\\0``."""
    if sys.platform != "win32":
        return None
    try:
        import winreg

        with winreg.OpenKey(winreg.HKEY_LOCAL_MACHINE, r"HARDWARE\DESCRIPTION\System\CentralProcessor\0") as key:
            value, _kind = winreg.QueryValueEx(key, "ProcessorNameString")
    except (ImportError, OSError):
        return None
    return clean_name(value)


@functools.cache
def cpu_name() -> str:
    """This CPU's name: /proc/cpuinfo on Linux (``lscpu`` where it names no core this module knows), ``sysctl
    machdep.cpu.brand_string`` on macOS ("Apple M2 Pro"), the registry's ``ProcessorNameString`` on Windows
    ("AMD Ryzen 7 7840U w/ Radeon 780M Graphics"), else what ``platform`` says."""
    name = None
    if sys.platform == "darwin":
        name = clean_name(_run("sysctl", "-n", "machdep.cpu.brand_string"))
    elif sys.platform == "win32":
        name = _windows_cpu_name()
    elif sys.platform.startswith("linux"):
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
                name = parse_cpuinfo(fh.read())
        except OSError:
            pass
        if name is None or " part 0x" in name:
            name = parse_lscpu(_run("lscpu")) or name
    return name or clean_name(platform.processor()) or platform.machine() or "unknown CPU"


def isa() -> str:
    """Instruction set the kernels use now (x86-64: ``scalar``, ``avx2``, ``avx512``; ARM64: ``scalar``, ``neon``,
    ``dotprod``, ``i8mm``)."""
    from .native import kernels

    return kernels.isa()


def isa_detected() -> str:
    """Best instruction set this CPU supports."""
    from .native import kernels

    return kernels.isa_detected()


def default_threads() -> int:
    """Threads a computation uses when none is given (the online CPUs)."""
    from .native import kernels

    return kernels.default_threads()


def is_x86() -> bool:
    """Whether this is an x86-64 machine (where CPUID flags, AMX and the TSC exist)."""
    return platform.machine().lower() in ("x86_64", "amd64", "x86", "i386", "i686")
