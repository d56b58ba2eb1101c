"""The chat view's controllers on their own: each is handed its widgets and callbacks (no ChatView, no model
thread), so what it owns can be checked directly — the reply's batching and its end, the model bar's states and
memory check, the conversation store and its list."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtWidgets import QWidget

from quantscope.core.chat.controller import ChatController, identity_of
from quantscope.core.chat.store import ChatStore, StoredMessage, StoreError
from quantscope.core.gguf.reader import GGUFFile
from quantscope.gui.chat_engine import GenStats
from quantscope.gui.document import Document
from quantscope.gui.views import chat_loading, chat_persist
from quantscope.gui.views.chat_conversations import ConversationPanel
from quantscope.gui.views.chat_loading import ModelLoader
from quantscope.gui.views.chat_modelbar import ModelBar
from quantscope.gui.views.chat_notices import Notices
from quantscope.gui.views.chat_persist import Conversations
from quantscope.gui.views.chat_reply import ReplyController, ReplyHooks
from quantscope.gui.views.chat_settings import SamplingPanel
from quantscope.gui.views.chat_thread import Composer, ReplyStream, StatsBar


@dataclass
class FakeHost:
    """What the controllers use of the model thread's handle: its state, the engine info, generate and stop."""

    state: str = "ready"
    info: Any = None
    requests: list[tuple[Any, ...]] = field(default_factory=list)
    stopped: int = 0

    def generate(self, prompt: Any, params: Any, threads: int = 0, reserve: int = 256, forced: Any = None,
                 seed: Any = None, lookup: int = 0) -> int:
        self.requests.append((prompt, params, threads, reserve, forced, seed, lookup))
        self.state = "generating"
        return len(self.requests)

    def stop(self) -> None:
        self.stopped += 1

    def cancel_load(self) -> None:
        pass


@pytest.fixture
def reply(qtbot):
    owner = QWidget()
    qtbot.addWidget(owner)
    host, ctl, calls = FakeHost(), ChatController(), []
    stream, composer, bar = ReplyStream(owner), Composer(owner), ModelBar(owner)
    hooks = ReplyHooks(show_error=lambda m, d: calls.append(("error", m)), clear_error=lambda: calls.append("clear"),
                       save=lambda: calls.append("save"), controls_changed=lambda: None,
                       preview_changed=lambda: None, finished=lambda s: calls.append(("finished", s)),
                       failed=lambda m, d: calls.append(("failed", m, d)))
    r = ReplyController(host, ctl, stream, composer, StatsBar(4096, owner), Notices(owner), SamplingPanel(owner),
                        bar, owner, lambda: True, hooks)
    return r, host, calls


def test_a_reply_is_batched_then_kept_when_it_finishes(reply):
    r, host, calls = reply
    r.composer.text.setPlainText("Hello there")
    assert r.send()
    assert host.requests[0][0] == [{"role": "user", "content": "Hello there"}]  # chat mode, no system prompt
    assert r.composer.text.toPlainText() == "" and r.flush_timer.isActive() and r.view is not None
    req = r.req
    for i in range(40):
        r.on_delta(req, f"w{i} ", GenStats(n_generated=i + 1))
    r.on_delta(req + 7, "stale ", GenStats(n_generated=99))  # another request's delta: ignored
    assert r.flushes == 0 and r.stats == GenStats(n_generated=40)
    r.flush()
    r.flush()  # nothing new: no second append
    assert r.flushes == 1 and r.last_stats == GenStats(n_generated=40)
    host.state = "ready"
    done = GenStats(n_generated=40, stop_reason="length")
    r.on_finished(req, done)
    text = "".join(f"w{i} " for i in range(40))
    assert [(m.role, m.content) for m in r.messages] == [("user", "Hello there"), ("assistant", text)]
    assert r.messages[-1].stats["stop_reason"] == "length"
    assert calls[-1] == ("finished", done) and calls.count("save") >= 2  # before the reply and after it
    assert r.view is None and r.req == 0 and not r.flush_timer.isActive()
    assert [v.role for v in r.views] == ["user", "assistant"]


def test_a_reply_that_fails_before_any_token_leaves_no_empty_message(reply):
    r, _host, calls = reply
    assert r.send("Hi")
    r.on_failed(r.req, "Generation failed.", "the detail")
    assert [m.role for m in r.messages] == ["user"] and [v.role for v in r.views] == ["user"]
    assert calls[-1] == ("failed", "Generation failed.", "the detail") and r.view is None


def test_an_aborted_reply_keeps_what_arrived_marked_cancelled(reply):
    r, host, _calls = reply
    assert r.send("Hi")
    r.on_delta(r.req, "partial answer", GenStats(n_generated=2))
    r.abort("the file was switched")
    assert host.stopped == 1
    last = r.messages[-1]
    assert (last.role, last.content) == ("assistant", "partial answer")
    assert last.stats["stop_reason"] == "cancelled (the file was switched)"
    r.abort("again")  # nothing streams any more: nothing happens
    assert host.stopped == 1


def test_nothing_is_sent_unless_the_model_is_ready_or_to_a_foreign_conversation(reply):
    r, host, _calls = reply
    host.state = "loading"
    assert not r.send("Hi") and host.requests == [] and r.messages == []
    host.state = "ready"
    r.ctl.set_model(identity_of("/m/b.gguf", "Q8_0"))
    r.ctl.owner = identity_of("/m/a.gguf", "Q4_0")  # a conversation of another model: continuing is explicit
    assert r.ctl.foreign and not r.send("Hi") and host.requests == []


def test_the_model_bar_follows_the_model_thread_and_the_cuda_probe(qtbot):
    bar = ModelBar()
    qtbot.addWidget(bar)
    host = FakeHost(state="loading")
    lo = ModelLoader(None, host, bar, lambda: None)  # type: ignore[arg-type]
    lo.update_controls(True)
    assert not bar.load_btn.isEnabled() and bar.unload_btn.isEnabled() and not bar.load_cancel.isHidden()
    assert not bar.backend_combo.isEnabled()
    host.state = "ready"
    lo.loaded_note = " · loaded in 0.50 s"
    lo.update_controls(True)
    assert bar.load_btn.text() == "Reload" and bar.load_cancel.isHidden()
    assert bar.model_state.full_text() == "ready · loaded in 0.50 s"
    lo.cuda_checked((False, "no CUDA driver (libcuda.so.1 not found)"))
    assert lo.cuda == (False, "no CUDA driver (libcuda.so.1 not found)")
    assert bar.cuda_label.full_text() == "CUDA unavailable: no CUDA driver"
    assert not bar.backend_combo.model().item(1).isEnabled()
    assert lo.plan() is None and lo.too_large() is None and not lo.start()  # no file: nothing to load


def test_the_memory_check_refuses_a_model_larger_than_what_is_free(qtbot, model_path, monkeypatch):
    bar = ModelBar()
    qtbot.addWidget(bar)
    path = model_path("smollm2")
    with GGUFFile(path) as f:
        doc = Document(Path(path), 0.0, gguf=f)
        lo = ModelLoader(None, FakeHost(state="empty"), bar, lambda: doc)  # type: ignore[arg-type]
        plan = lo.plan()
        assert plan is not None and plan.total_bytes > 0
        monkeypatch.setattr(chat_loading, "available_memory", lambda: plan.total_bytes)
        assert lo.too_large() is None
        monkeypatch.setattr(chat_loading, "available_memory", lambda: plan.total_bytes - 1)
        message, detail = lo.too_large() or ("", "")
        assert message == "The model is too large for the memory available." and "is free" in detail


def _conversations(qtbot, ctl, errors):
    owner = QWidget()
    qtbot.addWidget(owner)
    panel = ConversationPanel(owner)
    said: list[str] = []
    c = Conversations(panel, ctl, owner, lambda m, d: errors.append((m, d)),
                      lambda: {"system_prompt": "be brief", "mode": "chat", "params": {}}, lambda: False, said.append)
    return c, panel, said


def test_conversations_save_list_rename_export_and_delete(qtbot, tmp_path):
    ctl, errors = ChatController(), []
    c, panel, _said = _conversations(qtbot, ctl, errors)
    c.use(ChatStore(tmp_path / "chats.sqlite3"))
    c.save()  # nothing to save yet
    assert panel.list.count() == 0 and ctl.conv_id is None
    ctl.set_model(identity_of(tmp_path / "m.gguf", "Q4_0"))
    ctl.add_user("What is a GGUF file?")
    c.save()
    assert panel.list.count() == 1 and ctl.conv_id is not None
    assert panel.store_label.text() == f"Saved in {tmp_path / 'chats.sqlite3'}"
    c.rename(ctl.conv_id, "About GGUF")
    assert panel.list.item(0).text() == "About GGUF"
    out = c.export(tmp_path / "conv.md")
    assert out is not None and "What is a GGUF file?" in out.read_text(encoding="utf-8")
    conv_id = ctl.conv_id
    ctl.new()
    conv = c.open(conv_id)
    assert conv is not None and conv.system_prompt == "be brief" and [m.content for m in ctl.messages] == [
        "What is a GGUF file?"]
    c.delete(conv_id)
    assert panel.list.count() == 0 and c.open(conv_id) is None
    assert errors == []
    c.close()


def test_a_store_that_cannot_open_is_said_once(qtbot, monkeypatch):
    def refuse(*_a: object) -> ChatStore:
        raise StoreError("read-only file system")

    monkeypatch.setattr(chat_persist, "ChatStore", refuse)
    ctl, errors = ChatController(), []
    c, panel, _said = _conversations(qtbot, ctl, errors)
    ctl.messages = [StoredMessage("user", "hi")]
    assert c.store() is None and c.store() is None
    c.save()
    assert errors == [("Conversations cannot be saved.", "read-only file system")]
    c.refresh()
    assert panel.store_label.text() == "read-only file system" and c.export("x.md") is None
