"""The conversation store (core.chat.store): SQLite persistence, the data-directory rules, exports."""

from __future__ import annotations

import json
import sqlite3

import pytest

from quantscope.core.chat.store import (
    SCHEMA_VERSION,
    ChatStore,
    ModelIdentity,
    StoredMessage,
    StoreError,
    close_fences,
    data_dir,
    default_path,
    export,
    title_from,
    to_dict,
    to_markdown,
)


@pytest.fixture
def store(tmp_path):
    s = ChatStore(tmp_path / "data" / "chats.sqlite3")
    yield s
    s.close()


def test_data_dir_rules(monkeypatch, tmp_path):
    monkeypatch.setenv("QUANTSCOPE_DATA", str(tmp_path / "qs"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert data_dir() == tmp_path / "qs" and default_path() == tmp_path / "qs" / "chats.sqlite3"
    monkeypatch.delenv("QUANTSCOPE_DATA")
    assert default_path() == tmp_path / "xdg" / "quantscope" / "chats.sqlite3"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_path() == tmp_path / "home" / ".local" / "share" / "quantscope" / "chats.sqlite3"


def test_default_store_goes_where_quantscope_data_says(monkeypatch, tmp_path):
    monkeypatch.setenv("QUANTSCOPE_DATA", str(tmp_path / "d"))
    with ChatStore() as s:
        s.create("x")
    assert (tmp_path / "d" / "chats.sqlite3").is_file()


def test_create_list_get_rename_delete(store):
    a = store.create("First", model="smol.gguf", system_prompt="be nice", params={"temperature": 0.2})
    b = store.create("  ", mode="completion")
    assert store.get(b).title == "New chat" and store.get(b).mode == "completion"
    store.set_messages(a, [StoredMessage("user", "hi"), StoredMessage("assistant", "hello", {"n_generated": 3})])
    convs = store.list_conversations()
    assert [c.id for c in convs] == [a, b]  # most recently updated first
    assert convs[0].n_messages == 2 and convs[1].n_messages == 0 and convs[0].model == "smol.gguf"
    c = store.get(a)
    assert c.system_prompt == "be nice" and c.params == {"temperature": 0.2}
    assert [(m.role, m.content) for m in c.messages] == [("user", "hi"), ("assistant", "hello")]
    assert c.messages[1].stats == {"n_generated": 3} and c.messages[0].created > 0
    store.rename(a, "  Renamed   twice ")
    assert store.get(a).title == "Renamed twice"
    with pytest.raises(ValueError):
        store.rename(a, "   ")
    store.update(a, system_prompt="terse", params={"temperature": 0.0}, mode="chat")
    assert store.get(a).system_prompt == "terse" and store.get(a).params == {"temperature": 0.0}
    with pytest.raises(ValueError):
        store.update(a, mode="nonsense")
    store.delete(a)
    assert not store.exists(a) and [c.id for c in store.list_conversations()] == [b]
    with pytest.raises(KeyError):
        store.get(a)
    with pytest.raises(KeyError):
        store.rename(a, "gone")
    with pytest.raises(KeyError):
        store.set_messages(a, [])
    # the messages went with it (ON DELETE CASCADE)
    assert store._db.execute("SELECT COUNT(*) FROM messages WHERE conversation_id = ?", (a,)).fetchone()[0] == 0


def test_set_messages_replaces_and_append_adds(store):
    cid = store.create("c")
    store.set_messages(cid, [StoredMessage("user", str(i)) for i in range(5)])
    store.set_messages(cid, [StoredMessage("user", "edited")])  # an edit drops what followed
    store.append_message(cid, StoredMessage("assistant", "reply ✓ 日本語"))
    assert [m.content for m in store.get(cid).messages] == ["edited", "reply ✓ 日本語"]


def test_persists_across_connections(tmp_path):
    p = tmp_path / "c.sqlite3"
    with ChatStore(p) as s:
        cid = s.create("kept", messages=[StoredMessage("user", "q"), StoredMessage("assistant", "a")])
    with ChatStore(p) as s:
        assert s.get(cid).title == "kept" and len(s.get(cid).messages) == 2
        assert s._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4


def test_schema_1_database_is_migrated_and_keeps_its_conversations(tmp_path):
    """A database written before conversations carried the model identity opens, keeps its rows (with an empty
    quantization; its messages gain an empty thinking column) and takes the identity from then on."""
    import sqlite3

    p = tmp_path / "old.sqlite3"
    db = sqlite3.connect(p)
    db.executescript("""
        CREATE TABLE conversations (id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL,
            model TEXT NOT NULL DEFAULT '', model_path TEXT NOT NULL DEFAULT '',
            system_prompt TEXT NOT NULL DEFAULT '', mode TEXT NOT NULL DEFAULT 'chat',
            params TEXT NOT NULL DEFAULT '{}', created REAL NOT NULL, updated REAL NOT NULL);
        CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, conversation_id INTEGER NOT NULL,
            position INTEGER NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL,
            stats TEXT NOT NULL DEFAULT '{}', created REAL NOT NULL);
        INSERT INTO conversations (title, model, model_path, created, updated)
            VALUES ('old chat', 'SmolLM2.gguf', '/m/SmolLM2.gguf', 1, 1);
        INSERT INTO messages (conversation_id, position, role, content, created) VALUES (1, 0, 'user', 'hi', 1);
        PRAGMA user_version = 1;
    """)
    db.commit()
    db.close()
    with ChatStore(p) as s:
        assert s._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
        old = s.get(1)
        assert old.title == "old chat" and [(m.content, m.thinking) for m in old.messages] == [("hi", "")]
        assert old.identity == ModelIdentity("SmolLM2.gguf", "", "/m/SmolLM2.gguf", 0)
        ident = ModelIdentity("qwen.gguf", "MOSTLY_Q4_K_M", "/m/qwen.gguf", 123)
        cid = s.create("new", identity=ident)
        s.update(1, identity=ident)
    with ChatStore(p) as s:
        rows = {c.id: c for c in s.list_conversations()}
        assert rows[cid].identity == ident and rows[1].identity == ident
        assert rows[1].identity.label == "qwen.gguf · MOSTLY_Q4_K_M"
        assert ident.same_model(ModelIdentity("qwen.gguf", "MOSTLY_Q4_K_M", "/elsewhere/qwen.gguf", 123))
        assert not ident.same_model(ModelIdentity("qwen.gguf", "MOSTLY_Q8_0", "/m/qwen.gguf", 123))
        assert not ident.same_model(ModelIdentity("smol.gguf", "MOSTLY_Q4_K_M", "/m/qwen.gguf", 123))
        assert ident.same_model(ModelIdentity("qwen.gguf", "", "", 0))  # a schema-1 row: by name


def test_bad_and_newer_files_are_refused_by_name(tmp_path):
    """A file that is not a database is kept aside under a name the store reports (never dropped) and a new
    database begins; a newer schema and an unusable path are refused by name."""
    bad = tmp_path / "bad.sqlite3"
    junk = b"this is not a database" * 100
    bad.write_bytes(junk)
    with ChatStore(bad) as s:
        aside = s.moved_aside
        assert aside is not None and aside.name.startswith("bad.sqlite3.unreadable-") and aside.read_bytes() == junk
        assert s.list_conversations() == [] and s.create("new") == 1
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(("-wal", "-shm"))) == sorted(
        ["bad.sqlite3", aside.name])
    newer = tmp_path / "newer.sqlite3"
    db = sqlite3.connect(newer)
    db.execute("PRAGMA user_version = 99")
    db.close()
    with pytest.raises(StoreError, match="newer Quantscope"):
        ChatStore(newer)
    blocked = tmp_path / "file"
    blocked.write_text("x")
    with pytest.raises(StoreError):
        ChatStore(blocked / "sub" / "c.sqlite3")


def test_title_from_and_close_fences():
    assert title_from("\n  Write a   haiku\nabout rain") == "Write a haiku"
    t = title_from("word " * 40)
    assert t.endswith("…") and len(t) <= 49
    assert title_from("") == "New chat"
    assert close_fences("a\n```py\nx = 1") == "a\n```py\nx = 1\n```"
    assert close_fences("```\nx\n```\n") == "```\nx\n```\n"
    assert close_fences("~~~~\n```\ninside\n") == "~~~~\n```\ninside\n~~~~"


def _sample(store):
    cid = store.create("Adding numbers", model="SmolLM2-135M-Instruct.Q4_1.gguf", system_prompt="Be brief.",
                       params={"temperature": 0.0, "top_k": 40, "seed": None})
    store.set_messages(cid, [
        StoredMessage("user", "Write a function that adds two numbers."),
        StoredMessage("assistant", "Here it is:\n\n```python\ndef add(a, b):\n    return a + b\n```\n\nDone.",
                      {"n_generated": 30, "gen_tps": 25.5, "ttft_s": 0.12, "stop_reason": "end of generation"}),
        StoredMessage("user", "And in C?"),
        StoredMessage("assistant", "```c\nint add(int a, int b) {", {"n_generated": 9, "stop_reason": "cancelled"}),
    ])
    return store.get(cid)


def test_markdown_export_is_valid_markdown(store, tmp_path, qapp):
    from PySide6.QtGui import QTextDocument

    conv = _sample(store)
    md = to_markdown(conv)
    assert md.startswith("# Adding numbers\n")
    assert "## System\n\nBe brief." in md and md.count("## User") == 2 and md.count("## Assistant") == 2
    assert "*30 tokens · 25.5 tokens/s · first token after 120 ms · stop: end of generation*" in md
    fences = [ln for ln in md.splitlines() if ln.startswith("```")]
    assert len(fences) % 2 == 0  # the stopped reply's open code block was closed
    doc = QTextDocument()
    doc.setMarkdown(md)  # Qt's CommonMark parser: headings and code blocks come out as such
    text = doc.toPlainText()
    assert "def add(a, b):" in text and "int add(int a, int b) {" in text and "## User" not in text
    p = export(conv, tmp_path / "chat.md")
    assert p.read_text(encoding="utf-8") == md and not list(tmp_path.glob(".*tmp"))


def test_json_export_round_trips(store, tmp_path):
    conv = _sample(store)
    p = export(conv, tmp_path / "chat.json")
    d = json.loads(p.read_text(encoding="utf-8"))
    assert d == to_dict(conv)
    assert d["format"] == "quantscope-chat" and d["version"] == 1 and d["title"] == "Adding numbers"
    assert d["system_prompt"] == "Be brief." and d["params"]["temperature"] == 0.0
    assert [m["role"] for m in d["messages"]] == ["user", "assistant", "user", "assistant"]
    assert d["messages"][1]["content"] == conv.messages[1].content and d["messages"][1]["stats"]["n_generated"] == 30
    assert "stats" not in d["messages"][0]
    with pytest.raises(ValueError):
        export(conv, tmp_path / "x.txt", fmt="html")


def test_completion_mode_export_keeps_text_exact(store):
    cid = store.create("c", mode="completion", messages=[StoredMessage("user", "Once upon a time"),
                                                          StoredMessage("assistant", ", a *star* fell")])
    md = to_markdown(store.get(cid))
    assert "## Prompt\n\n```text\nOnce upon a time\n```" in md and "## Continuation" in md
    assert "```text\n, a *star* fell\n```" in md



# ------------------------------------------------------------------------------- two windows, one conversation
_WINDOW = r"""
import sys, time
from pathlib import Path
from quantscope.core.chat.controller import ChatController
from quantscope.core.chat.store import ChatStore

db, cid, me, other, first = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5] == "1"
flags = Path(db).parent

def wait(name):  # the other window's step; the deadline is a hang guard, not a measure
    end = time.monotonic() + 120
    while not (flags / name).exists():
        if time.monotonic() > end:
            raise SystemExit(f"timed out waiting for {name}")
        time.sleep(0.01)

with ChatStore(db) as s:
    ctl = ChatController()
    ctl.open(s, cid)                       # both windows show the conversation as it was
    (flags / f"loaded-{me}").touch()
    wait(f"loaded-{other}")
    if not first:
        wait(f"saved-{other}")
    ctl.add_user(f"question from {me}")
    ctl.add_reply(f"answer for {me}", {"n_generated": 1})
    ctl.save(s, {})                        # shown as saved in this window
    (flags / f"saved-{me}").touch()
"""


def test_two_processes_with_one_conversation_lose_nothing(tmp_path):
    """Window A and window B (two processes) have the same conversation open; A saves an exchange, then B saves
    its own: both exchanges are in the database (B's save must not delete and rewrite A's)."""
    import subprocess
    import sys

    p = tmp_path / "c.sqlite3"
    with ChatStore(p) as s:
        cid = s.create("shared", messages=[StoredMessage("user", "hi"), StoredMessage("assistant", "hello")])
    procs = [subprocess.Popen([sys.executable, "-c", _WINDOW, str(p), str(cid), me, other, first])
             for me, other, first in (("A", "B", "1"), ("B", "A", "0"))]
    assert [pr.wait(300) for pr in procs] == [0, 0]
    with ChatStore(p) as s:
        got = [m.content for m in s.get(cid).messages]
    assert got == ["hi", "hello", "question from A", "answer for A", "question from B", "answer for B"]


def test_a_window_deletes_only_what_it_removed(tmp_path):
    """An edit in window A drops the messages after the edited one that A had shown; a reply B added meanwhile
    stays."""
    from quantscope.core.chat.controller import ChatController

    with ChatStore(tmp_path / "c.sqlite3") as s:
        cid = s.create("x", messages=[StoredMessage("user", "q1"), StoredMessage("assistant", "a1")])
        a, b = ChatController(), ChatController()
        a.open(s, cid)
        b.open(s, cid)
        b.add_user("q-b")
        b.save(s, {})
        a.editing = 0  # A edits its first message: q1 and a1 go, "q1 edited" comes
        a.add_user("q1 edited")
        a.save(s, {})
        assert [m.content for m in s.get(cid).messages] == ["q-b", "q1 edited"]
        a.add_reply("a1 again", {})
        a.save(s, {})  # the same message saved twice is one row
        assert [m.content for m in s.get(cid).messages] == ["q-b", "q1 edited", "a1 again"]


def test_rows_of_an_older_quantscope_keep_working(store):
    """A row written without a uid (an older version in another window) is read, updated and removed by id."""
    from quantscope.core.chat.controller import ChatController

    cid = store.create("x", messages=[StoredMessage("user", "q1")])
    store._db.execute("INSERT INTO messages (conversation_id, position, role, content, created) "
                      "VALUES (?, 5, 'assistant', 'old reply', 1)", (cid,))
    store._db.commit()
    ctl = ChatController()
    ctl.open(store, cid)
    assert [m.content for m in ctl.messages] == ["q1", "old reply"] and ctl.messages[1].uid.startswith("row-")
    ctl.drop_replies()
    ctl.add_reply("new reply", {})
    ctl.save(store, {})
    got = store.get(cid).messages
    assert [m.content for m in got] == ["q1", "new reply"] and got[1].variants[0].message.content == "old reply"


@pytest.mark.parametrize("column, value", [("created", "'yesterday'"), ("updated", "x'00ff'"),
                                           ("model_size", "'big'"), ("model_size", "1e300"), ("title", "42"),
                                           ("mode", "'weird'"), ("params", "'[1,2'")])
def test_values_of_the_wrong_type_read_as_defaults(tmp_path, column, value):
    """A conversation whose created, updated or model_size is not a number (a hand-edited or damaged database)
    lists and opens with defaults instead of raising (the GUI used to die in showEvent)."""
    p = tmp_path / "c.sqlite3"
    with ChatStore(p) as s:
        cid = s.create("t", messages=[StoredMessage("user", "q")])
    db = sqlite3.connect(p)
    db.execute(f"UPDATE conversations SET {column} = {value} WHERE id = ?", (cid,))
    db.execute(f"UPDATE messages SET created = {value}, variant = {value}, stats = {value} WHERE conversation_id = ?",
               (cid,))
    db.commit()
    db.close()
    with ChatStore(p) as s:
        (info,) = s.list_conversations()
        conv = s.get(cid)
    for v in (info.created, info.updated, conv.created, conv.updated, conv.messages[0].created):
        assert isinstance(v, float) and v == v
    assert isinstance(info.model_size, int) and isinstance(conv.model_size, int) and conv.model_size >= 0
    assert isinstance(info.title, str) and conv.mode in ("chat", "completion") and isinstance(conv.params, dict)
    assert conv.messages[0].content == "q" and isinstance(conv.messages[0].stats, dict)
