"""The library: every GGUF already on this machine (core/library.py: the Hugging Face cache, LM Studio, Ollama,
llama.cpp's cache, GPT4All, the folders the user adds), scanned in a worker from the headers only, filterable and
sortable; a row opens in the app, in the chat, in the server or in the quantize dialog. Nothing is copied."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, QSortFilterProxyModel, Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QInputDialog,
    QLabel,
    QLineEdit,
    QPushButton,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from quantscope.core import library
from quantscope.core.fsutil import printable
from quantscope.core.summary import human_bytes, params_text

from ..guard import qt_guarded
from ..widgets.fit import ElidedLabel
from ..widgets.jobstrip import JobStrip
from ..workers import JobSlot, TaskRunner

COLUMNS = ("Name", "Source", "Architecture", "Parameters", "Type", "Size", "Shards", "Location")
#: what a row's buttons ask the window for
ACTIONS = (("open", "Open"), ("chat", "Chat"), ("serve", "Serve"), ("quantize", "Quantize…"))
_Index = QModelIndex | QPersistentModelIndex


@qt_guarded
class LibraryModel(QAbstractTableModel):
    """The scan's rows; the display role is text, the user role the value sorted on."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.rows: list[library.Entry] = []

    def set_rows(self, rows: list[library.Entry]) -> None:
        self.beginResetModel()
        self.rows = list(rows)
        self.endResetModel()

    def rowCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: B008 - Qt's signature
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation,
                   role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section]
        return None

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        e = self.rows[index.row()]
        col = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return self._text(e, col)
        if role == Qt.ItemDataRole.UserRole:
            return (e.name.lower(), library.KINDS.index(e.source) if e.source in library.KINDS else 99,
                    e.architecture or "", e.parameters or 0, e.file_type or "", e.size, e.shards, e.path)[col]
        if role == Qt.ItemDataRole.ToolTipRole:
            tip = f"{printable(e.path)}\n{library.LABELS.get(e.source, e.source)}: {printable(e.store)}"
            return f"{tip}\n⚠ {printable(e.problem)}" if e.problem else tip
        if role == Qt.ItemDataRole.TextAlignmentRole and col in (3, 5, 6):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None

    @staticmethod
    def _text(e: library.Entry, col: int) -> str:
        if col == 0:
            return printable(e.name) + ("  ⚠" if e.problem else "")
        if col == 1:
            return library.LABELS.get(e.source, e.source)
        if col == 2:
            return printable(e.architecture or "–")
        if col == 3:
            return params_text(e.parameters)
        if col == 4:
            return printable(e.file_type or "–")
        if col == 5:
            return human_bytes(e.size)
        if col == 6:
            return str(e.shards)
        return printable(str(Path(e.path).parent))


@qt_guarded
class LibraryFilter(QSortFilterProxyModel):
    """Rows whose name, source, architecture or type holds every word of the filter."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.words: list[str] = []
        self.setSortRole(Qt.ItemDataRole.UserRole)

    def set_text(self, text: str) -> None:
        self.beginFilterChange()
        self.words = text.lower().split()
        self.endFilterChange(QSortFilterProxyModel.Direction.Rows)

    def filterAcceptsRow(self, row: int, parent: _Index) -> bool:
        src = self.sourceModel()
        assert isinstance(src, LibraryModel)
        e = src.rows[row]
        hay = " ".join((e.name, library.LABELS.get(e.source, e.source), e.architecture or "", e.file_type or "",
                        e.path)).lower()
        return all(w in hay for w in self.words)


@qt_guarded
class LibraryView(QWidget):
    """The models on this machine. ``actionRequested(path, action)``: a row's Open, Chat, Serve or Quantize."""

    actionRequested = Signal(str, str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Library")
        # its own worker: a scan reads other files than the open one, so opening or closing a file (which cancels
        # the window's jobs) does not stop it, and the window's file checks do not apply to it
        self.runner = TaskRunner(self, max_threads=1)
        self.job = JobSlot(self.runner, self, on_busy=self._busy)
        self.scanned = False
        self._build_header()
        self._build_table()
        self._build_actions()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(12, 10, 12, 10)
        lay.addWidget(self.intro)
        lay.addLayout(self.tools)
        lay.addWidget(self.strip)
        lay.addWidget(self.empty)
        lay.addWidget(self.table, 1)
        lay.addLayout(self.buttons)
        self._selection_changed()

    # -- construction ----------------------------------------------------------------------------------------
    def _build_header(self) -> None:
        self.intro = QLabel("<b>Models on this machine</b> — open a GGUF or bump file with File ▸ Open (Ctrl+O) or "
                            "by dropping it here, or pick one the usual tools keep (Hugging Face cache, LM Studio, "
                            "Ollama, llama.cpp, GPT4All, your folders). Nothing is copied.")
        self.intro.setWordWrap(True)
        self.filter = QLineEdit()
        self.filter.setPlaceholderText("Filter by name, source, architecture or type")
        self.filter.setAccessibleName("Filter models")
        self.filter.setClearButtonEnabled(True)
        self.filter.textChanged.connect(self._filter_changed)
        self.add_btn = QPushButton("Add folder…")
        self.add_btn.setAccessibleName("Add a folder to the library")
        self.add_btn.clicked.connect(self.add_folder)
        self.remove_btn = QPushButton("Remove folder…")
        self.remove_btn.setAccessibleName("Remove a folder from the library")
        self.remove_btn.clicked.connect(self.remove_folder)
        self.tools = QHBoxLayout()
        self.tools.addWidget(self.filter, 1)
        self.tools.addWidget(self.add_btn)
        self.tools.addWidget(self.remove_btn)
        self.strip = JobStrip("library scan", "Rescan", status_text="Not scanned yet", disable_run=True)
        self.strip.run_clicked.connect(self.scan)
        self.strip.cancel_clicked.connect(lambda: self.job.cancel())

    def _build_table(self) -> None:
        self.model = LibraryModel(self)
        self.proxy = LibraryFilter(self)
        self.proxy.setSourceModel(self.model)
        self.table = QTableView()
        self.table.setAccessibleName("Models found")
        self.table.setModel(self.proxy)
        self.table.setSortingEnabled(True)
        self.table.sortByColumn(1, Qt.SortOrder.AscendingOrder)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.setWordWrap(False)
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)  # names and folders keep both ends
        h = self.table.horizontalHeader()
        h.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        h.setStretchLastSection(True)
        self.table.doubleClicked.connect(lambda _i: self._act("open"))
        self.table.activated.connect(lambda _i: self._act("open"))
        self.table.selectionModel().selectionChanged.connect(lambda *_: self._selection_changed())
        self.empty = QLabel()
        self.empty.setWordWrap(True)
        self.empty.setObjectName("muted")
        self.empty.hide()

    def _build_actions(self) -> None:
        self.action_btns: dict[str, QPushButton] = {}
        self.buttons = QHBoxLayout()
        self.selected_label = ElidedLabel(mode=Qt.TextElideMode.ElideMiddle)
        self.selected_label.setObjectName("muted")
        self.selected_label.setAccessibleName("Selected model")
        self.buttons.addWidget(self.selected_label, 1)
        for key, text in ACTIONS:
            b = QPushButton(text)
            b.setAccessibleName(f"{text.rstrip('…')} the selected model")
            b.clicked.connect(lambda _c=False, k=key: self._act(k))
            self.buttons.addWidget(b)
            self.action_btns[key] = b

    # -- scanning --------------------------------------------------------------------------------------------
    def showEvent(self, event: Any) -> None:
        super().showEvent(event)
        if not self.scanned and not self.job.busy:
            self.scan()

    def scan(self) -> None:
        """Scan every store in a worker (headers only; unchanged files come from the scan cache)."""
        self.scanned = True
        try:
            places = library.stores()
        except library.LibraryError as exc:
            self.strip.failed(f"Library: {exc}")
            return
        self.strip.started("Scanning the library…")

        def work(report, token):  # type: ignore[no-untyped-def]
            return library.scan(places, progress=lambda n, name: report(n, 0, name),
                                cancelled=lambda: token.cancelled)

        self.job.start("library-scan", work, on_done=lambda rows: self._done(places, rows),
                       on_progress=lambda n, _t, name: self.strip.set_status(f"Scanning… {n} read: {printable(name)}"),
                       on_failed=lambda m, _tb: self.strip.failed(f"Library scan failed: {m}"),
                       on_cancelled=lambda: self.strip.cancelled("Library scan cancelled."))

    def _busy(self, busy: bool) -> None:
        self.strip.set_busy(busy)

    def _done(self, places: list[library.Store], rows: list[library.Entry]) -> None:
        self.places = places
        self.model.set_rows(rows)
        self.table.resizeColumnsToContents()
        for col, most in ((0, 420), (7, 360)):
            if self.table.columnWidth(col) > most:
                self.table.setColumnWidth(col, most)
        where = ", ".join(f"{s.label}" for s in places)
        n = len(rows)
        self.strip.finished(f"{n} model{'s' * (n != 1)} in {where}" if places else
                            "None of the usual places exists on this machine")
        if not rows:
            checked = "; ".join(f"{s.label}: {printable(s.root)}" for s in library.store_places())
            self.empty.setText(f"No GGUF found. Looked in {checked}. Add a folder that holds models, or open a file "
                               "with File ▸ Open.")
        self.empty.setVisible(not rows)
        self._selection_changed()

    def shutdown(self, timeout_ms: int = 30000) -> bool:
        """Cancel a scan and wait for its worker (the window is closing)."""
        return self.runner.shutdown(timeout_ms)

    # -- folders ---------------------------------------------------------------------------------------------
    def add_folder(self) -> None:
        d = QFileDialog.getExistingDirectory(self, "Add a folder to the library")
        if not d:
            return
        try:
            library.add_folder(d)
        except (library.LibraryError, OSError) as exc:
            self.strip.failed(f"Could not add {printable(d)}: {exc}")
            return
        self.scan()

    def remove_folder(self) -> None:
        try:
            folders = [str(f) for f in library.user_folders()]
        except library.LibraryError as exc:
            self.strip.failed(str(exc))
            return
        if not folders:
            self.strip.set_status("No folder was added to the library.")
            return
        item, ok = QInputDialog.getItem(self, "Remove a folder", "Folder:", folders, 0, False)
        if ok and item:
            library.remove_folder(item)
            self.scan()

    # -- rows --------------------------------------------------------------------------------------------------
    def _filter_changed(self, text: str) -> None:
        self.proxy.set_text(text)
        self._selection_changed()

    def selected(self) -> library.Entry | None:
        rows = self.table.selectionModel().selectedRows()
        if not rows:
            return None
        return self.model.rows[self.proxy.mapToSource(rows[0]).row()]

    def _selection_changed(self) -> None:
        e = self.selected()
        for b in self.action_btns.values():
            b.setEnabled(e is not None and e.architecture is not None)
        self.selected_label.setText("" if e is None else
                                    f"{printable(e.name)} · {printable(e.path)}")

    def _act(self, action: str) -> None:
        e = self.selected()
        if e is not None and e.architecture is not None:
            self.actionRequested.emit(e.path, action)
