"""The Starlette application: the OpenAI endpoints, llama-server's /infill, /tokenize, /detokenize, /health and
/metrics, and Ollama's (:mod:`.ollama`) and Anthropic's (:mod:`.anthropic`) endpoints, whose requests take the
same path (:meth:`ServerApp.generation`: the checks, the queue, tool calls and JSON mode) and whose refusals come
in their own shapes (:func:`.errors.error_body`).

Every request is checked before the engine is touched: its Host and Origin (421, 403: :mod:`.policy`), a POST's
Content-Type (415), the body's size (413), its JSON (400), the model's name (404), each parameter (400) and the
prompt's length against the context (400); then it joins the scheduler's queue (503 with ``Retry-After`` when
full). When the server stops, streams end with an error event and ``data: [DONE]``, other requests with a 503.
Generation runs on the scheduler's thread; handlers only wait for its events, so the event loop never blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from ..chat import ChatTemplateError
from ..chat.tokens import piece_text
from ..engine.generate import Engine
from .anthropic import AnthropicApi
from .dialect import Gathered, Part, Started
from .errors import ApiError, bad_request, dialect_of, error_body
from .fim import FimTokens, find_fim, infill_ids
from .jsonmode import SchemaError
from .ollama import OllamaApi
from .policy import Policy
from .prompt import chat_prompt_ids
from .protocol import GenRequest, parse_detokenize, parse_generation, parse_infill, parse_json, parse_tokenize
from .requests import RequestLog, RequestRecord
from .scheduler import Event, Job, QueueFull, Scheduler, ServerStopped, TokenLogprob, Usage
from .slots import SlotActions
from .tools import FORMATS, Forcing, HarmonyParser, ToolCallParser, ToolFormat, make_parser, tool_format, with_ids

#: the largest request body accepted (a long conversation is a few MiB at most)
DEFAULT_MAX_BODY = 8 * 2**20
#: paths open without the API key
OPEN_PATHS = frozenset({"/health", "/"})  # "/": Ollama's "is it running" probe
#: the paths whose requests go to the request log
GENERATION_PATHS = frozenset({"/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions",
                              "/api/chat", "/api/generate", "/v1/messages", "/infill"})


@dataclass
class ServerConfig:
    """What the app needs besides the engine: the model's name in the API, the key, the body limit, and the
    address it is bound to with the extra Host names and the CORS origins it accepts (:class:`.policy.Policy`)."""

    model_id: str
    api_key: str | None = None
    max_body: int = DEFAULT_MAX_BODY
    trace: bool = False  # keep each reply's token records with alternatives in the request log
    host: str = "127.0.0.1"
    allowed_hosts: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()
    #: control tokens' texts in messages and tools become control tokens (llama-server's way); by default they
    #: are text and only the template's markup is special (core/server/prompt.py)
    special_in_content: bool = False
    #: the folder of ``POST /slots/{id}?action=save|restore`` files (None: the endpoint is refused; :mod:`.slots`)
    slot_save_path: str | None = None


def _client(request: Request) -> str:
    return f"{request.client.host}:{request.client.port}" if request.client is not None else "?"


def _error(exc: ApiError, dialect: str = "openai") -> JSONResponse:
    return JSONResponse(error_body(exc, dialect), status_code=exc.status, headers=exc.headers)


def _usage(u: Usage) -> dict[str, Any]:
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


def _timings(u: Usage) -> dict[str, Any]:
    """llama-server's ``timings`` object."""
    n_prompt = u.prompt_tokens - u.cached_tokens
    return {"cache_n": u.cached_tokens, "prompt_n": n_prompt, "prompt_ms": round(u.prompt_ms, 3),
            "prompt_per_second": n_prompt / (u.prompt_ms / 1e3) if u.prompt_ms > 0 else 0.0,
            "predicted_n": u.completion_tokens, "predicted_ms": round(u.predicted_ms, 3),
            "predicted_per_second": u.completion_tokens / (u.predicted_ms / 1e3) if u.predicted_ms > 0 else 0.0}


def _bytes(b: bytes) -> list[int]:
    return list(b)


def _chat_logprobs(tokens: list[TokenLogprob]) -> dict[str, Any]:
    return {"content": [{"token": t.text, "logprob": t.logprob, "bytes": _bytes(t.raw),
                         "top_logprobs": [{"token": s, "logprob": lp, "bytes": _bytes(b)} for s, b, lp in t.top]}
                        for t in tokens]}


def _completion_logprobs(tokens: list[TokenLogprob], offset: int) -> dict[str, Any]:
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t.text)
    # (an echoed prompt's first token has no logprob: NaN here, null in the reply)
    return {"tokens": [t.text for t in tokens],
            "token_logprobs": [None if math.isnan(t.logprob) else t.logprob for t in tokens],
            "top_logprobs": [None if math.isnan(t.logprob) else {s: lp for s, _b, lp in t.top} for t in tokens],
            "text_offset": offsets}


def _total(usages: list[Usage]) -> Usage:
    """The usage of a request's choices together: the prompt once (the first choice's), every choice's tokens,
    the longest times."""
    if len(usages) == 1:
        return usages[0]
    first = usages[0]
    return Usage(prompt_tokens=first.prompt_tokens, cached_tokens=first.cached_tokens,
                 completion_tokens=sum(u.completion_tokens for u in usages),
                 prompt_ms=max(u.prompt_ms for u in usages), predicted_ms=max(u.predicted_ms for u in usages),
                 queued_ms=min(u.queued_ms for u in usages))


def _finish_reason(reason: str) -> str:
    return "length" if reason == "length" else "stop"


def check_key(request: Request, key: str | None) -> None:
    """Refuse (401) a request without the API ``key`` (None: none needed) as a Bearer token or ``x-api-key``."""
    if not key:
        return
    given = request.headers.get("authorization", "")
    scheme, _, token = given.partition(" ")
    bearer = scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())
    x_key = request.headers.get("x-api-key")  # Anthropic's header, taken on every path
    if not bearer and not (x_key is not None and hmac.compare_digest(x_key.strip().encode(), key.encode())):
        raise ApiError(401, "invalid or missing API key (send 'Authorization: Bearer KEY' or 'x-api-key: KEY')",
                       code="invalid_api_key")


def check_json_type(request: Request) -> None:
    """Refuse (415) a body not sent as JSON."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    # Ollama's clients (and its curl examples, `curl -d`) send no type or a form's: taken as JSON on its paths
    # (a browser's cross-origin form post is refused by its Origin before this, :mod:`.policy`)
    ollama_ok = ctype in ("", "application/x-www-form-urlencoded") and dialect_of(request.url.path) == "ollama"
    if ctype != "application/json" and not ollama_ok:
        raise ApiError(415, "the request body must be JSON, sent with 'Content-Type: application/json'",
                       code="unsupported_media_type")


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, refused (413) past ``limit`` bytes, by its Content-Length or as it arrives."""
    too_big = ApiError(413, f"the request body is larger than {limit:,} bytes", code="request_too_large")
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise bad_request("the Content-Length header is not a number")
        if int(length) > limit:
            raise too_big
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise too_big
    except ClientDisconnect:  # gone, or closed by the read timeout (.connections): nobody reads the reply
        raise bad_request("the connection closed before the whole body arrived") from None
    return bytes(body)


class StatusCounts:
    """The HTTP statuses a server's app answered (``http_requests``: status -> count, for ``/metrics``): a reply
    counted by :meth:`_count`, a refusal before routing (the Host/Origin rules) by :meth:`_count_status`."""

    http_requests: dict[int, int]

    def _count(self, r: Response) -> Response:
        self._count_status(r.status_code)
        return r

    def _count_status(self, status: int) -> None:
        self.http_requests[status] = self.http_requests.get(status, 0) + 1


class ServerApp(StatusCounts):
    """The endpoints over one engine and its scheduler (see the module's docstring); ``slot_routes``: with
    ``/slots/{id}`` (:mod:`.slots`; not in a pool of models, whose requests are routed by the model they name)."""

    def __init__(self, engine: Engine, scheduler: Scheduler, config: ServerConfig, slot_routes: bool = True) -> None:
        self.engine = engine
        self.scheduler = scheduler
        self.config = config
        self.created = int(time.time())
        self.http_requests: dict[int, int] = {}  # status -> count, for /metrics
        tok = engine.tokenizer
        #: every generation request, live and finished (the app's Requests panel reads it)
        self.log = RequestLog(lambda t: piece_text(tok.token_bytes(t, True)), trace=config.trace)
        #: the tool-call form the chat template writes (core/server/toolcall_formats.py), None: tools refused
        tpl = engine.template
        self.tool_format: ToolFormat | None = (
            tool_format(tpl.source) if tpl is not None and engine.template_error is None else None)
        #: the form's markers that are special tokens of the vocabulary: written as text when tools are given
        vocab = engine.tokenizer.vocab
        tags = self.tool_format.tags if self.tool_format is not None else ()
        self._tool_tags = frozenset(vocab[t] for t in tags if t in vocab)
        self._fim: FimTokens | str | None = None
        routes = [
            Route("/v1/models", self._wrap(self.models), methods=["GET"]),
            Route("/models", self._wrap(self.models), methods=["GET"]),
            Route("/v1/chat/completions", self._wrap(self.chat), methods=["POST"]),
            Route("/chat/completions", self._wrap(self.chat), methods=["POST"]),
            Route("/v1/completions", self._wrap(self.completions), methods=["POST"]),
            Route("/completions", self._wrap(self.completions), methods=["POST"]),
            Route("/v1/embeddings", self._wrap(self.embeddings), methods=["POST"]),
            Route("/embeddings", self._wrap(self.embeddings), methods=["POST"]),
            Route("/infill", self._wrap(self.infill), methods=["POST"]),
            Route("/tokenize", self._wrap(self.tokenize), methods=["POST"]),
            Route("/detokenize", self._wrap(self.detokenize), methods=["POST"]),
            Route("/health", self._wrap(self.health), methods=["GET"]),
            Route("/metrics", self._wrap(self.metrics), methods=["GET"]),
            *OllamaApi(self).routes(),
            *AnthropicApi(self).routes(),
        ]
        if slot_routes:
            routes += SlotActions(scheduler, engine.file.paths[0], config.slot_save_path, self._json).routes(self._wrap)

        async def http_error(request: Request, exc: Exception) -> Response:
            status = exc.status_code if isinstance(exc, HTTPException) else 500
            what = {404: f"no such endpoint: {request.url.path}",
                    405: f"{request.method} is not allowed on {request.url.path}"}.get(status, "request failed")
            return self._count(_error(ApiError(status, what), dialect_of(request.url.path)))

        self.app = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
        self.app.router.redirect_slashes = False  # a redirect would be built from the Host header sent
        #: the ASGI application served: the routes behind the Host/Origin/CORS rules
        self.asgi = Policy(self.app, config.host, config.allowed_hosts, config.cors_origins, count=self._count_status)

    # ------------------------------------------------------------------ plumbing
    def _wrap(self, fn: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def handler(request: Request) -> Response:
            try:
                if request.url.path not in OPEN_PATHS:
                    try:
                        self._authorize(request)
                    except ApiError as exc:
                        if request.url.path in GENERATION_PATHS:  # listed: a client with a wrong key shows up
                            self.log.refused(request.url.path, _client(request), exc.status, exc.message)
                        raise
                return self._count(await fn(request))
            except ApiError as exc:
                return self._count(_error(exc, dialect_of(request.url.path)))

        return handler

    def _authorize(self, request: Request) -> None:
        check_key(request, self.config.api_key)

    async def _json(self, request: Request) -> dict[str, Any]:
        check_json_type(request)
        return parse_json(await read_body(request, self.config.max_body))

    def _check_model(self, name: str | None) -> None:
        if name is not None and name != self.config.model_id:
            raise ApiError(404, f"the model {name!r} does not exist: this server serves {self.config.model_id!r}",
                           param="model", code="model_not_found")

    # ------------------------------------------------------------------ endpoints
    async def models(self, request: Request) -> Response:
        c = self.engine.model.config
        return JSONResponse({"object": "list", "data": [{
            "id": self.config.model_id, "object": "model", "created": self.created, "owned_by": "quantscope",
            "meta": {"arch": c.arch, "n_ctx": self.engine.n_ctx, "n_ctx_train": c.n_ctx_train,
                     "n_vocab": c.n_vocab, "n_embd": c.n_embd, "backend": self.engine.backend,
                     "slots": len(self.scheduler.slots)}}]})

    async def health(self, request: Request) -> Response:
        if self.scheduler.failure is not None:
            return JSONResponse({"status": "error", "error": str(self.scheduler.failure)}, status_code=500)
        return JSONResponse({"status": "ok", "slots_idle": len(self.scheduler.slots) - self.scheduler.busy_slots,
                             "slots_processing": self.scheduler.busy_slots, "queued": self.scheduler.queued})

    async def metrics(self, request: Request) -> Response:
        m, s = self.scheduler.metrics, self.scheduler
        lines: list[str] = []

        def metric(name: str, kind: str, help_: str, values: list[tuple[str, float]]) -> None:
            lines.extend((f"# HELP quantscope_{name} {help_}", f"# TYPE quantscope_{name} {kind}"))
            lines.extend(f"quantscope_{name}{labels} {value:g}" for labels, value in values)

        metric("requests_total", "counter", "Generation requests accepted.", [("", m.requests)])
        metric("requests_finished_total", "counter", "Generation requests finished, by reason.",
               [(f'{{reason="{k}"}}', v) for k, v in sorted(m.finished.items())] or [('{reason="stop"}', 0)])
        metric("requests_rejected_total", "counter", "Requests refused because the queue was full.",
               [("", m.rejected_full)])
        metric("http_responses_total", "counter", "HTTP responses, by status.",
               [(f'{{status="{k}"}}', v) for k, v in sorted(self.http_requests.items())] or [('{status="200"}', 0)])
        metric("prompt_tokens_total", "counter", "Prompt tokens evaluated.", [("", m.prompt_tokens)])
        metric("prompt_tokens_cached_total", "counter", "Prompt tokens reused from a slot's cache.",
               [("", m.cached_tokens)])
        metric("tokens_predicted_total", "counter", "Tokens generated.", [("", m.generated_tokens)])
        metric("prompt_seconds_total", "counter", "Time spent on prompts.", [("", m.prompt_seconds)])
        metric("tokens_predicted_seconds_total", "counter", "Time spent generating.", [("", m.generation_seconds)])
        metric("predicted_tokens_per_second", "gauge", "Average generation speed per request (tokens/s).",
               [("", m.generated_tokens / m.generation_seconds if m.generation_seconds else 0.0)])
        metric("requests_processing", "gauge", "Requests in a slot.", [("", s.busy_slots)])
        metric("requests_deferred", "gauge", "Requests waiting for a slot.", [("", s.queued)])
        metric("slots", "gauge", "Parallel slots.", [("", len(s.slots))])
        metric("batched_steps_total", "counter", "Decode steps of several slots in one forward pass.",
               [("", m.batched_steps)])
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    async def tokenize(self, request: Request) -> Response:
        content, add_special, with_pieces = parse_tokenize(await self._json(request))
        tok = self.engine.tokenizer
        ids = await run_in_threadpool(tok.encode, content, add_special if add_special else False)
        if not with_pieces:
            return JSONResponse({"tokens": ids})

        def piece(t: int) -> str | list[int]:
            raw = tok.token_bytes(t, True)
            try:
                return raw.decode("utf-8")
            except UnicodeDecodeError:
                return list(raw)

        return JSONResponse({"tokens": [{"id": t, "piece": piece(t)} for t in ids]})

    async def detokenize(self, request: Request) -> Response:
        ids = parse_detokenize(await self._json(request), self.engine.tokenizer.n_vocab)
        tok = self.engine.tokenizer
        raw = b"".join(tok.token_bytes(t, True) for t in ids)
        return JSONResponse({"content": raw.decode("utf-8", "replace")})

    async def embeddings(self, request: Request) -> Response:
        d = await self._json(request)
        self._check_model(d.get("model") if isinstance(d.get("model"), str) else None)
        raise bad_request(f"embeddings are not available: {self.config.model_id} is a text generation model and "
                          "this server has no pooling for it", code="unsupported_endpoint")

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, "chat")

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, "completion")

    async def infill(self, request: Request) -> Response:
        """llama-server's /infill: fill in the middle between ``input_prefix`` and ``input_suffix``, answered in
        its /completion shape (``content``, ``stop``, ``timings``; streamed as ``data:`` lines)."""
        eng = self.engine

        def parse(d: dict[str, Any]) -> GenRequest:
            if isinstance(self.fim, str):  # (before the body's fields: llama-server's order)
                raise bad_request(f"infill is not supported by {self.config.model_id}: {self.fim}",
                                  code="unsupported_endpoint")
            return parse_infill(d, eng.tokenizer.n_vocab, eng.n_ctx)

        async def respond(req: GenRequest, ids: list[int], st: Started) -> Response:
            def body(text: str, end: Event | None) -> dict[str, Any]:
                d: dict[str, Any] = {"index": 0, "content": text, "id_slot": st.job.slot, "stop": end is not None,
                                     "model": self.config.model_id}
                if end is not None:
                    u = end.usage or Usage()
                    d |= {"tokens_predicted": u.completion_tokens, "tokens_evaluated": u.prompt_tokens,
                          "tokens_cached": u.cached_tokens, "truncated": False,
                          "stop_type": "limit" if end.finish_reason == "length" else
                          "word" if end.stop_sequence else "eos",
                          "stopping_word": end.stop_sequence, "timings": _timings(u)}
                return d

            if not req.stream:
                got = await self.gather(request, req, st)
                return JSONResponse(body(got.text, got.end))

            async def lines() -> AsyncIterator[str]:
                async with contextlib.aclosing(self.parts(req, st)) as parts:
                    async for p in parts:
                        if p.end is not None and p.end.finish_reason in ("error", "cancelled"):
                            yield f"data: {json.dumps(self._failure(p.end).body())}\n\n"
                        elif p.text or p.end is not None:
                            yield f"data: {json.dumps(body(p.text, p.end), ensure_ascii=False)}\n\n"

            return StreamingResponse(lines(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

        return await self.generation(request, parse, respond)

    # ------------------------------------------------------------------ generation
    def _prompt_ids(self, req: GenRequest) -> list[int]:
        eng = self.engine
        if req.kind == "chat":
            assert req.messages is not None
            try:
                ids = self._chat_ids(req)
            except ChatTemplateError as exc:
                raise bad_request(f"the chat template refused the messages: {exc}", "messages") from None
        elif req.suffix is not None:  # fill in the middle: the model's FIM layout
            fim = self.fim
            if isinstance(fim, str):
                raise bad_request(f"suffix (fill in the middle) is not supported by {self.config.model_id}: {fim}",
                                  "suffix", "unsupported_parameter")
            assert isinstance(req.prompt, str)
            ids = infill_ids(eng.tokenizer, fim, req.prompt, req.suffix, req.infill_prompt, req.extra)
        elif isinstance(req.prompt, list):
            ids = list(req.prompt)
        else:
            ids = eng.tokenizer.encode(req.prompt or "")
        if not ids:
            if eng.tokenizer.bos_id is None:
                raise bad_request("the prompt is empty and the vocabulary has no BOS token to start from", "prompt")
            ids = [eng.tokenizer.bos_id]
        if len(ids) >= eng.n_ctx:
            raise bad_request(f"the prompt has {len(ids)} tokens but the context holds {eng.n_ctx}",
                              "messages" if req.kind == "chat" else "prompt", "context_length_exceeded")
        return ids

    def _forcing(self, req: GenRequest) -> Forcing:
        """How the call a request requires is forced (its tools are given, so the form is known)."""
        assert self.tool_format is not None
        return self.tool_format.force(req.tools, req.tool_name)

    def _tool_parser(self, req: GenRequest) -> ToolCallParser | HarmonyParser | None:
        """The streaming parser of an automatic tool choice's reply, or None."""
        if req.tool_choice != "auto" or self.tool_format is None:
            return None
        return make_parser(self.tool_format, req.tools)

    @property
    def fim(self) -> FimTokens | str:
        """The model's fill-in-the-middle tokens, or why it has none (looked up once)."""
        if self._fim is None:
            self._fim = find_fim(self.engine.file, self.engine.tokenizer)
        return self._fim

    def _chat_ids(self, req: GenRequest) -> list[int]:
        """The prompt of a chat request: its messages (and tools) through the template; a required tool call
        starts the reply with the call's opening."""
        eng = self.engine
        assert req.messages is not None
        if not req.tools:
            if self.config.special_in_content:
                return eng.prompt_ids(req.messages)
            if eng.template_error is not None:
                raise ChatTemplateError(eng.template_error)
            return chat_prompt_ids(eng.tokenizer, eng.template, req.messages)
        tpl = eng.template
        if eng.template_error is not None or tpl is None or self.tool_format is None:
            raise bad_request(f"tools are not supported for {self.config.model_id}: its chat template does not "
                              "write tool calls in a form this server reads ("
                              + ", ".join(f.label for f in FORMATS) + ")", "tools", "unsupported_parameter")
        messages = with_ids(req.messages, self.tool_format.short_ids)
        if self.config.special_in_content:
            text = tpl.render(messages, add_generation_prompt=True, tools=req.tools)
            has_bos = bool(tpl.bos_token) and text.startswith(tpl.bos_token)
            ids = eng.tokenizer.encode(text, add_special=not has_bos)
        else:
            ids = chat_prompt_ids(eng.tokenizer, tpl, messages, req.tools)
        if req.tool_choice == "required":
            ids += eng.tokenizer.encode(self._forcing(req).opening(self._prompt_text(ids[-8:])), add_special=False)
        return ids

    async def _generate(self, request: Request, kind: str) -> Response:
        eng = self.engine

        def parse(d: dict[str, Any]) -> GenRequest:
            return parse_generation(d, kind, eng.tokenizer.n_vocab, eng.n_ctx)

        async def respond(req: GenRequest, ids: list[int], st: Started) -> Response:
            rid = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
            if req.stream:
                return StreamingResponse(self._sse(req, rid, st, self._echo(req, ids)),
                                         media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            return await self._collect(request, req, rid, st, self._echo(req, ids))

        return await self.generation(request, parse, respond)

    async def generation(self, request: Request, parse: Callable[[dict[str, Any]], GenRequest | None],
                         respond: Callable[[GenRequest, list[int], Started], Awaitable[Response]],
                         early: Callable[[dict[str, Any]], Response] | None = None) -> Response:
        """A generation request of any dialect: the body read and ``parse``d into a :class:`GenRequest` (a
        refusal is logged and answered in the path's dialect), its prompt built and checked, the job queued,
        and ``respond`` makes the reply. ``parse`` returning None answers ``early(body)`` without the engine."""
        client = _client(request)
        t0 = time.perf_counter()
        try:
            d = await self._json(request)
            req = parse(d)
            if req is None:
                assert early is not None
                return early(d)
            ids, st = await self._start(request, req, client, t0)
            return await respond(req, ids, st)
        except ApiError as exc:
            if not getattr(exc, "logged", False):
                self.log.refused(request.url.path, client, exc.status, exc.message)
            raise

    def _prompt_text(self, ids: list[int]) -> str:
        tok = self.engine.tokenizer
        return b"".join(tok.token_bytes(t, True) for t in ids).decode("utf-8", "replace")

    async def _start(self, request: Request, req: GenRequest, client: str, t0: float) -> tuple[list[int], Started]:
        eng = self.engine
        self._check_model(req.model)
        ids = await run_in_threadpool(self._prompt_ids, req)
        if req.n_ctx is not None:  # a smaller context asked for (Ollama's num_ctx): the prompt and reply fit it
            if len(ids) >= req.n_ctx:
                raise bad_request(f"the prompt has {len(ids)} tokens but num_ctx holds {req.n_ctx}",
                                  "num_ctx", "context_length_exceeded")
            room = req.n_ctx - len(ids)
            req.max_tokens = room if req.max_tokens is None else min(req.max_tokens, room)
        if req.tool_choice == "required":
            try:
                req.json_schema = self._forcing(req).schema()
            except SchemaError as exc:
                raise bad_request(f"tools: {exc}", "tools", "unsupported_schema") from None
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()
        recs: list[RequestRecord | None] = [None] * req.n
        log = self.log

        def emitter(i: int) -> Callable[[Event], None]:
            def emit(ev: Event) -> None:
                ev.choice = i
                rec = recs[i]
                if rec is not None:
                    log.event(rec, ev)
                loop.call_soon_threadsafe(events.put_nowait, ev)

            return emit

        def watcher(i: int) -> Callable[[int | None, str, str, Any], None]:
            def on_token(tid: int | None, text: str, channel: str, choice: Any) -> None:
                rec = recs[i]
                if rec is not None:
                    log.token(rec, tid, text, channel, choice)

            return on_token

        bias = dict(req.logit_bias)
        if req.ignore_eos:
            bias.update(dict.fromkeys(eng.eog, -math.inf))
        seed = req.params.seed
        jobs = [Job(ids, req.params if i == 0 or seed is None else replace(req.params, seed=(seed + i) % 2**64),
                    emitter(i), max_tokens=req.max_tokens, logprobs=req.logprobs,
                    top_logprobs=req.top_logprobs, logit_bias=bias,
                    harmony=req.kind == "chat" and eng.harmony is not None and not (
                        req.tools and self.tool_format is not None and self.tool_format.harmony),
                    json_schema=req.json_schema,
                    literal=self._tool_tags if req.tool_choice == "auto" else frozenset(), on_token=watcher(i),
                    ends=self.fim.ends if req.suffix is not None and not isinstance(self.fim, str) else frozenset(),
                    prompt_logprobs=req.echo and req.logprobs)
                for i in range(req.n)]
        prompt_text = self._prompt_text(ids)
        rec: RequestRecord | None = None
        try:
            for i, job in enumerate(jobs):  # (choice i > 0: a seed of its own, seed + i, when one is given)
                rec = recs[i] = log.open(request.url.path, client, job, prompt_text, req.stream)
                self.scheduler.submit(job)
        except QueueFull as exc:
            for job in jobs:
                self._cancel(job)
            err = ApiError(503, f"the server is busy: {exc}; retry later", code="server_busy",
                           headers={"Retry-After": "1"})
            log.close_refused(rec, err.status, err.message)
            err.logged = True  # type: ignore[attr-defined]
            raise err from None
        except ServerStopped as exc:
            err = ApiError(503, str(exc), code="server_shutting_down")
            log.close_refused(rec, err.status, err.message)
            err.logged = True  # type: ignore[attr-defined]
            raise err from None
        return ids, Started(jobs[0], events, t0, jobs[1:])

    async def parts(self, req: GenRequest, st: Started) -> AsyncIterator[Part]:
        """The reply as :class:`Part` s: text with the tool calls taken out (the same parsing as the OpenAI
        path's), ending with the last event; leaving it early (a client gone) cancels the job."""
        parser = self._tool_parser(req)
        forced: list[str] = []  # a required call: its JSON, a call at the end
        done = False
        try:
            while True:
                ev = await st.events.get()
                calls: list[dict[str, Any]] = []
                text = ev.text
                if req.kind == "chat" and req.tool_choice == "required":
                    forced.append(text)
                    text = ""
                    if ev.done:
                        call = self._forcing(req).call("".join(forced)) if ev.finish_reason == "stop" else None
                        if call is None:
                            text = "".join(forced)
                        else:
                            calls = [call]
                reasoning = ev.reasoning
                if parser is not None:
                    text, calls = parser.push(text)
                    if ev.done:
                        tail, more = parser.finish()
                        text, calls = text + tail, calls + more
                    reasoning += parser.take_reasoning()
                if reasoning:
                    yield Part(reasoning=reasoning)
                if text:
                    yield Part(text=text)
                for call in calls:
                    yield Part(call=call)
                if ev.done:
                    done = True
                    yield Part(end=ev)
                    return
        finally:
            if not done:
                self._cancel(st.job)

    async def gather(self, request: Request, req: GenRequest, st: Started) -> Gathered:
        """The whole reply of a request answered at once (the job cancelled if its client goes away); a failed
        or cancelled one raises its :class:`ApiError`."""

        async def watch() -> None:
            while True:
                msg = await request.receive()
                if msg["type"] == "http.disconnect":
                    self._cancel(st.job)
                    return

        watcher = asyncio.create_task(watch())
        text, reasoning, calls = [], [], []
        end = Event()
        try:
            async with contextlib.aclosing(self.parts(req, st)) as parts:
                async for p in parts:
                    text.append(p.text)
                    reasoning.append(p.reasoning)
                    if p.call is not None:
                        calls.append(p.call)
                    if p.end is not None:
                        end = p.end
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        if end.finish_reason in ("error", "cancelled"):
            raise self._failure(end)
        return Gathered("".join(text), "".join(reasoning), calls, end)

    def _failure(self, ev: Event) -> ApiError:
        """The error a request ended by ``ev`` (an error, or cancelled: the server stopping) answers with."""
        if ev.finish_reason == "error":
            return ApiError(500, f"generation failed: {ev.error or 'internal error'}", code="generation_failed")
        if self.scheduler.stopping:
            return ApiError(503, "the server is shutting down", code="server_shutting_down")
        return ApiError(503, "the request was cancelled", code="cancelled")

    def _cancel(self, job: Job) -> None:
        job.cancel.set()
        self.scheduler.wake()

    def _echo(self, req: GenRequest, ids: list[int]) -> str:
        """The prompt's text a completion with ``echo`` starts with (the text sent, or its tokens' text)."""
        if not req.echo:
            return ""
        return req.prompt if isinstance(req.prompt, str) else self._prompt_text(ids)

    async def _collect(self, request: Request, req: GenRequest, rid: str, st: Started, echo: str = "") -> Response:
        """A non-streamed reply: wait for every choice's events, cancelling the jobs if the client goes away
        meanwhile."""
        jobs, events = st.jobs, st.events

        async def watch() -> None:
            while True:
                msg = await request.receive()
                if msg["type"] == "http.disconnect":
                    for job in jobs:
                        self._cancel(job)
                    return

        watcher = asyncio.create_task(watch())
        n = len(jobs)
        text: list[list[str]] = [[] for _ in range(n)]
        reasoning: list[list[str]] = [[] for _ in range(n)]
        tokens: list[list[TokenLogprob]] = [[] for _ in range(n)]
        prompts: list[list[TokenLogprob]] = [[] for _ in range(n)]  # echo with logprobs: the prompt's tokens
        ends: list[Event | None] = [None] * n
        try:
            while any(e is None for e in ends):
                ev = await events.get()
                i = ev.choice
                prompts[i].extend(ev.prompt)
                text[i].append(ev.text)
                reasoning[i].append(ev.reasoning)
                tokens[i].extend(ev.tokens)
                if ev.done:
                    ends[i] = ev
                    if ev.finish_reason in ("error", "cancelled"):
                        break
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            for job, e in zip(jobs, ends, strict=True):
                if e is None:
                    self._cancel(job)
        for e in ends:
            if e is not None and e.finish_reason in ("error", "cancelled"):
                raise self._failure(e)
        done = [e for e in ends if e is not None]
        body: dict[str, Any] = {"id": rid, "created": int(time.time()), "model": self.config.model_id}
        choices = []
        for i, ev in enumerate(done):
            content = "".join(text[i])
            if req.kind == "chat":
                calls: list[dict[str, Any]] = []
                parser = self._tool_parser(req)
                if req.tool_choice == "required" and ev.finish_reason == "stop":
                    call = self._forcing(req).call(content)
                    if call is not None:
                        content, calls = "", [call]
                elif parser is not None:
                    head, calls = parser.push(content)
                    tail, more = parser.finish()
                    content, calls = head + tail, calls + more
                    reasoning[i].append(parser.take_reasoning())
                msg: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
                if calls:
                    msg["tool_calls"] = calls
                if any(reasoning[i]):
                    msg["reasoning_content"] = "".join(reasoning[i])
                reason = "tool_calls" if calls and ev.finish_reason == "stop" else _finish_reason(ev.finish_reason)
                choices.append({"index": i, "message": msg,
                                "logprobs": _chat_logprobs(tokens[i]) if req.logprobs else None,
                                "finish_reason": reason})
            else:
                head = "".join(t.text for t in prompts[i]) if prompts[i] else echo
                choices.append({"index": i, "text": head + content,
                                "logprobs": _completion_logprobs(prompts[i] + tokens[i], 0) if req.logprobs
                                else None,
                                "finish_reason": _finish_reason(ev.finish_reason)})
        body["object"] = "chat.completion" if req.kind == "chat" else "text_completion"
        u = _total([e.usage or Usage() for e in done])
        body |= {"choices": choices, "usage": _usage(u), "timings": _timings(u)}
        return JSONResponse(body)

    async def _sse(self, req: GenRequest, rid: str, st: Started, echo: str = "") -> AsyncIterator[str]:
        """A streamed reply as server-sent events ending in ``data: [DONE]`` (each choice's chunks carry its
        ``index``; the last chunk of each its ``finish_reason``); closing the stream cancels it."""
        jobs, events = st.jobs, st.events
        created = int(time.time())
        chat = req.kind == "chat"
        base = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
                "model": self.config.model_id}
        n = len(jobs)
        offset = [0] * n

        def chunk(choice: dict[str, Any] | None, usage: Usage | None = None, final: bool = False) -> str:
            d = dict(base)
            d["choices"] = [choice] if choice is not None else []
            if req.include_usage:
                d["usage"] = _usage(usage) if usage is not None else None
            if final and usage is not None:
                d["timings"] = _timings(usage)
            return f"data: {json.dumps(d, ensure_ascii=False)}\n\n"

        ended: list[Event | None] = [None] * n
        try:
            for i in range(n):
                if chat:
                    yield chunk({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                 "finish_reason": None})
                elif echo and not req.logprobs:  # (with logprobs: when the prompt's come)
                    yield chunk({"index": i, "text": echo, "finish_reason": None, "logprobs": None})
            parsers = [self._tool_parser(req) if chat else None for _ in range(n)]
            forced: list[list[str]] = [[] for _ in range(n)]  # a required call: its JSON, sent as a call at the end
            n_calls = [0] * n

            def call_chunks(i: int, calls: list[dict[str, Any]]) -> list[str]:
                out = []
                for call in calls:
                    out.append(chunk({"index": i, "delta": {"tool_calls": [{"index": n_calls[i], **call}]},
                                      "logprobs": None, "finish_reason": None}))
                    n_calls[i] += 1
                return out

            while True:
                ev = await events.get()
                i = ev.choice
                if ev.prompt:  # echo with logprobs: the prompt's text and tokens
                    head = "".join(t.text for t in ev.prompt)
                    yield chunk({"index": i, "text": head, "finish_reason": None,
                                 "logprobs": _completion_logprobs(ev.prompt, 0)})
                    offset[i] += len(head)
                parser = parsers[i]
                if chat and (parser is not None or req.tool_choice == "required"):
                    calls: list[dict[str, Any]] = []
                    if req.tool_choice == "required":
                        forced[i].append(ev.text)
                        ev.text = ""
                        if ev.done and ev.finish_reason == "stop":
                            call = self._forcing(req).call("".join(forced[i]))
                            if call is None:
                                ev.text = "".join(forced[i])
                            else:
                                calls = [call]
                        elif ev.done:
                            ev.text = "".join(forced[i])
                    elif parser is not None:
                        ev.text, calls = parser.push(ev.text)
                        if ev.done:
                            tail, more = parser.finish()
                            ev.text, calls = ev.text + tail, calls + more
                        ev.reasoning += parser.take_reasoning()
                    for line in call_chunks(i, calls):
                        yield line
                if ev.text or ev.reasoning or ev.tokens:
                    if chat:
                        delta: dict[str, Any] = {"content": ev.text} if ev.text or ev.tokens else {}
                        if ev.reasoning:
                            delta["reasoning_content"] = ev.reasoning
                        yield chunk({"index": i, "delta": delta,
                                     "logprobs": _chat_logprobs(ev.tokens) if req.logprobs else None,
                                     "finish_reason": None})
                    else:
                        yield chunk({"index": i, "text": ev.text, "finish_reason": None,
                                     "logprobs": _completion_logprobs(ev.tokens, offset[i]) if req.logprobs
                                     else None})
                    offset[i] += len(ev.text)
                if not ev.done:
                    continue
                ended[i] = ev
                if ev.finish_reason in ("error", "cancelled"):
                    yield f"data: {json.dumps(self._failure(ev).body())}\n\n"
                    yield "data: [DONE]\n\n"
                    return
                reason = _finish_reason(ev.finish_reason)
                if n_calls[i] and ev.finish_reason == "stop":
                    reason = "tool_calls"
                last = all(e is not None for e in ended)
                u = _total([e.usage or Usage() for e in ended if e is not None]) if last else None
                tail = None if req.include_usage else u
                if chat:
                    yield chunk({"index": i, "delta": {}, "logprobs": None, "finish_reason": reason},
                                tail, final=last and not req.include_usage)
                else:
                    yield chunk({"index": i, "text": "", "logprobs": None, "finish_reason": reason},
                                tail, final=last and not req.include_usage)
                if not last:
                    continue
                if req.include_usage:
                    yield chunk(None, u, final=True)
                yield "data: [DONE]\n\n"
                return
        finally:
            for job, e in zip(jobs, ended, strict=True):
                if e is None:  # the client closed the stream (or a choice failed): the slot is freed at the next step
                    self._cancel(job)
