"""Tokenizing through the whole command line: `quantscope tokenize FILE --ids TEXT` vs llama-tokenize on the same file
and text, interleaved, in one run (issue 15: no slower than llama-tokenize).

Usage: python tests/bench/bench_tokenize.py --llama-bin DIR [--models smollm2,qwen2.5-coder,gemma3] [--rounds 7]
    [--kb 35]
The text is the project's docs (deterministic), cut to --kb kilobytes. Both tools' ids are compared (the figures
are worthless if they differ). Wall time per run is the median of the rounds; the ratio is llama ÷ ours (> 1: we are
faster). Figures only, no assertions. Python's bytecode cache is written once first, as an installed package has it
(a checkout run with PYTHONDONTWRITEBYTECODE=1 recompiles every module on each start).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from quantscope.core import catalog
from quantscope.core.cpu import cpu_name

ROOT = Path(__file__).resolve().parents[2]


def docs_text(kb: int) -> str:
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md")))
    while len(text.encode("utf-8")) < kb * 1000:
        text += "\n" + text
    return text.encode("utf-8")[: kb * 1000].decode("utf-8", "ignore")


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    t = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t
    if res.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed: {res.stderr.strip()[-400:]}")
    return dt, res.stdout


def parse_ids(out: str) -> list[int]:
    return [int(x) for x in out.replace("[", " ").replace("]", " ").replace(",", " ").split()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-bin", required=True, help="folder holding llama-tokenize")
    ap.add_argument("--models", default="smollm2,qwen2.5-coder,gemma3")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--kb", type=int, default=35)
    args = ap.parse_args()
    llama = str(Path(args.llama_bin) / "llama-tokenize")
    ours = [str(Path(sys.executable).with_name("quantscope"))]
    if not Path(ours[0]).exists():
        ours = [sys.executable, "-m", "quantscope.cli"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    text = docs_text(args.kb)
    print(f"CPU: {cpu_name()}; text: {len(text.encode('utf-8'))} bytes of docs/*.md; {args.rounds} rounds")
    print(f"{'model':<16} {'ours s':>8} {'llama s':>8} {'llama/ours':>10}  ids")
    with tempfile.TemporaryDirectory() as tmp:
        tfile = Path(tmp) / "text.txt"
        tfile.write_text(text, encoding="utf-8")
        for name in args.models.split(","):
            path = str(catalog.model_path(name))
            a = [*ours, "tokenize", path, "--ids", "--no-bos", text]
            b = [llama, "-m", path, "-f", str(tfile), "--ids", "--log-disable", "--no-bos"]
            _, first = timed(a, env)  # writes the bytecode cache
            _, ref = timed(b, env)
            same = parse_ids(first) == parse_ids(ref)
            ta, tb = [], []
            for _ in range(args.rounds):
                ta.append(timed(a, env)[0])
                tb.append(timed(b, env)[0])
            ma, mb = statistics.median(ta), statistics.median(tb)
            print(f"{name:<16} {ma:8.3f} {mb:8.3f} {mb / ma:10.2f}  {'same' if same else 'DIFFER'}"
                  f" ({len(parse_ids(first))} tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
