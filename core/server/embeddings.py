"""The server of an embedding model (issue 51): OpenAI's ``/v1/embeddings`` (and ``/embeddings``) on an
:class:`~quantscope.core.engine.encoder.Encoder`, ``/v1/models``, ``/health``, ``/tokenize``; the generation
endpoints of every dialect answer a 400 saying the model does not generate text. A reranker (rank pooling)
answers ``/v1/rerank`` (and ``/rerank``, ``/v1/reranking``, ``/reranking``) in llama-server's shape instead:
``{model, query, documents, top_n, return_documents}`` → ``{model, object, results: [{index, relevance_score,
document?}], usage}``, the best first; a body with ``texts`` instead of ``documents`` is Text Embeddings
Inference's and is answered as TEI does (a bare list of ``{index, score, text?}``, ``return_text``).

The request checks, the API key, the body limit and the Host/Origin rules are the generative server's
(:class:`.app.ServerApp`'s helpers, :class:`.policy.Policy`). ``input`` is a string, an array of strings, an
array of token ids or an array of such arrays (at most :data:`MAX_INPUTS`); ``encoding_format`` ``float`` (the
default) or ``base64`` (little-endian float32 bytes, as OpenAI's); ``dimensions`` N in 1..n_embd keeps the first
N components and normalises them again (Matryoshka truncation, as OpenAI's text-embedding-3 and Ollama do: no
GGUF key says which widths a model was trained for, so every width is taken). Every input is checked (text,
token ids in range, length within the model's positions) before any is evaluated; evaluation runs off the event
loop, one request at a time.

Ollama's embedding endpoints are served beside them (:func:`parse_ollama_embed`): ``POST /api/embed`` (``input``
a string or an array of strings, ``truncate``, ``dimensions``, ``options.num_ctx``, ``keep_alive``; the answer
``{model, embeddings, total_duration, load_duration, prompt_eval_count}`` with unit vectors) and the legacy
``POST /api/embeddings`` (``prompt``; ``{embedding}`` not normalised, as Ollama's), their errors as Ollama's
``{"error": …}``; with what Ollama's clients ask first: ``GET /`` ("Ollama is running"), ``/api/version``,
``/api/tags`` and ``/api/ps`` (the model), ``POST /api/show`` (capabilities ``["embedding"]``, as Ollama says of
an embedding model).
"""

from __future__ import annotations

import base64
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from ..chat.tokens import piece_text
from ..engine.encoder import RANK, EmbedError, Encoder, normalize
from .app import GENERATION_PATHS, ServerApp, ServerConfig, StatusCounts, _error
from .errors import ApiError, bad_request, dialect_of
from .ollama import OLLAMA_VERSION, _keep_alive, model_entry
from .policy import Policy
from .protocol import parse_tokenize
from .requests import RequestLog

#: the most inputs one request may carry (OpenAI's limit)
MAX_INPUTS = 2048
#: the most documents one rerank request may carry
MAX_DOCUMENTS = MAX_INPUTS
#: the rerank endpoints (llama-server's four spellings)
RERANK_PATHS = ("/v1/rerank", "/rerank", "/v1/reranking", "/reranking")
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


@dataclass
class RerankRequest:
    """A checked rerank body: the query, the documents' texts, how many results (None: all), whether the texts
    come back, and whether it is Text Embeddings Inference's shape (``texts``) rather than Jina's/llama-server's."""

    query: str
    documents: list[str]
    top_n: int | None
    return_text: bool
    tei: bool


def parse_rerank(d: dict[str, Any]) -> RerankRequest:
    """A rerank body checked field by field (llama-server's fields, Jina's ``return_documents`` and documents as
    ``{"text": …}`` objects, TEI's ``texts``/``return_text``); a 400 naming the field that is wrong."""
    q = d.get("query")
    if not isinstance(q, str):
        raise bad_request("'query' is required: a string" if q is None else "'query' must be a string", "query")
    if not q.strip():
        raise bad_request("'query' is empty: nothing to rank the documents against", "query")
    tei = "texts" in d and "documents" not in d
    key = "texts" if tei else "documents"
    docs = d.get(key)
    if not isinstance(docs, list) or not docs:
        raise bad_request(f"'{key}' must be a non-empty array of strings", key)
    if len(docs) > MAX_DOCUMENTS:
        raise bad_request(f"'{key}' holds {len(docs)} documents; at most {MAX_DOCUMENTS} per request", key)
    texts: list[str] = []
    for i, x in enumerate(docs):
        if isinstance(x, dict) and set(x) == {"text"}:
            x = x["text"]
        if not isinstance(x, str):
            raise bad_request(f"{key}[{i}] must be a string (or an object with a 'text' string)", key)
        texts.append(x)
    top_n = d.get("top_n")
    if top_n is not None and (not _is_int(top_n) or top_n < 1):
        raise bad_request("'top_n' must be a positive integer", "top_n")
    flags = []
    for name in ("return_documents", "return_text"):
        v = d.get(name)
        if v is not None and not isinstance(v, bool):
            raise bad_request(f"'{name}' must be true or false", name)
        flags.append(bool(v))
    return RerankRequest(q, texts, top_n, any(flags), tei)

def parse_dimensions(v: Any, n_embd: int, param: str = "dimensions") -> int | None:
    """``dimensions`` as a width in 1..``n_embd`` (None: absent); a 400 otherwise."""
    if v is None:
        return None
    if not _is_int(v) or not 1 <= v <= n_embd:
        raise bad_request(f"'{param}' must be an integer in 1..{n_embd} (the model's width), not "
                          f"{str(v)[:40]}", param)
    return int(v)


def cut(v: np.ndarray, dims: int | None) -> np.ndarray:
    """The first ``dims`` components of a unit vector, normalised again (Matryoshka truncation)."""
    if dims is None or dims >= v.shape[-1]:
        return v
    return normalize(v[:dims], 2)


@dataclass
class OllamaEmbed:
    """An ``/api/embed`` (or legacy ``/api/embeddings``) request: its texts, ``truncate``, the width and the
    context length that truncation keeps to (``options.num_ctx`` when smaller than the model's)."""

    model: str
    texts: list[str]
    truncate: bool
    dims: int | None
    n_ctx: int


def _ollama_model(d: dict[str, Any], model_id: str) -> str:
    """The body's ``model`` (a ``:latest`` tag of the served name is the served name)."""
    m = d.get("model", d.get("name"))
    if not isinstance(m, str) or not m:
        raise bad_request("model is required", "model")
    return model_id if m == model_id + ":latest" else m


def _ollama_num_ctx(d: dict[str, Any], n_ctx: int) -> int:
    o = d.get("options")
    if o is None:
        return n_ctx
    if not isinstance(o, dict):
        raise bad_request("options must be an object", "options")
    v = o.get("num_ctx")
    if v is None:
        return n_ctx
    if not _is_int(v) or v < 1:
        raise bad_request(f"options.num_ctx must be a positive integer, not {str(v)[:40]}", "options.num_ctx")
    return min(v, n_ctx)


def parse_ollama_embed(d: dict[str, Any], model_id: str, n_embd: int, n_ctx: int, legacy: bool) -> OllamaEmbed:
    """An Ollama embedding body checked as Ollama checks it: ``input`` a string or an array of strings (an
    empty string or none: no inputs); legacy ``prompt`` a string; ``truncate`` a boolean (default true);
    ``dimensions`` 0 or absent (the model's width) or 1..n_embd; ``keep_alive`` a duration."""
    model = _ollama_model(d, model_id)
    _keep_alive(d)
    num_ctx = _ollama_num_ctx(d, n_ctx)
    if legacy:
        p = d.get("prompt")
        if p is not None and not isinstance(p, str):
            raise bad_request("prompt must be a string", "prompt")
        return OllamaEmbed(model, [p] if p else [], False, None, num_ctx)
    v = d.get("input")
    if isinstance(v, str):
        texts = [v] if v else []
    elif isinstance(v, list) and all(isinstance(x, str) for x in v):
        texts = list(v)
    elif v is None:
        texts = []
    else:
        raise bad_request("invalid input type", "input")
    if len(texts) > MAX_INPUTS:
        raise bad_request(f"'input' holds {len(texts)} inputs; at most {MAX_INPUTS} per request", "input")
    t = d.get("truncate", True)
    if not isinstance(t, bool):
        raise bad_request("truncate must be a boolean", "truncate")
    dims = d.get("dimensions")
    return OllamaEmbed(model, texts, t, None if dims == 0 else parse_dimensions(dims, n_embd), num_ctx)


def truncated(ids: list[int], plain: list[int], limit: int) -> list[int]:
    """``ids`` (a text's tokens with its special tokens, ``plain`` without) cut to ``limit`` tokens as Ollama
    cuts: the text's tokens end early, the special tokens at both ends stay; a 400 when nothing of the text
    would be left."""
    if len(ids) <= limit:
        return ids
    k = next((k for k in range(len(ids) - len(plain) + 1) if ids[k:k + len(plain)] == plain), 0)
    pre, post = ids[:k], ids[k + len(plain):]
    keep = limit - len(pre) - len(post)
    if keep <= 0:
        raise bad_request("input after truncation exceeds maximum context length", "input")
    return pre + plain[:keep] + post


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
        self.ollama_entry = model_entry(config.model_id, encoder.file)  # its row in /api/tags
        routes = [
            Route("/v1/models", self._wrap(self.models), methods=["GET"]),
            Route("/models", self._wrap(self.models), methods=["GET"]),
            Route("/v1/embeddings", self._wrap(self.embeddings), methods=["POST"]),
            Route("/embeddings", self._wrap(self.embeddings), methods=["POST"]),
            *[Route(p, self._wrap(self.rerank), methods=["POST"]) for p in RERANK_PATHS],
            Route("/tokenize", self._wrap(self.tokenize), methods=["POST"]),
            Route("/health", self._wrap(self.health), methods=["GET"]),
            Route("/api/embed", self._wrap(self.ollama_embed), methods=["POST"]),
            Route("/api/embeddings", self._wrap(self.ollama_embeddings), methods=["POST"]),
            Route("/", self._wrap(self.ollama_root), methods=["GET", "HEAD"]),
            Route("/api/version", self._wrap(self.ollama_version), methods=["GET", "HEAD"]),
            Route("/api/tags", self._wrap(self.ollama_tags), methods=["GET", "HEAD"]),
            Route("/api/ps", self._wrap(self.ollama_tags), methods=["GET"]),
            Route("/api/show", self._wrap(self.ollama_show), methods=["POST"]),
            *[Route(p, self._wrap(self.refuse_generation), methods=["POST"]) for p in REFUSED_PATHS],
        ]

        async def http_error(request: Request, exc: Exception) -> Response:
            status = exc.status_code if isinstance(exc, HTTPException) else 500
            what = {404: f"no such endpoint: {request.url.path} (an embedding model: POST {self._endpoint})",
                    405: f"{request.method} is not allowed on {request.url.path}"}.get(status, "request failed")
            return self._count(_error(ApiError(status, what), dialect_of(request.url.path)))

        self.app = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
        self.app.router.redirect_slashes = False
        self.asgi = Policy(self.app, config.host, config.allowed_hosts, config.cors_origins, count=self._count_status)

    @property
    def _endpoint(self) -> str:
        """The endpoint that runs this model: /v1/rerank for a reranker, /v1/embeddings otherwise."""
        return "/v1/rerank" if self.encoder.pooling == RANK else "/v1/embeddings"

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
                          f"{self.encoder.pooling} pooling): it does not generate text; ask POST {self._endpoint}",
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
        self._no_pooling()
        dims = parse_dimensions(d.get("dimensions"), self.encoder.n_embd)
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

        vecs = [cut(v, dims) for v in await run_in_threadpool(run)]
        n_tokens = sum(len(s) for s in seqs)

        def encoded(v: np.ndarray) -> Any:
            if fmt == "base64":
                return base64.b64encode(np.ascontiguousarray(v, dtype="<f4").tobytes()).decode("ascii")
            return [float(x) for x in v]

        return JSONResponse({"object": "list", "model": self.config.model_id,
                             "data": [{"object": "embedding", "index": i, "embedding": encoded(v)}
                                      for i, v in enumerate(vecs)],
                             "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}})

    async def rerank(self, request: Request) -> Response:
        """``/v1/rerank``: every document scored against the query by the reranker's head (the raw score, as
        llama-server answers it), the best first, ``top_n`` of them."""
        d = await self._json(request)
        model = d.get("model")
        if model is not None and not isinstance(model, str):
            raise bad_request("'model' must be a string", "model")
        self._check_model(model)
        enc = self.encoder
        if enc.pooling != RANK:
            raise bad_request(f"{self.config.model_id} is an embedding model ({enc.pooling} pooling), not a "
                              "reranker: it does not rerank (serve a cross-encoder with rank pooling); ask POST "
                              "/v1/embeddings", code="unsupported_endpoint")
        r = parse_rerank(d)
        key = "texts" if r.tei else "documents"
        try:
            seqs = [enc.check_ids(enc.rerank_tokens(r.query, doc), f"{key}[{i}] with the query")
                    for i, doc in enumerate(r.documents)]
        except EmbedError as exc:
            raise bad_request(str(exc), key) from None

        def run() -> list[float]:
            with self._lock:
                return [float(s[0]) for s in enc.rank_ids(seqs)]

        scores = await run_in_threadpool(run)
        order = sorted(range(len(scores)), key=lambda i: -scores[i])[:r.top_n]
        if r.tei:
            return JSONResponse([{"index": i, "score": scores[i], **({"text": r.documents[i]} if r.return_text
                                                                      else {})} for i in order])
        n_tokens = sum(len(s) for s in seqs)
        return JSONResponse({"model": self.config.model_id, "object": "list",
                             "results": [{"index": i, "relevance_score": scores[i],
                                          **({"document": {"text": r.documents[i]}} if r.return_text else {})}
                                         for i in order],
                             "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}})

    # ------------------------------------------------------------------ Ollama's endpoints
    def _no_pooling(self) -> None:
        """Refuse a vector request where the model gives no vector per input (a reranker; pooling none)."""
        if self.encoder.pooling == RANK:
            raise bad_request(f"{self.config.model_id} is a reranker (rank pooling): it scores query/document pairs "
                              "and gives no vectors; ask POST /v1/rerank", code="unsupported_endpoint")
        if self.encoder.pooling == "none":
            raise bad_request(f"{self.config.model_id} has no pooling (pooling_type none): one vector per token, "
                              "not per input; serve it with --pooling mean, cls or last", "input")

    async def _ollama_run(self, request: Request, legacy: bool) -> tuple[OllamaEmbed, list[np.ndarray], int, int]:
        """An Ollama body's vectors (unit vectors cut to ``dimensions``; legacy: not normalised), its token count
        and when the request was checked (ns); every text tokenized, cut or refused before any is evaluated."""
        enc = self.encoder
        r = parse_ollama_embed(await self._json(request), self.config.model_id, enc.n_embd, enc.n_ctx, legacy)
        self._check_model(r.model)
        self._no_pooling()
        t_checked = time.perf_counter_ns()
        if not r.texts:
            return r, [], 0, t_checked

        def run() -> tuple[list[np.ndarray], int]:
            seqs = []
            for i, t in enumerate(r.texts):
                ids = enc.tokenize(t)
                if len(ids) > r.n_ctx:
                    if not r.truncate:
                        raise bad_request("input exceeds maximum context length", "input")
                    ids = truncated(ids, enc.tokenizer.encode(t, add_special=False, parse_special=True), r.n_ctx)
                try:
                    seqs.append(enc.check_ids(ids, f"input[{i}]"))
                except EmbedError as exc:
                    raise bad_request(str(exc), "input") from None
            with self._lock:
                vecs = enc.embed_ids(seqs, enc.pooling, -1 if legacy else 2)
            return [cut(v, r.dims) for v in vecs], sum(len(s) for s in seqs)

        vecs, n = await run_in_threadpool(run)
        return r, vecs, n, t_checked

    async def ollama_embed(self, request: Request) -> Response:
        """``POST /api/embed``: Ollama's answer, durations in nanoseconds."""
        t0 = time.perf_counter_ns()
        r, vecs, n, t_load = await self._ollama_run(request, legacy=False)  # load: the model is loaded already
        out: dict[str, Any] = {"model": r.model, "embeddings": [[float(x) for x in v] for v in vecs]}
        if vecs:  # Ollama leaves out the zero counts (omitempty), as for an empty input
            out |= {"total_duration": time.perf_counter_ns() - t0, "load_duration": t_load - t0,
                    "prompt_eval_count": n}
        return JSONResponse(out)

    async def ollama_embeddings(self, request: Request) -> Response:
        """``POST /api/embeddings`` (Ollama's legacy endpoint): ``{"embedding": [...]}``, the pooled vector not
        normalised (as Ollama's); an empty prompt gives an empty vector."""
        _r, vecs, _n, _t = await self._ollama_run(request, legacy=True)
        return JSONResponse({"embedding": [float(x) for x in vecs[0]] if vecs else []})

    async def ollama_root(self, request: Request) -> Response:
        return PlainTextResponse("Ollama is running")

    async def ollama_version(self, request: Request) -> Response:
        return JSONResponse({"version": OLLAMA_VERSION})

    async def ollama_tags(self, request: Request) -> Response:
        """``/api/tags`` and ``/api/ps``: the one model served."""
        return JSONResponse({"models": [self.ollama_entry]})

    async def ollama_show(self, request: Request) -> Response:
        """``/api/show``: the model's details; its capability is ``embedding`` (it does not complete text)."""
        self._check_model(_ollama_model(await self._json(request), self.config.model_id))
        c, e = self.encoder.config, self.ollama_entry
        info = {"general.architecture": c.arch,
                "general.parameter_count": sum(t.n_elements for t in self.encoder.file.tensors),
                f"{c.arch}.context_length": c.n_ctx_train, f"{c.arch}.embedding_length": c.n_embd,
                f"{c.arch}.pooling_type": self.encoder.pooling, "tokenizer.vocab_size": c.n_vocab}
        return JSONResponse({"modelfile": f"FROM {self.config.model_id}\n", "parameters": "", "template": "",
                             "details": e["details"], "model_info": info, "capabilities": ["embedding"],
                             "modified_at": e["modified_at"]})
