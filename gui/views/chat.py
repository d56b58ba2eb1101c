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
tokenizer lab) and ``chat_widgets`` (a message, labels, chips). Their behaviour is in three controllers that own
their state and are handed the widgets and callbacks they need (none of them knows this module):
:class:`~.chat_loading.ModelLoader` (the model bar: CUDA, memory, loading), :class:`~.chat_reply.ReplyController`
(the conversation's actions and the streaming reply) and :class:`~.chat_persist.Conversations` (the store and the
list). :class:`ChatView` builds the widgets, composes the controllers and decides what an event changes across them.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from quantscope.core.chat.controller import ChatController, identity_of
from quantscope.core.chat.store import StoredMessage
from quantscope.core.gguf.checks import INT32_MAX, metadata_int

from ..chat_engine import EngineHost, EngineInfo, GenStats
from ..document import Document
from ..guard import qt_guarded
from ..theme import is_dark
from ..workers import TaskRunner
from .chat_conversations import ConversationPanel
from .chat_loading import ModelLoader
from .chat_modelbar import DEFAULT_CTX, ModelBar
from .chat_notices import Notices, stylesheet
from .chat_persist import Conversations
from .chat_reply import ReplyController, ReplyHooks
from .chat_settings import SamplingPanel
from .chat_thread import Composer, ReplyStream, StatsBar
from .chat_tokens import ColorLegend
from .chat_tools import TemplatePreview, TokBundle, TokenizerLab, read_bundle
from .chat_widgets import MessageView


@qt_guarded
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
        self.ctl = ChatController()  # messages, conversation id, the model it belongs to
        self.error = ""
        self.is_embedding = False  # the open file is an embedding model (it does not chat)
        self.bundle: TokBundle | None = None
        self._bundle_error = ""
        self._bundle_pending = False
        self._script: list[str] = []
        self.script_active = False

        self._preview_timer = QTimer(self)
        self._preview_timer.setSingleShot(True)
        self._preview_timer.setInterval(200)
        self._preview_timer.timeout.connect(self.update_preview)

        self._dark = is_dark()
        self.setStyleSheet(stylesheet(self._dark))
        self._build()
        self._compose()
        self._update_controls()

    def _compose(self) -> None:
        """The controllers, each handed the widgets and callbacks it needs, and the signals that drive them."""
        self.loader = ModelLoader(self.runner, self.host, self.model_bar, lambda: self.doc)
        self.reply = ReplyController(
            self.host, self.ctl, self.stream, self.composer_box, self.stats_bar, self.notices, self.settings,
            self.model_bar, self, lambda: self.doc is not None,
            ReplyHooks(show_error=self.show_error, clear_error=self.clear_error, save=self._save,
                       controls_changed=self._update_controls, preview_changed=self._schedule_preview,
                       finished=self._reply_finished, failed=self._reply_failed))
        self.conversations = Conversations(self.side, self.ctl, self, self.show_error, self._settings,
                                           lambda: self.host.state == "generating", self.activity.setText)
        lo, r, c = self.loader, self.reply, self.conversations
        # the controllers' actions, as the view's (the main window, scripts and tests call them by these names)
        self.send, self.regenerate, self.switch_variant = r.send, r.regenerate, r.switch_variant
        self.store, self.use_store = c.store, c.use
        self.rename_conversation, self.export_conversation = c.rename, c.export

        self.side.renameRequested.connect(c.rename)
        self.side.exportRequested.connect(c.export_dialog)
        self.threads_spin.valueChanged.connect(lambda _v: lo.show_engine_info())
        self.ctx_spin.valueChanged.connect(lambda _v: lo.update_memory())
        self.model_bar.kv_combo.currentIndexChanged.connect(lambda _i: lo.update_memory())
        cb = self.composer_box
        cb.sendRequested.connect(lambda: r.send())
        cb.stopRequested.connect(r.stop)
        self.stop_shortcut.activated.connect(r.stop)
        cb.regenerateRequested.connect(r.regenerate)
        cb.cancelEditRequested.connect(r.cancel_edit)
        self.settings.modeChanged.connect(r.mode_changed)

        h = self.host
        h.stateChanged.connect(lambda _s: self._update_controls())
        h.loadProgress.connect(lo.show_progress)
        h.loaded.connect(self._on_loaded)
        h.loadFailed.connect(self._on_load_failed)
        h.loadCancelled.connect(self._on_load_cancelled)
        h.trimmed.connect(r.on_trimmed)
        h.promptProgress.connect(r.on_prompt_progress)
        h.delta.connect(r.on_delta)
        h.thinking.connect(r.on_thinking)
        h.token.connect(r.on_token)
        h.trace.connect(r.on_trace)
        h.finished.connect(r.on_finished)
        h.failed.connect(r.on_failed)

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
        sp.deleteRequested.connect(self.delete_conversation)
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
        # Esc stops the reply (or the loading) wherever the focus is in the chat pane
        self.stop_shortcut = QShortcut(QKeySequence("Escape"), self)
        self.stop_shortcut.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        self.stop_shortcut.setWhatsThis("stop the reply")  # listed by F1
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
        self.settings.systemChanged.connect(self._schedule_preview)
        self.settings.colorModeChanged.connect(self._color_mode_changed)
        self.color_combo = self.settings.color_combo
        s = self.settings  # the panel's widgets, as the view's (tests and scripts use them by these names)
        self.mode_combo, self.system_edit, self.preset_combo, self.special_check = (
            s.mode_combo, s.system_edit, s.preset_combo, s.special_check)
        self.temp_spin, self.topk_spin, self.topp_spin, self.minp_spin, self.repeat_spin = (
            s.temp_spin, s.topk_spin, s.topp_spin, s.minp_spin, s.repeat_spin)
        self.seed_spin, self.max_spin, self.lookup_spin = s.seed_spin, s.max_spin, s.lookup_spin
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
        self.reply.abort("the file was switched")
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
        self.reply.cancel_edit()
        self.notice.hide()
        self.reply.reset_stats()
        # a conversation belongs to a model: a new file starts a new chat
        self.ctl.set_model(identity_of(self.doc.path, self.doc.gguf.file_type_name)
                           if self.doc is not None and self.doc.gguf is not None else None)
        self.reply.rebuild_views()
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
        self.loader.update_memory()
        self.loader.probe_cuda()
        self._update_controls()
        self.conversations.refresh()
        if self.isVisible():
            self._ensure_bundle()
        self._say_embedding_model()

    def _say_embedding_model(self) -> None:
        """An embedding model does not chat: said as soon as its file is open (as loading it would say)."""
        from quantscope.core.summary import embedding_summary

        emb = embedding_summary(self.doc.gguf) if self.doc is not None and self.doc.gguf is not None else None
        self.is_embedding = emb is not None
        self.reply.update_empty()
        if emb is not None:
            self.show_error("This is an embedding model: it does not chat or generate text.",
                            f"It turns a text into one vector ({emb['pooling']} pooling): serve it from the Serve "
                            "tab (/v1/embeddings, Ollama's /api/embed) or run quantscope embed FILE -p TEXT.")

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange and is_dark() != self._dark:
            self._dark = is_dark()  # the system switched between light and dark: recolour the bubbles
            self.setStyleSheet(stylesheet(self._dark))
            self.color_legend.set_mode(self.color_legend.mode)

    def showEvent(self, event: Any) -> None:
        super().showEvent(event)
        self.conversations.refresh()
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

    def _color_mode_changed(self, mode: str) -> None:
        self.color_legend.set_mode(mode)
        for v in self.views:
            v.set_color_mode(mode)

    # ================================================================== what an event changes across the pane
    def _update_controls(self) -> None:
        """Every button and state for the model thread's state and the open conversation."""
        self.loader.update_controls(self.doc is not None)
        self.reply.update_controls()
        self.conversations.update_buttons()

    # ------------------------------------------------------------------ loading
    def load_model(self) -> bool:
        """Load the open file in the model thread (memory is checked first; errors appear in the pane)."""
        if self.doc is None or self.host.state == "loading":
            return False
        self.clear_error()
        refused = self.loader.too_large()
        if refused is not None:
            self.show_error(*refused)
            self._script = []
            self.script_active = False
            return False
        self.loader.start()
        self._update_controls()
        return True

    def unload_model(self) -> None:
        self.reply.abort("the model was unloaded")
        self.loader.unload()
        self._update_controls()

    def _on_loaded(self, info: EngineInfo) -> None:
        self.loader.loaded(info)
        if info.backend_note:
            self.show_error("Running on the CPU.", info.backend_note)
        self.reply.reset_stats()
        self.ctx_bar.setRange(0, info.n_ctx)  # a new engine: nothing measured yet, its context size
        self.max_spin.setMaximum(info.n_ctx)
        if not info.has_template:
            self.set_mode("completion")
        self._update_controls()
        self._ensure_bundle()
        if self.isVisible():  # ready to type: the message box, not the list the Load button left the focus in
            self.composer.setFocus()
        self.engineLoaded.emit(info)
        if self.script_active:
            self._script_next()

    def _on_load_failed(self, message: str, detail: str) -> None:
        self.loader.ended("not loaded")
        self.show_error(message, detail)
        self._load_ended()

    def _on_load_cancelled(self) -> None:
        self.loader.ended("loading cancelled")
        self._load_ended()

    def _load_ended(self) -> None:
        self._script = []
        self.script_active = False
        self._update_controls()
        self._ensure_bundle()

    # ------------------------------------------------------------------ a reply's end
    def _reply_finished(self, stats: GenStats) -> None:
        self.replyFinished.emit(stats)
        if self.script_active:
            self._script_next()

    def _reply_failed(self, message: str, detail: str) -> None:
        self.show_error(message, detail)
        self.replyFailed.emit(message)
        if self.script_active:
            self._script = []
            self.script_active = False
            self.scriptFinished.emit()

    # ------------------------------------------------------------------ conversations
    def _settings(self) -> dict[str, Any]:
        """What is saved with a conversation besides its messages."""
        return {"system_prompt": self.system_edit.toPlainText(), "mode": self.mode, "params": self.params_dict()}

    def _save(self) -> None:
        self.conversations.save()

    def new_conversation(self) -> None:
        self.reply.abort("a new conversation was started")
        self.ctl.new()
        self.reply.cancel_edit()
        self.notice.hide()
        self.reply.reset_stats()
        self._show_binding()
        self.reply.rebuild_views()
        self.side.clear_selection()
        self._update_controls()

    def open_conversation(self, conv_id: int) -> bool:
        """Show a saved conversation with its system prompt, mode and sampling settings."""
        if self.conversations.store() is None or (conv_id == self.conv_id and self.views):
            return conv_id == self.conv_id
        if self.host.state == "generating":
            return False
        conv = self.conversations.open(conv_id)
        if conv is None:
            return False
        self.reply.reset_stats()
        self._show_binding()
        self.system_edit.setPlainText(conv.system_prompt)
        self.set_mode(conv.mode if self.settings.chat_available else "completion")
        self.set_params(conv.params)
        self.reply.cancel_edit()
        self.notice.hide()
        self.clear_error()
        self.reply.rebuild_views()
        self.conversations.refresh()
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
        self.conversations.continue_with_model()
        self._show_binding()
        self.conversations.refresh()
        self._update_controls()

    def delete_conversation(self, conv_id: int) -> None:
        if self.conversations.store() is None:
            return
        if conv_id == self.conv_id:
            self.new_conversation()
        self.conversations.delete(conv_id)

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
                    return self.reply.branch(last, i, alt)
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
        self.reply.abort("the window was closed")
        self._script = []
        self.script_active = False
        self.reply.flush_timer.stop()
        ok = self.host.shutdown(timeout_ms)
        self.conversations.close()
        return ok


