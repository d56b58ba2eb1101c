"""Benchmarks behind ``quantscope bench``: figures, never assertions."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .gguf import GGUFFile


def rss_bytes() -> int:
    """Current resident set size of this process (Linux ``/proc``; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as fh:
            import os

            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def time_call(fn: Callable[[], Any], repeat: int) -> list[float]:
    """Wall times (seconds) of ``repeat`` calls."""
    out = []
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def open_index(path: Path) -> GGUFFile:
    """What 'open' means for the benchmark: header, all metadata and the full tensor index."""
    f = GGUFFile(path)
    _ = [(t.name, t.ne, t.type_name, t.data_offset) for t in f.tensors]
    return f


def bench_open(paths: list[Path], repeat: int = 7) -> list[dict[str, Any]]:
    """Median open time and RSS growth for each file (our reader)."""
    rows = []
    for p in paths:
        before = rss_bytes()
        kept = open_index(p)
        grown = rss_bytes() - before
        times = time_call(lambda p=p: open_index(p).close(), repeat)
        rows.append({
            "file": str(p), "size": p.stat().st_size, "tensors": len(kept.tensors), "kv": len(kept.metadata),
            "median_ms": 1e3 * statistics.median(times), "min_ms": 1e3 * min(times), "rss_growth_mb": grown / 2**20,
        })
        kept.close()
    return rows
