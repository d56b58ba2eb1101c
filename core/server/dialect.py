"""What the dialects other than OpenAI's (:mod:`.ollama`, :mod:`.anthropic`) take from the server
(:class:`~quantscope.core.server.app.ServerApp`) without importing it: the request in the scheduler, the pieces of a
reply and a whole reply, and the server's side they call, as a protocol."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import Response

from .protocol import GenRequest
from .scheduler import Event, Job


@dataclass
class Started:
    """A generation request in the scheduler: its job, the events it sends, and when the request arrived; with
    ``n`` > 1 (OpenAI's paths), the other choices' jobs, whose events come on the same queue (``Event.choice``)."""

    job: Job
    events: asyncio.Queue[Event]
    t0: float
    more: list[Job] = field(default_factory=list)

    @property
    def jobs(self) -> list[Job]:
        return [self.job, *self.more]


@dataclass
class Part:
    """A piece of a reply as the dialects other than OpenAI's stream it: text, thinking, a finished tool call
    (OpenAI's shape, ``arguments`` a JSON string), or the end (``end``, the last event)."""

    text: str = ""
    reasoning: str = ""
    call: dict[str, Any] | None = None
    end: Event | None = None


@dataclass
class Gathered:
    """A whole reply: its text, thinking, tool calls and last event."""

    text: str
    reasoning: str
    calls: list[dict[str, Any]]
    end: Event


class Host(Protocol):
    """The server as a dialect sees it (ServerApp): its configuration and engine, the request checks and error
    answers, and the one generation path every dialect shares."""

    config: Any
    engine: Any

    def _wrap(self, fn: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]: ...

    async def _json(self, request: Request) -> dict[str, Any]: ...

    def _check_model(self, name: str | None) -> None: ...

    def _failure(self, *args: Any, **kwargs: Any) -> Any: ...

    async def generation(self, *args: Any, **kwargs: Any) -> Any: ...

    def parts(self, *args: Any, **kwargs: Any) -> AsyncIterator[Part]: ...

    async def gather(self, request: Request, req: GenRequest, st: Started) -> Gathered: ...
