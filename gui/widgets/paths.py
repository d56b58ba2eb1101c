"""A path field with its "Browse…" button, as the job dialogs (convert, quantize, compare) use it, and the open
dialog with a size column that fits its figures."""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QStandardPaths
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


def output_path(source: str | os.PathLike[str], name: str) -> Path:
    """Where a new file ``name`` made from ``source`` is proposed: beside the source, unless the source lives in a
    cache (the model cache where the demo model is fetched, or any folder under the user's cache folder: Linux
    ``$XDG_CACHE_HOME``, default ``~/.cache``; macOS ``~/Library/Caches``; Windows ``%LOCALAPPDATA%``) or in a
    folder this user cannot write; then in the user's Documents folder, else home."""
    folder = Path(source).expanduser().absolute().parent
    if not _is_cache(folder) and os.access(folder, os.W_OK):
        return folder / name
    docs = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.DocumentsLocation)
    return (Path(docs) if docs and Path(docs).is_dir() else Path.home()) / name


def _is_cache(folder: Path) -> bool:
    from quantscope.core import catalog, sysinfo

    caches = [catalog.cache_dir(), sysinfo.user_cache_dir()]
    try:
        real = folder.resolve()
    except OSError:
        return False
    for c in caches:
        try:
            if real.is_relative_to(c.expanduser().resolve()):
                return True
        except OSError:
            continue
    return False


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
    """Keep the Size and Date Modified columns of Qt's own file dialog wide enough for their figures ("438.5 MiB"
    was cut to "438…MiB"): each time a folder is listed the columns take the width their cells need. A native
    dialog has no such view and is left as it is."""
    view = dialog.findChild(QTreeView, "treeView")
    model = dialog.findChild(QFileSystemModel)
    if view is None or model is None:
        return

    def fit(*_: object) -> None:
        header = view.header()
        pad = 2 * view.style().pixelMetric(QStyle.PixelMetric.PM_HeaderMargin) + 8
        sample = {1: "1023.99 MiB", 3: "88/88/8888 88:88"}  # the widest size, a date (the rows may be unlisted)
        for col, text in sample.items():  # the size, and the date modified
            need = max(header.sectionSizeHint(col), view.sizeHintForColumn(col),
                       view.fontMetrics().horizontalAdvance(text) + pad)
            if header.sectionSize(col) < need:
                header.resizeSection(col, need)
        # the names take what the view has left, up to what they need
        room = view.viewport().width() - sum(header.sectionSize(c) for c in range(1, header.count()))
        name = min(view.sizeHintForColumn(0) + pad, room)
        if header.sectionSize(0) < name:
            header.resizeSection(0, name)

    model.directoryLoaded.connect(fit)
    fit()


def open_file_dialog(parent: QWidget, title: str, start: str, file_filter: str) -> QFileDialog:
    """A dialog that picks one existing file, starting at ``start`` (a folder, or a file to select), with its
    size column fitted (:func:`fit_size_column`); :func:`pick_file` runs it."""
    dialog = QFileDialog(parent, title, start, file_filter)
    dialog.setAcceptMode(QFileDialog.AcceptMode.AcceptOpen)
    dialog.setFileMode(QFileDialog.FileMode.ExistingFile)
    dialog.resize(860, 500)  # room for long model names beside the sizes and dates
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
