"""Aggregate decode throughput of ``quantscope serve`` with 1, 2, 4 and 8 parallel clients, optionally side by
side with llama-server (``--llama-server BIN``, started with ``-np N``) on the same machine, interleaved.

Each client streams one completion of ``--tokens`` tokens (``ignore_eos``) from a short prompt; the figure is
all clients' tokens over the time from the first request to the last token. Figures only (no assertions).

``--long-prompt L``: instead, N decoding clients (``--clients``, its largest figure) stream ``--tokens`` tokens
each while one more client sends an L-token prompt once they are all generating; per ``--prefill-chunks`` value
(the server's ``prefill_chunk``: 0 = the whole prompt in one step, 512 = this server's step before chunked
prefill, 256 = the default) the decoding clients' inter-token latency (p50, p99, max, in ms) and the long
prompt's time to first token.

Usage: python tests/bench/bench_serve.py [MODEL …] [--clients 1,2,4,8] [--tokens 64] [--threads N] [--reps 2]
       [--llama-server PATH]        (MODEL: a catalogue name, a GGUF path, or synthetic:1b; default smollm2)
       python tests/bench/bench_serve.py [MODEL] --long-prompt 4096 --clients 4 [--prefill-chunks 0,512,256]
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from quantscope.core import catalog
from quantscope.core.cpu import cpu_name
from quantscope.core.engine.generate import Engine
from quantscope.core.server import Server

PROMPT = "Write a long story about a lighthouse keeper."


def stream_one(port: int, tokens: int, seed: int, done: list[float], counts: list[int]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = {"prompt": PROMPT, "max_tokens": tokens, "temperature": 0.8, "seed": seed, "stream": True,
            "ignore_eos": True, "n_predict": tokens}
    conn.request("POST", "/v1/completions", body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    n = 0
    for line in r:
        if line.startswith(b"data: {"):
            d = json.loads(line[6:])
            n += sum(1 for c in d.get("choices", []) if c.get("text"))
        elif line.startswith(b"data: [DONE]"):
            break
    conn.close()
    done.append(time.perf_counter())
    counts.append(n)


def aggregate(port: int, clients: int, tokens: int) -> float:
    done: list[float] = []
    counts: list[int] = []
    t0 = time.perf_counter()
    threads = [threading.Thread(target=stream_one, args=(port, tokens, 1 + i, done, counts)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # chunks may carry several tokens (a character split over tokens): count the tokens asked for
    return clients * tokens / (max(done) - t0)


def stream_times(port: int, body: dict[str, object], stamps: list[float]) -> None:
    """Stream one completion, appending each content chunk's arrival time to ``stamps``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    conn.request("POST", "/v1/completions", body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    for line in r:
        if line.startswith(b"data: {"):
            d = json.loads(line[6:])
            if any(c.get("text") for c in d.get("choices", [])):
                stamps.append(time.perf_counter())
        elif line.startswith(b"data: [DONE]"):
            break
    conn.close()


def long_prompt_run(port: int, clients: int, tokens: int, long_text: str) -> tuple[list[float], float]:
    """``clients`` decoding streams and, once each has its second token, one long prompt (one token out): the
    decoding streams' gaps between tokens (s) and the long prompt's time to its token (s)."""
    stamps: list[list[float]] = [[] for _ in range(clients)]
    threads = [threading.Thread(target=stream_times, args=(port, {
        "prompt": PROMPT, "max_tokens": tokens, "temperature": 0.8, "seed": 1 + i, "stream": True,
        "ignore_eos": True}, stamps[i])) for i in range(clients)]
    for t in threads:
        t.start()
    while any(len(s) < 2 for s in stamps):
        time.sleep(0.001)
    long_stamps: list[float] = []
    t0 = time.perf_counter()
    stream_times(port, {"prompt": long_text, "max_tokens": 1, "temperature": 0.0, "stream": True,
                        "ignore_eos": True}, long_stamps)
    ttft = long_stamps[0] - t0 if long_stamps else float("nan")
    for t in threads:
        t.join()
    gaps = [b - a for s in stamps for a, b in itertools.pairwise(s)]
    return gaps, ttft


def percentile(xs: list[float], q: float) -> float:
    ys = sorted(xs)
    return ys[min(len(ys) - 1, int(q * len(ys)))]


def long_prompt_bench(path: Path, a: argparse.Namespace) -> None:
    clients = max(int(x) for x in a.clients.split(","))
    chunks = [int(x) for x in a.prefill_chunks.split(",")]
    ctx = a.long_prompt + a.tokens + 64
    eng = Engine(path, n_ctx=ctx, threads=a.threads, backend="cpu")
    piece = eng.tokenizer.encode(PROMPT + " The keeper counted the ships that passed each night. ",
                                 add_special=False)
    ids = (piece * (a.long_prompt // len(piece) + 1))[: a.long_prompt]
    srv = Server(eng, "m", port=0, parallel=clients + 1)
    srv.start()
    rows: dict[int, list[tuple[list[float], float]]] = {c: [] for c in chunks}
    try:
        for rep in range(a.reps):
            for c in chunks:
                srv.scheduler.prefill_chunk = c
                # a fresh long prompt each run (its first token differs): no slot has it cached
                text = eng.tokenizer.decode([*piece[rep * len(chunks) + chunks.index(c):][:1], *ids])
                rows[c].append(long_prompt_run(srv.port, clients, a.tokens, text))
    finally:
        srv.stop()
        eng.close()
    print(f"\n{path.name}: {clients} decoding clients x {a.tokens} tokens, one {a.long_prompt}-token prompt "
          f"arriving while they decode; {a.reps} run(s) per setting, interleaved")
    print(f"{'prefill chunk':>14} {'ITL p50 ms':>11} {'ITL p99 ms':>11} {'ITL max ms':>11} {'long TTFT s':>12}")
    for c in chunks:
        gaps = [g for run, _t in rows[c] for g in run]
        ttft = statistics.median(t for _g, t in rows[c])
        label = "off (0)" if c == 0 else str(c)
        print(f"{label:>14} {percentile(gaps, 0.5) * 1e3:>11.1f} {percentile(gaps, 0.99) * 1e3:>11.1f} "
              f"{max(gaps) * 1e3:>11.1f} {ttft:>12.2f}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def llama_server(binary: str, model: Path, n: int, ctx: int, threads: int) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    cmd = [binary, "-m", str(model), "-np", str(n), "-c", str(ctx * n), "--port", str(port), "--host", "127.0.0.1"]
    if threads:
        cmd += ["-t", str(threads)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return proc, port
        except OSError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("llama-server did not start")


def model_path(name: str) -> Path:
    if name.startswith("synthetic:"):
        from quantscope.core.synthetic import ensure_synthetic

        return Path(ensure_synthetic(name.split(":", 1)[1]))
    return Path(name) if Path(name).is_file() else catalog.model_path(name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=["smollm2"])
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--llama-server", help="a llama-server binary to compare with (built from the pinned source)")
    ap.add_argument("--unbatched", action="store_true",
                    help="also run each N with the slots taking turns (one forward each), interleaved")
    ap.add_argument("--long-prompt", type=int, default=0, metavar="L",
                    help="the chunked-prefill benchmark: one L-token prompt among the decoding clients")
    ap.add_argument("--prefill-chunks", default="0,512,256", help="with --long-prompt: the settings compared")
    a = ap.parse_args()
    if a.long_prompt:
        print(f"CPU: {cpu_name()}, {os.cpu_count()} logical CPUs; threads {a.threads or 'default'}")
        for name in a.models:
            long_prompt_bench(model_path(name), a)
        return 0
    ns = [int(x) for x in a.clients.split(",")]
    print(f"CPU: {cpu_name()}, {os.cpu_count()} logical CPUs; threads {a.threads or 'default'}; "
          f"{a.tokens} tokens per client; best of {a.reps} interleaved runs")
    for name in a.models:
        path = model_path(name)
        eng = Engine(path, n_ctx=a.ctx, threads=a.threads, backend="cpu")
        srv = Server(eng, "m", port=0, parallel=max(ns))
        srv.start()
        ours: dict[int, list[float]] = {n: [] for n in ns}
        theirs: dict[int, list[float]] = {n: [] for n in ns}
        turns: dict[int, list[float]] = {n: [] for n in ns}
        for _ in range(a.reps):
            for n in ns:
                ours[n].append(aggregate(srv.port, n, a.tokens))
                if a.unbatched:
                    srv.scheduler.batch = False
                    turns[n].append(aggregate(srv.port, n, a.tokens))
                    srv.scheduler.batch = True
                if a.llama_server:
                    proc, port = llama_server(a.llama_server, path, n, a.ctx, a.threads)
                    try:
                        theirs[n].append(aggregate(port, n, a.tokens))
                    finally:
                        proc.kill()
                        proc.wait()
        srv.stop()
        eng.close()
        print(f"\n{path.name}")
        print(f"{'clients':>8} {'quantscope t/s':>15} {'x single':>9}"
              + (f" {'in turns t/s':>13}" if a.unbatched else "")
              + (f" {'llama-server':>13} {'ratio':>6}" if a.llama_server else ""))
        one = max(ours[ns[0]])
        for n in ns:
            best = max(ours[n])
            row = f"{n:>8} {best:>15.1f} {best / one:>9.2f}"
            if a.unbatched:
                row += f" {max(turns[n]):>13.1f}"
            if a.llama_server:
                peer = max(theirs[n])
                row += f" {peer:>13.1f} {best / peer:>6.2f}"
            print(row + f"   (runs: {', '.join(f'{x:.1f}' for x in ours[n])}; median {statistics.median(ours[n]):.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
