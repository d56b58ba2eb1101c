"""Metadata: a searchable, sortable table of every key; the selected value in full beside it: long arrays in a
lazy table (the 262k-entry vocabulary scrolls and searches instantly), text and the chat template with syntax
highlighting."""

from __future__ import annotations

import re

import numpy as np
from PySide6.QtCore import QModelIndex, Qt, QTimer
from PySide6.QtGui import QColor, QFont, QSyntaxHighlighter, QTextCharFormat, QTextDocument
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QSpinBox,
    QSplitter,
    QStackedWidget,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from quantscope.core.analysis import find_in_strings
from quantscope.core.gguf import GGUFFile, MetadataValue, StringArray, ValueType
from quantscope.core.summary import format_value

from ..document import Document
from ..models import KEY_ROLE, ArrayModel, MetadataModel, SortFilterProxy, plural
from ..theme import is_dark
from ..widgets.blockwidgets import mono_font
from ..widgets.fit import fit_columns


class JinjaHighlighter(QSyntaxHighlighter):
    """Jinja2 template highlighting: ``{% statements %}``, ``{{ expressions }}``, ``{# comments #}``, strings,
    keywords, and the special tokens (``<|im_start|>``, ``<start_of_turn>``...) that chat templates emit."""

    KEYWORDS = ("for", "endfor", "if", "elif", "else", "endif", "set", "endset", "in", "not", "and", "or", "is",
                "macro", "endmacro", "call", "endcall", "filter", "endfilter", "raise_exception", "loop",
                "namespace", "true", "false", "none", "True", "False", "None", "defined", "length")

    def __init__(self, doc: QTextDocument) -> None:
        super().__init__(doc)
        dark = is_dark()

        def fmt(color: str, bold: bool = False, italic: bool = False) -> QTextCharFormat:
            f = QTextCharFormat()
            f.setForeground(QColor(color))
            if bold:
                f.setFontWeight(QFont.Weight.Bold)
            f.setFontItalic(italic)
            return f

        self.delim = fmt("#c586c0" if dark else "#a626a4", bold=True)
        self.expr = fmt("#9cdcfe" if dark else "#0550ae")
        self.keyword = fmt("#569cd6" if dark else "#cf222e", bold=True)
        self.string = fmt("#ce9178" if dark else "#0a7d32")
        self.comment = fmt("#6a9955" if dark else "#6e7781", italic=True)
        self.special = fmt("#dcdcaa" if dark else "#953800", bold=True)
        self.tag_re = re.compile(r"(\{%-?|-?%\}|\{\{-?|-?\}\}|\{#.*?#\})")
        self.block_re = re.compile(r"\{%-?.*?-?%\}|\{\{-?.*?-?\}\}", re.S)
        self.kw_re = re.compile(r"\b(" + "|".join(self.KEYWORDS) + r")\b")
        self.str_re = re.compile(r"'[^'\n]*'|\"[^\"\n]*\"")
        self.special_re = re.compile(r"<\|?[A-Za-z_/][\w/|]*\|?>|\[/?INST\]|<s>|</s>")

    def highlightBlock(self, text: str) -> None:
        for m in self.special_re.finditer(text):
            self.setFormat(m.start(), m.end() - m.start(), self.special)
        for m in self.block_re.finditer(text):
            a, b = m.start(), m.end()
            self.setFormat(a, b - a, self.expr)
            inner = text[a:b]
            for k in self.kw_re.finditer(inner):
                self.setFormat(a + k.start(), k.end() - k.start(), self.keyword)
            for s in self.str_re.finditer(inner):
                self.setFormat(a + s.start(), s.end() - s.start(), self.string)
        for m in self.tag_re.finditer(text):
            is_comment = m.group(0).startswith("{#")
            self.setFormat(m.start(), m.end() - m.start(), self.comment if is_comment else self.delim)


class ArrayView(QWidget):
    """A metadata array in a lazy table, with search (string arrays) and go-to-index."""

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


class MetadataView(QWidget):
    """The Metadata tab."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.doc: Document | None = None
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

        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        ll.addWidget(self.filter)
        ll.addWidget(self.table, 1)
        ll.addWidget(self.count)
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
        lay.addWidget(split)

        self.filter.textChanged.connect(self._filter)
        self.table.selectionModel().currentRowChanged.connect(self._current_changed)

    def set_document(self, doc: Document | None) -> None:
        self.doc = doc
        self.model.set_file(doc.gguf if doc else None)
        self._filter(self.filter.text())
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
        key = self.proxy.data(current, KEY_ROLE)
        if key is not None and self.doc.gguf is not None:
            self.show_value(self.doc.gguf.metadata[key])

    def show_value(self, kv: MetadataValue) -> None:
        assert self.doc is not None and self.doc.gguf is not None
        self.current = kv
        self.detail_title.setText(kv.key)
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
