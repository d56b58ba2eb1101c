"""The Quant lab's pictures: bits per weight against an error figure (points labelled with the type names), the
per-block RMSE heatmap of one type, and one block before and after the round trip with its requantized bytes decoded
by the block inspector's widgets. They draw figures :mod:`quantscope.core.quant.lab` computed."""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt, QTimer, Signal
from PySide6.QtGui import QFont
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QTableView,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from quantscope.core.quant import decode_block
from quantscope.core.quant.lab import BlockPair, ErrorStats

from ..exports import Exporter
from ..guard import qt_guarded
from ..theme import group_color, muted_color, plot_pen_color
from ..widgets.blockwidgets import HexView, mono_font
from ..widgets.fit import ElidedLabel, fit_columns
from ..widgets.plots import CompactPlot
from .block_inspector import FieldModel, _field_value_text
from .quant_lab_table import METRICS, metric_text

CURRENT_COLOR = "#e15759"  # the tensor's own type
SELECTED_COLOR = "#f28e2b"  # the type chosen in the table
BPW_TICKS = (2, 3, 4, 5, 6, 8, 12, 16)
_HEAT_MAP = "viridis"


def _tip(e: ErrorStats, current: bool) -> str:
    lines = [f"{e.type}{' (the tensor’s type in this file)' if current else ''}",
             f"{metric_text('bpw', e.bits_per_weight)} bits per weight"]
    for key, label, _log in METRICS:
        v = getattr(e, key)
        if v is not None:
            lines.append(f"{label}: {metric_text(key, v)}")
    return "\n".join(lines)


@qt_guarded
class BpwPlot(CompactPlot):
    """Bits per weight (logarithmic x) against one error figure, a point per type labelled with its name; the
    tensor's own type ringed in red, the selected one filled orange. Errors that are 0 (exact round trips) sit on a
    line below the others, an infinite SNR above them, each labelled "exact"."""

    typeClicked = Signal(str)

    def __init__(self) -> None:
        super().__init__((420, 240))
        self.setAccessibleName("Bits per weight against the chosen error, one labelled point per type")
        self.showGrid(x=True, y=True, alpha=0.2)
        self.setMouseEnabled(x=False, y=False)
        self.hideButtons()
        self.setMenuEnabled(False)
        self.exporter = Exporter(self, standalone=True)
        self.exporter.install_plot_menu(self, "bits per weight")
        pi = self.getPlotItem()
        pi.setLabel("bottom", "bits per weight")
        self.getAxis("left").enableAutoSIPrefix(False)
        self.getAxis("bottom").setTicks([[(math.log10(v), str(v)) for v in BPW_TICKS]])
        self.errors: list[ErrorStats] = []
        self.metric = "rmse"
        self.current: str | None = None
        self.selected: str | None = None
        self.points = pg.ScatterPlotItem(hoverable=True, tip=None)
        self.points.sigClicked.connect(self._clicked)
        self.rings = pg.ScatterPlotItem()
        self.leaders = pg.PlotDataItem(pen=pg.mkPen(muted_color(), width=0.8))  # point -> a label set apart
        self.addItem(self.leaders, ignoreBounds=True)
        self.addItem(self.rings)
        self.addItem(self.points)
        self.labels: list[pg.TextItem] = []
        self.positions: dict[str, tuple[float, float]] = {}  # type -> (x, y) in plot coordinates
        self._font = QFont()
        self._font.setPointSizeF(8)
        self._bold = QFont(self._font)
        self._bold.setBold(True)
        self._place_timer = QTimer(self)
        self._place_timer.setSingleShot(True)
        self._place_timer.setInterval(0)
        self._place_timer.timeout.connect(self.place_labels)
        pi.vb.sigRangeChanged.connect(lambda *_: self._place_timer.start())
        pi.vb.sigResized.connect(lambda *_: self._place_timer.start())

    def clear_points(self) -> None:
        self.set_errors([], self.metric, None)

    def set_errors(self, errors: list[ErrorStats], metric: str, current: str | None,
                   selected: str | None = None) -> None:
        self.errors = list(errors)
        self.metric = metric
        self.current = current
        self.selected = selected
        self._draw()

    def set_metric(self, metric: str) -> None:
        self.metric = metric
        self._draw()

    def set_selected(self, qtype: str | None) -> None:
        self.selected = qtype
        self._draw()

    def label_texts(self) -> list[str]:
        return [t.toPlainText() for t in self.labels]

    def _draw(self) -> None:
        old = {t.data(0): t for t in self.labels}  # the labels are kept and updated, not made anew each time
        self.labels = []
        self.positions = {}
        key, label, log = next(m for m in METRICS if m[0] == self.metric)
        self.getAxis("left").setLogMode(log)
        self.setLabel("left", label + (" (log)" if log else ""))
        shown = [e for e in self.errors if getattr(e, key) is not None and not math.isnan(getattr(e, key))]
        for axis in ("left", "bottom"):
            self.getPlotItem().showAxis(axis, bool(shown))
        self.leaders.setData([], [])
        keep = {e.type for e in shown}
        for q, t in old.items():
            if q not in keep:
                self.removeItem(t)
        if not shown:
            self.points.setData([])
            self.rings.setData([])
            return
        vals = {e.type: float(getattr(e, key)) for e in shown}
        finite = [v for v in vals.values() if math.isfinite(v) and (v > 0 or not log)]
        if log:
            lo = math.log10(min(finite)) if finite else -6.0
            hi = math.log10(max(finite)) if finite else lo
            floor = lo - max(0.25, 0.12 * (hi - lo))  # exact (0) round trips: on a line below the others
        else:
            lo = min(finite) if finite else 0.0
            hi = max(finite) if finite else 1.0
            ceil = hi + max(3.0, 0.12 * (hi - lo))  # infinite SNR: on a line above
        spots, rings = [], []
        for e in shown:
            v = vals[e.type]
            exact = e.exact
            if log:
                y = floor if v <= 0 else math.log10(v)
            else:
                y = ceil if v == math.inf else (lo if not math.isfinite(v) else v)
            x = math.log10(e.bits_per_weight)
            self.positions[e.type] = (x, y)
            is_cur, is_sel = e.type == self.current, e.type == self.selected
            color = SELECTED_COLOR if is_sel else group_color(0)
            spots.append({"pos": (x, y), "data": e.type, "size": 11 if is_sel else 8, "symbol": "o",
                          "brush": pg.mkBrush(color), "pen": pg.mkPen(plot_pen_color(), width=1.5 if is_sel else 0.8)})
            if is_cur:
                rings.append({"pos": (x, y), "size": 18, "brush": None, "pen": pg.mkPen(CURRENT_COLOR, width=2.2),
                              "symbol": "o"})
            text = e.type + (" · exact" if exact else "") + (" · this file" if is_cur else "")
            color = CURRENT_COLOR if is_cur else plot_pen_color()
            font = self._bold if is_cur or is_sel else self._font
            ti = old.get(e.type)
            if ti is None:
                ti = pg.TextItem(text, color=color, anchor=(0, 0))
                ti.textItem.document().setDocumentMargin(1)
                ti.setData(0, e.type)
                ti.setFont(font)
                self.addItem(ti, ignoreBounds=True)
            else:
                if ti.toPlainText() != text or ti.color != pg.mkColor(color):
                    ti.setText(text, color)
                if ti.textItem.font() != font:
                    ti.setFont(font)
            ti.setToolTip(_tip(e, is_cur))
            self.labels.append(ti)
        tips = {e.type: _tip(e, e.type == self.current) for e in shown}
        self.points.setData(spots, tip=lambda x, y, data: tips.get(data, ""))
        self.rings.setData(rings)
        xs = [p[0] for p in self.positions.values()]
        ys = [p[1] for p in self.positions.values()]
        xpad = 0.04 * (max(xs) - min(xs) or 1)
        ypad = 0.1 * (max(ys) - min(ys) or 1)
        # room on the right for the labels of the widest types (16-bit), a little below and above
        self.setXRange(min(xs) - xpad, max(xs) + 4 * xpad, padding=0)
        self.setYRange(min(ys) - ypad, max(ys) + ypad, padding=0)
        self._place_timer.start()

    def place_labels(self) -> None:
        """Put each label beside its point where it overlaps no other label or point and stays inside the plot
        (right, left, above, below, then the diagonals); the tensor's type and the selected one first."""
        if not self.labels:
            return
        vb = self.getPlotItem().vb
        area = vb.sceneBoundingRect()
        if area.width() < 10 or area.height() < 10:
            return
        pts = {q: vb.mapViewToScene(QPointF(*p)) for q, p in self.positions.items()}
        obstacles = [QRectF(p.x() - 5, p.y() - 5, 10, 10) for p in pts.values()]
        placed: list[QRectF] = []
        seg_x: list[float] = []
        seg_y: list[float] = []
        order = sorted(self.labels, key=lambda t: (t.data(0) != self.current, t.data(0) != self.selected,
                                                   self.positions[t.data(0)][0]))
        for ti in order:
            q = ti.data(0)
            p = pts[q]
            size = ti.mapRectToScene(ti.boundingRect())
            w, h = size.width() + 2, size.height()
            cands = []
            for gap in (6, 6 + h * 0.9, 6 + h * 1.8):  # beside the point first, then a little further out
                cands += [(gap, -h / 2), (-gap - w, -h / 2), (-w / 2, -h - gap + 3), (-w / 2, gap - 3),
                          (gap - 3, -h - gap / 2), (gap - 3, gap / 2), (-gap - w + 3, -h - gap / 2),
                          (-gap - w + 3, gap / 2)]
            best, best_cost = None, math.inf
            for dx, dy in cands:
                r = QRectF(p.x() + dx, p.y() + dy, w, h)
                cost = 0.0
                if not area.contains(r):
                    cost += 1000 + (r.united(area).width() * r.united(area).height() - area.width() * area.height())
                for o in placed:
                    if o.intersects(r):
                        ir = o.intersected(r)
                        cost += 100 + ir.width() * ir.height()
                for o in obstacles:
                    if o.intersects(r):
                        cost += 200
                cost += 0.1 * (abs(dx + w / 2) + abs(dy + h / 2))  # nearer is better
                if cost < best_cost:
                    best, best_cost = r, cost
            assert best is not None
            placed.append(best)
            ti.setPos(vb.mapSceneToView(best.topLeft()))
            near = QPointF(min(max(p.x(), best.left()), best.right()), min(max(p.y(), best.top()), best.bottom()))
            if (near - p).manhattanLength() > 12:  # set apart from its point: a thin line shows whose it is
                for end in (p, near):
                    v = vb.mapSceneToView(end)
                    seg_x.append(v.x())
                    seg_y.append(v.y())
        self.leaders.setData(seg_x, seg_y, connect="pairs")

    def label_rects(self) -> dict[str, QRectF]:
        """Each label's rectangle in scene coordinates (tests check that they do not overlap)."""
        return {t.data(0): t.mapRectToScene(t.boundingRect()) for t in self.labels}

    def _clicked(self, _item: object, points: object, _ev: object = None) -> None:
        pts = list(points)  # type: ignore[call-overload]
        if pts:
            self.typeClicked.emit(str(pts[0].data()))


@qt_guarded
class BlockHeatmap(QWidget):
    """The RMSE of every block of the measured rows for one type: rows along x, blocks along y. Hover shows the
    row (and the tensor row it is), the block and its columns and its RMSE; a click picks the block. The worst
    block is marked with a red ring, the picked one with a square."""

    blockClicked = Signal(int, int)  # measured row, block

    HINT = "Hover for a block's RMSE; click a block to see it before and after."

    def __init__(self) -> None:
        super().__init__()
        self.block_rmse: np.ndarray | None = None
        self.rows: np.ndarray | None = None
        self.block_elems = 1
        self.qtype = ""
        self.gl = pg.GraphicsLayoutWidget()
        self.gl.setAccessibleName("Per-block RMSE heatmap of the selected type")
        self.gl.setMinimumHeight(120)
        self.gl.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self.plot = self.gl.addPlot()
        self.plot.setLabel("bottom", "row (measured)")
        self.plot.setLabel("left", "block")
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.image = pg.ImageItem(axisOrder="row-major")
        self.plot.addItem(self.image)
        self.colorbar = pg.ColorBarItem(values=(0, 1), colorMap=pg.colormap.get(_HEAT_MAP), interactive=False,
                                        width=12, label="RMSE")
        self.colorbar.setImageItem(self.image, insert_in=self.plot)
        self.worst_marker = pg.ScatterPlotItem(size=22, symbol="o", brush=None, pen=pg.mkPen(CURRENT_COLOR, width=2))
        self.pick_marker = pg.ScatterPlotItem(size=14, symbol="s", brush=None,
                                              pen=pg.mkPen(SELECTED_COLOR, width=2.2))
        self.plot.addItem(self.worst_marker)
        self.plot.addItem(self.pick_marker)
        self.title = ElidedLabel()
        self.title.setObjectName("heading")
        self.title.setAccessibleName("Heatmap title")
        self.hover = ElidedLabel(self.HINT)
        self.hover.setObjectName("muted")
        self.hover.setAccessibleName("Heatmap position")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(2)
        lay.addWidget(self.title)
        lay.addWidget(self.gl, 1)
        self.footer = QHBoxLayout()
        self.footer.addWidget(self.hover, 1)
        lay.addLayout(self.footer)
        self.plot.scene().sigMouseMoved.connect(self._hover)
        self.plot.scene().sigMouseClicked.connect(self._click)
        self.exporter = Exporter(self, standalone=True)
        self.exporter.install_plot_menu(self.gl, "block RMSE")
        self.clear()

    def clear(self, text: str = "") -> None:
        self.block_rmse = None
        self.image.clear()
        self.worst_marker.setData([])
        self.pick_marker.setData([])
        for side in ("left", "bottom"):
            self.plot.showAxis(side, False)
        self.colorbar.setVisible(False)
        self.title.setText(text or "Per-block RMSE")
        self.hover.setText("Requantize a tensor, then pick a type in the table: its blocks' errors appear here."
                           if not text else self.HINT)

    def set_blocks(self, qtype: str, block_rmse: np.ndarray, rows: np.ndarray, block_elems: int,
                   worst: tuple[int, int, float] | None) -> None:
        """Show ``block_rmse`` (measured rows x blocks) of ``qtype``; ``rows`` maps a measured row to the tensor's."""
        self.qtype = qtype
        self.block_rmse = block_rmse
        self.rows = rows
        self.block_elems = block_elems
        n_rows, n_blocks = block_rmse.shape
        for side in ("left", "bottom"):
            self.plot.showAxis(side, True)
        self.colorbar.setVisible(True)
        hi = worst[2] if worst is not None else 0.0
        self.image.setImage(np.ascontiguousarray(block_rmse.T), autoLevels=False)
        self.colorbar.setLevels((0.0, hi if hi > 0 else 1.0))
        self.image.setRect(QRectF(0, 0, n_rows, n_blocks))
        self.plot.setRange(xRange=(0, n_rows), yRange=(0, n_blocks), padding=0.02)
        if worst is not None and worst[2] > 0:
            self.worst_marker.setData([worst[0] + 0.5], [worst[1] + 0.5])
        else:
            self.worst_marker.setData([])
        exact = hi == 0
        self.title.setText(f"{qtype}: RMSE of each block ({n_rows:,} rows × {n_blocks:,} blocks of {block_elems})"
                           + (" — exact, every block is 0" if exact else ""))
        self.hover.setText(self.HINT)

    def set_pick(self, row: int, block: int) -> None:
        self.pick_marker.setData([row + 0.5], [block + 0.5])

    def describe(self, row: int, block: int) -> str:
        """``row 37 (tensor row 37) · block 9, columns 288–319 · RMSE 0.0123``."""
        assert self.block_rmse is not None and self.rows is not None
        a = block * self.block_elems
        trow = int(self.rows[row])
        cols = f"column {a}" if self.block_elems == 1 else f"columns {a}–{a + self.block_elems - 1}"
        return (f"row {row:,}" + (f" (tensor row {trow:,})" if trow != row else "") + f" · block {block:,}, {cols}"
                f" · RMSE {float(self.block_rmse[row, block]):.5g}")

    def block_at(self, scene_pos: object) -> tuple[int, int] | None:
        if self.block_rmse is None:
            return None
        vb = self.plot.vb
        if not vb.sceneBoundingRect().contains(scene_pos):
            return None
        p = vb.mapSceneToView(scene_pos)
        if p.x() < 0 or p.y() < 0:
            return None
        row, block = int(p.x()), int(p.y())
        n_rows, n_blocks = self.block_rmse.shape
        return (row, block) if row < n_rows and block < n_blocks else None

    def _hover(self, scene_pos: object) -> None:
        at = self.block_at(scene_pos)
        if at is not None:
            self.hover.setText(self.describe(*at))

    def _click(self, event: object) -> None:
        if event.button() != Qt.MouseButton.LeftButton:  # type: ignore[attr-defined]  # right: the plot menu
            return
        at = self.block_at(event.scenePos())  # type: ignore[attr-defined]
        if at is not None:
            self.blockClicked.emit(*at)


@qt_guarded
class BlockCompare(QWidget):
    """One block before and after: the original values and the requantized ones (a plot of both, a line from each
    original value to what it became), and the requantized block's bytes decoded field by field."""

    inspectRequested = Signal()  # "this file's block in the block inspector"

    def __init__(self) -> None:
        super().__init__()
        self.pair: BlockPair | None = None
        self.title = ElidedLabel("Block before and after")
        self.title.setObjectName("heading")
        self.title.setAccessibleName("Block shown")
        self.inspect_btn = QPushButton("Open in the inspector")
        self.inspect_btn.setAccessibleName("Open this file's block at these columns in the block inspector")
        self.inspect_btn.setToolTip("The block of this file's tensor that holds these columns, in the block "
                                    "inspector")
        self.inspect_btn.clicked.connect(self.inspectRequested)
        self.inspect_btn.setEnabled(False)
        self.info = ElidedLabel()
        self.info.setObjectName("muted")
        self.info.setAccessibleName("Block errors")

        self.plot = CompactPlot((380, 200))
        self.plot.setAccessibleName("The block's original and requantized values")
        self.plot.showGrid(x=True, y=True, alpha=0.2)
        self.plot.setLabel("bottom", "element of the block")
        self.plot.setLabel("left", "value")
        self.plot.getAxis("left").enableAutoSIPrefix(False)
        self.plot.setMenuEnabled(False)
        self.exporter = Exporter(self, standalone=True)
        self.exporter.install_plot_menu(self.plot, "requantized block")
        self.moves = pg.PlotDataItem(pen=pg.mkPen(muted_color(), width=1))
        self.orig = pg.ScatterPlotItem(size=7, symbol="o", brush=None, pen=pg.mkPen(group_color(0), width=1.6))
        self.requant = pg.ScatterPlotItem(size=6, symbol="s", brush=pg.mkBrush(SELECTED_COLOR), pen=None)
        self.plot.addItem(self.moves)
        self.plot.addItem(self.orig)
        self.plot.addItem(self.requant)

        self.formula = QLabel()
        self.formula.setFont(mono_font(9.5, bold=True))
        self.formula.setAccessibleName("Dequantization formula of the requantized block")
        self.formula.setWordWrap(True)
        self.formula.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.hex = HexView()
        self.fields_model = FieldModel()
        self.fields = QTableView()
        self.fields.setModel(self.fields_model)
        self.fields.setAccessibleName("Fields of the requantized block")
        self.fields.verticalHeader().setVisible(False)
        self.fields.setWordWrap(False)
        self.fields.setMinimumHeight(120)
        fit_columns(self.fields, stretch=5, optional=(3, 1, 2), min_stretch=120)
        bytes_page = QWidget()
        bl = QVBoxLayout(bytes_page)
        bl.setContentsMargins(0, 4, 0, 0)
        bl.addWidget(self.formula)
        bl.addWidget(self.hex)
        bl.addWidget(self.fields, 1)
        self.bytes_scroll = QScrollArea()
        self.bytes_scroll.setWidgetResizable(True)
        self.bytes_scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        self.bytes_scroll.setWidget(bytes_page)
        self.bytes_scroll.setAccessibleName("The requantized block's bytes")

        self.tabs = QTabWidget()
        self.tabs.setAccessibleName("Block before and after")
        self.tabs.setDocumentMode(True)
        self.tabs.addTab(self.plot, "Values")
        self.tabs.addTab(self.bytes_scroll, "Requantized bytes")
        key = QLabel(f"<span style='color:{group_color(0).name()}'>○</span> original &nbsp; "
                     f"<span style='color:{SELECTED_COLOR}'>■</span> requantized &nbsp;")
        key.setAccessibleName("Legend of the values plot")
        self.tabs.setCornerWidget(key, Qt.Corner.TopRightCorner)
        head = QHBoxLayout()
        head.addWidget(self.title, 1)
        head.addWidget(self.inspect_btn)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(2)
        lay.addLayout(head)
        lay.addWidget(self.tabs, 1)
        lay.addWidget(self.info)
        self.clear()

    def clear(self) -> None:
        self.pair = None
        self.title.setText("Block before and after")
        self.info.setText("Click a block in the heatmap.")
        self.orig.setData([], [])
        self.requant.setData([], [])
        self.moves.setData([], [])
        self.formula.setText("")
        self.hex.set_block(b"", [], 0)
        self.fields_model.set_rows([])
        self.inspect_btn.setEnabled(False)

    def set_pair(self, pair: BlockPair, tensor_row: int, can_inspect: bool) -> None:
        self.pair = pair
        a, b = pair.columns
        self.title.setText(f"{pair.qtype} · tensor row {tensor_row:,} · block {pair.block:,} (columns {a}–{b - 1})")
        n = pair.original.size
        x = np.arange(n, dtype=np.float64)
        self.orig.setData(x, pair.original.astype(np.float64))
        self.requant.setData(x, pair.requantized.astype(np.float64))
        seg_x = np.repeat(x, 2)
        seg_y = np.column_stack([pair.original, pair.requantized]).astype(np.float64).reshape(-1)
        self.moves.setData(seg_x, seg_y, connect="pairs")
        self.plot.setXRange(-0.5, n - 0.5, padding=0.02)
        self.plot.enableAutoRange(axis="y")
        el, err = pair.worst_element
        self.info.setText(f"block RMSE {pair.rmse:.5g} · largest move {err:.5g} at element {el} "
                          f"({pair.original[el]:.6g} → {pair.requantized[el]:.6g})")
        d = decode_block(pair.qtype, pair.raw)
        self.formula.setText(d.formula)
        self.hex.set_block(d.raw, d.fields, 0)
        self.fields_model.set_rows([(fd.name, str(fd.offset), str(fd.size), fd.kind, _field_value_text(fd.value),
                                     fd.description) for fd in d.fields])
        self.inspect_btn.setEnabled(can_inspect)

    def decoded_values(self) -> np.ndarray:
        """The requantized block's values as the block decoder reads its bytes (tests compare them)."""
        assert self.pair is not None
        return np.asarray(decode_block(self.pair.qtype, self.pair.raw).values, np.float32)
