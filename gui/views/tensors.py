"""Tensors: a tree by layer and a flat filterable table; the selected tensor's details, statistics, histogram
and heatmap, computed in a worker with the native kernels and cached per file."""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import QModelIndex, QPoint, QRectF, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QGuiApplication, QKeySequence
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMenu,
    QPushButton,
    QSplitter,
    QTableView,
    QTabWidget,
    QTreeView,
    QVBoxLayout,
    QWidget,
)

from quantscope.core.analysis import (
    Heatmap,
    TensorAnalysis,
    analyze_tensor,
    blocks_per_row,
    can_read_values,
    element_location,
    heatmap,
)
from quantscope.core.gguf import TensorInfo
from quantscope.core.quant.lab import is_quantizable
from quantscope.core.summary import human_bytes

from ..document import Document
from ..exports import Exporter
from ..guard import qt_guarded
from ..models import (
    KEY_ROLE,
    KeyValueModel,
    TensorFilterProxy,
    TensorTableModel,
    TensorTreeModel,
    plural,
    shape_text,
)
from ..theme import BAD_COLOR, group_color
from ..widgets.fit import ElidedLabel, fit_columns
from ..widgets.jobstrip import JobStrip
from ..workers import JobSlot, TaskRunner

HOVER_HINT = "Hover the heatmap for row, column and value; click a cell to open its block."
_DIVERGING = "CET-D1"
_SEQUENTIAL = "viridis"
#: A heatmap of at most this many rows labels each row (one tick per row).
FEW_ROWS = 8
#: The tensor list's width when a tensor is shown from elsewhere (the Probe's links) and it was narrower.
LIST_MIN_WIDTH = 320
#: Typing in the filter applies it after this pause.
FILTER_DELAY_MS = 150


@qt_guarded
class TensorsView(QWidget):
    """The Tensors tab."""

    inspectRequested = Signal(str, int, int, int)  # tensor, row, block, element
    analysisReady = Signal(str)
    tensorSelected = Signal(str)  # the selected tensor changed
    requantizeRequested = Signal(str)  # "Requantize in the Quant lab"

    def __init__(self, runner: TaskRunner, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.runner = runner
        self.doc: Document | None = None
        self.tensor: TensorInfo | None = None
        self.analysis: TensorAnalysis | None = None
        self.heat: Heatmap | None = None
        #: the statistics of the selected tensor, and a refinement of its heatmap: one job each
        self.stats_job = JobSlot(runner, self, on_busy=self._set_progress_visible)
        self.heat_job = JobSlot(runner, self, on_busy=lambda busy: self.refine_btn.setEnabled(not busy))

        left = self._build_lists()
        right = self._build_values()

        split = self.split = QSplitter()
        split.addWidget(left)
        split.addWidget(right)
        split.setStretchFactor(0, 4)
        split.setStretchFactor(1, 7)
        split.setSizes([560, 880])
        lay = QVBoxLayout(self)
        lay.addWidget(split)

        # typing filters after a pause (one pass per pause, not per key)
        self._filter_timer = QTimer(self)
        self._filter_timer.setSingleShot(True)
        self._filter_timer.setInterval(FILTER_DELAY_MS)
        self._filter_timer.timeout.connect(lambda: self._filter(self.filter.text()))
        self.filter.textChanged.connect(lambda _t: self._filter_timer.start())
        self.tree.selectionModel().currentChanged.connect(self._tree_current)
        self.table.selectionModel().currentRowChanged.connect(self._table_current)
        self._set_progress_visible(False)
        self.strip.hide()  # shown with its first message

    # ------------------------------------------------------------------ construction
    def _build_lists(self) -> QWidget:
        """The left column: the filter, the tensors by layer and all of them, the count."""
        self.filter = QLineEdit()
        self.filter.setPlaceholderText("Filter by name or type, e.g. ffn_down or Q4_K (Ctrl+F)…")
        self.filter.setClearButtonEnabled(True)
        self.filter.setAccessibleName("Filter tensors")
        self.tree_model = TensorTreeModel()
        self.tree_proxy = TensorFilterProxy(self, recursive=True)
        self.tree_proxy.setSourceModel(self.tree_model)
        self.tree = QTreeView()
        self.tree.setModel(self.tree_proxy)
        self.tree.setAccessibleName("Tensors by layer")
        self.tree.setUniformRowHeights(True)
        self.tree.setAlternatingRowColors(True)
        self.tree.setSortingEnabled(False)
        self.table_model = TensorTableModel()
        self.table_proxy = TensorFilterProxy(self)
        self.table_proxy.setSourceModel(self.table_model)
        self.table = QTableView()
        self.table.setModel(self.table_proxy)
        self.table.setAccessibleName("All tensors")
        self.table.setSortingEnabled(True)
        self.table.sortByColumn(5, Qt.SortOrder.AscendingOrder)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(22)
        self.table.setAlternatingRowColors(True)
        for view in (self.tree, self.table):
            fit_columns(view, stretch=0, optional=(3, 5, 2, 6, 4), min_stretch=150, max_stretch=300)
            view.activated.connect(self._activated)  # Enter, or a double click
            view.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
            view.customContextMenuRequested.connect(lambda pos, v=view: self._context_menu(v, pos))
        self.lists = QTabWidget()
        self.lists.addTab(self.tree, "By layer")
        self.lists.addTab(self.table, "All tensors")
        self.lists.setAccessibleName("Tensor lists")
        self.count = QLabel()
        self.count.setObjectName("muted")
        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        ll.addWidget(self.filter)
        ll.addWidget(self.lists, 1)
        ll.addWidget(self.count)
        return left

    def _build_values(self) -> QWidget:
        """The right column: the title, the details, the statistics' :class:`JobStrip`, the statistics and
        histogram over the heatmap."""
        self.title = QLabel("Select a tensor")
        self.title.setObjectName("heading")
        self.title.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details_model = KeyValueModel(headers=("Property", "Value"))
        self.details = QTableView()
        self.details.setModel(self.details_model)
        self.details.setAccessibleName("Tensor details")
        self.details.verticalHeader().setVisible(False)
        self.details.verticalHeader().setDefaultSectionSize(21)
        fit_columns(self.details, stretch=1, min_stretch=80)
        self.details.setMaximumHeight(240)
        self._build_strip()
        stats_page = self._build_stats_page()
        heat_page = self._build_heat_page()
        self.value_split = QSplitter(Qt.Orientation.Vertical)
        self.value_split.addWidget(stats_page)
        self.value_split.addWidget(heat_page)
        self.value_split.setStretchFactor(0, 2)
        self.value_split.setStretchFactor(1, 3)
        self.value_split.setAccessibleName("Tensor values")
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.addWidget(self.title)
        rl.addWidget(self.details)
        rl.addWidget(self.strip)
        rl.addWidget(self.value_split, 1)
        return right

    def _build_strip(self) -> None:
        """The statistics' status, progress, Cancel and Compute (hidden until its first message)."""
        self.strip = JobStrip("statistics", "Compute", run_name="Compute the statistics", progress_width=16777215)
        self.strip.status.setObjectName("muted")
        self.strip.status.setWordWrap(False)
        self.strip.cancel_clicked.connect(lambda: self.stats_job.cancel())
        self.strip.run_clicked.connect(lambda: self.start_analysis(force=True))
        self.strip.set_can_run(False)  # offered after a cancelled or failed run
        self.progress = self.strip.progress
        self.progress_label = self.strip.status
        self.cancel_btn = self.strip.cancel_btn
        self.retry_btn = self.strip.run_btn

    def _build_stats_page(self) -> QWidget:
        """The statistics table beside the histogram of the values."""
        self.stats_model = KeyValueModel(headers=("Statistic", "Value"))
        self.stats = QTableView()
        self.stats.setModel(self.stats_model)
        self.stats.setAccessibleName("Tensor statistics")
        self.stats.verticalHeader().setVisible(False)
        self.stats.verticalHeader().setDefaultSectionSize(21)
        fit_columns(self.stats, stretch=1, min_stretch=60)
        self.stats.setMaximumWidth(300)
        self.hist = pg.PlotWidget()
        self.hist.setAccessibleName("Histogram of the tensor's values")
        self.hist.setLabel("bottom", "value")
        self.hist.setLabel("left", "count")
        self.hist.showGrid(x=True, y=True, alpha=0.2)
        self.hist.getAxis("bottom").enableAutoSIPrefix(False)
        self.log_y = QCheckBox("log count")
        self.log_y.setAccessibleName("Logarithmic histogram counts")
        self.log_y.toggled.connect(lambda on: self.hist.setLogMode(y=on))

        stats_page = QWidget()
        sl = QHBoxLayout(stats_page)
        sl.setContentsMargins(0, 4, 0, 0)
        sl.addWidget(self.stats)
        hl = QVBoxLayout()
        hl.addWidget(self.hist, 1)
        hl.addWidget(self.log_y)
        sl.addLayout(hl, 1)
        return stats_page

    def _build_heat_page(self) -> QWidget:
        """The heatmap of the dequantized matrix, its cell statistic, Refine and Whole matrix, the hover line."""
        self.heat_widget = pg.GraphicsLayoutWidget()
        self.heat_widget.setAccessibleName("Heatmap of the dequantized matrix")
        self.heat_plot = self.heat_widget.addPlot()
        self.heat_plot.invertY(True)
        self.heat_plot.setLabel("bottom", "column (ne0)")
        self.heat_plot.setLabel("left", "row")
        self.image = pg.ImageItem(axisOrder="row-major")
        self.heat_plot.addItem(self.image)
        self.colorbar = pg.ColorBarItem(values=(-1, 1), colorMap=pg.colormap.get(_DIVERGING), interactive=False,
                                        width=14)
        self.colorbar.setImageItem(self.image, insert_in=self.heat_plot)
        #: a column or row marked from outside (the Probe tab's channel links): (axis, index) and its line
        self.mark: tuple[str, int] | None = None
        self.mark_item = pg.InfiniteLine(angle=90, movable=False)
        self.mark_item.setZValue(20)
        self.mark_item.hide()
        self.heat_plot.addItem(self.mark_item, ignoreBounds=True)
        self.heat_mode = QComboBox()
        self.heat_mode.addItems(["mean", "RMS"])
        self.heat_mode.setAccessibleName("Heatmap cell statistic")
        self.heat_mode.currentIndexChanged.connect(self._draw_heatmap)
        self.refine_btn = QPushButton("Refine visible region")
        self.refine_btn.setAccessibleName("Recompute the heatmap for the visible region at full detail")
        self.refine_btn.clicked.connect(self.refine_heatmap)
        self.reset_btn = QPushButton("Whole matrix")
        self.reset_btn.setAccessibleName("Show the whole matrix again")
        self.reset_btn.clicked.connect(self._reset_heatmap)
        self.hover = QLabel(HOVER_HINT)
        self.hover.setObjectName("muted")
        self.hover.setAccessibleName("Heatmap position")
        self.hover.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.heat_info = ElidedLabel()
        self.heat_info.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.heat_info.setObjectName("muted")
        self.heat_plot.scene().sigMouseMoved.connect(self._heat_hover)
        self.heat_plot.scene().sigMouseClicked.connect(self._heat_click)
        self.exporter = Exporter(self, self.runner)
        self.exporter.install_plot_menu(self.hist, "histogram", self._tensor_actions)
        self.exporter.install_plot_menu(self.heat_widget, "heatmap", self._tensor_actions)

        heat_page = QWidget()
        hpl = QVBoxLayout(heat_page)
        hpl.setContentsMargins(0, 4, 0, 0)
        bar = QHBoxLayout()
        bar.addWidget(QLabel("Cell shows"))
        bar.addWidget(self.heat_mode)
        bar.addWidget(self.refine_btn)
        bar.addWidget(self.reset_btn)
        bar.addWidget(self.heat_info, 1)  # elided when narrow, whole in its tool tip
        hpl.addLayout(bar)
        hpl.addWidget(self.heat_widget, 1)
        hpl.addWidget(self.hover)
        return heat_page

    # ------------------------------------------------------------------ document
    def set_document(self, doc: Document | None) -> None:
        """A new file (or none): nothing of the last one's selection, jobs or messages stays."""
        self.stats_job.forget()
        self.heat_job.forget()
        self.progress_label.setText("")
        self.strip.hide()
        self.strip.set_can_run(False)
        self.heat_info.setText("")
        self.hover.setText(HOVER_HINT)
        self.doc = doc
        f = doc.gguf if doc else None
        self.tree_model.set_file(f)
        self.table_model.set_file(f)
        self.tree.expandToDepth(-1)
        if self.tree_model.rowCount():
            self.tree.expand(self.tree_proxy.index(0, 0))
        self._filter(self.filter.text())
        self.tensor = None
        self.analysis = None
        self.clear_mark()
        self.title.setText("Select a tensor")
        self.details_model.set_rows([])
        self.stats_model.set_rows([])
        self.hist.clear()
        self.image.clear()
        self.heat = None
        self._heat_axes(False)
        self._hist_axes(False)

    def _hist_axes(self, on: bool) -> None:
        for side in ("left", "bottom"):
            self.hist.getPlotItem().showAxis(side, on)

    def _heat_axes(self, on: bool) -> None:
        """Axes and colour bar only around a drawn heatmap (an empty plot's −400…400 axes mean nothing)."""
        for side in ("left", "bottom"):
            self.heat_plot.showAxis(side, on)
        self.colorbar.setVisible(on)
        if on:
            self.hover.setText(HOVER_HINT)
        else:
            self.heat_info.setText("")
            self.hover.setText("Select a tensor: its heatmap appears here." if self.tensor is None else
                               "No heatmap for this tensor.")

    def key_help(self) -> list[tuple[str, str]]:
        """(keys, what they do) of this view, for the F1 list."""
        return [("Enter, double click", "open the tensor's first block in the block inspector"),
                ("Menu key, right click", "copy the name, open the block, show it in the heatmap")]

    def tensor_at(self, view: QTreeView | QTableView, index: QModelIndex) -> str | None:
        """The tensor name of a row of the tree or the table (None for a layer row)."""
        proxy = self.tree_proxy if view is self.tree else self.table_proxy
        name = proxy.data(index.siblingAtColumn(0), KEY_ROLE) if index.isValid() else None
        return name if isinstance(name, str) else None

    def _activated(self, index: QModelIndex) -> None:
        view = self.tree if self.sender() is self.tree else self.table
        name = self.tensor_at(view, index)
        if name is not None:
            self.open_block(name)

    def open_block(self, name: str) -> None:
        """Open the first block of ``name`` in the block inspector."""
        if self.doc is not None and self.doc.gguf is not None and self.doc.gguf.has_tensor(name):
            self.inspectRequested.emit(name, 0, 0, 0)

    def show_heatmap(self, name: str) -> None:
        """Select ``name`` and make sure the heatmap pane is open, with the keyboard focus on it; a filter that
        hides ``name`` is cleared (the tensor shown is listed)."""
        self.flush_filter()
        src = self._source_index(self.table_model, name)
        if src is not None and not self.table_proxy.mapFromSource(src).isValid():
            self.filter.blockSignals(True)
            self.filter.clear()
            self.filter.blockSignals(False)
            self._filter("")
        self.select_tensor(name)
        sizes = self.split.sizes()
        if len(sizes) == 2 and sizes[0] < LIST_MIN_WIDTH:  # the list keeps room for the names
            self.split.setSizes([LIST_MIN_WIDTH, max(1, sum(sizes) - LIST_MIN_WIDTH)])
        sizes = self.value_split.sizes()
        if len(sizes) == 2 and sizes[1] < 120:
            self.value_split.setSizes([max(1, sum(sizes) * 2 // 5), sum(sizes) * 3 // 5])
        self.heat_widget.setFocus()

    def context_actions(self, name: str) -> list[QAction]:
        """The tensor context menu's actions (tests trigger them directly)."""
        copy = QAction("Copy name", self)
        copy.triggered.connect(lambda: QGuiApplication.clipboard().setText(name))
        block = QAction("Open in the block inspector", self)
        block.setShortcut(QKeySequence(Qt.Key.Key_Return))
        block.triggered.connect(lambda: self.open_block(name))
        heat = QAction("Show in the heatmap", self)
        heat.triggered.connect(lambda: self.show_heatmap(name))
        t = self.doc.gguf.tensor(name) if self.doc is not None and self.doc.gguf is not None else None
        whole = self.doc is not None and self.doc.remote is None  # a remote file: only its blocks are read
        block.setEnabled(t is not None and t.type is not None and not t.problem)
        heat.setEnabled(whole and t is not None and can_read_values(t))
        values = QAction("Export values as .npy (float32)…", self)
        values.triggered.connect(lambda: self.export_tensor(name, raw=False))
        values.setEnabled(whole and t is not None and can_read_values(t))
        raw = QAction("Export raw blocks as .npy…", self)
        raw.triggered.connect(lambda: self.export_tensor(name, raw=True))
        raw.setEnabled(whole and t is not None and t.type is not None and not t.problem and t.n_bytes is not None)
        return [copy, block, heat, values, raw]

    def _tensor_actions(self) -> list[QAction]:
        """The selected tensor's export actions, at the top of the plots' menus."""
        return self.context_actions(self.tensor.name)[3:] if self.tensor is not None else []

    def export_tensor(self, name: str, *, raw: bool, path: str | None = None) -> object:
        """Write ``name`` as .npy (asks where unless ``path``), in the runner."""
        if self.doc is None or self.doc.gguf is None:
            return None
        return self.exporter.tensor_npy(self.doc.gguf, name, raw=raw, path=path)

    def lab_action(self, name: str) -> QAction:
        """The context menu's "Requantize in the Quant lab" (enabled for the weights llama-quantize quantizes)."""
        a = QAction("Requantize in the Quant lab", self)
        a.triggered.connect(lambda: self.requantizeRequested.emit(name))
        f = self.doc.gguf if self.doc is not None else None
        local = self.doc is not None and self.doc.remote is None
        a.setEnabled(local and f is not None and f.has_tensor(name) and can_read_values(f.tensor(name))
                     and is_quantizable(f.tensor(name), f.architecture or ""))
        return a

    def _context_menu(self, view: QTreeView | QTableView, pos: QPoint) -> None:
        at = view.indexAt(pos)
        name = self.tensor_at(view, at)
        if name is None and not at.isValid():  # the Menu key (or a click off the rows): the current row
            name = self.tensor_at(view, view.currentIndex())
            if name is not None:
                pos = view.visualRect(view.currentIndex()).center()
        if name is None:
            return
        menu = QMenu(self)
        menu.setAccessibleName(f"Actions for {name}")
        for a in [*self.context_actions(name), self.lab_action(name)]:
            a.setParent(menu)
            menu.addAction(a)
        self.context_menu = menu
        menu.popup(view.viewport().mapToGlobal(pos))

    def _filter(self, text: str) -> None:
        """Keep the tensors whose name or type holds ``text`` (both lists; the tree's layers opened)."""
        self._filter_timer.stop()
        changed = self.table_proxy.set_needle(text)
        if self.tree_proxy.set_needle(text) or changed:
            if text.strip():
                self.tree.expandAll()
        self.count.setText(f"{self.table_proxy.rowCount():,} of {plural(self.table_model.rowCount(), 'tensor')}")

    def _tree_current(self, current: QModelIndex, _prev: QModelIndex) -> None:
        name = self.tree_proxy.data(current.siblingAtColumn(0), KEY_ROLE)
        if isinstance(name, str):
            self.select_tensor(name)

    def _table_current(self, current: QModelIndex, _prev: QModelIndex) -> None:
        name = self.table_proxy.data(current.siblingAtColumn(0), KEY_ROLE)
        if isinstance(name, str):
            self.select_tensor(name)

    def flush_filter(self) -> None:
        """Apply the filter text now if a pause in the typing is still awaited (the lists must be current)."""
        if self._filter_timer.isActive():
            self._filter(self.filter.text())

    def select_tensor(self, name: str) -> None:
        """Show ``name``'s details and start (or show the cached) statistics."""
        if self.doc is None or self.doc.gguf is None:
            return
        self.flush_filter()
        t = self.doc.gguf.tensor(name)
        if self.tensor is not None and self.tensor.name == name:
            return
        self.tensor = t
        self.clear_mark()
        self._sync_selection(name)
        self.tensorSelected.emit(name)
        self.title.setText(t.name)
        bpw = t.bits_per_weight
        rows = [
            ("type", t.type_name + (f" ({t.type.block_elems} elements in {t.type.block_bytes} bytes per block)"
                                    if t.type and t.type.is_quantized else "")),
            ("shape (ne, ggml order)", shape_text(t)),
            ("matrix", f"{t.n_rows:,} rows × {t.row_len:,} columns"),
            ("elements", f"{t.n_elements:,}"),
            ("bytes", f"{t.n_bytes:,} ({human_bytes(t.n_bytes)})" if t.n_bytes is not None else "?"),
            ("file offset", f"{t.data_offset:,} (data section + {t.offset:,})"),
            ("bits per weight", f"{bpw:.4f}" if bpw is not None else "?"),
            ("blocks per row", f"{blocks_per_row(t):,}"),
        ]
        colors = {}
        if t.problem:
            rows.append(("problem", t.problem))
            colors[len(rows) - 1] = pg.mkColor(BAD_COLOR)
        self.details_model.set_rows(rows, colors)
        self.start_analysis()

    def _sync_selection(self, name: str) -> None:
        """Select ``name`` in the tree (expanding its layer) and in the table, without re-entering."""
        for view, proxy, model in ((self.tree, self.tree_proxy, self.tree_model),
                                   (self.table, self.table_proxy, self.table_model)):
            src = self._source_index(model, name)
            idx = proxy.mapFromSource(src) if src is not None else QModelIndex()
            if idx.isValid() and view.currentIndex().siblingAtColumn(0) != idx:
                view.blockSignals(True)
                view.selectionModel().blockSignals(True)
                if idx.parent().isValid():
                    view.expand(idx.parent())  # type: ignore[attr-defined]
                view.setCurrentIndex(idx)
                view.scrollTo(idx)
                view.selectionModel().blockSignals(False)
                view.blockSignals(False)

    @staticmethod
    def _source_index(model: TensorTreeModel | TensorTableModel, name: str) -> QModelIndex | None:
        if isinstance(model, TensorTableModel):
            for r, t in enumerate(model.tensors):
                if t.name == name:
                    return model.index(r, 0)
            return None
        for g, (_, ts) in enumerate(model.groups):
            for r, t in enumerate(ts):
                if t.name == name:
                    return model.index(r, 0, model.index(g, 0))
        return None

    # ------------------------------------------------------------------ analysis
    def start_analysis(self, force: bool = False) -> None:
        doc, t = self.doc, self.tensor
        if doc is None or doc.gguf is None or t is None:
            return
        self.stats_job.forget()
        self.heat_job.forget()
        cached = doc.analyses.get(t.name)
        if cached is not None and not force:
            self._show_analysis(cached)
            return
        self.analysis = None
        self.stats_model.set_rows([])
        self.hist.clear()
        self.image.clear()
        self._heat_axes(False)
        self._hist_axes(False)
        self.heat = None
        if t.n_elements == 0:
            self.progress_label.setText(f"{t.name} has no values: its shape ne = {list(t.ne)} has a zero dimension.")
            self.strip.show()
            return
        if not can_read_values(t):
            self.progress_label.setText(f"Values of {t.type_name} cannot be computed"
                                        + (f": {t.problem}" if t.problem else "."))
            self.strip.show()
            return
        if doc.remote is not None:  # every value of the tensor: its whole extent, not the blocks inspected
            self.progress_label.setText(f"Statistics and the heatmap read all {t.n_elements:,} values of {t.name}, "
                                        "and this file is on the hub: Download it (above) for them.")
            self.strip.show()
            return
        f = doc.gguf
        self.strip.set_can_run(False)
        self.strip.started(f"Dequantizing {t.name} ({t.n_elements:,} values) with the native kernels…")

        def work(report, token):  # type: ignore[no-untyped-def]
            return analyze_tensor(f, t, progress=lambda d, n: report(d, n), cancel=token)

        def progress(done: int, total: int, _text: str) -> None:
            self.strip.progress_to(done, total)

        def done(a: TensorAnalysis) -> None:
            doc.analyses[t.name] = a
            self._show_analysis(a)
            self.analysisReady.emit(t.name)

        def cancelled() -> None:
            self.progress_label.setText("Statistics cancelled.")
            self.strip.set_can_run(True)

        def failed(msg: str, _tb: str) -> None:
            self.progress_label.setText(f"Statistics failed: {msg}")
            self.strip.set_can_run(True)

        self.stats_job.start("tensor-stats", work, on_done=done, on_progress=progress, on_cancelled=cancelled,
                             on_failed=failed)

    def _set_progress_visible(self, on: bool) -> None:
        """The statistics job's busy state: its bar and Cancel while it runs; its label (the outcome) stays."""
        self.strip.set_busy(on)
        if on:
            self.strip.show()

    def _show_analysis(self, a: TensorAnalysis) -> None:
        self.analysis = a
        self.strip.set_can_run(False)
        self.progress_label.setText(f"Computed in {a.seconds:.2f} s (cached)")
        self.strip.show()
        s = a.stats
        self.stats_model.set_rows([
            ("min", f"{s.min:.7g}"), ("max", f"{s.max:.7g}"), ("mean", f"{s.mean:.7g}"), ("std", f"{s.std:.7g}"),
            ("elements", f"{s.n_elements:,}"), ("finite", f"{s.n_finite:,}"), ("NaN", f"{s.n_nan:,}"),
            ("Inf", f"{s.n_inf:,}"), ("zeros", f"{s.n_zero:,}"),
        ], {i: pg.mkColor(BAD_COLOR) for i in (6, 7) if (s.n_nan if i == 6 else s.n_inf)})
        self.hist.clear()
        self._hist_axes(True)
        h = a.histogram
        self.hist.plot(h.edges, h.counts, stepMode="center", fillLevel=0, brush=pg.mkBrush(group_color(0)),
                       pen=pg.mkPen(group_color(0).darker(120)))
        self.heat = a.heatmap
        self._draw_heatmap()

    def _draw_heatmap(self) -> None:
        hm = self.heat
        if hm is None:
            return
        mode = "rms" if self.heat_mode.currentIndex() == 1 else "mean"
        img = hm.rms if mode == "rms" else hm.mean
        if img.size == 0 or hm.n_cols == 0 or hm.n_rows == 0:
            self.image.clear()
            self._heat_axes(False)
            self.heat_info.setText("no values to draw")
            return
        self._heat_axes(True)
        lo, hi = hm.levels(mode)
        self.colorbar.setColorMap(pg.colormap.get(_SEQUENTIAL if mode == "rms" else _DIVERGING))
        self.image.setImage(img, autoLevels=False)
        self.colorbar.setLevels((lo, hi))
        self.image.setRect(QRectF(hm.col0, hm.row0, hm.n_cols, hm.n_rows))
        self.heat_plot.setRange(xRange=(hm.col0, hm.col0 + hm.n_cols), yRange=(hm.row0, hm.row0 + hm.n_rows),
                                padding=0)
        # rows are whole numbers: a matrix of a few rows gets one tick per row (at its middle), not 0.2, 0.4, …
        left = self.heat_plot.getAxis("left")
        if hm.n_rows <= FEW_ROWS:
            left.setTicks([[(r + 0.5, f"{r:,}") for r in range(hm.row0, hm.row0 + hm.n_rows)], []])
        else:
            left.setTicks(None)
        self._place_mark()
        h, w = hm.shape
        self.heat_info.setText(f"{h} × {w} pixels, each {hm.row_step} row(s) × {hm.col_step} column(s)"
                               + ("" if hm.exact else " (zoom, then refine for detail)"))

    def mark_line(self, axis: str, index: int) -> bool:
        """Mark column (``axis`` "column": ne0 index) or row ``index`` of the selected tensor with a thin line over
        the heatmap (cleared when another tensor is selected); False when the tensor has no such column/row."""
        t = self.tensor
        if t is None or axis not in ("column", "row"):
            return False
        if not 0 <= index < (t.row_len if axis == "column" else t.n_rows):
            return False
        self.mark = (axis, int(index))
        self._place_mark()
        return True

    def clear_mark(self) -> None:
        self.mark = None
        self.mark_item.hide()

    def _place_mark(self) -> None:
        """Draw the mark over a drawn heatmap (hidden while there is none), and say what it is."""
        if self.mark is None:
            self.mark_item.hide()
            return
        axis, index = self.mark
        self.mark_item.setAngle(90 if axis == "column" else 0)
        self.mark_item.setPos(index + 0.5)
        self.mark_item.setPen(pg.mkPen("#ff3b30", width=2, cosmetic=True))
        self.mark_item.setVisible(self.heat is not None)
        self.hover.setText(f"Marked: {axis} {index:,} (a channel of the residual stream, from the Probe tab). "
                           + HOVER_HINT)

    def refine_heatmap(self) -> None:
        """Recompute the heatmap for the visible rows/columns at up to 512 × 512 pixels."""
        doc, t = self.doc, self.tensor
        if doc is None or doc.gguf is None or t is None or self.heat is None:
            return
        (x0, x1), (y0, y1) = self.heat_plot.viewRange()
        rows = (max(0, int(y0)), min(t.n_rows, int(y1) + 1))
        cols = (max(0, int(x0)), min(t.row_len, int(x1) + 1))
        if rows[1] <= rows[0] or cols[1] <= cols[0]:
            return
        f = doc.gguf
        self.heat_info.setText(f"refining rows {rows[0]:,}–{rows[1]:,}, columns {cols[0]:,}–{cols[1]:,}…")

        def work(report, token):  # type: ignore[no-untyped-def]
            return heatmap(f, t, rows=rows, cols=cols, progress=lambda d, n: report(d, n), cancel=token)

        def done(hm: Heatmap) -> None:
            if self.tensor is t:
                self.heat = hm
                self._draw_heatmap()

        def failed(msg: str, _tb: str) -> None:
            self.heat_info.setText(f"refining failed: {msg}")

        self.heat_job.start("heatmap", work, on_done=done, on_failed=failed)

    def _reset_heatmap(self) -> None:
        if self.analysis is not None:
            self.heat = self.analysis.heatmap
            self._draw_heatmap()

    def _matrix_pos(self, scene_pos: object) -> tuple[int, int] | None:
        hm, t = self.heat, self.tensor
        if hm is None or t is None:
            return None
        vb = self.heat_plot.vb
        if not vb.sceneBoundingRect().contains(scene_pos):
            return None
        p = vb.mapSceneToView(scene_pos)
        row, col = int(p.y()), int(p.x())
        if p.y() < 0 or p.x() < 0 or hm.cell_at(row, col) is None:
            return None
        return row, col

    def _heat_hover(self, scene_pos: object) -> None:
        pos = self._matrix_pos(scene_pos)
        if pos is None or self.heat is None or self.tensor is None:
            return
        row, col = pos
        cell = self.heat.cell_at(row, col)
        assert cell is not None
        block, elem = element_location(self.tensor, row, col)
        where = f"row {row:,}, col {col:,} → block {block:,}, element {elem}"
        if self.heat.exact:
            self.hover.setText(f"{where} · value {cell.mean:.6g}")
        else:
            self.hover.setText(f"{where} · cell rows {cell.row0:,}–{cell.row1 - 1:,} × cols {cell.col0:,}–"
                               f"{cell.col1 - 1:,}: mean {cell.mean:.5g}, RMS {cell.rms:.5g}")

    def _heat_click(self, event: object) -> None:
        if event.button() != Qt.MouseButton.LeftButton:  # type: ignore[attr-defined]  # right: the plot menu
            return
        pos = self._matrix_pos(event.scenePos())  # type: ignore[attr-defined]
        if pos is None or self.tensor is None or self.tensor.type is None:
            return
        row, col = pos
        block, elem = element_location(self.tensor, row, col)
        self.inspectRequested.emit(self.tensor.name, row, block, elem)
