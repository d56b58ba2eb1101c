"""The Probe tab (issue 20): inside the model on one prompt (at most 1024 tokens), from
:mod:`quantscope.core.engine.probe` (docs/probe.md).

- Logit lens: residual index (rows: ``emb``, then after each layer) × position heatmap of the target token's
  probability or rank (a log colour scale), the top tokens of a cell on hover and in a side table on a click;
- Attention: a layer's weights per head, or averaged over the heads, query × key with token labels; masked cells
  (later keys, keys outside a sliding window) hatched; recurrent (delta-net) layers cannot be chosen;
- Activations: the residual stream's RMS per layer, a layer's per-channel RMS with its outlier channels, and links
  from a channel to the weight columns/rows that read/write it (shown in the Tensors tab's heatmap).

The engine is loaded for the open file on the first run (CPU, ``repack=False``: the weights stay mapped from the
file rather than being copied a second time beside the chat's model) and kept until the document changes. Every
computation runs in the :class:`~..workers.TaskRunner`, one at a time (they share the engine), cancellable.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtGui import QKeySequence, QShortcut, QStandardItemModel
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from quantscope.core.engine import probe as P

from ..document import Document
from ..exports import Exporter
from ..guard import qt_guarded
from ..theme import BAD_COLOR, group_color, is_dark
from ..widgets.fit import ElidedLabel
from ..widgets.jobstrip import JobStrip, controls_row
from ..workers import JobSlot, Task, TaskRunner
from .probe_widgets import CellHeatmap, TokenAxis, token_label

MAX_TOKENS = P.MAX_PROBE_TOKENS
#: text longer than this is not tokenized on the GUI thread while typing (counted when the run starts)
LIVE_COUNT_CHARS = 16000
#: attention weights of this many layers are kept (n_head × T × T float32 each)
ATTENTION_CACHE = 4
TASK_NAMES = ("probe-run", "probe-lens", "probe-attention")
TARGET_TEXT = {"final": "the model's final prediction", "next": "the prompt's next token"}


class ProbeRefused(ValueError):
    """A run refused before anything is computed (shown in the status line)."""


@dataclass
class ProbeResult:
    """One finished run: the probe, its logit lens (for ``lens.target_kind``) and activations."""

    probe: P.Probe
    lens: P.LogitLens
    acts: P.Activations
    labels: list[str]  # per position, for the axes
    seconds: dict[str, float]


def _load_engine(path: object, cancel: Any, report: Any) -> Any:
    """The CPU engine for ``path`` without repacking (progress 0..0.1 of the run); a failure as a ProbeRefused
    saying why the file cannot run."""
    import threading

    from quantscope.core.engine.generate import Engine, LoadCancelled, load_failure
    from quantscope.core.jobs import Cancelled

    stop = threading.Event()

    def say(stage: str, f: float) -> None:
        if cancel.cancelled:
            stop.set()
        report(int(100 * f), 1000, f"loading the model: {stage}")

    try:
        return Engine(path, n_ctx=64, threads=0, progress=say, cancel=stop, backend="cpu", repack=False)
    except LoadCancelled:
        raise Cancelled("loading cancelled") from None
    except Exception as exc:
        why = load_failure(exc)
        if why is None:
            raise
        raise ProbeRefused(why.line()) from None


def release_engine(eng: Any) -> None:
    """Free an engine's session and unmap its file (views still exported keep the mapping until dropped)."""
    if eng is not None:
        eng.close()


def resid_text(index: int) -> str:
    """Residual index ``index`` in words: ``the embeddings``, ``after layer 3``."""
    return "the embeddings" if index == 0 else f"after layer {index - 1}"


def _table(headers: list[str], name: str) -> QTableWidget:
    t = QTableWidget(0, len(headers))
    t.setHorizontalHeaderLabels(headers)
    t.setAccessibleName(name)
    t.verticalHeader().setVisible(False)
    t.verticalHeader().setDefaultSectionSize(21)
    t.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    t.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    t.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    t.setAlternatingRowColors(True)
    h = t.horizontalHeader()
    h.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
    for i in range(1, len(headers)):
        h.setSectionResizeMode(i, QHeaderView.ResizeMode.ResizeToContents)
    return t


def _cell(text: str, align_right: bool = False, tip: str = "") -> QTableWidgetItem:
    it = QTableWidgetItem(text)
    if align_right:
        it.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
    if tip:
        it.setToolTip(tip)
    return it


# ====================================================================== logit lens
@qt_guarded
class LensPage(QWidget):
    """The logit lens heatmap, its colour choice, the hovered cell's top tokens and the picked cell's table."""

    def __init__(self, view: ProbeView) -> None:
        super().__init__()
        self.view = view
        self.result: ProbeResult | None = None
        self.mode = QComboBox()
        self.mode.addItems(["probability of the target", "rank of the target (log scale)"])
        self.mode.setAccessibleName("Logit lens colour")
        self.mode.currentIndexChanged.connect(lambda _i: self.redraw(keep_view=True))
        self.caption = ElidedLabel()
        self.caption.setObjectName("muted")
        self.heat = CellHeatmap("Logit lens: the target's probability per layer and position", "position (token)",
                                "layer (residual stream after it)")
        self.heat.hovered.connect(self._hover)
        self.heat.picked.connect(self.show_cell)
        self.hover = ElidedLabel("Run a prompt: each cell is one layer's guess at one position.")
        self.hover.setObjectName("muted")
        self.hover.setAccessibleName("Logit lens cell under the mouse")
        self.cell_title = QLabel("Click a cell (or use the arrow keys) for its top tokens.")
        self.cell_title.setWordWrap(True)
        self.cell_title.setAccessibleName("Picked cell")
        self.top = _table(["token", "probability", "id"], "Top tokens of the picked cell")
        side = QWidget()
        sl = QVBoxLayout(side)
        sl.setContentsMargins(0, 0, 0, 0)
        sl.addWidget(self.cell_title)
        sl.addWidget(self.top, 1)
        split = QSplitter()
        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        bar = QHBoxLayout()
        bar.addWidget(QLabel("Colour"))
        bar.addWidget(self.mode)
        bar.addWidget(self.caption, 1)
        ll.addLayout(bar)
        ll.addWidget(self.heat, 1)
        ll.addWidget(self.hover)
        split.addWidget(left)
        split.addWidget(side)
        split.setStretchFactor(0, 4)
        split.setStretchFactor(1, 1)
        split.setSizes([800, 240])
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 4, 0, 0)
        lay.addWidget(split)

    def set_result(self, result: ProbeResult | None) -> None:
        self.result = result
        self.top.setRowCount(0)
        if result is None:
            self.heat.reset()
            self.caption.setText("")
            self.cell_title.setText("Click a cell (or use the arrow keys) for its top tokens.")
            return
        self.redraw()
        self.hover.setText("Hover a cell for the top tokens of that layer at that position; click it (or use the "
                           "arrow keys) to list them beside the map; zoom in (wheel) to read each cell's top token.")
        last = result.probe.n_tokens - 1
        self.heat.pick(result.probe.n_layers, last)  # the model's own answer at the end of the prompt

    def values(self) -> tuple[np.ndarray, tuple[float, float], list[tuple[float, str]] | None]:
        """What the heatmap shows: probability (0..1), or −log10(rank + 1) (so rank 1 is bright) with its bar."""
        assert self.result is not None
        lens = self.result.lens
        if self.mode.currentIndex() == 0:
            return lens.target_prob.astype(np.float32), (0.0, 1.0), None
        n_vocab = int(self.result.probe.model.config.n_vocab)
        top = max(1.0, float(np.log10(n_vocab)))
        ticks = [(-float(k), f"{10 ** k:,}") for k in range(int(top) + 1)]
        return (-np.log10(lens.target_rank.astype(np.float64) + 1)).astype(np.float32), (-top, 0.0), ticks

    def redraw(self, keep_view: bool = False) -> None:
        r = self.result
        if r is None:
            return
        data, levels, ticks = self.values()
        rows = [P.Probe.resid_label(i) for i in range(len(r.probe.resid))]
        top = r.lens.top_ids
        self.heat.set_data(data, rows, r.labels, levels, "viridis", ticks, keep_view,
                           cell_text=lambda i, j: token_label(self._tok(int(top[i, j, 0])), 12))
        what = "probability" if self.mode.currentIndex() == 0 else "rank (1: the likeliest)"
        self.caption.setText(f"each cell: the {what} of the target, {TARGET_TEXT[r.lens.target_kind]}")

    def _tok(self, tid: int) -> str:
        return self.view.piece(tid)

    def describe(self, row: int, col: int) -> str:
        """One line on cell (row, col): the layer, the position's token, the target's rank/probability, the top 5."""
        r = self.result
        assert r is not None
        lens = r.lens
        tops = ", ".join(f"{token_label(self._tok(int(t)), 14)} {p:.2f}"
                         for t, p in zip(lens.top_ids[row, col][:5], lens.top_probs[row, col][:5], strict=True))
        target = token_label(self._tok(int(lens.targets[col])), 14)
        return (f"layer {P.Probe.resid_label(row)} · position {col} {token_label(r.probe.pieces[col], 14)} → "
                f"target {target}: rank {int(lens.target_rank[row, col]) + 1:,}, "
                f"p {float(lens.target_prob[row, col]):.3f} · top: {tops}")

    def _hover(self, row: int, col: int) -> None:
        if self.result is None or row < 0:
            return
        text = self.describe(row, col)
        self.hover.setText(text)
        self.heat.setToolTip(text.replace(" · top: ", "\ntop: "))

    def show_cell(self, row: int, col: int) -> None:
        r = self.result
        if r is None:
            return
        lens = r.lens
        self.cell_title.setText(
            f"<b>layer {P.Probe.resid_label(row)}</b>, position {col} "
            f"<code>{_html(token_label(r.probe.pieces[col], 20))}</code><br>target "
            f"<code>{_html(token_label(self._tok(int(lens.targets[col])), 20))}</code>: rank "
            f"{int(lens.target_rank[row, col]) + 1:,}, p {float(lens.target_prob[row, col]):.4f}; entropy "
            f"{float(lens.entropy[row, col]):.2f} nats")
        ids, probs = lens.top_ids[row, col], lens.top_probs[row, col]
        self.top.setRowCount(len(ids))
        for i, (t, p) in enumerate(zip(ids, probs, strict=True)):
            piece = self._tok(int(t))
            self.top.setItem(i, 0, _cell(token_label(piece, 24), tip=repr(piece)))
            self.top.setItem(i, 1, _cell(f"{float(p):.4f}", True))
            self.top.setItem(i, 2, _cell(str(int(t)), True))


def _html(s: str) -> str:
    from html import escape

    return escape(s)


# ====================================================================== attention
@qt_guarded
class AttentionPage(QWidget):
    """A layer's attention weights: layer and head choice, query × key heatmap, masked cells hatched."""

    def __init__(self, view: ProbeView) -> None:
        super().__init__()
        self.view = view
        self.result: ProbeResult | None = None
        self.weights: np.ndarray | None = None  # (n_head, T, T) of self.layer
        self.layer = -1
        self.shown: np.ndarray | None = None
        self.layer_box = QComboBox()
        self.layer_box.setAccessibleName("Attention layer")
        self.layer_box.currentIndexChanged.connect(self._layer_changed)
        self.head_box = QComboBox()
        self.head_box.setAccessibleName("Attention head")
        self.head_box.currentIndexChanged.connect(lambda _i: self.redraw(keep_view=True))
        self.sink = QCheckBox("scale without the first key")
        self.sink.setAccessibleName("Colour scale without the first key")
        self.sink.setToolTip("The first token often takes most of the attention (an attention sink): leave its "
                             "column out of the colour scale so the rest can be told apart (it saturates)")
        self.sink.setChecked(True)
        self.sink.toggled.connect(lambda _on: self.redraw(keep_view=True))
        self.note = ElidedLabel()
        self.note.setObjectName("muted")
        self.note.setAccessibleName("Attention layer note")
        self.heat = CellHeatmap("Attention weights: query × key", "key (attended token)", "query (token)")
        self.heat.hovered.connect(self._hover)
        self.heat.picked.connect(self._picked)
        self.hover = ElidedLabel("Run a prompt, then choose a layer and a head.")
        self.hover.setObjectName("muted")
        self.hover.setAccessibleName("Attention cell under the mouse")
        bar = QHBoxLayout()
        bar.addWidget(QLabel("Layer"))
        bar.addWidget(self.layer_box)
        bar.addWidget(QLabel("Head"))
        bar.addWidget(self.head_box)
        bar.addWidget(self.sink)
        bar.addWidget(self.note, 1)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 4, 0, 0)
        lay.addLayout(bar)
        lay.addWidget(self.heat, 1)
        lay.addWidget(self.hover)

    def set_result(self, result: ProbeResult | None) -> None:
        self.result = result
        self.weights = None
        self.layer = -1
        self.shown = None
        self.heat.reset()
        self.layer_box.blockSignals(True)
        self.head_box.blockSignals(True)
        self.layer_box.clear()
        self.head_box.clear()
        if result is None:
            self.note.setText("")
            self.layer_box.blockSignals(False)
            self.head_box.blockSignals(False)
            return
        pr = result.probe
        model = self.layer_box.model()
        first = -1
        for li in range(pr.n_layers):
            if not pr.has_attention(li):
                self.layer_box.addItem(f"{li} (delta-net: no attention)", li)
                item = model.item(li) if isinstance(model, QStandardItemModel) else None
                if item is not None:
                    item.setEnabled(False)
                continue
            w = pr.window(li)
            self.layer_box.addItem(f"{li}" + (f" (sliding window {w})" if w else ""), li)
            first = li if first < 0 else first
        self.head_box.addItem("average of the heads", -1)
        for h in range(pr.model.config.n_head):
            self.head_box.addItem(f"head {h}", h)
        self.layer_box.setCurrentIndex(max(first, 0))
        self.layer_box.blockSignals(False)
        self.head_box.blockSignals(False)
        if first >= 0:
            self._layer_changed(first)
        else:
            self.note.setText("This model has no attention layer.")

    def current_head(self) -> int:
        h = self.head_box.currentData()
        return int(h) if h is not None else -1

    def select(self, layer: int, head: int = -1) -> None:
        """Show ``layer`` (its weights computed in the worker when not cached) and ``head`` (-1: the average)."""
        i = self.head_box.findData(head)
        if i >= 0:
            self.head_box.setCurrentIndex(i)
        j = self.layer_box.findData(layer)
        if j >= 0:
            if j == self.layer_box.currentIndex():
                self._layer_changed(j)
            else:
                self.layer_box.setCurrentIndex(j)

    def _layer_changed(self, _index: int) -> None:
        r = self.result
        li = self.layer_box.currentData()
        if r is None or li is None:
            return
        li = int(li)
        if not r.probe.has_attention(li):
            self.note.setText(f"layer {li} is a recurrent (delta-net) layer: it has no attention weights")
            return
        self.view.want_attention(li)

    def set_weights(self, layer: int, weights: np.ndarray) -> None:
        """The worker's (or the cache's) weights of ``layer``: drawn when it is still the chosen layer."""
        if self.result is None or self.layer_box.currentData() != layer:
            return
        first = self.layer != layer
        self.layer, self.weights = layer, weights
        w = self.result.probe.window(layer)
        T = self.result.probe.n_tokens
        if w:
            scope = f"sliding window: {w:,} positions" + (f" (≥ the prompt's {T}: none cut)" if w >= T else "")
        else:
            scope = "sees the whole prefix"
        self.note.setText(f"layer {layer}: {weights.shape[0]} heads, {scope}; hatched: keys not seen")
        if first:
            self.hover.setText("Hover a cell for its query, key and weight; each row sums to 1 over the keys it sees.")
        self.redraw(keep_view=not first)

    def redraw(self, keep_view: bool = False) -> None:
        r, w = self.result, self.weights
        if r is None or w is None:
            return
        h = self.current_head()
        m = P.head_average(w) if h < 0 else w[h]
        self.shown = m
        scaled = m[:, 1:] if self.sink.isChecked() and m.shape[1] > 1 else m
        hi = float(np.nanmax(scaled)) if np.isfinite(scaled).any() else 1.0
        self.heat.set_data(m, r.labels, r.labels, (0.0, max(hi, 1e-6)), "viridis", None, keep_view)

    def _hover(self, q: int, k: int) -> None:
        r, m = self.result, self.shown
        if r is None or m is None or q < 0:
            return
        v = m[q, k]
        val = "not seen (masked)" if np.isnan(v) else f"weight {float(v):.4f}"
        text = (f"query {q} {token_label(r.probe.pieces[q], 16)} → key {k} {token_label(r.probe.pieces[k], 16)}: "
                f"{val}")
        self.hover.setText(text)
        self.heat.setToolTip(text)

    def _picked(self, q: int, k: int) -> None:
        self._hover(q, k)


# ====================================================================== activations
@qt_guarded
class ActivationsPage(QWidget):
    """The residual stream's RMS per layer, one layer's channels, its top channels and their weight links."""

    linkRequested = Signal(str, str, int)  # tensor, "column" | "row", channel

    def __init__(self, view: ProbeView) -> None:
        super().__init__()
        self.view = view
        self.result: ProbeResult | None = None
        self.index = 0
        self.channel: int | None = None

        self.rms_axis = TokenAxis("bottom")
        self.rms_plot = pg.PlotWidget(axisItems={"bottom": self.rms_axis})
        self.rms_plot.setAccessibleName("Residual stream RMS per layer")
        self.rms_plot.setLabel("bottom", "layer (residual stream after it)")
        self.rms_plot.setLabel("left", "RMS")
        self.rms_plot.setLogMode(y=True)
        self.rms_plot.showGrid(x=False, y=True, alpha=0.2)
        self.rms_plot.addLegend(offset=(10, 5))
        self.rms_plot.getPlotItem().hideButtons()
        self.rms_plot.scene().sigMouseClicked.connect(self._rms_click)
        self.layer_line = pg.InfiniteLine(angle=90, movable=False)
        self.chan_plot = pg.PlotWidget()
        self.chan_plot.setAccessibleName("RMS per channel of the chosen layer")
        self.chan_plot.setLabel("bottom", "channel")
        self.chan_plot.setLabel("left", "RMS over the positions")
        self.chan_plot.showGrid(x=False, y=True, alpha=0.2)
        self.chan_plot.getPlotItem().hideButtons()
        self.chan_plot.getAxis("bottom").enableAutoSIPrefix(False)
        self.chan_plot.scene().sigMouseClicked.connect(self._chan_click)

        self.layer_box = QComboBox()
        self.layer_box.setAccessibleName("Activations layer")
        self.layer_box.currentIndexChanged.connect(self._layer_changed)
        self.summary = QLabel()
        self.summary.setWordWrap(True)
        self.summary.setAccessibleName("Layer summary")
        self.table = _table(["channel", "RMS", "max |x|", "× median"], "Largest channels of the layer")
        self.table.currentCellChanged.connect(lambda row, *_: self._channel_row(row))
        self.links_title = QLabel("Pick a channel: the weights that read or write it are listed here.")
        self.links_title.setWordWrap(True)
        self.links = QListWidget()
        self.links.setAccessibleName("Weights touching the channel")
        self.links.itemActivated.connect(self._link_activated)
        self.show_btn = QPushButton("Show in the Tensors heatmap")
        self.show_btn.setAccessibleName("Show the weight's channel in the Tensors heatmap")
        self.show_btn.setEnabled(False)
        self.show_btn.clicked.connect(lambda: self._link_activated(self.links.currentItem()))
        self.links.currentItemChanged.connect(lambda cur, _p: self.show_btn.setEnabled(cur is not None))

        plots = QSplitter(Qt.Orientation.Vertical)
        plots.addWidget(self.rms_plot)
        plots.addWidget(self.chan_plot)
        side = QWidget()
        sl = QVBoxLayout(side)
        sl.setContentsMargins(0, 0, 0, 0)
        row = QHBoxLayout()
        row.addWidget(QLabel("Layer"))
        row.addWidget(self.layer_box, 1)
        sl.addLayout(row)
        sl.addWidget(self.summary)
        sl.addWidget(self.table, 3)
        sl.addWidget(self.links_title)
        sl.addWidget(self.links, 2)
        sl.addWidget(self.show_btn)
        split = QSplitter()
        split.addWidget(plots)
        split.addWidget(side)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        split.setSizes([640, 380])
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 4, 0, 0)
        lay.addWidget(split)

    def set_result(self, result: ProbeResult | None) -> None:
        self.result = result
        self.rms_plot.clear()
        self.chan_plot.clear()
        self.table.setRowCount(0)
        self.links.clear()
        self.channel = None
        self.layer_box.blockSignals(True)
        self.layer_box.clear()
        if result is None:
            self.layer_box.blockSignals(False)
            self.summary.setText("")
            return
        n = len(result.probe.resid)
        labels = [P.Probe.resid_label(i) for i in range(n)]
        for i in range(n):
            self.layer_box.addItem(resid_text(i) + (" (emb)" if i == 0 else ""), i)
        self.layer_box.blockSignals(False)
        self.rms_axis.set_labels(labels)
        a = result.acts
        x = np.arange(n) + 0.5
        self.rms_plot.plot(x, a.layer_rms(), pen=pg.mkPen(group_color(0), width=2), symbol="o", symbolSize=5,
                           symbolBrush=group_color(0), name="RMS over all positions")
        self.rms_plot.plot(x, a.rms.max(axis=1), pen=pg.mkPen(group_color(1), width=2, style=Qt.PenStyle.DashLine),
                           name="largest position's RMS")
        self.rms_plot.addItem(self.layer_line)
        self.rms_plot.setXRange(0, n, padding=0.01)
        worst = int(np.argmax([a.outlier_ratio(i) for i in range(n)]))
        self.select_layer(worst)

    def select_layer(self, index: int) -> None:
        i = self.layer_box.findData(index)
        if i < 0:
            return
        if i == self.layer_box.currentIndex():
            self._layer_changed(i)
        else:
            self.layer_box.setCurrentIndex(i)

    def _layer_changed(self, _i: int) -> None:
        r = self.result
        idx = self.layer_box.currentData()
        if r is None or idx is None:
            return
        self.index = idx = int(idx)
        a = r.acts
        self.layer_line.setPos(idx + 0.5)
        self.layer_line.setPen(pg.mkPen(group_color(2), width=1.5))
        row = a.channel_rms[idx]
        med = float(np.median(row))
        tops = a.top_channels(idx, 16)
        self.chan_plot.clear()
        E = row.shape[0]
        self.chan_plot.addItem(pg.BarGraphItem(x0=np.arange(E), x1=np.arange(E) + 1, y0=0, y1=row,
                                               brush=pg.mkBrush(group_color(0)), pen=pg.mkPen(None)))
        self.chan_plot.addItem(pg.InfiniteLine(angle=0, pos=med, pen=pg.mkPen(group_color(3),
                                                                            style=Qt.PenStyle.DashLine)))
        xs = np.array([c + 0.5 for c, _, _ in tops[:5]])
        ys = np.array([v for _, v, _ in tops[:5]])
        self.chan_plot.addItem(pg.ScatterPlotItem(xs, ys, size=8, brush=pg.mkBrush(group_color(1)),
                                                  pen=pg.mkPen(None)))
        for c, v, _ in tops[:3]:
            t = pg.TextItem(str(c), anchor=(0.5, 1.1), color=group_color(1))
            t.setPos(c + 0.5, v)
            self.chan_plot.addItem(t)
        self.chan_plot.setXRange(-0.01 * E, 1.04 * E, padding=0)  # room for the labels of the edge channels
        self.chan_plot.setYRange(0, float(row.max()) * 1.2 if row.max() > 0 else 1, padding=0)
        self.chan_plot.setTitle(f"{resid_text(idx)}: RMS of each of the {E:,} channels "
                                "(dashed: the median)", size="9pt")
        ratio = a.outlier_ratio(idx)
        rms = a.rms[idx]
        self.summary.setText(
            f"RMS {float(a.layer_rms()[idx]):.4g} (largest at position {int(rms.argmax())}: "
            f"{float(rms.max()):.4g}); largest channel over the median channel: <b>{ratio:,.1f}×</b>")
        self.table.setRowCount(len(tops))
        for i, (c, v, mx) in enumerate(tops):
            self.table.setItem(i, 0, _cell(str(c)))
            self.table.setItem(i, 1, _cell(f"{v:.4g}", True))
            self.table.setItem(i, 2, _cell(f"{mx:.4g}", True))
            self.table.setItem(i, 3, _cell(f"{v / med:,.1f}" if med > 0 else "∞", True))
        self.table.blockSignals(True)
        self.table.setCurrentCell(0, 0)
        self.table.blockSignals(False)
        if tops:
            self.select_channel(tops[0][0])

    def _channel_row(self, row: int) -> None:
        it = self.table.item(row, 0) if row >= 0 else None
        if it is not None:
            self.select_channel(int(it.text()))

    def select_channel(self, channel: int) -> None:
        """List the weights that read/write ``channel`` of the chosen residual index."""
        r = self.result
        if r is None:
            return
        self.channel = channel
        names = self.view.tensor_names()
        links = P.channel_links(names, r.probe.n_layers, self.index)
        self.links.clear()
        for name, axis in links:
            it = QListWidgetItem(f"{name} — {axis} {channel}")
            it.setData(Qt.ItemDataRole.UserRole, (name, axis, channel))
            it.setToolTip(f"{'reads' if axis == 'column' else 'writes'} channel {channel}: show its {axis} in the "
                          "Tensors tab's heatmap")
            self.links.addItem(it)
        self.links_title.setText(f"Channel <b>{channel}</b> {resid_text(self.index)}: the weight columns that read "
                                 "it and the rows that wrote it (Enter or double click: show in the Tensors heatmap)"
                                 if links else f"Channel {channel}: no weight of this file touches it directly.")
        if links:
            self.links.setCurrentRow(0)
        self.show_btn.setEnabled(bool(links))

    def _link_activated(self, item: QListWidgetItem | None) -> None:
        if item is None:
            return
        name, axis, channel = item.data(Qt.ItemDataRole.UserRole)
        self.linkRequested.emit(name, axis, int(channel))

    def _rms_click(self, event: Any) -> None:
        if event.button() != Qt.MouseButton.LeftButton or self.result is None:
            return
        vb = self.rms_plot.getPlotItem().vb
        if not vb.sceneBoundingRect().contains(event.scenePos()):
            return
        x = int(np.floor(vb.mapSceneToView(event.scenePos()).x()))
        if 0 <= x < len(self.result.probe.resid):
            self.select_layer(x)

    def _chan_click(self, event: Any) -> None:
        if event.button() != Qt.MouseButton.LeftButton or self.result is None:
            return
        vb = self.chan_plot.getPlotItem().vb
        if not vb.sceneBoundingRect().contains(event.scenePos()):
            return
        c = int(np.floor(vb.mapSceneToView(event.scenePos()).x()))
        if 0 <= c < self.result.acts.channel_rms.shape[1]:
            self.table.clearSelection()
            self.select_channel(c)


# ====================================================================== the tab
@qt_guarded
class ProbeView(QWidget):
    """The Probe tab."""

    channelLinkRequested = Signal(str, str, int)  # tensor, "column" | "row", channel
    ranOut = Signal(str)  # a run (or a recomputation) ended: "done", "cancelled", "failed", "refused"

    def __init__(self, runner: TaskRunner, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.runner = runner
        self.doc: Document | None = None
        self.engine: Any = None
        self.result: ProbeResult | None = None
        self.job = JobSlot(runner, self, on_busy=self._set_busy)
        self.state = "idle"  # idle, running, done, cancelled, failed, refused
        self.error = ""
        self.n_tokens: int | None = None
        self._attention: dict[int, np.ndarray] = {}
        self._pending_layer: int | None = None
        self._retired: list[Any] = []

        self.prompt = QPlainTextEdit()
        self.prompt.setAccessibleName("Probe prompt")
        self.prompt.setPlaceholderText("A prompt of at most 1,024 tokens, e.g. The capital of France is Paris, and "
                                       "the capital of Italy is")
        self.prompt.setTabChangesFocus(True)
        self.prompt.setMaximumHeight(76)
        self.prompt.textChanged.connect(lambda: self._count_timer.start())
        self._count_timer = QTimer(self)
        self._count_timer.setSingleShot(True)
        self._count_timer.setInterval(200)
        self._count_timer.timeout.connect(self.update_count)
        self.count = QLabel()
        self.count.setAccessibleName("Prompt tokens")
        self.target = QComboBox()
        self.target.addItem("the final prediction", "final")
        self.target.addItem("the next prompt token", "next")
        self.target.setAccessibleName("Logit lens target")
        self.target.setToolTip("The token whose rank and probability the logit lens follows at each position: the "
                               "model's own final prediction there, or the token that comes next in the prompt")
        self.target.currentIndexChanged.connect(self._target_changed)
        # [tokens][Lens target ▾] … [Run][Cancel] over [progress][status]
        self.strip = JobStrip("probe", "Run", scale=1000, progress_width=180, status=ElidedLabel(),
                              layout="two_rows", disable_run=True,
                              controls=controls_row(self.count, 12, QLabel("Lens target"), self.target, None))
        self.strip.run_btn.setToolTip("Run the prompt through the model and keep its insides (Ctrl+Enter)")
        self.strip.run_clicked.connect(self.run)
        self.strip.cancel_clicked.connect(self.cancel)
        self.run_btn = self.strip.run_btn
        self.cancel_btn = self.strip.cancel_btn
        self.progress = self.strip.progress
        self.status: ElidedLabel = self.strip.status  # type: ignore[assignment]
        for key in ("Ctrl+Return", "Ctrl+Enter"):
            sc = QShortcut(QKeySequence(key), self)
            sc.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
            sc.activated.connect(self.run)
            sc.setWhatsThis("run the probe on the prompt")

        self.lens_page = LensPage(self)
        self.attention_page = AttentionPage(self)
        self.activations_page = ActivationsPage(self)
        self.activations_page.linkRequested.connect(self.channelLinkRequested)
        self.pages = QTabWidget()
        self.pages.setAccessibleName("Probe pages")
        self.pages.addTab(self.lens_page, "Logit lens")
        self.pages.addTab(self.attention_page, "Attention")
        self.pages.addTab(self.activations_page, "Activations")
        self.exporter = Exporter(self, runner, standalone=True)
        for w, name in ((self.lens_page.heat, "logit-lens"), (self.attention_page.heat, "attention"),
                        (self.activations_page.rms_plot, "residual-rms"),
                        (self.activations_page.chan_plot, "channel-rms")):
            self.exporter.install_plot_menu(w, name)

        lay = QVBoxLayout(self)
        lay.addWidget(self.prompt)
        lay.addWidget(self.strip)
        lay.addWidget(self.pages, 1)
        self._dark = is_dark()
        self._set_busy(False)
        self.set_document(None)

    # ------------------------------------------------------------------ helpers
    def key_help(self) -> list[tuple[str, str]]:
        return [("Ctrl+Enter", "run the probe on the prompt"),
                ("arrow keys, Home/End", "move the picked cell of a heatmap (its details shown beside it)"),
                ("Enter on a weight link", "show the channel's column/row in the Tensors heatmap")]

    def piece(self, tid: int) -> str:
        tok = self.engine.tokenizer if self.engine is not None else None
        if tok is None:
            return str(tid)
        try:
            return str(tok.decode([int(tid)]))
        except Exception:  # an id the decoder refuses: its number
            return f"<{tid}>"

    def tensor_names(self) -> list[str]:
        f = self.doc.gguf if self.doc is not None else None
        return [t.name for t in f.tensors] if f is not None else []

    def _say(self, text: str, error: bool = False) -> None:
        self.status.setText(text)
        self.status.setStyleSheet(f"color: {BAD_COLOR};" if error else "")

    def _set_busy(self, busy: bool) -> None:
        self.strip.set_can_run(self.doc is not None)
        self.strip.set_busy(busy)
        self.target.setEnabled(not busy)
        if not busy:
            QTimer.singleShot(0, self, self._idle)  # after the ended task has left the runner's list

    @property
    def busy(self) -> bool:
        return self.job.busy

    @property
    def task(self) -> Task | None:
        return self.job.task

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange and is_dark() != self._dark:
            self._dark = is_dark()
            for h in (self.lens_page.heat, self.attention_page.heat):
                h.restyle()

    # ------------------------------------------------------------------ the document
    def set_document(self, doc: Document | None) -> None:
        """A new file (or none): cancel the work, drop the engine and the results."""
        self.job.forget()
        self._retire(self.engine)
        self.engine = None
        self.doc = doc if doc is not None and doc.gguf is not None else None
        self.result = None
        self._attention.clear()
        self._pending_layer = None
        self.n_tokens = None
        self.state = "idle"
        self.error = ""
        for page in (self.lens_page, self.attention_page, self.activations_page):
            page.set_result(None)
        self._set_busy(False)
        self._say("Type a prompt and press Run (Ctrl+Enter): the model is loaded on the CPU for the first run."
                  if self.doc is not None else "Open a GGUF model to probe it.")
        self.update_count()

    def _retire(self, eng: Any) -> None:
        """Release ``eng`` now, or when the task still using it has ended."""
        if eng is None:
            return
        if any(not t.done for t in self.runner.running() if t.name in TASK_NAMES):
            self._retired.append(eng)
        else:
            release_engine(eng)

    def shutdown(self) -> None:
        """The window closes (after the runner's shutdown): free the engine."""
        self._retire(self.engine)
        self.engine = None
        for e in self._retired:
            release_engine(e)
        self._retired.clear()

    # ------------------------------------------------------------------ the prompt
    def tokenize(self, text: str) -> list[int]:
        assert self.engine is not None
        return [int(t) for t in self.engine.tokenizer.encode(text)]

    def update_count(self) -> None:
        text = self.prompt.toPlainText()
        self.n_tokens = None
        if self.engine is None:
            self.count.setText(f"{len(text):,} characters (tokens counted once the model is loaded)")
            self.count.setStyleSheet("")
            return
        if len(text) > LIVE_COUNT_CHARS:
            self.count.setText(f"{len(text):,} characters: tokens counted at Run (at most {MAX_TOKENS:,})")
            self.count.setStyleSheet("")
            return
        self.n_tokens = n = len(self.tokenize(text)) if text else 0
        over = n > MAX_TOKENS
        self.count.setText(f"{n:,} / {MAX_TOKENS:,} tokens" + (" — too long" if over else ""))
        self.count.setStyleSheet(f"color: {BAD_COLOR};" if over else "")

    # ------------------------------------------------------------------ running
    def run(self) -> bool:
        """Start a probe of the prompt (loading the model first when needed); False when refused or busy."""
        if self.doc is None or self.busy:
            return False
        text = self.prompt.toPlainText()
        if not text:
            self._refuse("Type a prompt first.")
            return False
        if self.engine is not None and len(text) <= LIVE_COUNT_CHARS:
            n = len(self.tokenize(text))
            if n > MAX_TOKENS:
                self._refuse(f"The prompt has {n:,} tokens; the probe takes at most {MAX_TOKENS:,}. Shorten it.")
                return False
        path, engine, target = self.doc.path, self.engine, str(self.target.currentData())

        def work(report: Any, token: Any) -> tuple[Any, ProbeResult]:
            from quantscope.core.jobs import check_cancel

            eng = engine if engine is not None else _load_engine(path, token, report)
            check_cancel(token)
            t0 = time.perf_counter()
            ids = [int(t) for t in eng.tokenizer.encode(text)]
            if not ids:
                raise ProbeRefused("The prompt has no tokens.")
            if len(ids) > MAX_TOKENS:
                raise ProbeRefused(f"The prompt has {len(ids):,} tokens; the probe takes at most {MAX_TOKENS:,}. "
                                   "Shorten it.")
            pieces = [str(eng.tokenizer.decode([t])) for t in ids]
            report(100, 1000, f"running {len(ids)} tokens through {eng.model.config.n_layers} layers")
            pr = P.run_probe(eng.model, ids, pieces, token, lambda f: report(100 + int(200 * f), 1000,
                                                                              "running the layers"))
            t1 = time.perf_counter()
            lens = P.logit_lens(pr, 5, target, token, lambda f: report(300 + int(690 * f), 1000,
                                                                        "logit lens: every layer through the head"))
            t2 = time.perf_counter()
            acts = P.activations(pr)
            t3 = time.perf_counter()
            labels = [token_label(s) for s in pieces]
            return eng, ProbeResult(pr, lens, acts, labels, {"probe": t1 - t0, "lens": t2 - t1, "acts": t3 - t2})

        def done(out: tuple[Any, ProbeResult]) -> None:
            eng, res = out
            if self.doc is None or self.doc.path != path:
                self._retire(eng)
                return
            self.engine = eng
            self._show(res)
            self.update_count()

        self._start("probe-run", work, done, "Loading the model…" if engine is None else "Running…")
        return True

    def _refuse(self, message: str) -> None:
        self.state, self.error = "refused", message
        self._say(message, error=True)
        self.ranOut.emit("refused")

    def _start(self, name: str, work: Any, done: Any, text: str, status: bool = True) -> Task:
        """Run ``work`` as the one probe task (the view's :class:`JobSlot`: busy until it ends, however it ends);
        ``status``: its text and progress go to the status line (else it is left alone: a short computation for
        one page)."""
        doc = self.doc

        def progress(d: int, t: int, what: str) -> None:
            if t:
                self.strip.progress_to(d, t)
            else:
                self.progress.setValue(0)
            if what and status:
                self._say(what[:1].upper() + what[1:] + "…")

        def finished(res: Any) -> None:
            if self.doc is doc:
                done(res)

        def cancelled() -> None:
            self.state = "cancelled"
            self._say("Cancelled." + (" The last run's results are still shown." if self.result else ""))
            self.ranOut.emit("cancelled")

        self.state, self.error = "running", ""
        self.progress.setValue(0)  # (the slot's on_busy shows the strip running)
        if status:
            self._say(text)
        return self.job.start(name, work, on_done=finished, on_progress=progress, on_failed=self._failed,
                              on_cancelled=cancelled)

    def _idle(self) -> None:
        """The job ended (whichever way): free retired engines, then run the attention layer asked meanwhile."""
        if not any(not t.done for t in self.runner.running() if t.name in TASK_NAMES):
            for e in self._retired:
                release_engine(e)
            self._retired.clear()
        if self._pending_layer is not None and self.result is not None:
            layer, self._pending_layer = self._pending_layer, None
            self.want_attention(layer)

    def _failed(self, msg: str, _tb: str) -> None:
        self.state, self.error = "failed", msg
        self._say(msg, error=True)
        self.ranOut.emit("failed")

    def cancel(self) -> None:
        self.strip.cancelling()  # (only while a job runs)
        self.job.cancel()

    def _show(self, res: ProbeResult) -> None:
        self.result = res
        self._attention.clear()
        self.state = "done"
        pr = res.probe
        s = res.seconds
        last = int(res.lens.targets[-1])
        self._say(f"{pr.n_tokens:,} tokens through {pr.n_layers} layers of {pr.model.config.arch} · the model "
                  f"predicts {token_label(self.piece(last), 20)} next · probe {s['probe']:.2f} s, logit lens "
                  f"{s['lens']:.2f} s")
        self.lens_page.set_result(res)
        self.attention_page.set_result(res)
        self.activations_page.set_result(res)
        self.ranOut.emit("done")

    def _target_changed(self, _i: int) -> None:
        r = self.result
        target = str(self.target.currentData())
        if r is None or self.busy or r.lens.target_kind == target:
            return
        pr = r.probe

        def work(report: Any, token: Any) -> tuple[P.LogitLens, float]:
            t0 = time.perf_counter()
            lens = P.logit_lens(pr, 5, target, token, lambda f: report(int(1000 * f), 1000, "logit lens"))
            return lens, time.perf_counter() - t0

        def done(out: tuple[P.LogitLens, float]) -> None:
            lens, secs = out
            if self.result is r:
                r.lens = lens
                r.seconds["lens"] = secs
                self.state = "done"
                self._say(f"Logit lens of {TARGET_TEXT[target]} in {secs:.2f} s")
                self.lens_page.set_result(r)
                self.ranOut.emit("done")

        self._start("probe-lens", work, done, "Logit lens for the new target…")

    def want_attention(self, layer: int) -> None:
        """The attention page wants ``layer``'s weights: from the cache, or computed in the worker (after the task
        running now)."""
        r = self.result
        if r is None:
            return
        w = self._attention.get(layer)
        if w is not None:
            self.attention_page.set_weights(layer, w)
            return
        if self.busy:
            self._pending_layer = layer
            return
        pr = r.probe

        def work(report: Any, token: Any) -> np.ndarray:
            report(0, 1, f"attention weights of layer {layer}")
            return pr.attention(layer)

        def done(weights: np.ndarray) -> None:
            if self.result is not r:
                return
            self._attention[layer] = weights
            while len(self._attention) > ATTENTION_CACHE:
                self._attention.pop(next(iter(self._attention)))
            self.state = "done"
            self.attention_page.set_weights(layer, weights)
            self.ranOut.emit("done")

        self.attention_page.note.setText(f"computing the attention weights of layer {layer}…")
        self._start("probe-attention", work, done, "", status=False)
