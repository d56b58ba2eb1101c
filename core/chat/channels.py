"""The channels of a reply in OpenAI's "harmony" format (gpt-oss): the model thinks in ``analysis``, may talk to
tools in ``commentary`` and answers in ``final``, each message framed by special tokens::

    <|channel|>analysis<|message|>…thinking…<|end|><|start|>assistant<|channel|>final<|message|>…answer…<|return|>

:class:`HarmonySplitter` follows that framing token by token (the engine hides the special tokens from the text),
so the app shows the thinking apart from the answer; llama.cpp's chat parser does the same split
(``reasoning_content`` and ``content``). docs/engine.md section 9 describes it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: the channel of thinking text (gpt-oss's ``analysis``); the answer's channel is ``""``
REASONING = "analysis"
_MARKERS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>")


@dataclass(frozen=True)
class HarmonyTokens:
    """The ids of the framing tokens of a harmony vocabulary."""

    start: int
    channel: int
    message: int
    end: int
    constrain: int | None = None

    @classmethod
    def find(cls, vocab: Mapping[str, int]) -> HarmonyTokens | None:
        """The framing tokens of a vocabulary (piece -> id), or ``None`` when it lacks them."""
        ids = [vocab.get(m) for m in _MARKERS]
        if any(i is None for i in ids[:4]):
            return None
        return cls(*ids)  # type: ignore[arg-type]


class HarmonySplitter:
    """Token by token: which channel the text belongs to. ``push(token, text)`` returns ``(channel, text)`` for
    the text of a token that is message content (``""`` = the answer, ``"analysis"`` = thinking, ``"commentary"``
    = tool talk), or ``None`` for framing (the special tokens, the header and channel names between them).

    Text before any framing is the answer, so a model that ignores the format still shows its reply."""

    def __init__(self, tokens: HarmonyTokens) -> None:
        self.t = tokens
        self.state = "content"  # content | header | channel
        self.channel = ""
        self._name: list[str] = []

    def push(self, token: int, text: str) -> tuple[str, str] | None:
        t = self.t
        if token == t.start:
            self.state = "header"
            return None
        if token == t.channel:
            self.state, self._name = "channel", []
            return None
        if token == t.constrain:  # "<|constrain|>json" inside a channel name: part of the header
            return None
        if token == t.message:
            name = "".join(self._name).strip().split(" ")[0] if self.state == "channel" else ""
            self.channel = "" if name in ("", "final") else name
            self.state = "content"
            return None
        if token == t.end:
            self.state = "header"  # until the next <|start|>: nothing of it is content
            return None
        if self.state == "channel":
            self._name.append(text)
            return None
        if self.state == "header":
            return None
        return (self.channel, text) if text else None


def split_harmony(pieces: Iterable[tuple[int, str]], tokens: HarmonyTokens) -> tuple[str, str]:
    """``(thinking, answer)`` of a whole reply given as (token id, text) pairs; commentary counts as thinking."""
    s = HarmonySplitter(tokens)
    thinking: list[str] = []
    answer: list[str] = []
    for tid, text in pieces:
        out = s.push(tid, text)
        if out is not None:
            (answer if out[0] == "" else thinking).append(out[1])
    return "".join(thinking), "".join(answer)
