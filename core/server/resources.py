"""What the server's slots will take, checked before they are made: each slot has a KV cache of the whole context,
and numpy's zeroed arrays take their pages only when written, so ``--parallel 64 -c 32768`` would otherwise be
accepted on a machine it cannot fit and fail (or be killed) mid-request."""

from __future__ import annotations

from .. import sysinfo


class NotEnoughMemory(MemoryError):
    """The slots' KV caches would not fit in the memory available (the message says both sizes)."""


def size_text(n: int) -> str:
    """``n`` bytes for people: ``1.4 GiB``, ``230.0 MiB``."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n / 1024:.1f} KiB"


def available_memory() -> int | None:
    """Bytes of memory available now (Linux's MemAvailable within a cgroup's limit, macOS' free and inactive
    pages, Windows' available physical memory: :func:`sysinfo.memory_available`); None where unknown."""
    return sysinfo.memory_available()


def session_kv_bytes(session: object) -> int | None:
    """The bytes of a CPU session's KV cache (a layer sharing another's cache counted once); None for other
    sessions (a GPU's memory is checked when its cache is made)."""
    caches = getattr(session, "k_cache", None), getattr(session, "v_cache", None)
    if not all(isinstance(c, list) for c in caches):
        return None
    arrays = {id(a): a for c in caches for a in c}  # type: ignore[union-attr]
    return sum(int(a.nbytes) for a in arrays.values())


def kv_shortfall(per_slot: int, slots: int, available: int | None, n_ctx: int | None = None) -> str | None:
    """A one-line reason when ``slots`` KV caches of ``per_slot`` bytes exceed ``available`` bytes (None: they fit,
    or the memory available is unknown)."""
    need = per_slot * slots
    if available is None or need <= available:
        return None
    what = f"{slots} slot{'s' if slots != 1 else ''}" + (f" of {n_ctx:,} tokens" if n_ctx is not None else "")
    return (f"{what} need {size_text(need)} of KV cache ({need:,} bytes), but {size_text(available)} of memory is "
            "available")
