"""The Chat tab: talk with the opened model on Quantscope's own kernels without ever blocking the window.

Left, the saved conversations (SQLite, see :mod:`quantscope.core.chat.store`); in the middle the model bar (memory
before loading, backend, threads, context, load progress with cancel), the conversation and the composer with the
live numbers (time to first token, prompt and generation tokens/s, context fill); right, the sampling settings,
the exact prompt the chat template produces (with its token ids) and a tokenizer lab.

The model runs in its own thread (:mod:`quantscope.gui.chat_engine`); token deltas arrive as queued signals, are
collected in a list and appended to the reply by a 50 ms timer, so a fast model never repaints per token.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from quantscope.core.analysis import INT32_MAX, memory_plan, metadata_int
from quantscope.core.chat.controller import ChatController, identity_of, stats_text
from quantscope.core.chat.conversation import reply_reserve
from quantscope.core.chat.store import (
    ChatStore,
    StoredMessage,
    StoreError,
    default_path,
    export,
)
from quantscope.core.summary import human_bytes

from ..chat_engine import EngineHost, EngineInfo, GenStats, cuda_availability
from ..document import Document
from ..theme import is_dark
from ..workers import TaskRunner
from .chat_conversations import ConversationPanel
from .chat_modelbar import DEFAULT_CTX, ModelBar
from .chat_notices import Notices, stylesheet
from .chat_settings import SamplingPanel
from .chat_thread import Composer, ReplyStream, StatsBar
from .chat_tools import TemplatePreview, TokBundle, TokenizerLab, read_bundle
from .chat_widgets import (
    MessageView,
)

FLUSH_MS = 50


def available_memory() -> int | None:
    """Bytes the system can still give (``MemAvailable``), or None where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


class ChatView(QWidget):
    """The Chat tab. ``runner`` runs the tokenizer lab and template preview; the model has its own thread."""

    replyFinished = Signal(object)  # GenStats of a reply that ended (finished or stopped)
    replyFailed = Signal(str)
    engineLoaded = Signal(object)  # EngineInfo
    scriptFinished = Signal()

    def __init__(self, runner: TaskRunner, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.runner = runner
        self.host = EngineHost(self)
        self.doc: Document | None = None
        self._store: ChatStore | None = None
        self.store_error = ""
        self.ctl = ChatController()  # messages, conversation id, the model it belongs to
        self.error = ""
        self.last_stats: GenStats | None = None
        self.dropped = 0
        self.bundle: TokBundle | None = None
        self._bundle_error = ""
        self._bundle_pending = False
        self.cuda: tuple[bool | None, str] = (None, "not checked yet")
        self._reply_req = 0
        self._reply_view: MessageView | None = None
        self._reply_text: list[str] = []
        self._pending: list[str] = []
        self._pending_stats: GenStats | None = None
        self._reply_stats: GenStats | None = None
        self._script: list[str] = []
        self.script_active = False
        self._loaded_note = ""
        self.flushes = 0  # batches appended to the reply (tests check that tokens are batched)

        self._flush_timer = QTimer(self)
        self._flush_timer.setInterval(FLUSH_MS)
        self._flush_timer.timeout.connect(self._flush)
        self._preview_timer = QTimer(self)
        self._preview_timer.setSingleShot(True)
        self._preview_timer.setInterval(200)
        self._preview_timer.timeout.connect(self.update_preview)

        self._dark = is_dark()
        self.setStyleSheet(stylesheet(self._dark))
        self._build()
        self.host.stateChanged.connect(lambda _s: self._update_controls())
        self.host.loadProgress.connect(self._on_load_progress)
        self.host.loaded.connect(self._on_loaded)
        self.host.loadFailed.connect(self._on_load_failed)
        self.host.loadCancelled.connect(self._on_load_cancelled)
        self.host.trimmed.connect(self._on_trimmed)
        self.host.promptProgress.connect(self._on_prompt_progress)
        self.host.delta.connect(self._on_delta)
        self.host.finished.connect(self._on_finished)
        self.host.failed.connect(self._on_failed)
        self._update_controls()

    # the open conversation lives in the controller
    @property
    def messages(self) -> list[StoredMessage]:
        return self.ctl.messages

    @messages.setter
    def messages(self, value: list[StoredMessage]) -> None:
        self.ctl.messages = value

    @property
    def views(self) -> list[MessageView]:
        return self.stream.views

    @property
    def conv_id(self) -> int | None:
        return self.ctl.conv_id

    @property
    def editing(self) -> int | None:
        return self.ctl.editing

    # ================================================================== building
    def _build(self) -> None:
        split = QSplitter(Qt.Orientation.Horizontal)
        split.setChildrenCollapsible(False)
        self.side = ConversationPanel()
        sp = self.side  # its widgets, as the view's (tests use them by these names)
        self.new_btn, self.conv_list, self.rename_btn, self.delete_btn, self.export_btn, self.store_label = (
            sp.new_btn, sp.list, sp.rename_btn, sp.delete_btn, sp.export_btn, sp.store_label)
        sp.newRequested.connect(self.new_conversation)
        sp.openRequested.connect(self.open_conversation)
        sp.renameRequested.connect(self.rename_conversation)
        sp.deleteRequested.connect(self.delete_conversation)
        sp.exportRequested.connect(self.export_dialog)
        split.addWidget(sp)
        split.addWidget(self._build_center())
        split.addWidget(self._build_right())
        split.setStretchFactor(0, 0)
        split.setStretchFactor(1, 1)
        split.setStretchFactor(2, 0)
        split.setSizes([210, 820, 330])
        self.splitter = split
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 6, 6)
        lay.addWidget(split)

    # ------------------------------------------------------------------ conversations panel
    # ------------------------------------------------------------------ center: model bar, thread, composer
    def _build_center(self) -> QWidget:
        w = QWidget()
        lay = QVBoxLayout(w)
        lay.setContentsMargins(4, 0, 4, 0)
        lay.setSpacing(6)
        self.model_bar = ModelBar()
        mb = self.model_bar  # its widgets, as the view's (tests and scripts use them by these names)
        self.model_name, self.model_state, self.backend_combo, self.cuda_label = (
            mb.model_name, mb.model_state, mb.backend_combo, mb.cuda_label)
        self.threads_spin, self.ctx_spin, self.load_btn, self.unload_btn = (
            mb.threads_spin, mb.ctx_spin, mb.load_btn, mb.unload_btn)
        self.memory_label, self.load_progress, self.load_cancel, self.engine_label = (
            mb.memory_label, mb.load_progress, mb.load_cancel, mb.engine_label)
        self.threads_spin.valueChanged.connect(lambda _v: self._show_engine_info())
        self.ctx_spin.valueChanged.connect(lambda _v: self._update_memory())
        self.load_btn.clicked.connect(self.load_model)
        self.unload_btn.clicked.connect(self.unload_model)
        self.load_cancel.clicked.connect(self.host.cancel_load)
        lay.addWidget(self.model_bar)
        self.notices = Notices()
        nt = self.notices  # its widgets, as the view's (tests use them by these names)
        self.error_banner, self.notice, self.binding_bar, self.binding_label, self.binding_btn = (
            nt.error_banner, nt.notice, nt.binding_bar, nt.binding_label, nt.binding_btn)
        self.binding_btn.clicked.connect(self.continue_with_model)
        nt.binding_new.clicked.connect(self.new_conversation)
        lay.addWidget(nt)

        self.stream = ReplyStream()
        self.scroll = self.stream
        lay.addWidget(self.stream, 1)
        self.composer_box = Composer()
        cb = self.composer_box  # its widgets, as the view's (tests use them by these names)
        self.composer, self.send_btn, self.stop_btn, self.regen_btn, self.edit_bar, self.edit_label = (
            cb.text, cb.send_btn, cb.stop_btn, cb.regen_btn, cb.edit_bar, cb.edit_label)
        cb.sendRequested.connect(lambda: self.send())
        cb.stopRequested.connect(self.stop)
        cb.regenerateRequested.connect(self.regenerate)
        cb.cancelEditRequested.connect(self.cancel_edit)
        cb.textChanged.connect(self._schedule_preview)
        lay.addWidget(cb)
        self.stats_bar = StatsBar(DEFAULT_CTX)
        self.stat_labels, self.ctx_bar, self.activity = (
            self.stats_bar.labels, self.stats_bar.ctx_bar, self.stats_bar.activity)
        lay.addWidget(self.stats_bar)
        return w

    # ------------------------------------------------------------------ right: settings, template, tokenizer
    def _build_right(self) -> QWidget:
        tabs = QTabWidget()
        tabs.setAccessibleName("Chat tools")
        tabs.setMinimumWidth(260)
        self.settings = SamplingPanel()
        self.settings.modeChanged.connect(self._mode_changed)
        self.settings.systemChanged.connect(self._schedule_preview)
        s = self.settings  # the panel's widgets, as the view's (tests and scripts use them by these names)
        self.mode_combo, self.system_edit, self.preset_combo, self.special_check = (
            s.mode_combo, s.system_edit, s.preset_combo, s.special_check)
        self.temp_spin, self.topk_spin, self.topp_spin, self.minp_spin, self.repeat_spin = (
            s.temp_spin, s.topk_spin, s.topp_spin, s.minp_spin, s.repeat_spin)
        self.seed_spin, self.max_spin = s.seed_spin, s.max_spin
        self.apply_preset, self.params_dict, self.set_params = s.apply_preset, s.params_dict, s.set_params
        self.sampler_params, self.set_mode = s.sampler_params, s.set_mode
        tabs.addTab(self.settings, "Settings")
        self.preview = TemplatePreview(self.runner)
        self.preview_status, self.preview_text, self.preview_ids = (
            self.preview.status, self.preview.text, self.preview.ids)
        self.preview_hl = self.preview.highlighter
        self.lab = TokenizerLab(self.runner)
        self.lab.wanted.connect(self._ensure_bundle)
        self.lab_input, self.lab_special, self.lab_bos, self.lab_count = (
            self.lab.input, self.lab.special, self.lab.bos, self.lab.count)
        self.lab_chips, self.lab_legend, self.lab_model, self.lab_table, self.lab_ids = (
            self.lab.chips, self.lab.legend, self.lab.model, self.lab.table, self.lab.ids)
        tabs.addTab(self.preview, "Template")
        tabs.addTab(self.lab, "Tokenizer")
        tabs.currentChanged.connect(self._tool_tab_changed)
        self.tools = tabs
        return tabs

    # ================================================================== the document
    def set_document(self, doc: Document | None) -> None:
        """A new file (or none): stop any reply, unload the old model (without waiting), show the new one."""
        self._abort_reply("the file was switched")
        self._script = []
        self.script_active = False
        self.host.unload()
        self.doc = doc if doc is not None and doc.gguf is not None else None
        self.bundle = None
        self.lab.set_bundle(None)
        self._bundle_error = ""
        self._bundle_pending = False
        self.preview_hl.set_specials(())
        self.clear_error()
        self.load_progress.hide()
        self.cancel_edit()
        self.notice.hide()
        self.reset_stats()
        # a conversation belongs to a model: a new file starts a new chat
        self.ctl.set_model(identity_of(self.doc.path, self.doc.gguf.file_type_name)
                           if self.doc is not None and self.doc.gguf is not None else None)
        self._rebuild_views()
        self._show_binding()
        if self.doc is not None:
            f = self.doc.gguf
            assert f is not None
            self.model_name.setText(self.doc.path.name)
            ctx_train = metadata_int(f.arch_get("context_length") if f.architecture else None)
            hi = min(ctx_train, INT32_MAX) if ctx_train is not None and ctx_train > 0 else DEFAULT_CTX  # spin box
            self.ctx_spin.setMaximum(max(256, hi))
            self.ctx_spin.setValue(min(DEFAULT_CTX, hi))
            has_template = isinstance(f.get("tokenizer.chat_template"), str)
            self.settings.set_mode_available(has_template)
            self.set_mode("chat" if has_template else "completion")  # each file starts in its natural mode
        else:
            self.model_name.setText("No model")
        self._update_memory()
        self._probe_cuda()
        self._update_controls()
        self._refresh_list()
        if self.isVisible():
            self._ensure_bundle()

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange and is_dark() != self._dark:
            self._dark = is_dark()  # the system switched between light and dark: recolour the bubbles
            self.setStyleSheet(stylesheet(self._dark))

    def showEvent(self, event: Any) -> None:
        super().showEvent(event)
        self._refresh_list()
        self._ensure_bundle()

    def _probe_cuda(self) -> None:
        if self.cuda[0] is not None or self.cuda[1] != "not checked yet":
            self._show_cuda()
            return
        self.cuda = (None, "checking")
        self.runner.start("cuda-check", lambda _r, _t: cuda_availability(), on_done=self._cuda_checked,
                          on_failed=lambda m, _d: self._cuda_checked((False, m)),
                          on_cancelled=self._cuda_check_cancelled)

    def _cuda_check_cancelled(self) -> None:
        self.cuda = (None, "not checked yet")
        if not self.runner.closed:
            self._probe_cuda()  # cancelled by a file switch: ask again (the probe result is cached)

    def _cuda_checked(self, result: tuple[bool | None, str]) -> None:
        self.cuda = result
        self._show_cuda()

    def _show_cuda(self) -> None:
        self.model_bar.show_cuda(*self.cuda)

    def plan(self) -> Any:
        if self.doc is None or self.doc.gguf is None:
            return None
        try:
            return memory_plan(self.doc.gguf, self.ctx_spin.value(), "F16")
        except Exception:
            return None

    def _update_memory(self) -> None:
        self.model_bar.show_memory(self.plan(), available_memory())

    # ================================================================== loading
    def load_model(self) -> bool:
        """Load the open file in the model thread (memory is checked first; errors appear in the pane)."""
        if self.doc is None or self.host.state == "loading":
            return False
        self.clear_error()
        p = self.plan()
        avail = available_memory()
        if p is not None and avail is not None and p.total_bytes > avail:
            self.show_error("The model is too large for the memory available.",
                            f"It needs about {human_bytes(p.total_bytes)} (weights {human_bytes(p.weights_bytes)} "
                            f"+ KV cache {human_bytes(p.kv_bytes)}) and {human_bytes(avail)} is free; lower the "
                            "context size or close other programs.")
            self._script = []
            self.script_active = False
            return False
        self.load_progress.setValue(0)
        self.load_progress.show()
        self.model_state.setText("loading…")
        backend = str(self.backend_combo.currentData() or "cpu")
        self.host.load(self.doc.path, self.ctx_spin.value(), self.threads_spin.value(), backend)
        self._update_controls()
        return True

    def unload_model(self) -> None:
        self._abort_reply("the model was unloaded")
        self.host.unload()
        self.model_state.setText("not loaded")
        self._update_controls()

    def _on_load_progress(self, stage: str, fraction: float) -> None:
        self.model_bar.show_progress(stage, fraction)

    def _on_loaded(self, info: EngineInfo) -> None:
        self.load_progress.hide()
        self._loaded_note = f" · loaded in {info.load_s:.2f} s"
        self.model_state.setText(f"ready{self._loaded_note}")
        self._show_engine_info()
        if info.backend_note:
            self.show_error("Running on the CPU.", info.backend_note)
        self.reset_stats()
        self.ctx_bar.setRange(0, info.n_ctx)  # a new engine: nothing measured yet, its context size
        self.max_spin.setMaximum(info.n_ctx)
        if not info.has_template:
            self.set_mode("completion")
        self._update_controls()
        self._ensure_bundle()
        self.engineLoaded.emit(info)
        if self.script_active:
            self._script_next()

    def _show_engine_info(self) -> None:
        info = self.host.info
        if info is None:
            return
        self.model_bar.show_engine(info)

    def _on_load_failed(self, message: str, detail: str) -> None:
        self.load_progress.hide()
        self.model_state.setText("not loaded")
        self.show_error(message, detail)
        self._script = []
        self.script_active = False
        self._update_controls()
        self._ensure_bundle()

    def _on_load_cancelled(self) -> None:
        self.load_progress.hide()
        self.model_state.setText("loading cancelled")
        self._script = []
        self.script_active = False
        self._update_controls()
        self._ensure_bundle()

    # ================================================================== errors and notices
    def show_error(self, message: str, detail: str = "") -> None:
        self.error = message
        d = detail.strip().splitlines()
        short = d[-1] if d else ""
        self.notices.show_error(message, short, detail)

    def clear_error(self) -> None:
        self.error = ""
        self.error_banner.hide()

    # ================================================================== sampling settings
    @property
    def mode(self) -> str:
        return self.settings.mode

    def _mode_changed(self, _mode: str) -> None:
        for v in self.views:
            v.set_mode(self.mode)
            if v is not self._reply_view:
                v.set_content(v.content)
        self._update_empty()
        self._schedule_preview()

    # ================================================================== the conversation
    def prompt_for(self, messages: list[StoredMessage]) -> list[dict[str, str]] | str:
        """What the engine gets: the messages (with the system prompt) in chat mode, the text in completion mode."""
        return self.ctl.prompt(messages, self.mode, self.system_edit.toPlainText().strip())

    def send(self, text: str | None = None) -> bool:
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

    def regenerate(self) -> bool:
        """Drop the last reply and generate it again (the prompt's KV cache is reused)."""
        if self.host.state != "ready" or not self.messages or self.ctl.foreign:
            return False
        if not self.ctl.drop_replies():
            return False
        self._rebuild_views()
        self._start_reply()
        return True

    def edit_message(self, index: int) -> None:
        """Put message ``index`` into the composer; sending replaces it and drops what followed."""
        if not 0 <= index < len(self.messages) or self.messages[index].role != "user" or self.ctl.foreign:
            return
        self.ctl.editing = index
        self.composer.setPlainText(self.messages[index].content)
        self.composer.setFocus()
        after = len(self.messages) - index - 1
        self.composer_box.show_editing(index, after)

    def cancel_edit(self) -> None:
        self.ctl.editing = None
        self.edit_bar.hide()
        self.composer.clear()

    def stop(self) -> None:
        """Stop the reply (the engine checks before each token) or cancel loading."""
        if self.host.state == "generating":
            self.host.stop()
            self.activity.setText("stopping…")
        elif self.host.state == "loading":
            self.host.cancel_load()

    def _start_reply(self) -> None:
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
        self._pending_stats = None
        self._reply_stats = None
        self.activity.setText("reading the prompt…")
        self._reply_req = self.host.generate(prompt, params, self.threads_spin.value(),
                                             reply_reserve(params.max_tokens, n_ctx))
        self._flush_timer.start()
        self._update_controls()
        self._update_empty()

    def _on_trimmed(self, req: int, dropped: int, n_tokens: int) -> None:
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

    def _on_prompt_progress(self, req: int, done: int, total: int) -> None:
        if req == self._reply_req and done < total:  # the last chunk is followed by the first token
            self.activity.setText(f"reading the prompt: {done:,} of {total:,} tokens…")

    def _on_delta(self, req: int, text: str, stats: GenStats) -> None:
        if req != self._reply_req:
            return
        self._pending.append(text)  # no widget work per token: the timer appends the batch
        self._pending_stats = stats
        self._reply_stats = stats

    def _flush(self) -> None:
        if self._reply_view is None:
            return
        if self._pending:
            chunk = "".join(self._pending)
            self._pending = []
            self._reply_text.append(chunk)
            self._reply_view.append(chunk)
            self.flushes += 1
        if self._pending_stats is not None:
            self._show_stats(self._pending_stats, live=True)
            self._pending_stats = None

    def _show_stats(self, s: GenStats, live: bool = False) -> None:
        self.last_stats = s
        self.stats_bar.show_stats(s.as_dict())
        if live and self._reply_view is not None:
            self._reply_view.set_stats(f"{s.n_generated} tokens · {s.gen_tps:.1f} t/s")
            self.activity.setText("generating…")

    def _on_finished(self, req: int, stats: GenStats) -> None:
        if req != self._reply_req:
            return
        self._flush()
        self._finish_reply(stats)
        self.replyFinished.emit(stats)
        if self.script_active:
            self._script_next()

    def _on_failed(self, req: int, message: str, detail: str) -> None:
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

    def _finish_reply(self, stats: GenStats | None, note: str = "") -> None:
        """Turn the streaming view into a message (Markdown rendered once, now), save, reset the live state."""
        self._flush_timer.stop()
        view, text = self._reply_view, "".join(self._reply_text)
        self._reply_view = None
        self._reply_req = 0
        self._reply_text = []
        self._pending = []
        if view is None:
            return
        if stats is None and not text:  # failed before any token: no empty reply is kept
            self.stream.remove(view)
        else:
            d = stats.as_dict() if stats is not None else {}
            if note:
                d["stop_reason"] = f"cancelled ({note})"
            self.ctl.add_reply(text, d)
            label = stats_text(stats.as_dict()) if stats is not None else "failed"
            if note:
                label += f" ({note})"
            view.finish(text, label)
            if stats is not None:
                self._show_stats(stats)
        self.activity.setText("")
        self._save()
        self._update_controls()
        self._update_regen_buttons()
        self._schedule_preview()

    def reset_stats(self) -> None:
        """No numbers and an empty context bar (a new or another conversation: nothing of it is measured yet)."""
        self.last_stats = None
        self.dropped = 0
        self.stats_bar.reset()

    def _abort_reply(self, note: str) -> None:
        """End the reply now (switching files, conversations, closing): keep what arrived, stop the engine."""
        if self._reply_view is None:
            return
        self.host.stop()
        self._flush()
        stats = self._reply_stats or GenStats()
        self._finish_reply(replace(stats, stop_reason="cancelled"), note)

    # ------------------------------------------------------------------ message views
    def _connect_view(self, v: MessageView) -> None:
        v.editRequested.connect(self.edit_message)
        v.regenerateRequested.connect(self.regenerate)

    def _add_view(self, index: int, role: str, content: str) -> MessageView:
        v = self.stream.add(index, role, content, self.mode)
        self._connect_view(v)
        return v

    def _rebuild_views(self) -> None:
        self.stream.rebuild(self.messages, self.mode, stats_text, self._connect_view)
        self._update_regen_buttons()
        self._update_empty()
        self._schedule_preview()

    def _update_regen_buttons(self) -> None:
        last = len(self.messages) - 1
        for v in self.views:
            v.regen_btn.setVisible(v.role == "assistant" and v.index == last and v is not self._reply_view)
            v.edit_btn.setEnabled(self.host.state != "generating" and not self.ctl.foreign)

    def _update_empty(self) -> None:
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

    def _update_controls(self) -> None:
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
        if st == "empty" and not self.model_state.text().startswith(("loading cancelled", "not loaded")):
            self.model_state.setText("not loaded")
        self.engine_label.setVisible(st in ("ready", "generating"))
        if st == "generating":
            self.model_state.setText("generating…")
        elif st == "ready":
            self.model_state.setText(f"ready{self._loaded_note}")
        self._update_regen_buttons()
        self._update_empty()

    # ================================================================== persistence
    def use_store(self, store: ChatStore | None) -> None:
        """Use ``store`` (tests and the screenshot pass a temporary one); None reopens the default lazily."""
        if self._store is not None and self._store is not store:
            self._store.close()
        self._store = store
        self.store_error = ""
        self._refresh_list()

    def store(self) -> ChatStore | None:
        if self._store is None and not self.store_error:
            try:
                self._store = ChatStore()
            except StoreError as exc:
                self.store_error = str(exc)
                self.show_error("Conversations cannot be saved.", self.store_error)
        return self._store

    def _settings(self) -> dict[str, Any]:
        return {"system_prompt": self.system_edit.toPlainText(), "mode": self.mode, "params": self.params_dict()}

    def _save(self) -> None:
        store = self.store()
        if store is None or not self.messages:
            return
        try:
            self.ctl.save(store, self._settings())
        except (StoreError, KeyError) as exc:
            self.show_error("The conversation could not be saved.", str(exc))
            return
        self._refresh_list()

    def _refresh_list(self) -> None:
        store = self._store
        if store is None and self.isVisible() and default_path().exists():
            store = self.store()  # an existing database is opened to list it; a new one is made on first save
        if store is None:
            self.side.fill([], None)
            self.store_label.setText(self.store_error or f"Conversations will be saved in {default_path()}")
        else:
            self.side.fill(store.list_conversations(), self.conv_id)
            self.store_label.setText(f"Saved in {store.path}")
        self._update_buttons_for_list()

    def _update_buttons_for_list(self) -> None:
        self.side.update_buttons(self.host.state == "generating", self.conv_id is not None)

    def new_conversation(self) -> None:
        self._abort_reply("a new conversation was started")
        self.ctl.new()
        self.cancel_edit()
        self.notice.hide()
        self.reset_stats()
        self._show_binding()
        self._rebuild_views()
        self.side.clear_selection()
        self._update_controls()

    def open_conversation(self, conv_id: int) -> bool:
        """Show a saved conversation with its system prompt, mode and sampling settings."""
        store = self.store()
        if store is None or (conv_id == self.conv_id and self.views):
            return conv_id == self.conv_id
        if self.host.state == "generating":
            return False
        try:
            conv = self.ctl.open(store, conv_id)
        except KeyError:
            self._refresh_list()
            return False
        self.reset_stats()
        self._show_binding()
        self.system_edit.setPlainText(conv.system_prompt)
        self.set_mode(conv.mode if self.settings.chat_available else "completion")
        self.set_params(conv.params)
        self.cancel_edit()
        self.notice.hide()
        self.clear_error()
        self._rebuild_views()
        self._refresh_list()
        self._update_controls()
        return True

    def _show_binding(self) -> None:
        """Say which model the open conversation belongs to when it is not the opened file's, with the explicit
        choice to continue it with this one."""
        owner, model = self.ctl.owner, self.ctl.model
        self.notices.show_binding(owner if self.ctl.foreign else None, model)
        self.model_name.setToolTip(model.label if model is not None else "")

    def continue_with_model(self) -> None:
        """The explicit choice: continue the open conversation (a copy) with the opened file's model."""
        store = self.store()
        try:
            self.ctl.continue_with(store, self._settings())
        except (StoreError, KeyError) as exc:
            self.show_error("The conversation could not be copied.", str(exc))
        self._show_binding()
        self._refresh_list()
        self._update_controls()

    def rename_conversation(self, conv_id: int, title: str) -> None:
        store = self.store()
        if store is None:
            return
        try:
            store.rename(conv_id, title)
        except (ValueError, KeyError, StoreError) as exc:
            self.show_error("The conversation could not be renamed.", str(exc))
        self._refresh_list()

    def delete_conversation(self, conv_id: int) -> None:
        store = self.store()
        if store is None:
            return
        if conv_id == self.conv_id:
            self.new_conversation()
        try:
            store.delete(conv_id)
        except StoreError as exc:
            self.show_error("The conversation could not be deleted.", str(exc))
        self._refresh_list()

    def export_conversation(self, path: str | Path, fmt: str | None = None) -> Path | None:
        store = self.store()
        if store is None or self.conv_id is None:
            return None
        try:
            return export(store.get(self.conv_id), path, fmt)
        except (OSError, KeyError, ValueError) as exc:
            self.show_error("The conversation could not be exported.", str(exc))
            return None

    def export_dialog(self, fmt: str) -> None:
        if self.conv_id is None or (store := self.store()) is None:
            return
        title = store.get(self.conv_id).title
        safe = "".join(c if c.isalnum() or c in "-_ " else "_" for c in title).strip() or "conversation"
        suffix = ".json" if fmt == "json" else ".md"
        path, _ = QFileDialog.getSaveFileName(self, "Export the conversation", str(Path.home() / (safe + suffix)),
                                              "JSON (*.json)" if fmt == "json" else "Markdown (*.md)")
        if path:
            out = self.export_conversation(path, fmt)
            if out is not None:
                self.activity.setText(f"exported to {out.name}")

    # ================================================================== template preview and tokenizer lab
    def _ensure_bundle(self) -> None:
        """Get the tokenizer and template for the Template and Tokenizer tabs (only while one of them shows):
        the loaded engine's own, or one read in a worker. Never while the model loads: two threads building
        tokenizers at once would starve the event loop of the interpreter lock; the engine's is used then."""
        if self.doc is None or self.bundle is not None or self._bundle_pending or self._bundle_error:
            return
        if self.tools.currentIndex() == 0 or not self.isVisible():
            return
        path = self.doc.path
        info = self.host.info
        if info is not None and info.tokenizer is not None and info.path == path:
            self._bundle_done(TokBundle.of(path, info.tokenizer, info.template))
            return
        if self.host.state == "loading":
            return  # _on_loaded / _on_load_failed come back here
        self._bundle_pending = True
        self.preview_status.setText("Reading the tokenizer…")

        def failed(msg: str, _detail: str) -> None:
            self._bundle_pending = False
            self._bundle_error = msg
            self.preview_status.setText(f"The tokenizer cannot be read: {msg}")
            self.lab_count.setText("—")

        self.runner.start("tokenizer", lambda _r, _t: read_bundle(path), on_done=self._bundle_done, on_failed=failed,
                          on_cancelled=lambda: setattr(self, "_bundle_pending", False))

    def _bundle_done(self, b: TokBundle) -> None:
        self._bundle_pending = False
        if self.doc is None or b.path != self.doc.path:
            return
        self.bundle = b
        self.preview_hl.set_specials(b.specials)
        self.update_preview()
        self.lab.set_bundle(b)

    def _tool_tab_changed(self, _i: int) -> None:
        self._ensure_bundle()
        self._schedule_preview()

    def _schedule_preview(self) -> None:
        if self.tools.currentIndex() == 1:
            self._preview_timer.start()

    def update_preview(self) -> None:
        """Render the current conversation (plus the composer's text as the next message) in a worker."""
        b = self.bundle
        if b is None:
            self._ensure_bundle()
            return
        prompt, stand_in = self.ctl.preview_prompt(self.composer.toPlainText(), self.mode,
                                                   self.system_edit.toPlainText().strip())
        self.preview.render(b, prompt, stand_in)

    # ================================================================== scripted exchange (screenshot, demos)
    def run_script(self, prompts: list[str], system: str | None = None, preset: str | None = None,
                   max_tokens: int | None = None, mode: str | None = None) -> None:
        """Load the model if needed, then send ``prompts`` one after another (``scriptFinished`` at the end)."""
        if system is not None:
            self.system_edit.setPlainText(system)
        if preset is not None:
            self.apply_preset(preset)
        if max_tokens is not None:
            self.max_spin.setValue(max_tokens)
        if mode is not None:
            self.set_mode(mode)
        self._script = list(prompts)
        self.script_active = True
        if self.host.state == "ready":
            self._script_next()
        elif self.host.state == "empty" and not self.load_model():
            self.script_active = False
            self.scriptFinished.emit()

    def _script_next(self) -> None:
        if not self._script or self.host.state != "ready":
            self.script_active = False
            self._script = []
            self.scriptFinished.emit()
            return
        if not self.send(self._script.pop(0)):
            self.script_active = False
            self.scriptFinished.emit()

    # ================================================================== shutdown
    @property
    def busy(self) -> bool:
        return self.host.busy or self.script_active

    def shutdown(self, timeout_ms: int = 30000) -> bool:
        """Stop the reply, unload the model and wait for its thread (closing the window)."""
        self._abort_reply("the window was closed")
        self._script = []
        self.script_active = False
        self._flush_timer.stop()
        ok = self.host.shutdown(timeout_ms)
        if self._store is not None:
            self._store.close()
            self._store = None
        return ok


