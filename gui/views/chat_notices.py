"""The chat pane's banners (an error, the context notice, a conversation of another model with the choice to
continue it) and the pane's style sheet."""

from __future__ import annotations

import html

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from quantscope.core.chat.store import ModelIdentity

from ..guard import qt_guarded


def stylesheet(dark: bool) -> str:
    user = "#2b3440" if dark else "#eaf1fb"
    user_border = "#3b4d63" if dark else "#c9daf2"
    note_bg, note_fg, note_bd = ("#4a3d17", "#f3dc9b", "#7a6326") if dark else ("#fff4d6", "#5c4400", "#e8c66a")
    err_bg, err_fg, err_bd = ("#4d2226", "#f5b8bd", "#8a3a41") if dark else ("#fde7e7", "#7a1010", "#e39a9a")
    think_fg, think_bd = ("#a9b1bb", "#4a5563") if dark else ("#5f6670", "#c6ccd4")  # a reply's thinking: muted
    return f"""
    QFrame#msgUser {{ background: {user}; border: 1px solid {user_border}; border-radius: 8px; }}
    QFrame#msgAssistant {{ background: palette(base); border: 1px solid palette(mid); border-radius: 8px; }}
    QLabel#msgRole {{ font-weight: 600; }}
    QLabel#msgNote {{ color: {note_fg}; background: {note_bg}; border-radius: 3px; padding: 0 4px; }}
    QToolButton#msgAction {{ padding: 1px 6px; }}
    QToolButton#msgThinking {{ color: {think_fg}; padding: 1px 2px; }}
    QTextBrowser#msgThinkingText {{ color: {think_fg}; border: none; border-left: 3px solid {think_bd};
                                     padding-left: 6px; }}
    QFrame#notice {{ background: {note_bg}; border: 1px solid {note_bd}; border-radius: 6px; }}
    QFrame#notice QLabel {{ color: {note_fg}; }}
    QLabel#notice {{ background: {note_bg}; color: {note_fg}; border: 1px solid {note_bd}; border-radius: 6px;
                     padding: 6px 10px; }}
    QLabel#errorBanner {{ background: {err_bg}; color: {err_fg}; border: 1px solid {err_bd}; border-radius: 6px;
                          padding: 6px 10px; }}
    QLabel#modelName {{ font-size: 11pt; font-weight: 600; }}
    QLabel#statValue {{ font-weight: 600; }}
    QWidget#thread {{ background: palette(window); }}
    """



@qt_guarded
class Notices(QWidget):
    """The banners above the conversation; each is hidden until it has something to say."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(6)
        self.error_banner = QLabel()
        self.error_banner.setObjectName("errorBanner")
        self.error_banner.setWordWrap(True)
        self.error_banner.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.error_banner.setAccessibleName("Chat error")
        self.error_banner.hide()
        self.notice = QLabel()
        self.notice.setObjectName("notice")
        self.notice.setWordWrap(True)
        self.notice.setAccessibleName("Context notice")
        self.notice.hide()
        self.binding_bar = QFrame()
        self.binding_bar.setObjectName("notice")
        self.binding_bar.setAccessibleName("Conversation of another model")
        bb = QVBoxLayout(self.binding_bar)
        bb.setContentsMargins(8, 6, 8, 6)
        self.binding_label = QLabel()
        self.binding_label.setWordWrap(True)
        self.binding_new = QPushButton("New chat")
        self.binding_new.setAccessibleName("Start a new conversation with the open model")
        self.binding_btn = QPushButton("Continue with the open model")
        self.binding_btn.setAccessibleName("Continue this conversation with the open model")
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(self.binding_new)
        row.addWidget(self.binding_btn)
        bb.addWidget(self.binding_label)
        bb.addLayout(row)
        self.binding_bar.hide()
        for w in (self.error_banner, self.notice, self.binding_bar):
            lay.addWidget(w)

    def show_error(self, message: str, short: str, detail: str) -> None:
        self.error_banner.setText(f"<b>{html.escape(message)}</b>" + (f"<br>{html.escape(short)}" if short else ""))
        self.error_banner.setToolTip(detail)
        self.error_banner.show()

    def show_binding(self, owner: ModelIdentity | None, model: ModelIdentity | None) -> None:
        """``owner`` set: the open conversation belongs to it, not to ``model`` (the open file's)."""
        if owner is None or model is None:
            self.binding_bar.hide()
            return
        self.binding_label.setText(f"This conversation was held with <b>{html.escape(owner.label)}</b>; the open "
                                   f"file is <b>{html.escape(model.label)}</b>. Start a new chat, or continue a copy "
                                   "of this one with the open model.")
        self.binding_btn.setToolTip(f"Copy this conversation and continue it with {model.label}")
        self.binding_bar.show()
