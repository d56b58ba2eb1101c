"""Open time and RSS: Quantscope's reader vs gguf-py's GGUFReader, and reference dequant vs gguf-py, in one run.

Usage: python tests/bench/bench_open.py [--repeat N] [--reader-repeat M]
Figures only (no assertions). Each model's peers run interleaved in the same process window.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import numpy as np

from quantscope.core import catalog
from quantscope.core.bench import time_call
from quantscope.core.gguf import GGUFFile
from quantscope.core.quant import dequantize

RSS_PROBE = """
import sys, gc
from quantscope.core.bench import rss_bytes
kind, path = sys.argv[1], sys.argv[2]
if kind == "gguf-py":
    import gguf
    before = rss_bytes(); r = gguf.GGUFReader(path); n = len(r.tensors)
else:
    from quantscope.core.gguf import GGUFFile
    import numpy  # imported by both before measuring
    before = rss_bytes(); r = GGUFFile(path); n = len(r.tensors)
print((rss_bytes() - before) / 2**20)
"""

DEQUANT_CASES = [
    ("gemma3", "blk.0.attn_output.weight"),
    ("qwen2.5-coder", "blk.11.ffn_down.weight"),
    ("qwen2.5-coder", "blk.1.ffn_down.weight"),
    ("qwen2.5-coder", "blk.0.attn_q.weight"),
    ("smollm2", "blk.0.ffn_down.weight"),
    ("qwen2.5-coder", "output.weight"),
]


def rss_growth(kind: str, path: str) -> float:
    out = subprocess.run([sys.executable, "-c", RSS_PROBE, kind, path], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def main() -> None:
    import gguf
    from gguf.quants import dequantize as gguf_dequantize

    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--reader-repeat", type=int, default=1)
    args = ap.parse_args()
    names = list(catalog.MODELS)
    print(f"{'model':<15} {'ours ms':>9} {'gguf-py ms':>11} {'speed-up':>9} {'ours RSS+MiB':>13} "
          f"{'gguf-py RSS+MiB':>16}")
    for name in names:
        path = str(catalog.model_path(name))
        ours = statistics.median(time_call(lambda p=path: GGUFFile(p).close(), args.repeat))
        theirs = statistics.median(time_call(lambda p=path: gguf.GGUFReader(p), args.reader_repeat))
        ours_rss, theirs_rss = rss_growth("ours", path), rss_growth("gguf-py", path)
        print(f"{name:<15} {ours * 1e3:9.2f} {theirs * 1e3:11.0f} {theirs / ours:8.0f}x {ours_rss:13.2f} "
              f"{theirs_rss:16.1f}")
    print()
    print(f"{'dequantize':<42} {'type':<5} {'Melem':>7} {'ours ms':>9} {'gguf-py ms':>11} {'ratio':>6}")
    for name, tensor in DEQUANT_CASES:
        with GGUFFile(catalog.model_path(name)) as f:
            t = f.tensor(tensor)
            rows = f.tensor_rows(t)
            reps = 5 if t.n_elements > 50e6 else args.repeat
            dequantize(rows, t.type)  # warm-up: page in the mapping for both peers
            gguf_dequantize(rows, gguf.GGMLQuantizationType(t.type_id))
            ours_t, theirs_t = [], []
            for _ in range(reps):  # interleaved
                t0 = time.perf_counter()
                a = dequantize(rows, t.type)
                ours_t.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                b = gguf_dequantize(rows, gguf.GGMLQuantizationType(t.type_id))
                theirs_t.append(time.perf_counter() - t0)
            assert np.array_equal(a.view(np.uint32), np.asarray(b, np.float32).view(np.uint32))
            o, g = statistics.median(ours_t), statistics.median(theirs_t)
            print(f"{name + ':' + tensor:<42} {t.type.name:<5} {t.n_elements / 1e6:7.2f} {o * 1e3:9.1f} "
                  f"{g * 1e3:11.1f} {g / o:5.2f}x")


if __name__ == "__main__":
    main()
