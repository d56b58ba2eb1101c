"""Tool calls in the Hermes / Qwen form the chat templates write: the template lists the tools and asks for
``<tool_call>{"name": …, "arguments": {…}}</tool_call>`` blocks, which are taken out of the reply's text.

With ``tool_choice`` auto the model decides: :class:`ToolCallParser` splits the streamed text into content and
calls, holding back text that may begin a block. With ``required`` or a named function the reply is made a call:
the prompt ends with the block's opening and the output is held to :func:`call_schema` by constrained sampling.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from .jsonmode import Schema, SchemaError, call_union, compile_schema
from .scheduler import held_back

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def supports_tools(template_source: str) -> bool:
    """Whether a chat template writes tool calls in the form this server reads."""
    return OPEN in template_source and "tools" in template_source


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
    fn = next(t["function"] for t in tools if t["function"]["name"] == name)
    params = fn.get("parameters") or {"type": "object"}
    try:
        return compile_schema({"type": "object", "properties": {"name": {"enum": [name]}, "arguments": params},
                               "required": ["name", "arguments"], "additionalProperties": False}, grammar=False)
    except SchemaError:  # parameters beyond the automaton's subset: the call as a grammar
        return call_union({name: params})


def make_call(raw: str) -> dict[str, Any] | None:
    """A block's text as an OpenAI tool call (``arguments`` a JSON string), or None when it is not one."""
    try:
        data = json.loads(raw.strip())
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    args = data.get("arguments", data.get("parameters", {}))
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": data["name"], "arguments": args if isinstance(args, str)
                         else json.dumps(args, ensure_ascii=False)}}


class ToolCallParser:
    """Streamed text in, content and finished calls out (see the module's docstring). A block that is not a
    valid call stays in the content as written. Small models often write the call's JSON without the tags: a
    reply that starts with ``{`` is held back to its end, and is a call when it is one of ``names``' calls."""

    def __init__(self, names: frozenset[str] = frozenset()) -> None:
        self.names = names
        self.buf = ""
        self.inside = False
        self.bare: bool | None = None if names else False  # None: not known yet whether the reply is bare JSON
        self.calls = 0

    def push(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        self.buf += text
        if self.bare is None and self.buf.strip():
            self.bare = self.buf.lstrip().startswith("{")
        if self.bare is not False:
            return "", []
        out: list[str] = []
        calls: list[dict[str, Any]] = []
        while True:
            if not self.inside:
                i = self.buf.find(OPEN)
                if i < 0:
                    keep = held_back(self.buf, [OPEN], 0)
                    out.append(self.buf[: len(self.buf) - keep])
                    self.buf = self.buf[len(self.buf) - keep :]
                    break
                out.append(self.buf[:i])
                self.buf = self.buf[i + len(OPEN) :]
                self.inside = True
            else:
                j = self.buf.find(CLOSE)
                if j < 0:
                    break
                raw, self.buf = self.buf[:j], self.buf[j + len(CLOSE) :]
                self.inside = False
                call = make_call(raw)
                if call is None:
                    out.append(OPEN + raw + CLOSE)
                else:
                    calls.append(call)
        self.calls += len(calls)
        return "".join(out), calls

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """What is left at the end: an unclosed block that parses is a call, else text."""
        rest, self.buf = self.buf, ""
        if self.bare is not False:
            call = make_call(rest) if self.bare else None
            if call is None or call["function"]["name"] not in self.names:
                self.bare = False
                self.buf = rest
                head, calls = self.push("")
                tail, more = self.finish()
                return head + tail, calls + more
            self.calls += 1
            return "", [call]
        if not self.inside:
            return rest, []
        self.inside = False
        call = make_call(rest)
        if call is None:
            return OPEN + rest, []
        self.calls += 1
        return "", [call]
