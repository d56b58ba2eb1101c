"""The middle of the chat pane: the conversation as a column of messages (kept scrolled to the newest while the
user has not scrolled away), the composer with Send/Stop/Regenerate and the edit bar, and the live numbers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from PySide6.QtCore import QPoint, Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut, QTextCursor
from PySide6.QtWidgets import (
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from quantscope.core.chat.controller import stats_numbers
from quantscope.core.chat.store import StoredMessage

from ..guard import qt_guarded
from ..widgets.fit import ElidedLabel
from ..widgets.progress import ProgressBar
from .chat_tokens import align
from .chat_widgets import MessageView


@qt_guarded
class ReplyStream(QScrollArea):
    """The messages of the conversation, one :class:`MessageView` each; never wider than the pane (no
    horizontal scroll bar: replies wrap)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.views: list[MessageView] = []
        self.stick = True
        self.thread = QWidget()
        self.thread.setObjectName("thread")
        self.lay = QVBoxLayout(self.thread)
        self.lay.setContentsMargins(2, 2, 10, 2)
        self.lay.setSpacing(8)
        self.empty_label = QLabel()
        self.empty_label.setObjectName("muted")
        self.empty_label.setWordWrap(True)
        self.empty_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.lay.addWidget(self.empty_label)
        self.lay.addStretch(1)
        self.setWidgetResizable(True)
        self.setWidget(self.thread)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setAccessibleName("Conversation")
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        bar = self.verticalScrollBar()
        bar.rangeChanged.connect(lambda _lo, hi: bar.setValue(hi) if self.stick else None)
        bar.valueChanged.connect(lambda v: setattr(self, "stick", v >= bar.maximum() - 40))

    def add(self, index: int, role: str, content: str, mode: str) -> MessageView:
        v = MessageView(index, role, content, mode)
        self.lay.insertWidget(self.lay.count() - 1, v)
        self.views.append(v)
        self.stick = True
        return v

    def remove(self, v: MessageView) -> None:
        if v in self.views:
            self.views.remove(v)
        self.lay.removeWidget(v)
        v.hide()
        v.deleteLater()

    def rebuild(self, messages: Sequence[StoredMessage], mode: str, stats: Callable[[dict[str, Any]], str],
                each: Callable[[MessageView], None]) -> None:
        """One view per message (``stats`` formats a reply's numbers; ``each`` connects a new view)."""
        for v in list(self.views):
            self.remove(v)
        for i, m in enumerate(messages):
            v = self.add(i, m.role, m.content, mode)
            if m.thinking:
                v.set_thinking(m.thinking)
            each(v)
            if m.role == "assistant" and m.stats:
                v.set_stats(stats(m.stats))
            temp = m.stats.get("temperature")
            v.temperature = float(temp) if isinstance(temp, (int, float)) and not isinstance(temp, bool) else None
            if m.tokens:
                v.set_records(m.tokens)
            v.set_variants(m.variant, m.n_variants)

    def finish(self, v: MessageView, text: str, stats: str) -> None:
        """End ``v``'s streaming (its text rendered as Markdown) without moving what the user reads: while they
        follow the newest text the view stays at the bottom; when they have scrolled up into the reply, the
        text at the top of the view stays at the top although the rendering changes the reply's height."""
        bar = self.verticalScrollBar()
        body = v.body
        top = body.mapTo(self.thread, QPoint(0, 0)).y()
        y = bar.value() - top
        follow = self.stick
        anchor = -1
        if not follow and 0 <= y < body.height():
            cur = body.cursorForPosition(QPoint(0, y))
            anchor = cur.position()  # while streaming, document positions are offsets in the reply's text
            dy = y - body.cursorRect(cur).top()
        value = bar.value()
        v.finish(text, stats)
        if follow:
            return  # rangeChanged keeps the bottom in view
        v.layout().activate()  # the new heights, now (not at the next pass of the event loop)
        self.thread.layout().activate()
        if anchor >= 0 and v.markdown:
            shown = align(body.document().toRawText(), text)
            pos = next((i for i, o in enumerate(shown) if o >= anchor), max(0, len(shown) - 1))
            cur = QTextCursor(body.document())
            cur.setPosition(min(pos, body.document().characterCount() - 1))
            value = body.mapTo(self.thread, QPoint(0, 0)).y() + body.cursorRect(cur).top() + dy
        bar.setValue(value)
        self.stick = bar.value() >= bar.maximum() - 40

    def set_empty(self, text: str) -> None:
        """The hint shown while there is no message ("" hides it)."""
        self.empty_label.setText(text)
        self.empty_label.setVisible(bool(text) and not self.views)


@qt_guarded
class Composer(QWidget):
    """The message box (Ctrl+Enter sends, Esc stops), its buttons, and the bar shown while a message is edited."""

    sendRequested = Signal()
    stopRequested = Signal()
    regenerateRequested = Signal()
    cancelEditRequested = Signal()
    textChanged = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(6)
        self.edit_bar = QWidget()
        eb = QHBoxLayout(self.edit_bar)
        eb.setContentsMargins(0, 0, 0, 0)
        self.edit_label = QLabel()
        self.edit_label.setObjectName("muted")
        self.edit_label.setWordWrap(True)
        cancel_edit = QPushButton("Cancel edit")
        cancel_edit.setAccessibleName("Cancel editing")
        cancel_edit.clicked.connect(self.cancelEditRequested.emit)
        eb.addWidget(self.edit_label, 1)
        eb.addWidget(cancel_edit)
        self.edit_bar.hide()
        lay.addWidget(self.edit_bar)
        self.text = QPlainTextEdit()
        self.text.setAccessibleName("Message to send")
        self.text.setPlaceholderText("Message the model…  (Ctrl+Enter sends, Esc stops)")
        self.text.setFixedHeight(78)
        self.text.textChanged.connect(self.textChanged.emit)
        for keys in ("Ctrl+Return", "Ctrl+Enter"):  # (Esc is the whole chat pane's: ChatView)
            sc = QShortcut(QKeySequence(keys), self.text)
            sc.setContext(Qt.ShortcutContext.WidgetShortcut)
            sc.setWhatsThis("send the message")  # listed by F1
            sc.activated.connect(self.sendRequested.emit)
        self.send_btn = QPushButton("Send")
        self.send_btn.setAccessibleName("Send the message")
        self.send_btn.setDefault(True)
        self.send_btn.clicked.connect(self.sendRequested.emit)
        self.stop_btn = QPushButton("Stop")
        self.stop_btn.setAccessibleName("Stop the reply")
        self.stop_btn.clicked.connect(self.stopRequested.emit)
        self.regen_btn = QPushButton("Regenerate")
        self.regen_btn.setAccessibleName("Regenerate the last reply")
        self.regen_btn.clicked.connect(self.regenerateRequested.emit)
        buttons = QVBoxLayout()
        buttons.setSpacing(4)
        for b in (self.send_btn, self.stop_btn, self.regen_btn):
            buttons.addWidget(b)
        comp = QHBoxLayout()
        comp.addWidget(self.text, 1)
        comp.addLayout(buttons)
        lay.addLayout(comp)

    def show_editing(self, index: int, after: int) -> None:
        self.edit_label.setText(f"Editing message {index + 1}: Send replaces it"
                                + (f" and the {after} message{'s' if after != 1 else ''} after it." if after else "."))
        self.edit_bar.show()


@qt_guarded
class StatsBar(QWidget):
    """The live numbers on one row (each pair keeps its label whole), the context fill and what the model is doing
    on the next (the bar takes the room that is left; the activity elides)."""

    def __init__(self, n_ctx: int, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        grid = QGridLayout(self)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setHorizontalSpacing(6)
        grid.setVerticalSpacing(2)
        self.labels: dict[str, QLabel] = {}
        nums = QHBoxLayout()
        nums.setSpacing(6)
        for key, title in (("ttft", "First token"), ("prompt", "Prompt"), ("gen", "Generation")):
            t = QLabel(title)
            t.setObjectName("muted")
            v = QLabel("—")
            v.setObjectName("statValue")
            v.setAccessibleName(title)
            v.setMinimumWidth(v.fontMetrics().horizontalAdvance("9999.9 t/s"))
            self.labels[key] = v
            nums.addWidget(t)
            nums.addWidget(v)
            nums.addSpacing(6)
        nums.addStretch(1)
        t = QLabel("Context")
        t.setObjectName("muted")
        self.ctx_bar = ProgressBar()
        self.ctx_bar.setAccessibleName("Context used")
        self.ctx_bar.setRange(0, n_ctx)
        self.ctx_bar.setValue(0)
        self.ctx_bar.setTextVisible(True)
        self.ctx_bar.setFormat("%v / %m tokens")
        self.ctx_bar.setMinimumWidth(self.ctx_bar.fontMetrics().horizontalAdvance("99,999 / 99,999 tokens") + 16)
        self.activity = ElidedLabel()
        self.activity.setObjectName("muted")
        self.activity.setAccessibleName("Activity")
        ctx = QHBoxLayout()
        ctx.setSpacing(6)
        ctx.addWidget(t)
        ctx.addWidget(self.ctx_bar, 1)
        ctx.addWidget(self.activity, 1)
        grid.addLayout(nums, 0, 0)
        grid.addLayout(ctx, 1, 0)

    def show_stats(self, stats: dict[str, Any]) -> None:
        """A reply's numbers ("prompt cached" when the prompt came whole from the cache) and the context fill."""
        for key, text in stats_numbers(stats).items():
            self.labels[key].setText(text)
        if stats.get("n_ctx"):
            self.ctx_bar.setRange(0, int(stats["n_ctx"]))
        self.ctx_bar.setValue(min(int(stats.get("context_used", 0)), self.ctx_bar.maximum()))

    def reset(self, n_ctx: int | None = None) -> None:
        """No numbers and an empty context bar (``n_ctx`` sets its size)."""
        for v in self.labels.values():
            v.setText("—")
        if n_ctx:
            self.ctx_bar.setRange(0, n_ctx)
        self.ctx_bar.setValue(0)
