"""What the CPU kernels run with: the instruction set in use, the best one this CPU has, and the default thread
count. The GUI asks here (gui -> core -> native: the views never reach into the native layer)."""

from __future__ import annotations

from .native import kernels as _kernels


def isa() -> str:
    """Instruction set the kernels use now (x86-64: ``scalar``, ``avx2``, ``avx512``; ARM64: ``scalar``, ``neon``,
    ``dotprod``, ``i8mm``)."""
    return _kernels.isa()


def isa_detected() -> str:
    """Best instruction set this CPU supports."""
    return _kernels.isa_detected()


def default_threads() -> int:
    """Threads a computation uses when none is given (the online CPUs)."""
    return _kernels.default_threads()
