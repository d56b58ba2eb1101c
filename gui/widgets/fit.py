"""Widgets and helpers that keep text inside the window at any size (1024 × 640 up to 4K, any scale factor):
a label that elides with the full text in its tool tip, and item views whose columns always fit their width."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import QAbstractProxyModel, QEvent, QObject, QSize, Qt, QTimer
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QLabel, QSizePolicy, QTableView, QTreeView, QWidget

from ..guard import qt_guarded


@qt_guarded
class ElidedLabel(QLabel):
    """A one-line plain-text label that never asks for more width than it gets: it shows as much of its text as
    fits, cut with "…" (``mode``: end, middle or start), and then the whole text leads its tool tip (followed by
    any tool tip of its own). ``text()`` is what is shown, ``full_text()`` the text set, ``elided`` whether it
    is cut."""

    def __init__(self, text: str = "", mode: Qt.TextElideMode = Qt.TextElideMode.ElideRight,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._full = ""
        self._tip = ""
        self._mode = mode
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.setMinimumWidth(1)
        self.setText(text)

    def setText(self, text: str) -> None:  # type: ignore[override]
        self._full = text
        self._elide()

    def setToolTip(self, tip: str) -> None:  # type: ignore[override]
        self._tip = tip
        self._elide()

    def full_text(self) -> str:
        return self._full

    @property
    def elided(self) -> bool:
        return super().text() != self._full

    def sizeHint(self) -> QSize:
        m = self.contentsMargins()
        return QSize(self.fontMetrics().horizontalAdvance(self._full) + m.left() + m.right() + 2,
                     super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:
        return QSize(1, super().minimumSizeHint().height())

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._elide()

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.FontChange:
            self._elide()

    def _elide(self) -> None:
        shown = self.fontMetrics().elidedText(self._full, self._mode, max(0, self.contentsRect().width()))
        super().setText(shown)
        tip = self._tip
        if shown != self._full and self._full not in tip:
            tip = self._full + (f"\n{tip}" if tip else "")
        super().setToolTip(tip)


#: A cell's room around its text (the delegate's margins and focus frame).
_CELL_PADDING = 12
#: Rows measured beyond those in view when a column's width is fitted to its contents (0: those in view).
CONTENTS_PRECISION = 0


@qt_guarded
class _ColumnFitter(QObject):
    """Event filter behind :func:`fit_columns`: re-fits on every resize of the view."""

    def __init__(self, view: QTableView | QTreeView, stretch: int, optional: Sequence[int], min_stretch: int,
                 max_stretch: int) -> None:
        super().__init__(view)
        self.view, self.stretch, self.optional = view, stretch, tuple(optional)
        self.min_stretch, self.max_stretch = min_stretch, max_stretch
        self._later = QTimer(self)  # many changes in one pass of the event loop: one fit after them
        self._later.setSingleShot(True)
        self._later.setInterval(0)
        self._later.timeout.connect(self.fit)
        #: the columns' content widths, measured once per change of the rows (a resize reuses them)
        self._widths: dict[int, int] | None = None

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:
        if event.type() in (QEvent.Type.Resize, QEvent.Type.Show, QEvent.Type.LayoutRequest):
            self.fit()
        return False

    def schedule(self) -> None:
        """Measure again and fit once the current changes are done (a model reset, rows shown or hidden)."""
        self._widths = None
        self._later.start()

    def _width(self, col: int) -> int:
        v = self.view
        h = v.header() if isinstance(v, QTreeView) else v.horizontalHeader()
        src = v.model()
        while isinstance(src, QAbstractProxyModel):
            src = src.sourceModel()
        texts = getattr(src, "column_texts", None)
        if texts is not None:  # the model lists its column's texts: measured as strings, no data() per cell
            fm = v.fontMetrics()
            w = max((fm.horizontalAdvance(t) for t in texts(col)), default=0) + _CELL_PADDING
            if isinstance(v, QTreeView) and col == 0:
                w += 2 * v.indentation()
            return max(h.sectionSizeHint(col), w)
        return max(h.sectionSizeHint(col), v.sizeHintForColumn(col))

    def fit(self) -> None:
        v = self.view
        h = v.header() if isinstance(v, QTreeView) else v.horizontalHeader()
        model = v.model()
        if model is None or not v.isVisible():  # a hidden view (another tab) is fitted when it is shown
            return
        room = v.viewport().width()
        sb = v.verticalScrollBar()
        if v.verticalScrollBarPolicy() == Qt.ScrollBarPolicy.ScrollBarAsNeeded and not sb.isVisible():
            # the room the vertical scroll bar takes once it is needed, kept free when it is not: a filter or an
            # expanded layer that brings the bar must not hide a column (nor clearing it show one back)
            room -= sb.sizeHint().width()
        cols = [c for c in range(model.columnCount()) if c != self.stretch]
        hidden: set[int] = set()
        if self._widths is None or len(self._widths) != len(cols) + 1:
            self._widths = {c: self._width(c) for c in (*cols, self.stretch)}
        widths = {c: self._widths[c] for c in cols}
        want = max(self.min_stretch, min(self._widths[self.stretch], self.max_stretch))
        for c in (None, *self.optional):
            if c is not None:
                hidden.add(c)
            if room - sum(w for k, w in widths.items() if k not in hidden) >= want:
                break
        for c in cols:
            if h.isSectionHidden(c) != (c in hidden):
                h.setSectionHidden(c, c in hidden)
            if c not in hidden and h.sectionSize(c) != widths[c]:
                h.resizeSection(c, widths[c])


def fit_columns(view: QTableView | QTreeView, stretch: int = 0, optional: Sequence[int] = (),
                min_stretch: int = 120, max_stretch: int = 0,
                elide: Qt.TextElideMode = Qt.TextElideMode.ElideMiddle) -> None:
    """Keep ``view``'s columns inside its width: never a horizontal scroll bar. Every column but ``stretch`` is as
    wide as its contents (measured again only when the rows change); ``stretch`` takes the rest, its text elided
    (``elide``; item views show the full text in the tool tip their model gives). While ``stretch`` would get less
    than its contents' width (at most ``max_stretch`` pixels) or ``min_stretch``, the columns in ``optional`` are
    hidden, in that order (the first is the least needed)."""
    h = view.header() if isinstance(view, QTreeView) else view.horizontalHeader()
    view.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    view.setHorizontalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
    view.setTextElideMode(elide)
    h.setStretchLastSection(False)
    h.setMinimumSectionSize(24)
    # the widths are set by the fitter from one measurement per change of the rows: Qt's ResizeToContents would
    # measure every column again (a Python data() call per cell) on each relayout, hide or show
    h.setSectionResizeMode(QHeaderView.ResizeMode.Fixed)
    h.setSectionResizeMode(stretch, QHeaderView.ResizeMode.Stretch)
    # widths from the rows in view and a sample of the rest, not every row (Qt's default reads 1,000 rows per
    # column: a Python data() call each, on every layout change of a 300-tensor list)
    rows_header = h if isinstance(view, QTreeView) else view.verticalHeader()
    rows_header.setResizeContentsPrecision(CONTENTS_PRECISION)
    fitter = _ColumnFitter(view, stretch, optional, min_stretch, max_stretch)
    view.viewport().installEventFilter(fitter)
    model = view.model()
    if model is not None:  # another file's names and numbers: other widths
        for sig in (model.modelReset, model.layoutChanged, model.dataChanged, model.rowsInserted,
                    model.rowsRemoved, model.headerDataChanged):
            sig.connect(fitter.schedule)
    if isinstance(view, QTreeView):  # the rows shown change the widest name
        view.expanded.connect(fitter.schedule)
        view.collapsed.connect(fitter.schedule)
    view._column_fitter = fitter  # type: ignore[attr-defined]
    fitter.fit()
