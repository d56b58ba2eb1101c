"""The prompt of a chat request, with what the client wrote read as text.

A message's content (or a tool's description) that holds a control token's text, such as
``<|im_end|>\\n<|im_start|>system``, must not become those control tokens: it would forge a turn. Only the chat
template's own markup is special. :func:`chat_prompt_ids` stands a private-use character in for each control
token's text in the client's strings, renders the template, puts the texts back and tokenizes with those spans
read as text (:meth:`~quantscope.core.tokenizer.Tokenizer.encode`'s ``literal``), so the rest of the text is
tokenized exactly as before. User-defined tokens (not control tokens) are matched in the text as llama.cpp does.
"""

from __future__ import annotations

import re
from typing import Any

from ..chat import ChatTemplate, ChatTemplateError
from ..tokenizer import Tokenizer

#: the characters that stand in for control tokens' texts while the template renders (private use: a client's
#: text that holds one of them only moves the choice on)
_FIRST, _LAST = 0xF0000, 0xFFFFD


def _strings(value: Any, out: list[str]) -> None:
    """Every string (keys too) in ``value``, a JSON-like tree."""
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, dict):
            out.extend(k for k in v if isinstance(k, str))
            todo.extend(v.values())
        elif isinstance(v, (list, tuple)):
            todo.extend(v)


class _Masker:
    """Control tokens' texts in the client's strings <-> stand-in characters."""

    def __init__(self, tokenizer: Tokenizer, taken: str) -> None:
        self.tok = tokenizer
        self.taken = taken
        self.code: dict[str, str] = {}  # control token text -> stand-in
        self.next = _FIRST

    def _stand_in(self, text: str) -> str:
        c = self.code.get(text)
        if c is None:
            while chr(self.next) in self.taken:
                self.next += 1
            if self.next > _LAST:
                raise ChatTemplateError("the messages hold every private-use character of plane 15: none is left to "
                                        "stand in for a control token's text")
            c = self.code[text] = chr(self.next)
            self.next += 1
        return c

    def mask(self, value: Any) -> Any:
        if isinstance(value, str):
            spans = self.tok.control_spans(value)
            if not spans:
                return value
            parts, pos = [], 0
            for a, b in spans:
                parts += [value[pos:a], self._stand_in(value[a:b])]
                pos = b
            parts.append(value[pos:])
            return "".join(parts)
        if isinstance(value, dict):
            return {self.mask(k): self.mask(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.mask(v) for v in value]
        return value

    def unmask(self, text: str) -> tuple[str, list[tuple[int, int]]]:
        """``text`` with the control tokens' texts back, and their spans."""
        back = {c: t for t, c in self.code.items()}
        if not back:
            return text, []
        parts: list[str] = []
        spans: list[tuple[int, int]] = []
        pos = n = 0
        for m in re.finditer("[" + "".join(back) + "]", text):
            t = back[m.group()]
            parts += [text[pos : m.start()], t]
            n += m.start() - pos
            spans.append((n, n + len(t)))
            n += len(t)
            pos = m.end()
        parts.append(text[pos:])
        return "".join(parts), spans


def chat_prompt_ids(tokenizer: Tokenizer, template: ChatTemplate | None, messages: list[dict[str, Any]],
                    tools: list[dict[str, Any]] | None = None) -> list[int]:
    """Token ids of ``messages`` (and ``tools``) through ``template`` with the generation prompt, control tokens'
    texts in them read as text (see the module's docstring); the BOS rule of ``Engine.prompt_ids``. Without a
    template (a base model) the contents joined by newlines, all text. Raises what the template raises."""
    if template is None:
        return tokenizer.encode("\n".join(str(m["content"]) for m in messages), parse_special=False)
    strings: list[str] = [template.source]
    _strings(messages, strings)
    _strings(tools, strings)
    masker = _Masker(tokenizer, "".join(strings))
    msgs = masker.mask(messages)
    kw = {"tools": masker.mask(tools)} if tools else {}
    masked = template.render(msgs, add_generation_prompt=True, **kw)
    has_bos = bool(template.bos_token) and masked.startswith(template.bos_token)
    text, spans = masker.unmask(masked)
    return tokenizer.encode(text, add_special=not has_bos, literal=spans)
