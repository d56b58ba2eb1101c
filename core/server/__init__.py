"""A local OpenAI-compatible server on the engine (Starlette on uvicorn): :class:`Server` binds, serves and stops
one model, :class:`PoolServer` several loaded on demand (:mod:`.models`); :mod:`.app` has the endpoints,
:mod:`.scheduler` the slots, :mod:`.protocol` the request checks, :mod:`.policy` the Host/Origin/CORS rules and
:mod:`.connections` the read timeout and the connection cap."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import uvicorn

from ..engine.encoder import Encoder
from ..engine.generate import Engine
from . import resources
from .app import DEFAULT_MAX_BODY, ServerApp, ServerConfig
from .connections import ACCEPT_BURST, DEFAULT_TIMEOUT, LISTEN_BACKLOG, protocol_class, quiet_accept_errors
from .embeddings import EmbeddingApp
from .errors import ApiError
from .models import LoadOptions, ModelPool, Offer, PoolApp, model_id_of
from .requests import RequestLog, RequestRecord
from .scheduler import DEFAULT_PREFILL_CHUNK, Scheduler

__all__ = ["DEFAULT_MAX_BODY", "DEFAULT_TIMEOUT", "ApiError", "EmbeddingServer", "LoadOptions", "ModelPool", "Offer",
           "PoolServer", "RequestLog", "RequestRecord", "Server", "ServerApp", "ServerConfig", "listen", "model_id_of"]

#: seconds the open requests get to end (streams with an error event, queued ones with a 503) once stopping
SHUTDOWN_GRACE = 30


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port`` (port 0: a free one); ``OSError`` when it cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, stopping gracefully: at SIGINT/SIGTERM (or :meth:`Server.stop`) it stops accepting and
    ``on_stop`` ends every request (streams with an error event and ``data: [DONE]``, queued ones with a 503)
    before the connections close; the signal is not raised again afterwards (no KeyboardInterrupt, exit 0)."""

    def __init__(self, config: uvicorn.Config, on_stop: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_stop = on_stop

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        before = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in before.items():
                signal.signal(sig, handler)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        quiet_accept_errors(asyncio.get_running_loop())
        await super().startup(sockets)  # asyncio listens with the accept burst as the backlog: the kernel's again
        for sock in sockets or []:
            sock.listen(LISTEN_BACKLOG)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._on_stop()
        await super().shutdown(sockets)


class _Serving:
    """uvicorn serving ``asgi`` on ``sock`` (or a socket bound to ``host:port``; port 0: a free one, read
    :attr:`port`): :meth:`serve_forever` on the calling thread until SIGINT/SIGTERM, :meth:`start` on a background
    thread until :meth:`stop`. ``on_stop`` ends the open requests when stopping; :meth:`_begin` and
    :meth:`_end` start and stop what serves them."""

    def _bind(self, asgi: Any, on_stop: Callable[[], None], host: str, port: int, log_level: str,
              sock: socket.socket | None, timeout: float, max_connections: int | None) -> None:
        protocol = protocol_class(timeout, max_connections)
        self.sock = sock if sock is not None else listen(host, port)
        self.host, self.port = host, int(self.sock.getsockname()[1])
        #: the connection cap in force
        self.max_connections = protocol.max_connections
        config = uvicorn.Config(asgi, log_level=log_level, access_log=False, lifespan="off",
                                timeout_graceful_shutdown=SHUTDOWN_GRACE, http=protocol, backlog=ACCEPT_BURST)
        self.uvicorn = _Uvicorn(config, on_stop)
        self._thread: threading.Thread | None = None

    def _begin(self) -> None: ...

    def _end(self) -> None: ...

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def serve_forever(self) -> None:
        """Serve until SIGINT (Ctrl-C) or SIGTERM, then end every request (see :class:`_Uvicorn`) and return."""
        self._begin()
        try:
            self.uvicorn.run(sockets=[self.sock])
        finally:
            self._end()
            self.sock.close()

    def start(self, timeout: float = 30.0) -> None:
        """Serve on a background thread; returns once the server accepts connections."""
        self._begin()
        self._thread = threading.Thread(target=self.uvicorn.run, kwargs={"sockets": [self.sock]},
                                        name="quantscope-http", daemon=True)
        self._thread.start()
        end = time.monotonic() + timeout
        while not self.uvicorn.started and self._thread.is_alive() and time.monotonic() < end:
            time.sleep(0.01)
        if not self.uvicorn.started:
            raise RuntimeError("the server did not start")


class Server(_Serving):
    """The server on ``engine``: ``parallel`` slots, bound to ``host:port`` (port 0: a free one, read
    :attr:`port`) or listening on ``sock`` (from :func:`listen`). The socket is bound here (``OSError`` when the
    address is taken); :meth:`serve_forever` serves on the calling thread until SIGINT/SIGTERM, :meth:`start` on a
    background thread until :meth:`stop`. Slots whose KV caches exceed the memory available are refused first
    (:class:`~.resources.NotEnoughMemory`). ``trace``: keep each reply's token records with alternatives in the
    request log (``app.log``); ``special_in_content``: control tokens' texts in messages and tools are control
    tokens (llama-server's way), not text. ``allowed_hosts``, ``cors_origins``: :mod:`.policy`; ``timeout``
    (seconds for a request to arrive whole) and ``max_connections`` (None: from the open-file limit):
    :mod:`.connections`. ``prefill_chunk``: prompt tokens read per step (:class:`~.scheduler.Scheduler`);
    ``slot_save_path``: the folder of ``/slots`` files, made if missing (None: that endpoint is refused,
    :mod:`.slots`)."""

    def __init__(self, engine: Engine, model_id: str, host: str = "127.0.0.1", port: int = 8080, parallel: int = 1,
                 api_key: str | None = None, max_queue: int = 64, max_body: int = DEFAULT_MAX_BODY,
                 log_level: str = "warning", trace: bool = False, special_in_content: bool = False, *,
                 sock: socket.socket | None = None, allowed_hosts: tuple[str, ...] = (),
                 cors_origins: tuple[str, ...] = (), timeout: float = DEFAULT_TIMEOUT,
                 max_connections: int | None = None, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                 slot_save_path: str | None = None) -> None:
        per_slot = resources.session_kv_bytes(engine.session)
        problem = None if per_slot is None else resources.kv_shortfall(per_slot, parallel,
                                                                      resources.available_memory(), engine.n_ctx)
        if problem is not None:
            raise resources.NotEnoughMemory(problem)
        if slot_save_path is not None:
            Path(slot_save_path).mkdir(parents=True, exist_ok=True)  # (as llama-server does)
        self.scheduler = Scheduler(engine, parallel, max_queue, prefill_chunk=prefill_chunk)
        self.app = ServerApp(engine, self.scheduler, ServerConfig(
            model_id, api_key, max_body, trace, host=host, allowed_hosts=tuple(allowed_hosts),
            cors_origins=tuple(cors_origins), special_in_content=special_in_content, slot_save_path=slot_save_path))
        self._bind(self.app.asgi, lambda: self.scheduler.stop(wait=False), host, port, log_level, sock, timeout,
                   max_connections)

    def _begin(self) -> None:
        self.scheduler.start()

    def _end(self) -> None:
        self.scheduler.stop()

    def stop(self) -> None:
        """End every request (streams with an error event, others with a 503), stop serving and close the
        socket."""
        self.scheduler.stop()
        self.uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(SHUTDOWN_GRACE + 5)
        self.sock.close()


class PoolServer(_Serving):
    """The server on the models of ``pool`` (:class:`~.models.ModelPool`), each loaded when a request names it;
    the other arguments as :class:`Server`'s (its policy, key and body limit are ``pool.config``'s)."""

    def __init__(self, pool: ModelPool, port: int = 8080, log_level: str = "warning", *,
                 sock: socket.socket | None = None, timeout: float = DEFAULT_TIMEOUT,
                 max_connections: int | None = None) -> None:
        self.pool = pool
        self.app = PoolApp(pool)
        self._bind(self.app.asgi, pool.stop, pool.config.host, port, log_level, sock, timeout, max_connections)

    def _end(self) -> None:
        self.pool.close()

    def stop(self) -> None:
        """End every request (streams with an error event, others with a 503), stop serving, unload every model
        and close the socket."""
        self.uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(SHUTDOWN_GRACE + 5)
        self.pool.close()
        self.sock.close()


class EmbeddingServer(_Serving):
    """The server of an embedding model (:mod:`.embeddings`): ``/v1/embeddings`` on ``encoder``, with the same
    binding, key, body limit, Host/Origin rules and connection handling as :class:`Server`."""

    def __init__(self, encoder: Encoder, model_id: str, host: str = "127.0.0.1", port: int = 8080,
                 api_key: str | None = None, max_body: int = DEFAULT_MAX_BODY, log_level: str = "warning", *,
                 sock: socket.socket | None = None, allowed_hosts: tuple[str, ...] = (),
                 cors_origins: tuple[str, ...] = (), timeout: float = DEFAULT_TIMEOUT,
                 max_connections: int | None = None) -> None:
        self.app = EmbeddingApp(encoder, ServerConfig(model_id, api_key, max_body, host=host,
                                                      allowed_hosts=tuple(allowed_hosts),
                                                      cors_origins=tuple(cors_origins)))
        self._bind(self.app.asgi, lambda: None, host, port, log_level, sock, timeout, max_connections)

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self.uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(SHUTDOWN_GRACE + 5)
        self.sock.close()
