"""Anthropic's Messages API on the same server: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

A body is checked in Anthropic's terms (``max_tokens`` required, ``system`` a string or text blocks, content
blocks ``text``, ``tool_use`` and ``tool_result``, ``stop_sequences``, ``tools`` with ``input_schema``,
``tool_choice`` auto / any / tool / none) and turned into the OpenAI chat request it means, which
:func:`~.protocol.parse_generation` checks again: the same validation, scheduling and tool calls as
``/v1/chat/completions``. Refusals come as ``{"type": "error", "error": {"type", "message"}}``. A streamed reply
is server-sent events: ``message_start``, ``ping``, ``content_block_start`` / ``content_block_delta``
(``text_delta``, ``input_json_delta``) / ``content_block_stop`` per block, ``message_delta`` (stop reason,
usage) and ``message_stop``.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .errors import ANTHROPIC_TYPES, ApiError, bad_request
from .protocol import MAX_MESSAGES, MAX_STOP, GenRequest, _show, parse_generation
from .scheduler import Event, Usage

if TYPE_CHECKING:
    from .dialect import Host as ServerApp
    from .dialect import Started

ROLES = frozenset({"user", "assistant"})
#: blocks a client may send back that carry nothing for this model (an earlier reply's thinking)
SKIPPED_BLOCKS = frozenset({"thinking", "redacted_thinking"})


def _text_blocks(v: Any, where: str) -> str:
    """A string, or a list of text blocks joined (``system``, a tool result's content)."""
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        out = []
        for j, b in enumerate(v):
            if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
                kind = b.get("type") if isinstance(b, dict) else None
                raise bad_request(f"{where}[{j}] must be a text block" + (f", not {_show(kind)}" if kind else ""),
                                  where)
            out.append(b["text"])
        return "".join(out)
    raise bad_request(f"{where} must be a string or a list of text blocks", where)


def _message(m: Any, i: int) -> list[dict[str, Any]]:
    """One Anthropic message as OpenAI messages: a user's tool results become ``tool`` messages (first, as they
    answer the calls before), an assistant's tool_use blocks its ``tool_calls``."""
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise bad_request(f"{where} must be an object", where)
    role = m.get("role")
    if role not in ROLES:
        raise bad_request(f"{where}.role must be user or assistant, not {_show(role)}", f"{where}.role")
    content = m.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise bad_request(f"{where}.content must be a string or a list of content blocks", f"{where}.content")
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for j, b in enumerate(content):
        bw = f"{where}.content[{j}]"
        kind = b.get("type") if isinstance(b, dict) else None
        if not isinstance(b, dict) or not isinstance(kind, str):
            raise bad_request(f"{bw} must be a content block with a type", bw)
        if kind == "text":
            if not isinstance(b.get("text"), str):
                raise bad_request(f"{bw}.text must be a string", bw)
            text.append(b["text"])
        elif kind == "tool_use" and role == "assistant":
            name, args, cid = b.get("name"), b.get("input", {}), b.get("id", "")
            if not isinstance(name, str) or not isinstance(args, dict) or not isinstance(cid, str):
                raise bad_request(f"{bw} must be {{\"type\": \"tool_use\", \"id\", \"name\", \"input\": {{…}}}}", bw)
            calls.append({"id": cid, "type": "function", "function": {"name": name, "arguments": args}})
        elif kind == "tool_result" and role == "user":
            cid = b.get("tool_use_id")
            if not isinstance(cid, str):
                raise bad_request(f"{bw}.tool_use_id must be a string", bw)
            body = _text_blocks(b.get("content", ""), f"{bw}.content")
            if b.get("is_error") is True:
                body = f"Error: {body}"
            results.append({"role": "tool", "tool_call_id": cid, "content": body})
        elif kind in SKIPPED_BLOCKS:
            continue
        else:
            raise bad_request(f"{bw}: {kind} blocks are not supported in a {role} message", bw)
    out = list(results)
    if text or (not results and not calls):
        out.append({"role": role, "content": "".join(text)})
    if calls:
        if out and out[-1]["role"] == "assistant":
            out[-1]["tool_calls"] = calls
        else:
            out.append({"role": "assistant", "content": "", "tool_calls": calls})
    return out


def _tools(d: dict[str, Any], out: dict[str, Any]) -> None:
    tools = d.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise bad_request("tools must be a list", "tools")
        conv = []
        for j, t in enumerate(tools):
            if not isinstance(t, dict) or t.get("type", "custom") != "custom":
                kind = t.get("type") if isinstance(t, dict) else None
                raise bad_request(f"tools[{j}]: only client tools are supported" +
                                  (f", not {_show(kind)}" if kind else ""), "tools")
            schema = t.get("input_schema")
            if not isinstance(schema, dict):
                raise bad_request(f"tools[{j}].input_schema must be a JSON Schema object", "tools")
            desc = t.get("description", "")
            if not isinstance(desc, str):
                raise bad_request(f"tools[{j}].description must be a string", "tools")
            conv.append({"type": "function", "function": {"name": t.get("name"), "description": desc,
                                                          "parameters": schema}})
        out["tools"] = conv
    tc = d.get("tool_choice")
    if tc is None:
        return
    kind = tc.get("type") if isinstance(tc, dict) else None
    if kind in ("auto", "none"):
        out["tool_choice"] = kind
    elif kind == "any":
        out["tool_choice"] = "required"
    elif kind == "tool" and isinstance(tc.get("name"), str):
        out["tool_choice"] = {"type": "function", "function": {"name": tc["name"]}}
    else:
        raise bad_request("tool_choice must be {\"type\": \"auto\"}, {\"type\": \"any\"}, {\"type\": \"none\"} or "
                          "{\"type\": \"tool\", \"name\": …}", "tool_choice")


def to_openai(d: dict[str, Any], count_only: bool = False) -> dict[str, Any]:
    """A Messages body as the OpenAI chat body it means (:class:`ApiError` for what is wrong)."""
    model = d.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("model: field required (a string)", "model")
    out: dict[str, Any] = {"model": model}
    if not count_only:
        mt = d.get("max_tokens")
        if mt is None:
            raise bad_request("max_tokens: field required", "max_tokens")
        if isinstance(mt, bool) or not isinstance(mt, int) or not 1 <= mt <= 1 << 30:
            raise bad_request(f"max_tokens must be an integer in [1, {1 << 30}], not {_show(mt)}", "max_tokens")
        out["max_tokens"] = mt
        stream = d.get("stream", False)
        if not isinstance(stream, bool):
            raise bad_request(f"stream must be true or false, not {_show(stream)}", "stream")
        out["stream"] = stream
        for key in ("temperature", "top_p", "top_k"):
            if d.get(key) is not None:
                out[key] = d[key]
        t = d.get("temperature")
        if isinstance(t, (int, float)) and not isinstance(t, bool) and not 0 <= t <= 1:
            raise bad_request(f"temperature must be in [0, 1], not {_show(t)}", "temperature")
        stops = d.get("stop_sequences")
        if stops is not None:
            if not isinstance(stops, list) or len(stops) > MAX_STOP:
                raise bad_request(f"stop_sequences must be a list of at most {MAX_STOP} strings", "stop_sequences")
            out["stop"] = stops
        for key in ("metadata", "thinking"):
            if d.get(key) is not None and not isinstance(d[key], dict):
                raise bad_request(f"{key} must be an object", key)
    msgs = d.get("messages")
    if not isinstance(msgs, list) or not msgs or len(msgs) > MAX_MESSAGES:
        raise bad_request(f"messages must be a non-empty list of at most {MAX_MESSAGES} messages", "messages")
    conv: list[dict[str, Any]] = []
    system = d.get("system")
    if system is not None:
        s = _text_blocks(system, "system")
        if s:
            conv.append({"role": "system", "content": s})
    for i, m in enumerate(msgs):
        conv.extend(_message(m, i))
    out["messages"] = conv
    _tools(d, out)
    return out


def parse_messages(d: dict[str, Any], n_vocab: int, n_ctx: int, count_only: bool = False) -> GenRequest:
    """A /v1/messages body as a :class:`GenRequest`; a refusal names Anthropic's field."""
    body = to_openai(d, count_only)
    try:
        return parse_generation(body, "chat", n_vocab, n_ctx)
    except ApiError as exc:
        if exc.param == "stop":
            exc.message, exc.param = exc.message.replace("stop", "stop_sequences", 1), "stop_sequences"
        raise


def _stop_reason(ev: Event, called: bool) -> str:
    if ev.finish_reason == "length":
        return "max_tokens"
    if called:
        return "tool_use"
    return "stop_sequence" if ev.stop_sequence else "end_turn"


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    fn = call["function"]
    try:
        args = json.loads(fn["arguments"])
    except ValueError:
        args = {}
    return {"type": "tool_use", "id": "toolu_" + call["id"].removeprefix("call_"), "name": fn["name"],
            "input": args if isinstance(args, dict) else {}}


def _sse(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps(data | {'type': kind}, ensure_ascii=False)}\n\n"


class AnthropicApi:
    """The Messages endpoints of ``app`` (see the module's docstring)."""

    def __init__(self, app: ServerApp) -> None:
        self.app = app

    def routes(self) -> list[Route]:
        w = self.app._wrap
        return [Route("/v1/messages", w(self.messages), methods=["POST"]),
                Route("/v1/messages/count_tokens", w(self.count_tokens), methods=["POST"])]

    async def count_tokens(self, request: Request) -> Response:
        app, eng = self.app, self.app.engine
        req = parse_messages(await app._json(request), eng.tokenizer.n_vocab, eng.n_ctx, count_only=True)
        app._check_model(req.model)
        ids = await run_in_threadpool(app._prompt_ids, req)
        return JSONResponse({"input_tokens": len(ids)})

    async def messages(self, request: Request) -> Response:
        app, eng = self.app, self.app.engine

        def parse(d: dict[str, Any]) -> GenRequest:
            return parse_messages(d, eng.tokenizer.n_vocab, eng.n_ctx)

        async def respond(req: GenRequest, ids: list[int], st: Started) -> Response:
            mid = "msg_" + uuid.uuid4().hex[:24]
            if req.stream:
                return StreamingResponse(self._events(req, st, mid, len(ids)), media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            g = await app.gather(request, req, st)
            content: list[dict[str, Any]] = []
            if g.reasoning:
                content.append({"type": "thinking", "thinking": g.reasoning, "signature": ""})
            if g.text or not g.calls:
                content.append({"type": "text", "text": g.text})
            content.extend(_tool_use(c) for c in g.calls)
            u = g.end.usage or Usage()
            called = bool(g.calls) and g.end.finish_reason == "stop"
            return JSONResponse({
                "id": mid, "type": "message", "role": "assistant", "model": app.config.model_id,
                "content": content, "stop_reason": _stop_reason(g.end, called),
                "stop_sequence": g.end.stop_sequence or None,
                "usage": {"input_tokens": u.prompt_tokens, "output_tokens": u.completion_tokens,
                          "cache_read_input_tokens": u.cached_tokens}})

        return await app.generation(request, parse, respond)

    async def _events(self, req: GenRequest, st: Started, mid: str, n_prompt: int) -> AsyncIterator[str]:
        """The streamed reply's events (see the module's docstring); a failure as an ``error`` event."""
        yield _sse("message_start", {"message": {
            "id": mid, "type": "message", "role": "assistant", "model": self.app.config.model_id, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": n_prompt, "output_tokens": 0}}})
        yield _sse("ping", {})
        index = -1
        open_kind = ""  # the kind of block open: "", "text" or "thinking"
        called = False

        def close() -> list[str]:
            nonlocal open_kind
            if not open_kind:
                return []
            open_kind = ""
            return [_sse("content_block_stop", {"index": index})]

        def start(kind: str, block: dict[str, Any]) -> list[str]:
            nonlocal index, open_kind
            out = close()
            index += 1
            open_kind = kind
            return [*out, _sse("content_block_start", {"index": index, "content_block": block})]

        async with contextlib.aclosing(self.app.parts(req, st)) as parts:
            async for p in parts:
                out: list[str] = []
                if p.reasoning:
                    if open_kind != "thinking":
                        out += start("thinking", {"type": "thinking", "thinking": ""})
                    out.append(_sse("content_block_delta", {"index": index, "delta": {
                        "type": "thinking_delta", "thinking": p.reasoning}}))
                if p.text:
                    if open_kind != "text":
                        out += start("text", {"type": "text", "text": ""})
                    out.append(_sse("content_block_delta", {"index": index, "delta": {
                        "type": "text_delta", "text": p.text}}))
                if p.call is not None:
                    called = True
                    use = _tool_use(p.call)
                    out += start("tool_use", {"type": "tool_use", "id": use["id"], "name": use["name"],
                                              "input": {}})
                    out.append(_sse("content_block_delta", {"index": index, "delta": {
                        "type": "input_json_delta", "partial_json": json.dumps(use["input"], ensure_ascii=False)}}))
                    out += close()
                for line in out:
                    yield line
                ev = p.end
                if ev is None:
                    continue
                if ev.finish_reason in ("error", "cancelled"):
                    exc = self.app._failure(ev)
                    yield _sse("error", {"error": {"type": ANTHROPIC_TYPES.get(exc.status, "api_error"),
                                                   "message": exc.message}})
                    return
                if index < 0:  # an empty reply: one empty text block, as Anthropic sends
                    for line in start("text", {"type": "text", "text": ""}):
                        yield line
                for line in close():
                    yield line
                u = ev.usage or Usage()
                yield _sse("message_delta", {"delta": {"stop_reason": _stop_reason(ev, called and ev.finish_reason
                                                                                   == "stop"),
                                                       "stop_sequence": ev.stop_sequence or None},
                                             "usage": {"output_tokens": u.completion_tokens}})
                yield _sse("message_stop", {})
                return


__all__ = ["AnthropicApi", "parse_messages", "to_openai"]
