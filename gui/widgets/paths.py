"""A path field with its "Browse…" button, as the job dialogs (convert, quantize, compare) use it, and the open
dialog with a size column that fits its figures."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QFileDialog,
    QFileSystemModel,
    QHBoxLayout,
    QLineEdit,
    QPushButton,
    QStyle,
    QTreeView,
    QWidget,
)


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


def fit_size_column(dialog: QFileDialog) -> None:
    """Keep the Size column of Qt's own file dialog wide enough for its figures ("438.5 MiB" was cut to
    "438…MiB"): each time a folder is listed the column takes the width its cells need. A native dialog has no
    such view and is left as it is."""
    view = dialog.findChild(QTreeView, "treeView")
    model = dialog.findChild(QFileSystemModel)
    if view is None or model is None:
        return

    def fit(*_: object) -> None:
        header = view.header()
        sample = view.fontMetrics().horizontalAdvance("1023.99 MiB") + 2 * view.style().pixelMetric(
            QStyle.PixelMetric.PM_HeaderMargin) + 8
        need = max(header.sectionSizeHint(1), view.sizeHintForColumn(1), sample)
        if header.sectionSize(1) < need:
            header.resizeSection(1, need)

    model.directoryLoaded.connect(fit)
    fit()


def open_file_dialog(parent: QWidget, title: str, start: str, file_filter: str) -> QFileDialog:
    """A dialog that picks one existing file, starting at ``start`` (a folder, or a file to select), with its
    size column fitted (:func:`fit_size_column`); :func:`pick_file` runs it."""
    dialog = QFileDialog(parent, title, start, file_filter)
    dialog.setAcceptMode(QFileDialog.AcceptMode.AcceptOpen)
    dialog.setFileMode(QFileDialog.FileMode.ExistingFile)
    fit_size_column(dialog)
    return dialog


def pick_file(parent: QWidget, title: str, start: str, file_filter: str) -> str:
    """The file the user picked in :func:`open_file_dialog`, or "" when cancelled."""
    dialog = open_file_dialog(parent, title, start, file_filter)
    try:
        files = dialog.selectedFiles() if dialog.exec() == QFileDialog.DialogCode.Accepted else []
    finally:
        dialog.deleteLater()
    return files[0] if files else ""
