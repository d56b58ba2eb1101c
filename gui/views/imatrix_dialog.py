"""Tools ▸ Importance matrix…: an importance matrix (llama-imatrix's GGUF or legacy .dat, core/quant/imatrix.py)
read in a worker, one row per tensor in a sortable table, and the per-channel importance weights of the selected
tensor (one expert at a time for 3-D expert tensors) plotted, optionally on a log scale."""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from quantscope.core.fsutil import printable
from quantscope.core.gguf import GGUFError
from quantscope.core.quant.imatrix import Imatrix, read_imatrix

from ..exports import Exporter
from ..guard import qt_guarded
from ..models import KEY_ROLE, SORT_ROLE, SortFilterProxy, plural
from ..theme import BAD_COLOR, group_color
from ..widgets.fit import ElidedLabel, fit_columns
from ..widgets.plots import CompactPlot
from ..workers import JobSlot, TaskRunner

_Index = QModelIndex | QPersistentModelIndex
_ROOT = QModelIndex()
_COLS = ("Tensor", "Columns", "Experts", "Count", "Mean", "Max", "Zeros")
_KEYS = ("name", "n_cols", "n_mat", "count", "mean", "max", "zeros")
_RIGHT = int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
_DIGITS = re.compile(r"\d+")


def natural_key(name: str) -> str:
    """``blk.2.x`` before ``blk.10.x``: the name with its numbers zero-padded (a string Qt compares)."""
    return _DIGITS.sub(lambda m: m.group().zfill(10), name)


@qt_guarded
class ImatrixModel(QAbstractTableModel):
    """The rows of :meth:`Imatrix.entry_stats`: one per tensor, numbers sortable through :data:`SORT_ROLE`."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict[str, object]] = []

    def set_rows(self, rows: list[dict[str, object]]) -> None:
        self.beginResetModel()
        self.rows = rows
        self.endResetModel()

    def rowCount(self, parent: _Index = _ROOT) -> int:
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent: _Index = _ROOT) -> int:
        return 0 if parent.isValid() else len(_COLS)

    @staticmethod
    def text(key: str, v: object) -> str:
        if key == "name":
            return printable(v)
        if key in ("mean", "max"):
            return f"{float(v):.4g}"  # type: ignore[arg-type]
        return f"{int(v):,}"  # type: ignore[call-overload]

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        row = self.rows[index.row()]
        key = _KEYS[index.column()]
        v = row[key]
        if role == Qt.ItemDataRole.DisplayRole:
            return self.text(key, v)
        if role == Qt.ItemDataRole.ToolTipRole and key == "name":
            return printable(v)
        if role == SORT_ROLE:
            return natural_key(str(v)) if key == "name" else v
        if role == KEY_ROLE:
            return row["name"]
        if role == Qt.ItemDataRole.TextAlignmentRole and index.column() > 0:
            return _RIGHT
        if role == Qt.ItemDataRole.ForegroundRole and key == "zeros" and int(v):  # type: ignore[call-overload]
            return pg.mkColor(BAD_COLOR)
        return None

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return _COLS[section]
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.ToolTipRole:
            return ("tensor the matrix weighs", "input columns (channels)", "sub-matrices (experts)",
                    "activation rows summed (the largest count of its experts)",
                    "mean importance weight (sum of squared activations / count)", "largest importance weight",
                    "zero columns: input columns whose weight is 0 (never activated)")[section]
        return None


@qt_guarded
class ImatrixDialog(QDialog):
    """Reads an importance matrix in a worker and shows it; ``loaded`` carries the :class:`Imatrix` (None when the
    file could not be read: ``error`` says why)."""

    loaded = Signal(object)

    def __init__(self, runner: TaskRunner, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Importance matrix")
        self.setAccessibleName("Importance matrix")
        self.runner = runner
        self.job = JobSlot(runner, self)  # the read: its callbacks connected before it is queued
        self.imatrix: Imatrix | None = None
        self.error: str | None = None
        self.tensor: str | None = None
        self.values: np.ndarray | None = None  # the plotted weights

        self.path = QLineEdit()
        self.path.setAccessibleName("Importance matrix file")
        self.path.setPlaceholderText("llama-imatrix's .gguf, or a legacy .dat")
        self.path.returnPressed.connect(self.load)
        browse = QPushButton("Browse…")
        browse.setAccessibleName("Browse for an importance matrix")
        browse.clicked.connect(self.browse)
        self.open_btn = QPushButton("Read")
        self.open_btn.setAccessibleName("Read the importance matrix")
        self.open_btn.clicked.connect(self.load)
        top = QHBoxLayout()
        top.addWidget(QLabel("File"))
        top.addWidget(self.path, 1)
        top.addWidget(browse)
        top.addWidget(self.open_btn)
        self.info = QLabel("Choose an importance matrix (llama-imatrix's output, GGUF or legacy .dat).")
        self.info.setAccessibleName("Importance matrix summary")
        self.info.setWordWrap(True)
        self.info.setTextFormat(Qt.TextFormat.RichText)
        self.info.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        self.filter = QLineEdit()
        self.filter.setPlaceholderText("Filter tensors, e.g. ffn_down or blk.3.")
        self.filter.setClearButtonEnabled(True)
        self.filter.setAccessibleName("Filter tensors")
        self.model = ImatrixModel()
        self.proxy = SortFilterProxy(self)
        self.proxy.setSourceModel(self.model)
        self.proxy.setFilterKeyColumn(0)
        self.table = QTableView()
        self.table.setModel(self.proxy)
        self.table.setAccessibleName("Tensors of the importance matrix")
        self.table.setSortingEnabled(True)
        self.table.sortByColumn(0, Qt.SortOrder.AscendingOrder)  # by layer, then name
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(22)
        self.table.setAlternatingRowColors(True)
        fit_columns(self.table, stretch=0, optional=(6, 3, 2), min_stretch=140, max_stretch=260)
        self.count = QLabel()
        self.count.setObjectName("muted")
        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        ll.addWidget(self.filter)
        ll.addWidget(self.table, 1)
        ll.addWidget(self.count)

        self.title = ElidedLabel("Select a tensor", Qt.TextElideMode.ElideMiddle)
        self.title.setObjectName("heading")
        self.title.setAccessibleName("Selected tensor")
        self.expert = QSpinBox()
        self.expert.setAccessibleName("Expert")
        self.expert.setPrefix("expert ")
        self.expert.setEnabled(False)
        self.expert.valueChanged.connect(lambda _v: self._plot())
        self.log_y = QCheckBox("Log scale")
        self.log_y.setAccessibleName("Logarithmic importance axis")
        self.log_y.toggled.connect(self._log_toggled)
        self.expert_info = QLabel("")
        self.expert_info.setObjectName("muted")
        bar = QHBoxLayout()
        bar.addWidget(self.expert)
        bar.addWidget(self.expert_info, 1)
        bar.addWidget(self.log_y)
        self.plot = CompactPlot((520, 300))
        self.plot.setAccessibleName("Importance of each input column")
        self.plot.setLabel("bottom", "input column (channel)")
        self.plot.setLabel("left", "importance (mean squared activation)")
        self.plot.showGrid(x=True, y=True, alpha=0.2)
        self.plot.getAxis("bottom").enableAutoSIPrefix(False)
        self.plot.setMenuEnabled(False)
        self.exporter = Exporter(self, standalone=True)
        self.exporter.install_plot_menu(self.plot, "importance per channel")
        self.curve = pg.PlotDataItem(connect="finite")
        self.plot.addItem(self.curve)
        self.hover = QLabel("Hover the plot for a column's weight.")
        self.hover.setObjectName("muted")
        self.hover.setAccessibleName("Plot position")
        self.plot.scene().sigMouseMoved.connect(self._hover)
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.addWidget(self.title)
        rl.addLayout(bar)
        rl.addWidget(self.plot, 1)
        rl.addWidget(self.hover)

        self.split = QSplitter(Qt.Orientation.Horizontal)
        self.split.addWidget(left)
        self.split.addWidget(right)
        self.split.setStretchFactor(0, 4)
        self.split.setStretchFactor(1, 5)
        self.split.setSizes([600, 500])
        buttons = QDialogButtonBox()
        close = buttons.addButton("Close", QDialogButtonBox.ButtonRole.RejectRole)
        close.clicked.connect(self.close)
        lay = QVBoxLayout(self)
        lay.addLayout(top)
        lay.addWidget(self.info)
        lay.addWidget(self.split, 1)
        lay.addWidget(buttons)
        self.resize(1120, 720)

        self.filter.textChanged.connect(self._filter)
        self.table.selectionModel().currentRowChanged.connect(self._current)
        self._axes(False)

    # ------------------------------------------------------------------ reading
    def browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Importance matrix", self.path.text(),
                                              "imatrix (*.gguf *.dat);;All files (*)")
        if path:
            self.open_file(path)

    def open_file(self, path: str | Path) -> None:
        """Read ``path`` (in the worker) and show it."""
        self.path.setText(str(path))
        self.load()

    def load(self) -> None:
        text = self.path.text().strip()
        if not text:
            return
        path = Path(text).expanduser()
        self.imatrix = None
        self.error = None
        self.model.set_rows([])
        self._select(None)
        self._filter(self.filter.text())
        self.info.setText(html.escape(printable(f"Reading {path}…")))

        def work(report, token):  # type: ignore[no-untyped-def]
            try:
                im = read_imatrix(path)
            except GGUFError as exc:
                raise ValueError(f"{path}: {exc}") from None
            return im, im.entry_stats()

        def failed(msg: str, _tb: str) -> None:
            self.error = msg
            self.info.setText(f"<span style='color:{BAD_COLOR}; font-weight:600'>Cannot read this file:</span> "
                              f"{html.escape(printable(msg))}")
            self.loaded.emit(None)

        def cancelled() -> None:
            self.info.setText(html.escape(printable(f"Cancelled: {path.name} was not read.")))

        self.job.start("imatrix", work, on_done=lambda res: self._show(*res), on_failed=failed,
                       on_cancelled=cancelled)

    @property
    def busy(self) -> bool:
        """Whether a file is being read."""
        return self.job.busy

    def _show(self, im: Imatrix, rows: list[dict[str, object]]) -> None:
        self.imatrix = im
        s = im.summary()
        self.setWindowTitle(f"Importance matrix — {im.path.name}")
        experts = sum(1 for r in rows if int(r["n_mat"]) > 1)  # type: ignore[call-overload]
        self.info.setText(html.escape(printable(
            f"{im.path.name}: {s['format']} imatrix, {plural(len(rows), 'entry', 'entries')}"
            + (f" ({experts} with experts)" if experts else "")
            + f", {s['chunk_count']} chunks" + (f" of {s['chunk_size']} tokens" if s["chunk_size"] else "")
            + (f"; dataset {', '.join(im.datasets)}" if im.datasets else ""))))
        self.model.set_rows(rows)
        self._filter(self.filter.text())
        if rows:
            self.table.setCurrentIndex(self.proxy.index(0, 0))
        self.loaded.emit(im)

    def cancel(self) -> None:
        self.job.cancel()

    # ------------------------------------------------------------------ table
    def _filter(self, text: str) -> None:
        self.proxy.setFilterFixedString(text)
        n = self.model.rowCount()
        self.count.setText(f"{self.proxy.rowCount():,} of {plural(n, 'tensor')}" if n else "")

    def names(self) -> list[str]:
        """The tensor names in the table's current order (filtered and sorted)."""
        return [self.proxy.data(self.proxy.index(r, 0), KEY_ROLE) for r in range(self.proxy.rowCount())]

    def _current(self, current: QModelIndex, _prev: QModelIndex) -> None:
        name = self.proxy.data(current.siblingAtColumn(0), KEY_ROLE) if current.isValid() else None
        self._select(name if isinstance(name, str) else None)

    def select_tensor(self, name: str) -> None:
        """Select ``name`` in the table (and plot it)."""
        for r in range(self.proxy.rowCount()):
            if self.proxy.data(self.proxy.index(r, 0), KEY_ROLE) == name:
                self.table.setCurrentIndex(self.proxy.index(r, 0))
                self.table.scrollTo(self.proxy.index(r, 0))
                return

    def _select(self, name: str | None) -> None:
        im = self.imatrix
        e = im.entries.get(name) if im is not None and name is not None else None
        self.tensor = name if e is not None else None
        if e is None:
            self.title.setText("Select a tensor")
            self.expert.setEnabled(False)
            self.expert.setVisible(False)
            self.expert.setRange(0, 0)
            self.expert_info.setText("")
            self._plot()
            return
        self.title.setText(printable(name))
        self.expert.blockSignals(True)
        self.expert.setRange(0, max(e.n_mat - 1, 0))
        self.expert.setValue(0)
        self.expert.setSuffix(f" of {e.n_mat}")
        self.expert.blockSignals(False)
        self.expert.setEnabled(e.n_mat > 1)
        self.expert.setVisible(e.n_mat > 1)  # only 3-D (expert) entries have more than one matrix
        self._plot()

    # ------------------------------------------------------------------ plot
    def _axes(self, on: bool) -> None:
        for side in ("left", "bottom"):
            self.plot.getPlotItem().showAxis(side, on)

    def _log_toggled(self, on: bool) -> None:
        self.plot.setLogMode(x=False, y=on)
        self.plot.enableAutoRange()

    def _plot(self) -> None:
        im, name = self.imatrix, self.tensor
        e = im.entries.get(name) if im is not None and name is not None else None
        w = im.weights(name) if e is not None and im is not None and name is not None else None
        if e is None or w is None or e.n_cols == 0:
            self.values = None
            self.curve.setData([], [])
            self._axes(False)
            self.expert_info.setText("")
            return
        j = self.expert.value() if e.n_mat > 1 else 0
        n = e.n_cols
        self.values = w[j * n:(j + 1) * n] if e.n_mat > 1 else w
        self._axes(True)
        color = group_color(j)
        self.curve.setData(np.arange(self.values.size), self.values, pen=pg.mkPen(color, width=1.2))
        count = int(e.counts[j]) if e.n_mat > 1 else int(e.counts[0])
        what = "activation rows" if not im.is_legacy else "calls"  # type: ignore[union-attr]
        self.expert_info.setText(f"{n:,} columns · {count:,} {what}"
                                 + (" (never routed: weights 1)" if e.n_mat > 1 and count == 0 else ""))
        self.plot.enableAutoRange()

    def _hover(self, scene_pos: object) -> None:
        v = self.values
        if v is None or v.size == 0:
            return
        vb = self.plot.getPlotItem().vb
        if not vb.sceneBoundingRect().contains(scene_pos):
            return
        col = round(vb.mapSceneToView(scene_pos).x())
        if 0 <= col < v.size:
            self.hover.setText(f"column {col:,}: weight {float(v[col]):.6g}")

    def closeEvent(self, event: Any) -> None:
        self.cancel()
        super().closeEvent(event)
