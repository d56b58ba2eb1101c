"""A local OpenAI-compatible server on the engine (Starlette on uvicorn): :class:`Server` binds, serves and stops;
:mod:`.app` has the endpoints, :mod:`.scheduler` the slots, :mod:`.protocol` the request checks."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from ..engine.generate import Engine
from . import resources
from .app import DEFAULT_MAX_BODY, ServerApp, ServerConfig
from .errors import ApiError
from .requests import RequestLog, RequestRecord
from .scheduler import Scheduler

__all__ = ["DEFAULT_MAX_BODY", "ApiError", "RequestLog", "RequestRecord", "Server", "ServerApp", "ServerConfig",
           "model_id_of"]


def model_id_of(path: str | Path) -> str:
    """The model's name in the API: its file name without ``.gguf``."""
    name = Path(path).name
    return name[: -len(".gguf")] if name.lower().endswith(".gguf") else name


class Server:
    """The server on ``engine``: ``parallel`` slots, bound to ``host:port`` (port 0: a free one, read
    :attr:`port`). The socket is bound here (``OSError`` when the address is taken); :meth:`serve_forever` serves
    on the calling thread until interrupted, :meth:`start` on a background thread until :meth:`stop`. Slots whose KV
    caches exceed the memory available are refused first (:class:`~.resources.NotEnoughMemory`).
    ``trace``: keep each reply's token records with alternatives in the request log (``app.log``);
    ``special_in_content``: control tokens' texts in messages and tools are control tokens (llama-server's way),
    not text."""

    def __init__(self, engine: Engine, model_id: str, host: str = "127.0.0.1", port: int = 8080, parallel: int = 1,
                 api_key: str | None = None, max_queue: int = 64, max_body: int = DEFAULT_MAX_BODY,
                 log_level: str = "warning", trace: bool = False, special_in_content: bool = False) -> None:
        import uvicorn

        per_slot = resources.session_kv_bytes(engine.session)
        problem = None if per_slot is None else resources.kv_shortfall(per_slot, parallel,
                                                                      resources.available_memory(), engine.n_ctx)
        if problem is not None:
            raise resources.NotEnoughMemory(problem)
        self.scheduler = Scheduler(engine, parallel, max_queue)
        self.app = ServerApp(engine, self.scheduler, ServerConfig(model_id, api_key, max_body, trace,
                                                                  special_in_content=special_in_content))
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind((host, port))
            self.sock.listen(128)
        except OSError:
            self.sock.close()
            raise
        self.host, self.port = host, int(self.sock.getsockname()[1])
        config = uvicorn.Config(self.app.app, log_level=log_level, access_log=False, lifespan="off",
                                timeout_graceful_shutdown=3)
        self.uvicorn = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def serve_forever(self) -> None:
        """Serve until Ctrl-C / SIGTERM (uvicorn's handlers), then stop the slots."""
        self.scheduler.start()
        try:
            self.uvicorn.run(sockets=[self.sock])
        finally:
            self.scheduler.stop()
            self.sock.close()

    def start(self, timeout: float = 30.0) -> None:
        """Serve on a background thread; returns once the server accepts connections."""
        self.scheduler.start()
        self._thread = threading.Thread(target=self.uvicorn.run, kwargs={"sockets": [self.sock]},
                                        name="quantscope-http", daemon=True)
        self._thread.start()
        end = time.monotonic() + timeout
        while not self.uvicorn.started and self._thread.is_alive() and time.monotonic() < end:
            time.sleep(0.01)
        if not self.uvicorn.started:
            raise RuntimeError("the server did not start")

    def stop(self) -> None:
        """End every request (cancelled), stop serving and close the socket."""
        self.scheduler.stop()
        self.uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
        self.sock.close()
