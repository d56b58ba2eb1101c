"""A bounded load test of ``quantscope serve`` on loopback: many clients, random disconnects and malformed bodies
mixed in; every completed reply must be the text its prompt gives when run alone (nothing lost or mixed up), the
server must stay up, and its memory must come back flat. Prints the figures; exit status 1 on any failure.

Usage: python tests/bench/serve_load.py [MODEL] [--clients 16] [--requests 20] [--parallel 4] [--threads N]
(MODEL: a catalogue name or a GGUF path; default smollm2)
"""

from __future__ import annotations

import argparse
import gc
import http.client
import json
import random
import sys
import threading
import time
from pathlib import Path

from quantscope.core import catalog
from quantscope.core.bench import rss_bytes
from quantscope.core.engine.generate import Engine
from quantscope.core.server import Server

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "The three primary colours are",
           "In 1969, the first", "My favourite food is", "Water boils at", "The quick brown fox"]
MALFORMED = [b"{not json", b"[1,2]", b'{"prompt": 5}', b'{"prompt": "x", "temperature": -3}', b"\xff\xfe",
             b'{"prompt": "x", "max_tokens": "many"}', b"[" * 50_000]


def post(port: int, body: bytes, stream_close_after: int | None = None) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        if stream_close_after is not None:
            for _ in range(stream_close_after):
                r.readline()
            return r.status, ""  # closed mid-stream
        return r.status, r.read().decode("utf-8", "replace")
    finally:
        conn.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="smollm2")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    path = Path(a.model) if Path(a.model).is_file() else catalog.model_path(a.model)
    eng = Engine(path, n_ctx=512, threads=a.threads, backend="cpu")
    srv = Server(eng, "m", port=0, parallel=a.parallel, max_queue=a.clients * 2)
    srv.start()
    port = srv.port
    body = {p: json.dumps({"prompt": p, "max_tokens": a.tokens, "temperature": 0}).encode() for p in PROMPTS}
    alone = {p: json.loads(post(port, body[p])[1])["choices"][0]["text"] for p in PROMPTS}
    gc.collect()
    rss0 = rss_bytes()
    counts = {"ok": 0, "wrong": 0, "refused": 0, "refused_wrong_status": 0, "disconnected": 0, "busy": 0,
              "failed": 0}
    lock = threading.Lock()
    errors: list[str] = []

    def client(ci: int) -> None:
        rng = random.Random(a.seed * 1000 + ci)
        for _ in range(a.requests):
            roll = rng.random()
            try:
                if roll < 0.15:
                    status, _text = post(port, rng.choice(MALFORMED))
                    key = "refused" if status == 400 else "refused_wrong_status"
                elif roll < 0.3:
                    p = rng.choice(PROMPTS)
                    req = json.dumps({"prompt": p, "max_tokens": 64, "temperature": 0.8, "stream": True}).encode()
                    post(port, req, stream_close_after=rng.randint(1, 6))
                    key = "disconnected"
                else:
                    p = rng.choice(PROMPTS)
                    status, text = post(port, body[p])
                    if status == 503:
                        key = "busy"
                    elif status != 200:
                        key = "failed"
                        errors.append(f"{status}: {text[:200]}")
                    else:
                        got = json.loads(text)["choices"][0]["text"]
                        key = "ok" if got == alone[p] else "wrong"
                        if key == "wrong":
                            errors.append(f"{p!r}: {got!r} != {alone[p]!r}")
            except OSError as exc:
                key = "failed"
                errors.append(f"{type(exc).__name__}: {exc}")
            with lock:
                counts[key] += 1

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    end = time.monotonic() + 30
    while (srv.scheduler.busy_slots or srv.scheduler.queued) and time.monotonic() < end:
        time.sleep(0.05)
    gc.collect()
    rss1 = rss_bytes()
    healthy = srv.scheduler.failure is None and post(port, body[PROMPTS[0]])[0] == 200
    m = srv.scheduler.metrics
    srv.stop()
    eng.close()
    total = a.clients * a.requests
    print(f"{a.clients} clients x {a.requests} requests ({total}) in {wall:.1f} s, {a.parallel} slots, "
          f"model {path.name}")
    print("  " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    print(f"  generated {m.generated_tokens} tokens, {m.batched_steps} batched steps, finished {m.finished}")
    print(f"  RSS {rss0 / 2**20:.1f} MiB before the load, {rss1 / 2**20:.1f} MiB after ({(rss1 - rss0) / 2**20:+.1f})")
    print(f"  server healthy afterwards: {healthy}")
    for e in errors[:10]:
        print("  error:", e)
    bad = counts["wrong"] or counts["failed"] or counts["refused_wrong_status"] or not healthy
    bad = bad or sum(counts.values()) != total
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
