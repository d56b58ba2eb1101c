"""Metadata: a searchable, sortable table of every key; the selected value in full beside it: long arrays in a
lazy table (the 262k-entry vocabulary scrolls and searches instantly), text and the chat template with syntax
highlighting."""

from __future__ import annotations

import html
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PySide6.QtCore import QModelIndex, QPoint, Qt, QTimer, Signal
from PySide6.QtGui import (
    QAction,
    QColor,
    QGuiApplication,
    QKeySequence,
)
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QMessageBox,
    QPlainTextEdit,
    QSpinBox,
    QSplitter,
    QStackedWidget,
    QTableView,
    QToolBar,
    QVBoxLayout,
    QWidget,
)

from quantscope.core.analysis import find_in_strings
from quantscope.core.fsutil import printable
from quantscope.core.gguf import GGUFFile, MetadataValue, StringArray, ValueType
from quantscope.core.gguf.edit import DeleteKey, EditError, EditList, EditOp, save_edited
from quantscope.core.summary import format_value

from ..document import Document
from ..exports import Exporter
from ..guard import qt_guarded
from ..models import KEY_ROLE, ArrayModel, MetadataModel, SortFilterProxy, plural
from ..theme import BAD_COLOR, OK_COLOR, muted_color
from ..widgets.blockwidgets import mono_font
from ..widgets.fit import fit_columns
from ..widgets.jinja import JinjaHighlighter
from ..widgets.paths import output_path
from ..workers import JobSlot, TaskRunner
from .metadata_edit import (
    EditedValue,
    ElementDialog,
    SpecialTokenDialog,
    TemplateDialog,
    ValueDialog,
)
from .metadata_edit import _status as _status_line


def _same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """``a`` names the file ``b`` (a symlink or hard link to it included)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


@qt_guarded
class ArrayView(QWidget):
    """A metadata array in a lazy table, with search (string arrays) and go-to-index. A double click (or Enter) on
    an element emits :attr:`elementActivated` with its index (the Metadata view edits it)."""

    elementActivated = Signal(int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.kv: MetadataValue | None = None
        self.file: GGUFFile | None = None
        self.model = ArrayModel()
        self.table = QTableView()
        self.table.setModel(self.model)
        self.table.setAccessibleName("Array elements")
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Fixed)
        self.table.verticalHeader().setDefaultSectionSize(21)
        self.table.horizontalHeader().setStretchLastSection(False)
        self.table.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setAlternatingRowColors(True)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search strings…")
        self.search.setClearButtonEnabled(True)
        self.search.setAccessibleName("Search the array")
        self.goto = QSpinBox()
        self.goto.setAccessibleName("Go to index")
        self.goto.setKeyboardTracking(False)
        self.goto.setMinimumWidth(100)
        self.status = QLabel()
        self.status.setObjectName("muted")
        self.status.setAccessibleName("Array status")
        top = QHBoxLayout()
        top.addWidget(self.search, 1)
        top.addWidget(QLabel("Go to"))
        top.addWidget(self.goto)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(top)
        lay.addWidget(self.table, 1)
        lay.addWidget(self.status)
        self._debounce = QTimer(self)
        self._debounce.setSingleShot(True)
        self._debounce.setInterval(120)
        self._debounce.timeout.connect(self.apply_search)
        self.search.textChanged.connect(lambda _t: self._debounce.start())
        self.goto.valueChanged.connect(self.go_to)
        self.table.activated.connect(lambda idx: self.elementActivated.emit(self.index_of_row(idx.row())))

    def index_of_row(self, row: int) -> int:
        """The array index a table row shows (search hits are a subset)."""
        ind = self.model.indices
        return int(ind[row]) if ind is not None and 0 <= row < len(ind) else row

    def set_array(self, kv: MetadataValue, f: GGUFFile) -> None:
        self.kv, self.file = kv, f
        self.search.blockSignals(True)
        self.search.clear()
        self.search.blockSignals(False)
        self.model.set_array(kv, f)
        n = len(kv.value)
        self.goto.setRange(0, max(0, n - 1))
        is_str = isinstance(kv.value, StringArray)
        self.search.setEnabled(is_str)
        self.search.setPlaceholderText("Search strings…" if is_str else "(search works on string arrays)")
        self._size_columns()
        self.status.setText(f"{kv.key}: {n:,} × {kv.elem_type.name if kv.elem_type else '?'} "
                            f"(rows are read from the file as they scroll into view)")

    def _size_columns(self) -> None:
        """The index column as wide as the largest index (search hits far down stay whole), the type and score
        columns as wide as their widest value; the element column takes the rest."""
        h = self.table.horizontalHeader()
        fm = self.table.fontMetrics()
        pad = 2 * self.table.style().pixelMetric(self.table.style().PixelMetric.PM_FocusFrameHMargin) + 14
        n = self.model.rowCount()
        widest = {0: [f"{max(0, n - 1):,}", "Index"]}
        for c in range(2, self.model.columnCount()):
            widest[c] = [self.model.headerData(c, Qt.Orientation.Horizontal), *self.model.widest_extra(c)]
        for c in range(self.model.columnCount()):
            if c == 1:
                h.setSectionResizeMode(c, QHeaderView.ResizeMode.Stretch)
                continue
            h.setSectionResizeMode(c, QHeaderView.ResizeMode.Fixed)
            h.resizeSection(c, max(fm.horizontalAdvance(str(t)) for t in widest[c]) + pad)

    def apply_search(self) -> None:
        kv, f = self.kv, self.file
        if kv is None or f is None or not isinstance(kv.value, StringArray):
            return
        text = self.search.text()
        if not text:
            self.model.set_indices(None)
            self.status.setText(f"{kv.key}: {plural(len(kv.value), 'element')}")
            return
        hits = find_in_strings(kv.value, text, path=str(f.path) if f.path else None)
        self.model.set_indices(hits)
        verb = "contains" if len(hits) == 1 else "contain"
        self.status.setText(f"{len(hits):,} of {plural(len(kv.value), 'element')} {verb} {text!r}")

    def go_to(self, i: int) -> None:
        row = i
        if self.model.indices is not None:
            row = int(np.searchsorted(self.model.indices, i))
            if row >= len(self.model.indices):
                return
        idx = self.model.index(row, 0)
        self.table.scrollTo(idx, QAbstractItemView.ScrollHint.PositionAtTop)
        self.table.selectRow(row)


@qt_guarded
class MetadataView(QWidget):
    """The Metadata tab: every key, and editing them (listed with undo/redo until saved with Save As)."""

    #: a saved file to open (the result of Save As)
    openRequested = Signal(str)
    #: the unsaved-changes state changed (the window title shows it)
    dirtyChanged = Signal(bool)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.doc: Document | None = None
        self.runner: TaskRunner | None = None
        self.edits: EditList | None = None
        self.edit_refusal = ""  # why this file cannot be edited ("" when it can)
        self.tokenizer: Any = None
        self.dialog: QDialog | None = None
        self.save_job: JobSlot | None = None  # the save, made with the first one (the runner comes later)
        self.current: MetadataValue | EditedValue | None = None  # the entry shown on the right
        self.model = MetadataModel()
        self.proxy = SortFilterProxy(self)
        self.proxy.setSourceModel(self.model)
        self.filter = QLineEdit()
        self.filter.setPlaceholderText("Filter keys and values (Ctrl+F)…")
        self.filter.setClearButtonEnabled(True)
        self.filter.setAccessibleName("Filter metadata")
        self.table = QTableView()
        self.table.setModel(self.proxy)
        self.table.setAccessibleName("Metadata keys")
        self.table.setSortingEnabled(True)
        self.table.sortByColumn(3, Qt.SortOrder.AscendingOrder)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(22)
        self.table.setAlternatingRowColors(True)
        self.table.setWordWrap(False)
        fit_columns(self.table, stretch=2, optional=(3,), min_stretch=100, elide=Qt.TextElideMode.ElideRight)
        self.count = QLabel()
        self.count.setObjectName("muted")

        self.detail_title = QLabel()
        self.detail_title.setObjectName("heading")
        self.detail_title.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.detail_sub = QLabel()
        self.detail_sub.setObjectName("muted")
        self.detail_sub.setWordWrap(True)
        self.text = QPlainTextEdit()
        self.text.setReadOnly(True)
        self.text.setFont(mono_font(9.5))
        self.text.setAccessibleName("Metadata value")
        self.text.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        self.highlighter: JinjaHighlighter | None = None
        self.array = ArrayView()
        self.stack = QStackedWidget()
        self.stack.addWidget(self.text)
        self.stack.addWidget(self.array)

        self.changes = QListWidget()
        self.changes.setAccessibleName("Unsaved changes")
        self.changes.setMaximumHeight(120)
        self.changes_title = QLabel()
        self.changes_title.setObjectName("heading")
        self.edit_message = QLabel()
        self.edit_message.setWordWrap(True)
        self.edit_message.setAccessibleName("Edit message")
        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        ll.addWidget(self.filter)
        ll.addWidget(self.table, 1)
        ll.addWidget(self.count)
        ll.addWidget(self.edit_message)
        ll.addWidget(self.changes_title)
        ll.addWidget(self.changes)
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.addWidget(self.detail_title)
        rl.addWidget(self.detail_sub)
        rl.addWidget(self.stack, 1)
        split = QSplitter()
        split.addWidget(left)
        split.addWidget(right)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        lay = QVBoxLayout(self)
        lay.addWidget(self._build_toolbar())
        lay.addWidget(split, 1)

        self.filter.textChanged.connect(self._filter)
        self.table.doubleClicked.connect(lambda _i: self.edit_current())
        self.array.elementActivated.connect(self.edit_element)
        self.table.selectionModel().currentRowChanged.connect(self._current_changed)
        self.exporter = Exporter(self)
        self.table.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.table.customContextMenuRequested.connect(self._context_menu)

    def row_actions(self, key: str | None) -> list[QAction]:
        """Copy key, copy value (scalars and strings in full, arrays up to 100,000 elements as JSON), copy
        ``key = value``, and export every entry as JSON."""
        f = self.doc.gguf if self.doc is not None else None
        kv = f.metadata.get(key) if f is not None and key is not None else None
        out = []
        for text, fn, ok in (
                ("Copy key", lambda: QGuiApplication.clipboard().setText(key or ""), kv is not None),
                ("Copy value", lambda: QGuiApplication.clipboard().setText(self.value_text(kv)),
                 kv is not None and self.value_copyable(kv)),
                ("Copy key = value", lambda: QGuiApplication.clipboard().setText(f"{key} = {self.value_text(kv)}"),
                 kv is not None and self.value_copyable(kv)),
                ("Export all metadata as JSON…", self.export_metadata, f is not None)):
            a = QAction(text, self)
            a.triggered.connect(fn)
            a.setEnabled(ok)
            out.append(a)
        return out

    #: the most array elements "Copy value" puts on the clipboard (larger arrays: export them)
    COPY_MAX_ELEMENTS = 100_000

    def value_copyable(self, kv: MetadataValue) -> bool:
        return kv.type != ValueType.ARRAY or len(kv.value) <= self.COPY_MAX_ELEMENTS

    @staticmethod
    def value_text(kv: MetadataValue | None) -> str:
        """A value as text: strings as they are, numbers as Python prints them, arrays as JSON."""
        if kv is None:
            return ""
        if isinstance(kv.value, str):
            return kv.value
        if kv.type == ValueType.ARRAY:
            from quantscope.core.export import plain_value
            from quantscope.core.fsutil import json_text

            return json_text(plain_value(kv.value), None)
        return format_value(kv)

    def _context_menu(self, pos: QPoint) -> None:
        idx = self.table.indexAt(pos)
        key = self.proxy.data(idx.siblingAtColumn(0), KEY_ROLE) if idx.isValid() else None
        menu = QMenu(self)
        menu.setAccessibleName(f"Actions for {key}" if key else "Metadata actions")
        for a in self.row_actions(key if isinstance(key, str) else None):
            a.setParent(menu)
            menu.addAction(a)
        self.context_menu = menu
        menu.popup(self.table.viewport().mapToGlobal(pos))

    def export_metadata(self, path: str | None = None) -> object:
        """Every entry in full and the tensor index as JSON (asks where unless ``path``)."""
        if self.doc is None or self.doc.gguf is None:
            return None
        return self.exporter.metadata(self.doc.gguf, path=path)

    # ------------------------------------------------------------------ editing
    def _build_toolbar(self) -> QToolBar:
        bar = QToolBar("Edit metadata")
        bar.setAccessibleName("Edit metadata")
        bar.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextOnly)
        self.actions_: dict[str, QAction] = {}
        for key, text, fn, keys, tip in (
                ("edit", "Edit…", self.edit_current, "F2", "Edit the selected key's value (or double click it)"),
                ("add", "Add key…", self.add_key, None, "Add a new key"),
                ("delete", "Delete", self.delete_current, "Del", "Delete the selected key"),
                ("special", "Special token…", self.edit_special_token, None,
                 "Set BOS, EOS, padding … by id or by searching the vocabulary"),
                ("template", "Chat template…", self.edit_template, None,
                 "Edit the chat template with a live rendering of a sample conversation"),
                (None, "", None, None, ""),
                ("undo", "Undo", self.undo, QKeySequence.StandardKey.Undo, "Undo the last change"),
                ("redo", "Redo", self.redo, QKeySequence.StandardKey.Redo, "Redo the undone change"),
                (None, "", None, None, ""),
                ("save", "Save as…", self.save_as, None,
                 "Write a new GGUF with the changes (the tensors are copied unchanged)")):
            if key is None:
                bar.addSeparator()
                continue
            a = QAction(text, self)
            a.setToolTip(tip)
            if keys is not None:
                a.setShortcut(QKeySequence(keys))
                a.setShortcutContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
            a.triggered.connect(lambda _c=False, f=fn: f())
            bar.addAction(a)
            self.addAction(a)
            self.actions_[key] = a
        self.dirty_label = QLabel()
        self.dirty_label.setObjectName("muted")
        self.dirty_label.setAccessibleName("Unsaved changes count")
        bar.addWidget(self.dirty_label)
        return bar

    @property
    def dirty(self) -> bool:
        """Changes applied and not saved."""
        return self.edits is not None and len(self.edits) > 0

    def _try_apply(self, op: EditOp) -> str | None:
        """Apply ``op`` (None) or say why it was refused."""
        if self.edits is None:
            return self.edit_refusal or "no file"
        try:
            self.edits.apply(op)
        except EditError as exc:
            return str(exc)
        self._refresh(getattr(op, "key", None))
        return None

    def apply_edit(self, op: EditOp) -> bool:
        """Apply ``op``, showing a refusal under the table; True when applied."""
        why = self._try_apply(op)
        self._say(why or "", bad=why is not None)
        return why is None

    def _say(self, text: str, bad: bool = False) -> None:
        colour = BAD_COLOR if bad else OK_COLOR
        self.edit_message.setText(f"<span style='color:{colour}'>{html.escape(printable(text))}</span>" if text
                                  else "")

    def _refresh(self, key: str | None = None) -> None:
        """Show the edited state: the table, the changes list, the buttons; keep (or select) ``key``."""
        keep = key or (self.current.key if self.current is not None else None)
        f = self.doc.gguf if self.doc is not None else None
        if self.edits is not None:
            items: list[Any] = [e.original if e.status == "kept" else
                                EditedValue(e.key, e.type, e.elem_type, e.python_value, e.type_label, e.status)
                                for e in self.edits.entries()]
            self.model.set_items(items)
        else:
            self.model.set_file(f)
        self._filter(self.filter.text())
        self.changes.clear()
        if self.edits is not None:
            for op in self.edits.ops:
                self.changes.addItem(op.describe())
            for op in self.edits.undone:
                item = QListWidgetItem(f"{op.describe()}  (undone)")
                item.setForeground(QColor(muted_color()))
                self.changes.addItem(item)
        n = len(self.edits) if self.edits is not None else 0
        self.changes_title.setText(f"Unsaved changes ({n})" if n else "")
        self.changes_title.setVisible(self.changes.count() > 0)
        self.changes.setVisible(self.changes.count() > 0)
        self.dirty_label.setText(f"  {plural(n, 'unsaved change')}" if n else
                                 (f"  {self.edit_refusal}" if self.edit_refusal else ""))
        self._update_actions()
        self.dirtyChanged.emit(self.dirty)
        if keep is not None and not self.select_key(keep) and self.model.rowCount():
            self.table.selectRow(0)

    def _update_actions(self) -> None:
        can = self.edits is not None
        key = self.selected_key()
        busy = self.saving
        for a in self.actions_.values():
            a.setEnabled(can and not busy)
        if can:
            self.actions_["edit"].setEnabled(not busy and key is not None)
            self.actions_["delete"].setEnabled(not busy and key is not None and key != "general.architecture")
            self.actions_["undo"].setEnabled(not busy and self.edits.can_undo)  # type: ignore[union-attr]
            self.actions_["redo"].setEnabled(not busy and self.edits.can_redo)  # type: ignore[union-attr]
            self.actions_["save"].setEnabled(not busy)
        for a in self.actions_.values():  # a disabled action says why
            a.setToolTip(a.toolTip().split(" — ")[0] + (f" — {self.edit_refusal}" if self.edit_refusal else ""))

    def selected_key(self) -> str | None:
        idx = self.table.currentIndex()
        key = self.proxy.data(idx.siblingAtColumn(0), KEY_ROLE) if idx.isValid() else None
        return key if isinstance(key, str) else None

    def _open(self, dlg: QDialog) -> QDialog:
        """Show an editor (non-modal to the rest of the app, one at a time)."""
        if self.dialog is not None:
            self.dialog.close()
        self.dialog = dlg
        dlg.setWindowModality(Qt.WindowModality.WindowModal)
        dlg.show()
        return dlg

    def edit_current(self) -> QDialog | None:
        """Edit the selected key: its value (arrays: the selected element when one is chosen)."""
        key = self.selected_key()
        if self.edits is None or key is None:
            return None
        return self._open(ValueDialog(self.edits.state, key, self._try_apply, self))

    def edit_element(self, index: int) -> QDialog | None:
        key = self.current.key if self.current is not None else None
        if self.edits is None or key is None:
            return None
        t = self.edits.state.type_of(key)
        if t is None or t[0] != ValueType.ARRAY or t[1] in (None, ValueType.ARRAY):
            return None
        return self._open(ElementDialog(self.edits.state, key, index, self._try_apply, self))

    def add_key(self) -> QDialog | None:
        if self.edits is None:
            return None
        return self._open(ValueDialog(self.edits.state, None, self._try_apply, self))

    def delete_current(self) -> bool:
        key = self.selected_key()
        return key is not None and self.edits is not None and self.apply_edit(DeleteKey(key))

    def edit_special_token(self, name: str = "eos") -> QDialog | None:
        if self.edits is None:
            return None
        return self._open(SpecialTokenDialog(self.edits.state, self._try_apply, name, self))

    def edit_template(self) -> QDialog | None:
        """The template editor; the file's tokenizer is read (once, in a worker) for the token ids."""
        if self.edits is None or self.runner is None:
            return None
        dlg = TemplateDialog(self.edits.state, self.runner, self.tokenizer, self._try_apply, self)
        if self.tokenizer is None and self.doc is not None and self.doc.gguf is not None:
            path = self.doc.path

            def loaded(tok: Any) -> None:
                self.tokenizer = tok
                if self.dialog is dlg:
                    dlg.tokenizer = tok
                    dlg.special_hl.set_specials([tok.pieces[i] for i in tok.special_ids])
                    dlg.render_sample()

            def read(_r: Any, _t: Any) -> Any:
                from quantscope.core.tokenizer import Tokenizer

                from ..chat_engine import gc_paused

                f = GGUFFile(path)
                with gc_paused():
                    return Tokenizer(f)

            def failed(msg: str, _tb: str) -> None:
                dlg.tokenizer_error = msg  # (a render ending later keeps saying it)
                _status_line(dlg.render_status, False, f"no token ids: {msg}")

            self.runner.start("tokenizer-edit", read, on_done=loaded, on_failed=failed)
        return self._open(dlg)

    def undo(self) -> None:
        if self.edits is not None and self.edits.undo() is not None:
            self._refresh()

    def redo(self) -> None:
        if self.edits is not None and self.edits.redo() is not None:
            self._refresh()

    def discard_edits(self) -> None:
        if self.edits is not None and self.doc is not None and self.doc.gguf is not None:
            self.edits = EditList(self.doc.gguf)
            self._refresh()

    # ------------------------------------------------------------------ saving
    @property
    def saving(self) -> bool:
        """Whether the edited file is being written."""
        return self.save_job is not None and self.save_job.busy

    def save_as(self, path: str | None = None, confirm: Callable[[str], bool] | None = None) -> Any:
        """Write the edited file (asks where unless ``path``) in the runner, then open it. Writing over the open file
        asks first (``confirm``, default a question box), and then still goes through a temporary and a rename."""
        if self.edits is None or self.doc is None or self.doc.gguf is None or self.runner is None:
            return None
        src = Path(self.doc.path)
        if path is None:
            path, _ = QFileDialog.getSaveFileName(self, "Save the edited file as", str(
                output_path(src, f"{src.stem}-edited.gguf")), "GGUF files (*.gguf);;All files (*)")
            if not path:
                return None
        same = _same_file(path, src)
        if same:
            ask = confirm or self._confirm_overwrite
            if not ask(path):
                return None
        f, ops = self.doc.gguf, self.edits.ops
        out = path

        def work(report: Callable[..., None], token: Any) -> Any:
            return save_edited(f, out, ops, progress=lambda d, t: report(d, t, f"saving {Path(out).name}"),
                               cancel=token, overwrite_source=same)

        def done(r: Any) -> None:
            self.edits = EditList(f)  # saved: what is open next is the file with the changes
            self._refresh()
            self._say(f"Saved {r.path} ({r.plan.file_bytes:,} bytes)")
            self.openRequested.emit(str(r.path))

        def failed(msg: str, _tb: str) -> None:
            self._say(f"Saving failed: {msg}", bad=True)

        def cancelled() -> None:
            self._say("Saving cancelled: nothing was written")

        if self.save_job is None or self.save_job.runner is not self.runner:
            self.save_job = JobSlot(self.runner, self, on_busy=lambda _busy: self._update_actions())
        return self.save_job.start("save-metadata", work, on_done=done, on_failed=failed, on_cancelled=cancelled)

    def _confirm_overwrite(self, path: str) -> bool:
        box = QMessageBox(QMessageBox.Icon.Warning, "Overwrite the open file?",
                          f"{path} is the file that is open. Write the edited file over it?",
                          QMessageBox.StandardButton.Cancel, self)
        box.setInformativeText("The new file is written beside it and renamed over it when complete; the open file "
                               "is reopened afterwards.")
        over = box.addButton("Overwrite", QMessageBox.ButtonRole.DestructiveRole)
        box.exec()
        return box.clickedButton() is over

    def set_document(self, doc: Document | None) -> None:
        self.doc = doc
        self.edits = None
        self.tokenizer = None
        self.current = None
        self.edit_refusal = ""
        if self.dialog is not None:
            self.dialog.close()
            self.dialog = None
        f = doc.gguf if doc else None
        if f is not None and getattr(f, "is_split", False):
            self.edit_refusal = ("a model split in several files is not edited as a set: open its first file alone "
                                 "to edit the metadata")
        elif f is not None and doc is not None and doc.remote is not None:
            self.edit_refusal = ("a file on the hub is not edited here: saving copies every tensor, which needs the "
                                 "whole file (Download it)")
        elif f is not None:
            self.edits = EditList(f)
        self._say("")
        self._refresh()
        if doc is not None and doc.gguf is not None:
            key = "tokenizer.chat_template" if "tokenizer.chat_template" in doc.gguf else "general.architecture"
            self.select_key(key)

    def _filter(self, text: str) -> None:
        self.proxy.setFilterFixedString(text)
        self.count.setText(f"{self.proxy.rowCount():,} of {plural(self.model.rowCount(), 'key')}")

    def select_key(self, key: str) -> bool:
        """Select ``key`` in the table (clearing a filter that hides it) and show its value."""
        for row in range(self.model.rowCount()):
            if self.model.item(row).key == key:
                idx = self.proxy.mapFromSource(self.model.index(row, 0))
                if not idx.isValid():
                    self.filter.clear()
                    idx = self.proxy.mapFromSource(self.model.index(row, 0))
                self.table.selectRow(idx.row())
                self.table.scrollTo(idx)
                self.show_value(self.model.item(row))
                return True
        return False

    def _current_changed(self, current: QModelIndex, _prev: QModelIndex) -> None:
        if not current.isValid() or self.doc is None:
            return
        src = self.proxy.mapToSource(current)
        if self.doc.gguf is not None and 0 <= src.row() < self.model.rowCount():
            self.show_value(self.model.item(src.row()))
        self._update_actions()

    def show_value(self, kv: MetadataValue | EditedValue) -> None:
        assert self.doc is not None and self.doc.gguf is not None
        self.current = kv
        self.detail_title.setText(kv.key)
        if isinstance(kv, EditedValue):
            sub = f"{kv.type_label} · {'added' if kv.status == 'added' else 'edited'}, not saved yet"
        else:
            sub = (f"{kv.type_label} · entry at byte {kv.offset:,}, value at {kv.value_offset:,} "
                   f"({kv.end - kv.offset:,} bytes)")
        if kv.type == ValueType.ARRAY:
            self.detail_sub.setText(sub)
            self.array.set_array(kv, self.doc.gguf)
            self.stack.setCurrentWidget(self.array)
            return
        if self.highlighter is not None:
            self.highlighter.setDocument(None)
            self.highlighter = None
        if isinstance(kv.value, str):
            self.text.setPlainText(kv.value)
            if kv.key.endswith("chat_template") or "{%" in kv.value:
                self.highlighter = JinjaHighlighter(self.text.document())
                sub += " · Jinja chat template (highlighted; shown, never executed)"
            else:
                sub += f" · {len(kv.value):,} characters"
        else:
            self.text.setPlainText(format_value(kv))
        self.detail_sub.setText(sub)
        self.stack.setCurrentWidget(self.text)
