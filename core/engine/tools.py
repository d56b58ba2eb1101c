"""Perplexity (llama-perplexity's procedure) and llama-bench-style throughput, on the engine."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..tokenizer import Tokenizer
from .session import Model


@dataclass
class PerplexityResult:
    ppl: float
    n_chunks: int
    n_ctx: int
    n_tokens_scored: int
    seconds: float
    chunk_ppl: list[float]


def perplexity(model: Model, tok: Tokenizer, text: str, n_ctx: int, max_chunks: int = 0,
               progress: Callable[[int, int, float], None] | None = None,
               make_session: Callable[[int], Any] | None = None) -> PerplexityResult:
    """Tokenize once (BOS per metadata); non-overlapping chunks of ``n_ctx`` tokens, each from an empty cache, the
    first token replaced by BOS when the model adds BOS; score only the second half of each chunk."""
    ids = tok.encode(text)
    n_chunks = len(ids) // n_ctx
    if max_chunks:
        n_chunks = min(n_chunks, max_chunks)
    if n_chunks == 0:
        raise ValueError(f"the text has {len(ids)} tokens; perplexity needs at least {n_ctx} (one chunk)")
    session = make_session(n_ctx) if make_session else model.session(n_ctx)
    first = n_ctx // 2
    nll_total, count = 0.0, 0
    per_chunk = []
    t0 = time.perf_counter()
    for c in range(n_chunks):
        chunk = list(ids[c * n_ctx : (c + 1) * n_ctx])
        if tok.add_bos and tok.bos_id is not None:
            chunk[0] = tok.bos_id
        session.reset()
        logits = session.forward(chunk, all_logits=True).astype(np.float64)
        lg = logits[first : n_ctx - 1]
        targets = np.asarray(chunk[first + 1 : n_ctx])
        mx = lg.max(axis=1, keepdims=True)
        logz = (mx[:, 0] + np.log(np.exp(lg - mx).sum(axis=1)))
        nll = logz - lg[np.arange(targets.size), targets]
        nll_total += float(nll.sum())
        count += int(targets.size)
        per_chunk.append(math.exp(float(nll.mean())))
        if progress:
            progress(c + 1, n_chunks, math.exp(nll_total / count))
    return PerplexityResult(math.exp(nll_total / count), n_chunks, n_ctx, count, time.perf_counter() - t0, per_chunk)


#: the untimed prefill that fills the cache to a depth runs in pieces of this many tokens
DEPTH_CHUNK = 512


def bench_test_name(test: str, n: int, depth: int) -> str:
    """llama-bench's name of a test: ``pp512``, ``tg64 @ d4096`` (the depth only when there is one)."""
    return f"{test}{n}" + (f" @ d{depth}" if depth else "")


def bench_model(model: Model, n_prompt: int = 128, n_gen: int = 64, repetitions: int = 3,
                seed: int = 0, make_session: Callable[[int], Any] | None = None,
                progress: Callable[[str, int, int], None] | None = None,
                depths: Sequence[int] = (0,)) -> list[dict[str, Any]]:
    """llama-bench-like: ``pp<n>`` a prefill of n random tokens and ``tg<n>`` n single-token decodes, each
    repeated; tokens/s mean and stddev. ``depths`` (llama-bench ``-d``): each test runs after that many tokens are
    already in the KV cache (filled by an untimed prefill of random tokens, once per depth; every repetition
    rewinds the cache to it with ``truncate``, a recurrent model's state from its ``checkpoint``), so ``tg<n> @
    d<d>`` decodes at positions d..d+n-1 and ``pp<n> @ d<d>`` prefills positions d..d+n-1. Rows in llama-bench's
    order: per depth, pp then tg, each with its ``n_depth``. ``progress(test, rep, reps)`` is called as each
    repetition starts (rep 0 is the warm-up)."""
    depths = [int(d) for d in depths]
    if not depths or min(depths) < 0:
        raise ValueError(f"depths must be non-negative, got {depths}")
    rng = np.random.default_rng(seed)
    c = model.config
    n_ctx = max(depths) + max(n_prompt, n_gen) + 8
    session = make_session(n_ctx) if make_session else model.session(n_ctx)
    out = []
    for depth in depths:
        session.reset()
        for start in range(0, depth, DEPTH_CHUNK):  # the cache to this depth, untimed
            session.forward(rng.integers(0, c.n_vocab, size=min(DEPTH_CHUNK, depth - start)))
        session.checkpoint()
        if session.n_past != depth:
            raise RuntimeError(f"the cache holds {session.n_past} positions after filling it to depth {depth}")
        for test, n in (("pp", n_prompt), ("tg", n_gen)):
            if n <= 0:
                continue
            name = bench_test_name(test, n, depth)
            rates = []
            for rep in range(repetitions + 1):  # first repetition warms up
                toks = rng.integers(0, c.n_vocab, size=n)
                if progress is not None:
                    progress(name, rep, repetitions)
                session.truncate(depth)
                if session.n_past != depth:
                    raise RuntimeError(f"{name}: the cache rewound to {session.n_past} positions, not {depth}")
                t0 = time.perf_counter()
                if test == "pp":
                    session.forward(toks)
                else:
                    for t in toks:
                        session.forward([int(t)])
                dt = time.perf_counter() - t0
                if rep:
                    rates.append(n / dt)
            out.append({"test": name, "n_tokens": n, "n_depth": depth,
                        "threads": model.threads, "tokens_per_s": statistics.mean(rates),
                        "stddev": statistics.stdev(rates) if len(rates) > 1 else 0.0, "repetitions": repetitions})
    return out
