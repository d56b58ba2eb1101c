"""The OpenAI request bodies, checked field by field into :class:`GenRequest` before the engine sees anything.

Every known field is validated (type and range); a field this server cannot honour (a JSON schema it cannot
enforce) is refused with a 400 naming it, never silently ignored. ``n`` choices (at most ``MAX_CHOICES``),
presence and frequency penalties, ``echo`` and ``suffix`` (fill in the middle, :mod:`.fim`) are honoured.
``response_format`` json_object and json_schema, and llama-server's ``grammar`` (GBNF) and ``json_schema`` fields,
are enforced by constrained sampling (:mod:`.jsonmode`, :mod:`.grammar`). Unknown
fields are ignored, as the OpenAI API and llama-server do.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from ..chat import SamplerParams
from .errors import ApiError, bad_request
from .grammar import GrammarError
from .jsonmode import ANY_OBJECT, Schema, SchemaError, compile_grammar, compile_schema

#: limits on what one request may carry (each far above real use, far below what would hurt the server)
MAX_MESSAGES = 4096
MAX_STOP = 16
MAX_STOP_CHARS = 1024
MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 1024
MAX_PROMPT_IDS = 1 << 20
MAX_TOOLS = 128
MAX_CHOICES = 16  # ``n``
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: message roles passed to the chat template (``developer`` is OpenAI's new name for ``system``)
ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object; a 400 for anything else (bad UTF-8, bad JSON, NaN, Infinity or a number too
    large for a float such as ``1e999``, nesting too deep, a lone surrogate such as ``"\\ud800"`` in a string,
    named by its field)."""

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    def finite(text: str) -> float:
        v = float(text)
        if not math.isfinite(v):
            raise ValueError(f"{text} is not a finite number")
        return v

    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=no_constant, parse_float=finite)
    except UnicodeDecodeError:
        raise bad_request("the request body is not UTF-8 text") from None
    except RecursionError:
        raise bad_request("the request body is nested too deeply") from None
    except ValueError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise bad_request("the request body must be a JSON object")
    where = _lone_surrogate(data)
    if where is not None:
        raise bad_request(f"{where} holds a lone surrogate (such as \\ud800): not Unicode text", where)
    return data


def _valid_text(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _lone_surrogate(data: dict[str, Any]) -> str | None:
    """The path (``messages[0].content``) of the first string or key in ``data`` with a lone surrogate, else None."""
    todo: list[tuple[str, Any]] = [("", data)]
    while todo:
        path, v = todo.pop()
        if isinstance(v, str):
            if not _valid_text(v):
                return path
        elif isinstance(v, dict):
            items = []
            for k, x in v.items():
                name = k if _valid_text(k) else k.encode("utf-8", "backslashreplace").decode()
                sub = f"{path}.{name}" if path else name
                if name != k:
                    return sub
                items.append((sub, x))
            todo.extend(reversed(items))
        elif isinstance(v, list):
            todo.extend(reversed([(f"{path}[{i}]", x) for i, x in enumerate(v)]))
    return None


def _number(d: dict[str, Any], key: str, lo: float, hi: float, default: float) -> float:
    v = d.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise bad_request(f"{key} must be a number in [{lo:g}, {hi:g}], not {_show(v)}", key)
    return float(v)


def _integer(d: dict[str, Any], key: str, lo: int, hi: int, default: int | None) -> int | None:
    v = d.get(key)
    if v is None:
        return default
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise bad_request(f"{key} must be an integer in [{lo}, {hi}], not {_show(v)}", key)
    return v


def _flag(d: dict[str, Any], key: str, default: bool = False) -> bool:
    v = d.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad_request(f"{key} must be true or false, not {_show(v)}", key)
    return v


def _show(v: Any) -> str:
    s = json.dumps(v) if not isinstance(v, float) or math.isfinite(v) else str(v)
    return s if len(s) <= 40 else s[:37] + "..."


@dataclass
class GenRequest:
    """A checked chat or text completion request."""

    kind: str  # "chat" or "completion"
    model: str | None
    messages: list[dict[str, Any]] | None = None
    prompt: str | list[int] | None = None
    stream: bool = False
    include_usage: bool = False
    params: SamplerParams = field(default_factory=SamplerParams)
    max_tokens: int | None = None  # None: until the end of generation or the context is full; 0: nothing
    logprobs: bool = False
    top_logprobs: int = 0
    logit_bias: dict[int, float] = field(default_factory=dict)
    json_schema: Schema | None = None  # response_format: the output is held to this (jsonmode)
    tools: list[dict[str, Any]] = field(default_factory=list)  # for the template ([] with tool_choice none)
    tool_choice: str = "none"  # "none", "auto" or "required"
    tool_name: str | None = None  # the function a named tool_choice requires
    ignore_eos: bool = False  # llama-server's: end-of-generation tokens are never sampled
    n_ctx: int | None = None  # a smaller context than the server's (Ollama's num_ctx): the prompt and the reply fit it
    n: int = 1  # choices, each sampled on its own from the same prompt
    echo: bool = False  # completions: the prompt's text comes back before each choice's
    suffix: str | None = None  # completions: fill in the middle between the prompt and this (:mod:`.fim`)
    extra: list[tuple[str, str]] = field(default_factory=list)  # /infill's input_extra: (filename, text)
    infill_prompt: str = ""  # /infill's prompt: text the middle starts with


def _stop(d: dict[str, Any]) -> list[str]:
    v = d.get("stop")
    if v is None:
        return []
    items = [v] if isinstance(v, str) else v
    if (not isinstance(items, list) or len(items) > MAX_STOP
            or not all(isinstance(s, str) and len(s) <= MAX_STOP_CHARS for s in items)):
        raise bad_request(f"stop must be a string or a list of at most {MAX_STOP} strings of at most "
                          f"{MAX_STOP_CHARS} characters", "stop")
    return [s for s in items if s]


def _content(v: Any, i: int) -> str:
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    if isinstance(v, list):  # content parts: text only
        out = []
        for part in v:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else None
                raise bad_request(f"messages[{i}].content: only text parts are supported"
                                  + (f", not {_show(kind)}" if kind else ""), f"messages[{i}].content")
            out.append(part["text"])
        return "".join(out)
    raise bad_request(f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}].content")


def _messages(d: dict[str, Any]) -> list[dict[str, Any]]:
    msgs = d.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad_request("messages must be a non-empty list", "messages")
    if len(msgs) > MAX_MESSAGES:
        raise bad_request(f"at most {MAX_MESSAGES} messages are accepted", "messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise bad_request(f"messages[{i}] must be an object", f"messages[{i}]")
        role = m.get("role")
        if role not in ROLES:
            raise bad_request(f"messages[{i}].role must be one of {', '.join(sorted(ROLES))}, not {_show(role)}",
                              f"messages[{i}].role")
        msg: dict[str, Any] = {"role": "system" if role == "developer" else role,
                               "content": _content(m.get("content"), i)}
        for key in ("name", "tool_call_id"):
            if isinstance(m.get(key), str):
                msg[key] = m[key]
        if m.get("tool_calls"):
            msg["tool_calls"] = _message_calls(m["tool_calls"], f"messages[{i}].tool_calls")
        out.append(msg)
    return out


def _message_calls(v: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls`` as chat templates take them (``arguments`` parsed into an object)."""
    if not isinstance(v, list) or len(v) > MAX_TOOLS:
        raise bad_request(f"{where} must be a list of at most {MAX_TOOLS} calls", where)
    out = []
    for j, call in enumerate(v):
        fn = call.get("function") if isinstance(call, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        args = fn.get("arguments", "{}") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not isinstance(args, (str, dict)):
            raise bad_request(f"{where}[{j}] must be {{\"type\": \"function\", \"function\": {{\"name\", "
                              "\"arguments\"}}}}", where)
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except (ValueError, RecursionError):
                raise bad_request(f"{where}[{j}].function.arguments is not JSON", where) from None
        out.append({"id": str(call.get("id", "")), "type": "function",
                    "function": {"name": name, "arguments": args}})
    return out


def _tools(d: dict[str, Any]) -> tuple[list[dict[str, Any]], str, str | None]:
    """``tools`` and ``tool_choice``: the tools as the template takes them, the choice ("none", "auto" or
    "required") and the one function a named choice requires."""
    tools = d.get("tools")
    if tools is None:
        tools = []
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise bad_request(f"tools must be a list of at most {MAX_TOOLS} tools", "tools")
    names = []
    for j, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict):
            raise bad_request(f"tools[{j}] must be {{\"type\": \"function\", \"function\": {{…}}}}", "tools")
        name = fn.get("name")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise bad_request(f"tools[{j}].function.name must be 1-64 letters, digits, _ or -", "tools")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise bad_request(f"tools[{j}].function.parameters must be a JSON Schema object", "tools")
        names.append(name)
    tc = d.get("tool_choice")
    named = None
    if tc is None:
        choice = "auto" if tools else "none"
    elif tc in ("none", "auto", "required"):
        choice = tc
    elif isinstance(tc, dict) and tc.get("type") == "function" and isinstance(tc.get("function"), dict):
        named, choice = tc["function"].get("name"), "required"
        if named not in names:
            raise bad_request(f"tool_choice names {_show(named)}, which is not among the tools", "tool_choice")
    else:
        raise bad_request("tool_choice must be none, auto, required or {\"type\": \"function\", \"function\": "
                          "{\"name\": …}}", "tool_choice")
    if choice != "none" and not tools:
        raise bad_request(f"tool_choice {choice} needs tools", "tool_choice")
    return (tools if choice != "none" else []), choice, named


def _prompt(d: dict[str, Any], n_vocab: int) -> str | list[int]:
    v = d.get("prompt")
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], (str, list)):
        v = v[0]  # a batch of one
    if isinstance(v, str):
        return v
    if isinstance(v, list) and len(v) <= MAX_PROMPT_IDS and all(
            isinstance(t, int) and not isinstance(t, bool) for t in v):
        bad = next((t for t in v if not 0 <= t < n_vocab), None)
        if bad is not None:
            raise bad_request(f"prompt token {bad} is not in the vocabulary (0..{n_vocab - 1})", "prompt")
        return list(v)
    raise bad_request("prompt must be a string or a list of token ids (a batch of several prompts is not "
                      "supported)", "prompt")


def _unsupported(d: dict[str, Any]) -> None:
    if d.get("functions") or d.get("function_call"):
        raise bad_request("functions (the legacy form of tools) are not supported: use tools", "functions",
                          "unsupported_parameter")


def _logit_bias(d: dict[str, Any], n_vocab: int) -> dict[int, float]:
    v = d.get("logit_bias")
    if v is None:
        return {}
    if not isinstance(v, dict) or len(v) > MAX_LOGIT_BIAS:
        raise bad_request(f"logit_bias must be an object of at most {MAX_LOGIT_BIAS} token ids", "logit_bias")
    out = {}
    for k, b in v.items():
        try:
            t = int(k)
        except ValueError:
            raise bad_request(f"logit_bias key {_show(k)} is not a token id", "logit_bias") from None
        if not 0 <= t < n_vocab:
            raise bad_request(f"logit_bias token {t} is not in the vocabulary (0..{n_vocab - 1})", "logit_bias")
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not -100 <= b <= 100:
            raise bad_request(f"logit_bias values must be numbers in [-100, 100], not {_show(b)}", "logit_bias")
        out[t] = float(b)
    return out


def _response_format(d: dict[str, Any]) -> Schema | None:
    """``response_format``: None for text, else the schema the output is held to (json_object: any object)."""
    rf = d.get("response_format")
    if rf is None:
        return None
    kind = rf.get("type") if isinstance(rf, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return ANY_OBJECT
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict):
            raise bad_request("response_format.json_schema must be an object", "response_format")
        try:
            return compile_schema(js.get("schema", True))
        except SchemaError as exc:
            raise bad_request(f"response_format: {exc}", "response_format", "unsupported_schema") from None
        except RecursionError:
            raise bad_request("response_format: the schema is nested too deeply", "response_format") from None
    raise bad_request("response_format.type must be text, json_object or json_schema", "response_format")


def _grammar(d: dict[str, Any]) -> Schema:
    """llama-server's ``grammar`` (GBNF text; "" is none, as there) or ``json_schema`` (a JSON Schema) field: what
    the output is held to."""
    if d.get("grammar") not in (None, ""):
        if d.get("json_schema") is not None:
            raise bad_request("grammar and json_schema cannot both shape the output", "grammar")
        try:
            return compile_grammar(d["grammar"])
        except GrammarError as exc:
            raise bad_request(f"grammar: {exc}", "grammar", "invalid_grammar") from None
    try:
        return compile_schema(d["json_schema"])
    except SchemaError as exc:
        raise bad_request(f"json_schema: {exc}", "json_schema", "unsupported_schema") from None
    except RecursionError:
        raise bad_request("json_schema: the schema is nested too deeply", "json_schema") from None


def parse_generation(d: dict[str, Any], kind: str, n_vocab: int, n_ctx: int) -> GenRequest:
    """``d`` (a parsed body of /v1/chat/completions or /v1/completions) as a :class:`GenRequest`; an
    :class:`ApiError` (400) names the first field that is wrong or not supported."""
    model = d.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("model must be a string", "model")
    _unsupported(d)
    stream = _flag(d, "stream")
    so = d.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise bad_request("stream_options must be an object", "stream_options")
    include_usage = _flag(so or {}, "include_usage")
    seed = _integer(d, "seed", -(2**63), 2**64 - 1, None)
    max_tokens = _integer(d, "max_completion_tokens", 1, 1 << 30, None)
    max_tokens = _integer(d, "max_tokens", 1, 1 << 30, max_tokens)
    if d.get("n_predict") is not None:  # llama-server's, first when given: -1 no limit, 0 no token generated
        n_predict = _integer(d, "n_predict", -1, 1 << 30, None)
        max_tokens = None if n_predict == -1 else n_predict
    defaults = SamplerParams()
    params = SamplerParams(
        temperature=_number(d, "temperature", 0.0, 100.0, defaults.temperature),
        top_k=int(_integer(d, "top_k", 0, 1 << 31, defaults.top_k) or 0),
        top_p=_number(d, "top_p", 0.0, 1.0, defaults.top_p),
        min_p=_number(d, "min_p", 0.0, 1.0, defaults.min_p),
        repeat_penalty=_number(d, "repeat_penalty", 1e-3, 100.0, defaults.repeat_penalty),
        repeat_last_n=int(_integer(d, "repeat_last_n", 0, n_ctx, defaults.repeat_last_n) or 0),
        seed=None if seed is None or seed < 0 else seed,
        stop=_stop(d))
    params.presence_penalty = _number(d, "presence_penalty", -2.0, 2.0, 0.0)
    params.frequency_penalty = _number(d, "frequency_penalty", -2.0, 2.0, 0.0)
    n = int(_integer(d, "n", 1, MAX_CHOICES, 1) or 1)
    if kind == "chat":
        if d.get("echo") or d.get("suffix"):
            raise bad_request("echo and suffix need /v1/completions", "echo" if d.get("echo") else "suffix")
        logprobs = _flag(d, "logprobs")
        top = int(_integer(d, "top_logprobs", 0, MAX_TOP_LOGPROBS, 0) or 0)
        if top and not logprobs:
            raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
        req = GenRequest(kind, model, messages=_messages(d))
        req.tools, req.tool_choice, req.tool_name = _tools(d)
    else:
        # the legacy API: ``logprobs`` is the number of alternatives (0 still returns the picked tokens')
        top_v = _integer(d, "logprobs", 0, MAX_TOP_LOGPROBS, None)
        logprobs, top = top_v is not None, int(top_v or 0)
        req = GenRequest(kind, model, prompt=_prompt(d, n_vocab))
        if d.get("tools"):
            raise bad_request("tools need /v1/chat/completions", "tools")
        req.echo = _flag(d, "echo")  # (with logprobs: the prompt's tokens' too, the prompt read whole)
        suffix = d.get("suffix")
        if suffix is not None and not isinstance(suffix, str):
            raise bad_request(f"suffix must be a string, not {_show(suffix)}", "suffix")
        req.suffix = suffix or None  # (an empty suffix, as some clients send by default: a plain completion)
        if req.suffix is not None and not isinstance(req.prompt, str):
            raise bad_request("suffix needs the prompt as text", "suffix")
    req.stream, req.include_usage, req.params, req.max_tokens = stream, include_usage, params, max_tokens
    req.logprobs, req.top_logprobs, req.logit_bias = logprobs, top, _logit_bias(d, n_vocab)
    params.alternatives = max(top, 1) if logprobs else 0
    req.json_schema = _response_format(d)
    if d.get("grammar") not in (None, "") or d.get("json_schema") is not None:  # llama-server's fields
        if req.json_schema is not None:
            raise bad_request("grammar (or json_schema) and response_format cannot both shape the output", "grammar")
        req.json_schema = _grammar(d)
    if req.json_schema is not None and req.tool_choice == "required":
        raise bad_request("response_format and a required tool call cannot both shape the output", "tool_choice")
    req.ignore_eos = _flag(d, "ignore_eos")
    req.n = n
    return req


def parse_infill(d: dict[str, Any], n_vocab: int, n_ctx: int) -> GenRequest:
    """llama-server's /infill body (``input_prefix``, ``input_suffix``, ``input_extra`` of ``{filename, text}``,
    ``prompt``, and the sampling fields of /completion) as a completion request with a ``suffix``."""
    for key in ("input_prefix", "input_suffix"):
        if not isinstance(d.get(key), str):
            raise bad_request(f"{key} is required and must be a string", key)
    prompt = d.get("prompt", "")
    if not isinstance(prompt, str):
        raise bad_request("prompt must be a string", "prompt")
    extra = d.get("input_extra", [])
    if not isinstance(extra, list) or len(extra) > MAX_MESSAGES:
        raise bad_request(f"input_extra must be a list of at most {MAX_MESSAGES} {{\"filename\", \"text\"}} "
                          "objects", "input_extra")
    chunks = []
    for i, c in enumerate(extra):
        if not isinstance(c, dict) or not isinstance(c.get("text"), str) or not isinstance(
                c.get("filename", "tmp"), str):
            raise bad_request(f"input_extra[{i}] must be {{\"filename\": string, \"text\": string}}", "input_extra")
        chunks.append((c.get("filename", "tmp"), c["text"]))
    body = {k: v for k, v in d.items() if k not in ("input_prefix", "input_suffix", "input_extra", "prompt")}
    req = parse_generation(body | {"prompt": d["input_prefix"]}, "completion", n_vocab, n_ctx)
    if req.n != 1 or req.echo:
        raise bad_request("n and echo need /v1/completions", "n" if req.n != 1 else "echo")
    req.suffix, req.extra, req.infill_prompt = d["input_suffix"], chunks, prompt
    return req


def parse_tokenize(d: dict[str, Any]) -> tuple[str, bool, bool]:
    """/tokenize: ``(content, add_special, with_pieces)``."""
    content = d.get("content")
    if not isinstance(content, str):
        raise bad_request("content must be a string", "content")
    return content, _flag(d, "add_special"), _flag(d, "with_pieces")


def parse_detokenize(d: dict[str, Any], n_vocab: int) -> list[int]:
    """/detokenize: the token ids, each in the vocabulary."""
    toks = d.get("tokens")
    if not isinstance(toks, list) or len(toks) > MAX_PROMPT_IDS or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in toks):
        raise bad_request("tokens must be a list of token ids", "tokens")
    bad = next((t for t in toks if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise bad_request(f"token {bad} is not in the vocabulary (0..{n_vocab - 1})", "tokens")
    return toks


__all__ = ["ApiError", "GenRequest", "parse_detokenize", "parse_generation", "parse_infill", "parse_json",
           "parse_tokenize"]
