"""Conversations on disk: one SQLite file (stdlib ``sqlite3``) under the user's data directory, plus Markdown and
JSON export.

The file is ``$QUANTSCOPE_DATA/chats.sqlite3`` when ``QUANTSCOPE_DATA`` is set, else ``quantscope/chats.sqlite3`` in
the user's data folder (Linux ``$XDG_DATA_HOME``, default ``~/.local/share``; macOS ``~/Library/Application
Support``; Windows ``%APPDATA%``). A store is used from one thread (the GUI's); every write is one short
transaction.

Several windows or processes may have the same conversation open: every message carries a random ``uid`` and a
save (:meth:`ChatStore.save_messages`) inserts or updates its messages by uid and deletes only the ones that
window itself removed, so what another window saved is never lost. A file that is not a readable database is
moved aside (``chats.sqlite3.unreadable-YYYYmmdd-HHMMSS``; :attr:`ChatStore.moved_aside` names it) and a new one
is started. Values read back are checked: a time, size or count that is not a number reads as 0, a text that is
not text as "".
"""

from __future__ import annotations

import json
import math
import os
import re
import sqlite3
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from .. import sysinfo
from ..fsutil import write_atomic
from . import tokens as _tokens
from .tokens import TokenRecord

#: 2: the model identity (quantization, size) per conversation; 3: a reply's thinking; 4: a reply's tokens (their
#: probabilities and alternatives) and a message's other variants (branches)
SCHEMA_VERSION = 4
DB_NAME = "chats.sqlite3"
EXPORT_FORMAT = "quantscope-chat"
MODES = ("chat", "completion")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL,
    model TEXT NOT NULL DEFAULT '',
    model_path TEXT NOT NULL DEFAULT '',
    model_quant TEXT NOT NULL DEFAULT '',
    model_size INTEGER NOT NULL DEFAULT 0,
    system_prompt TEXT NOT NULL DEFAULT '',
    mode TEXT NOT NULL DEFAULT 'chat',
    params TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    stats TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL,
    thinking TEXT NOT NULL DEFAULT '',
    tokens TEXT NOT NULL DEFAULT '',
    variants TEXT NOT NULL DEFAULT '',
    variant INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, position);
"""
#: columns added after schema 1, with their definitions (added to an older database when it is opened)
_ADDED = {"model_quant": "TEXT NOT NULL DEFAULT ''", "model_size": "INTEGER NOT NULL DEFAULT 0"}
#: the same for messages (schema 3: a reply's thinking; schema 4: its token records as compact JSON, the message's
#: other variants as JSON and its own place among them; empty for the messages before)
_ADDED_MESSAGES = {"thinking": "TEXT NOT NULL DEFAULT ''", "tokens": "TEXT NOT NULL DEFAULT ''",
                   "variants": "TEXT NOT NULL DEFAULT ''", "variant": "INTEGER NOT NULL DEFAULT 0",
                   "uid": "TEXT NOT NULL DEFAULT ''"}
#: how deeply variants may nest in a stored message (a branch's messages with branches of their own, ...)
MAX_VARIANT_DEPTH = 32


class StoreError(RuntimeError):
    """The database cannot be opened or used; the message says which file and why."""


def _new_uid() -> str:
    return uuid.uuid4().hex


def _num(v: object, default: float = 0.0) -> float:
    """A stored number as a finite float (anything else: ``default``)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return default
    f = float(v)
    return f if math.isfinite(f) else default


def _int(v: object, default: int = 0, lo: int = 0) -> int:
    """A stored integer at least ``lo`` (a float is truncated; anything else: ``default``)."""
    f = _num(v, float(default))
    if abs(f) >= 2.0**63:
        return default
    return max(lo, int(f))


def _text(v: object, default: str = "") -> str:
    return v if isinstance(v, str) else default


def data_dir() -> Path:
    """``$QUANTSCOPE_DATA``, else ``quantscope`` in the user's data folder
    (:func:`~quantscope.core.sysinfo.user_data_dir`: Linux ``$XDG_DATA_HOME``, default ``~/.local/share``; macOS
    ``~/Library/Application Support``; Windows ``%APPDATA%``)."""
    env = os.environ.get("QUANTSCOPE_DATA")
    if env:
        return Path(env)
    return sysinfo.user_data_dir() / "quantscope"


def default_path() -> Path:
    """The conversation database: :func:`data_dir` / ``chats.sqlite3``."""
    return data_dir() / DB_NAME


@dataclass
class StoredMessage:
    """One message: ``role`` is system/user/assistant; ``stats`` holds the reply's timings (tokens, t/s, ...);
    ``thinking`` a reply's reasoning apart from its answer (gpt-oss's analysis channel; never sent back);
    ``tokens`` a reply's tokens with their probabilities (when the chat recorded them).

    A message may have other versions (a reply branched at one of its tokens): ``variants`` holds the versions
    not shown, in order, each with the messages that followed it; this one is number ``variant`` (0-based) of
    ``1 + len(variants)``. The conversation is the path of shown versions (see :func:`switch_variant`)."""

    role: str
    content: str
    stats: dict[str, Any] = field(default_factory=dict)
    created: float = 0.0
    thinking: str = ""
    tokens: list[TokenRecord] = field(default_factory=list)
    variants: list[Variant] = field(default_factory=list)
    variant: int = 0
    #: the message's identity in the store (random; not part of equality or of exports)
    uid: str = field(default_factory=_new_uid, compare=False, repr=False)

    def as_chat(self) -> dict[str, str]:
        """The ``{"role", "content"}`` form templates take."""
        return {"role": self.role, "content": self.content}

    @property
    def n_variants(self) -> int:
        return 1 + len(self.variants)


@dataclass
class Variant:
    """A version of a message that is not shown: the message (without variants of its own) and the messages
    that followed it."""

    message: StoredMessage
    after: list[StoredMessage] = field(default_factory=list)


def _bare(m: StoredMessage) -> StoredMessage:
    return StoredMessage(m.role, m.content, m.stats, m.created, m.thinking, m.tokens)


def add_variant(messages: list[StoredMessage], index: int, new: StoredMessage) -> list[StoredMessage]:
    """The conversation with ``new`` as the last version of message ``index`` (shown; it ends the conversation):
    the message there and what followed it become a variant. Returns the new message list."""
    if not 0 <= index < len(messages):
        raise IndexError(f"no message {index}")
    old = messages[index]
    variants = [*old.variants[: old.variant], Variant(_bare(old), list(messages[index + 1:])),
                *old.variants[old.variant:]]
    shown = StoredMessage(new.role, new.content, new.stats, new.created, new.thinking, new.tokens, variants,
                          len(variants))
    return [*messages[:index], shown]


def switch_variant(messages: list[StoredMessage], index: int, which: int) -> list[StoredMessage]:
    """The conversation showing version ``which`` (0-based) of message ``index``, followed by the messages that
    followed that version; the shown version and its followers become a variant."""
    if not 0 <= index < len(messages):
        raise IndexError(f"no message {index}")
    m = messages[index]
    if not 0 <= which < m.n_variants:
        raise IndexError(f"message {index} has {m.n_variants} versions, not {which + 1}")
    if which == m.variant:
        return list(messages)
    every = [*m.variants[: m.variant], Variant(_bare(m), list(messages[index + 1:])), *m.variants[m.variant:]]
    pick = every.pop(which)
    p = pick.message
    shown = StoredMessage(p.role, p.content, p.stats, p.created, p.thinking, p.tokens, every, which)
    return [*messages[:index], shown, *pick.after]


def message_dict(m: StoredMessage, compact: bool = True, depth: int = 0, times: bool = True) -> dict[str, Any]:
    """A message as JSON-ready data, with its tokens (``compact``: the storage's lists, else one object per
    token) and its variants (recursively, each with the messages after it); ``times``: with its creation time."""
    d: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.thinking:
        d["thinking"] = m.thinking
    if m.stats:
        d["stats"] = m.stats
    if m.created and times:
        d["created"] = m.created
    if m.tokens:
        d["tokens"] = _tokens.to_lists(m.tokens) if compact else _tokens.to_dicts(m.tokens)
    if m.variants and depth < MAX_VARIANT_DEPTH:
        d["variant"] = m.variant
        d["variants"] = [{"message": message_dict(v.message, compact, depth + 1, times),
                          "after": [message_dict(a, compact, depth + 1, times) for a in v.after]}
                         for v in m.variants]
    return d


def _variants_json(m: StoredMessage) -> str:
    if not m.variants:
        return ""
    d = message_dict(m)
    return json.dumps(d["variants"], ensure_ascii=False, separators=(",", ":"), default=str)


def message_from(d: Any, depth: int = 0) -> StoredMessage:
    """A message from :func:`message_dict`'s compact form; ``ValueError`` when it is not one."""
    if not isinstance(d, dict) or not isinstance(d.get("role"), str) or not isinstance(d.get("content"), str):
        raise ValueError("a message needs a role and a content")
    stats = d.get("stats", {})
    thinking = d.get("thinking", "")
    created = d.get("created", 0.0)
    if not isinstance(stats, dict) or not isinstance(thinking, str) or isinstance(created, bool) \
            or not isinstance(created, (int, float)):
        raise ValueError("a message's stats, thinking or time is malformed")
    toks = _tokens.from_lists(d.get("tokens", []))
    variants = _variants_from(d.get("variants", []), depth)
    which = d.get("variant", 0)
    if isinstance(which, bool) or not isinstance(which, int):
        raise ValueError("a message's variant must be an integer")
    return StoredMessage(d["role"], d["content"], stats, float(created), thinking, toks, variants,
                         max(0, min(which, len(variants))))


def _variants_from(data: Any, depth: int) -> list[Variant]:
    if depth >= MAX_VARIANT_DEPTH or not isinstance(data, list):
        raise ValueError("variants must be a list (and not nested too deeply)")
    out = []
    for v in data:
        if not isinstance(v, dict) or not isinstance(v.get("after", []), list):
            raise ValueError("a variant needs a message and the messages after it")
        msg = message_from(v.get("message"), depth + 1)
        out.append(Variant(_bare(msg), [message_from(a, depth + 1) for a in v.get("after", [])]))
    return out


def _row_message(role: object, content: object, stats: object, created: object, thinking: object, toks: object,
                 variants: object, variant: object, uid: object, row_id: object) -> StoredMessage:
    """A stored row as a message; token records or variants that do not read are left out (the text stays), a
    value of the wrong type reads as its default."""
    try:
        records = _tokens.loads(_text(toks))
    except (ValueError, TypeError, RecursionError):
        records = []
    vs: list[Variant] = []
    if isinstance(variants, str) and variants:
        try:
            vs = _variants_from(json.loads(variants), 0)
        except (ValueError, TypeError, RecursionError):
            vs = []
    which = max(0, min(_int(variant), len(vs)))
    return StoredMessage(_text(role, "user"), _text(content), _loads(stats), _num(created), _text(thinking),
                         records, vs, which, _text(uid) or f"row-{_int(row_id)}")


@dataclass(frozen=True)
class ModelIdentity:
    """Which model a conversation belongs to: file name, quantization (``general.file_type`` name), path and
    size in bytes. Two identities are the same model when their names agree and so do quantization and size
    where both record them (a moved file is still the same model; a conversation saved before identities had
    a quantization matches by name)."""

    name: str = ""
    quant: str = ""
    path: str = ""
    size: int = 0

    def same_model(self, other: ModelIdentity) -> bool:
        return (self.name == other.name and (not self.quant or not other.quant or self.quant == other.quant)
                and (not self.size or not other.size or self.size == other.size))

    @property
    def label(self) -> str:
        """``name · quant`` for lists and notices."""
        if not self.name:
            return "no model recorded"
        return f"{self.name} · {self.quant}" if self.quant else self.name


@dataclass
class ConversationInfo:
    """A row of the conversation list."""

    id: int
    title: str
    model: str
    created: float
    updated: float
    n_messages: int
    model_quant: str = ""
    model_path: str = ""
    model_size: int = 0

    @property
    def identity(self) -> ModelIdentity:
        return ModelIdentity(self.model, self.model_quant, self.model_path, self.model_size)


@dataclass
class Conversation:
    """A whole conversation with its settings."""

    id: int
    title: str
    model: str = ""
    model_path: str = ""
    system_prompt: str = ""
    mode: str = "chat"
    params: dict[str, Any] = field(default_factory=dict)
    created: float = 0.0
    updated: float = 0.0
    messages: list[StoredMessage] = field(default_factory=list)
    model_quant: str = ""
    model_size: int = 0

    @property
    def identity(self) -> ModelIdentity:
        return ModelIdentity(self.model, self.model_quant, self.model_path, self.model_size)


def _dumps(d: dict[str, Any]) -> str:
    return json.dumps(d, ensure_ascii=False, sort_keys=True, default=str)


def _loads(s: object) -> dict[str, Any]:
    try:
        v = json.loads(s)  # type: ignore[arg-type]
    except (TypeError, ValueError, RecursionError):
        return {}
    return v if isinstance(v, dict) else {}


class ChatStore:
    """The conversation database. ``path`` defaults to :func:`default_path`; its folder is created. A file that is
    not a readable database is renamed to ``NAME.unreadable-TIME`` (:attr:`moved_aside`) and a new one begun."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_path()
        #: where an unreadable database found at :attr:`path` was moved (None: nothing was moved)
        self.moved_aside: Path | None = None
        try:
            self._open()
        except _Unreadable as exc:
            self.moved_aside = self._move_aside(str(exc))
            try:
                self._open()
            except _Unreadable as again:
                raise StoreError(f"{self.path} is not a usable conversation database: {again}") from None

    def _move_aside(self, why: str) -> Path:
        """Rename the unreadable database (with its -wal and -shm files) to a free ``.unreadable-TIME`` name."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for n in range(1000):
            dest = self.path.with_name(f"{self.path.name}.unreadable-{stamp}" + (f"-{n}" if n else ""))
            if not any(os.path.lexists(f"{dest}{x}") for x in ("", "-wal", "-shm")):
                break
        else:
            raise StoreError(f"{self.path} is not a usable conversation database ({why}) and cannot be moved aside")
        try:
            for x in ("-wal", "-shm", ""):
                if os.path.lexists(f"{self.path}{x}"):
                    os.rename(f"{self.path}{x}", f"{dest}{x}")
        except OSError as exc:
            raise StoreError(f"{self.path} is not a usable conversation database ({why}) and cannot be moved "
                             f"aside: {exc.strerror or exc}") from None
        return dest

    def _open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(self.path), timeout=5.0)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open the conversation database {self.path}: {exc}") from None
        try:
            self._db.execute("PRAGMA foreign_keys = ON")
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = NORMAL")  # WAL + NORMAL: durable, and a commit costs no fsync
            version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
            if version > SCHEMA_VERSION:
                raise StoreError(f"{self.path} was written by a newer Quantscope (schema {version}, this one reads "
                                 f"{SCHEMA_VERSION})")
            with self._db:
                self._db.executescript(_SCHEMA)
                have = {r[1] for r in self._db.execute("PRAGMA table_info(conversations)")}
                for col, decl in _ADDED.items():  # schema 1 -> 2: conversations made before keep an empty identity
                    if col not in have:
                        self._db.execute(f"ALTER TABLE conversations ADD COLUMN {col} {decl}")
                have = {r[1] for r in self._db.execute("PRAGMA table_info(messages)")}
                for col, decl in _ADDED_MESSAGES.items():
                    if col not in have:
                        self._db.execute(f"ALTER TABLE messages ADD COLUMN {col} {decl}")
                self._db.execute("CREATE UNIQUE INDEX IF NOT EXISTS messages_by_uid ON messages(conversation_id, uid) "
                                 "WHERE uid != ''")
                self._db.execute("UPDATE messages SET uid = lower(hex(randomblob(16))) WHERE uid = ''")
                self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except sqlite3.Error as exc:
            self._db.close()
            if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError):
                raise _Unreadable(str(exc)) from None  # not a database, malformed: its bytes are kept aside
            raise StoreError(f"{self.path} is not a usable conversation database: {exc}") from None
        except StoreError:
            self._db.close()
            raise

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> ChatStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self, sql: str, args: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        try:
            with self._db:
                return self._db.execute(sql, args)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: {exc}") from None

    # ------------------------------------------------------------------ conversations
    def create(self, title: str = "New chat", *, model: str = "", model_path: str = "", system_prompt: str = "",
               mode: str = "chat", params: dict[str, Any] | None = None,
               messages: list[StoredMessage] | None = None, identity: ModelIdentity | None = None) -> int:
        """A new conversation (optionally with its messages) bound to ``identity`` (or to ``model`` and
        ``model_path`` alone); returns its id."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        ident = identity or ModelIdentity(model, "", model_path, 0)
        now = time.time()
        cur = self._write("INSERT INTO conversations (title, model, model_path, model_quant, model_size, "
                          "system_prompt, mode, params, created, updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                          (title.strip() or "New chat", ident.name, ident.path, ident.quant, int(ident.size),
                           system_prompt, mode, _dumps(params or {}), now, now))
        cid = int(cur.lastrowid or 0)
        if messages:
            self.set_messages(cid, messages)
        return cid

    def list_conversations(self) -> list[ConversationInfo]:
        """Every conversation, most recently updated first."""
        rows = self._db.execute(
            "SELECT c.id, c.title, c.model, c.created, c.updated, COUNT(m.id), c.model_quant, c.model_path, "
            "c.model_size FROM conversations c LEFT JOIN messages m ON m.conversation_id = c.id GROUP BY c.id "
            "ORDER BY c.updated DESC, c.id DESC"
        ).fetchall()
        return [ConversationInfo(_int(r[0]), _text(r[1], "(untitled)"), _text(r[2]), _num(r[3]), _num(r[4]),
                                 _int(r[5]), _text(r[6]), _text(r[7]), _int(r[8])) for r in rows]

    def exists(self, conv_id: int) -> bool:
        return self._db.execute("SELECT 1 FROM conversations WHERE id = ?", (conv_id,)).fetchone() is not None

    def get(self, conv_id: int) -> Conversation:
        """The conversation and its messages in order; :class:`KeyError` when there is none with that id."""
        r = self._db.execute("SELECT id, title, model, model_path, system_prompt, mode, params, created, updated, "
                             "model_quant, model_size FROM conversations WHERE id = ?", (conv_id,)).fetchone()
        if r is None:
            raise KeyError(conv_id)
        msgs = [_row_message(*m) for m in self._db.execute(
            "SELECT role, content, stats, created, thinking, tokens, variants, variant, uid, id FROM messages "
            "WHERE conversation_id = ? ORDER BY position, id", (conv_id,))]
        mode = _text(r[5], "chat")
        return Conversation(_int(r[0]), _text(r[1], "(untitled)"), _text(r[2]), _text(r[3]), _text(r[4]),
                            mode if mode in MODES else "chat", _loads(r[6]), _num(r[7]), _num(r[8]), msgs,
                            _text(r[9]), _int(r[10]))

    def rename(self, conv_id: int, title: str) -> None:
        title = " ".join(title.split())
        if not title:
            raise ValueError("a conversation needs a non-empty title")
        self._touch(conv_id, "title = ?", (title,))

    def update(self, conv_id: int, *, system_prompt: str | None = None, mode: str | None = None,
               params: dict[str, Any] | None = None, model: str | None = None, model_path: str | None = None,
               identity: ModelIdentity | None = None) -> None:
        """Change the settings that are given (``None`` leaves a field as it is); ``identity`` rebinds the
        conversation to another model (name, quantization, path, size)."""
        if mode is not None and mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        sets: list[str] = []
        args: list[Any] = []
        if identity is not None:
            model, model_path = identity.name, identity.path
            sets += ["model_quant = ?", "model_size = ?"]
            args += [identity.quant, int(identity.size)]
        for col, val in (("system_prompt", system_prompt), ("mode", mode), ("model", model),
                         ("model_path", model_path)):
            if val is not None:
                sets.append(f"{col} = ?")
                args.append(val)
        if params is not None:
            sets.append("params = ?")
            args.append(_dumps(params))
        if sets:
            self._touch(conv_id, ", ".join(sets), tuple(args))

    def _touch(self, conv_id: int, sets: str, args: tuple[Any, ...]) -> None:
        cur = self._write(f"UPDATE conversations SET {sets}, updated = ? WHERE id = ?", (*args, time.time(), conv_id))
        if cur.rowcount == 0:
            raise KeyError(conv_id)

    def delete(self, conv_id: int) -> None:
        """Remove the conversation and its messages (nothing happens when it does not exist)."""
        self._write("DELETE FROM conversations WHERE id = ?", (conv_id,))

    # ------------------------------------------------------------------ messages
    def save_messages(self, conv_id: int, messages: list[StoredMessage], removed: Iterable[str] = ()) -> None:
        """Save one window's view of a conversation without losing another's: each message is updated in place
        by its uid, or appended after every stored one when it is new; the messages ``removed`` names (uids this
        window loaded or saved and has since dropped: an edit, a regenerate, a switch of version) are deleted.
        Messages another window saved meanwhile are left as they are."""
        now = time.time()
        keep = {m.uid for m in messages}
        try:
            with self._db:
                cur = self._db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conv_id))
                if cur.rowcount == 0:
                    raise KeyError(conv_id)
                for uid in set(removed) - keep:
                    self._db.execute(f"DELETE FROM messages WHERE conversation_id = ? AND {_by_uid(uid)}",
                                     (conv_id, _uid_arg(uid)))
                for m in messages:
                    fields = (m.role, m.content, _dumps(m.stats), m.created or now, m.thinking,
                              _tokens.dumps(m.tokens), _variants_json(m), m.variant if m.variants else 0)
                    cur = self._db.execute(
                        "UPDATE messages SET role = ?, content = ?, stats = ?, created = ?, thinking = ?, tokens = ?, "
                        f"variants = ?, variant = ? WHERE conversation_id = ? AND {_by_uid(m.uid)}",
                        (*fields, conv_id, _uid_arg(m.uid)))
                    if cur.rowcount:
                        continue
                    (pos,) = self._db.execute("SELECT COALESCE(MAX(position) + 1, 0) FROM messages "
                                              "WHERE conversation_id = ?", (conv_id,)).fetchone()
                    if m.uid.startswith("row-"):  # a row of an older Quantscope, gone meanwhile: a new identity
                        m.uid = _new_uid()
                    self._db.execute(
                        "INSERT INTO messages (conversation_id, position, role, content, stats, created, thinking, "
                        "tokens, variants, variant, uid) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (conv_id, _int(pos), *fields, m.uid))
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: {exc}") from None

    def set_messages(self, conv_id: int, messages: list[StoredMessage]) -> None:
        """Replace all of the conversation's messages (a new conversation's, an import); a window saving what it
        shows uses :meth:`save_messages`, which keeps what other windows saved."""
        now = time.time()
        try:
            with self._db:
                cur = self._db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conv_id))
                if cur.rowcount == 0:
                    raise KeyError(conv_id)
                self._db.execute("DELETE FROM messages WHERE conversation_id = ?", (conv_id,))
                self._db.executemany(
                    "INSERT INTO messages (conversation_id, position, role, content, stats, created, thinking, "
                    "tokens, variants, variant, uid) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [(conv_id, i, m.role, m.content, _dumps(m.stats), m.created or now, m.thinking,
                      _tokens.dumps(m.tokens), _variants_json(m), m.variant if m.variants else 0, _fresh(m))
                     for i, m in enumerate(messages)])
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: {exc}") from None

    def append_message(self, conv_id: int, message: StoredMessage) -> None:
        now = time.time()
        try:
            with self._db:
                cur = self._db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conv_id))
                if cur.rowcount == 0:
                    raise KeyError(conv_id)
                (pos,) = self._db.execute("SELECT COALESCE(MAX(position) + 1, 0) FROM messages "
                                          "WHERE conversation_id = ?", (conv_id,)).fetchone()
                self._db.execute("INSERT INTO messages (conversation_id, position, role, content, stats, created, "
                                 "thinking, tokens, variants, variant, uid) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                 (conv_id, _int(pos), message.role, message.content, _dumps(message.stats),
                                  message.created or now, message.thinking, _tokens.dumps(message.tokens),
                                  _variants_json(message), message.variant if message.variants else 0,
                                  _fresh(message)))
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: {exc}") from None


class _Unreadable(Exception):
    """The file is not a readable SQLite database (moved aside by :class:`ChatStore`)."""


def _by_uid(uid: str) -> str:
    """The condition naming a message: its uid, or its row id for a row an older Quantscope wrote."""
    return "id = ?" if uid.startswith("row-") else "uid = ?"


def _uid_arg(uid: str) -> object:
    return _int(int(uid[4:]) if uid[4:].isdecimal() else -1) if uid.startswith("row-") else uid


def _fresh(m: StoredMessage) -> str:
    """The message's uid for a new row (an older row's stand-in gets a real one)."""
    if not m.uid or m.uid.startswith("row-"):
        m.uid = _new_uid()
    return m.uid


# ---------------------------------------------------------------------------------------------------- export
def title_from(text: str, limit: int = 48) -> str:
    """A conversation title from its first message: the first line, whitespace collapsed, cut at a word."""
    line = next((x for x in text.splitlines() if x.strip()), "")
    line = " ".join(line.split())
    if len(line) <= limit:
        return line or "New chat"
    cut = line[:limit].rsplit(" ", 1)[0] if " " in line[:limit] else line[:limit]
    return cut.rstrip(" ,.;:") + "…"


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def close_fences(text: str) -> str:
    """``text`` with an unterminated code fence closed (a reply stopped inside a code block must not swallow the
    rest of an exported document)."""
    open_fence: str | None = None
    for line in text.splitlines():
        m = _FENCE.match(line)
        if not m:
            continue
        fence = m.group(1)
        if open_fence is None:
            open_fence = fence
        elif fence[0] == open_fence[0] and len(fence) >= len(open_fence) and not line.strip()[len(fence):].strip():
            open_fence = None
    if open_fence is None:
        return text
    return text + ("" if text.endswith("\n") else "\n") + open_fence


_ROLE_TITLES = {"system": "System", "user": "User", "assistant": "Assistant"}


def _when(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M") if t else "—"


def _stats_line(stats: dict[str, Any]) -> str:
    parts = []
    if "n_generated" in stats:
        parts.append(f"{stats['n_generated']} tokens")
    if stats.get("gen_tps"):
        parts.append(f"{float(stats['gen_tps']):.1f} tokens/s")
    if stats.get("ttft_s") is not None:
        parts.append(f"first token after {float(stats['ttft_s']) * 1000:.0f} ms")
    if stats.get("stop_reason"):
        parts.append(f"stop: {stats['stop_reason']}")
    return " · ".join(parts)


def to_markdown(conv: Conversation) -> str:
    """A readable Markdown document: title, model and settings, then each message under a role heading."""
    head = [f"# {conv.title}", ""]
    meta = [f"- Model: `{conv.model}`" + (f" ({conv.model_quant})" if conv.model_quant else "") if conv.model
            else "- Model: (none recorded)",
            f"- Mode: {'plain completion' if conv.mode == 'completion' else 'chat'}",
            f"- Created: {_when(conv.created)}, updated: {_when(conv.updated)}"]
    if conv.params:
        meta.append("- Sampling: " + ", ".join(f"{k} = {v}" for k, v in sorted(conv.params.items())
                                               if k != "stop" and v is not None))
    out = head + meta + [""]
    if conv.system_prompt:
        out += ["## System", "", close_fences(conv.system_prompt.strip("\n")), ""]
    for m in conv.messages:
        if conv.mode == "completion":
            title = "Prompt" if m.role == "user" else "Continuation"
        else:
            title = _ROLE_TITLES.get(m.role, m.role.capitalize())
        out += [f"## {title}" + (f" (version {m.variant + 1} of {m.n_variants})" if m.variants else ""), ""]
        out += _md_body(m, conv.mode)
        if m.variants:  # the versions not shown (branches), folded away, each with how many messages followed
            out += [f"<details><summary>Other versions ({len(m.variants)})</summary>", ""]
            for k, v in enumerate(m.variants):
                n = k + 1 if k < m.variant else k + 2
                after = f", followed by {len(v.after)} message{'s' if len(v.after) != 1 else ''}" if v.after else ""
                out += [f"**Version {n} of {m.n_variants}**{after}", ""]
                out += _md_body(v.message, conv.mode)
            out += ["</details>", ""]
    return "\n".join(out).rstrip("\n") + "\n"


def _md_body(m: StoredMessage, mode: str) -> list[str]:
    """A message's thinking (folded), text and numbers as Markdown lines."""
    out = []
    if m.thinking.strip():  # a harmony model's thinking, folded away as chat apps show it
        out += ["<details><summary>Thinking</summary>", "", close_fences(m.thinking.strip("\n")), "",
                "</details>", ""]
    body = m.content.strip("\n")
    if mode == "completion":  # exact text: fenced so that Markdown does not reflow it
        fence = "````" if "```" in body else "```"
        out += [fence + "text", body, fence]
    else:
        out.append(close_fences(body) if body else "*(empty)*")
    line = _stats_line(m.stats)
    if line:
        out += ["", f"*{line}*"]
    out.append("")
    return out


def to_dict(conv: Conversation) -> dict[str, Any]:
    """The JSON export as a dict (``format``/``version`` first, messages in the OpenAI-style role/content form)."""
    return {
        "format": EXPORT_FORMAT,
        "version": 1,
        "title": conv.title,
        "model": conv.model,
        "model_path": conv.model_path,
        "model_quant": conv.model_quant,
        "model_size": conv.model_size,
        "mode": conv.mode,
        "system_prompt": conv.system_prompt,
        "params": conv.params,
        "created": datetime.fromtimestamp(conv.created).astimezone().isoformat() if conv.created else None,
        "updated": datetime.fromtimestamp(conv.updated).astimezone().isoformat() if conv.updated else None,
        "messages": [_export_message(m) for m in conv.messages],
    }


def _export_message(m: StoredMessage) -> dict[str, Any]:
    """A message of the JSON export: role, content, thinking, stats, its tokens (one object each, with their
    probabilities and alternatives) and its other versions (``variants``, each with the messages after it;
    ``variant`` is this one's place, 0-based)."""
    return message_dict(m, compact=False, times=False)


def to_json(conv: Conversation) -> str:
    return json.dumps(to_dict(conv), ensure_ascii=False, indent=2) + "\n"


def export(conv: Conversation, path: str | Path, fmt: str | None = None) -> Path:
    """Write ``conv`` as Markdown (``.md``) or JSON (``.json``); ``fmt`` ("markdown"/"json") overrides the
    suffix. Written through a temporary file, so a failed export leaves no half file."""
    p = Path(path)
    kind = fmt or ("json" if p.suffix.lower() == ".json" else "markdown")
    if kind not in ("markdown", "json"):
        raise ValueError(f"export format must be markdown or json, got {kind!r}")
    text = to_json(conv) if kind == "json" else to_markdown(conv)
    write_atomic(p, text, "export")  # refuses FIFOs, devices, directories; a failed export leaves no half file
    return p
