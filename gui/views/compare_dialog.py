"""Tools ▸ Quality on a text (KL divergence)…: measure a quant's quality. The open GGUF and another one of the same
model (or a llama-perplexity KL-divergence base file) score a text in a worker (core/engine/compare.py); the dialog
shows both perplexities, the KL divergence figures and top-1 agreement, the text coloured token by token by KL
divergence, a histogram of it and the positions where the two models differ most."""

from __future__ import annotations

import bisect
import html
import math
import re
import sys
from pathlib import Path
from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import QAbstractTableModel, QEvent, QModelIndex, QPersistentModelIndex, QPoint, Qt, QUrl, Signal
from PySide6.QtGui import QColor, QFont, QHelpEvent, QTextCharFormat, QTextCursor, QTextDocument
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QSpinBox,
    QSplitter,
    QTableView,
    QTextBrowser,
    QToolTip,
    QVBoxLayout,
    QWidget,
)

from quantscope.core.bump import Cancelled
from quantscope.core.engine.compare import CompareCancelled, CompareResult, TokenScore, compare_models
from quantscope.core.fsutil import printable
from quantscope.core.jobs import RateMeter, format_duration

from ..guard import qt_guarded
from ..theme import BAD_COLOR, KLD_BINS, KLD_COLORS, KLD_TEXT_COLORS, kld_bin, muted_color
from ..widgets.fit import ElidedLabel, fit_columns
from ..widgets.jobstrip import JobStrip
from ..widgets.paths import browse_row
from ..widgets.plots import CompactPlot
from ..workers import JobSlot, Task, TaskRunner
from .overview import Card

SAMPLE_TEXT = "sample-text.txt"
DEFAULT_CTX = 512
MAX_CTX_CHOICE = 1 << 17
WORST_ROWS = 50
_WORST_COLS = ("KLD", "Position", "Token", "Base top-1", "Quant top-1")
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f]")
_Index = QModelIndex | QPersistentModelIndex
_ROOT = QModelIndex()


def sample_text_path() -> Path | None:
    """The bundled sample text (resources/, beside the package or inside a frozen app)."""
    for p in (Path(__file__).resolve().parent.parent.parent / "resources" / SAMPLE_TEXT,
              Path(getattr(sys, "_MEIPASS", "")) / "resources" / SAMPLE_TEXT):
        if p.is_file():
            return p
    return None


def sample_text() -> str:
    p = sample_text_path()
    try:
        return p.read_text(encoding="utf-8") if p is not None else ""
    except (OSError, UnicodeDecodeError):
        return ""


def shown_piece(piece: str) -> str:
    """A token's text as the coloured text shows it: control characters (but newline and tab) as their Unicode
    pictures, one character each, so the text keeps its length."""
    return _CONTROL.sub(lambda m: "␡" if m.group() == "\x7f" else chr(0x2400 + ord(m.group())), piece)


def _quoted(text: str) -> str:
    """A token's text in quotes, control characters escaped visibly (``\\n``), bytes that are no character on
    their own as core wrote them (``\\xNN``)."""
    return f"'{printable(text)}'"


def token_details(r: CompareResult, t: TokenScore) -> str:
    """What the tool tip (and the line under the text) says of a scored position."""
    agree = "the same top-1" if t.base_top1 == t.quant_top1 else "different top-1 tokens"
    return (f"KLD {t.kld:.6f} nats at position {t.position:,} (token {_quoted(t.piece)}, id {t.token_id}); "
            f"{agree}\n"
            f"base:  log p {t.base_logp:.4f} (p {math.exp(t.base_logp):.4g}), top-1 "
            f"{_quoted(r.token_text.get(t.base_top1, ''))} (id {t.base_top1})\n"
            f"quant: log p {t.quant_logp:.4f} (p {math.exp(t.quant_logp):.4g}), top-1 "
            f"{_quoted(r.token_text.get(t.quant_top1, ''))} (id {t.quant_top1})")


def _ppl(v: float) -> str:
    return f"{v:.4f}" if v < 1e4 else f"{v:.5g}"


def _legend_labels() -> list[str]:
    bounds = ["0", *(f"{b:g}" for b in KLD_BINS)]
    return [f"< {bounds[i + 1]}" if i < len(KLD_BINS) else f"≥ {bounds[-1]}" for i in range(len(KLD_COLORS))]


@qt_guarded
class TokenText(QTextBrowser):
    """The compared text, one span per token: scored positions on a background coloured by KL divergence (an
    anchor ``tok:INDEX`` into ``result.tokens``), the context that is only read dimmed. Hovering a token shows its
    figures; clicking it, or moving the caret onto it with the keyboard, makes it current (``tokenChosen``)."""

    tokenChosen = Signal(int)  # index into result.tokens

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.result: CompareResult | None = None
        self.starts: list[int] = []  # document position of each context token
        self.ends: list[int] = []
        self.index_of: dict[int, int] = {}  # context position -> index into result.tokens
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse
                                     | Qt.TextInteractionFlag.TextSelectableByKeyboard
                                     | Qt.TextInteractionFlag.LinksAccessibleByMouse)
        self.anchorClicked.connect(self._clicked)
        self.cursorPositionChanged.connect(self._caret_moved)
        self._choosing = False

    def clear_result(self, html_text: str = "") -> None:
        self.result = None
        self.starts, self.ends, self.index_of = [], [], {}
        self.setHtml(html_text)

    def set_result(self, r: CompareResult) -> None:
        """Build the coloured document (one fragment per token: each scored one carries its own anchor)."""
        doc = QTextDocument(self)
        doc.setUndoRedoEnabled(False)
        doc.setDefaultFont(self.font())
        base = [QTextCharFormat() for _ in KLD_COLORS]
        for f, bg, fg in zip(base, KLD_COLORS, KLD_TEXT_COLORS, strict=True):
            f.setBackground(QColor(bg))
            f.setForeground(QColor(fg))
            f.setAnchor(True)
        dim = QTextCharFormat()
        dim.setForeground(muted_color())
        index_of = {t.position: i for i, t in enumerate(r.tokens)}
        starts: list[int] = []
        ends: list[int] = []
        cur = QTextCursor(doc)
        cur.beginEditBlock()
        for p, (_tid, piece) in enumerate(r.context):
            text = shown_piece(piece)
            starts.append(cur.position())
            i = index_of.get(p)
            if i is None:
                cur.insertText(text, dim)
            else:
                f = QTextCharFormat(base[kld_bin(r.tokens[i].kld)])
                f.setAnchorHref(f"tok:{i}")
                f.setToolTip("")  # the view's own tool tip (see viewportEvent) says more
                cur.insertText(text, f)
            ends.append(cur.position())
        cur.endEditBlock()
        self.result = r
        self.starts, self.ends, self.index_of = starts, ends, index_of
        self.setDocument(doc)

    # ------------------------------------------------------------------ positions
    def token_range(self, i: int) -> tuple[int, int]:
        """Document positions [start, end) of scored token ``i``."""
        assert self.result is not None
        p = self.result.tokens[i].position
        return self.starts[p], self.ends[p]

    def token_at(self, point: QPoint) -> int | None:
        """The scored token under a viewport point (None over context, margins or nothing)."""
        href = self.anchorAt(point)
        if href.startswith("tok:") and self.result is not None:
            i = int(href[4:])
            return i if 0 <= i < len(self.result.tokens) else None
        return None

    def tooltip_for(self, i: int) -> str:
        assert self.result is not None
        return token_details(self.result, self.result.tokens[i])

    def viewportEvent(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ToolTip and isinstance(event, QHelpEvent):
            i = self.token_at(event.pos())
            if i is None:
                QToolTip.hideText()
                event.ignore()
            else:
                QToolTip.showText(event.globalPos(), self.tooltip_for(i), self.viewport())
            return True
        return super().viewportEvent(event)

    def show_token(self, i: int) -> None:
        """Select scored token ``i`` and scroll it into the middle of the view."""
        if self.result is None or not 0 <= i < len(self.result.tokens):
            return
        a, b = self.token_range(i)
        cur = QTextCursor(self.document())
        cur.setPosition(a)
        cur.setPosition(b, QTextCursor.MoveMode.KeepAnchor)
        self._choosing = True
        try:
            self.setTextCursor(cur)
        finally:
            self._choosing = False
        self.ensureCursorVisible()
        rect = self.cursorRect(cur)
        bar = self.verticalScrollBar()
        bar.setValue(bar.value() + rect.center().y() - self.viewport().height() // 2)
        self.tokenChosen.emit(i)

    def _clicked(self, url: QUrl) -> None:
        s = url.toString()
        if s.startswith("tok:"):
            self.show_token(int(s[4:]))

    def _caret_moved(self) -> None:
        if self._choosing or self.result is None:
            return
        pos = self.textCursor().position()
        p = bisect.bisect_right(self.starts, pos) - 1
        if 0 <= p < len(self.starts) and pos < self.ends[p] and p in self.index_of:
            self.tokenChosen.emit(self.index_of[p])


@qt_guarded
class WorstModel(QAbstractTableModel):
    """The positions of largest KL divergence: KLD (on its colour), position, token, both top-1 tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int, TokenScore, tuple[str, ...]]] = []  # (index into result.tokens, score, cells)

    def set_result(self, r: CompareResult | None, n: int) -> None:
        self.beginResetModel()
        self.rows = []
        if r is not None:
            index_of = {t.position: i for i, t in enumerate(r.tokens)}
            for t in r.worst(n):
                cells = (f"{t.kld:.5f}", f"{t.position:,}", _quoted(t.piece),
                         _quoted(r.token_text.get(t.base_top1, "")), _quoted(r.token_text.get(t.quant_top1, "")))
                self.rows.append((index_of[t.position], t, cells))
        self.endResetModel()

    def rowCount(self, parent: _Index = _ROOT) -> int:
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent: _Index = _ROOT) -> int:
        return 0 if parent.isValid() else len(_WORST_COLS)

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        i, t, cells = self.rows[index.row()]
        col = index.column()
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.ToolTipRole):
            return cells[col]
        if role == Qt.ItemDataRole.UserRole:
            return i
        if role == Qt.ItemDataRole.TextAlignmentRole and col < 2:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.BackgroundRole and col == 0:
            return QColor(KLD_COLORS[kld_bin(t.kld)])
        if role == Qt.ItemDataRole.ForegroundRole and col == 0:
            return QColor(KLD_TEXT_COLORS[kld_bin(t.kld)])
        return None

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return _WORST_COLS[section]
        return None



@qt_guarded
class CompareDialog(QDialog):
    """Compares the open file (``doc_path``) with another one in a worker; ``compareFinished`` carries the
    :class:`CompareResult` (None when cancelled or failed)."""

    compareFinished = Signal(object)

    def __init__(self, doc_path: Path, runner: TaskRunner, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle(f"Compare {doc_path.name} with…")
        self.setAccessibleName("Compare")
        self.doc_path = doc_path
        self.runner = runner
        self.task: Task | None = None
        self.job_slot = JobSlot(self.runner, self)  # the job and its callbacks, connected before it is queued
        self.result: CompareResult | None = None
        self.error: str | None = None
        self.state = "idle"  # idle | running | done | cancelled | failed
        self.meter = RateMeter()
        self._phases: tuple[str, ...] = ("base", "quant", "chunk")
        self._sample = sample_text()

        self.split = self._build_split(self._build_setup(doc_path), self._build_results())
        buttons = QDialogButtonBox()
        self.close_btn = buttons.addButton("Close", QDialogButtonBox.ButtonRole.RejectRole)
        self.close_btn.clicked.connect(self.close)
        lay = QVBoxLayout(self)
        lay.addWidget(self.split, 1)
        lay.addWidget(buttons)
        self.resize(1280, 820)

        self.role.currentIndexChanged.connect(self._role_changed)
        self.kld_base.toggled.connect(self._kld_toggled)
        self.text_source.currentIndexChanged.connect(self._source_changed)
        self.text_edit.textChanged.connect(self._typed_changed)
        self._role_changed()
        self._source_changed()
        self._clear_figures()
        self.text.clear_result(self._placeholder())

    # ------------------------------------------------------------------ construction
    def _build_setup(self, doc_path: Path) -> QWidget:
        """The left column: the options, the job strip and the rate."""
        self._build_options(doc_path)
        self._build_strip()
        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        ll.addWidget(self.setup, 1)
        ll.addWidget(self.strip)
        ll.addWidget(self.rate)
        return left

    def _build_options(self, doc_path: Path) -> None:
        """The files, the text and the numbers (``self.setup``, greyed while a comparison runs)."""
        self.role = QComboBox()
        self.role.setAccessibleName("The open file is the")
        self.role.addItem("base (the reference)", "base")
        self.role.addItem("quant (the one measured)", "quant")
        self.other = QLineEdit()
        self.other.setAccessibleName("Other file")
        self.other.setPlaceholderText("a GGUF of the same model")
        other_row, self.other_browse = browse_row(
            self.other, "Other file", "GGUF or KLD base (*.gguf *.kld *.bin);;All files (*)", self, save=False,
            accessible="Browse for the other file")
        self.kld_base = QCheckBox("The base is a llama-perplexity KLD file")
        self.kld_base.setAccessibleName("The base is a KL-divergence base file")
        self.kld_base.setToolTip("A file written by llama-perplexity --kl-divergence-base (or quantscope perplexity "
                                 "--kl-divergence-base): its log-probabilities stand for the base model, and its "
                                 "context size and chunks are used.")
        self.text_source = QComboBox()
        self.text_source.setAccessibleName("Text to score")
        self.text_source.addItem("Sample text (bundled)", "sample")
        self.text_source.addItem("Text file", "file")
        self.text_source.addItem("Typed below", "typed")
        self.text_file = QLineEdit()
        self.text_file.setAccessibleName("Text file")
        self.text_file.setPlaceholderText("a UTF-8 text file")
        self.text_file_row, self.text_file_browse = browse_row(
            self.text_file, "Text file", "Text (*.txt *.md *.raw);;All files (*)", self, save=False,
            accessible="Browse for the text file")
        self.text_edit = QPlainTextEdit()
        self.text_edit.setAccessibleName("Text")
        self.text_edit.setPlaceholderText("Type or paste the text to score here.")
        self.text_edit.setPlainText(self._sample)
        self.text_edit.setTabChangesFocus(True)
        self._typed = self._sample
        self.ctx = QSpinBox()
        self.ctx.setAccessibleName("Context size")
        self.ctx.setRange(4, MAX_CTX_CHOICE)
        self.ctx.setValue(DEFAULT_CTX)
        self.ctx.setSuffix(" tokens")
        self.ctx.setToolTip("Each chunk of this many tokens is evaluated from an empty cache and its second half "
                            "scored (llama-perplexity's procedure).")
        self.chunks = QSpinBox()
        self.chunks.setAccessibleName("Maximum chunks")
        self.chunks.setRange(0, 1_000_000)
        self.chunks.setSpecialValueText("all")
        self.chunks.setToolTip("Score at most this many chunks of the text (all: every whole chunk).")

        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        self.doc_label = ElidedLabel(doc_path.name, Qt.TextElideMode.ElideMiddle)
        self.doc_label.setToolTip(str(doc_path))
        form.addRow("Open file", self.doc_label)
        form.addRow("It is the", self.role)
        self.other_label = QLabel("Quant")
        form.addRow(self.other_label, other_row)
        form.addRow(self.kld_base)
        form.addRow("Text", self.text_source)
        form.addRow(self.text_file_row)
        nums = QHBoxLayout()
        nums.addWidget(QLabel("Context"))
        nums.addWidget(self.ctx, 1)
        nums.addWidget(QLabel("Chunks"))
        nums.addWidget(self.chunks, 1)
        self.setup = QWidget()
        sl = QVBoxLayout(self.setup)
        sl.setContentsMargins(0, 0, 0, 0)
        sl.addLayout(form)
        sl.addWidget(self.text_edit, 1)
        sl.addLayout(nums)

    def _build_strip(self) -> None:
        """Compare, Cancel, the bar, the status (a :class:`JobStrip`) and the rate line."""
        status = QLabel()
        status.setWordWrap(True)
        status.setTextFormat(Qt.TextFormat.RichText)
        # [Compare ……][Cancel] over the bar over the status, all in place (greyed when not usable)
        self.strip = JobStrip("comparison", "Compare", status_text="Choose the other file, then Compare.", scale=1000,
                              status=status, layout="column", always_shown=True, run_name="Start the comparison")
        self.strip.row.setStretchFactor(self.strip.run_btn, 1)
        self.strip.progress.setFormat("%p%")
        self.strip.run_btn.setDefault(True)
        self.strip.run_clicked.connect(self.start)
        self.strip.cancel_clicked.connect(self.cancel)
        self.start_btn = self.strip.run_btn
        self.cancel_btn = self.strip.cancel_btn
        self.progress = self.strip.progress
        self.status = self.strip.status
        self.rate = QLabel()
        self.rate.setObjectName("muted")
        self.rate.setWordWrap(True)

    def _build_results(self) -> QWidget:
        """The right column: the headline, the figure cards, the coloured text over the histogram and the worst
        positions."""
        self.headline = ElidedLabel("No comparison yet.", Qt.TextElideMode.ElideMiddle)
        self.headline.setObjectName("heading")
        self.headline.setAccessibleName("Compared files")
        grid = self._build_cards()
        text_page = self._build_text_page()

        bottom = self._build_distribution()
        self.result_split = QSplitter(Qt.Orientation.Vertical)
        self.result_split.addWidget(text_page)
        self.result_split.addWidget(bottom)
        self.result_split.setStretchFactor(0, 3)
        self.result_split.setStretchFactor(1, 2)
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.addWidget(self.headline)
        rl.addLayout(grid)
        rl.addWidget(self.result_split, 1)
        return right

    def _build_cards(self) -> QGridLayout:
        """The ten figure cards (PPL, agreement, KLD quantiles), two rows of five."""
        self.cards: dict[str, Card] = {}
        grid = QGridLayout()
        grid.setSpacing(6)
        for i, key in enumerate(("PPL base", "PPL quant", "PPL ratio", "Top-1 agreement", "Positions",
                                 "KLD mean", "KLD median", "KLD p90", "KLD p99", "KLD max")):
            c = Card(key)
            c.setMinimumWidth(90)
            self.cards[key] = c
            grid.addWidget(c, i // 5, i % 5)
        for col in range(5):
            grid.setColumnStretch(col, 1)
        return grid

    def _build_text_page(self) -> QWidget:
        """The KLD legend, the text coloured by KL divergence and the chosen token's details."""
        self.text = TokenText()
        self.text.setAccessibleName("Text coloured by KL divergence")
        self.text.tokenChosen.connect(self._token_chosen)
        legend = QHBoxLayout()
        legend.setSpacing(3)
        title = QLabel("KLD (nats)")
        title.setObjectName("muted")
        legend.addWidget(title)
        self.legend: list[QLabel] = []
        for label, bg, fg in zip(_legend_labels(), KLD_COLORS, KLD_TEXT_COLORS, strict=True):
            lab = QLabel(label)
            lab.setStyleSheet(f"background:{bg}; color:{fg}; padding:1px 5px; border-radius:3px;")
            self.legend.append(lab)
            legend.addWidget(lab)
        ctx_label = QLabel("context, not scored")
        ctx_label.setStyleSheet(f"color:{muted_color().name()}; padding:1px 4px;")
        legend.addWidget(ctx_label)
        self.legend.append(ctx_label)
        legend.addStretch(1)
        self.details = QLabel("Hover a token for its figures; click one, or pick a position below.")
        self.details.setObjectName("muted")
        self.details.setAccessibleName("Token details")
        self.details.setWordWrap(True)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        mono = QFont("monospace")
        mono.setStyleHint(QFont.StyleHint.Monospace)
        self.details.setFont(mono)
        text_page = QWidget()
        tl = QVBoxLayout(text_page)
        tl.setContentsMargins(0, 0, 0, 0)
        tl.addLayout(legend)
        tl.addWidget(self.text, 1)
        tl.addWidget(self.details)
        return text_page

    def _build_distribution(self) -> QSplitter:
        """The KLD histogram beside the table of the worst positions."""
        self.hist = CompactPlot((360, 200))
        self.hist.setAccessibleName("Histogram of the KL divergence")
        self.hist.setLabel("bottom", "KL divergence (nats)")
        self.hist.setLabel("left", "positions")
        self.hist.showGrid(x=True, y=True, alpha=0.2)
        self.hist.setLogMode(x=True, y=False)
        self.hist.setMenuEnabled(False)
        self.worst_model = WorstModel()
        self.worst = QTableView()
        self.worst.setModel(self.worst_model)
        self.worst.setAccessibleName("Positions of largest KL divergence")
        self.worst.verticalHeader().setVisible(False)
        self.worst.verticalHeader().setDefaultSectionSize(21)
        self.worst.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.worst.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        fit_columns(self.worst, stretch=2, optional=(1,), min_stretch=50, max_stretch=140)
        self.worst.selectionModel().currentRowChanged.connect(lambda cur, _prev: self._worst_row(cur.row()))
        self.worst.clicked.connect(lambda index: self._worst_row(index.row()))
        self.worst_title = QLabel(f"The {WORST_ROWS} positions of largest KLD")
        self.worst_title.setObjectName("muted")
        worst_page = QWidget()
        wl = QVBoxLayout(worst_page)
        wl.setContentsMargins(0, 0, 0, 0)
        wl.addWidget(self.worst_title)
        wl.addWidget(self.worst, 1)
        bottom = QSplitter(Qt.Orientation.Horizontal)
        bottom.addWidget(self.hist)
        bottom.addWidget(worst_page)
        bottom.setStretchFactor(0, 1)
        bottom.setStretchFactor(1, 1)
        return bottom

    def _build_split(self, left: QWidget, right: QWidget) -> QSplitter:
        """The setup column beside the results."""
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(left)
        split.addWidget(right)
        split.setStretchFactor(0, 0)
        split.setStretchFactor(1, 1)
        split.setSizes([300, 900])
        return split

    # ------------------------------------------------------------------ options
    def role_name(self) -> str:
        return str(self.role.currentData())

    def source_name(self) -> str:
        return str(self.text_source.currentData())

    def set_role(self, role: str) -> None:
        self.role.setCurrentIndex(self.role.findData(role))

    def set_source(self, source: str) -> None:
        self.text_source.setCurrentIndex(self.text_source.findData(source))

    def _role_changed(self) -> None:
        quant = self.role_name() == "quant"
        self.other_label.setText("Base" if quant else "Quant")
        self.other.setAccessibleName("Base file" if quant else "Quant file")
        self.kld_base.setEnabled(quant)
        if not quant:
            self.kld_base.setChecked(False)

    def _kld_toggled(self, on: bool) -> None:
        i = self.text_source.findData("kld")
        if on and i < 0:
            self.text_source.addItem("The KLD file's own tokens", "kld")
            self.set_source("kld")
        elif not on and i >= 0:
            if self.source_name() == "kld":
                self.set_source("sample")
            self.text_source.removeItem(i)
        self.ctx.setEnabled(not on)
        self.ctx.setToolTip("The KLD file's context size is used." if on else
                            "Each chunk of this many tokens is evaluated from an empty cache and its second half "
                            "scored (llama-perplexity's procedure).")

    def _source_changed(self) -> None:
        src = self.source_name()
        self.text_file_row.setVisible(src == "file")
        self.text_edit.setVisible(src in ("sample", "typed"))
        self.text_edit.blockSignals(True)
        if src == "sample":
            self.text_edit.setPlainText(self._sample)
            self.text_edit.setReadOnly(True)
        elif src == "typed":
            self.text_edit.setPlainText(self._typed)
            self.text_edit.setReadOnly(False)
        self.text_edit.blockSignals(False)

    def _typed_changed(self) -> None:
        if self.source_name() == "typed":
            self._typed = self.text_edit.toPlainText()

    def set_typed_text(self, text: str) -> None:
        """Score ``text`` (the "Typed below" source)."""
        self._typed = text
        self.set_source("typed")
        self._source_changed()

    def _placeholder(self) -> str:
        return ("<p>Compare the open file with another GGUF of the same model, e.g. F16 or Q8_0 as the base and "
                "Q4_K_M as the quant: both score the text chunk by chunk, and each position shows how far the "
                "quant's prediction drifts from the base's (KL divergence, in nats).</p>"
                "<p>Choose the other file and the text on the left, then <b>Compare</b>.</p>")

    # ------------------------------------------------------------------ run
    def start(self) -> None:
        if self.state == "running":
            return
        other = self.other.text().strip()
        if not other:
            self._refuse("Choose the other file first.")
            return
        other_path = Path(other).expanduser()
        kld_base = self.kld_base.isChecked() and self.role_name() == "quant"
        base, quant = (other_path, self.doc_path) if self.role_name() == "quant" else (self.doc_path, other_path)
        src = self.source_name()
        text_path: Path | None = None
        text = ""
        if src == "file":
            if not self.text_file.text().strip():
                self._refuse("Choose the text file first.")
                return
            text_path = Path(self.text_file.text().strip()).expanduser()
        elif src == "sample":
            text = self._sample
        elif src == "typed":
            text = self._typed
        if src in ("sample", "typed") and not text.strip():
            self._refuse("Type or paste a text first." if src == "typed" else "The sample text is missing.")
            return
        n_ctx, max_chunks = self.ctx.value(), self.chunks.value()
        self.state = "running"
        self.error = None
        self.result = None
        self.meter = RateMeter()
        self._phases = ("quant", "chunk") if kld_base else ("base", "quant", "chunk")
        self.setup.setEnabled(False)
        self.strip.started("Starting…")
        self.rate.setText("")
        self._clear_figures()
        self.headline.setText(f"{base.name}  →  {quant.name}")
        self.text.clear_result("<p>Comparing…</p>")

        def work(report, token):  # type: ignore[no-untyped-def]
            body = text
            if text_path is not None:
                try:
                    body = text_path.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError) as exc:
                    raise ValueError(f"{text_path}: cannot read the text: {exc}") from None
            try:
                return compare_models(base, quant, body, n_ctx=n_ctx, max_chunks=max_chunks, base_is_kld=kld_base,
                                      progress=report, cancel=lambda: token.cancelled)
            except CompareCancelled:
                raise Cancelled("comparison cancelled") from None

        task = self.job_slot.start("compare", work, on_done=self._done, on_progress=self._progress,
                              on_failed=self._failed, on_cancelled=self._cancelled)
        self.task = task if self.job_slot.busy else None  # (None: it has ended already)

    def _refuse(self, message: str) -> None:
        self.status.setText(f"<span style='color:{BAD_COLOR}; font-weight:600'>{html.escape(message)}</span>")

    def _progress(self, done: int, total: int, text: str) -> None:
        if self.state != "running":
            return
        phase = next((i for i, p in enumerate(self._phases) if text.startswith(f"loading the {p}")),
                     len(self._phases) - 1)
        frac = done / total if total > 0 else 0.0
        self.progress.setValue(int(1000 * (phase + frac) / len(self._phases)))
        if text.startswith("chunk") and total > 0 and done > 0:
            rate, eta = self.meter.update(done, total)
            self.rate.setText(f"{done} of {total} chunks · {1 / rate:.1f} s per chunk · {format_duration(eta)} "
                              "left" if rate > 0 else f"{done} of {total} chunks")
        self.status.setText(html.escape(printable(text[:1].upper() + text[1:])) if text else "Working…")

    def _finish(self, state: str) -> None:
        self.state = state
        self.task = None
        self.setup.setEnabled(True)
        self.strip.set_busy(False)

    def _done(self, r: CompareResult) -> None:
        self._finish("done")
        self.result = r
        self.strip.finished()
        self.rate.setText(f"Scored in {r.seconds:.1f} s" + (f" ({r.backends[1]})" if r.backends[1] else ""))
        self.status.setText(html.escape(printable(f"Done: {r.n_chunks} chunk{'s' if r.n_chunks != 1 else ''} of "
                                                  f"{r.n_ctx} tokens, {r.n_scored:,} positions scored.")))
        self.show_result(r)
        self.compareFinished.emit(r)

    def show_result(self, r: CompareResult) -> None:
        """Fill the figures, the coloured text, the histogram and the worst positions from ``r``."""
        self.headline.setText(printable(f"{r.base_name}{' (KLD base file)' if r.base_is_kld else ''}  →  "
                                        f"{r.quant_name}"))
        worst = r.worst(1)
        c = self.cards
        c["PPL base"].set(_ppl(r.ppl_base), printable(r.base_name))
        c["PPL quant"].set(_ppl(r.ppl_quant), printable(r.quant_name))
        c["PPL ratio"].set(f"{r.ppl_ratio:.4f}", f"ln {math.log(r.ppl_ratio):+.5f}")
        agree = round(r.top1_agreement * r.n_scored)
        c["Top-1 agreement"].set(f"{100 * r.top1_agreement:.2f} %", f"{agree:,} of {r.n_scored:,}")
        c["Positions"].set(f"{r.n_scored:,}", f"{r.n_chunks} × {r.n_ctx} tokens")
        c["KLD mean"].set(f"{r.kld_mean:.6f}", "nats")
        c["KLD median"].set(f"{r.kld_median:.6f}", "nats")
        c["KLD p90"].set(f"{r.kld_p90:.6f}", "90th percentile")
        c["KLD p99"].set(f"{r.kld_p99:.6f}", "99th percentile")
        c["KLD max"].set(f"{r.kld_max:.6f}", f"at position {worst[0].position:,}" if worst else "")
        self.text.set_result(r)
        self._draw_histogram(r)
        self._fill_worst(r)
        self.details.setText("Hover a token for its figures; click one, or pick a position below.")

    def _clear_figures(self) -> None:
        for card in self.cards.values():
            card.set("—", "")
        self.hist.clear()
        for side in ("left", "bottom"):
            self.hist.getPlotItem().showAxis(side, False)
        self.worst_model.set_result(None, 0)

    def _draw_histogram(self, r: CompareResult) -> None:
        self.hist.clear()
        for side in ("left", "bottom"):
            self.hist.getPlotItem().showAxis(side, True)
        edges, counts = r.kld_histogram()
        color = QColor(KLD_COLORS[-2])
        self.hist.plot(edges, counts, stepMode="center", fillLevel=0, brush=pg.mkBrush(color),
                       pen=pg.mkPen(color.darker(130)))
        # median left of its line, mean right, p99 left (it is near the right edge), at three heights
        for value, name, style, at, side in ((r.kld_median, "median", Qt.PenStyle.DotLine, 0.95, 1),
                                             (r.kld_mean, "mean", Qt.PenStyle.DashLine, 0.82, 0),
                                             (r.kld_p99, "p99", Qt.PenStyle.DashDotLine, 0.55, 1)):
            if value > 0 and math.isfinite(value):
                line = pg.InfiniteLine(pos=math.log10(value), angle=90,
                                       pen=pg.mkPen(muted_color(), width=1.5, style=style), label=name,
                                       labelOpts={"position": at, "color": muted_color(),
                                                  "anchors": [(side, 0.5), (side, 0.5)]})
                self.hist.addItem(line)

    def _fill_worst(self, r: CompareResult) -> None:
        self.worst_model.set_result(r, WORST_ROWS)
        self.worst_title.setText(f"The {self.worst_model.rowCount()} positions of largest KLD (pick one to find "
                                 "it in the text)")

    def worst_token(self, row: int) -> int | None:
        """The index into ``result.tokens`` of a row of the worst list."""
        return self.worst_model.rows[row][0] if 0 <= row < len(self.worst_model.rows) else None

    def show_worst(self, row: int = 0) -> None:
        """Make row ``row`` of the worst positions current (its token selected in the text)."""
        if 0 <= row < self.worst_model.rowCount():
            self.worst.setCurrentIndex(self.worst_model.index(row, 0))

    def _worst_row(self, row: int) -> None:
        i = self.worst_token(row)
        if i is not None:
            self.text.show_token(i)

    def _token_chosen(self, i: int) -> None:
        if self.result is not None and 0 <= i < len(self.result.tokens):
            self.details.setText(token_details(self.result, self.result.tokens[i]))

    def _failed(self, msg: str, _tb: str) -> None:
        self.error = msg
        self._finish("failed")
        self.progress.setValue(0)
        self.rate.setText("")
        self.status.setText(f"<span style='color:{BAD_COLOR}; font-weight:600'>Comparison failed.</span> "
                            f"{html.escape(printable(msg))}")
        self.text.clear_result(f"<p style='color:{BAD_COLOR}; font-weight:600'>The comparison failed:</p>"
                               f"<p>{html.escape(printable(msg))}</p>")
        self.compareFinished.emit(None)

    def _cancelled(self) -> None:
        self._finish("cancelled")
        self.progress.setValue(0)
        self.rate.setText("")
        self.status.setText("Cancelled.")
        self.text.clear_result("<p>The comparison was cancelled.</p>")
        self.compareFinished.emit(None)

    def cancel(self) -> None:
        if self.task is not None:
            self.strip.cancelling()
            self.task.cancel()

    def closeEvent(self, event: Any) -> None:
        if self.state == "running":
            self.cancel()
        super().closeEvent(event)

    def reject(self) -> None:  # Esc
        if self.state == "running":
            self.cancel()
            return
        super().reject()
