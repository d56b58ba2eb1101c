"""The engine's slots and the thread that runs them: requests queue, join a free slot between decode steps, and
decode one token per slot per step.

Each slot has its own inference session (KV cache) and remembers the tokens in it: a request goes to the free
slot sharing the longest prefix with its prompt, and only the rest of the prompt is evaluated (a conversation
that continues evaluates its new turn only; ``cached`` in its usage); a request whose prompt another slot is
reading (a request's ``n`` choices) waits for it and copies that cache (:func:`copy_prefix`). Each step
evaluates at most ``prefill_chunk`` prompt tokens (shared in turn by the slots still reading their prompts, so a
long prompt delays the other slots' next tokens by one chunk per step, not by the whole prompt; 0: each prompt
is read whole in one step), then samples a token for every generating slot and evaluates all of them in one
batched forward pass (:func:`~quantscope.core.engine.batch.forward_batch`:
each weight read once for all slots; one forward per slot on the GPU or for recurrent models). A request whose
client went away (its ``cancel`` set) leaves its slot at the next step. A full queue is refused
(:class:`QueueFull`), and nothing here blocks the caller: events go out through ``Job.emit``.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..chat import Sampler, SamplerParams, TokenChoice, token_choice
from ..chat.channels import HarmonySplitter
from ..chat.tokens import common_prefix
from ..engine.batch import can_batch, forward_batch
from ..engine.generate import PREFILL_CHUNK, Engine
from ..engine.session import Session
from ..tokenizer import StreamDecoder
from .jsonmode import Schema, State, can_end, closed, feed, initial, step

#: constrained sampling looks this far down the logit order for more valid tokens once it has found one
SCAN = 4096
#: the prompt chunk of a request whose every prompt position's logits are kept (echo with logprobs)
LOGITS_CHUNK = 64
#: prompt tokens evaluated per step while other slots decode (``serve --prefill-chunk``)
DEFAULT_PREFILL_CHUNK = 256
#: the largest ``prefill_chunk`` accepted
MAX_PREFILL_CHUNK = 1 << 20


class QueueFull(Exception):
    """Every slot is busy and the queue holds its maximum: try again later."""


class ServerStopped(Exception):
    """The scheduler has stopped."""


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token for ``logprobs``: the text it added to the reply, its bytes, its log-probability
    (temperature 1, after the repetition penalty) and the most likely tokens as ``(text, bytes, logprob)``."""

    token: int
    text: str
    raw: bytes
    logprob: float
    top: tuple[tuple[str, bytes, float], ...] = ()


@dataclass
class Usage:
    """A request's counts and timings (llama-server's ``timings``)."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    prompt_ms: float = 0.0
    predicted_ms: float = 0.0
    queued_ms: float = 0.0


@dataclass
class Event:
    """A piece of a reply (``text``, ``reasoning`` for a harmony model's thinking, their tokens), or its end:
    ``done`` with ``finish_reason`` ("stop", "length", "cancelled" or "error" with ``error``) and ``usage``."""

    text: str = ""
    reasoning: str = ""
    tokens: list[TokenLogprob] = field(default_factory=list)
    done: bool = False
    finish_reason: str = ""
    usage: Usage | None = None
    error: str = ""
    stop_sequence: str = ""  # the stop string that ended the reply ("stop" for a stop string, not an end token)
    choice: int = 0  # which of a request's ``n`` choices (set by the receiver's ``emit``)
    #: the prompt's tokens with their logprobs (``Job.prompt_logprobs``; the first one's logprob is NaN: none)
    prompt: list[TokenLogprob] = field(default_factory=list)


@dataclass
class Job:
    """One request for the scheduler: its prompt tokens and sampling, and where its events go. ``emit`` is called
    on the scheduler's thread and must not block; ``cancel`` may be set from any thread."""

    ids: list[int]
    params: SamplerParams
    emit: Callable[[Event], None]
    max_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    logit_bias: dict[int, float] = field(default_factory=dict)
    harmony: bool = False  # split a harmony (gpt-oss) reply into thinking and answer
    json_schema: Schema | None = None  # hold the output to this schema (response_format)
    literal: frozenset[int] = frozenset()  # special tokens written as their text (a template's tool-call tags)
    ends: frozenset[int] = frozenset()  # more tokens that end generation (a fill-in-the-middle's pad and separators)
    prompt_logprobs: bool = False  # send the prompt's tokens' logprobs first (its cache is not reused: read whole)
    #: called on the scheduler's thread with each token sampled (id, the text it added, its channel, how the
    #: sampler saw it when ``params.alternatives`` is set) and, id None, with text flushed at the end
    on_token: Callable[[int | None, str, str, TokenChoice | None], None] | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    queued_at: float = field(default_factory=time.perf_counter)
    slot: int = -1


@dataclass
class Metrics:
    """Running totals for /metrics (written by the scheduler's thread; read anywhere)."""

    requests: int = 0
    finished: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0  # evaluated (cached ones are counted apart)
    cached_tokens: int = 0
    generated_tokens: int = 0
    prompt_seconds: float = 0.0
    generation_seconds: float = 0.0
    rejected_full: int = 0
    batched_steps: int = 0  # steps whose tokens went through one batched forward pass
    drafted_tokens: int = 0  # speculative decoding (``Engine.speculate``): tokens proposed
    accepted_tokens: int = 0  # ... and accepted


class _Run:
    """A job's state while it has a slot."""

    def __init__(self, job: Job, engine: Engine, n_cached: int, pending: list[int]) -> None:
        self.job = job
        p = job.params
        self.sampler = Sampler(p, prompt_len=len(job.ids))
        self.decoder = StreamDecoder(engine.tokenizer, special=p.special)
        self.hide = frozenset() if p.special else engine.markers
        self.eog = engine.eog | job.ends if job.ends else engine.eog
        self.split = HarmonySplitter(engine.harmony) if job.harmony and engine.harmony is not None else None
        self.pending = pending
        self.logits: np.ndarray | None = None
        self.history = list(job.ids)
        self.usage = Usage(prompt_tokens=len(job.ids), cached_tokens=n_cached)
        self.usage.queued_ms = (time.perf_counter() - job.queued_at) * 1e3
        self.t0 = time.perf_counter()
        self.t_gen = 0.0
        self.text = ""  # the answer so far; ``sent`` characters of it are out
        self.sent = 0
        self.stopped_by = ""  # the stop string found in the text
        self.records: list[tuple[int, TokenLogprob]] = []  # (offset in text, record) not yet sent
        self.prompt: list[TokenLogprob] = []  # the prompt's records being made (``Job.prompt_logprobs``)
        self.json: State | None = initial(job.json_schema) if job.json_schema is not None else None
        self.bias: tuple[np.ndarray, np.ndarray] | None = None
        #: speculative decoding: tokens picked by a verification pass, not yet sent (all but the last in the cache)
        self.queue: list[tuple[int, TokenChoice | None]] = []
        if job.logit_bias:
            self.bias = (np.fromiter(job.logit_bias, np.int64), np.fromiter(job.logit_bias.values(), np.float32))


class Slot:
    """An inference session and the tokens in its KV cache."""

    def __init__(self, index: int, session: object) -> None:
        self.index = index
        self.session = session
        self.cached: list[int] = []
        self.memo: tuple[tuple[int, ...], np.ndarray] | None = None  # the last prompt and its logits
        self.run: _Run | None = None
        self.last_used = 0.0


def copy_prefix(src: object, dst: object, n: int) -> bool:
    """Copy the first ``n`` cached positions of session ``src`` into ``dst`` (the CPU engine's host caches, attention
    layers only); False, nothing done, where that is not possible (GPU sessions, recurrent layers)."""
    if (type(src) is not Session or type(dst) is not Session or src is dst or src.recurrent or dst.recurrent
            or src.model is not dst.model or src.n_past < n or dst.n_ctx < n):
        return False
    c = src.model.config
    for li in range(c.n_layers):
        if c.kv_source(li) == li:
            dst.k_cache[li][:n] = src.k_cache[li][:n]
            dst.v_cache[li][:n] = src.v_cache[li][:n]
    dst.n_past = n
    return True


def held_back(text: str, stops: list[str], start: int) -> int:
    """How many characters at the end of ``text`` (from ``start`` on) could begin a stop string."""
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text) - start), hold, -1):
            if text.endswith(s[:k]):
                hold = k
                break
    return hold


class Scheduler:
    """``n_slots`` sessions on ``engine`` and the thread that serves them (see the module's docstring)."""

    def __init__(self, engine: Engine, n_slots: int = 1, max_queue: int = 64, batch: bool = True,
                 prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> None:
        if not 1 <= n_slots <= 256:
            raise ValueError(f"parallel slots must be 1..256, not {n_slots}")
        if not 0 <= max_queue <= 1 << 16:
            raise ValueError(f"the queue must hold 0..65536 requests, not {max_queue}")
        if isinstance(prefill_chunk, bool) or not 0 <= prefill_chunk <= MAX_PREFILL_CHUNK:
            raise ValueError(f"the prefill chunk must be 0..{MAX_PREFILL_CHUNK} tokens, not {prefill_chunk}")
        self.engine = engine
        sessions = [engine.session] + [engine.new_session(engine.n_ctx) for _ in range(n_slots - 1)]
        self.slots = [Slot(i, s) for i, s in enumerate(sessions)]
        #: a prompt read in one slot can be copied into another (CPU sessions without recurrent layers)
        self._share = all(type(s) is Session and not s.recurrent for s in sessions)
        self.max_queue = max_queue
        #: decode the generating slots in one batched forward pass per step (CPU sessions; else one per slot)
        self.batch = batch
        #: prompt tokens evaluated per step, all reading slots together (0: every prompt whole in one step)
        self.prefill_chunk = prefill_chunk
        self._turn = 0  # the slot whose prompt is read first in the next step (the reading slots take turns)
        self.metrics = Metrics()
        self._queue: deque[Job] = deque()
        #: work on an idle slot's cache (save, restore, erase) run on this thread between steps (:meth:`slot_task`)
        self._tasks: list[tuple[int, Callable[[Slot], Any], Future[Any]]] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="quantscope-serve", daemon=True)
        self._started = False
        self._token_bytes: list[bytes] | None = None
        self._first_byte: np.ndarray | None = None
        self._spec_run: _Run | None = None  # the request the engine's speculator last proposed for
        #: set (with the exception) when the loop died of a bug: /health reports it
        self.failure: BaseException | None = None
        #: called on the scheduler's thread before each step, after queued jobs were given free slots, without the
        #: lock held (``submit`` goes on): tests observe the slots or hold the loop at an exact point
        self.before_step: list[Callable[[], None]] = []

    # ------------------------------------------------------------------ control
    def start(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()

    def stop(self, timeout: float = 30.0, wait: bool = True) -> None:
        """Stop the thread: queued and running requests end with ``finish_reason`` "cancelled" (after the
        step in progress); ``wait``: until it has ended (at most ``timeout`` seconds)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._started and wait:
            self._thread.join(timeout)

    @property
    def stopping(self) -> bool:
        """Stopped or stopping: no request is accepted any more."""
        return self._stopping

    def submit(self, job: Job) -> None:
        """Queue ``job``; :class:`QueueFull` when every slot is busy and the queue is full."""
        with self._cond:
            if self._stopping:
                raise ServerStopped("the server is shutting down")
            busy = sum(s.run is not None for s in self.slots)
            if busy + len(self._queue) >= len(self.slots) + self.max_queue:
                self.metrics.rejected_full += 1
                raise QueueFull(f"all {len(self.slots)} slots are busy and {len(self._queue)} requests wait")
            self.metrics.requests += 1
            self._queue.append(job)
            self._cond.notify_all()

    def slot_task(self, index: int, fn: Callable[[Slot], Any]) -> Future[Any]:
        """Run ``fn(slot)`` on the scheduler's thread between steps once slot ``index`` is idle (before any queued
        request joins it); its result or exception comes in the future returned (:class:`ServerStopped` when the
        scheduler stops first). ``IndexError`` for a slot that does not exist."""
        if not 0 <= index < len(self.slots):
            raise IndexError(f"no slot {index}")
        fut: Future[Any] = Future()
        with self._cond:
            if self._stopping:
                raise ServerStopped("the server is shutting down")
            self._tasks.append((index, fn, fut))
            self._cond.notify_all()
        return fut

    def wake(self) -> None:
        """Have the thread look at the jobs again (a cancel of a queued job is seen at once)."""
        with self._cond:
            self._cond.notify_all()

    @property
    def busy_slots(self) -> int:
        return sum(s.run is not None for s in self.slots)

    @property
    def queued(self) -> int:
        return len(self._queue)

    # ------------------------------------------------------------------ the thread
    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    while (not self._stopping and not self._queue and not self._tasks
                           and all(s.run is None for s in self.slots)):
                        self._cond.wait()
                    if self._stopping:
                        break
                    tasks = [t for t in self._tasks if self.slots[t[0]].run is None]
                    self._tasks = [t for t in self._tasks if self.slots[t[0]].run is not None]
                for index, fn, fut in tasks:  # (without the lock: a file's reading does not hold up submit)
                    if fut.set_running_or_notify_cancel():
                        try:
                            fut.set_result(fn(self.slots[index]))
                        except Exception as exc:
                            fut.set_exception(exc)
                with self._cond:
                    if self._stopping:
                        break
                    self._admit()
                if tasks and not any(s.run is not None for s in self.slots):
                    continue  # (only slot tasks were run: nothing to step)
                for hook in self.before_step:
                    hook()
                self._step()
        except BaseException as exc:  # a bug: every request ends with an error, /health says so
            self.failure = exc
            raise
        finally:
            with self._cond:
                self._stopping = True
                jobs = list(self._queue)
                self._queue.clear()
                tasks, self._tasks = self._tasks, []
            for _i, _fn, fut in tasks:
                if fut.set_running_or_notify_cancel():
                    fut.set_exception(ServerStopped("the server stopped"))
            why = f"server error: {self.failure}" if self.failure is not None else ""
            for job in jobs:
                self._drop(job, "error" if why else "cancelled", why)
            for slot in self.slots:
                if slot.run is not None:
                    self._finish(slot, "error" if why else "cancelled", why)

    def _admit(self) -> None:
        """Queued jobs into free slots (called with the lock held): each to the free slot whose cache shares
        the longest prefix with its prompt (the least recently used among equals); cancelled jobs (their clients
        gone while they waited) are dropped wherever they are in the queue."""
        if any(job.cancel.is_set() for job in self._queue):
            keep: deque[Job] = deque()
            gone: list[Job] = []
            for job in self._queue:
                (gone if job.cancel.is_set() else keep).append(job)
            self._queue = keep
            for job in gone:
                self._drop(job, "cancelled")
        while self._queue:
            job = self._queue[0]
            free = [s for s in self.slots if s.run is None]
            if not free:
                return
            if self._share and any(s.run is not None and s.run.pending and s.run.job.ids == job.ids
                                   for s in self.slots):
                return  # the same prompt is being read in another slot (``n`` choices): copy its cache once read
            self._queue.popleft()
            slot = max(free, key=lambda s: (common_prefix(s.cached, job.ids), -s.last_used))
            try:
                self._start(slot, job)
            except BaseException:
                self._queue.appendleft(job)  # not lost in between: the loop's end answers it with the error
                raise

    def _start(self, slot: Slot, job: Job) -> None:
        ids = job.ids
        s = slot.session
        common = common_prefix(slot.cached, ids) if not job.prompt_logprobs else 0
        memo = slot.memo if not job.prompt_logprobs else None
        if common >= len(ids) and memo is not None and memo[0] == tuple(ids):
            s.truncate(len(ids))  # type: ignore[attr-defined]
        if common >= len(ids) and memo is not None and memo[0] == tuple(ids) and s.n_past == len(ids):  # type: ignore[attr-defined]
            # the same prompt again: its logits as computed then (a seed reproduces its text exactly)
            run = _Run(job, self.engine, len(ids), [])
            run.logits = memo[1].copy()
            slot.cached = list(ids)
        elif (not job.prompt_logprobs and (src := self._prompt_read(slot, ids)) is not None
              and copy_prefix(src.session, s, len(ids))):
            # the same prompt read in another slot (a request's ``n`` choices): its cache and logits, copied
            assert src.memo is not None
            run = _Run(job, self.engine, len(ids), [])
            run.logits = src.memo[1].copy()
            slot.cached, slot.memo = list(ids), (tuple(ids), src.memo[1].copy())
        else:
            common = min(common, len(ids) - 1)
            s.truncate(common)  # type: ignore[attr-defined]
            common = min(common, s.n_past)  # type: ignore[attr-defined]  # recurrent layers: a checkpoint or 0
            slot.cached = slot.cached[:common]
            run = _Run(job, self.engine, common, list(ids[common:]))
        job.slot = slot.index
        slot.run = run

    def _prompt_read(self, slot: Slot, ids: list[int]) -> Slot | None:
        """Another slot whose cache begins with all of ``ids`` and which kept the logits after them, if one does and
        this slot's own cache shares less with ``ids``."""
        key = tuple(ids)
        if common_prefix(slot.cached, ids) >= len(ids) - 1:
            return None
        for other in self.slots:
            if (other is not slot and other.memo is not None and other.memo[0] == key
                    and other.cached[:len(ids)] == ids and (other.run is None or not other.run.pending)):
                return other
        return None

    def _prefill_shares(self) -> dict[int, int]:
        """How many prompt tokens each reading slot evaluates this step (slot index -> count): ``prefill_chunk``
        in all, given in turn from :attr:`_turn` on (a slot's share is the rest of its prompt when that is less);
        every pending prompt whole when chunking is off."""
        n = len(self.slots)
        order = [self.slots[(self._turn + i) % n] for i in range(n)]
        reading = [s for s in order if s.run is not None and s.run.pending and not s.run.job.cancel.is_set()]
        if not self.prefill_chunk:
            return {s.index: len(s.run.pending) for s in reading}  # type: ignore[union-attr]
        budget, shares = self.prefill_chunk, dict[int, int]()
        for s in reading:
            if budget <= 0:
                break
            assert s.run is not None
            shares[s.index] = take = min(budget, len(s.run.pending))
            budget -= take
        if reading:  # the next step starts after the first slot served this time
            self._turn = (reading[0].index + 1) % n
        return shares

    def _step(self) -> None:
        """One step: prompt tokens for the slots still reading their prompts (:meth:`_prefill_shares`), then a
        token sampled for each slot generating and all those tokens evaluated together (:func:`forward_batch`
        on the CPU; one forward per slot where batching is not possible)."""
        ready: list[tuple[Slot, int]] = []
        shares = self._prefill_shares()
        for slot in self.slots:
            run = slot.run
            if run is None:
                continue
            if run.job.cancel.is_set():
                self._finish(slot, "cancelled")
                continue
            try:
                if run.pending:
                    if slot.index in shares:
                        self._prefill(slot, run, shares[slot.index])
                    continue
                tid = self._sample(slot, run)
            except Exception as exc:  # a native failure ends this request only
                self._finish(slot, "error", f"{type(exc).__name__}: {exc}")
                continue
            if tid is not None and not run.queue:  # (a token of a speculative pass's queue is in the cache)
                ready.append((slot, tid))
        if not ready:
            return
        if len(ready) == 1 and self._speculate(*ready[0]):
            return
        sessions = [slot.session for slot, _t in ready]
        if len(ready) > 1 and self.batch and can_batch(sessions):
            try:
                logits = forward_batch(sessions, [t for _s, t in ready])  # type: ignore[arg-type]
            except Exception as exc:
                for slot, _t in ready:
                    self._finish(slot, "error", f"{type(exc).__name__}: {exc}")
                return
            self.metrics.batched_steps += 1
            for i, (slot, tid) in enumerate(ready):
                assert slot.run is not None
                slot.run.logits = logits[i]
                slot.cached.append(tid)
            return
        for slot, tid in ready:
            try:
                assert slot.run is not None
                slot.run.logits = slot.session.forward([tid])  # type: ignore[attr-defined]
                slot.cached.append(tid)
            except Exception as exc:
                self._finish(slot, "error", f"{type(exc).__name__}: {exc}")

    def _speculate(self, slot: Slot, tid: int) -> bool:
        """Evaluate ``tid`` with the engine's speculative proposals after it (``Engine.speculate``; when one slot
        generates and its output is not constrained by a schema or a logit bias); False when not used."""
        spec, run = self.engine.speculator, slot.run
        if spec is None or run is None or run.json is not None or run.bias is not None:
            return False
        if self._spec_run is not run:  # (one speculator for the slots: its draft follows the slot it serves)
            spec.begin(run.job.params)
            self._spec_run = run
        room = (run.job.max_tokens - run.usage.completion_tokens if run.job.max_tokens is not None
                else slot.session.n_ctx)  # type: ignore[attr-defined]
        d0, a0 = spec.stats.drafted, spec.stats.accepted
        try:
            run.queue = spec.step(slot.session, run.sampler, run.history, room, run.eog)  # type: ignore[arg-type]
        except Exception as exc:
            self._finish(slot, "error", f"{type(exc).__name__}: {exc}")
            return True
        slot.cached += [tid] + [t for t, _c in run.queue[:-1]]
        self.metrics.drafted_tokens += spec.stats.drafted - d0
        self.metrics.accepted_tokens += spec.stats.accepted - a0
        return True

    def _prefill(self, slot: Slot, run: _Run, count: int) -> None:
        """Evaluate the next ``count`` tokens of the slot's prompt, in forward calls of at most
        ``PREFILL_CHUNK`` tokens (the block's scratch memory)."""
        # (every position's logits for an echo with logprobs: smaller calls, a vocabulary-wide row per token)
        size = PREFILL_CHUNK if not run.job.prompt_logprobs else LOGITS_CHUNK
        while count > 0 and run.pending:
            n = min(size, count)
            self._prefill_call(slot, run, n)
            count -= n

    def _prefill_call(self, slot: Slot, run: _Run, size: int) -> None:
        chunk, run.pending = run.pending[:size], run.pending[size:]
        last = not run.pending
        slot.memo = None
        if run.job.prompt_logprobs:
            start = len(slot.cached)
            rows = slot.session.forward(chunk, all_logits=True)  # type: ignore[attr-defined]
            self._prompt_records(run, start, chunk, rows)
            out = rows[-1]
        else:
            out = slot.session.forward(chunk, logits=last)  # type: ignore[attr-defined]
        slot.cached.extend(chunk)
        if last:
            run.logits = out
            slot.memo = (tuple(run.job.ids), out.copy())
            checkpoint = getattr(slot.session, "checkpoint", None)
            if checkpoint is not None:  # recurrent layers: the state after the prompt, to come back to
                checkpoint()

    def _prompt_records(self, run: _Run, start: int, chunk: list[int], rows: np.ndarray) -> None:
        """The logprobs of the prompt's tokens ``start…`` (``chunk``, whose logits are ``rows``): each token's under
        the logits before it (temperature 1, no penalty), the first token's none (NaN); sent with the last chunk."""
        tok, ids, k = self.engine.tokenizer, run.job.ids, run.job.top_logprobs

        def lp(p: float) -> float:
            return math.log(p) if p > 0 else -9999.0

        def text(t: int) -> str:
            return tok.token_bytes(t, False).decode("utf-8", "replace")

        if start == 0:
            run.prompt = [TokenLogprob(ids[0], text(ids[0]), tok.token_bytes(ids[0], True), math.nan)]
        for j in range(len(chunk)):
            pos = start + j + 1  # the token these logits predict
            if pos >= len(ids):
                break
            t = ids[pos]
            c = token_choice(rows[j], t, 1.0, k, run.sampler._scratch)
            top = tuple((text(a), tok.token_bytes(a, True), lp(p)) for a, p, _q in c.alternatives)
            run.prompt.append(TokenLogprob(t, text(t), tok.token_bytes(t, True), lp(c.prob), top))
        if start + len(chunk) >= len(ids):
            self._emit(run.job, Event(prompt=run.prompt))
            run.prompt = []

    def _sample(self, slot: Slot, run: _Run) -> int | None:
        """Sample the slot's next token and send what it adds; the token to evaluate next, or None when the
        request has ended."""
        eng, job = self.engine, run.job
        if not run.t_gen:
            run.t_gen = time.perf_counter()
            run.usage.prompt_ms = (run.t_gen - run.t0) * 1e3
        if job.max_tokens == 0:  # (llama-server's n_predict 0: the prompt is read, nothing generated)
            self._finish(slot, "length")
            return None
        assert run.logits is not None
        logits = run.logits
        if run.bias is not None:
            logits = logits.astype(np.float32, copy=True)
            np.add.at(logits, run.bias[0], run.bias[1])
        if run.json is not None:
            picked = self._pick_json(run, logits)
            if picked is None:
                self._finish(slot, "error", "no token continues the JSON output")
                return None
            tid = picked
            if tid not in run.eog:
                run.json = feed(run.json, self.token_bytes[tid])
        elif run.queue:  # picked by a speculative verification pass
            tid, run.sampler.last = run.queue.pop(0)
        else:
            tid = run.sampler.sample(logits, run.history)
        if tid in run.eog:
            self._finish(slot, "stop")
            return None
        run.history.append(tid)
        run.usage.completion_tokens += 1
        if tid in job.literal:
            delta = run.decoder.flush() + eng.tokenizer.token_bytes(tid, True).decode("utf-8", "replace")
        else:
            delta = "" if tid in run.hide else run.decoder.push(tid)
        channel = ""
        if run.split is not None:
            part = run.split.push(tid, delta)
            delta, channel = ("", "") if part is None else (part[1], part[0])
        if job.on_token is not None:
            self._tell(job, tid, delta, channel, run.sampler.last if job.params.alternatives > 0 else None)
        if channel:
            self._emit(job, Event(reasoning=delta))
        else:
            if job.logprobs:
                run.records.append((len(run.text), self._record(run, tid, delta)))
            run.text += delta
        if self._flush(run, final=False) or (run.json is not None and closed(run.json)):
            self._finish(slot, "stop")
            return None
        if job.max_tokens is not None and run.usage.completion_tokens >= job.max_tokens:
            self._finish(slot, "length")
            return None
        if not run.queue and slot.session.n_past >= slot.session.n_ctx:  # type: ignore[attr-defined]
            self._finish(slot, "length")
            return None
        return tid

    @property
    def token_bytes(self) -> list[bytes]:
        """Each token's bytes as output (control tokens: none), made on first use (constrained sampling)."""
        if self._token_bytes is None:
            tok = self.engine.tokenizer
            self._token_bytes = [tok.token_bytes(t, False) for t in range(tok.n_vocab)]
        return self._token_bytes

    @property
    def first_byte(self) -> np.ndarray:
        """Each token's first output byte (256: none), made on first use (constrained sampling)."""
        if self._first_byte is None:
            self._first_byte = np.fromiter((b[0] if b else 256 for b in self.token_bytes), np.int16)
        return self._first_byte

    def _pick_json(self, run: _Run, logits: np.ndarray) -> int | None:
        """A token that keeps the output valid for the request's schema: the sampler's pick when it does (up to
        8 tries, each refused token masked), else a pick among the most likely tokens that do (up to 64 of them,
        or ``top_k``, found in logit order within the first ``SCAN`` tokens once one is found). End of generation
        only where the JSON may end. Only tokens whose first byte may come next are tried in that search (256
        steps of the automaton tell which), so a value the model finds unlikely costs a few candidates per
        token, not a walk down the vocabulary."""
        state = run.json
        assert state is not None
        table, eog = self.token_bytes, run.eog

        def ok(t: int) -> bool:
            if t in eog:
                return can_end(state)
            b = table[t]
            return bool(b) and feed(state, b) is not None

        x = logits
        for _ in range(8):
            t = run.sampler.sample(x, run.history)
            if ok(t):
                return t
            if x is logits:
                x = np.array(logits, dtype=np.float32)
            x[t] = -np.inf
        want = max(64, run.job.params.top_k)
        first = np.array([step(state, c) is not None for c in range(256)] + [can_end(state)])
        order = np.argsort(-x, kind="stable")
        allowed: list[int] = []
        for seen, t in enumerate(order[first[self.first_byte[order]]]):
            if x[t] == -np.inf or len(allowed) >= want or (allowed and seen >= SCAN):
                break
            if ok(int(t)):
                allowed.append(int(t))
        if not allowed:
            return None
        masked = np.full_like(x, -np.inf)
        masked[allowed] = x[allowed]
        return run.sampler.sample(masked, run.history)

    def _record(self, run: _Run, tid: int, text: str) -> TokenLogprob:
        tok = self.engine.tokenizer
        c = run.sampler.last

        def lp(p: float) -> float:
            return math.log(p) if p > 0 else -9999.0

        if c is None:
            return TokenLogprob(tid, text, tok.token_bytes(tid, True), 0.0)
        top = tuple((tok.token_bytes(t, True).decode("utf-8", "replace"), tok.token_bytes(t, True), lp(p))
                    for t, p, _q in c.alternatives[: run.job.top_logprobs])
        return TokenLogprob(tid, text, tok.token_bytes(tid, True), lp(c.prob), top)

    def _flush(self, run: _Run, final: bool) -> bool:
        """Send the answer's text that can no longer turn out to be a stop string; True when one was found
        (the text ends before it)."""
        stops = run.job.params.stop
        start = max(0, run.sent - max((len(s) for s in stops), default=0))
        cut = min((i for i in (run.text.find(s, start) for s in stops) if i >= 0), default=-1)
        end = cut if cut >= 0 else len(run.text) - (0 if final else held_back(run.text, stops, run.sent))
        end = max(end, run.sent)
        recs = []
        while run.records and (run.records[0][0] < end or (run.records[0][0] == end and not run.records[0][1].text)):
            off, r = run.records.pop(0)
            if off + len(r.text) > end:  # a token that runs into the stop string: its part before it
                r = TokenLogprob(r.token, r.text[: end - off], r.raw, r.logprob, r.top)
            recs.append(r)
        if cut >= 0:
            run.records.clear()
            run.stopped_by = next(s for s in stops if run.text.find(s, start) == cut)
        if end > run.sent or recs:
            self._emit(run.job, Event(text=run.text[run.sent:end], tokens=recs))
            run.sent = end
        return cut >= 0

    def _finish(self, slot: Slot, reason: str, error: str = "") -> None:
        run = slot.run
        assert run is not None
        slot.run = None
        slot.last_used = time.perf_counter()
        if reason in ("stop", "length"):
            tail = run.decoder.flush()
            if run.split is None:
                run.text += tail
                if tail and run.job.on_token is not None:
                    self._tell(run.job, None, tail, "", None)
            self._flush(run, final=True)
        now = time.perf_counter()
        u = run.usage
        if run.t_gen:
            u.predicted_ms = (now - run.t_gen) * 1e3
        else:
            u.prompt_ms = (now - run.t0) * 1e3
        m = self.metrics
        m.finished[reason] = m.finished.get(reason, 0) + 1
        m.prompt_tokens += u.prompt_tokens - u.cached_tokens
        m.cached_tokens += u.cached_tokens
        m.generated_tokens += u.completion_tokens
        m.prompt_seconds += u.prompt_ms / 1e3
        m.generation_seconds += u.predicted_ms / 1e3
        self._emit(run.job, Event(done=True, finish_reason=reason, usage=u, error=error,
                                  stop_sequence=run.stopped_by if reason == "stop" else ""))

    def _drop(self, job: Job, reason: str, error: str = "") -> None:
        """End a job that never had a slot (counted as finished for /metrics)."""
        m = self.metrics
        m.finished[reason] = m.finished.get(reason, 0) + 1
        self._emit(job, Event(done=True, finish_reason=reason, usage=Usage(prompt_tokens=len(job.ids)), error=error))

    @staticmethod
    def _tell(job: Job, tid: int | None, text: str, channel: str, choice: TokenChoice | None) -> None:
        assert job.on_token is not None
        try:
            job.on_token(tid, text, channel, choice)
        except Exception:  # an observer's bug must not end the request
            job.on_token = None

    @staticmethod
    def _emit(job: Job, ev: Event) -> None:
        try:
            job.emit(ev)
        except Exception:  # the receiver is gone (its event loop closed): nobody to tell, stop generating
            job.cancel.set()
