"""The chat pane's conversation actions (send, regenerate, edit and resend, stop) and the life of a reply: the
prompt goes to the model thread, token deltas are batched by a timer into the streaming message, and the finished
reply is rendered, measured and saved. A mixin of :class:`~quantscope.gui.views.chat.ChatView`."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from PySide6.QtCore import QPoint

from quantscope.core.chat.controller import stats_text
from quantscope.core.chat.conversation import reply_reserve
from quantscope.core.chat.store import StoredMessage
from quantscope.core.chat.tokens import TokenRecord

from ..chat_engine import GenStats
from .chat_tokens import alternatives_menu
from .chat_widgets import MessageView

if TYPE_CHECKING:
    from .chat import ChatView


class ReplyMixin:
    """Conversation actions and the reply lifecycle of the chat view."""

    # ================================================================== the conversation
    def prompt_for(self: ChatView, messages: list[StoredMessage]) -> list[dict[str, str]] | str:
        """What the engine gets: the messages (with the system prompt) in chat mode, the text in completion mode."""
        return self.ctl.prompt(messages, self.mode, self.system_edit.toPlainText().strip())

    def send(self: ChatView, text: str | None = None) -> bool:
        """Send ``text`` (default: the composer's) and start the reply; False when nothing can be sent now."""
        if text is None:
            text = self.composer.toPlainText()
        if not text.strip() or self.host.state != "ready" or self.ctl.foreign:
            return False
        self.edit_bar.hide()
        self.ctl.add_user(text)
        self.composer.clear()
        self._rebuild_views()
        self._start_reply()
        return True

    def regenerate(self: ChatView) -> bool:
        """Drop the last reply and generate it again (the prompt's KV cache is reused)."""
        if self.host.state != "ready" or not self.messages or self.ctl.foreign:
            return False
        if not self.ctl.drop_replies():
            return False
        self._rebuild_views()
        self._start_reply()
        return True

    def edit_message(self: ChatView, index: int) -> None:
        """Put message ``index`` into the composer; sending replaces it and drops what followed."""
        if not 0 <= index < len(self.messages) or self.messages[index].role != "user" or self.ctl.foreign:
            return
        self.ctl.editing = index
        self.composer.setPlainText(self.messages[index].content)
        self.composer.setFocus()
        after = len(self.messages) - index - 1
        self.composer_box.show_editing(index, after)

    def cancel_edit(self: ChatView) -> None:
        self.ctl.editing = None
        self.edit_bar.hide()
        self.composer.clear()

    def branch(self: ChatView, index: int, token_index: int, token: int) -> bool:
        """Continue reply ``index`` from its token ``token_index`` with ``token`` instead: a new version of the
        reply (the old one stays, with what followed it); False when it cannot start now."""
        if self.host.state != "ready" or self.ctl.foreign:
            return False
        try:
            forced, seed = self.ctl.begin_branch(index, token_index, token)
        except ValueError:
            return False
        self._rebuild_views()
        self._start_reply(forced, seed)
        return True

    def switch_variant(self: ChatView, index: int, which: int) -> bool:
        """Show version ``which`` (0-based) of message ``index``; the conversation continues from it."""
        if self.host.state == "generating" or self._reply_view is not None:
            return False
        if not 0 <= index < len(self.messages) or not 0 <= which < self.messages[index].n_variants:
            return False
        self.ctl.switch_variant(index, which)
        self._rebuild_views()
        self._save()
        self._update_controls()
        return True

    def _token_clicked(self: ChatView, index: int, token_index: int, where: QPoint) -> None:
        """A click on a reply's token: the menu of its alternatives; picking one branches the reply there."""
        if not 0 <= index < len(self.messages) or not 0 <= token_index < len(self.messages[index].tokens):
            return
        if self.alt_menu is not None:
            self.alt_menu.close()
            self.alt_menu.deleteLater()
        menu = alternatives_menu(self.messages[index].tokens[token_index], self)
        enabled = self.host.state == "ready" and not self.ctl.foreign
        for act in menu.actions():
            if act.data() is not None:
                act.setEnabled(enabled and act.isEnabled())
        menu.triggered.connect(lambda act: self.branch(index, token_index, int(act.data()))
                               if act.data() is not None else None)
        self.alt_menu = menu
        menu.popup(where)

    def _color_mode_changed(self: ChatView, mode: str) -> None:
        self.color_legend.set_mode(mode)
        for v in self.views:
            v.set_color_mode(mode)

    def stop(self: ChatView) -> None:
        """Stop the reply (the engine checks before each token) or cancel loading."""
        if self.host.state == "generating":
            self.host.stop()
            self.activity.setText("stopping…")
        elif self.host.state == "loading":
            self.host.cancel_load()

    def _start_reply(self: ChatView, forced: list[int] | None = None, seed: list[TokenRecord] | None = None) -> None:
        self.clear_error()
        self.notice.hide()
        for v in self.views:
            v.set_dropped(False)
        prompt = self.prompt_for(self.messages)
        params = self.sampler_params()
        n_ctx = self.host.info.n_ctx if self.host.info else self.ctx_spin.value()
        self._save()
        view = self._add_view(len(self.messages), "assistant", "")
        view.start_streaming()
        self._reply_view = view
        self._reply_text = []
        self._pending = []
        self._reply_thinking = []
        self._pending_thinking = []
        self._pending_stats = None
        self._reply_stats = None
        self._reply_records = []
        self._reply_temperature = params.temperature
        view.set_records(self._reply_records)
        self.activity.setText("reading the prompt…")
        self._reply_req = self.host.generate(prompt, params, self.threads_spin.value(),
                                             reply_reserve(params.max_tokens, n_ctx), forced, seed)
        self._flush_timer.start()
        self._update_controls()
        self._update_empty()

    def _on_trimmed(self: ChatView, req: int, dropped: int, n_tokens: int) -> None:
        if req != self._reply_req:
            return
        self.dropped = dropped
        if n_tokens >= 0:
            self.activity.setText(f"reading {n_tokens:,} prompt tokens…")
        if dropped:
            non_system = [v for v in self.views if v.role != "system" and v is not self._reply_view]
            for v in non_system[:dropped]:
                v.set_dropped(True)
            n_ctx = self.host.info.n_ctx if self.host.info else 0
            self.notice.setText(
                f"The conversation no longer fits in the {n_ctx:,}-token context: the {dropped} oldest "
                f"message{'s are' if dropped != 1 else ' is'} left out of the prompt (marked “not in context”). "
                "Load the model with a larger context to keep them.")
            self.notice.show()

    def _on_prompt_progress(self: ChatView, req: int, done: int, total: int) -> None:
        if req == self._reply_req and done < total:  # the last chunk is followed by the first token
            self.activity.setText(f"reading the prompt: {done:,} of {total:,} tokens…")

    def _on_thinking(self: ChatView, req: int, text: str) -> None:
        if req == self._reply_req:
            self._pending_thinking.append(text)  # batched by the timer, as the answer's text

    def _on_token(self: ChatView, req: int, record: TokenRecord) -> None:
        if req == self._reply_req:
            self._reply_records.append(record)  # the view holds this list: hover works while it streams

    def _on_trace(self: ChatView, req: int, records: list[TokenRecord]) -> None:
        if req == self._reply_req:
            self._reply_records = list(records)

    def _on_delta(self: ChatView, req: int, text: str, stats: GenStats) -> None:
        if req != self._reply_req:
            return
        self._pending.append(text)  # no widget work per token: the timer appends the batch
        self._pending_stats = stats
        self._reply_stats = stats

    def _flush(self: ChatView) -> None:
        if self._reply_view is None:
            return
        if self._pending_thinking:
            chunk = "".join(self._pending_thinking)
            self._pending_thinking = []
            self._reply_thinking.append(chunk)
            self._reply_view.append_thinking(chunk)
        if self._pending:
            chunk = "".join(self._pending)
            self._pending = []
            self._reply_text.append(chunk)
            self._reply_view.append(chunk)
            self.flushes += 1
        if self._pending_stats is not None:
            self._show_stats(self._pending_stats, live=True)
            self._pending_stats = None

    def _show_stats(self: ChatView, s: GenStats, live: bool = False) -> None:
        self.last_stats = s
        self.stats_bar.show_stats(s.as_dict())
        if live and self._reply_view is not None:
            self._reply_view.set_stats(f"{s.n_generated} tokens · {s.gen_tps:.1f} t/s")
            self.activity.setText("generating…")

    def _on_finished(self: ChatView, req: int, stats: GenStats) -> None:
        if req != self._reply_req:
            return
        self._flush()
        self._finish_reply(stats)
        self.replyFinished.emit(stats)
        if self.script_active:
            self._script_next()

    def _on_failed(self: ChatView, req: int, message: str, detail: str) -> None:
        if req != self._reply_req:
            return
        self._flush()
        self._finish_reply(None)
        self.show_error(message, detail)
        self.replyFailed.emit(message)
        if self.script_active:
            self._script = []
            self.script_active = False
            self.scriptFinished.emit()

    def _finish_reply(self: ChatView, stats: GenStats | None, note: str = "") -> None:
        """Turn the streaming view into a message (Markdown rendered once, now), save, reset the live state."""
        self._flush_timer.stop()
        view, text, thinking = self._reply_view, "".join(self._reply_text), "".join(self._reply_thinking)
        records, self._reply_records = self._reply_records, []
        self._reply_view = None
        self._reply_req = 0
        self._reply_text = []
        self._pending = []
        self._reply_thinking = []
        self._pending_thinking = []
        if view is None:
            return
        if stats is None and not text and not thinking:  # failed before any token: no empty reply is kept
            self.stream.remove(view)
            if self.ctl.pending_variant is not None:  # a regenerate or branch made nothing: the reply as it was
                self.ctl.abandon_variant()
                self._rebuild_views()
        else:
            d = stats.as_dict() if stats is not None else {}
            if note:
                d["stop_reason"] = f"cancelled ({note})"
            if self._reply_temperature is not None:
                d["temperature"] = self._reply_temperature
            self.ctl.add_reply(text, d, thinking, records)
            label = stats_text(stats.as_dict()) if stats is not None else "failed"
            if note:
                label += f" ({note})"
            view.temperature = self._reply_temperature
            self.stream.finish(view, text, label)
            view.set_records(records)
            last = self.messages[-1]
            view.set_variants(last.variant, last.n_variants)
            if stats is not None:
                self._show_stats(stats)
        self.activity.setText("")
        self._save()
        self._update_controls()
        self._update_regen_buttons()
        self._schedule_preview()

    def reset_stats(self: ChatView) -> None:
        """No numbers and an empty context bar (a new or another conversation: nothing of it is measured yet)."""
        self.last_stats = None
        self.dropped = 0
        self.stats_bar.reset()

    def _abort_reply(self: ChatView, note: str) -> None:
        """End the reply now (switching files, conversations, closing): keep what arrived, stop the engine."""
        if self._reply_view is None:
            return
        self.host.stop()
        self._flush()
        stats = self._reply_stats or GenStats()
        self._finish_reply(replace(stats, stop_reason="cancelled"), note)

    # ------------------------------------------------------------------ message views
    def _connect_view(self: ChatView, v: MessageView) -> None:
        v.editRequested.connect(self.edit_message)
        v.regenerateRequested.connect(self.regenerate)
        v.tokenClicked.connect(self._token_clicked)
        v.variantRequested.connect(self.switch_variant)
        v.color_mode = self.settings.color_mode

    def _add_view(self: ChatView, index: int, role: str, content: str) -> MessageView:
        v = self.stream.add(index, role, content, self.mode)
        self._connect_view(v)
        return v

    def _rebuild_views(self: ChatView) -> None:
        self.stream.rebuild(self.messages, self.mode, stats_text, self._connect_view)
        self._update_regen_buttons()
        self._update_empty()
        self._schedule_preview()

    def _update_regen_buttons(self: ChatView) -> None:
        last = len(self.messages) - 1
        for v in self.views:
            v.regen_btn.setVisible(v.role == "assistant" and v.index == last and v is not self._reply_view)
            v.edit_btn.setEnabled(self.host.state != "generating" and not self.ctl.foreign)
            idle = self.host.state != "generating" and v is not self._reply_view
            v.branchable = idle and v.role == "assistant" and self.host.state == "ready" and not self.ctl.foreign
            v.prev_btn.setEnabled(idle and v.variant > 0)
            v.next_btn.setEnabled(idle and v.variant < v.n_variants - 1)

    def _update_empty(self: ChatView) -> None:
        if self.views:
            self.stream.set_empty("")
            return
        if self.doc is None:
            text = "Open a GGUF file, then load it here to chat with it on Quantscope's own kernels."
        elif self.host.state in ("ready", "generating"):
            text = ("Type a prompt below: the model continues the text." if self.mode == "completion"
                    else "Type a message below (Ctrl+Enter sends).")
        else:
            text = "Load the model (above) to start; the memory it needs is shown before it loads."
        self.stream.set_empty(text)

    def _update_controls(self: ChatView) -> None:
        st = self.host.state
        has_doc = self.doc is not None
        self.load_btn.setEnabled(has_doc and st in ("empty", "ready"))
        self.load_btn.setText("Reload" if st in ("ready", "generating") else "Load model")
        self.load_btn.setToolTip("Load again with the backend and context chosen here" if st == "ready" else "")
        self.unload_btn.setEnabled(st in ("ready", "generating", "loading"))
        self.load_cancel.setVisible(st == "loading")
        self.load_progress.setVisible(st == "loading")
        for w in (self.backend_combo, self.ctx_spin):
            w.setEnabled(has_doc and st in ("empty", "ready"))
        foreign = self.ctl.foreign
        self.send_btn.setEnabled(st == "ready" and not foreign)
        self.composer.setReadOnly(foreign)
        self.stop_btn.setEnabled(st == "generating")
        self.regen_btn.setEnabled(st == "ready" and bool(self.messages) and not foreign)
        self._update_buttons_for_list()
        if st == "empty" and not self.model_state.full_text().startswith(("loading cancelled", "not loaded")):
            self.model_state.setText("not loaded")
        self.engine_label.setVisible(st in ("ready", "generating"))
        if st == "generating":
            self.model_state.setText("generating…")
        elif st == "ready":
            self.model_state.setText(f"ready{self._loaded_note}")
        self._update_regen_buttons()
        self._update_empty()

