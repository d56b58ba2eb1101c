"""The CPU's name (core/cpu.py) from real /proc/cpuinfo and lscpu texts of x86-64 and ARM64 machines, and the
llama.cpp build options per platform (tests/bench/llamacpp_build.py). Pure functions fed with text: no machine of
either kind is needed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from quantscope.core.cpu import cpu_name, is_x86, parse_cpuinfo, parse_lscpu

sys.path.insert(0, str(Path(__file__).resolve().parent / "bench"))
import llamacpp_build


def arm64_core(n: int, part: str, variant: str = "0x3", revision: int = 1, impl: str = "0x41",
               features: str = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm "
                                "lrcpc dcpop asimddp ssbs") -> str:
    """One processor block as an aarch64 Linux kernel writes it (tabs and all)."""
    return (f"processor\t: {n}\nBogoMIPS\t: 243.75\nFeatures\t: {features}\nCPU implementer\t: {impl}\n"
            f"CPU architecture: 8\nCPU variant\t: {variant}\nCPU part\t: {part}\nCPU revision\t: {revision}\n\n")


GRAVITON2 = "".join(arm64_core(i, "0xd0c") for i in range(4))  # AWS c6g: Neoverse-N1
GRAVITON3 = "".join(arm64_core(i, "0xd40", "0x1", features="fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp "
                               "asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve "
                               "asimdfhm dit uscat ilrcpc flagm ssbs paca pacg dcpodp svei8mm svebf16 i8mm bf16 dgh "
                               "rng") for i in range(2))
GRAVITON4 = "".join(arm64_core(i, "0xd4f", "0x0") for i in range(2))  # Neoverse-V2
COBALT100 = "".join(arm64_core(i, "0xd49", "0x0", revision=0) for i in range(2))  # Azure Cobalt 100: Neoverse-N2
AMPERE_ALTRA = "".join(arm64_core(i, "0xd0c", "0x3") for i in range(80))
PI4_TAIL = ("Hardware\t: BCM2835\nRevision\t: c03114\nSerial\t\t: 100000002b2c3d4e\n"
            "Model\t\t: Raspberry Pi 4 Model B Rev 1.4\n")
PI4 = "".join(arm64_core(i, "0xd08", "0x0", 3, features="fp asimd evtstrm crc32 cpuid") for i in range(4)) + PI4_TAIL
PI5 = ("".join(arm64_core(i, "0xd0b", "0x4", features="fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp "
                          "asimdhp cpuid asimdrdm lrcpc dcpop asimddp") for i in range(4))
       + "Revision\t: d04170\nSerial\t\t: 8c3b2f1e0a9d7c65\nModel\t\t: Raspberry Pi 5 Model B Rev 1.0\n")
RK3588 = ("".join(arm64_core(i, "0xd05", "0x2", 0) for i in range(4))  # Orange Pi 5: 4 little + 4 big cores
          + "".join(arm64_core(i, "0xd0b", "0x4", 0) for i in range(4, 8)))
ASAHI_M1 = ("".join(arm64_core(i, "0x022", "0x1", 1, impl="0x61") for i in range(4))  # Asahi Linux, Apple M1
            + "".join(arm64_core(i, "0x023", "0x1", 1, impl="0x61") for i in range(4, 8)))
UNKNOWN_PART = arm64_core(0, "0xd99")
XEON = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8488C
stepping\t: 8
microcode\t: 0x2b000603
cpu MHz\t\t: 2400.000
cache size\t: 107520 KB
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ss ht \
syscall nx pdpe1gb rdtscp lm constant_tsc avx2 avx512f avx512_vnni amx_bf16 amx_tile amx_int8
bogomips\t: 4800.00

"""
EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC 7R13 Processor
stepping\t: 1
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov avx2 sha_ni
"""
ARMV7 = """processor\t: 0
model name\t: ARMv7 Processor rev 3 (v7l)
BogoMIPS\t: 108.00
Features\t: half thumb fastmult vfp edsp neon vfpv3 tls vfpv4 idiva idivt vfpd32 lpae evtstrm crc32
CPU implementer\t: 0x41
CPU architecture: 7
CPU variant\t: 0x0
CPU part\t: 0xd08
CPU revision\t: 3

Hardware\t: BCM2711
Model\t\t: Raspberry Pi 4 Model B Rev 1.2
"""
LSCPU_GRAVITON2 = """Architecture:                       aarch64
CPU op-mode(s):                     32-bit, 64-bit
Byte Order:                         Little Endian
CPU(s):                             64
On-line CPU(s) list:                0-63
Vendor ID:                          ARM
Model name:                         Neoverse-N1
BIOS Model name:                    AWS Graviton2 Processor
Model:                              1
Thread(s) per core:                 1
Stepping:                           r3p1
BogoMIPS:                           243.75
Flags:                              fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm
"""
LSCPU_RK3588 = """Architecture:                    aarch64
CPU(s):                          8
Vendor ID:                       ARM
Model name:                      Cortex-A55
Model:                           0
Thread(s) per core:              1
Core(s) per cluster:             4
Model name:                      Cortex-A76
Model:                           0
Thread(s) per core:              1
"""
LSCPU_VM_APPLE = """Architecture:             aarch64
Vendor ID:                Apple
  Model name:             -
    Model:                0
"""


@pytest.mark.parametrize(("text", "name"), [
    (GRAVITON2, "Neoverse-N1"),
    (GRAVITON3, "Neoverse-V1"),
    (GRAVITON4, "Neoverse-V2"),
    (COBALT100, "Neoverse-N2"),
    (AMPERE_ALTRA, "Neoverse-N1"),
    (PI4, "Cortex-A72 (Raspberry Pi 4 Model B Rev 1.4)"),
    (PI5, "Cortex-A76 (Raspberry Pi 5 Model B Rev 1.0)"),
    (RK3588, "4x Cortex-A55 + 4x Cortex-A76"),
    (ASAHI_M1, "4x Icestorm (M1) + 4x Firestorm (M1)"),
    (UNKNOWN_PART, "Arm part 0xd99"),
    (XEON, "Intel(R) Xeon(R) Platinum 8488C"),
    (EPYC, "AMD EPYC 7R13 Processor"),
    (ARMV7, "Cortex-A72 (Raspberry Pi 4 Model B Rev 1.2)"),
], ids=["graviton2", "graviton3", "graviton4", "cobalt100", "altra", "pi4", "pi5", "rk3588", "asahi-m1",
        "unknown-part", "xeon", "epyc", "armv7"])
def test_parse_cpuinfo(text: str, name: str) -> None:
    assert parse_cpuinfo(text) == name


def test_parse_cpuinfo_unknown_implementer_and_empty() -> None:
    assert parse_cpuinfo(arm64_core(0, "0x001", impl="0x99")) == "implementer 0x99 part 0x001"
    assert parse_cpuinfo("") is None
    assert parse_cpuinfo("processor\t: 0\nBogoMIPS\t: 50.00\n") is None


def test_parse_lscpu() -> None:
    assert parse_lscpu(LSCPU_GRAVITON2) == "Neoverse-N1"  # not the BIOS model name
    assert parse_lscpu(LSCPU_RK3588) == "Cortex-A55 + Cortex-A76"
    assert parse_lscpu(LSCPU_VM_APPLE) is None
    assert parse_lscpu("") is None


def test_cpu_name_here() -> None:
    name = cpu_name()
    assert isinstance(name, str) and name and "\n" not in name


def test_llamacpp_build_options() -> None:
    linux = llamacpp_build.cmake_options(system="linux", amx=False)
    assert "-DGGML_NATIVE=ON" in linux and not any("amx" in o for o in linux)
    assert any("-mno-amx-tile" in o for o in llamacpp_build.cmake_options(system="linux", amx=True))
    mac = llamacpp_build.cmake_options(system="darwin", amx=False)
    assert {"-DGGML_NATIVE=ON", "-DGGML_METAL=OFF", "-DGGML_BLAS=OFF"} <= set(mac)  # CPU against CPU


def test_amx_only_on_x86() -> None:
    assert llamacpp_build.parse_flags(XEON) >= {"amx_tile", "avx2"}
    assert llamacpp_build.parse_flags(GRAVITON3) == set()  # aarch64 lists "Features", never "flags"
    if not is_x86():
        assert not llamacpp_build.has_amx()
