"""The tool-call forms chat templates teach their models, each a small description: how to recognise it in the
template's source, the markers that open (and close) a call, how a call's name and arguments are written, whether
one reply may hold several calls, and how a call is forced (``tool_choice`` required or named).

- ``hermes`` (Hermes, Qwen 2.5/3, Granite): ``<tool_call>{"name": N, "arguments": {…}}</tool_call>``, a block
  per call; a reply that is only a call's JSON counts too.
- ``llama3`` (Llama 3.1-3.3): ``{"name": N, "parameters": {…}}`` as the whole reply, or after ``<|python_tag|>``;
  several separated by ``;``.
- ``mistral`` (Nemo, 7B v0.3): ``[TOOL_CALLS][{"name": N, "arguments": {…}, "id": I}, …]``, all in one list.
- ``mistral-args`` (Small 3.2, Devstral, Ministral): ``[TOOL_CALLS]N[CALL_ID]I[ARGS]{…}`` (``[CALL_ID]I``
  optional), a marker per call; the older list is read too.
- ``qwen3-coder`` (Qwen3-Coder, Qwen3.5, Nemotron 3): ``<tool_call><function=N><parameter=K>V</parameter>…
  </function></tool_call>`` with newlines around each value, a block per call.
- ``glm`` (GLM 4.5-4.7): ``<tool_call>N<arg_key>K</arg_key><arg_value>V</arg_value>…</tool_call>``, a block per
  call.
- ``harmony`` (gpt-oss): a message ``<|channel|>commentary to=functions.N <|constrain|>json<|message|>{…}<|call|>``
  (the recipient may come before ``<|channel|>``), a message per call; ``<|call|>`` ends generation.

Mistral's calls get ids of 9 letters and digits, which its templates insist on when the conversation goes on (the
ids the model wrote, when they are such); the others get OpenAI's ``call_…`` ids.

In the XML forms a value is written as text when it is a string and as JSON otherwise; it is read back by the
tool's parameter schema (a ``string`` parameter keeps its text) and else as JSON when it parses. A forced call is
held to JSON by constrained sampling (:mod:`.jsonmode`), so each form forces a JSON-bodied call: the prompt ends
with :attr:`Forcing.prefix` (the form's opening, and the function's name where the form writes it outside the
JSON) and the output is :meth:`Forcing.schema`'s JSON. The XML forms are forced as the Hermes JSON inside their
``<tool_call>`` block (which their readers also accept), having no JSON form of their own.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .jsonmode import Schema, SchemaError, call_union, compile_schema

Call = dict[str, Any]
#: a tool's name -> its parameters' JSON Schema (what the XML forms read values by)
Params = dict[str, Any]

_ALNUM = string.ascii_letters + string.digits


def new_id(short: bool) -> str:
    """A call's id: OpenAI's ``call_…`` form, or the 9 letters and digits Mistral's templates insist on."""
    if short:
        return "".join(secrets.choice(_ALNUM) for _ in range(9))
    return "call_" + secrets.token_hex(12)


def make(name: str, args: Any, short: bool = False, cid: str | None = None) -> Call:
    """An OpenAI tool call: ``arguments`` a JSON string (an object given as text is kept as written); ``cid``, the
    id the model wrote, kept when it is a Mistral id (``short``)."""
    if not (short and isinstance(cid, str) and len(cid) == 9 and cid.isalnum() and cid.isascii()):
        cid = None
    return {"id": cid or new_id(short), "type": "function",
            "function": {"name": name, "arguments": args if isinstance(args, str)
                         else json.dumps(args, ensure_ascii=False)}}


def with_ids(messages: list[dict[str, Any]], short: bool) -> list[dict[str, Any]]:
    """``messages`` with an id on every assistant tool call that has none, and each tool reply without a
    ``tool_call_id`` given the id of the call it answers (the calls of the turn before, in order): Ollama's
    clients send neither, and Mistral's templates refuse a conversation that lacks them. Ids a client gave are
    kept; the list and its messages are copied where changed, never modified."""
    out: list[dict[str, Any]] = []
    pending: list[str] = []
    for m in messages:
        calls = m.get("tool_calls")
        if m.get("role") == "assistant" and isinstance(calls, list) and calls:
            fixed = [c if not isinstance(c, dict) or c.get("id") else {**c, "id": new_id(short)} for c in calls]
            pending = [c["id"] for c in fixed if isinstance(c, dict) and isinstance(c.get("id"), str)]
            m = {**m, "tool_calls": fixed} if fixed != calls else m
        elif m.get("role") == "tool":
            if not m.get("tool_call_id") and pending:
                m = {**m, "tool_call_id": pending[0]}
            pending = pending[1:]
        out.append(m)
    return out


def _json(raw: str) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def json_call(data: Any, short: bool = False) -> Call | None:
    """``{"name": N, "arguments"|"parameters": {…}}`` (also ``{"type": "function", "function": {…}}``) as a
    call, or None when ``data`` is not one."""
    if isinstance(data, dict) and isinstance(data.get("function"), dict) and "name" not in data:
        data = data["function"]
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        return None
    args = data.get("arguments", data.get("parameters", {}))
    if isinstance(args, str):  # arguments given as a JSON string: it must hold an object
        args = _json(args)
    if not isinstance(args, dict):
        return None
    cid = data.get("id")
    return make(data["name"], args, short, cid if isinstance(cid, str) else None)


def _json_calls(raw: str, short: bool = False) -> list[Call] | None:
    """One call's JSON, or a list of them; None when any is not a call."""
    data = _json(raw.strip())
    items = data if isinstance(data, list) else [data]
    calls = [json_call(d, short) for d in items]
    if not calls or any(c is None for c in calls):
        return None
    return calls  # type: ignore[return-value]


def _value(text: str, schema: Any) -> Any:
    """An XML form's value: text for a string parameter (``null`` too when it may be null), else the JSON it
    holds, else the text."""
    kinds = schema.get("type") if isinstance(schema, dict) else None
    kinds = {kinds} if isinstance(kinds, str) else set(kinds) if isinstance(kinds, list) else set()
    if "string" in kinds and not ("null" in kinds and text.strip() == "null"):
        return text
    if text.strip() == "null":
        return None
    data = _json(text)
    return text if data is None else data


def _props(params: Params, name: str) -> dict[str, Any]:
    p = params.get(name)
    props = p.get("properties") if isinstance(p, dict) else None
    return props if isinstance(props, dict) else {}


_FUNCTION = re.compile(r"\s*<function=([^>\n]{1,128})>(.*?)</function>\s*", re.S)
_PARAM = re.compile(r"<parameter=([^>\n]{1,128})>\n?(.*?)\n?</parameter>\s*", re.S)


def _qwen3_coder_body(raw: str, params: Params) -> list[Call] | None:
    """``<function=N><parameter=K>\\nV\\n</parameter>…</function>`` (or the Hermes JSON) as a call."""
    if raw.lstrip().startswith("{"):
        return _json_calls(raw)
    m = _FUNCTION.fullmatch(raw)
    if m is None:
        return None
    name, body = m.group(1).strip(), m.group(2)
    props = _props(params, name)
    args: dict[str, Any] = {}
    pos = 0
    body = body.strip("\n")
    while pos < len(body):
        p = _PARAM.match(body, pos)
        if p is None:
            return None
        args[p.group(1).strip()] = _value(p.group(2), props.get(p.group(1).strip()))
        pos = p.end()
    return [make(name, args)]


_ARG = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


def _glm_body(raw: str, params: Params) -> list[Call] | None:
    """``N<arg_key>K</arg_key><arg_value>V</arg_value>…`` (or the Hermes JSON) as a call."""
    if raw.lstrip().startswith("{"):
        return _json_calls(raw)
    i = raw.find("<arg_key>")
    name = (raw if i < 0 else raw[:i]).strip()
    if not name or len(name) > 128 or any(c in name for c in "<>\n{"):
        return None
    props = _props(params, name)
    args: dict[str, Any] = {}
    pos = 0 if i < 0 else i
    while pos < len(raw) and raw[pos:].strip():
        a = _ARG.match(raw, pos)
        if a is None:
            return None
        args[a.group(1).strip()] = _value(a.group(2), props.get(a.group(1).strip()))
        pos = a.end()
    return [make(name, args)]


def _mistral_args_body(raw: str, params: Params) -> list[Call] | None:
    """``N[CALL_ID]I[ARGS]{…}`` (or the older JSON list) as calls."""
    head, sep, args = raw.partition("[ARGS]")
    if not sep:
        return _json_calls(raw, short=True)
    name, _, cid = head.partition("[CALL_ID]")
    data = _json(args.strip())
    if not name.strip() or not isinstance(data, dict):
        return None
    return [make(name.strip(), data, True, cid.strip() or None)]


@dataclass(frozen=True)
class Forcing:
    """How a call is forced: the prompt ends with ``prefix`` and the reply is :meth:`schema`'s JSON: the arguments
    of ``name`` when the form writes the name before the JSON, else ``{"name": …, "arguments": …}``."""

    prefix: str
    name: str | None
    tools: tuple[dict[str, Any], ...]
    short_ids: bool = False

    def opening(self, prompt: str) -> str:
        """What to append to ``prompt`` (its end is enough): :attr:`prefix`, after closing a thinking block the
        template opened (GLM 4.7, Qwen3 and others end the generation prompt with ``<think>``): a forced call is
        not thought about."""
        return ("</think>" if prompt.rstrip().endswith("<think>") else "") + self.prefix

    def schema(self) -> Schema:
        """The reply's schema; :class:`~.jsonmode.SchemaError` when the parameters cannot be enforced."""
        if self.name is None:
            return call_schema(list(self.tools), None)
        return compile_schema(_parameters(list(self.tools), self.name), f"{self.name}.parameters")

    def call(self, text: str) -> Call | None:
        """The forced reply as a call, or None when it is not one (a reply cut short)."""
        data = _json(text.strip())
        if self.name is None:
            return json_call(data, self.short_ids)
        return make(self.name, data, self.short_ids) if isinstance(data, dict) else None


def call_schema(tools: list[dict[str, Any]], name: str | None) -> Schema:
    """The schema of a call's JSON: ``name`` one of the tools (or the named one), ``arguments`` that tool's
    parameters: the named one's, the only tool's, or with several tools the parameters of the one the call
    names (:func:`~.jsonmode.call_union`). :class:`~.jsonmode.SchemaError` when they cannot be enforced."""
    names = {t["function"]["name"] for t in tools}
    if name is None and len(names) == 1:
        name = next(iter(names))
    if name is None:
        by_name: dict[str, Any] = {}
        for t in tools:
            by_name.setdefault(t["function"]["name"], t["function"].get("parameters") or {"type": "object"})
        return call_union(by_name)
    params = _parameters(tools, name)
    try:
        return compile_schema({"type": "object", "properties": {"name": {"enum": [name]}, "arguments": params},
                               "required": ["name", "arguments"], "additionalProperties": False}, grammar=False)
    except SchemaError:  # parameters beyond the automaton's subset: the call as a grammar
        return call_union({name: params})


def _parameters(tools: list[dict[str, Any]], name: str) -> Any:
    fn = next(t["function"] for t in tools if t["function"]["name"] == name)
    return fn.get("parameters") or {"type": "object"}


def _only(tools: list[dict[str, Any]], name: str | None) -> str | None:
    names = {t["function"]["name"] for t in tools}
    return name if name is not None else (next(iter(names)) if len(names) == 1 else None)


@dataclass(frozen=True)
class ToolFormat:
    """One tool-call form (see the module's docstring).

    ``opens``: the texts that open a call; a call ends with ``close`` when it has one, else where the JSON value
    after the opening (after ``json_after`` when given: the name comes first) ends. ``body`` reads the text
    between them as calls (None: not a call, the text stays in the reply as written). ``bare``: a reply that
    starts with ``{`` may be a call's JSON without any opening (models fine-tuned on the form often write it so);
    ``chain``: bare calls may follow each other, separated by ``;``. ``tags``: the markers that may be control
    tokens of the vocabulary, written as text while tools are given. ``short_ids``: ids as Mistral's templates
    need them. ``harmony``: read by the channel parser instead (``opens`` and the rest unused). ``force_prefix``
    and ``name_outside``: see :meth:`force`."""

    name: str
    label: str
    detect: Callable[[str], bool]
    opens: tuple[str, ...]
    close: str | None
    body: Callable[[str, Params], list[Call] | None]
    force_prefix: Callable[[str | None], str]  # the function's name (or None) -> the prompt's ending
    name_outside: bool = False  # a forced call of a known function writes its name in the prefix
    json_after: str | None = None
    bare: bool = False
    chain: bool = False
    tags: tuple[str, ...] = ()
    short_ids: bool = False
    harmony: bool = False
    #: a block whose ``close`` never came is a call only when it is whole: JSON that parses, or (given) a body
    #: that ends with this inner closing
    inner_close: str | None = None

    def force(self, tools: list[dict[str, Any]], name: str | None) -> Forcing:
        """How ``tool_choice`` required (``name`` None) or named is enforced."""
        name = _only(tools, name)
        if self.name_outside and name is not None:
            return Forcing(self.force_prefix(name), name, tuple(tools), self.short_ids)
        return Forcing(self.force_prefix(None), None, tuple(tools), self.short_ids)


def _has(*parts: str) -> Callable[[str], bool]:
    return lambda src: all(p in src for p in parts)


_JSON_NAME = re.compile(r'\{\\?"name\\?"')  # the template writes (or shows) a call as {"name": …}

HERMES = ToolFormat(
    "hermes", "Hermes <tool_call> JSON", lambda src: "<tool_call>" in src and bool(_JSON_NAME.search(src)),
    ("<tool_call>",), "</tool_call>",
    lambda raw, _p: _json_calls(raw), lambda _n: "<tool_call>\n", bare=True, tags=("<tool_call>", "</tool_call>"))
QWEN3_CODER = ToolFormat(
    "qwen3-coder", "Qwen3-Coder XML", _has("<tool_call>", "<function=", "<parameter="), ("<tool_call>",),
    "</tool_call>", _qwen3_coder_body, lambda _n: "<tool_call>\n", tags=("<tool_call>", "</tool_call>"),
    inner_close="</function>")
GLM = ToolFormat(
    "glm", "GLM XML", _has("<tool_call>", "<arg_key>"), ("<tool_call>",), "</tool_call>", _glm_body,
    lambda _n: "<tool_call>", tags=("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
                                    "</arg_value>"))
MISTRAL_ARGS = ToolFormat(
    "mistral-args", "Mistral [TOOL_CALLS]name[ARGS]", _has("[TOOL_CALLS]", "[ARGS]"), ("[TOOL_CALLS]",), None,
    _mistral_args_body, lambda n: "[TOOL_CALLS]" + (n + "[ARGS]" if n else ""), name_outside=True,
    json_after="[ARGS]", tags=("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"), short_ids=True)
MISTRAL = ToolFormat(
    "mistral", "Mistral [TOOL_CALLS] JSON list", _has("[TOOL_CALLS]"), ("[TOOL_CALLS]",), None,
    lambda raw, _p: _json_calls(raw, short=True), lambda _n: "[TOOL_CALLS][", tags=("[TOOL_CALLS]",),
    short_ids=True)
LLAMA3 = ToolFormat(
    "llama3", "Llama 3.x JSON", lambda src: "<|start_header_id|>" in src and "<function=" not in src and (
        '"parameters"' in src or "<|python_tag|>" in src), ("<|python_tag|>",), None,
    lambda raw, _p: _json_calls(raw), lambda _n: "", bare=True, chain=True, tags=("<|python_tag|>",))
HARMONY = ToolFormat(
    "harmony", "gpt-oss harmony", _has("<|channel|>", "<|call|>", "functions"), (), None, lambda raw, _p: None,
    lambda n: "<|channel|>commentary" + (f" to=functions.{n}" if n else "") + " <|constrain|>json<|message|>",
    name_outside=True, harmony=True,
    tags=("<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", "<|call|>", "<|return|>"))

#: in the order they are tried: the more specific forms first
FORMATS: tuple[ToolFormat, ...] = (HARMONY, QWEN3_CODER, GLM, MISTRAL_ARGS, MISTRAL, HERMES, LLAMA3)


def tool_format(template_source: str) -> ToolFormat | None:
    """The tool-call form a chat template writes, or None when it writes none this server reads."""
    if "tool" not in template_source:
        return None
    return next((f for f in FORMATS if f.detect(template_source)), None)
