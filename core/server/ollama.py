"""Ollama's API on the same server: ``/api/version``, ``/api/tags``, ``/api/show``, ``/api/ps``, ``/api/chat``,
``/api/generate``, ``/api/embed`` (501: no embedding model), and ``GET``/``HEAD /`` ("Ollama is running").

A chat or generate body is checked field by field in Ollama's terms (``options``, ``format``, ``keep_alive`` …)
and turned into the OpenAI request it means, which :func:`~.protocol.parse_generation` checks again: the same
validation, scheduling, tool calls and JSON mode as ``/v1/chat/completions``; a refusal names Ollama's field
(``options.num_predict``) and comes as Ollama's ``{"error": "…"}``. Replies are NDJSON lines by default
(``stream`` false: one object), with ``done_reason``, token counts and durations in nanoseconds.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from .errors import ApiError, bad_request
from .protocol import MAX_MESSAGES, GenRequest, _show, parse_generation
from .scheduler import Event
from .tools import supports_tools

if TYPE_CHECKING:
    from .dialect import Host as ServerApp
    from .dialect import Started

#: the Ollama API version these endpoints follow (clients check it for features)
OLLAMA_VERSION = "0.12.0"
#: Ollama's ``options`` that map to our sampling: option -> the OpenAI field it becomes
OPTIONS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p", "seed": "seed",
           "num_predict": "n_predict", "stop": "stop", "repeat_penalty": "repeat_penalty",
           "repeat_last_n": "repeat_last_n", "presence_penalty": "presence_penalty",
           "frequency_penalty": "frequency_penalty"}
#: Ollama's options about how a model is loaded and run: they do not change the reply, taken when well typed
IGNORED_OPTIONS = frozenset({"num_keep", "num_batch", "num_gpu", "main_gpu", "use_mmap", "use_mlock", "num_thread",
                             "numa", "low_vram", "f16_kv", "vocab_only", "penalize_newline", "typical_p",
                             "tfs_z", "mirostat", "mirostat_tau", "mirostat_eta", "num_gqa"})
ROLES = frozenset({"system", "user", "assistant", "tool"})
#: the OpenAI field a refusal names -> Ollama's
_FIELDS = {v: f"options.{k}" for k, v in OPTIONS.items()} | {"response_format": "format"}


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _string(d: dict[str, Any], key: str, default: str = "") -> str:
    v = d.get(key)
    if v is None:
        return default
    if not isinstance(v, str):
        raise bad_request(f"{key} must be a string, not {_show(v)}", key)
    return v


def _keep_alive(d: dict[str, Any]) -> None:
    """``keep_alive`` (a duration such as "5m", or seconds): taken, and meaningless here (the model stays)."""
    v = d.get("keep_alive")
    if v is not None and (isinstance(v, bool) or not isinstance(v, (str, int, float)) or
                          (isinstance(v, str) and len(v) > 32)):
        raise bad_request(f"keep_alive must be a duration (\"5m\") or a number of seconds, not {_show(v)}",
                          "keep_alive")


def _options(d: dict[str, Any], out: dict[str, Any], n_ctx: int) -> int | None:
    """``options`` into the OpenAI fields of ``out``; the ``num_ctx`` asked for (None: the server's)."""
    o = d.get("options")
    if o is None:
        return None
    if not isinstance(o, dict):
        raise bad_request(f"options must be an object, not {_show(o)}", "options")
    for k, v in o.items():
        if v is None:
            continue
        if k in OPTIONS:
            out[OPTIONS[k]] = v
        elif k in IGNORED_OPTIONS and not isinstance(v, (bool, int, float)):
            raise bad_request(f"options.{k} must be a number or a boolean, not {_show(v)}", f"options.{k}")
    if out.get("n_predict") == -2:  # Ollama's "fill the context"
        out["n_predict"] = -1
    if out.get("repeat_last_n") == -1:  # Ollama's "the whole context"
        out["repeat_last_n"] = n_ctx
    num_ctx = o.get("num_ctx")
    if num_ctx is None:
        return None
    if isinstance(num_ctx, bool) or not isinstance(num_ctx, int) or not 1 <= num_ctx <= 1 << 31:
        raise bad_request(f"options.num_ctx must be a positive integer, not {_show(num_ctx)}", "options.num_ctx")
    return num_ctx if num_ctx < n_ctx else None


def _format(d: dict[str, Any], out: dict[str, Any]) -> None:
    f = d.get("format")
    if f is None or f == "":
        return
    if f == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(f, dict):
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "format", "schema": f}}
    else:
        raise bad_request(f"format must be \"json\" or a JSON schema object, not {_show(f)}", "format")


def _messages(v: Any) -> list[dict[str, Any]]:
    """Ollama's messages as OpenAI's (tool calls' ``arguments`` objects, a tool's reply named by ``tool_name``)."""
    if not isinstance(v, list) or len(v) > MAX_MESSAGES:
        raise bad_request(f"messages must be a list of at most {MAX_MESSAGES} messages", "messages")
    out = []
    for i, m in enumerate(v):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_request(f"{where} must be an object", where)
        role = m.get("role")
        if role not in ROLES:
            raise bad_request(f"{where}.role must be one of {', '.join(sorted(ROLES))}, not {_show(role)}",
                              f"{where}.role")
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            raise bad_request(f"{where}.content must be a string", f"{where}.content")
        if m.get("images"):
            raise bad_request(f"{where}.images: images are not supported by this model", f"{where}.images")
        msg: dict[str, Any] = {"role": role, "content": content or ""}
        calls = m.get("tool_calls")
        if calls:
            if not isinstance(calls, list):
                raise bad_request(f"{where}.tool_calls must be a list", f"{where}.tool_calls")
            msg["tool_calls"] = [{"type": "function", **c} if isinstance(c, dict) else c for c in calls]
        name = m.get("tool_name", m.get("name"))
        if isinstance(name, str):
            msg["name"] = name
        out.append(msg)
    return out


def _renamed(exc: ApiError) -> ApiError:
    """An OpenAI field's refusal worded with Ollama's name for it."""
    new = _FIELDS.get(exc.param or "")
    if new is None:
        return exc
    return ApiError(exc.status, exc.message.replace(exc.param or "", new, 1), param=new, code=exc.code,
                    headers=exc.headers)


def _common(d: dict[str, Any], model_id: str, n_ctx: int) -> tuple[dict[str, Any], int | None]:
    """What chat and generate share: the model, ``stream`` (true unless false), ``keep_alive``, ``options``,
    ``format`` and ``think``, as an OpenAI body and the ``num_ctx`` asked for."""
    model = d.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("model is required (a string)", "model")
    if model in (model_id + ":latest",):
        model = model_id
    stream = d.get("stream", True)
    if stream is None:
        stream = True
    if not isinstance(stream, bool):
        raise bad_request(f"stream must be true or false, not {_show(stream)}", "stream")
    think = d.get("think")
    if think is not None and not isinstance(think, (bool, str)):
        raise bad_request(f"think must be true, false or a level, not {_show(think)}", "think")
    _keep_alive(d)
    out: dict[str, Any] = {"model": model, "stream": stream}
    num_ctx = _options(d, out, n_ctx)
    _format(d, out)
    return out, num_ctx


def parse_chat(d: dict[str, Any], model_id: str, n_vocab: int, n_ctx: int) -> GenRequest | None:
    """An /api/chat body as a :class:`GenRequest`; None for no messages (Ollama's "load the model")."""
    out, num_ctx = _common(d, model_id, n_ctx)
    msgs = _messages(d.get("messages", []))
    if not msgs:
        return None
    out["messages"] = msgs
    if d.get("tools") is not None:
        out["tools"] = d["tools"]
    try:
        req = parse_generation(out, "chat", n_vocab, n_ctx)
    except ApiError as exc:
        raise _renamed(exc) from None
    req.n_ctx = num_ctx
    return req


def parse_generate(d: dict[str, Any], model_id: str, n_vocab: int, n_ctx: int) -> GenRequest | None:
    """An /api/generate body as a :class:`GenRequest`: ``prompt`` (with ``system``) through the chat template,
    or as it is with ``raw``; None for an empty prompt (Ollama's "load the model")."""
    out, num_ctx = _common(d, model_id, n_ctx)
    prompt, system = _string(d, "prompt"), _string(d, "system")
    raw = d.get("raw", False)
    if not isinstance(raw, bool):
        raise bad_request(f"raw must be true or false, not {_show(raw)}", "raw")
    suffix = _string(d, "suffix")  # fill in the middle (the model's FIM tokens, :mod:`.fim`)
    if _string(d, "template"):
        raise bad_request("template is not supported: the model's own chat template is used (or raw: true)",
                          "template")
    if d.get("context"):
        raise bad_request("context is not supported: send the conversation to /api/chat", "context")
    if d.get("images"):
        raise bad_request("images are not supported by this model", "images")
    if not prompt:
        return None
    if suffix:
        out["prompt"], out["suffix"] = prompt, suffix
    elif raw:
        out["prompt"] = prompt
    else:
        out["messages"] = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": prompt}]
    try:
        req = parse_generation(out, "completion" if raw or suffix else "chat", n_vocab, n_ctx)
    except ApiError as exc:
        raise _renamed(exc) from None
    req.n_ctx = num_ctx
    return req


def ollama_call(call: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI tool call (``arguments`` a JSON string) in Ollama's shape (``arguments`` an object)."""
    fn = call["function"]
    try:
        args = json.loads(fn["arguments"])
    except ValueError:
        args = {}
    return {"function": {"name": fn["name"], "arguments": args}}


def _param_size(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"


def model_entry(name: str, f: Any) -> dict[str, Any]:
    """The model's row in ``/api/tags`` from its open GGUF file ``f`` (its header and first MiB): name, size,
    modification time, a digest (of the name, size and first MiB) and details (family, parameters, quantization)."""
    path = f.path
    size = int(getattr(f, "file_size", 0) or (path.stat().st_size if path is not None else 0))
    h = hashlib.sha256(f"{name}:{size}".encode())
    if path is not None:
        with open(path, "rb") as fh:
            h.update(fh.read(1 << 20))
    modified = (datetime.fromtimestamp(path.stat().st_mtime, UTC) if path is not None
                else datetime.now(UTC)).isoformat().replace("+00:00", "Z")
    ft = f.file_type_name
    arch = f.architecture or "unknown"
    details = {"parent_model": "", "format": "gguf", "family": arch, "families": [arch],
               "parameter_size": _param_size(sum(t.n_elements for t in f.tensors)),
               "quantization_level": ft.removeprefix("MOSTLY_").removeprefix("ALL_") if ft else "unknown"}
    return {"name": name, "model": name, "modified_at": modified, "size": size, "digest": h.hexdigest(),
            "details": details}


class OllamaApi:
    """The Ollama endpoints of ``app`` (see the module's docstring)."""

    def __init__(self, app: ServerApp) -> None:
        self.app = app
        self.name = app.config.model_id
        entry = model_entry(self.name, app.engine.file)
        self.size, self.digest, self.modified = entry["size"], entry["digest"], entry["modified_at"]
        self.details = entry["details"]

    def routes(self) -> list[Route]:
        w = self.app._wrap
        return [
            Route("/", w(self.root), methods=["GET", "HEAD"]),
            Route("/api/version", w(self.version), methods=["GET", "HEAD"]),
            Route("/api/tags", w(self.tags), methods=["GET", "HEAD"]),
            Route("/api/ps", w(self.ps), methods=["GET"]),
            Route("/api/show", w(self.show), methods=["POST"]),
            Route("/api/chat", w(self.chat), methods=["POST"]),
            Route("/api/generate", w(self.generate), methods=["POST"]),
            Route("/api/embed", w(self.embed), methods=["POST"]),
            Route("/api/embeddings", w(self.embed), methods=["POST"]),
        ]

    def _entry(self) -> dict[str, Any]:
        return {"name": self.name, "model": self.name, "modified_at": self.modified, "size": self.size,
                "digest": self.digest, "details": self.details}

    def _model(self, d: dict[str, Any]) -> None:
        """The body's ``model`` (``name`` in old clients), refused unless it is the one served."""
        m = d.get("model", d.get("name"))
        if not isinstance(m, str):
            raise bad_request("model is required (a string)", "model")
        self.app._check_model(self.name if m == self.name + ":latest" else m)

    async def root(self, request: Request) -> Response:
        return PlainTextResponse("Ollama is running")

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": OLLAMA_VERSION})

    async def tags(self, request: Request) -> Response:
        return JSONResponse({"models": [self._entry()]})

    async def ps(self, request: Request) -> Response:
        gpu = self.app.engine.backend != "cpu"
        return JSONResponse({"models": [self._entry() | {
            "expires_at": "2318-01-01T00:00:00Z", "size_vram": self.size if gpu else 0,
            "context_length": self.app.engine.n_ctx}]})

    async def show(self, request: Request) -> Response:
        d = await self.app._json(request)
        self._model(d)
        eng = self.app.engine
        c = eng.model.config
        caps = ["completion"]
        tpl = eng.template
        if tpl is not None and eng.template_error is None and supports_tools(tpl.source):
            caps.append("tools")
        if eng.harmony is not None:
            caps.append("thinking")
        info = {"general.architecture": c.arch, "general.parameter_count": sum(t.n_elements for t in eng.file.tensors),
                f"{c.arch}.context_length": c.n_ctx_train, f"{c.arch}.embedding_length": c.n_embd,
                "tokenizer.vocab_size": c.n_vocab}
        return JSONResponse({"modelfile": f"FROM {self.name}\n", "parameters": f"num_ctx {eng.n_ctx}",
                             "template": tpl.source if tpl is not None else "", "details": self.details,
                             "model_info": info, "capabilities": caps, "modified_at": self.modified})

    async def embed(self, request: Request) -> Response:
        d = await self.app._json(request)
        self._model(d)
        raise ApiError(501, f"embeddings are not available: {self.name} is a text generation model and this "
                       "server has no embedding model", code="unsupported_endpoint")

    def _load(self, d: dict[str, Any], key: str) -> Response:
        """Ollama's answer to a request with nothing to generate: the model is loaded."""
        self._model(d)
        body: dict[str, Any] = {"model": self.name, "created_at": _now(), "done": True, "done_reason": "load"}
        body[key] = {"role": "assistant", "content": ""} if key == "message" else ""
        return JSONResponse(body)

    async def chat(self, request: Request) -> Response:
        return await self._run(request, "message")

    async def generate(self, request: Request) -> Response:
        return await self._run(request, "response")

    async def _run(self, request: Request, key: str) -> Response:
        app = self.app
        eng = app.engine
        parse = parse_chat if key == "message" else parse_generate

        def parsed(d: dict[str, Any]) -> GenRequest | None:
            return parse(d, self.name, eng.tokenizer.n_vocab, eng.n_ctx)

        async def respond(req: GenRequest, ids: list[int], st: Started) -> Response:
            if req.stream:
                return StreamingResponse(self._lines(req, st, key), media_type="application/x-ndjson")
            g = await app.gather(request, req, st)
            body = self._head(key, g.text, g.calls, g.reasoning) | self._tail(st, g.end)
            return JSONResponse(body)

        return await app.generation(request, parsed, respond, early=lambda d: self._load(d, key))

    def _head(self, key: str, text: str, calls: list[dict[str, Any]], thinking: str = "",
              done: bool = True) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.name, "created_at": _now()}
        if key == "message":
            msg: dict[str, Any] = {"role": "assistant", "content": text}
            if thinking:
                msg["thinking"] = thinking
            if calls:
                msg["tool_calls"] = [ollama_call(c) for c in calls]
            body["message"] = msg
        else:
            body["response"] = text
            if thinking:
                body["thinking"] = thinking
        body["done"] = done
        return body

    def _tail(self, st: Started, ev: Event) -> dict[str, Any]:
        u = ev.usage
        return {"done_reason": "length" if ev.finish_reason == "length" else "stop",
                "total_duration": int((time.perf_counter() - st.t0) * 1e9), "load_duration": 0,
                "prompt_eval_count": u.prompt_tokens if u else 0,
                "prompt_eval_duration": int(u.prompt_ms * 1e6) if u else 0,
                "eval_count": u.completion_tokens if u else 0,
                "eval_duration": int(u.predicted_ms * 1e6) if u else 0}

    async def _lines(self, req: GenRequest, st: Started, key: str) -> AsyncIterator[str]:
        """The reply as NDJSON: a line per piece, the last one ``done`` with the counts; an error as
        ``{"error": …}``."""
        async with contextlib.aclosing(self.app.parts(req, st)) as parts:
            async for p in parts:
                if p.end is not None:
                    ev = p.end
                    if ev.finish_reason in ("error", "cancelled"):
                        yield json.dumps({"error": self.app._failure(ev).message}) + "\n"
                        return
                    last = self._head(key, "", []) | self._tail(st, ev)
                    yield json.dumps(last, ensure_ascii=False) + "\n"
                    return
                if p.text or p.call is not None or p.reasoning:
                    line = self._head(key, p.text, [p.call] if p.call is not None else [], p.reasoning, done=False)
                    yield json.dumps(line, ensure_ascii=False) + "\n"


__all__ = ["OLLAMA_VERSION", "OllamaApi", "ollama_call", "parse_chat", "parse_generate"]
