"""Bounds on the connections uvicorn keeps open: a request must arrive whole (headers and body) within
``timeout`` seconds of its connection opening or of the previous response's end, else the connection is closed;
and beyond ``max_connections`` the connection that has waited longest for its client is closed at once, so a
crowd of half-sent requests cannot take every file descriptor and starve /health. Connections whose request is
being served (generating, queued, streaming) are never closed by either rule."""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from .. import sysinfo

#: the default read timeout, seconds
DEFAULT_TIMEOUT = 30.0
#: file descriptors left free besides the connections (the model's files, the loop, a burst of accepts)
FD_RESERVE = 32
#: connections accepted at most per event-loop turn (asyncio's accept loop): the cap closes the oldest ones a turn
#: or two later, so the descriptors in use overshoot it by a few bursts, within FD_RESERVE
ACCEPT_BURST = 8
#: the kernel's queue of connections not yet accepted
LISTEN_BACKLOG = 128
_seq = itertools.count()
log = logging.getLogger("uvicorn.error")


def default_max_connections() -> int:
    """As many connections as the open-file limit leaves room for (the descriptors already open and
    :data:`FD_RESERVE` kept apart), at most 1024 and at least 4. Windows: 1024 (its sockets are not C runtime
    descriptors, and no limit on them applies)."""
    if sysinfo.WINDOWS:
        return 1024
    soft = sysinfo.open_fd_limits()[0]
    if soft is None:  # unlimited, or no such limit known
        soft = 1 << 20
    used = sysinfo.open_fd_count()
    return max(4, min(1024, soft - (64 if used is None else used) - FD_RESERVE))


class BoundedH11(H11Protocol):
    """uvicorn's h11 protocol with the read timeout and the connection cap (see the module's docstring); the
    limits are class attributes, set by :func:`protocol_class`."""

    timeout: float = DEFAULT_TIMEOUT
    max_connections: int = 1024

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._timer: asyncio.TimerHandle | None = None
        self._order = 0
        super().connection_made(transport)
        self._arm()
        live = [c for c in self.connections if not c.transport.is_closing()]
        if len(live) > self.max_connections:
            waiting = [c for c in live if isinstance(c, BoundedH11) and c is not self and c._waiting()]
            victim = min(waiting, key=lambda c: c._order, default=self)
            victim._drop()

    def _waiting(self) -> bool:
        """Waiting for the client: for a request, or for the rest of one whose reply has not started."""
        c = self.cycle
        return c is None or c.response_complete or (c.more_body and not c.response_started)

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._order = next(_seq)
        self._timer = self.loop.call_later(self.timeout, self._expire)

    def _expire(self) -> None:
        self._timer = None
        if self._waiting():
            self._drop()

    def _drop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def on_response_complete(self) -> None:
        self._arm()  # the next request has ``timeout`` seconds
        super().on_response_complete()

    def shutdown(self) -> None:
        """The server is stopping: a connection waiting for its client is closed now, not after the timeout."""
        if self._waiting():
            self._drop()
        else:
            super().shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)


def protocol_class(timeout: float = DEFAULT_TIMEOUT, max_connections: int | None = None) -> type[BoundedH11]:
    """:class:`BoundedH11` with these limits (``max_connections`` None: :func:`default_max_connections`)."""
    if not timeout > 0:
        raise ValueError(f"the timeout must be positive, not {timeout}")
    n = default_max_connections() if max_connections is None else max_connections
    if n < 1:
        raise ValueError(f"the connection cap must be at least 1, not {n}")
    return type("BoundedH11", (BoundedH11,), {"timeout": float(timeout), "max_connections": n})


def quiet_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """asyncio logs a traceback for every accept() that runs out of file descriptors (other descriptors taken
    meanwhile; it retries a second later), and another when such a retry finds the server closed: one warning
    line a minute instead, and nothing for the retry."""
    last = [-math.inf]

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if str(context.get("message", "")).startswith("socket.accept() out of system resource"):
            if loop.time() - last[0] >= 60:
                last[0] = loop.time()
                log.warning("out of file descriptors: new connections wait a moment (see --max-connections)")
            return
        callback = getattr(context.get("handle"), "_callback", None)
        if getattr(callback, "__name__", "") == "_start_serving" and isinstance(context.get("exception"),
                                                                                 (OSError, ValueError)):
            return  # a retry after the server closed its socket
        loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
