"""A real server on 127.0.0.1 for the server tests: the model on the CPU engine, a free port, stopped and closed
on leaving."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from quantscope.core.engine.generate import Engine
from quantscope.core.server import Server, model_id_of


@contextlib.contextmanager
def serving(path: Any, n_ctx: int = 512, **server_args: Any) -> Iterator[Server]:
    """``Server(engine, model_id_of(path), port=0, **server_args)`` serving on a background thread."""
    eng = Engine(path, n_ctx=n_ctx, threads=1, backend="cpu")
    try:
        srv = Server(eng, model_id_of(path), port=0, **server_args)
        srv.start()
        try:
            yield srv
        finally:
            srv.stop()
    finally:
        eng.close()
