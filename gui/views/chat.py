"""The Chat tab: talk with the opened model on Quantscope's own kernels without ever blocking the window.

Left, the saved conversations (SQLite, see :mod:`quantscope.core.chat.store`); in the middle the model bar (memory
before loading, backend, threads, context, load progress with cancel), the conversation and the composer with the
live numbers (time to first token, prompt and generation tokens/s, context fill); right, the sampling settings,
the exact prompt the chat template produces (with its token ids) and a tokenizer lab.

The model runs in its own thread (:mod:`quantscope.gui.chat_engine`); token deltas arrive as queued signals, are
collected in a list and appended to the reply by a 50 ms timer, so a fast model never repaints per token.

The pieces: the conversation logic without Qt is :class:`quantscope.core.chat.controller.ChatController`; the
widgets are ``chat_conversations`` (the list), ``chat_modelbar``, ``chat_notices`` (banners, style sheet),
``chat_thread`` (messages, composer, numbers), ``chat_settings`` (sampling), ``chat_tools`` (template preview,
tokenizer lab) and ``chat_widgets`` (a message, labels, chips); :class:`ChatView` wires them, with its loading,
reply and persistence behaviour in the ``chat_loading``, ``chat_reply`` and ``chat_persist`` mixins.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QMenu,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from quantscope.core.chat.controller import ChatController, identity_of
from quantscope.core.chat.store import (
    ChatStore,
    StoredMessage,
)
from quantscope.core.chat.tokens import TokenRecord
from quantscope.core.gguf.checks import INT32_MAX, metadata_int

from ..chat_engine import EngineHost, GenStats
from ..document import Document
from ..guard import qt_guarded
from ..theme import is_dark
from ..workers import TaskRunner
from .chat_conversations import ConversationPanel
from .chat_loading import LoadingMixin
from .chat_modelbar import DEFAULT_CTX, ModelBar
from .chat_notices import Notices, stylesheet
from .chat_persist import PersistMixin
from .chat_reply import ReplyMixin
from .chat_settings import SamplingPanel
from .chat_thread import Composer, ReplyStream, StatsBar
from .chat_tokens import ColorLegend
from .chat_tools import TemplatePreview, TokBundle, TokenizerLab, read_bundle
from .chat_widgets import (
    MessageView,
)

FLUSH_MS = 50


@qt_guarded
class ChatView(LoadingMixin, ReplyMixin, PersistMixin, QWidget):
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
        self._reply_thinking: list[str] = []
        self._pending_thinking: list[str] = []
        self._pending_stats: GenStats | None = None
        self._reply_stats: GenStats | None = None
        self._reply_records: list[TokenRecord] = []
        self._reply_temperature: float | None = None
        self.alt_menu: QMenu | None = None  # the alternatives of a clicked token (tests pick from it)
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
        self.host.thinking.connect(self._on_thinking)
        self.host.token.connect(self._on_token)
        self.host.trace.connect(self._on_trace)
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
        self.color_legend = ColorLegend()  # what the replies' tint means (shown while they are coloured)
        lay.addWidget(self.color_legend)
        self.composer_box = Composer()
        cb = self.composer_box  # its widgets, as the view's (tests use them by these names)
        self.composer, self.send_btn, self.stop_btn, self.regen_btn, self.edit_bar, self.edit_label = (
            cb.text, cb.send_btn, cb.stop_btn, cb.regen_btn, cb.edit_bar, cb.edit_label)
        cb.sendRequested.connect(lambda: self.send())
        cb.stopRequested.connect(self.stop)
        # Esc stops the reply (or the loading) wherever the focus is in the chat pane
        self.stop_shortcut = QShortcut(QKeySequence("Escape"), self)
        self.stop_shortcut.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        self.stop_shortcut.setWhatsThis("stop the reply")  # listed by F1
        self.stop_shortcut.activated.connect(self.stop)
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
        self.settings.colorModeChanged.connect(self._color_mode_changed)
        self.color_combo = self.settings.color_combo
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
            self.color_legend.set_mode(self.color_legend.mode)

    def showEvent(self, event: Any) -> None:
        super().showEvent(event)
        self._refresh_list()
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

    def token_demo(self, color: str = "probability") -> bool:
        """Colour the replies by ``color`` and branch the last reply at its first uncertain token (probability
        below 0.6, not the first) with the likeliest other word, as the token view's screenshot shows them: the
        new version streams (wait for ``replyFinished``), the reply gets its "< 2/2 >" switcher. False when
        there is no such token or no model is ready."""
        self.settings.set_color_mode(color)
        self.tools.setCurrentIndex(0)
        last = len(self.messages) - 1
        if last < 0 or self.messages[last].role != "assistant":
            return False
        recs = self.messages[last].tokens
        for i, r in enumerate(recs):
            if i and r.known and r.prob < 0.6 and r.text.strip() and not r.channel:  # a word, not a list number
                alt = next((a.token for a in r.alternatives if a.token != r.token and a.piece.strip().isalpha()),
                           None)
                if alt is not None:
                    return self.branch(last, i, alt)
        return False

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


