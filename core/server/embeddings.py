"""The server of an embedding model (issue 51): OpenAI's ``/v1/embeddings`` (and ``/embeddings``) on an
:class:`~quantscope.core.engine.encoder.Encoder`, ``/v1/models``, ``/health``, ``/tokenize``; the generation
endpoints of every dialect answer a 400 saying the model does not generate text.

The request checks, the API key, the body limit and the Host/Origin rules are the generative server's
(:class:`.app.ServerApp`'s helpers, :class:`.policy.Policy`). ``input`` is a string, an array of strings, an
array of token ids or an array of such arrays (at most :data:`MAX_INPUTS`); ``encoding_format`` ``float`` (the
default) or ``base64`` (little-endian float32 bytes, as OpenAI's); ``dimensions`` only as the model's own width
(no file here says it may be cut). Every input is checked (text, token ids in range, length within the
model's positions) before any is evaluated; evaluation runs off the event loop, one request at a time.
"""

from __future__ import annotations

import base64
import threading
import time
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..chat.tokens import piece_text
from ..engine.encoder import EmbedError, Encoder
from .app import GENERATION_PATHS, ServerApp, ServerConfig, StatusCounts, _error
from .errors import ApiError, bad_request, dialect_of
from .policy import Policy
from .protocol import parse_tokenize
from .requests import RequestLog

#: the most inputs one request may carry (OpenAI's limit)
MAX_INPUTS = 2048
#: the generation endpoints, refused on an embedding model in their own dialect
REFUSED_PATHS = tuple(sorted(GENERATION_PATHS))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_embedding_input(d: dict[str, Any]) -> list[str | list[int]]:
    """``input`` as a list of texts and token lists; a 400 naming what is wrong."""
    if "input" not in d:
        raise bad_request("'input' is required: a string, an array of strings or of token ids", "input")
    v = d["input"]
    if isinstance(v, str):
        return [v]
    if not isinstance(v, list) or not v:
        raise bad_request("'input' must be a string or a non-empty array (strings, token ids, arrays of ids)",
                          "input")
    if all(_is_int(x) for x in v):
        return [list(v)]
    if len(v) > MAX_INPUTS:
        raise bad_request(f"'input' holds {len(v)} inputs; at most {MAX_INPUTS} per request", "input")
    out: list[str | list[int]] = []
    for i, x in enumerate(v):
        if isinstance(x, str):
            out.append(x)
        elif isinstance(x, list) and all(_is_int(t) for t in x):
            out.append(list(x))
        else:
            raise bad_request(f"input[{i}] must be a string or an array of token ids", "input")
    return out


class EmbeddingApp(StatusCounts):
    """The endpoints over one encoder (see the module's docstring)."""

    # the generative server's plumbing, shared: the key, the body, the model's name
    _wrap = ServerApp._wrap
    _authorize = ServerApp._authorize
    _json = ServerApp._json
    _check_model = ServerApp._check_model

    def __init__(self, encoder: Encoder, config: ServerConfig) -> None:
        self.encoder = encoder
        self.config = config
        self.created = int(time.time())
        self.http_requests: dict[int, int] = {}
        tok = encoder.tokenizer
        self.log = RequestLog(lambda t: piece_text(tok.token_bytes(t, True)), trace=False)
        self._lock = threading.Lock()
        routes = [
            Route("/v1/models", self._wrap(self.models), methods=["GET"]),
            Route("/models", self._wrap(self.models), methods=["GET"]),
            Route("/v1/embeddings", self._wrap(self.embeddings), methods=["POST"]),
            Route("/embeddings", self._wrap(self.embeddings), methods=["POST"]),
            Route("/tokenize", self._wrap(self.tokenize), methods=["POST"]),
            Route("/health", self._wrap(self.health), methods=["GET"]),
            *[Route(p, self._wrap(self.refuse_generation), methods=["POST"]) for p in REFUSED_PATHS],
        ]

        async def http_error(request: Request, exc: Exception) -> Response:
            status = exc.status_code if isinstance(exc, HTTPException) else 500
            what = {404: f"no such endpoint: {request.url.path} (an embedding model: POST /v1/embeddings)",
                    405: f"{request.method} is not allowed on {request.url.path}"}.get(status, "request failed")
            return self._count(_error(ApiError(status, what), dialect_of(request.url.path)))

        self.app = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
        self.app.router.redirect_slashes = False
        self.asgi = Policy(self.app, config.host, config.allowed_hosts, config.cors_origins, count=self._count_status)

    async def models(self, request: Request) -> Response:
        c, e = self.encoder.config, self.encoder
        return JSONResponse({"object": "list", "data": [{
            "id": self.config.model_id, "object": "model", "created": self.created, "owned_by": "quantscope",
            "meta": {"arch": c.arch, "n_ctx": e.n_ctx, "n_ctx_train": c.n_ctx_train, "n_vocab": c.n_vocab,
                     "n_embd": c.n_embd, "pooling": e.pooling, "embedding": True, "backend": "cpu"}}]})

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def tokenize(self, request: Request) -> Response:
        content, add_special, _pieces = parse_tokenize(await self._json(request))
        ids = await run_in_threadpool(self.encoder.tokenizer.encode, content, add_special if add_special else False)
        return JSONResponse({"tokens": ids})

    async def refuse_generation(self, request: Request) -> Response:
        raise bad_request(f"{self.config.model_id} is an embedding model ({self.encoder.config.arch}, "
                          f"{self.encoder.pooling} pooling): it does not generate text; ask POST /v1/embeddings",
                          code="unsupported_endpoint")

    async def embeddings(self, request: Request) -> Response:
        d = await self._json(request)
        model = d.get("model")
        if model is not None and not isinstance(model, str):
            raise bad_request("'model' must be a string", "model")
        self._check_model(model)
        fmt = d.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise bad_request(f"'encoding_format' must be 'float' or 'base64', not {fmt!r}"[:200], "encoding_format")
        dims = d.get("dimensions")
        n_embd = self.encoder.n_embd
        if dims is not None and (not _is_int(dims) or dims != n_embd):
            raise bad_request(f"'dimensions': this model gives vectors of {n_embd} only (it does not say its vectors "
                              "may be cut)", "dimensions")
        if self.encoder.pooling == "none":
            raise bad_request(f"{self.config.model_id} has no pooling (pooling_type none): one vector per token, "
                              "not per input; serve it with --pooling mean, cls or last", "input")
        inputs = parse_embedding_input(d)
        enc = self.encoder
        try:
            seqs = [enc.check_ids(enc.tokenize(x) if isinstance(x, str) else x, f"input[{i}]")
                    for i, x in enumerate(inputs)]
        except EmbedError as exc:
            raise bad_request(str(exc), "input") from None

        def run() -> list[np.ndarray]:
            with self._lock:
                return enc.embed_ids(seqs, enc.pooling, 2)

        vecs = await run_in_threadpool(run)
        n_tokens = sum(len(s) for s in seqs)

        def encoded(v: np.ndarray) -> Any:
            if fmt == "base64":
                return base64.b64encode(np.ascontiguousarray(v, dtype="<f4").tobytes()).decode("ascii")
            return [float(x) for x in v]

        return JSONResponse({"object": "list", "model": self.config.model_id,
                             "data": [{"object": "embedding", "index": i, "embedding": encoded(v)}
                                      for i, v in enumerate(vecs)],
                             "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}})
