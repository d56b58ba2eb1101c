"""The server's request log: one :class:`RequestRecord` per generation request (its endpoint, client, state,
counts, timings, prompt and reply, and with ``trace`` on the reply's token records as the chat keeps them), the
last :data:`MAX_REQUESTS` kept. Written by the server's threads, read by anyone (the app's Requests panel polls
:attr:`RequestLog.version`); nothing here blocks."""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ..chat import TokenChoice
from ..chat.tokens import N_ALTERNATIVES, ReplyTrace, TokenRecord
from .errors import dialect_of
from .scheduler import Event, Job

#: finished requests kept in the log
MAX_REQUESTS = 200
#: token records kept over all requests: older requests' traces are dropped beyond it (each record holds its
#: alternatives: about a kilobyte)
MAX_TRACED_TOKENS = 65536
#: the states of a request that has ended
ENDED = frozenset({"stop", "length", "cancelled", "error", "refused"})


@dataclass(eq=False)
class RequestRecord:
    """One request. ``status``: "queued", "prompt" (being read), "generating", then how it ended: "stop",
    "length", "cancelled", "error" or "refused" (``http_status`` and ``error`` say why)."""

    seq: int
    endpoint: str
    client: str
    stream: bool = False
    prompt_ids: list[int] = field(default_factory=list)
    prompt_text: str = ""
    http_status: int = 200
    error: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    text: str = ""
    started: float = field(default_factory=time.time)  # wall clock, for display
    t0: float = field(default_factory=time.perf_counter)
    t_first: float = 0.0  # when the first token came
    t_end: float = 0.0
    gen_s: float = 0.0  # generation time as the scheduler measured it (set at the end)
    ended_as: str = ""
    trace: ReplyTrace | None = None
    job: Job | None = field(default=None, repr=False)

    @property
    def status(self) -> str:
        if self.ended_as:
            return self.ended_as
        if self.job is None or self.job.slot < 0:
            return "queued"
        return "generating" if self.completion_tokens else "prompt"

    @property
    def dialect(self) -> str:
        """The API the request spoke: "openai", "ollama" or "anthropic"."""
        return dialect_of(self.endpoint)

    @property
    def done(self) -> bool:
        return bool(self.ended_as)

    @property
    def duration(self) -> float:
        """Seconds from arrival to the end (or to now, while it runs)."""
        return (self.t_end or time.perf_counter()) - self.t0

    @property
    def tokens_per_second(self) -> float:
        """Generation speed: completion tokens over the time since the first one (0 before there is one)."""
        if self.gen_s > 0:
            return self.completion_tokens / self.gen_s
        if not self.t_first or self.completion_tokens < 2:
            return 0.0
        dt = (self.t_end or time.perf_counter()) - self.t_first
        return (self.completion_tokens - 1) / dt if dt > 0 else 0.0

    @property
    def records(self) -> list[TokenRecord]:
        """The reply's token records (empty without a trace, or once dropped for newer requests)."""
        return list(self.trace.records) if self.trace is not None else []


def trim_records(records: list[TokenRecord], text: str) -> list[TokenRecord]:
    """``records`` cut to the answer ``text`` actually sent (a stop string and what followed it are not part of
    the reply): answer records past its end go, one running over it keeps the part before; thinking stays."""
    out: list[TokenRecord] = []
    pos = 0
    for r in records:
        if r.channel:
            out.append(r)
            continue
        if pos >= len(text) and r.text:
            continue
        if pos + len(r.text) > len(text):
            r = replace(r, text=text[pos:])
        pos += len(r.text)
        out.append(r)
    return out


class RequestLog:
    """The last ``limit`` requests (see the module's docstring). ``piece(id)`` gives a token's own text for the
    traces; ``trace``: keep each reply's token records, with :data:`N_ALTERNATIVES` alternatives per token."""

    def __init__(self, piece: Callable[[int], str], trace: bool = False, limit: int = MAX_REQUESTS,
                 max_traced: int = MAX_TRACED_TOKENS) -> None:
        if limit < 1 or max_traced < 0:
            raise ValueError("the request log keeps at least one request")
        self.piece = piece
        self.trace = trace
        self.limit = limit
        self.max_traced = max_traced
        self._items: deque[RequestRecord] = deque()
        self._lock = threading.Lock()
        self._seq = itertools.count(1)
        #: bumped on every change: a reader polls it
        self.version = 0
        #: called with the record after each change of a request, on the thread that made it (the scheduler's for
        #: tokens and the end, the event loop's for the start): an observer that sees every state, however fast
        self.listeners: list[Callable[[RequestRecord], None]] = []

    def _changed(self, rec: RequestRecord) -> None:
        self.version += 1
        for listen in self.listeners:
            listen(rec)

    def __len__(self) -> int:
        return len(self._items)

    def _add(self, rec: RequestRecord) -> RequestRecord:
        with self._lock:
            self._items.append(rec)
            while len(self._items) > self.limit:
                self._items.popleft()
        self._changed(rec)
        return rec

    def open(self, endpoint: str, client: str, job: Job, prompt_text: str, stream: bool) -> RequestRecord:
        """Log ``job`` (just queued); with tracing on, its sampler keeps the alternatives the trace needs."""
        rec = RequestRecord(next(self._seq), endpoint, client, stream, list(job.ids), prompt_text,
                            prompt_tokens=len(job.ids), job=job)
        if self.trace:
            rec.trace = ReplyTrace(self.piece)
            job.params.alternatives = max(job.params.alternatives, N_ALTERNATIVES)
        return self._add(rec)

    def refused(self, endpoint: str, client: str, status: int, message: str) -> RequestRecord:
        """Log a request refused before it reached the engine."""
        rec = RequestRecord(next(self._seq), endpoint, client, http_status=status, error=message, ended_as="refused")
        rec.t_end = rec.t0
        return self._add(rec)

    def close_refused(self, rec: RequestRecord | None, status: int, message: str) -> None:
        """A logged request the scheduler would not take (a full queue, a server stopping); marks the error
        as logged."""
        if rec is None:
            return
        rec.http_status, rec.error, rec.ended_as, rec.job, rec.trace = status, message, "refused", None, None
        rec.t_end = time.perf_counter()
        self._changed(rec)

    def token(self, rec: RequestRecord, token: int | None, text: str, channel: str,
              choice: TokenChoice | None) -> None:
        """A generated token (or, ``token`` None, text flushed at the end), on the scheduler's thread."""
        if token is not None:
            if not rec.t_first:
                rec.t_first = time.perf_counter()
            rec.completion_tokens += 1
        if rec.trace is not None:
            rec.trace.add(token, text, channel, choice)
        self._changed(rec)

    def event(self, rec: RequestRecord, ev: Event) -> None:
        """An event of the request's reply, on the scheduler's thread."""
        rec.text += ev.text
        if ev.done:
            u = ev.usage
            if u is not None:
                rec.prompt_tokens, rec.cached_tokens = u.prompt_tokens, u.cached_tokens
                rec.completion_tokens, rec.gen_s = u.completion_tokens, u.predicted_ms / 1e3
            rec.error = ev.error
            rec.http_status = {"error": 500, "cancelled": 499}.get(ev.finish_reason, 200)
            if rec.trace is not None:
                rec.trace.records = trim_records(rec.trace.records, rec.text)
            rec.t_end = time.perf_counter()
            rec.ended_as = ev.finish_reason or "stop"
            rec.job = None
            self._bound_traces()
        self._changed(rec)

    def _bound_traces(self) -> None:
        """Drop the oldest finished traces while all of them hold more than ``max_traced`` records."""
        with self._lock:
            total = sum(len(r.trace.records) for r in self._items if r.trace is not None)
            for r in self._items:
                if total <= self.max_traced:
                    break
                if r.trace is not None and r.done:
                    total -= len(r.trace.records)
                    r.trace = None

    def records(self) -> list[RequestRecord]:
        """The requests kept, oldest first (a copy of the list; the records themselves are live)."""
        with self._lock:
            return list(self._items)

    def get(self, seq: int) -> RequestRecord | None:
        with self._lock:
            return next((r for r in self._items if r.seq == seq), None)
