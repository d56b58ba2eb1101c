"""Placeholder for the chat pane, which arrives with the inference engine. Nothing here is simulated."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget


class ChatPlaceholder(QWidget):
    """Says what will be here and when; offers no fake functionality."""

    TEXT = (
        "<h3>Chat arrives with the engine</h3>"
        "<p>Chatting with this model on Quantscope's own native kernels comes in a later release, together with "
        "the inference engine: streaming tokens, tokens/s, time to first token, context fill and the chat "
        "template rendered for you to check.</p>"
        "<p>Until then this tab does nothing: no replies are simulated.</p>"
    )

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        label = QLabel(self.TEXT)
        label.setWordWrap(True)
        label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        label.setMaximumWidth(560)
        label.setAccessibleName("Chat (not available yet)")
        lay = QVBoxLayout(self)
        lay.addStretch(1)
        lay.addWidget(label, 0, Qt.AlignmentFlag.AlignHCenter)
        lay.addStretch(2)
