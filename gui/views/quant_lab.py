"""The Quant lab tab: what each quantization type loses (issue 18; llama.cpp's quantize-stats, in the app).

"Requantize": one weight's values (dequantized from the open file, or read from a higher-precision *reference* GGUF
of the same model; optionally weighted by an importance matrix) quantized into each candidate type in a worker. The
figures in a sortable table, bits per weight against a chosen error in a plot (the tensor's own type ringed), the
chosen type's per-block RMSE as a heatmap, and one block before and after with its requantized bytes decoded.

"Whole file": every quantizable weight × the chosen types (rows sampled), each tensor's figures and the per-type
summary, exported as JSON (``quant-stats --json``'s document) or CSV. Every figure comes from
:mod:`quantscope.core.quant.lab`; this module only shows them and runs the work through the :class:`TaskRunner`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PySide6.QtCore import QModelIndex, Qt, QTimer, Signal
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QCompleter,
    QFileDialog,
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMenu,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTableView,
    QTabWidget,
    QVBoxLayout,
    QWidget,
    QWidgetAction,
)

from quantscope.core.analysis import element_location
from quantscope.core.base.ggml_types import ggml_type
from quantscope.core.bump import Cancelled
from quantscope.core.fsutil import PathRefused, json_text, printable, write_atomic
from quantscope.core.gguf import GGUFError, GGUFFile
from quantscope.core.jobs import RateMeter, format_duration
from quantscope.core.quant import lab
from quantscope.core.quant.imatrix import Imatrix, read_imatrix

from ..document import Document
from ..guard import qt_guarded
from ..models import KEY_ROLE, SortFilterProxy, plural
from ..widgets.fit import ElidedLabel, fit_columns
from ..widgets.jobstrip import JobStrip, controls_row
from ..widgets.paths import output_path
from ..workers import JobSlot, Task, TaskRunner
from .quant_lab_budget import BudgetPanel
from .quant_lab_table import METRICS, ErrorRow, ErrorTableModel
from .quant_lab_widgets import BlockCompare, BlockHeatmap, BpwPlot

TENSOR_TASK = "requantize"
FILE_TASK = "quant-stats"
OPEN_TASK = "lab-open"
DEFAULT_TENSOR_ROWS = 1024
DEFAULT_FILE_ROWS = 256


def _shape(ne: tuple[int, ...] | list[int]) -> str:
    return " × ".join(str(d) for d in ne)


# --------------------------------------------------------------------------------------------------- type picker


@qt_guarded
class TypesButton(QPushButton):
    """"Types: all 17 ▾": a drop-down of check boxes, one per candidate type (it stays open while ticking)."""

    changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Candidate types")
        self.setToolTip("The types to requantize into")
        self.menu_ = QMenu(self)
        panel = QWidget()
        grid = QGridLayout(panel)
        grid.setContentsMargins(8, 6, 8, 6)
        self.boxes: dict[str, QCheckBox] = {}
        for i, q in enumerate(lab.CANDIDATE_TYPES):
            t = ggml_type(q)
            box = QCheckBox(q)
            box.setChecked(True)
            box.setAccessibleName(f"Requantize into {q}")
            bpw = 16.0 if q in ("F16", "BF16") else t.bits_per_weight
            box.setToolTip(f"{q}: {bpw:g} bits per weight, blocks of {t.block_elems}")
            box.toggled.connect(self._toggled)
            self.boxes[q] = box
            grid.addWidget(box, i // 3, i % 3)
        row = (len(lab.CANDIDATE_TYPES) + 2) // 3
        all_btn = QPushButton("All")
        all_btn.setAccessibleName("Every type")
        all_btn.clicked.connect(lambda: self.set_types(lab.CANDIDATE_TYPES))
        k_btn = QPushButton("K-quants + Q8_0")
        k_btn.setAccessibleName("The K-quants and Q8_0")
        k_btn.clicked.connect(lambda: self.set_types(("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_0")))
        grid.addWidget(all_btn, row, 0)
        grid.addWidget(k_btn, row, 1, 1, 2)
        action = QWidgetAction(self.menu_)
        action.setDefaultWidget(panel)
        self.menu_.addAction(action)
        self.setMenu(self.menu_)
        self._quiet = False
        self._label()

    def types(self) -> list[str]:
        return [q for q, b in self.boxes.items() if b.isChecked()]

    def set_types(self, types: Any) -> None:
        want = set(lab.candidate_types(types))
        self._quiet = True
        for q, b in self.boxes.items():
            b.setChecked(q in want)
        self._quiet = False
        self._toggled()

    def _toggled(self, *_: object) -> None:
        if self._quiet:
            return
        self._label()
        self.changed.emit()

    def _label(self) -> None:
        n, total = len(self.types()), len(self.boxes)
        self.setText(f"Types: all {total}" if n == total else f"Types: {n} of {total}")


# ----------------------------------------------------------------------------------------------- one tensor


@dataclass
class TensorRun:
    """One tensor requantized into the chosen types (what the worker hands back)."""

    name: str
    file_type: str  # the tensor's type in the open file
    source: str  # where the values came from, for people
    values: np.ndarray  # float32 (measured rows, ne0)
    rows: np.ndarray  # the tensor row of each measured row
    n_rows: int  # the tensor's rows
    weights: np.ndarray | None  # importance weights (n_mat * ne0) or None
    errors: list[lab.ErrorStats]
    skipped: list[str]
    seconds: float
    settings: tuple[object, ...]


@qt_guarded
class RequantizePanel(QWidget):
    """The "Requantize" page: a tensor, its round trip into every chosen type, the table, plot, heatmap and block."""

    runFinished = Signal(object)  # the TensorRun, or None (cancelled / failed)

    def __init__(self, view: QuantLabView) -> None:
        super().__init__()
        self.view = view
        self.runner = view.runner
        self.file: GGUFFile | None = None
        self.tensor: str | None = None
        self.run: TensorRun | None = None
        self.task: Task | None = None
        self.job_slot = JobSlot(self.runner, self)  # the job and its callbacks, connected before it is queued
        self.state = "idle"  # idle | running | done | cancelled | failed
        self.error: str | None = None
        self.pending = False  # the tensor or the settings changed: run when the page is next shown
        self.pending_type: str | None = None  # select this type when the run is in (from the file table)
        self.selected: str | None = None
        self.block: tuple[int, int] | None = None
        self._gen = 0
        self._updating = False
        self._sized = False
        self.started_with: tuple[object, ...] | None = None  # the settings of the shown figures / the run

        self.tensor_combo = QComboBox()
        self.tensor_combo.setEditable(True)
        self.tensor_combo.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
        self.tensor_combo.setAccessibleName("Tensor to requantize")
        self.tensor_combo.setToolTip("The weight to requantize; type part of a name or a type to filter")
        self.tensor_combo.setMinimumContentsLength(24)
        self.tensor_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        comp = QCompleter(self.tensor_combo.model(), self.tensor_combo)
        comp.setFilterMode(Qt.MatchFlag.MatchContains)
        comp.setCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)
        comp.setCompletionMode(QCompleter.CompletionMode.PopupCompletion)
        comp.setMaxVisibleItems(16)
        self.tensor_combo.setCompleter(comp)
        self.tensor_combo.lineEdit().setPlaceholderText("tensor name or type…")
        self.rows_spin = QSpinBox()
        self.rows_spin.setAccessibleName("Rows to measure (0: all)")
        self.rows_spin.setRange(0, 100_000_000)
        self.rows_spin.setSingleStep(256)
        self.rows_spin.setSpecialValueText("all")
        self.rows_spin.setValue(DEFAULT_TENSOR_ROWS)
        self.rows_spin.setKeyboardTracking(False)
        self.rows_spin.setToolTip("Measure at most this many evenly spaced rows (all: 0)")
        lab_t = QLabel("Tensor")
        lab_t.setBuddy(self.tensor_combo)
        lab_r = QLabel("Max rows")
        lab_r.setBuddy(self.rows_spin)
        # [Tensor …][Max rows][Requantize][Cancel] over [progress][status]
        self.strip = JobStrip("requantize", "Requantize", scale=1000, progress_width=160, status=ElidedLabel(),
                              layout="two_rows", disable_run=True, run_name="Requantize the tensor into every "
                              "chosen type", controls=controls_row(lab_t, (self.tensor_combo, 1), lab_r,
                                                                   self.rows_spin))
        self.strip.cancel_btn.setAccessibleName("Cancel requantizing")
        self.strip.status.setObjectName("muted")
        self.strip.run_clicked.connect(self.start)
        self.strip.cancel_clicked.connect(self.cancel)
        self.run_btn = self.strip.run_btn
        self.cancel_btn = self.strip.cancel_btn
        self.progress = self.strip.progress
        self.status: ElidedLabel = self.strip.status  # type: ignore[assignment]
        self.note = QLabel()
        self.note.setWordWrap(True)
        self.note.setAccessibleName("Types that do not fit")
        self.note.setObjectName("muted")
        self.note.hide()

        self.model = ErrorTableModel("tensor")
        self.proxy = SortFilterProxy(self)
        self.proxy.setSourceModel(self.model)
        self.table = QTableView()
        self.table.setModel(self.proxy)
        self.table.setAccessibleName("Requantize figures per type")
        self.table.setSortingEnabled(True)
        self.table.sortByColumn(1, Qt.SortOrder.AscendingOrder)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(21)
        self.table.setAlternatingRowColors(True)
        hh = self.table.horizontalHeader()  # the figures share the width (no one column takes it all)
        hh.setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        hh.setMinimumSectionSize(48)
        self.table.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.table.selectionModel().currentRowChanged.connect(self._table_current)

        self.metric = QComboBox()
        self.metric.setAccessibleName("Error shown in the plot")
        for key, label, _log in METRICS:
            self.metric.addItem(label, key)
        self.metric.currentIndexChanged.connect(lambda _i: self.plot.set_metric(self.metric_key()))
        self.plot = BpwPlot()
        self.plot.typeClicked.connect(self.select_type)
        self.heatmap = BlockHeatmap()
        self.heatmap.blockClicked.connect(self.select_block)
        self.compare = BlockCompare()
        self.compare.inspectRequested.connect(self._inspect)
        self.worst_btn = QPushButton("Worst block")
        self.worst_btn.setAccessibleName("Show the block with the largest RMSE")
        self.worst_btn.clicked.connect(self.select_worst)

        plot_box = QWidget()
        pl = QVBoxLayout(plot_box)
        pl.setContentsMargins(0, 0, 0, 0)
        pl.setSpacing(2)
        mrow = QHBoxLayout()
        lab_m = QLabel("Plot bits per weight against")
        lab_m.setBuddy(self.metric)
        mrow.addWidget(lab_m)
        mrow.addWidget(self.metric)
        mrow.addStretch(1)
        pl.addLayout(mrow)
        pl.addWidget(self.plot, 1)
        self.heatmap.footer.addWidget(self.worst_btn)
        self.upper = QSplitter()
        self.upper.addWidget(self.table)
        self.upper.addWidget(plot_box)
        self.upper.setStretchFactor(0, 4)
        self.upper.setStretchFactor(1, 5)
        self.lower = QSplitter()
        self.lower.addWidget(self.heatmap)
        self.lower.addWidget(self.compare)
        self.lower.setStretchFactor(0, 1)
        self.lower.setStretchFactor(1, 1)
        self.body = QSplitter(Qt.Orientation.Vertical)
        self.body.addWidget(self.upper)
        self.body.addWidget(self.lower)
        self.body.setStretchFactor(0, 1)
        self.body.setStretchFactor(1, 1)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 4, 0, 0)
        lay.addWidget(self.strip)
        lay.addWidget(self.note)
        lay.addWidget(self.body, 1)

        self.tensor_combo.currentIndexChanged.connect(self._combo_changed)
        self.tensor_combo.lineEdit().returnPressed.connect(self._combo_text_entered)
        self.rows_spin.valueChanged.connect(lambda _v: self.settings_changed())
        self.clear_results()

    # ------------------------------------------------------------------ file and tensor
    def set_file(self, f: GGUFFile | None) -> None:
        self._gen += 1
        self.runner.cancel(TENSOR_TASK)
        self.file = f
        self.tensor = None
        self.started_with = None
        self.pending = False
        self.pending_type = None
        self._updating = True
        self.tensor_combo.clear()
        names: list[str] = []
        if f is not None:
            try:
                tensors = lab.quantizable_tensors(f)
            except ValueError:
                tensors = []
            for t in tensors:
                self.tensor_combo.addItem(f"{t.name}   [{t.type_name}, {_shape(t.ne[:max(1, len(t.ne))])}]", t.name)
                names.append(t.name)
        self.tensor_combo.setCurrentIndex(-1)
        self._updating = False
        self.state = "idle"
        self.strip.set_busy(False)
        self.clear_results()
        if f is not None and not names:
            self.status.setText("No weight of this file can be requantized: it has no 2-D or 3-D weights that "
                                "llama-quantize would quantize.")
        self.run_btn.setEnabled(bool(names))

    def names(self) -> list[str]:
        return [self.tensor_combo.itemData(i) for i in range(self.tensor_combo.count())]

    def representative(self) -> str | None:
        """A tensor that shows the lab well: a Q4_K weight every type fits (rows of a multiple of 256), else any
        weight every type fits, else the first."""
        f = self.file
        names = self.names()
        if f is None or not names:
            return None
        infos = [f.tensor(n) for n in names]
        for want in ("Q4_K", None):
            for t in infos:
                if t.ne and t.ne[0] % 256 == 0 and (want is None or t.type_name == want) and not t.problem:
                    return t.name
        return names[0]

    def show_tensor(self, name: str, run: bool | None = None, qtype: str | None = None) -> bool:
        """Make ``name`` the tensor; ``run``: True starts at once, None when the page is shown, False waits for
        Requantize (or the page being shown). ``qtype``: the type to select when its figures are in."""
        i = self.tensor_combo.findData(name)
        if i < 0:
            return False
        self._updating = True
        self.tensor_combo.setCurrentIndex(i)
        self._updating = False
        self.tensor_combo.setToolTip(self.tensor_combo.currentText())
        self.pending_type = qtype
        if name != self.tensor or run:
            self.tensor = name
            if self.run is not None and self.run.name != name:
                self.clear_results()
            if run or (run is None and self.isVisible()):
                self.start()
            else:
                self.pending = self.run is None or self.run.name != name or self.run.settings != self.settings()
                if self.pending and self.state != "running":
                    self.status.setText(f"{name}: requantized when the page is shown (or press Requantize).")
        elif qtype is not None and self.run is not None:
            self.select_type(qtype)
        return True

    def _combo_changed(self, i: int) -> None:
        if self._updating or i < 0:
            return
        name = self.tensor_combo.itemData(i)
        if isinstance(name, str):
            self.show_tensor(name)

    def _combo_text_entered(self) -> None:
        text = self.tensor_combo.currentText().strip()
        name = text.split()[0] if text else ""
        i = self.tensor_combo.findData(name)
        if i >= 0:
            self.show_tensor(name, run=True)

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if not self._sized:  # the first time it has its size: table and plot, heatmap and block, in halves
            self._sized = True
            h, w = self.body.height(), self.body.width()
            self.body.setSizes([h * 9 // 20, h - h * 9 // 20])
            self.upper.setSizes([w // 2, w - w // 2])
            self.lower.setSizes([w * 9 // 20, w - w * 9 // 20])  # the block's bytes need about 540 px
        if self.pending and self.tensor is not None and self.state != "running":
            self.start()

    # ------------------------------------------------------------------ settings
    def settings(self) -> tuple[object, ...]:
        v = self.view
        return (self.tensor, tuple(v.types.types()), self.max_rows(), v.sources_version)

    def max_rows(self) -> int | None:
        return self.rows_spin.value() or None

    def metric_key(self) -> str:
        return str(self.metric.currentData())

    def settings_changed(self) -> None:
        """Types, rows, the source or the imatrix changed: the figures shown are not theirs any more."""
        if self.tensor is None:
            return
        if self.settings() == self.started_with and self.state in ("running", "done"):
            return  # these figures (or the run in flight) already have them
        if self.isVisible():
            self.start()
        else:
            self.pending = True

    # ------------------------------------------------------------------ the run
    def start(self) -> None:
        """Requantize the tensor into every chosen type in a worker (a run in progress is cancelled first)."""
        f, name = self.file, self.tensor
        if f is None or name is None:
            return
        self.pending = False
        types = self.view.types.types()
        self._gen += 1
        gen = self._gen
        self.runner.cancel(TENSOR_TASK)
        self.clear_results()
        if not types:
            self.state = "idle"
            self.status.setText("Choose at least one type (Types ▾).")
            return
        t = f.tensor(name)
        ref, im = self.view.reference, self.view.imatrix
        ref_name = self.view.reference_path.name if self.view.reference_path is not None else ""
        max_rows = self.max_rows()
        settings = self.settings()
        self.started_with = settings
        fits = [q for q in types if lab.fits(q, t.ne[0])]
        skipped = [q for q in types if q not in fits]
        self.state = "running"
        self.error = None
        self.strip.started(f"Reading {name}…")

        def work(report, token):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            values = lab.tensor_values(f, name, reference=ref, max_rows=max_rows)
            if token.cancelled:
                raise Cancelled("cancelled")
            rows = lab.sample_rows(t.n_rows, max_rows, lab.n_matrices(t.ne))
            weights = im.weights(name) if im is not None else None
            source = (f"{ref_name}'s {ref.tensor(name).type_name} values" if ref is not None
                      else f"this file's {t.type_name} values, dequantized")
            try:
                errors = lab.requantize_errors(values, fits, weights, blocks=True, progress=report,
                                               cancel=lambda: token.cancelled)
            except lab.LabCancelled:
                raise Cancelled("cancelled") from None
            return TensorRun(name, t.type_name, source, values, rows, t.n_rows, weights, errors, skipped,
                             time.perf_counter() - t0, settings)

        def progress(done: int, total: int, text: str) -> None:
            if gen == self._gen and total > 0:
                self.strip.progress_to(done, total, f"Requantizing {name} into {text}…" if text else
                                       f"Reading {name}…")

        def done(run: TensorRun) -> None:
            if gen == self._gen:
                self._show_run(run)
                self.runFinished.emit(run)

        def failed(msg: str, _tb: str) -> None:
            if gen == self._gen:
                self.state = "failed"
                self.error = msg
                self.strip.failed(f"{name} could not be requantized: {printable(msg)}")
                self.status.setToolTip(printable(msg))
                self.runFinished.emit(None)

        def cancelled() -> None:
            if gen == self._gen:
                self.state = "cancelled"
                self.strip.cancelled(f"Cancelled: {name} was not measured (press Requantize to run it).")
                self.runFinished.emit(None)

        task = self.job_slot.start(TENSOR_TASK, work, on_done=done, on_progress=progress, on_failed=failed,
                              on_cancelled=cancelled)
        self.task = task if self.job_slot.busy else None  # (None: it has ended already)

    def cancel(self) -> None:
        if self.task is not None and self.state == "running":
            self.strip.cancelling()
            self.task.cancel()

    def clear_results(self) -> None:
        self.run = None
        self.selected = None
        self.block = None
        self.model.set_rows([])
        self.plot.clear_points()
        self.heatmap.clear()
        self.compare.clear()
        self.note.hide()
        self.worst_btn.setEnabled(False)
        self.status.setToolTip("")
        if self.tensor is None:
            self.status.setText("Pick a tensor: its values are requantized into every chosen type and compared.")

    def _show_run(self, run: TensorRun) -> None:
        self.run = run
        self.state = "done"
        self.task = None
        self.strip.set_busy(False)
        weighted = run.weights is not None
        rows = [ErrorRow(e, run.name) for e in run.errors]
        self.model.set_rows(rows, weighted=weighted, current=run.file_type)
        measured = len(run.rows)
        sample = f"{measured:,} of {run.n_rows:,} rows" if measured < run.n_rows else f"all {run.n_rows:,} rows"
        imat = ""
        if self.view.imatrix is not None:
            imat = " · importance-weighted" if weighted else " · no imatrix entry for it: unweighted"
        self.status.setText(f"{run.name}: {run.source}, {sample}, into {plural(len(run.errors), 'type')} in "
                            f"{run.seconds:.2f} s{imat}")
        if run.skipped:
            t = ggml_type(run.skipped[0])
            self.note.setText(f"Not measured: {', '.join(run.skipped)} — rows of {run.values.shape[1]:,} values "
                              f"are not whole blocks of those types (e.g. {t.block_elems} for {t.name}).")
            self.note.show()
        i = self.metric.findData("weighted_rmse")
        self.metric.model().item(i).setEnabled(weighted)  # type: ignore[attr-defined]
        if not weighted and self.metric_key() == "weighted_rmse":
            self.metric.setCurrentIndex(0)
        self.plot.set_errors(run.errors, self.metric_key(), run.file_type)
        want = self.pending_type if self.pending_type in {e.type for e in run.errors} else self.default_type(run)
        self.pending_type = None
        if want is not None:
            self.select_type(want)

    @staticmethod
    def default_type(run: TensorRun) -> str | None:
        """The type first shown in the heatmap: the tensor's own type when its round trip loses something, else the
        inexact type nearest to it in bits per weight (cheaper first)."""
        errs = run.errors
        if not errs:
            return None
        own = next((e for e in errs if e.type == run.file_type), None)
        if own is not None and not own.exact:
            return own.type
        try:
            t = ggml_type(run.file_type)
            ref = t.bits_per_weight if t.is_quantized else 16.0
        except KeyError:
            ref = 4.5
        inexact = [e for e in errs if not e.exact] or errs
        return min(inexact, key=lambda e: (abs(e.bits_per_weight - ref), e.bits_per_weight > ref)).type

    # ------------------------------------------------------------------ the chosen type and block
    def errors_of(self, qtype: str) -> lab.ErrorStats | None:
        if self.run is None:
            return None
        return next((e for e in self.run.errors if e.type == qtype), None)

    def select_type(self, qtype: str) -> None:
        """Show ``qtype``'s blocks in the heatmap and its worst block before and after (the table follows)."""
        e = self.errors_of(qtype)
        if e is None or self.run is None:
            return
        row = self._proxy_row(qtype)
        if row >= 0 and self.table.currentIndex().row() != row:
            self.table.selectRow(row)  # -> _table_current -> here again, with the row current
            return
        if qtype == self.selected:
            return
        self.selected = qtype
        self.plot.set_selected(qtype)
        run = self.run
        assert e.block_rmse is not None
        worst = lab.worst_block(e.block_rmse) if e.block_rmse.size else None
        be = ggml_type(qtype).block_elems
        self.heatmap.set_blocks(qtype, e.block_rmse, run.rows, be, worst)
        self.worst_btn.setEnabled(worst is not None)
        if worst is not None:
            self.select_block(worst[0], worst[1])

    def _proxy_row(self, qtype: str) -> int:
        for r in range(self.proxy.rowCount()):
            if self.proxy.index(r, 0).data(KEY_ROLE) == qtype:
                return r
        return -1

    def _table_current(self, current: QModelIndex, _prev: QModelIndex) -> None:
        q = current.siblingAtColumn(0).data(KEY_ROLE) if current.isValid() else None
        if isinstance(q, str) and q != self.selected:
            self.select_type(q)

    def select_worst(self) -> None:
        e = self.errors_of(self.selected or "")
        if e is not None and e.block_rmse is not None and e.block_rmse.size:
            r, b, _ = lab.worst_block(e.block_rmse)
            self.select_block(r, b)

    def select_block(self, row: int, block: int) -> None:
        """Show block ``block`` of measured row ``row`` of the selected type before and after."""
        run, q = self.run, self.selected
        if run is None or q is None:
            return
        try:
            pair = lab.requantize_block(run.values, q, row, block, run.weights)
        except ValueError as exc:
            self.compare.clear()
            self.compare.info.setText(str(exc))
            return
        self.block = (row, block)
        self.heatmap.set_pick(row, block)
        t = self.file.tensor(run.name) if self.file is not None else None
        can = t is not None and t.type is not None and not t.problem
        self.compare.set_pair(pair, int(run.rows[row]), can)
        self.heatmap.hover.setText(self.heatmap.describe(row, block))

    def _inspect(self) -> None:
        run, pair, f = self.run, self.compare.pair, self.file
        if run is None or pair is None or f is None:
            return
        t = f.tensor(run.name)
        trow = int(run.rows[pair.row])
        col = pair.columns[0]
        try:
            blk, elem = element_location(t, trow, col)
        except (ValueError, IndexError):
            return
        self.view.inspectRequested.emit(run.name, trow, blk, elem)


# ----------------------------------------------------------------------------------------------- whole file


@dataclass
class FileRun:
    stats: list[lab.TensorStats]
    summary: list[lab.TypeSummary]
    types: list[str]
    meta: dict[str, object]
    weighted: bool
    seconds: float


@qt_guarded
class FileStatsPanel(QWidget):
    """The "Whole file" page: every quantizable weight × the chosen types, and the per-type summary."""

    runFinished = Signal(object)  # the FileRun, or None

    def __init__(self, view: QuantLabView) -> None:
        super().__init__()
        self.view = view
        self.runner = view.runner
        self.doc: Document | None = None
        self.result: FileRun | None = None
        self.task: Task | None = None
        self.job_slot = JobSlot(self.runner, self)  # the job and its callbacks, connected before it is queued
        self.state = "idle"
        self.error: str | None = None
        self.meter = RateMeter()
        self._gen = 0

        self.pattern = QLineEdit()
        self.pattern.setAccessibleName("Tensors to measure (regular expression)")
        self.pattern.setPlaceholderText("every quantizable weight; or a regular expression, e.g. ffn_down")
        self.pattern.setClearButtonEnabled(True)
        self.rows_spin = QSpinBox()
        self.rows_spin.setAccessibleName("Rows to measure per tensor (0: all)")
        self.rows_spin.setRange(0, 100_000_000)
        self.rows_spin.setSingleStep(64)
        self.rows_spin.setSpecialValueText("all")
        self.rows_spin.setValue(DEFAULT_FILE_ROWS)
        self.rows_spin.setToolTip("Measure at most this many evenly spaced rows of each tensor (all: 0)")
        lab_p = QLabel("Tensors")
        lab_p.setBuddy(self.pattern)
        lab_r = QLabel("Max rows")
        lab_r.setBuddy(self.rows_spin)
        # [Tensors …][Max rows][Measure][Cancel][Export] over [progress][status]
        self.strip = JobStrip("whole-file statistics", "Measure every tensor", scale=1000, progress_width=160,
                              status=ElidedLabel(), layout="two_rows", disable_run=True,
                              run_name="Measure every tensor of the file",
                              controls=controls_row(lab_p, (self.pattern, 1), lab_r, self.rows_spin))
        self.strip.status.setObjectName("muted")
        self.strip.run_clicked.connect(self.start)
        self.strip.cancel_clicked.connect(self.cancel)
        self.run_btn = self.strip.run_btn
        self.cancel_btn = self.strip.cancel_btn
        self.progress = self.strip.progress
        self.status: ElidedLabel = self.strip.status  # type: ignore[assignment]
        self.export_btn = QPushButton("Export…")
        self.export_btn.setAccessibleName("Export the statistics as JSON or CSV")
        self.export_btn.clicked.connect(self.export_dialog)
        self.filter = QLineEdit()
        self.filter.setAccessibleName("Filter the rows")
        self.filter.setPlaceholderText("Filter rows by tensor or type…")
        self.filter.setClearButtonEnabled(True)

        self.model = ErrorTableModel("file")
        self.proxy = SortFilterProxy(self)
        self.proxy.setSourceModel(self.model)
        self.proxy.setFilterKeyColumn(-1)
        self.table = self._table(self.proxy, "Figures per tensor and type")
        fit_columns(self.table, stretch=0, optional=(1, 6, 5), min_stretch=160, max_stretch=330)
        self.table.sortByColumn(0, Qt.SortOrder.AscendingOrder)
        self.table.doubleClicked.connect(self._open_row)
        self.table.activated.connect(self._open_row)
        self.sum_model = ErrorTableModel("summary")
        self.sum_proxy = SortFilterProxy(self)
        self.sum_proxy.setSourceModel(self.sum_model)
        self.summary = self._table(self.sum_proxy, "Per-type summary over the file")
        self.summary.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.summary.sortByColumn(1, Qt.SortOrder.AscendingOrder)
        self.sum_title = QLabel("Whole file, per type (each tensor weighted by its elements)")
        self.sum_title.setObjectName("heading")
        self.filter.textChanged.connect(self.proxy.setFilterFixedString)

        self.strip.row.addWidget(self.export_btn)
        upper = QWidget()
        ul = QVBoxLayout(upper)
        ul.setContentsMargins(0, 0, 0, 0)
        ul.setSpacing(2)
        ul.addWidget(self.filter)
        ul.addWidget(self.table, 1)
        lower = QWidget()
        ll = QVBoxLayout(lower)
        ll.setContentsMargins(0, 0, 0, 0)
        ll.setSpacing(2)
        ll.addWidget(self.sum_title)
        ll.addWidget(self.summary, 1)
        self.split = QSplitter(Qt.Orientation.Vertical)
        self.split.addWidget(upper)
        self.split.addWidget(lower)
        self.split.setStretchFactor(0, 3)
        self.split.setStretchFactor(1, 2)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 4, 0, 0)
        lay.addWidget(self.strip)
        lay.addWidget(self.split, 1)
        self.set_document(None)

    @staticmethod
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

    def set_document(self, doc: Document | None) -> None:
        self._gen += 1
        self.runner.cancel(FILE_TASK)
        self.doc = doc
        self.result = None
        self.state = "idle"
        self._set_running(False)
        self.model.set_rows([])
        self.sum_model.set_rows([])
        self.export_btn.setEnabled(False)
        n = 0
        if doc is not None and doc.gguf is not None:
            try:
                n = len(lab.quantizable_tensors(doc.gguf))
            except ValueError:
                n = 0
        self.strip.set_can_run(n > 0)
        self.status.setText(f"{plural(n, 'quantizable weight')}: measure them all (like llama.cpp's quantize-stats)"
                            " — each requantized into the chosen types, rows sampled." if doc is not None else "")

    def max_rows(self) -> int | None:
        return self.rows_spin.value() or None

    def start(self) -> None:
        doc = self.doc
        if doc is None or doc.gguf is None or self.state == "running":
            return
        f = doc.gguf
        types = self.view.types.types()
        if not types:
            self.status.setText("Choose at least one type (Types ▾).")
            return
        pattern = self.pattern.text().strip() or None
        try:
            if not lab.quantizable_tensors(f, pattern):
                self.status.setText(f"No quantizable weight matches {pattern!r}.")
                return
        except ValueError as exc:
            self.status.setText(printable(str(exc)))
            return
        ref, im, max_rows = self.view.reference, self.view.imatrix, self.max_rows()
        meta: dict[str, object] = {
            "file": str(doc.path), "reference": str(self.view.reference_path) if ref is not None else None,
            "imatrix": str(self.view.imatrix_path) if im is not None else None, "max_rows": max_rows,
            "types": types, "tensor": pattern}
        self._gen += 1
        gen = self._gen
        self.state = "running"
        self.error = None
        self.result = None
        self.meter = RateMeter()
        self.model.set_rows([])
        self.sum_model.set_rows([])
        self.export_btn.setEnabled(False)
        self._set_running(True)
        self.strip.started("Checking the tensors…")

        def work(report, token):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            try:
                stats = lab.file_stats(f, types, pattern=pattern, imatrix=im, reference=ref, max_rows=max_rows,
                                       progress=report, cancel=lambda: token.cancelled)
            except lab.LabCancelled:
                raise Cancelled("cancelled") from None
            secs = time.perf_counter() - t0
            return FileRun(stats, lab.summarize(stats, types), types, {**meta, "seconds": secs}, im is not None,
                           secs)

        def progress(done: int, total: int, text: str) -> None:
            if gen != self._gen or total <= 0:
                return
            _rate, eta = self.meter.update(done, total)
            self.strip.progress_to(done, total, f"{printable(text) or 'finishing'} · {100 * done / total:.0f}% · "
                                   f"{format_duration(eta)} left")

        def done(res: FileRun) -> None:
            if gen == self._gen:
                self._show(res)
                self.runFinished.emit(res)

        def failed(msg: str, _tb: str) -> None:
            if gen == self._gen:
                self.state = "failed"
                self.error = msg
                self._set_running(False)
                self.strip.failed(f"The statistics failed: {printable(msg)}")
                self.status.setToolTip(printable(msg))
                self.runFinished.emit(None)

        def cancelled() -> None:
            if gen == self._gen:
                self.state = "cancelled"
                self._set_running(False)
                self.strip.cancelled("Cancelled: nothing measured.")
                self.runFinished.emit(None)

        task = self.job_slot.start(FILE_TASK, work, on_done=done, on_progress=progress, on_failed=failed,
                              on_cancelled=cancelled)
        self.task = task if self.job_slot.busy else None  # (None: it has ended already)

    def cancel(self) -> None:
        if self.task is not None and self.state == "running":
            self.strip.cancelling()
            self.task.cancel()

    def _set_running(self, on: bool) -> None:
        self.strip.set_busy(on)
        for w in (self.pattern, self.rows_spin):
            w.setEnabled(not on)

    def _show(self, res: FileRun) -> None:
        self.result = res
        self.state = "done"
        self.task = None
        self._set_running(False)
        rows = [ErrorRow(e, s.name, s.source_type) for s in res.stats for e in s.errors]
        self.model.set_rows(rows, weighted=res.weighted)
        self.sum_model.set_rows([ErrorRow(u.stats, "", "", u.n_tensors, u.n_elements) for u in res.summary],
                                weighted=res.weighted)
        self.export_btn.setEnabled(True)
        rows_note = f"at most {res.meta['max_rows']:,} rows each" if res.meta["max_rows"] else "every row"
        src = "reference values" if res.meta["reference"] else "values dequantized from the file"
        self.status.setText(f"{plural(len(res.stats), 'tensor')} × {plural(len(res.types), 'type')}, {src}, "
                            f"{rows_note}, in {res.seconds:.1f} s. Double-click a row to requantize that tensor.")

    def _open_row(self, index: QModelIndex) -> None:
        key = index.siblingAtColumn(0).data(KEY_ROLE) if index.isValid() else None
        if isinstance(key, tuple) and len(key) == 2:
            self.view.open_tensor(str(key[0]), str(key[1]))

    # ------------------------------------------------------------------ export
    def export(self, path: str | Path) -> Path:
        """Write the figures to ``path``: CSV when it ends in .csv, else JSON (``quant-stats --json``'s layout);
        atomically, never over the open file. Raises OSError / PathRefused."""
        res = self.result
        if res is None:
            raise OSError("nothing measured yet")
        p = Path(path).expanduser()
        if p.suffix.lower() == ".csv":
            text = lab.stats_csv(res.stats, res.summary)
        else:
            text = json_text(lab.stats_report(res.stats, res.summary, **res.meta)) + "\n"
        inputs = [x for x in (self.doc.path if self.doc else None, self.view.reference_path) if x is not None]
        return write_atomic(p, text, "Export", inputs)

    def export_dialog(self) -> Path | None:
        if self.result is None or self.doc is None:
            return None
        start = str(output_path(self.doc.path, f"{self.doc.path.stem}-quant-stats.json"))
        path, chosen = QFileDialog.getSaveFileName(self, "Export the quant statistics", start,
                                                   "JSON (*.json);;CSV (*.csv)")
        if not path:
            return None
        p = Path(path)
        if p.suffix.lower() not in (".json", ".csv"):
            p = p.with_name(p.name + (".csv" if chosen.startswith("CSV") else ".json"))
        try:
            out = self.export(p)
        except (OSError, PathRefused) as exc:
            self.status.setText(f"Could not export: {printable(exc)}")
            self.status.setToolTip(printable(exc))
            return None
        self.status.setText(f"Exported to {out}")
        return out


# ----------------------------------------------------------------------------------------------------- the tab


@qt_guarded
class QuantLabView(QWidget):
    """The Quant lab tab: the values' source, the importance matrix and the types (shared), then the
    "Requantize", "Whole file" and "Budget" pages."""

    inspectRequested = Signal(str, int, int, int)  # tensor, row, block, element (this file's block)

    def __init__(self, runner: TaskRunner, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.runner = runner
        self.doc: Document | None = None
        self.reference: GGUFFile | None = None
        self.reference_path: Path | None = None
        self.imatrix: Imatrix | None = None
        self.imatrix_path: Path | None = None
        self._retired: list[GGUFFile] = []
        self._waiting = False
        self.sources_version = 0  # counts changes of the reference file and the imatrix
        self.setAccessibleName("Quant lab")

        self.source_label = ElidedLabel("this file's values, dequantized")
        self.source_label.setAccessibleName("Where the values come from")
        self.ref_btn = QPushButton("Reference GGUF…")
        self.ref_btn.setAccessibleName("Take the values from a higher-precision GGUF of the same model")
        self.ref_btn.clicked.connect(self.choose_reference)
        self.ref_clear = QPushButton("Use this file")
        self.ref_clear.setAccessibleName("Take the values from this file again")
        self.ref_clear.clicked.connect(self.clear_reference)
        self.imatrix_label = ElidedLabel("none")
        self.imatrix_label.setAccessibleName("Importance matrix")
        self.imatrix_btn = QPushButton("imatrix…")
        self.imatrix_btn.setAccessibleName("Open an importance matrix")
        self.imatrix_btn.clicked.connect(self.choose_imatrix)
        self.imatrix_clear = QPushButton("No imatrix")
        self.imatrix_clear.setAccessibleName("Quantize without importance weights")
        self.imatrix_clear.clicked.connect(self.clear_imatrix)
        self.types = TypesButton()
        self._types_timer = QTimer(self)  # ticking several types restarts the run once
        self._types_timer.setSingleShot(True)
        self._types_timer.setInterval(400)
        self._types_timer.timeout.connect(self._settings_changed)
        self.types.changed.connect(self._types_timer.start)

        bar = QHBoxLayout()
        bar.setContentsMargins(0, 0, 0, 0)
        lab_v = QLabel("Values:")
        lab_v.setObjectName("muted")
        bar.addWidget(lab_v)
        bar.addWidget(self.source_label, 3)
        bar.addWidget(self.ref_btn)
        bar.addWidget(self.ref_clear)
        bar.addSpacing(12)
        lab_i = QLabel("imatrix:")
        lab_i.setObjectName("muted")
        bar.addWidget(lab_i)
        bar.addWidget(self.imatrix_label, 2)
        bar.addWidget(self.imatrix_btn)
        bar.addWidget(self.imatrix_clear)
        bar.addSpacing(12)
        bar.addWidget(self.types)

        self.tensor_page = RequantizePanel(self)
        self.file_page = FileStatsPanel(self)
        self.pages = QTabWidget()
        self.pages.setAccessibleName("Quant lab pages")
        self.pages.addTab(self.tensor_page, "Requantize a tensor")
        self.pages.addTab(self.file_page, "Whole file")
        self.budget_page = BudgetPanel(self)
        self.pages.addTab(self.budget_page, "Budget")
        self.pages.currentChanged.connect(self._page_changed)
        lay = QVBoxLayout(self)
        lay.addLayout(bar)
        lay.addWidget(self.pages, 1)
        self._source_buttons()

    # ------------------------------------------------------------------ document
    def set_document(self, doc: Document | None) -> None:
        self.doc = doc
        f = doc.gguf if doc is not None else None
        self.tensor_page.set_file(f)
        self.file_page.set_document(doc if f is not None else None)
        self.budget_page.set_document(doc if f is not None else None)

    def follow_tensor(self, name: str) -> None:
        """The Tensors view selected ``name``: make it this tab's tensor (run when the tab is shown)."""
        if self.doc is not None and name in self.tensor_page.names():
            self.tensor_page.show_tensor(name, run=None)

    def open_tensor(self, name: str, qtype: str | None = None) -> bool:
        """Requantize ``name`` now on the Requantize page (and select ``qtype`` when its figures are in)."""
        self.pages.setCurrentWidget(self.tensor_page)
        return self.tensor_page.show_tensor(name, run=True, qtype=qtype)

    def key_help(self) -> list[tuple[str, str]]:
        return [("Click (heatmap)", "show that block before and after"),
                ("Double click (whole-file table)", "requantize that tensor")]

    # ------------------------------------------------------------------ values from a reference file
    def choose_reference(self) -> None:
        start = str(self.reference_path or (self.doc.path.parent if self.doc else Path.home()))
        path, _ = QFileDialog.getOpenFileName(self, "A higher-precision GGUF of the same model", start,
                                              "GGUF (*.gguf);;All files (*)")
        if path:
            self.load_reference(path)

    def load_reference(self, path: str | Path) -> None:
        """Open ``path`` (in a worker) and take the values from it from now on."""
        p = Path(path).expanduser()
        self.source_label.setText(f"opening {p.name}…")

        def work(report, token):  # type: ignore[no-untyped-def]
            try:
                return GGUFFile(p)
            except GGUFError as exc:
                raise ValueError(f"{p.name} is not a readable GGUF: {exc}") from None

        def done(f: GGUFFile) -> None:
            self._retire(self.reference)
            self.reference, self.reference_path = f, p
            self._sources_changed()

        def failed(msg: str, _tb: str) -> None:
            self._source_buttons()
            self.source_label.setText(f"{self.source_label.full_text()} — {printable(msg)}")
            self.source_label.setToolTip(printable(msg))

        self.runner.start(OPEN_TASK, work, on_done=done, on_failed=failed, on_cancelled=self._source_buttons)

    def clear_reference(self) -> None:
        if self.reference is None:
            return
        self._retire(self.reference)
        self.reference, self.reference_path = None, None
        self._sources_changed()

    # ------------------------------------------------------------------ importance matrix
    def choose_imatrix(self) -> None:
        start = str(self.imatrix_path or (self.doc.path.parent if self.doc else Path.home()))
        path, _ = QFileDialog.getOpenFileName(self, "An importance matrix (llama-imatrix)", start,
                                              "imatrix (*.gguf *.dat);;All files (*)")
        if path:
            self.load_imatrix(path)

    def load_imatrix(self, path: str | Path) -> None:
        p = Path(path).expanduser()
        self.imatrix_label.setText(f"reading {p.name}…")

        def work(report, token):  # type: ignore[no-untyped-def]
            return read_imatrix(p)

        def done(im: Imatrix) -> None:
            self.imatrix, self.imatrix_path = im, p
            self._sources_changed()

        def failed(msg: str, _tb: str) -> None:
            self._source_buttons()
            self.imatrix_label.setText(f"{self.imatrix_label.full_text()} — {printable(msg)}")
            self.imatrix_label.setToolTip(printable(msg))

        self.runner.start(OPEN_TASK, work, on_done=done, on_failed=failed, on_cancelled=self._source_buttons)

    def clear_imatrix(self) -> None:
        if self.imatrix is None:
            return
        self.imatrix, self.imatrix_path = None, None
        self._sources_changed()

    # ------------------------------------------------------------------ shared
    def _source_buttons(self) -> None:
        if self.reference_path is not None:
            self.source_label.setText(f"reference {self.reference_path.name}")
            self.source_label.setToolTip(str(self.reference_path))
        else:
            self.source_label.setText("this file's values, dequantized")
            self.source_label.setToolTip("")
        self.ref_clear.setEnabled(self.reference is not None)
        if self.imatrix is not None and self.imatrix_path is not None:
            s = self.imatrix.summary()
            self.imatrix_label.setText(f"{self.imatrix_path.name} ({s['entries']} entries)")
            self.imatrix_label.setToolTip(str(self.imatrix_path))
        else:
            self.imatrix_label.setText("none")
            self.imatrix_label.setToolTip("")
        self.imatrix_clear.setEnabled(self.imatrix is not None)

    def _sources_changed(self) -> None:
        self.sources_version += 1
        self._source_buttons()
        self._settings_changed()
        self.budget_page.imatrix_changed()

    def _settings_changed(self) -> None:
        self.tensor_page.settings_changed()

    def _page_changed(self, _index: int) -> None:
        """The Budget page measures the open file against itself, with its own types: the reference file and the
        type picker are the other pages' (disabled there, the imatrix stays)."""
        on = self.pages.currentWidget() is not self.budget_page
        why = "" if on else "The Budget page measures this file against itself, with its own candidate types"
        for w in (self.ref_btn, self.types):
            w.setEnabled(on)
            w.setToolTip(why or w.accessibleName())
        self.ref_clear.setEnabled(on and self.reference is not None)

    def _retire(self, f: GGUFFile | None) -> None:
        """Close ``f`` once no lab worker can still be reading it."""
        if f is not None:
            self._retired.append(f)
        self._close_retired()

    def _close_retired(self) -> None:
        busy = bool(self.runner.running(TENSOR_TASK) or self.runner.running(FILE_TASK))  # (the Budget page
        # measures the open file, never the reference)
        if busy:
            if not self._waiting:
                self._waiting = True
                self.runner.changed.connect(self._close_retired)
            return
        if self._waiting:
            self._waiting = False
            self.runner.changed.disconnect(self._close_retired)
        for old in self._retired:
            old.close()
        self._retired = []

    def shutdown(self) -> None:
        """After the runner has stopped: close the reference file (and stop a publish in flight)."""
        self.budget_page.shutdown()
        for f in [*self._retired, self.reference]:
            if f is not None:
                f.close()
        self._retired = []
        self.reference = None
