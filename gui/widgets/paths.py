"""A path field with its "Browse…" button, as the job dialogs (convert, quantize, compare) use it."""

from __future__ import annotations

from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QLineEdit, QPushButton, QWidget


def browse_row(edit: QLineEdit, title: str, file_filter: str, parent: QWidget, *, save: bool,
               accessible: str | None = None) -> tuple[QWidget, QPushButton]:
    """``edit`` beside a Browse… button that fills it from a save dialog (``save``) or an open dialog titled
    ``title``, starting at what ``edit`` holds; returns (the row, the button)."""
    w = QWidget()
    lay = QHBoxLayout(w)
    lay.setContentsMargins(0, 0, 0, 0)
    btn = QPushButton("Browse…")
    btn.setAccessibleName(accessible or f"Browse for {title}")

    def browse() -> None:
        pick = QFileDialog.getSaveFileName if save else QFileDialog.getOpenFileName
        path, _ = pick(parent, title, edit.text(), file_filter)
        if path:
            edit.setText(path)

    btn.clicked.connect(browse)
    lay.addWidget(edit, 1)
    lay.addWidget(btn)
    return w, btn
