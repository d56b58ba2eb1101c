"""Chunked prefill in the server's scheduler: while a 4K-token prompt arrives in one slot, another slot that is
generating gets its next token after at most one chunk of that prompt (counted in prompt tokens evaluated between
its tokens, not timed); without chunking the whole prompt comes between two of its tokens; greedy output is the
same token for token either way. SmolLM2 on the CPU engine."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from quantscope.cli import serve as cli_serve
from quantscope.core.chat import SamplerParams
from quantscope.core.engine.generate import Engine
from quantscope.core.server.scheduler import DEFAULT_PREFILL_CHUNK, MAX_PREFILL_CHUNK, Event, Job, Scheduler

LONG = 4096
TEXT = ("The river runs past the old mill, where the miller keeps his accounts in a ledger bound in green cloth. "
        "Each morning he counts the sacks, writes the numbers down, and walks to the bridge to watch the water. ")


@pytest.fixture(scope="module")
def engine(model_path: Any) -> Iterator[Engine]:
    eng = Engine(model_path("smollm2"), n_ctx=LONG + 128, threads=1, backend="cpu")
    yield eng
    eng.close()


def _long_prompt(eng: Engine) -> list[int]:
    ids: list[int] = []
    piece = eng.tokenizer.encode(TEXT, add_special=False)
    while len(ids) < LONG:
        ids += piece
    return ids[:LONG]


def _run(eng: Engine, chunk: int) -> tuple[list[int], list[int], list[int]]:
    """Slot 0 generates 48 greedy tokens; at its first token a 4K-token prompt arrives for slot 1 (8 tokens).
    Returns slot 0's tokens, slot 1's tokens and, at each of slot 0's tokens, how many of slot 1's prompt tokens
    had been evaluated."""
    sched = Scheduler(eng, n_slots=2, max_queue=4, prefill_chunk=chunk)
    greedy = SamplerParams(temperature=0.0)
    no_end = {t: -1e9 for t in eng.eog}
    done = [threading.Event(), threading.Event()]
    toks: list[list[int]] = [[], []]
    progress: list[int] = []
    long_job = Job(_long_prompt(eng), greedy, lambda ev: _end(ev, done[1]), max_tokens=8, logit_bias=no_end,
                   on_token=lambda t, _x, _c, _a: _keep(toks[1], t))

    def on_a(t: int | None, _x: str, _c: str, _a: Any) -> None:
        if t is None:
            return
        toks[0].append(t)
        progress.append(len(sched.slots[1].cached) if long_job.slot == 1 else 0)
        if len(toks[0]) == 1:
            sched.submit(long_job)  # (on the scheduler's thread: it joins a slot before the next step)

    first = Job(eng.tokenizer.encode("Count slowly from one to fifty:"), greedy, lambda ev: _end(ev, done[0]),
                max_tokens=48, logit_bias=no_end, on_token=on_a)
    sched.start()
    try:
        sched.submit(first)
        assert done[0].wait(3600) and done[1].wait(3600)  # (a cap for a hung scheduler only: 290 s at load 20)
    finally:
        sched.stop()
    assert long_job.slot == 1
    return toks[0], toks[1], progress


def _end(ev: Event, flag: threading.Event) -> None:
    if ev.done:
        assert ev.finish_reason == "length", ev.error
        flag.set()


def _keep(out: list[int], t: int | None) -> None:
    if t is not None:
        out.append(t)


def test_a_long_prompt_delays_a_generating_slot_by_one_chunk_at_most(engine: Engine) -> None:
    a_chunked, b_chunked, seen = _run(engine, DEFAULT_PREFILL_CHUNK)
    steps = [y - x for x, y in itertools.pairwise(seen)]
    assert seen[-1] == LONG + 8 - 1  # the whole prompt and slot 1's own tokens, all while slot 0 generated
    assert max(steps) <= DEFAULT_PREFILL_CHUNK
    assert sum(s == DEFAULT_PREFILL_CHUNK for s in steps) == LONG // DEFAULT_PREFILL_CHUNK  # one chunk per step
    a_whole, b_whole, seen_whole = _run(engine, 0)
    steps_whole = [y - x for x, y in itertools.pairwise(seen_whole)]
    assert max(steps_whole) == LONG  # off: the whole prompt between two of slot 0's tokens
    assert a_chunked == a_whole and b_chunked == b_whole  # greedy output unchanged
    assert len(a_chunked) == 48 and len(b_chunked) == 8


def test_chunk_bounds_and_the_cli_default(engine: Engine) -> None:
    for bad in (-1, MAX_PREFILL_CHUNK + 1, True):
        with pytest.raises(ValueError, match="prefill chunk"):
            Scheduler(engine, prefill_chunk=bad)
    assert (cli_serve.DEFAULT_PREFILL_CHUNK, cli_serve.MAX_PREFILL_CHUNK) == (DEFAULT_PREFILL_CHUNK,
                                                                              MAX_PREFILL_CHUNK)
