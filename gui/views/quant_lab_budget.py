"""The Quant lab's "Budget" page (issue 39): quantize to a size, not a preset.

Measure (a cancellable worker with progress): each quantizable tensor's cost per candidate type, the KL divergence it
adds to the model's output on a calibration text (:func:`quantscope.core.quant.sensitivity.tensor_costs`; measured
costs are cached by file, text, imatrix, tensor and type, so measuring again reuses them). Then the size/KLD front
(each point the best mix at a size; the presets Q3_K_M, Q4_K_M and Q5_K_M drawn on the same scale), a budget slider
that solves at once (:meth:`quantscope.core.quant.target.TargetSpace.solve`: no file access), the chosen type of
every tensor and why, the sensitivity tables (per tensor, per layer), "Check the mix" (the refine step: measure the
chosen estimates, solve again, measure the whole mix) and Write (the ordinary quantizer, through a worker).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDoubleSpinBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSlider,
    QSpinBox,
    QSplitter,
    QTableView,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from quantscope.core import sysinfo
from quantscope.core.bump import Cancelled
from quantscope.core.fsutil import OutputSet, PathRefused, printable, read_text_input
from quantscope.core.gguf import GGUFFile
from quantscope.core.jobs import RateMeter, format_duration
from quantscope.core.quant.mixture import layer_of
from quantscope.core.quant.quantize import QuantizeCancelled, QuantizeError, write_quantized
from quantscope.core.quant.sensitivity import CostCancelled, TensorCosts, sensitivity_report, tensor_costs
from quantscope.core.quant.target import (
    DEFAULT_TYPES,
    Mix,
    TargetSpace,
    refine_target,
    rules_text,
    target_space,
)
from quantscope.core.summary import human_bytes

from ..document import Document
from ..guard import qt_guarded
from ..models import KEY_ROLE, SORT_ROLE, SortFilterProxy, plural
from ..theme import group_color, muted_color, plot_pen_color
from ..widgets.fit import ElidedLabel, fit_columns
from ..widgets.jobstrip import JobStrip
from ..widgets.paths import browse_row, output_path
from ..widgets.plots import CompactPlot
from ..workers import JobSlot, Task

MEASURE_TASK = "budget-measure"
WRITE_TASK = "budget-write"
REFINE_TASK = "budget-refine"
PRESETS = ("Q3_K_M", "Q4_K_M", "Q5_K_M")
PRESET_COLOR = "#e15759"
CHOSEN_COLOR = "#f28e2b"
SLIDER_STEPS = 1000
DEFAULT_CTX = 64
_MIB = float(1 << 20)
_Index = QModelIndex | QPersistentModelIndex
_ROOT = QModelIndex()
_ALIGN_RIGHT = int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)


def default_cost_dir() -> Path:
    """Where the measured costs are kept (the CLI's ``--cost-cache`` default): ``quantscope/costs`` in the user's
    cache folder (:func:`~quantscope.core.sysinfo.user_cache_dir`)."""
    return sysinfo.user_cache_dir() / "quantscope" / "costs"


def kld_text(v: float | None, measured: bool = True, digits: int = 3) -> str:
    """A divergence as the tables show it: ``digits`` significant digits; ``≈`` where it was extended, not measured
    (``measured=None``: no mark, the table marks it otherwise)."""
    if v is None:
        return ""
    return ("≈" if measured is False else "") + ("0" if v == 0 else f"{v:.{digits}g}")


def milli_text(v: float) -> str:
    """A divergence in thousandths of a nat, short (the sensitivity tables: many type columns side by side)."""
    m = 1000.0 * v
    if m == 0:
        return "0"
    if m >= 99.5:  # (not "1e+02")
        return f"{m:,.0f}"
    return f"{m:.2g}" if m >= 0.01 else f"{m:.0e}"


def against_text(cost: float, other: float) -> str:
    """How a predicted divergence ``cost`` compares with ``other`` (> 0) in words: "40 % less", "7.6× less",
    "20 % more", "the same" (a ratio past 2 is a factor: a percentage would round up to "100 % less")."""
    if cost == other:
        return "the same"

    def num(v: float) -> str:
        return f"{v:,.0f}" if v >= 10 else f"{v:.2g}"

    if cost < other:
        if cost > 0 and other / cost >= 2:
            return f"{num(other / cost)}× less"
        return f"{num(100 * (1 - cost / other))} % less"
    return f"{num(100 * (cost / other - 1))} % more"


def tensor_key(name: str) -> str:
    """Sort key of a tensor name: by block number (the others first), then by name."""
    return f"{layer_of(name) + 1:09d} {name}"


# ------------------------------------------------------------------------------------------------------- results


@dataclass
class BudgetRun:
    """What measuring hands back: the costs and what is drawn from them (the front, the presets)."""

    space: TargetSpace
    costs: list[TensorCosts]
    candidates: list[tuple[str, list[str]]]  # what was measured (the candidates and the presets' types)
    chunks: np.ndarray
    front: list[Mix]
    presets: dict[str, Mix]
    seconds: float
    timings: dict[str, float]
    text_name: str
    imatrix: Any = None  # the lab's imatrix the costs were measured with (None: none)


def why_text(space: TargetSpace, c: TensorCosts, chosen: str, lam: float | None) -> tuple[str, str]:
    """Why ``chosen`` (short, and the tool tip's long form): the larger candidate the budget would buy next, what
    it would save and its price per MiB against the price the budget pays (the solver's multiplier)."""
    allowed = dict(space.candidates).get(c.name, [])
    opts = sorted((space.padded(space.tensor_bytes(c.name, q)), c.costs[q], q) for q in c.costs if q in allowed)
    if len(opts) <= 1:
        return "the only type that fits", "the only candidate type that fits the tensor's rows"
    b0 = space.padded(space.tensor_bytes(c.name, chosen))
    c0 = c.costs[chosen]
    up = [(b, v, q) for b, v, q in opts if b > b0 and v < c0]
    if not up:
        return "nothing larger costs less", "the best candidate: no larger type adds less divergence"
    b, v, q = max(up, key=lambda o: (c0 - o[1]) / (o[0] - b0))
    rate = (c0 - v) / ((b - b0) / _MIB)
    price = (f"; the budget pays {lam * _MIB:.3g} per MiB at the margin, so the bytes buy more elsewhere"
             if lam is not None and lam > 0 else "; the budget has no bytes left for it")
    return (f"next {q}: −{c0 - v:.2g} for +{human_bytes(b - b0)}",
            f"{q} would lower the divergence by {c0 - v:.3g} for {b - b0:,} more bytes ({rate:.3g} per MiB){price}")


# ---------------------------------------------------------------------------------------------------- table model


@qt_guarded
class RowsModel(QAbstractTableModel):
    """A read-only table of rows: each cell (text, sort value); column 0's key is the row's tensor name."""

    def __init__(self, headers: list[str], tips: list[str] | None = None) -> None:
        super().__init__()
        self.headers = headers
        self.tips = tips or [""] * len(headers)
        self.rows: list[list[tuple[str, Any]]] = []
        self.keys: list[str] = []
        self.right: set[int] = set()
        self.row_tips: list[list[str]] = []
        self.muted: set[tuple[int, int]] = set()  # (row, column) of the cells drawn muted (estimated values)

    def set_rows(self, headers: list[str], rows: list[list[tuple[str, Any]]], keys: list[str],
                 right: set[int] | None = None, tips: list[str] | None = None,
                 row_tips: list[list[str]] | None = None) -> None:
        self.beginResetModel()
        self.headers, self.rows, self.keys = headers, rows, keys
        self.tips = tips or [""] * len(headers)
        self.right = right or set()
        self.row_tips = row_tips or []
        self.endResetModel()

    def update_rows(self, rows: list[list[tuple[str, Any]]]) -> None:
        """Same rows and columns, other values (a slider move): no reset, the selection and scroll stay."""
        if len(rows) != len(self.rows):
            self.set_rows(self.headers, rows, self.keys, self.right, self.tips, self.row_tips)
            return
        self.rows = rows
        if rows:
            self.dataChanged.emit(self.index(0, 0), self.index(len(rows) - 1, len(self.headers) - 1))

    def rowCount(self, parent: _Index = _ROOT) -> int:
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent: _Index = _ROOT) -> int:
        return 0 if parent.isValid() else len(self.headers)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if orientation != Qt.Orientation.Horizontal or not 0 <= section < len(self.headers):
            return None
        if role == Qt.ItemDataRole.DisplayRole:
            return self.headers[section]
        if role == Qt.ItemDataRole.ToolTipRole:
            return self.tips[section] or None
        return None

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        r, c = index.row(), index.column()
        text, sort = self.rows[r][c]
        if role == Qt.ItemDataRole.DisplayRole:
            return text
        if role == SORT_ROLE:
            return sort
        if role == KEY_ROLE:
            return self.keys[r]
        if role == Qt.ItemDataRole.ToolTipRole:
            tip = self.row_tips[r][c] if r < len(self.row_tips) and c < len(self.row_tips[r]) else ""
            return tip or text or None
        if role == Qt.ItemDataRole.TextAlignmentRole and c in self.right:
            return _ALIGN_RIGHT
        if role == Qt.ItemDataRole.ForegroundRole and (r, c) in self.muted:
            return muted_color()
        return None


def _table(model: Any, name: str) -> QTableView:
    t = QTableView()
    t.setModel(model)
    t.setAccessibleName(name)
    t.setSortingEnabled(True)
    t.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    t.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    t.verticalHeader().setVisible(False)
    t.verticalHeader().setDefaultSectionSize(21)
    t.setAlternatingRowColors(True)
    return t


# ------------------------------------------------------------------------------------------------------ the front


@qt_guarded
class FrontPlot(CompactPlot):
    """File size (MiB) against the predicted mean KL divergence (log): the front of best mixes as a line of points,
    the presets as labelled diamonds on the same scale, the chosen mix and the budget line."""

    def __init__(self) -> None:
        super().__init__((420, 260))
        self.setAccessibleName("The size/KLD front: each point the best mix at a size, the presets marked")
        self.showGrid(x=True, y=True, alpha=0.2)
        self.setMouseEnabled(x=False, y=False)
        self.hideButtons()
        self.setMenuEnabled(False)
        pi = self.getPlotItem()
        pi.setLabel("bottom", "file size (MiB)")
        pi.setLabel("left", "predicted mean KLD (log)")
        self.getAxis("left").setLogMode(True)
        self.getAxis("left").enableAutoSIPrefix(False)
        self.getAxis("bottom").enableAutoSIPrefix(False)
        self.line = pg.PlotDataItem(pen=pg.mkPen(group_color(0), width=1.5))
        self.points = pg.ScatterPlotItem(size=5, brush=pg.mkBrush(group_color(0)), pen=None, hoverable=True)
        self.preset_points = pg.ScatterPlotItem(size=11, symbol="d", brush=pg.mkBrush(PRESET_COLOR),
                                                pen=pg.mkPen(plot_pen_color(), width=0.8))
        self.chosen = pg.ScatterPlotItem(size=12, symbol="o", brush=pg.mkBrush(CHOSEN_COLOR),
                                         pen=pg.mkPen(plot_pen_color(), width=1.2))
        self.budget_line = pg.InfiniteLine(angle=90, movable=False,
                                           pen=pg.mkPen(muted_color(), width=1, style=Qt.PenStyle.DashLine))
        for it in (self.line, self.points, self.preset_points, self.chosen):
            self.addItem(it)
        self.addItem(self.budget_line, ignoreBounds=True)
        self.budget_line.hide()
        self.labels: dict[str, pg.TextItem] = {}
        self.front: list[tuple[float, float]] = []  # (MiB, log10 KLD)
        self.preset_xy: dict[str, tuple[float, float]] = {}

    @staticmethod
    def _y(cost: float, floor: float) -> float:
        return math.log10(cost) if cost > 0 else floor

    def set_front(self, front: list[Mix], presets: dict[str, Mix]) -> None:
        costs = [m.cost for m in front] + [m.cost for m in presets.values()]
        pos = [c for c in costs if c > 0]
        floor = math.log10(min(pos)) - 0.3 if pos else -6.0
        self._floor = floor
        self.front = [(m.file_bytes / _MIB, self._y(m.cost, floor)) for m in front]
        xs = [p[0] for p in self.front]
        ys = [p[1] for p in self.front]
        self.line.setData(xs, ys)
        tips = [f"{human_bytes(m.file_bytes)}: predicted KLD {m.cost:.4g}" for m in front]
        self.points.setData(xs, ys, data=tips, tip=lambda x, y, data: data)
        self.preset_xy = {p: (m.file_bytes / _MIB, self._y(m.cost, floor)) for p, m in presets.items()}
        self.preset_points.setData([v[0] for v in self.preset_xy.values()], [v[1] for v in self.preset_xy.values()])
        for name in list(self.labels):
            if name not in self.preset_xy:
                self.removeItem(self.labels.pop(name))
        allx = xs + [v[0] for v in self.preset_xy.values()]
        mid = (min(allx) + max(allx)) / 2 if allx else 0.0
        # by size, labels alternately above and below their diamonds (neighbouring presets often sit close); in the
        # right half of the plot a label ends at its diamond, so that none runs off the right edge
        for k, (name, (x, y)) in enumerate(sorted(self.preset_xy.items(), key=lambda kv: kv[1][0])):
            ti = self.labels.get(name)
            if ti is None:
                ti = pg.TextItem(name, color=PRESET_COLOR)
                self.labels[name] = ti
                self.addItem(ti, ignoreBounds=True)
            ti.setAnchor((1 if x > mid else 0, 1 if k % 2 == 0 else 0))
            ti.setPos(x, y)
        ally = ys + [v[1] for v in self.preset_xy.values()]
        if allx:
            xpad = 0.04 * (max(allx) - min(allx) or 1)
            ypad = 0.08 * (max(ally) - min(ally) or 1)
            self.setXRange(min(allx) - xpad, max(allx) + 3 * xpad, padding=0)
            self.setYRange(min(ally) - ypad, max(ally) + 2 * ypad, padding=0)

    def set_chosen(self, mix: Mix | None, budget: int | None) -> None:
        if mix is None:
            self.chosen.setData([])
            self.budget_line.hide()
            return
        floor = getattr(self, "_floor", -6.0)
        self.chosen.setData([mix.file_bytes / _MIB], [self._y(mix.cost, floor)])
        if budget is not None:
            self.budget_line.setValue(budget / _MIB)
            self.budget_line.show()

    def clear_all(self) -> None:
        self.set_front([], {})
        self.set_chosen(None, None)


# ------------------------------------------------------------------------------------------------------- the page


@qt_guarded
def card_inputs(tp: Any, size: int, measured: float | None, text: str) -> Any:
    """What a model card says of a mix written here (core/publish.py's CardInputs): the target-size figures as
    ``quantize --target-size --json`` reports them (target, bits per weight, the predicted mean KLD, the measured
    one when the mix was checked), the calibration text and the ``--tensor-type`` rules. No perplexity: the page
    measures none."""
    from quantscope.core.publish import CardInputs

    target: dict[str, Any] = {"target_bytes": size, "bpw_out": tp.plan.bits_per_weight(True),
                              "predicted_kld": tp.predicted_cost, "preset": tp.plan.preset.name}
    if measured is not None:
        target["refine"] = {"measured_kld": measured}
    calibration = Path(text).expanduser() if text else None
    return CardInputs(calibration=calibration if calibration is not None and calibration.is_file() else None,
                      rules=rules_text(tp.rules), target=target)


class BudgetPanel(QWidget):
    """The "Budget" page: measure the costs, then choose a size on the front and write the mix."""

    measureFinished = Signal(object)  # the BudgetRun, or None
    writeFinished = Signal(object)  # the written path, or None
    refineFinished = Signal(object)  # the Refinement, or None

    def __init__(self, view: Any) -> None:
        super().__init__()
        self.view = view
        self.runner = view.runner
        self.doc: Document | None = None
        self.run: BudgetRun | None = None
        self.mix: Mix | None = None
        self.budget: int | None = None
        self.cache_dir: Path | None = default_cost_dir()
        self.threads = 0
        self.task: Task | None = None
        self.job_slot = JobSlot(self.runner, self, on_busy=self._busy_changed)
        self._pending: tuple[Any, object] | None = None  # a finished signal, emitted once the page is idle
        self.state = "idle"  # idle | running | done | cancelled | failed (the measuring)
        self.write_state = "idle"  # idle | running | done | cancelled | failed
        self.error: str | None = None
        self.written: Path | None = None
        self.refined: Any = None
        self.meter = RateMeter()
        self._gen = 0
        self._syncing = False

        row1, row2 = self._build_calibration()
        left = self._build_front()
        right = self._build_tables()

        self._solve_timer = QTimer(self)  # a slider drag solves once per event-loop pass, not per pixel
        self._solve_timer.setSingleShot(True)
        self._solve_timer.setInterval(0)
        self._solve_timer.timeout.connect(self._solve)

        self.split = QSplitter()
        self.split.addWidget(left)
        self.split.addWidget(right)
        right.setMinimumWidth(560)  # room for the names and half a dozen type columns; the plot takes the rest
        self.split.setStretchFactor(0, 2)
        self.split.setStretchFactor(1, 3)
        self.split.setSizes([2000, 3000])  # 2:3 from the start (a QSplitter scales these to its width)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 4, 0, 0)
        lay.addLayout(row1)
        lay.addLayout(row2)
        lay.addWidget(self.split, 1)
        self.set_document(None)

    # ------------------------------------------------------------------ construction
    def _build_calibration(self) -> tuple[QHBoxLayout, QHBoxLayout]:
        """The calibration text and types (first row); its length, chunks and the measuring's :class:`JobStrip`
        (second row)."""
        from .compare_dialog import sample_text_path

        self.text_path = QLineEdit(str(sample_text_path() or ""))
        self.text_path.setAccessibleName("Calibration text the costs are measured on")
        self.text_path.setPlaceholderText("a UTF-8 text file")
        text_row, _b = browse_row(self.text_path, "Calibration text", "Text (*.txt);;All files (*)", self,
                                  save=False, accessible="Choose the calibration text")
        self.types_edit = QLineEdit(",".join(DEFAULT_TYPES))
        self.types_edit.setAccessibleName("Candidate types (comma-separated)")
        self.types_edit.setToolTip("The types the solver may give a tensor (each must fit the tensor's rows)")
        self.ctx_spin = QSpinBox()
        self.ctx_spin.setAccessibleName("Calibration chunk length in tokens")
        self.ctx_spin.setRange(8, 4096)
        self.ctx_spin.setValue(DEFAULT_CTX)
        self.chunks_spin = QSpinBox()
        self.chunks_spin.setAccessibleName("Calibration chunks")
        self.chunks_spin.setRange(1, 256)
        self.chunks_spin.setValue(1)
        self.strip = JobStrip("budget", "Measure", scale=1000, progress_width=160, status=ElidedLabel(),
                              status_last=True, disable_run=True, run_name="Measure every tensor's cost per type")
        self.strip.cancel_btn.setAccessibleName("Cancel the budget page's work")
        self.strip.status.setObjectName("muted")
        self.strip.run_clicked.connect(self.start)
        self.strip.cancel_clicked.connect(self.cancel)
        self.measure_btn = self.strip.run_btn
        self.cancel_btn = self.strip.cancel_btn
        self.progress = self.strip.progress
        self.status: ElidedLabel = self.strip.status  # type: ignore[assignment]

        row1 = QHBoxLayout()
        lab_t = QLabel("Calibration text")
        lab_t.setBuddy(self.text_path)
        row1.addWidget(lab_t)
        row1.addWidget(text_row, 3)
        lab_y = QLabel("Types")
        lab_y.setBuddy(self.types_edit)
        row1.addWidget(lab_y)
        row1.addWidget(self.types_edit, 2)
        row2 = QHBoxLayout()
        lab_c = QLabel("Tokens")
        lab_c.setBuddy(self.ctx_spin)
        row2.addWidget(lab_c)
        row2.addWidget(self.ctx_spin)
        lab_n = QLabel("Chunks")
        lab_n.setBuddy(self.chunks_spin)
        row2.addWidget(lab_n)
        row2.addWidget(self.chunks_spin)
        row2.addWidget(self.strip, 1)
        return row1, row2

    def _build_front(self) -> QWidget:
        """The left column: the size/KLD front, the budget slider and presets, the chosen mix, Output, Check and
        Write."""
        self.plot = FrontPlot()
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setAccessibleName("Budget: the file size")
        self.slider.setRange(0, SLIDER_STEPS)
        self.slider.valueChanged.connect(self._slider_moved)
        self.size_spin = QDoubleSpinBox()
        self.size_spin.setAccessibleName("Budget in MiB")
        self.size_spin.setDecimals(2)
        self.size_spin.setSuffix(" MiB")
        self.size_spin.setKeyboardTracking(False)
        self.size_spin.valueChanged.connect(self._spin_changed)
        self.preset_btns: dict[str, QPushButton] = {}
        self.summary = QLabel()
        self.summary.setAccessibleName("The chosen mix")
        self.summary.setWordWrap(True)
        self.output = QLineEdit()
        self.output.setAccessibleName("Output GGUF of the mix")
        out_row, _o = browse_row(self.output, "The mixed GGUF", "GGUF (*.gguf);;All files (*)", self, save=True,
                                 accessible="Choose where to write the mix")
        self.write_btn = QPushButton("Write")
        self.write_btn.setAccessibleName("Write the mix (and its --tensor-type rules)")
        self.write_btn.clicked.connect(self.write)
        self.publish_btn = QPushButton("Publish…")
        self.publish_btn.setAccessibleName("Publish the written file and its model card to the Hugging Face hub")
        self.publish_btn.setToolTip("Upload the file written last, with a model card that gives the figures "
                                    "measured here, to a repository on the Hugging Face hub")
        self.publish_btn.clicked.connect(self.publish)
        self.publish_inputs: Any = None  # the card's figures of the file written last (core.publish.CardInputs)
        self.publish_dialog: Any = None
        self.refine_btn = QPushButton("Check the mix")
        self.refine_btn.setAccessibleName("Measure the chosen estimates, solve again and measure the whole mix")
        self.refine_btn.setToolTip("Measure the KL divergence of the chosen types that were only estimated, solve "
                                   "again, then measure the whole mix on the calibration text")
        self.refine_btn.clicked.connect(self.refine)

        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        ll.setSpacing(4)
        ll.addWidget(self.plot, 1)
        srow = QHBoxLayout()
        lab_b = QLabel("Budget")
        lab_b.setBuddy(self.slider)
        srow.addWidget(lab_b)
        srow.addWidget(self.slider, 1)
        srow.addWidget(self.size_spin)
        ll.addLayout(srow)
        self.preset_row = QHBoxLayout()
        lab_p = QLabel("At the size of")
        lab_p.setObjectName("muted")
        self.preset_row.addWidget(lab_p)
        for p in PRESETS:
            b = QPushButton(p)
            b.setAccessibleName(f"Set the budget to the {p} preset's size")
            b.clicked.connect(lambda _c=False, p=p: self.set_budget_to_preset(p))
            self.preset_btns[p] = b
            self.preset_row.addWidget(b)
        self.preset_row.addStretch(1)
        ll.addLayout(self.preset_row)
        ll.addWidget(self.summary)
        wrow = QHBoxLayout()
        lab_o = QLabel("Output")
        lab_o.setBuddy(self.output)
        wrow.addWidget(lab_o)
        wrow.addWidget(out_row, 1)
        wrow.addWidget(self.refine_btn)
        wrow.addWidget(self.write_btn)
        wrow.addWidget(self.publish_btn)
        ll.addLayout(wrow)
        return left

    def _build_tables(self) -> QWidget:
        """The right column: the filter, the chosen types and the sensitivity tables, their units."""
        self.mix_model = RowsModel(["Tensor", "From", "Type", "Size", "KLD", "Why"])
        self.mix_proxy = SortFilterProxy(self)
        self.mix_proxy.setSourceModel(self.mix_model)
        self.mix_table = _table(self.mix_proxy, "The chosen type per tensor and why")
        fit_columns(self.mix_table, stretch=5, optional=(1, 3), min_stretch=200,
                    elide=Qt.TextElideMode.ElideRight)
        self.mix_table.sortByColumn(0, Qt.SortOrder.AscendingOrder)
        self.tensor_model = RowsModel(["Tensor"])
        self.tensor_proxy = SortFilterProxy(self)
        self.tensor_proxy.setSourceModel(self.tensor_model)
        self.tensor_table = _table(self.tensor_proxy, "KLD each type adds, per tensor")
        fit_columns(self.tensor_table, stretch=0, optional=(1,), min_stretch=150, max_stretch=230)
        self.layer_model = RowsModel(["Layer"])
        self.layer_proxy = SortFilterProxy(self)
        self.layer_proxy.setSourceModel(self.layer_model)
        self.layer_table = _table(self.layer_proxy, "KLD each type adds, per layer")
        fit_columns(self.layer_table, stretch=0, min_stretch=60)
        self.filter = QLineEdit()
        self.filter.setAccessibleName("Filter the tensors")
        self.filter.setPlaceholderText("Filter by tensor or type…")
        self.filter.setClearButtonEnabled(True)
        for p in (self.mix_proxy, self.tensor_proxy):
            self.filter.textChanged.connect(p.setFilterFixedString)
        self.tables = QTabWidget()
        self.tables.setAccessibleName("Budget tables")
        self.tables.addTab(self.mix_table, "Chosen types")
        self.tables.addTab(self.tensor_table, "Sensitivity per tensor")
        self.tables.addTab(self.layer_table, "Per layer")
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.setSpacing(2)
        rl.addWidget(self.filter)
        rl.addWidget(self.tables, 1)
        self.units = QLabel("Sensitivity tables: the KL divergence each type adds, in thousandths of a nat; muted: "
                            "extended from the tensor's measured type by the weighted error.")
        self.units.setObjectName("muted")
        self.units.setWordWrap(True)
        rl.addWidget(self.units)
        return right

    # ------------------------------------------------------------------ document
    def set_document(self, doc: Document | None) -> None:
        self._gen += 1
        self._pending = None
        self.job_slot.forget()
        self.doc = doc
        self.run = None
        self.mix = None
        self.budget = None
        self.written = None
        self.refined = None
        self.state = "idle"
        self.write_state = "idle"
        self.task = None
        self._clear_results()
        if doc is not None and doc.gguf is not None:
            self.status.setText("Measure what each type of each tensor adds to the KL divergence on the text, "
                                "then choose a size.")
            stem = doc.path.stem
            self.output.setText(str(output_path(doc.path, f"{stem}-mix.gguf")))
        else:
            self.status.setText("")
        self._update_buttons()

    def _clear_results(self) -> None:
        self.plot.clear_all()
        self.mix_model.set_rows(["Tensor", "From", "Type", "Size", "KLD", "Why"], [], [])
        self.tensor_model.set_rows(["Tensor"], [], [])
        self.layer_model.set_rows(["Layer"], [], [])
        self.summary.setText("")
        self.progress.setVisible(False)

    def _finished(self, signal: Any, value: object) -> None:
        """Emit ``signal(value)`` once the job has ended and the page is idle (a listener may start the next)."""
        self._pending = (signal, value)
        if not self.job_slot.busy:
            self._busy_changed(False)

    def _busy_changed(self, busy: bool) -> None:
        self._update_buttons()
        if not busy and self._pending is not None:
            signal, value = self._pending
            self._pending = None
            signal.emit(value)

    def _update_buttons(self) -> None:
        busy = self.job_slot.busy
        has = self.doc is not None and self.doc.gguf is not None
        self.strip.set_can_run(has)
        self.strip.set_busy(busy)
        ready = self.run is not None
        for w in (self.slider, self.size_spin, *self.preset_btns.values()):
            w.setEnabled(ready and not busy)
        for p, b in self.preset_btns.items():
            b.setVisible(self.run is None or p in self.run.presets)
        current = ready and self.run is not None and self.run.imatrix is self.view.imatrix
        self.write_btn.setEnabled(current and not busy and self.mix is not None)
        self.refine_btn.setEnabled(current and not busy and self.mix is not None)
        self.publish_btn.setEnabled(not busy and self.written is not None and self.publish_inputs is not None)
        for w in (self.text_path, self.types_edit, self.ctx_spin, self.chunks_spin):
            w.setEnabled(not busy)

    def imatrix_changed(self) -> None:
        """The lab's imatrix changed: the measured costs are another imatrix's; Write and Check wait for Measure."""
        if self.run is not None and self.run.imatrix is not self.view.imatrix:
            self.status.setText("The imatrix changed since the costs were measured: Measure again.")
        self._update_buttons()

    # ------------------------------------------------------------------ measure
    def start(self) -> bool:
        """Measure the costs in a worker (cached ones are reused); False when it cannot start (the status says)."""
        doc = self.doc
        if doc is None or doc.gguf is None or self.job_slot.busy:
            return False
        f = doc.gguf
        path = Path(self.text_path.text().strip()).expanduser()
        types = [t for t in self.types_edit.text().replace(" ", ",").split(",") if t.strip()]
        ctx, n_chunks = self.ctx_spin.value(), self.chunks_spin.value()
        im, im_label = self.view.imatrix, str(self.view.imatrix_path or "")
        cache_dir, threads = self.cache_dir, self.threads
        requant = any(t.type is not None and t.type.is_quantized for t in f.tensors)
        self._gen += 1
        gen = self._gen
        self.state = "running"
        self.error = None
        # the results shown (if any) stay until the new ones replace them: a cancelled or failed measure keeps them
        self.meter = RateMeter()
        self.progress.setValue(0)
        self.status.setText("Reading the text…")

        def work(report, token):  # type: ignore[no-untyped-def]
            from quantscope.core.engine.kld import chunk_ids
            from quantscope.core.tokenizer import Tokenizer

            t0 = time.perf_counter()
            try:  # a regular UTF-8 file of bounded size: a FIFO, a device or a folder is refused, never waited on
                text = read_text_input(path, "the calibration text")
            except PathRefused as exc:
                msg = str(exc)
                raise ValueError(msg if "calibration text" in msg else f"the calibration text {msg}") from None
            chunks = chunk_ids(Tokenizer(f).encode(text), ctx, n_chunks, min_chunks=1)
            space = target_space(f, types=types, imatrix=im, imatrix_label=im_label, allow_requantize=requant,
                                 threads=threads)
            cands = space.measure_candidates(PRESETS)
            timings: dict[str, float] = {}
            try:
                costs = tensor_costs(f, cands, chunks, imatrix=space.imatrix, cache_dir=cache_dir, threads=threads,
                                     progress=report, cancel=lambda: token.cancelled, timings=timings)
            except CostCancelled:
                raise Cancelled("cancelled") from None
            front = space.front(costs)
            presets = {p: m for p in PRESETS if (m := space.preset_mix(p, costs)) is not None}
            return BudgetRun(space, costs, cands, chunks, front, presets, time.perf_counter() - t0, timings,
                             path.name, im)

        def progress(done: int, total: int, text: str) -> None:
            if gen != self._gen or total <= 0:
                return
            self.progress.setValue(int(1000 * done / total))
            _rate, eta = self.meter.update(done, total)
            self.status.setText(f"Measuring {printable(text) or '…'} · {done}/{total} tensors · "
                                f"{format_duration(eta)} left")

        def done(res: BudgetRun) -> None:
            if gen == self._gen:
                self._show(res)
                self._finished(self.measureFinished, res)

        def failed(msg: str, _tb: str) -> None:
            if gen == self._gen:
                self.state = "failed"
                self.error = msg
                self.status.setText(f"Measuring failed: {printable(msg)}")
                self.status.setToolTip(printable(msg))
                self._finished(self.measureFinished, None)

        def cancelled() -> None:
            if gen == self._gen:
                self.state = "cancelled"
                self.status.setText("Cancelled: what was measured is kept for the next run" + (
                    "; the plot and tables show the previous measure." if self.run is not None else "."))
                self._finished(self.measureFinished, None)

        task = self.job_slot.start(MEASURE_TASK, work, on_done=done, on_progress=progress, on_failed=failed,
                                   on_cancelled=cancelled)
        self.task = task if self.job_slot.busy else None
        return True

    def cancel(self) -> None:
        if self.job_slot.busy:
            self.status.setText("Cancelling…")
            self.job_slot.cancel()

    def _show(self, res: BudgetRun) -> None:
        self.run = res
        self.refined = None  # a check of the previous costs' mix
        self.state = "done"
        self.task = None
        sp = res.space
        self.plot.set_front(res.front, res.presets)
        self._syncing = True
        self.size_spin.setRange(sp.smallest_file_bytes / _MIB, sp.largest_file_bytes / _MIB)
        self._syncing = False
        self._fill_sensitivity(res)
        measured = sum(1 for c in res.costs for q, v in c.measured.items()
                       if v and q != sp.f.tensor(c.name).type_name)  # (a tensor's own type is copied: not measured)
        self.status.setText(f"{plural(len(res.costs), 'tensor')} measured on {printable(res.text_name)} in "
                            f"{res.seconds:.1f} s ({plural(measured, 'divergence')} measured, the rest extended "
                            "by the weighted error).")
        start = res.presets.get("Q4_K_M")
        self.set_budget(start.file_bytes if start is not None else (sp.smallest_file_bytes + sp.largest_file_bytes)
                        // 2)
        self._update_buttons()

    def _fill_sensitivity(self, res: BudgetRun) -> None:
        rep = sensitivity_report(res.space.f, res.costs)
        chosen = {q for _, qs in res.space.candidates for q in qs}
        types = [q for q in rep["types"] if q in chosen]  # type: ignore[union-attr]  # (not the presets' extras)
        rows, keys, tips = [], [], []
        muted: set[tuple[int, int]] = set()
        for r, t in enumerate(rep["tensors"]):  # type: ignore[union-attr]
            cells: list[tuple[str, Any]] = [(printable(t["name"]), tensor_key(t["name"])), (t["type"], t["type"])]
            tip = ["", ""]
            for i, q in enumerate(types):
                k = t["kld"].get(q)
                cells.append((milli_text(k["value"]), k["value"]) if k else ("", -1.0))
                how = "measured" if k and k["measured"] else "extended from the measured type by the weighted error"
                tip.append("" if not k else f"{q}: {k['value']:.4g} ({how})")
                if k and not k["measured"]:
                    muted.add((r, 2 + i))
            rows.append(cells)
            keys.append(t["name"])
            tips.append(tip)
        right = set(range(2, 2 + len(types)))
        hdr_tips = ["", "the tensor's type in this file"] + [
            f"the mean KL divergence {q} adds on the text, in thousandths of a nat (muted: extended from the "
            "measured type by the weighted error)" for q in types]
        self.tensor_model.set_rows(["Tensor", "From", *types], rows, keys, right, hdr_tips, tips)
        self.tensor_model.muted = muted
        lrows, lkeys = [], []
        for r in rep["layers"]:  # type: ignore[union-attr]
            li = r["layer"]
            cells = [("other" if li < 0 else str(li), li), (str(r["tensors"]), r["tensors"])]
            for q in types:
                k = r["kld"].get(q)
                cells.append((milli_text(k["sum"]) + ("" if k["tensors"] == r["tensors"] else
                                                      f" ({k['tensors']})"), k["sum"]) if k else ("", -1.0))
            lrows.append(cells)
            lkeys.append(str(li))
        self.layer_model.set_rows(["Layer", "Tensors", *types], lrows, lkeys, set(range(1, 2 + len(types))),
                                  ["blk.N (other: the embedding, the output head)", "quantizable tensors"]
                                  + [f"the sum of what {q} adds to each of the layer's tensors (in brackets: how many "
                                     "can take it)" for q in types])
        last = tuple(range(1 + len(types), 1, -1))  # no room: the widest types go first (never a scroll bar)
        self.tensor_table._column_fitter.optional = (1, *last)  # type: ignore[attr-defined]
        self.layer_table._column_fitter.optional = last  # type: ignore[attr-defined]
        for t in (self.tensor_table, self.layer_table):
            t.sortByColumn(0, Qt.SortOrder.AscendingOrder)

    # ------------------------------------------------------------------ budget
    def set_budget(self, size: int) -> None:
        """Solve for ``size`` file bytes (clamped to the smallest and largest mix) and show the mix."""
        if self.run is None:
            return
        sp = self.run.space
        size = max(sp.smallest_file_bytes, min(int(size), sp.largest_file_bytes))
        self.budget = size
        self._syncing = True
        lo, hi = sp.smallest_file_bytes, sp.largest_file_bytes
        self.slider.setValue(round(SLIDER_STEPS * (size - lo) / max(hi - lo, 1)))
        self.size_spin.setValue(size / _MIB)
        self._syncing = False
        self._solve()

    def set_budget_to_preset(self, preset: str) -> None:
        if self.run is not None and preset in self.run.presets:
            self.set_budget(self.run.presets[preset].file_bytes)

    def _slider_moved(self, v: int) -> None:
        if self._syncing or self.run is None:
            return
        sp = self.run.space
        lo, hi = sp.smallest_file_bytes, sp.largest_file_bytes
        self.budget = lo + (hi - lo) * v // SLIDER_STEPS
        self._syncing = True
        self.size_spin.setValue(self.budget / _MIB)
        self._syncing = False
        self._solve_timer.start()

    def _spin_changed(self, mib: float) -> None:
        if self._syncing or self.run is None:
            return
        self.set_budget(int(mib * _MIB))

    def _solve(self) -> None:
        run, size = self.run, self.budget
        if run is None or size is None:
            return
        sp = run.space
        try:
            mix = sp.solve(run.costs, size=size)
        except (QuantizeError, ValueError) as exc:
            self.mix = None
            self.summary.setText(printable(str(exc)))
            self._update_buttons()
            return
        self._show_mix(mix, size)

    def checked_plan(self) -> Any:
        """The check's plan when the mix shown is the one it measured (None otherwise)."""
        r = self.refined
        if r is None or self.mix is None or r.plan.choices != self.mix.choices:
            return None
        return r.plan

    def _show_mix(self, mix: Mix, size: int) -> None:
        """Show ``mix`` (solved for ``size`` bytes, or the one the check measured): the plot, table and summary."""
        run = self.run
        assert run is not None
        sp = run.space
        self.mix = mix
        self.plot.set_chosen(mix, size)
        by = {c.name: c for c in run.costs}
        lam = mix.solution.lam if mix.solution is not None else None
        rows: list[list[tuple[str, Any]]] = []
        tips: list[list[str]] = []
        for n, q in mix.choices.items():
            c = by[n]
            src = sp.f.tensor(n).type_name
            nb = sp.tensor_bytes(n, q)
            why, why_tip = why_text(sp, c, q, lam)
            rows.append([(printable(n), tensor_key(n)), (src, src), (q, q), (human_bytes(nb), nb),
                         (kld_text(c.costs[q], bool(c.measured.get(q))), c.costs[q]), (why, why)])
            how = "measured" if c.measured.get(q) else "extended by the weighted error"
            tips.append(["", "", "", f"{nb:,} bytes", f"{c.costs[q]:.4g} ({how})", why_tip])
        if self.mix_model.keys == list(mix.choices):
            self.mix_model.row_tips = tips
            self.mix_model.update_rows(rows)
        else:
            self.mix_model.set_rows(["Tensor", "From", "Type", "Size", "KLD", "Why"], rows, list(mix.choices),
                                    {3, 4}, ["", "the tensor's type in this file", "the type the mix gives it",
                                             "its bytes in that type", "the KL divergence it adds (≈: extended)",
                                             "what the next larger type would buy"], tips)
        counts: dict[str, int] = {}
        for q in mix.choices.values():
            counts[q] = counts.get(q, 0) + 1
        near = ""
        for p, pm in run.presets.items():
            if abs(pm.file_bytes - size) <= max(sp.alignment, size // 2000) and pm.cost > 0:
                near = f" · {p}, the same size, predicts {pm.cost:.4g}: the mix {against_text(mix.cost, pm.cost)}"
        check = ""
        if self.refined is not None:
            swapped = len(self.refined.swapped)
            how = f" (it replaced the mix shown before: {plural(swapped, 'tensor')} changed type)" if swapped else ""
            check = (f"<br>Checked{how}: the whole mix measures <b>{self.refined.measured_kld:.4g}</b> on the text; "
                     "Write writes this mix." if self.checked_plan() is not None else
                     "<br>Not the checked mix (the budget changed since the check): Check the mix measures it.")
        self.summary.setText(
            f"<b>{human_bytes(mix.file_bytes)}</b> ({mix.file_bytes:,} bytes, "
            f"{sp.bpw(mix.tensor_bytes):.3f} bpw) within {human_bytes(size)} · predicted mean KLD "
            f"<b>{mix.cost:.4g}</b>{near}<br>"
            + ", ".join(f"{q} ×{k}" for q, k in sorted(counts.items(), key=lambda kv: -kv[1])) + check)
        self._update_buttons()

    # ------------------------------------------------------------------ check (refine) and write
    def refine(self) -> bool:
        """Measure the chosen types that were only estimated, solve again, measure the whole mix (a worker)."""
        run, mix, size = self.run, self.mix, self.budget
        if run is None or mix is None or size is None or self.job_slot.busy:
            return False
        sp = run.space
        try:
            tp = sp.plan(mix, run.costs, size)
        except QuantizeError as exc:
            self.summary.setText(printable(str(exc)))
            return False
        gen = self._gen
        cache_dir = self.cache_dir
        self.meter = RateMeter()
        self.progress.setValue(0)
        self.status.setText("Checking the mix…")

        def work(report, token):  # type: ignore[no-untyped-def]
            try:
                return refine_target(tp, sp, run.chunks, candidates=run.candidates, cache_dir=cache_dir,
                                     progress=report, cancel=lambda: token.cancelled)
            except CostCancelled:
                raise Cancelled("cancelled") from None

        def progress(done: int, total: int, text: str) -> None:
            if gen == self._gen and total > 0:
                self.progress.setValue(int(1000 * done / total))
                self.status.setText(f"Checking the mix: {printable(text) or '…'} · {done}/{total}")

        def done(r: Any) -> None:
            if gen != self._gen or self.run is not run:
                return
            self.refined = r
            by = {c.name: c for c in r.plan.costs.values()}
            run.costs = [by[c.name] if c.name in by else c for c in run.costs]
            p = r.plan
            checked = Mix(dict(p.choices), p.plan.file_bytes, p.plan.out_bytes, p.predicted_cost, p.solution)
            # the mix the check measured is the one shown (and written), not a solve that might differ from it
            self._show_mix(checked, size)
            measured = f"{plural(r.newly_measured, 'estimate')} measured"
            if r.swapped:
                # before → after first: the line is elided where the window is narrow (1100 px)
                self.status.setText(
                    f"The check replaced the mix (predicted {mix.cost:.3g} → {checked.cost:.3g}, "
                    f"{human_bytes(mix.file_bytes)} → {human_bytes(checked.file_bytes)}): "
                    f"{plural(len(r.swapped), 'tensor')} changed type once {measured}; the new mix measures "
                    f"{r.measured_kld:.4g} on the text. Write writes it.")
            else:
                self.status.setText(
                    f"The check kept the mix (predicted {mix.cost:.3g} → {checked.cost:.3g}; {measured}); it "
                    f"measures {r.measured_kld:.4g} on the text.")
            self.status.setToolTip(self.status.full_text())
            self._finished(self.refineFinished, r)

        def failed(msg: str, _tb: str) -> None:
            if gen == self._gen:
                self.status.setText(f"The check failed: {printable(msg)}")
                self._finished(self.refineFinished, None)

        def cancelled() -> None:
            if gen == self._gen:
                self.status.setText("The check was cancelled.")
                self._finished(self.refineFinished, None)

        self.job_slot.start(REFINE_TASK, work, on_done=done, on_progress=progress, on_failed=failed,
                            on_cancelled=cancelled)
        return True

    def write(self) -> bool:
        """Write the chosen mix to the output path with the ordinary quantizer (a worker), and its rule file."""
        run, mix, size, doc = self.run, self.mix, self.budget, self.doc
        if run is None or mix is None or size is None or doc is None or self.job_slot.busy:
            return False
        text = self.output.text().strip()
        if not text:
            self.status.setText("Choose an output path first.")
            return False
        out = Path(text).expanduser()
        rules_path = out.with_name(out.stem + ".tensor-types.txt")
        checked = self.checked_plan()
        measured = self.refined.measured_kld if checked is not None else None
        try:
            OutputSet([("Output", out), ("Rules", rules_path)], inputs=[doc.path])
            tp = checked if checked is not None else run.space.plan(mix, run.costs, size)
        except (PathRefused, QuantizeError) as exc:
            self.status.setText(f"Cannot write: {printable(exc)}")
            return False
        f: GGUFFile = run.space.f
        gen = self._gen
        self.write_state = "running"
        self.written = None
        self.meter = RateMeter()
        self.progress.setValue(0)
        self.status.setText("Writing…")

        def work(report, token):  # type: ignore[no-untyped-def]
            def on_progress(p: Any) -> None:
                report(p.done_bytes, p.total_bytes, f"{min(p.index + 1, p.count)}/{p.count} {p.tensor}")

            try:
                path = write_quantized(f, tp.plan, out, tp.options, on_progress, token)
            except QuantizeCancelled:
                raise Cancelled("cancelled") from None
            with OutputSet([("Rules", rules_path)], inputs=[doc.path, path]) as ro:
                ro.open("Rules")
                ro.write_bytes("Rules", rules_text(tp.rules).encode("utf-8"))
                ro.commit()
            return path

        def progress(done: int, total: int, text: str) -> None:
            if gen == self._gen and total > 0:
                self.progress.setValue(int(1000 * done / total))
                _rate, eta = self.meter.update(done, total)
                self.status.setText(f"Writing {printable(text)} · {format_duration(eta)} left")

        def done(path: Path) -> None:
            if gen != self._gen:
                return
            self.write_state = "done"
            self.written = path
            self.publish_inputs = card_inputs(tp, size, measured, self.text_path.text().strip())
            what = (f"the checked mix (measured {measured:.4g})" if measured is not None
                    else "a mix not checked as a whole")
            self.status.setText(f"Wrote {printable(path.name)}, {what} ({tp.plan.file_bytes:,} bytes, within the "
                                f"budget of {size:,}), and {printable(rules_path.name)}.")
            self.status.setToolTip(printable(str(path)))
            self._finished(self.writeFinished, path)

        def failed(msg: str, _tb: str) -> None:
            if gen == self._gen:
                self.write_state = "failed"
                self.error = msg
                self.status.setText(f"Writing failed: {printable(msg)} (nothing was left at the target path)")
                self._finished(self.writeFinished, None)

        def cancelled() -> None:
            if gen == self._gen:
                self.write_state = "cancelled"
                self.status.setText("Writing cancelled: nothing was written at the target path.")
                self._finished(self.writeFinished, None)

        self.job_slot.start(WRITE_TASK, work, on_done=done, on_progress=progress, on_failed=failed,
                            on_cancelled=cancelled)
        return True

    def publish(self) -> Any:
        """Publish…: the file written last and its card (with this page's figures) in the publish dialog."""
        from .publish_dialog import PublishDialog

        if self.written is None or self.publish_inputs is None:
            return None
        dlg = self.publish_dialog
        if dlg is None or dlg.runner.closed or (dlg.path != self.written and not dlg.job.busy):
            if dlg is not None:
                dlg.shutdown()
            dlg = PublishDialog(self.written, self.publish_inputs, self)
            self.publish_dialog = dlg
        dlg.show()
        dlg.raise_()
        return dlg

    def shutdown(self) -> None:
        """The window closing: a publish in flight is cancelled and its worker waited for."""
        if self.publish_dialog is not None:
            self.publish_dialog.shutdown()
