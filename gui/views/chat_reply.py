"""The chat pane's conversation actions (send, regenerate, edit and resend, branch, stop) and the life of a reply:
the prompt goes to the model thread, token deltas are batched by a timer into the streaming message, and the
finished reply is rendered, measured and saved. :class:`ReplyController` owns that state and the message views;
the view composes it and hands it the widgets and the few callbacks it needs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from PySide6.QtCore import QPoint, Qt, QTimer
from PySide6.QtWidgets import QApplication, QMenu, QWidget

from quantscope.core.chat.controller import ChatController, acceptance_text, stats_text
from quantscope.core.chat.conversation import reply_reserve
from quantscope.core.chat.store import StoredMessage
from quantscope.core.chat.tokens import TokenRecord

from ..chat_engine import EngineHost, GenStats
from .chat_modelbar import ModelBar
from .chat_notices import Notices
from .chat_settings import SamplingPanel
from .chat_thread import Composer, ReplyStream, StatsBar
from .chat_tokens import alternatives_menu
from .chat_widgets import MessageView

FLUSH_MS = 50


@dataclass(frozen=True)
class ReplyHooks:
    """What a reply changes around it, as the view does it: errors, saving, the pane's buttons, the template
    preview, and a reply's end (``finished`` with its numbers, ``failed`` with message and detail)."""

    show_error: Callable[[str, str], None]
    clear_error: Callable[[], None]
    save: Callable[[], None]
    controls_changed: Callable[[], None]
    preview_changed: Callable[[], None]
    finished: Callable[[GenStats], None]
    failed: Callable[[str, str], None]


class ReplyController:
    """The conversation's actions and the reply that streams: the request it answers (``req``), its message view
    (``view``), the text, thinking, numbers and token records received, the batching timer (``flushes`` counts the
    batches appended) and the numbers last shown (``last_stats``). ``has_doc`` says whether a file is open."""

    def __init__(self, host: EngineHost, ctl: ChatController, stream: ReplyStream, composer: Composer,
                 stats_bar: StatsBar, notices: Notices, settings: SamplingPanel, bar: ModelBar, owner: QWidget,
                 has_doc: Callable[[], bool], hooks: ReplyHooks) -> None:
        self.host, self.ctl, self.stream, self.composer = host, ctl, stream, composer
        self.stats_bar, self.notice, self.settings, self.bar = stats_bar, notices.notice, settings, bar
        self.owner = owner
        self._has_doc = has_doc
        self.hooks = hooks
        self.req = 0
        self.view: MessageView | None = None
        self.text: list[str] = []
        self.pending: list[str] = []
        self.thinking: list[str] = []
        self.pending_thinking: list[str] = []
        self.pending_stats: GenStats | None = None
        self.stats: GenStats | None = None  # the reply's numbers so far
        self.records: list[TokenRecord] = []
        self.temperature: float | None = None
        self.last_stats: GenStats | None = None
        self.dropped = 0
        self.alt_menu: QMenu | None = None  # the alternatives of a clicked token (tests pick from it)
        self.flushes = 0  # batches appended to the reply (tests check that tokens are batched)
        self.flush_timer = QTimer(owner)
        self.flush_timer.setInterval(FLUSH_MS)
        self.flush_timer.timeout.connect(self.flush)

    @property
    def messages(self) -> list[StoredMessage]:
        return self.ctl.messages

    @property
    def views(self) -> list[MessageView]:
        return self.stream.views

    # ================================================================== the conversation
    def prompt_for(self, messages: list[StoredMessage]) -> list[dict[str, str]] | str:
        """What the engine gets: the messages (with the system prompt) in chat mode, the text in completion mode."""
        return self.ctl.prompt(messages, self.settings.mode, self.settings.system_edit.toPlainText().strip())

    def send(self, text: str | None = None) -> bool:
        """Send ``text`` (default: the composer's) and start the reply; False when nothing can be sent now."""
        if text is None:
            text = self.composer.text.toPlainText()
        if not text.strip() or self.host.state != "ready" or self.ctl.foreign:
            return False
        self.composer.edit_bar.hide()
        self.ctl.add_user(text)
        self.composer.text.clear()
        self.rebuild_views()
        self._start()
        return True

    def regenerate(self) -> bool:
        """Drop the last reply and generate it again (the prompt's KV cache is reused)."""
        if self.host.state != "ready" or not self.messages or self.ctl.foreign:
            return False
        if not self.ctl.drop_replies():
            return False
        self.rebuild_views()
        self._start()
        return True

    def edit_message(self, index: int) -> None:
        """Put message ``index`` into the composer; sending replaces it and drops what followed."""
        if not 0 <= index < len(self.messages) or self.messages[index].role != "user" or self.ctl.foreign:
            return
        self.ctl.editing = index
        self.composer.text.setPlainText(self.messages[index].content)
        self.composer.text.setFocus()
        self.composer.show_editing(index, len(self.messages) - index - 1)

    def cancel_edit(self) -> None:
        self.ctl.editing = None
        self.composer.edit_bar.hide()
        self.composer.text.clear()

    def branch(self, index: int, token_index: int, token: int) -> bool:
        """Continue reply ``index`` from its token ``token_index`` with ``token`` instead: a new version of the
        reply (the old one stays, with what followed it); False when it cannot start now."""
        if self.host.state != "ready" or self.ctl.foreign:
            return False
        try:
            forced, seed = self.ctl.begin_branch(index, token_index, token)
        except ValueError:
            return False
        self.rebuild_views()
        self._start(forced, seed)
        return True

    def switch_variant(self, index: int, which: int) -> bool:
        """Show version ``which`` (0-based) of message ``index``; the conversation continues from it."""
        if self.host.state == "generating" or self.view is not None:
            return False
        if not 0 <= index < len(self.messages) or not 0 <= which < self.messages[index].n_variants:
            return False
        self.ctl.switch_variant(index, which)
        self.rebuild_views()
        self.hooks.save()
        self.hooks.controls_changed()
        return True

    def token_clicked(self, index: int, token_index: int, where: QPoint) -> None:
        """A click on a reply's token: the menu of its alternatives; picking one branches the reply there."""
        if not 0 <= index < len(self.messages) or not 0 <= token_index < len(self.messages[index].tokens):
            return
        if self.alt_menu is not None:
            self.alt_menu.close()
            self.alt_menu.deleteLater()
        menu = alternatives_menu(self.messages[index].tokens[token_index], self.owner)
        enabled = self.host.state == "ready" and not self.ctl.foreign
        for act in menu.actions():
            if act.data() is not None:
                act.setEnabled(enabled and act.isEnabled())
        menu.triggered.connect(lambda act: self.branch(index, token_index, int(act.data()))
                               if act.data() is not None else None)
        self.alt_menu = menu
        menu.popup(where)

    def mode_changed(self, _mode: str = "") -> None:
        """Chat or completion: every message shown the new way (the streaming one keeps streaming)."""
        for v in self.views:
            v.set_mode(self.settings.mode)
            if v is not self.view:
                v.set_content(v.content)
        self.update_empty()
        self.hooks.preview_changed()

    def stop(self) -> None:
        """Stop the reply (the engine checks before each token) or cancel loading."""
        if self.host.state == "generating":
            self.host.stop()
            self.stats_bar.activity.setText("stopping…")
        elif self.host.state == "loading":
            self.host.cancel_load()

    # ================================================================== the reply
    def _start(self, forced: list[int] | None = None, seed: list[TokenRecord] | None = None) -> None:
        self.hooks.clear_error()
        self.notice.hide()
        for v in self.views:
            v.set_dropped(False)
        prompt = self.prompt_for(self.messages)
        params = self.settings.sampler_params()
        n_ctx = self.host.info.n_ctx if self.host.info else self.bar.ctx_spin.value()
        self.hooks.save()
        view = self.add_view(len(self.messages), "assistant", "")
        view.start_streaming()
        self.view = view
        self.text, self.pending, self.thinking, self.pending_thinking = [], [], [], []
        self.pending_stats = None
        self.stats = None
        self.records = []
        self.temperature = params.temperature
        view.set_records(self.records)
        self.stats_bar.activity.setText("reading the prompt…")
        self.req = self.host.generate(prompt, params, self.bar.threads_spin.value(),
                                      reply_reserve(params.max_tokens, n_ctx), forced, seed,
                                      lookup=self.settings.params_dict().get("lookup", 0))
        self.flush_timer.start()
        self.hooks.controls_changed()
        self.update_empty()

    def on_trimmed(self, req: int, dropped: int, n_tokens: int) -> None:
        if req != self.req:
            return
        self.dropped = dropped
        if n_tokens >= 0:
            self.stats_bar.activity.setText(f"reading {n_tokens:,} prompt tokens…")
        if dropped:
            non_system = [v for v in self.views if v.role != "system" and v is not self.view]
            for v in non_system[:dropped]:
                v.set_dropped(True)
            n_ctx = self.host.info.n_ctx if self.host.info else 0
            self.notice.setText(
                f"The conversation no longer fits in the {n_ctx:,}-token context: the {dropped} oldest "
                f"message{'s are' if dropped != 1 else ' is'} left out of the prompt (marked “not in context”). "
                "Load the model with a larger context to keep them.")
            self.notice.show()

    def on_prompt_progress(self, req: int, done: int, total: int) -> None:
        if req == self.req and done < total:  # the last chunk is followed by the first token
            self.stats_bar.activity.setText(f"reading the prompt: {done:,} of {total:,} tokens…")

    def on_thinking(self, req: int, text: str) -> None:
        if req == self.req:
            self.pending_thinking.append(text)  # batched by the timer, as the answer's text

    def on_token(self, req: int, record: TokenRecord) -> None:
        if req == self.req:
            self.records.append(record)  # the view holds this list: hover works while it streams

    def on_trace(self, req: int, records: list[TokenRecord]) -> None:
        if req == self.req:
            self.records = list(records)

    def on_delta(self, req: int, text: str, stats: GenStats) -> None:
        if req != self.req:
            return
        self.pending.append(text)  # no widget work per token: the timer appends the batch
        self.pending_stats = stats
        self.stats = stats

    def flush(self) -> None:
        """Append what arrived since the last tick to the streaming message (one append per batch)."""
        if self.view is None:
            return
        if self.pending_thinking:
            chunk = "".join(self.pending_thinking)
            self.pending_thinking = []
            self.thinking.append(chunk)
            self.view.append_thinking(chunk)
        if self.pending:
            chunk = "".join(self.pending)
            self.pending = []
            self.text.append(chunk)
            self.view.append(chunk)
            self.flushes += 1
        if self.pending_stats is not None:
            self.show_stats(self.pending_stats, live=True)
            self.pending_stats = None

    def show_stats(self, s: GenStats, live: bool = False) -> None:
        self.last_stats = s
        self.stats_bar.show_stats(s.as_dict())
        if live and self.view is not None:
            spec = f" · {acceptance_text(s.as_dict())}" if s.drafted else ""
            self.view.set_stats(f"{s.n_generated} tokens · {s.gen_tps:.1f} t/s{spec}")
            self.stats_bar.activity.setText("generating…")

    def on_finished(self, req: int, stats: GenStats) -> None:
        if req != self.req:
            return
        self.flush()
        self._finish(stats)
        self.hooks.finished(stats)

    def on_failed(self, req: int, message: str, detail: str) -> None:
        if req != self.req:
            return
        self.flush()
        self._finish(None)
        self.hooks.failed(message, detail)

    def _finish(self, stats: GenStats | None, note: str = "") -> None:
        """Turn the streaming view into a message (Markdown rendered once, now), save, reset the live state."""
        self.flush_timer.stop()
        view, text, thinking = self.view, "".join(self.text), "".join(self.thinking)
        records, self.records = self.records, []
        self.view = None
        self.req = 0
        self.text, self.pending, self.thinking, self.pending_thinking = [], [], [], []
        if view is None:
            return
        if stats is None and not text and not thinking:  # failed before any token: no empty reply is kept
            self.stream.remove(view)
            if self.ctl.pending_variant is not None:  # a regenerate or branch made nothing: the reply as it was
                self.ctl.abandon_variant()
                self.rebuild_views()
        else:
            d = stats.as_dict() if stats is not None else {}
            if note:
                d["stop_reason"] = f"cancelled ({note})"
            if self.temperature is not None:
                d["temperature"] = self.temperature
            self.ctl.add_reply(text, d, thinking, records)
            label = stats_text(stats.as_dict()) if stats is not None else "failed"
            if note:
                label += f" ({note})"
            view.temperature = self.temperature
            self.stream.finish(view, text, label)
            view.set_records(records)
            last = self.messages[-1]
            view.set_variants(last.variant, last.n_variants)
            if stats is not None:
                self.show_stats(stats)
        self.stats_bar.activity.setText("")
        self.hooks.save()
        self.hooks.controls_changed()
        self.update_regen_buttons()
        self.hooks.preview_changed()

    def reset_stats(self) -> None:
        """No numbers and an empty context bar (a new or another conversation: nothing of it is measured yet)."""
        self.last_stats = None
        self.dropped = 0
        self.stats_bar.reset()

    def abort(self, note: str) -> None:
        """End the reply now (switching files, conversations, closing): keep what arrived, stop the engine."""
        if self.view is None:
            return
        self.host.stop()
        self.flush()
        stats = self.stats or GenStats()
        self._finish(replace(stats, stop_reason="cancelled"), note)

    # ------------------------------------------------------------------ message views
    def _connect_view(self, v: MessageView) -> None:
        v.editRequested.connect(self.edit_message)
        v.regenerateRequested.connect(self.regenerate)
        v.tokenClicked.connect(self.token_clicked)
        v.variantRequested.connect(self.switch_variant)
        v.color_mode = self.settings.color_mode

    def add_view(self, index: int, role: str, content: str) -> MessageView:
        v = self.stream.add(index, role, content, self.settings.mode)
        self._connect_view(v)
        return v

    def rebuild_views(self) -> None:
        """One message view per message of the open conversation. The focus, when it was in a view that goes (the
        reply whose token was clicked, its regenerate or version buttons) or nowhere, goes to the composer: typed
        keys land there and Esc (a shortcut of the chat pane) stops the reply that starts."""
        focus = QApplication.focusWidget()
        lost = focus is None or self.stream.isAncestorOf(focus)
        self.stream.rebuild(self.messages, self.settings.mode, stats_text, self._connect_view)
        if lost and self.owner.isVisible():
            self.composer.text.setFocus(Qt.FocusReason.OtherFocusReason)
        self.update_regen_buttons()
        self.update_empty()
        self.hooks.preview_changed()

    def update_regen_buttons(self) -> None:
        last = len(self.messages) - 1
        st, foreign = self.host.state, self.ctl.foreign
        for v in self.views:
            v.regen_btn.setVisible(v.role == "assistant" and v.index == last and v is not self.view)
            v.edit_btn.setEnabled(st != "generating" and not foreign)
            idle = st != "generating" and v is not self.view
            v.branchable = idle and v.role == "assistant" and st == "ready" and not foreign
            v.prev_btn.setEnabled(idle and v.variant > 0)
            v.next_btn.setEnabled(idle and v.variant < v.n_variants - 1)

    def update_empty(self) -> None:
        if self.views:
            self.stream.set_empty("")
            return
        if not self._has_doc():
            text = "Open a GGUF file, then load it here to chat with it on Quantscope's own kernels."
        elif self.host.state in ("ready", "generating"):
            text = ("Type a prompt below: the model continues the text." if self.settings.mode == "completion"
                    else "Type a message below (Ctrl+Enter sends).")
        elif getattr(self.owner, "is_embedding", False):
            text = ""  # the banner above says it does not chat
        else:
            text = "Load the model (above) to start; the memory it needs is shown before it loads."
        self.stream.set_empty(text)

    def update_controls(self) -> None:
        """The composer's buttons and the message views' for the model thread's state."""
        st, foreign = self.host.state, self.ctl.foreign
        self.composer.send_btn.setEnabled(st == "ready" and not foreign)
        self.composer.text.setReadOnly(foreign)
        self.composer.stop_btn.setEnabled(st == "generating")
        self.composer.regen_btn.setEnabled(st == "ready" and bool(self.messages) and not foreign)
        self.update_regen_buttons()
        self.update_empty()
