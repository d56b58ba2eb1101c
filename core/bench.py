"""Benchmarks behind ``quantscope bench``: figures, never assertions."""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import fsutil
from .gguf import GGUFFile
from .sysinfo import maxrss_bytes as maxrss_bytes
from .sysinfo import peak_rss_bytes as peak_rss_bytes
from .sysinfo import reset_peak_rss
from .sysinfo import rss_bytes as rss_bytes


def child_peak_rss(polled: float, ru_maxrss: int) -> float:
    """A finished child's peak RSS in bytes: the ``VmHWM`` polled while it ran, or where /proc gave none (macOS)
    the ``ru_maxrss`` its wait4 returned."""
    return polled or float(maxrss_bytes(ru_maxrss))


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


def _median_time(fn: Callable[[], Any], min_time: float = 0.15, min_reps: int = 5, max_reps: int = 200) -> float:
    fn()  # warm-up
    times: list[float] = []
    t_start = time.perf_counter()
    while len(times) < min_reps or (time.perf_counter() - t_start < min_time and len(times) < max_reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def memory_bandwidth(mib: int = 256, threads: tuple[int, ...] = (1, 2)) -> dict[str, float]:
    """This machine's memory bandwidth now: numpy copy (bytes read + written) and a native read-only stream
    at each thread count (``read_gbs_<n>t``), over a buffer far larger than the caches."""
    import numpy as np

    from .native import ffi, lib

    src = np.ones(mib << 18, dtype=np.float32)
    dst = np.empty_like(src)
    t = _median_time(lambda: np.copyto(dst, src), min_reps=5)
    out = {"copy_gbs": 2 * src.nbytes / t / 1e9}
    buf = ffi.from_buffer(src)
    for n in threads:
        t = _median_time(lambda n=n: lib.qs_read_probe(buf, src.nbytes, n), min_reps=5)
        out[f"read_gbs_{n}t"] = src.nbytes / t / 1e9
    return out


#: (label, k, rows): shape classes of `bench kernels` (k = row length).
KERNEL_SHAPES = (("in-cache", 1024, 640), ("model 896x4864", 896, 4864), ("model 4864x896", 4864, 896))
KERNEL_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "F16", "BF16", "F32")
#: Types with dot kernels that the benchmark also takes (not in the default run): Q2_K, Q3_K, IQ4 and the low-bit
#: families.
EXTRA_KERNEL_TYPES = ("Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S",
                      "IQ1_M", "TQ1_0", "TQ2_0", "MXFP4", "NVFP4")


def random_weights(type_name: str, rows: int, k: int, seed: int = 0) -> Any:
    """Valid random weight bytes of a type: random codes with small finite fp16 scales."""
    import numpy as np

    from .quant import ggml_type

    t = ggml_type(type_name)
    rng = np.random.default_rng(seed)
    if t.block_elems == 1:
        v = rng.standard_normal(rows * k).astype(np.float32)
        if t.name == "F16":
            return v.astype(np.float16).view(np.uint8)
        if t.name == "BF16":
            return (v.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        return v.view(np.uint8)
    raw = rng.integers(0, 256, size=(rows * k // t.block_elems, t.block_bytes), dtype=np.uint8)
    for off in t.fp16_scales:
        s = (rng.random(raw.shape[0]) * 0.01).astype(np.float16)
        raw[:, off : off + 2] = s.view(np.uint8).reshape(-1, 2)
    if t.name == "IQ1_M":  # d's 16 bits: the top nibbles of the four scale words
        d = (rng.random(raw.shape[0]) * 0.01).astype(np.float16).view(np.uint16).astype(np.uint32)
        words = raw[:, 48:56].copy().view("<u2").astype(np.uint32) & 0x0FFF
        for i in range(4):
            words[:, i] |= ((d >> (4 * i)) & 15) << 12
        raw[:, 48:56] = words.astype("<u2").view(np.uint8)
    if t.name == "MXFP4":
        raw[:, 0] = rng.integers(118, 124, raw.shape[0])
    if t.name == "NVFP4":
        raw[:, 0:4] = rng.integers(8, 24, (raw.shape[0], 4))
    return raw.reshape(-1)


def bench_kernels(types: tuple[str, ...] = KERNEL_TYPES, threads: tuple[int, ...] = (1, 2),
                  big: bool = True, dequant: bool = True) -> dict[str, Any]:
    """GEMV figures per type and shape class, the memory-bound big GEMV, bandwidth and dequant vs gguf-py."""
    import numpy as np

    from .cpu import cpu_name
    from .native import kernels as K
    from .native import lib
    from .quant import ggml_type

    out: dict[str, Any] = {"cpu": cpu_name(), "arch": K.ARCH, "isa": K.isa(), "isa_detected": K.isa_detected(),
                           "bandwidth": memory_bandwidth(threads=threads), "gemv": [],
                           "gemm": [], "dequant": [],
                           "pool_op_us": {n: lib.qs_pool_op_ns(n, 20000) / 1e3 for n in threads if n > 1}}
    rng = np.random.default_rng(1)
    cases = [(name, label, k, rows) for name in types for (label, k, rows) in KERNEL_SHAPES
             if k % ggml_type(name).block_elems == 0]
    if big:  # DRAM-bound: the shapes whose speed decode at real sizes is made of
        cases.append(("Q8_0", "big 151936x896", 896, 151936))
        cases += [(name, "big 65536x2048", 2048, 65536) for name in ("Q4_K", "Q5_K", "Q6_K") if name in types]
    for name, label, k, rows in cases:
        t = ggml_type(name)
        w = random_weights(name, rows, k)
        x = rng.standard_normal(k).astype(np.float32)
        y = np.empty(rows, np.float32)
        rp = K.Repacked(t, w, rows, k) if K.isa() != "scalar" and K.can_repack(t, rows, k) else None
        for n_thr in threads:
            def call(t=t, w=w, rows=rows, k=k, x=x, y=y, n_thr=n_thr) -> None:
                K.matvec(t, w, rows, k, x, threads=n_thr, out=y)

            layouts = [("file", call, w.nbytes)]
            if rp is not None:
                layouts.append(("repacked", lambda rp=rp, x=x[None], n_thr=n_thr: rp.matmat(x, threads=n_thr),
                                rp.nbytes))
            for layout, fn, nbytes in layouts:
                sec = _median_time(fn)
                out["gemv"].append({"type": name, "shape": label, "rows": rows, "k": k, "threads": n_thr,
                                    "layout": layout, "ms": sec * 1e3, "gelem_s": rows * k / sec / 1e9,
                                    "gb_s": nbytes / sec / 1e9})
    # prefill: 128 activation rows, the tiled GEMM against the row-by-row dot kernels (its peer, same run)
    for name in ("Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"):
        if name not in types:
            continue
        t = ggml_type(name)
        for label, k, rows in KERNEL_SHAPES[1:]:
            if k % t.block_elems:
                continue
            w = random_weights(name, rows, k)
            xs = rng.standard_normal((128, k)).astype(np.float32)
            n_thr = max(threads)
            res = {}
            for on in (True, False):
                def mm(t=t, w=w, rows=rows, k=k, xs=xs, n_thr=n_thr, on=on) -> None:
                    with K.prefill_gemm(on):
                        K.matmat(t, w, rows, k, xs, threads=n_thr)

                res[on] = _median_time(mm, min_reps=3)
            packed = None
            if K.isa() != "scalar" and K.can_repack(t, rows, k):
                rp = K.Repacked(t, w, rows, k)
                packed = rows * k * 128 / _median_time(lambda rp=rp, xs=xs, n=n_thr: rp.matmat(xs, threads=n),
                                                       min_reps=3) / 1e9
            out["gemm"].append({"type": name, "shape": label, "threads": n_thr, "cols": 128,
                                "gemm_gmac_s": rows * k * 128 / res[True] / 1e9,
                                "dots_gmac_s": rows * k * 128 / res[False] / 1e9, "repacked_gmac_s": packed})
    if dequant:
        try:
            import gguf
            from gguf.quants import dequantize as gguf_dequantize
        except ImportError:  # pragma: no cover - gguf-py is a test dependency
            gguf = None
        from .quant import dequantize as numpy_dequantize

        for name in ("Q4_K", "Q6_K", "Q5_0", "Q8_0", "Q4_1"):
            t = ggml_type(name)
            raw = random_weights(name, 1024, 4096).reshape(1024, -1)
            ours = _median_time(lambda raw=raw, t=t: K.dequantize(raw, t, threads=1), min_reps=3)
            ours2 = _median_time(lambda raw=raw, t=t: K.dequantize(raw, t, threads=2), min_reps=3)
            ref = _median_time(lambda raw=raw, t=t: numpy_dequantize(raw, t), min_reps=3)
            peer = (_median_time(lambda raw=raw, t=t: gguf_dequantize(raw, gguf.GGMLQuantizationType(t.id)),
                                 min_reps=3) if gguf else float("nan"))
            n = raw.shape[0] * raw.shape[1] // t.block_bytes * t.block_elems
            out["dequant"].append({"type": name, "elements": n, "native_1t_ms": ours * 1e3, "native_2t_ms": ours2 * 1e3,
                                   "numpy_ms": ref * 1e3, "gguf_py_ms": peer * 1e3})
    return out


def render_kernels(r: dict[str, Any]) -> str:
    """Text table of :func:`bench_kernels`; GEMV bandwidth is also shown against the read stream at the same
    thread count."""
    bw = r["bandwidth"]
    reads = ", ".join(f"{v:.1f} GB/s read ({k.split('_')[-1]})" for k, v in bw.items() if k.startswith("read_"))
    pool = ", ".join(f"{us:.2f} us at {n} threads" for n, us in r.get("pool_op_us", {}).items())
    isa = r["isa"] if r.get("isa_detected", r["isa"]) == r["isa"] else f"{r['isa']} (this CPU: {r['isa_detected']})"
    lines = [f"CPU {r.get('cpu', '?')} ({r.get('arch', '?')}); ISA {isa}",
             f"memory: numpy copy {bw['copy_gbs']:.1f} GB/s (read+write), {reads}",
             *([f"thread pool: {pool} per operation (an empty job: waking the workers and the barrier after it)"]
               if pool else []), "",
             f"{'type':<6} {'shape':<16} {'layout':<8} {'thr':>3} {'ms':>9} {'Gelem/s':>8} {'GB/s':>7} "
             f"{'% of read BW':>12}"]
    for g in r["gemv"]:
        ceiling = bw.get(f"read_gbs_{g['threads']}t")
        share = f"{100 * g['gb_s'] / ceiling:11.0f}%" if ceiling else f"{'':>12}"
        lines.append(f"{g['type']:<6} {g['shape']:<16} {g.get('layout', 'file'):<8} {g['threads']:>3} {g['ms']:9.3f} "
                     f"{g['gelem_s']:8.2f} {g['gb_s']:7.2f} {share}")
    if r.get("gemm"):
        lines += ["", f"{'prefill':<7} {'shape':<16} {'thr':>3} {'cols':>4} {'tiled GEMM':>11} {'row dots':>9} "
                      f"{'ratio':>6} {'repacked':>9}  (GMAC/s, activation quantization included)"]
        for g in r["gemm"]:
            rp = g.get("repacked_gmac_s")
            lines.append(f"{g['type']:<7} {g['shape']:<16} {g['threads']:>3} {g['cols']:>4} {g['gemm_gmac_s']:11.1f} "
                         f"{g['dots_gmac_s']:9.1f} {g['gemm_gmac_s'] / g['dots_gmac_s']:5.2f}x "
                         f"{(f'{rp:9.1f}' if rp else '        -')}")
    if r["dequant"]:
        lines += ["", f"{'dequant':<7} {'Melem':>6} {'native 1t':>10} {'native 2t':>10} {'numpy':>8} {'gguf-py':>8} "
                      f"{'x gguf-py (1t)':>14} {'(2t)':>6}"]
        for d in r["dequant"]:
            x1 = d["gguf_py_ms"] / d["native_1t_ms"]
            x2 = d["gguf_py_ms"] / d["native_2t_ms"]
            lines.append(f"{d['type']:<7} {d['elements'] / 1e6:6.2f} {d['native_1t_ms']:9.2f}m "
                         f"{d['native_2t_ms']:9.2f}m {d['numpy_ms']:7.1f}m {d['gguf_py_ms']:7.1f}m "
                         f"{x1:13.1f}x {x2:5.1f}x")
    return "\n".join(lines)


def bench_convert(gguf: Path, out_dir: Path, repeat: int = 3, context: int | None = None,
                  profile: str = "ckernel") -> dict[str, Any]:
    """Conversion time, MB/s and peak RSS growth, interleaved in one run with SHA-256 of the output size and a
    copy (+fsync) of it: the two floors a conversion can approach."""
    import hashlib
    import shutil

    from .bump import ConvertJob

    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / "bench.bump"
    copy = out_dir / "bench-copy.bin"
    conv_t, hash_t, copy_t, rss = [], [], [], []
    size = 0
    for _ in range(repeat):
        gc.collect()
        base = rss_bytes()
        out.unlink(missing_ok=True)  # both peers write a fresh file
        reset = reset_peak_rss()  # Linux only: elsewhere the growth is NaN
        t0 = time.perf_counter()
        res = ConvertJob(gguf, out, profile=profile, context=context).run()
        conv_t.append(time.perf_counter() - t0)
        rss.append((peak_rss_bytes() - base) / 2**20 if reset else float("nan"))
        size = res.size
        with open(out, "rb") as fh:  # untimed: both floors start from a page-cache-resident file
            while fh.read(8 << 20):
                pass
        t0 = time.perf_counter()
        h = hashlib.sha256()
        with open(out, "rb") as fh:
            fh.seek(128)
            while chunk := fh.read(8 << 20):
                h.update(chunk)
        hash_t.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        shutil.copyfile(out, copy)
        fd = os.open(copy, fsutil.O_READWRITE)  # Windows syncs only a descriptor open for writing
        os.fsync(fd)
        os.close(fd)
        copy_t.append(time.perf_counter() - t0)
        copy.unlink()
    out.unlink(missing_ok=True)
    c, hs, cp = statistics.median(conv_t), statistics.median(hash_t), statistics.median(copy_t)
    return {"file": str(gguf), "size": size, "convert_s": c, "mb_s": size / 1e6 / c, "hash_s": hs, "copy_s": cp,
            "ratio": c / max(hs, cp), "peak_rss_growth_mb": max(rss)}
