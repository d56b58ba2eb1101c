"""Tool calls in the forms chat templates write (:mod:`.toolcall_formats`): the form is picked from the model's
chat template, the template lists the tools, and the calls are taken out of the reply's text.

With ``tool_choice`` auto the model decides: :func:`make_parser` gives the form's streaming parser, which splits
the streamed text into content and calls, holding back text that may begin a call (a call leaves when it is
whole: its JSON checked, its name among the tools). A block that is not a valid call, names a tool that was not
given, or never ends stays in the content as written. With ``required`` or a named function the reply is made a
call: the prompt ends with the form's opening (:meth:`.ToolFormat.force`) and the output is held to the call's
JSON schema by constrained sampling.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .scheduler import held_back
from .toolcall_formats import (
    FORMATS,
    HERMES,
    Call,
    Forcing,
    ToolFormat,
    call_schema,
    json_call,
    make,
    tool_format,
    with_ids,
)

__all__ = ["FORMATS", "Call", "Forcing", "HarmonyParser", "ToolCallParser", "ToolFormat", "call_schema",
           "make_parser", "supports_tools", "tool_format", "with_ids"]

#: whitespace held back at the end of the text: it is dropped when a call follows it or ends the reply
_WS = " \t\r\n"


def supports_tools(template_source: str) -> bool:
    """Whether a chat template writes tool calls in a form this server reads."""
    return tool_format(template_source) is not None


def _params(tools: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for t in tools:
        out.setdefault(t["function"]["name"], t["function"].get("parameters") or {})
    return out


class ToolCallParser:
    """Streamed text in, content and finished calls out, for one of the forms with openings (see the module's
    docstring). ``push`` and ``finish`` return ``(content, calls)``; :meth:`take_reasoning` is always empty here
    (the harmony form's parser fills it)."""

    def __init__(self, fmt: ToolFormat = HERMES, tools: list[dict[str, Any]] | None = None) -> None:
        self.fmt = fmt
        self.params = _params(tools or [])
        self.names = frozenset(self.params)
        self.buf = ""
        self.state = "start"  # start | text | region | chain
        self.opener = ""
        self._bare = False
        self._searched = 0
        self.calls = 0
        self._scan: list[int] | None = None  # the JSON end's search: [start, pos, depth, in string, escaped]

    def take_reasoning(self) -> str:
        return ""

    def _known(self, calls: list[Call] | None) -> list[Call] | None:
        if calls is None or (self.names and any(c["function"]["name"] not in self.names for c in calls)):
            return None
        return calls

    def _json_start(self) -> int | None:
        """Where the region's JSON begins (-1: it cannot be a call; None: not known yet)."""
        buf, after = self.buf, self.fmt.json_after
        s = buf.lstrip()
        if not s:
            return None
        i = len(buf) - len(s)
        if s[0] == "{" or (s[0] == "[" and not (after and (s.startswith(after) or s.startswith("[CALL_ID]")))):
            return i
        if not after or not self.opener:
            return -1
        k = buf.find(after)
        if k < 0:
            return -1 if len(buf) > 256 or "\n" in buf or "{" in buf else None
        return k + len(after)

    def _json_end(self) -> int | None:
        """Where the region's JSON ends (-1: it cannot be a call; None: not yet)."""
        if self._scan is None:
            start = self._json_start()
            if start is None or start < 0:
                return start
            self._scan = [start, start, 0, 0, 0]
        st = self._scan
        buf = self.buf
        pos, depth, in_str, esc = st[1], st[2], st[3], st[4]
        while pos < len(buf):
            c = buf[pos]
            pos += 1
            if in_str:
                if esc:
                    esc = 0
                elif c == "\\":
                    esc = 1
                elif c == '"':
                    in_str = 0
            elif c == '"':
                in_str = 1
            elif c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    self._scan = None
                    return pos
            elif depth == 0 and c not in _WS:
                self._scan = None
                return -1
        st[1], st[2], st[3], st[4] = pos, depth, in_str, esc
        return None

    def _region(self, bare: bool, opener: str) -> None:
        self.state, self.opener, self._scan = "region", opener, None
        self._bare = bare
        self._searched = 0

    def push(self, text: str) -> tuple[str, list[Call]]:
        self.buf += text
        out: list[str] = []
        calls: list[Call] = []
        fmt = self.fmt
        while True:
            if self.state in ("start", "chain"):
                s = self.buf.lstrip(_WS + (";" if self.state == "chain" else ""))
                if not s:
                    break
                if s[0] == "{" and (fmt.bare if self.state == "start" else fmt.chain):
                    self.buf = s
                    self._region(True, "")
                else:
                    self.state = "text"
                continue
            if self.state == "text":
                hit = min(((i, op) for op in fmt.opens if (i := self.buf.find(op)) >= 0), default=None)
                if hit is None:
                    # held: what may begin an opening, and the whitespace before it
                    cut = len(self.buf) - held_back(self.buf, list(fmt.opens), 0)
                    cut = len(self.buf[:cut].rstrip(_WS))
                    out.append(self.buf[:cut])
                    self.buf = self.buf[cut:]
                    break
                i, op = hit
                out.append(self.buf[:i].rstrip(_WS))
                self.buf = self.buf[i + len(op) :]
                self._region(False, op)
                continue
            # a region: a call's text after its opening
            close = fmt.close
            if close is not None:
                j = self.buf.find(close, self._searched)
                if j < 0:  # (the next search starts where this one could not have found it)
                    self._searched = max(0, len(self.buf) - len(close) + 1)
                    break
                raw, self.buf = self.buf[:j], self.buf[j + len(close) :]
            else:
                end = self._json_end()
                if end is None:
                    break
                if end < 0:  # not a call's JSON: the opening is text, and what follows it is read again
                    out.append(self.opener)
                    self.state = "text"
                    continue
                raw, self.buf = self.buf[:end], self.buf[end:]
                close = ""
            got = self._known(fmt.body(raw, self.params))
            if got is None:
                out.append(self.opener + raw + close)
                self.state = "text"
            else:
                calls += got
                self.state = "chain" if fmt.chain and self._bare else "text"
        self.calls += len(calls)
        return "".join(out), calls

    def finish(self) -> tuple[str, list[Call]]:
        """What is left at the end: an unclosed call that is whole is a call, any other text is content."""
        rest, self.buf = self.buf, ""
        if self.state == "region":
            raw = rest
            if self.fmt.close is None:
                self.buf = raw
                end = self._json_end()
                self.buf = ""
                raw = raw if end is None or end < 0 else raw[:end]
                tail = rest[len(raw):]
            else:
                tail = ""
                inner = self.fmt.inner_close
                if not raw.lstrip().startswith("{") and not (inner and raw.rstrip().endswith(inner)):
                    raw = ""  # the form's own closing never came: the arguments may be cut short
            got = self._known(self.fmt.body(raw, self.params)) if raw.strip() else None
            self.state = "text"
            if got is not None and not tail.strip():
                self.calls += len(got)
                return "", got
            return self.opener + rest, []
        if self.calls and not rest.strip(_WS):
            return "", []
        return rest, []


#: the harmony format's markers, as text
_H_MARKS = ["<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", "<|call|>", "<|return|>"]
_H_ENDS = ("<|end|>", "<|call|>", "<|return|>")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")


class HarmonyParser:
    """The gpt-oss harmony form read from the reply's text (its markers written as text): messages
    ``[<|start|>assistant][ to=R]<|channel|>C[ to=R][ <|constrain|>json]<|message|>BODY<|end|>|<|call|>``.
    A message to ``functions.NAME`` is a call (its body the arguments' JSON), and so is JSON on commentary with no
    recipient that names the function itself (a call forced among several tools); the ``analysis`` channel is
    reasoning (:meth:`take_reasoning`), other channels are content; text before any marker is content."""

    def __init__(self, fmt: ToolFormat, tools: list[dict[str, Any]] | None = None) -> None:
        self.fmt = fmt
        self.names = frozenset(_params(tools or []))
        self.buf = ""
        self.state = "lead"  # lead | header | body | between
        self.header = ""
        self.channel = ""
        self.recipient: str | None = None
        self.args = ""
        self.reasoning: list[str] = []
        self.calls = 0

    def take_reasoning(self) -> str:
        out, self.reasoning = "".join(self.reasoning), []
        return out

    def _start_body(self) -> None:
        h = self.header
        r = _RECIPIENT.search(h)
        c = _CHANNEL.search(h)
        self.recipient = r.group(1) if r else None
        self.channel = c.group(1) if c else ""
        if self.recipient is None and self.channel == "commentary" and "<|constrain|>json" in h:
            self.recipient = ""  # JSON on commentary with no recipient (a forced call): the name is in it
        self.args = ""
        self.state = "body"

    def _end_message(self, out: list[str], calls: list[Call], marker: str) -> None:
        if self.recipient is None:
            return
        name = self.recipient.removeprefix("functions.")
        try:
            data = json.loads(self.args.strip())
        except (ValueError, RecursionError):
            data = None
        call = None
        if not self.recipient:
            call = json_call(data)
        elif self.recipient.startswith("functions."):
            call = make(name, data) if isinstance(data, dict) else None
        if call is not None and self.names and call["function"]["name"] not in self.names:
            call = None
        if call is None:  # not a call this server can give: the message as written
            out.append(self.header + "<|message|>" + self.args + marker)
        else:
            calls.append(call)

    def push(self, text: str) -> tuple[str, list[Call]]:
        self.buf += text
        out: list[str] = []
        calls: list[Call] = []
        while self.buf:
            if self.state == "lead":  # the reply's first header may start with " to=…" (the template's way)
                s = self.buf.lstrip()
                heads = ["to=", *_H_MARKS]
                if not s or any(h.startswith(s) and h != s for h in heads):
                    break  # not known yet
                if any(s.startswith(h) for h in heads):
                    self.state, self.header = "header", ""
                else:
                    self.state, self.recipient, self.channel = "body", None, ""
                continue
            if self.state == "header":
                j = self.buf.find("<|message|>")
                if j < 0:
                    if len(self.header) + len(self.buf) > 512:  # not a header: the text as written
                        out.append(self.header + self.buf)
                        self.header, self.buf, self.state = "", "", "between"
                    break
                self.header += self.buf[:j]
                self.buf = self.buf[j + len("<|message|>") :]
                self._start_body()
                continue
            if self.state == "between":
                j = self.buf.find("<|start|>")
                k = self.buf.find("<|channel|>")
                hits = [x for x in (j, k) if x >= 0]
                if not hits:
                    keep = held_back(self.buf, ["<|start|>", "<|channel|>"], 0)
                    out.append(self.buf[: len(self.buf) - keep])
                    self.buf = self.buf[len(self.buf) - keep :]
                    break
                i = min(hits)
                out.append(self.buf[:i])
                self.header, self.buf, self.state = "", self.buf[i:], "header"
                continue
            # body: up to the message's end, or a new header
            hits = [(i, m) for m in (*_H_ENDS, "<|start|>", "<|channel|>") if (i := self.buf.find(m)) >= 0]
            if not hits:
                keep = held_back(self.buf, _H_MARKS, 0)
                piece, self.buf = self.buf[: len(self.buf) - keep], self.buf[len(self.buf) - keep :]
                self._body(piece, out)
                break
            i, m = min(hits)
            self._body(self.buf[:i], out)
            if m in _H_ENDS:
                self.buf = self.buf[i + len(m) :]
                self._end_message(out, calls, m)
                self.state = "between"
            else:
                self._end_message(out, calls, "")
                self.header, self.buf, self.state = "", self.buf[i:], "header"
        self.calls += len(calls)
        return "".join(out), calls

    def _body(self, piece: str, out: list[str]) -> None:
        if self.recipient is not None:
            self.args += piece
        elif self.channel == "analysis":
            if piece:
                self.reasoning.append(piece)
        else:
            out.append(piece)

    def finish(self) -> tuple[str, list[Call]]:
        """The end of the reply ends its last message (``<|call|>`` ends generation, so it is never seen)."""
        out: list[str] = []
        calls: list[Call] = []
        rest, self.buf = self.buf, ""
        if self.state == "header":
            out.append(self.header + rest)
        elif self.state == "body":
            self._body(rest, out)
            self._end_message(out, calls, "")
        else:
            out.append(rest)
        self.state = "between"
        self.calls += len(calls)
        return "".join(out), calls


def make_parser(fmt: ToolFormat, tools: list[dict[str, Any]]) -> ToolCallParser | HarmonyParser:
    """The streaming parser of ``fmt``'s calls of ``tools``."""
    return HarmonyParser(fmt, tools) if fmt.harmony else ToolCallParser(fmt, tools)
