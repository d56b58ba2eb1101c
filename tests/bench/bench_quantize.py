"""`quantscope quantize` against llama-quantize on the same input, interleaved, at the same thread count.

The input is a model requantized to F16 first (a catalogue name, default the Qwen2.5 test model, or a GGUF path;
the F16 file is written once with ``quantscope quantize --allow-requantize … F16`` into
``~/.cache/quantscope/bench`` and checked byte for byte against llama-quantize's F16 of the same file). Each of
``--reps`` rounds runs both tools, in an order that alternates between rounds, each in its own process, timing the
wall clock of the whole command (start-up, reading, writing and syncing included) and polling its peak RSS
(VmHWM; macOS: the ru_maxrss of wait4). Both outputs are hashed: the script fails if they differ. Figures only;
worth something on an idle machine. Usage:

    python tests/bench/bench_quantize.py [--model qwen2.5-coder] [--preset Q4_K_M] [--threads 2] [--reps 3]
                                         [--imatrix FILE] [--llama-bin DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import llamacpp_build  # noqa: E402

from quantscope.core import catalog  # noqa: E402
from quantscope.core.bench import child_peak_rss, peak_rss_bytes  # noqa: E402
from quantscope.core.cpu import cpu_name  # noqa: E402


def run(cmd: list[str]) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of one command; raises when it fails."""
    with tempfile.TemporaryFile() as log:  # not a pipe: a tool that logs more than a pipe holds would block
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        peak = 0
        while True:
            peak = max(peak, peak_rss_bytes(p.pid))
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                p.returncode = os.waitstatus_to_exitcode(status)
                peak = int(child_peak_rss(peak, usage.ru_maxrss))
                break
            time.sleep(0.02)
        secs = time.perf_counter() - t0
        log.seek(0)
        err = log.read().decode(errors="replace")
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{err[-2000:]}")
    return secs, peak


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder")
    ap.add_argument("--preset", default="Q4_K_M")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--imatrix", help="importance matrix for both tools")
    ap.add_argument("--llama-bin", type=Path, default=None)
    a = ap.parse_args()
    bin_dir = a.llama_bin or Path(llamacpp_build.build())
    lq = str(bin_dir / "llama-quantize")
    qs = [sys.executable, "-m", "quantscope.cli"]
    src = Path(a.model) if Path(a.model).is_file() else catalog.fetch(a.model)
    bench_dir = catalog.cache_dir().parent / "bench"
    bench_dir.mkdir(parents=True, exist_ok=True)
    f16 = bench_dir / f"{src.stem}-F16.gguf"
    if not f16.exists():
        print(f"writing {f16} (requantized to F16)...", file=sys.stderr)
        run([*qs, "quantize", "--allow-requantize", str(src), str(f16), "F16"])
        check = bench_dir / "llama-F16.tmp.gguf"
        run([lq, "--allow-requantize", str(src), str(check), "F16", str(a.threads)])
        same = sha256(check) == sha256(f16)
        check.unlink()
        if not same:
            f16.unlink()
            raise SystemExit("llama-quantize's F16 differs from ours")
    im = ["--imatrix", a.imatrix] if a.imatrix else []
    outs = {"llama": bench_dir / "out-llama.gguf", "ours": bench_dir / "out-ours.gguf"}
    cmds = {"llama": [lq, *im, str(f16), str(outs["llama"]), a.preset, str(a.threads)],
            "ours": [*qs, "quantize", *im, "--threads", str(a.threads), str(f16), str(outs["ours"]), a.preset]}
    times: dict[str, list[float]] = {"llama": [], "ours": []}
    peaks: dict[str, int] = {"llama": 0, "ours": 0}
    for r in range(a.reps):
        order = ("llama", "ours") if r % 2 == 0 else ("ours", "llama")
        for who in order:
            secs, peak = run(cmds[who])
            times[who].append(secs)
            peaks[who] = max(peaks[who], peak)
    h = {who: sha256(p) for who, p in outs.items()}
    for p in outs.values():
        os.unlink(p)
    if h["llama"] != h["ours"]:
        raise SystemExit(f"the outputs differ: llama {h['llama']} ours {h['ours']}")
    med = {who: statistics.median(v) for who, v in times.items()}
    print(f"CPU: {cpu_name()}; {a.threads} threads; {src.name} -> F16 -> {a.preset}"
          f"{' with ' + a.imatrix if a.imatrix else ''}; {a.reps} interleaved rounds")
    print(f"{'tool':<16} {'median s':>9} {'best s':>8} {'peak RSS MiB':>13}")
    for who, label in (("llama", "llama-quantize"), ("ours", "quantscope")):
        print(f"{label:<16} {med[who]:>9.2f} {min(times[who]):>8.2f} {peaks[who] / 2**20:>13.0f}")
    print(f"speed ratio (llama time / ours): median {med['llama'] / med['ours']:.2f}x, "
          f"best {min(times['llama']) / min(times['ours']):.2f}x; outputs identical (sha256 {h['ours'][:16]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
