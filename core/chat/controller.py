"""The chat pane's conversation logic without Qt: which model a conversation belongs to, the messages and what
the engine is sent, saving, and the text shown for a reply (its Markdown and numbers).

:class:`ChatController` holds the open conversation: its messages, its id in the :class:`ChatStore` and the model
it belongs to. A conversation belongs to one model (:class:`ModelIdentity`: file name, quantization, size):
opening another file starts a new conversation, and continuing an old one with a different model is an explicit
step (:meth:`ChatController.continue_with`), which copies it into a new conversation bound to that model.

A reply can have versions: regenerating it, or branching it at one of its tokens with another token
(:meth:`ChatController.begin_branch`), adds a version and keeps the old one with the messages that followed it;
:meth:`ChatController.switch_variant` shows another version (the conversation continues from the shown one).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .store import ChatStore, ModelIdentity, StoredMessage, add_variant, switch_variant, title_from
from .tokens import TokenRecord, branch_records, replay_tokens

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def identity_of(path: str | Path, file_type_name: str | None) -> ModelIdentity:
    """The identity of the model in ``path`` (its file name, quantization and size)."""
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError:
        size = 0
    return ModelIdentity(p.name, file_type_name or "", str(p), int(size))


def chat_markdown(text: str) -> str:
    """``text`` with every single line break kept, as chat apps show replies: outside code blocks a line followed
    by another non-empty line ends in a Markdown hard break (a haiku keeps its three lines)."""
    lines = text.split("\n")
    out: list[str] = []
    fence: str | None = None
    for i, line in enumerate(lines):
        m = _FENCE.match(line)
        if m:
            mark = m.group(1)
            if fence is None:
                fence = mark
            elif mark[0] == fence[0] and len(mark) >= len(fence):
                fence = None
            out.append(line)
            continue
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if (fence is None and line.strip() and nxt.strip() and not line.endswith("  ") and not line.endswith("\\")
                and not line.startswith(("    ", "\t")) and not _FENCE.match(nxt)):
            line += "  "
        out.append(line)
    return "\n".join(out)


def stats_numbers(s: Mapping[str, Any]) -> dict[str, str]:
    """The live numbers of a reply as shown: first token, prompt speed, generation speed. A prompt that came
    whole from the cache (a regenerate) reads "prompt cached", not "0 ms" and "0.0 t/s"."""
    cached = int(s.get("n_prompt_new", -1)) == 0
    gen = float(s.get("gen_tps", 0.0) or 0.0)
    return {"ttft": "prompt cached" if cached else f"{float(s.get('ttft_s', 0.0)) * 1000:.0f} ms",
            "prompt": "cached" if cached else f"{float(s.get('prompt_tps', 0.0)):.1f} t/s",
            "gen": f"{gen:.1f} t/s" if int(s.get("n_generated", 0)) else "—"}


def acceptance_text(s: Mapping[str, Any]) -> str:
    """``79% of 52 drafted accepted``: how speculative decoding went in a reply (its ``drafted``/``accepted``)."""
    drafted = int(s.get("drafted", 0))
    return f"{100 * int(s.get('accepted', 0)) / max(1, drafted):.0f}% of {drafted} drafted accepted"


def stats_text(s: Mapping[str, Any]) -> str:
    """A finished reply's numbers in one line (tokens, speed, first token or "prompt cached", stop reason)."""
    parts = [f"{int(s.get('n_generated', 0))} tokens"]
    if s.get("gen_tps"):
        parts.append(f"{float(s['gen_tps']):.1f} t/s")
    if int(s.get("drafted", 0)) > 0:
        parts.append(acceptance_text(s))
    if int(s.get("n_prompt_new", -1)) == 0:
        parts.append("prompt cached")
    else:
        parts.append(f"TTFT {float(s.get('ttft_s', 0.0)) * 1000:.0f} ms")
    reason = str(s.get("stop_reason", ""))
    if reason:
        parts.append("stopped" if reason == "cancelled" else reason)
    return " · ".join(parts)


class ChatController:
    """The open conversation: messages, store id and model binding (see the module's docstring)."""

    def __init__(self) -> None:
        self.conv_id: int | None = None
        self.messages: list[StoredMessage] = []
        #: the model the open conversation belongs to (None: nothing sent yet, it takes the current model's)
        self.owner: ModelIdentity | None = None
        #: the model of the opened file
        self.model: ModelIdentity | None = None
        self.editing: int | None = None
        #: a reply being made as a new version of message ``[0]`` of the conversation ``[1]`` (regenerate, branch)
        self.pending_variant: tuple[int, list[StoredMessage]] | None = None
        #: the uids of the messages this window loaded or saved: a save deletes only those it no longer shows
        self.stored: set[str] = set()

    # ------------------------------------------------------------------ binding
    def set_model(self, model: ModelIdentity | None) -> None:
        """A new file: a new, empty conversation for it."""
        self.model = model
        self.new()

    def new(self) -> None:
        self.conv_id = None
        self.stored = set()
        self.messages = []
        self.owner = None
        self.editing = None
        self.pending_variant = None

    @property
    def foreign(self) -> bool:
        """The open conversation belongs to another model than the opened file's: it is shown, but continuing
        it needs :meth:`continue_with`."""
        return (self.owner is not None and self.model is not None and bool(self.owner.name)
                and not self.owner.same_model(self.model))

    def open(self, store: ChatStore, conv_id: int) -> Any:
        """Load a saved conversation (``KeyError`` when it is gone); returns it for its settings."""
        conv = store.get(conv_id)
        self.conv_id = conv.id
        self.messages = list(conv.messages)
        self.stored = {m.uid for m in self.messages}
        self.owner = conv.identity
        self.editing = None
        self.pending_variant = None
        return conv

    def continue_with(self, store: ChatStore | None, settings: dict[str, Any]) -> int | None:
        """Continue the open (foreign) conversation with the opened file's model: a copy bound to it, titled as
        such; the original stays with its model. Returns the new id (None without a store)."""
        if self.model is None:
            return None
        self.owner = self.model
        if store is None or self.conv_id is None:
            self.conv_id = None
            return None
        title = store.get(self.conv_id).title
        self.conv_id = store.create(f"{title} ({self.model.name})", identity=self.model, messages=self.messages,
                                    **settings)
        self.stored = {m.uid for m in self.messages}
        return self.conv_id

    # ------------------------------------------------------------------ messages
    def add_user(self, text: str) -> None:
        if self.editing is not None:
            self.messages = self.messages[: self.editing]
            self.editing = None
        self.messages.append(StoredMessage("user", text, created=time.time()))
        if self.owner is None:
            self.owner = self.model

    def drop_replies(self) -> bool:
        """Remove the trailing replies (regenerate): the next reply becomes a new version of the first of them
        (:meth:`add_reply`); False when no message is left to answer."""
        before = list(self.messages)
        while self.messages and self.messages[-1].role == "assistant":
            self.messages.pop()
        if len(self.messages) < len(before):
            self.pending_variant = (len(self.messages), before)
        return bool(self.messages)

    def begin_branch(self, index: int, token_index: int, token: int) -> tuple[list[int], list[TokenRecord]]:
        """Branch reply ``index`` at its token ``token_index`` with ``token``: the conversation is cut before the
        reply (the next :meth:`add_reply` becomes its new version, :meth:`abandon_variant` goes back); returns
        the reply's tokens to force (the ones before, then ``token``) and their records. ``ValueError`` when the
        message is not a reply with recorded tokens or the index is out of range."""
        if not 0 <= index < len(self.messages) or self.messages[index].role != "assistant":
            raise ValueError(f"message {index} is not a reply")
        recs = self.messages[index].tokens
        forced = replay_tokens(recs, token_index, token)
        seed = branch_records(recs, token_index, token)
        self.pending_variant = (index, list(self.messages))
        self.messages = self.messages[:index]
        return forced, seed

    def abandon_variant(self) -> None:
        """The new version was not made (failed before any token): the conversation as it was."""
        if self.pending_variant is not None:
            self.messages = self.pending_variant[1]
            self.pending_variant = None

    def add_reply(self, text: str, stats: dict[str, Any], thinking: str = "",
                  tokens: list[TokenRecord] | None = None) -> None:
        """The finished reply: its answer, numbers, (harmony models) its thinking, kept apart, and its token
        records; a new version of the reply it regenerates or branches."""
        msg = StoredMessage("assistant", text, stats, time.time(), thinking, list(tokens or []))
        pending, self.pending_variant = self.pending_variant, None
        if pending is not None and pending[0] == len(self.messages) and 0 <= pending[0] < len(pending[1]):
            self.messages = add_variant(pending[1], pending[0], msg)
        else:
            self.messages.append(msg)

    def switch_variant(self, index: int, which: int) -> None:
        """Show version ``which`` (0-based) of message ``index``; the conversation continues from it."""
        self.messages = switch_variant(self.messages, index, which)

    def prompt(self, messages: list[StoredMessage], mode: str, system: str) -> list[dict[str, str]] | str:
        """What the engine gets: the messages (with the system prompt) in chat mode, the text in completion
        mode."""
        if mode == "completion":
            return "".join(m.content for m in messages if m.role != "system")
        msgs = [{"role": "system", "content": system}] if system else []
        return msgs + [m.as_chat() for m in messages if m.role != "system"]

    def preview_prompt(self, pending: str, mode: str, system: str) -> tuple[list[dict[str, str]] | str, bool]:
        """What the template preview shows: the conversation (up to the message being edited) plus the composer's
        text as the next message; ``(prompt, stand_in)`` where ``stand_in`` says a placeholder user message was
        added because there is none to answer yet."""
        msgs = list(self.messages)
        if self.editing is not None:
            msgs = msgs[: self.editing]
        if pending.strip():
            msgs.append(StoredMessage("user", pending))
        prompt = self.prompt(msgs, mode, system)
        stand_in = isinstance(prompt, list) and (len(prompt) == 0 or prompt[-1]["role"] != "user")
        if isinstance(prompt, list) and stand_in:
            prompt.append({"role": "user", "content": "(your next message)"})
        return prompt, stand_in

    def save(self, store: ChatStore, settings: dict[str, Any]) -> None:
        """Write the conversation (created on first save, bound to its model), message by message: what another
        window saved in the same conversation meanwhile stays (see :meth:`ChatStore.save_messages`). Raises
        StoreError/KeyError."""
        if not self.messages:
            return
        owner = self.owner or self.model or ModelIdentity()
        if self.conv_id is None or not store.exists(self.conv_id):
            first = next((m.content for m in self.messages if m.role == "user"), "")
            self.conv_id = store.create(title_from(first), identity=owner, **settings)
            self.stored = set()
        else:
            store.update(self.conv_id, **settings)
        store.save_messages(self.conv_id, self.messages, removed=self.stored)
        self.stored = {m.uid for m in self.messages}
