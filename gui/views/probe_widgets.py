"""Pieces of the Probe tab: token labels, an axis that labels every n-th token, and a token × token (or layer ×
token) heatmap with hover, click and keyboard selection of a cell, masked cells hatched."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFontMetrics, QKeyEvent, QPainter, QPen, QTransform
from PySide6.QtWidgets import QApplication, QGraphicsRectItem, QWidget

from ..guard import qt_guarded
from ..theme import is_dark, muted_color

#: a token's label on an axis is cut to this many characters (the whole piece is in the hover text)
LABEL_CHARS = 10


def token_label(piece: str, width: int = LABEL_CHARS) -> str:
    """A token piece made visible: a space as ·, a newline as ↵, a tab as ⇥, other control characters as their
    code; cut to ``width`` characters with …; the empty piece as ∅."""
    out = []
    for ch in piece:
        if ch == " ":
            out.append("·")
        elif ch == "\n":
            out.append("↵")
        elif ch == "\t":
            out.append("⇥")
        elif not ch.isprintable():
            out.append(f"\\x{ord(ch):02x}" if ord(ch) < 256 else f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    s = "".join(out) or "∅"
    return s if len(s) <= width else s[: width - 1] + "…"


def nice_step(raw: float) -> int:
    """The smallest whole step of at least ``raw``: 1 to 10 as they are, then 20, 50, 100, 200, …"""
    if raw <= 1:
        return 1
    if raw <= 10:
        return math.ceil(raw)
    p = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * p >= raw:
            return int(m * p)
    return int(10 * p)


@qt_guarded
class TokenAxis(pg.AxisItem):
    """An axis over cells ``0..n-1`` (cell ``i`` spans ``[i, i+1)``) labelled with ``labels``: every n-th cell,
    the step chosen from the room the labels need at the current zoom, so they never overlap."""

    def __init__(self, orientation: str, **kw: object) -> None:
        super().__init__(orientation, **kw)
        self.labels: list[str] = []
        self.step = 1
        self.enableAutoSIPrefix(False)

    def set_labels(self, labels: list[str]) -> None:
        self.labels = list(labels)
        self.picture = None
        self.update()

    def _metrics(self) -> QFontMetrics:
        return QFontMetrics(self.style.get("tickFont") or QApplication.font())

    def label_extent(self) -> int:
        """Pixels one label needs along the axis (with a gap)."""
        fm = self._metrics()
        if self.orientation in ("left", "right"):
            return fm.height() + 2
        widest = max((fm.horizontalAdvance(s) for s in self.labels), default=0)
        return widest + 10

    def tickValues(self, minVal: float, maxVal: float, size: float) -> list[tuple[float, list[float]]]:
        n = len(self.labels)
        minVal, maxVal = min(minVal, maxVal), max(minVal, maxVal)  # an inverted view gives them reversed
        if n == 0 or size <= 0 or maxVal <= minVal:
            return []
        per_cell = size / (maxVal - minVal)
        self.step = nice_step(self.label_extent() / max(per_cell, 1e-9))
        i0 = max(0, math.floor(minVal))
        i1 = min(n, math.ceil(maxVal))
        first = (i0 + self.step - 1) // self.step * self.step
        return [(float(self.step), [i + 0.5 for i in range(first, i1, self.step)])]

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:
        out = []
        for v in values:
            i = math.floor(v)
            out.append(self.labels[i] if 0 <= i < len(self.labels) else "")
        return out


@qt_guarded
class CellText(pg.GraphicsObject):
    """Text in the heatmap's cells (the logit lens's top token), painted in screen pixels for the visible cells only,
    and only once a cell is wide and tall enough to hold a few characters; dark text on bright cells."""

    MIN_W, MIN_H, MAX_CELLS = 30.0, 13.0, 2500

    def __init__(self) -> None:
        super().__init__()
        self.text: Callable[[int, int], str] | None = None
        self.bright: np.ndarray | None = None  # per cell: is the colour light (dark text)?
        self.dims = (0, 0)
        self.painted = 0  # cells given text by the last paint (for tests)
        self._shown: dict[tuple[int, int, int], str] = {}  # (row, col, width) -> the elided text: paints repeat
        self.setZValue(5)

    def set_cells(self, text: Callable[[int, int], str] | None, bright: np.ndarray | None) -> None:
        self.prepareGeometryChange()
        self._shown = {}
        self.text, self.bright = text, bright
        self.dims = bright.shape if bright is not None else (0, 0)
        self.update()

    def boundingRect(self) -> QRectF:
        return QRectF(0, 0, self.dims[1], self.dims[0])

    def visible_cells(self, tr: QTransform, device: QRectF) -> list[tuple[int, int]]:
        """The cells that get text under the item-to-device transform ``tr`` in the ``device`` rectangle: none when a
        cell is too small on screen or too many are visible."""
        rows, cols = self.dims
        if self.text is None or not rows or not cols:
            return []
        d = tr.map(QPointF(1, 1)) - tr.map(QPointF(0, 0))
        if abs(d.x()) < self.MIN_W or abs(d.y()) < self.MIN_H:
            return []
        inv, ok = tr.inverted()
        if not ok:
            return []
        vr = inv.mapRect(device)
        r0, r1 = max(0, math.floor(vr.top())), min(rows, math.ceil(vr.bottom()))
        c0, c1 = max(0, math.floor(vr.left())), min(cols, math.ceil(vr.right()))
        if (r1 - r0) * (c1 - c0) > self.MAX_CELLS:
            return []
        return [(r, c) for r in range(r0, r1) for c in range(c0, c1)]

    def paint(self, p: QPainter, *_args: object) -> None:
        if self.text is None or self.bright is None:
            return
        tr = p.transform()
        cells = self.visible_cells(tr, QRectF(p.viewport()))
        if not cells:
            return
        self.painted = len(cells)
        p.save()
        p.setTransform(QTransform())
        fm = p.fontMetrics()
        light, dark = QColor("#ffffff"), QColor("#111111")
        shown, text, bright = self._shown, self.text, self.bright
        if len(shown) > 4 * self.MAX_CELLS:  # zoomed through many sizes: start again
            shown.clear()
        center = Qt.AlignmentFlag.AlignCenter
        for r, c in cells:
            rect = tr.mapRect(QRectF(c, r, 1, 1)).adjusted(2, 0, -2, 0)
            w = int(rect.width())
            s = shown.get((r, c, w))
            if s is None:
                s = shown[(r, c, w)] = fm.elidedText(text(r, c), Qt.TextElideMode.ElideRight, w)
            p.setPen(dark if bright[r, c] else light)
            p.drawText(rect, center, s)
        p.restore()


@qt_guarded
class CellHeatmap(pg.GraphicsLayoutWidget):
    """A rows × columns heatmap of one value per cell (NaN: a masked cell, drawn hatched), token labels on both
    axes, a colour bar. ``hovered(row, col)`` follows the mouse (-1, -1 off the cells); ``picked(row, col)``
    comes from a left click or from the arrow keys moving the picked cell (Home/End: first/last column)."""

    hovered = Signal(int, int)
    picked = Signal(int, int)

    def __init__(self, name: str, x_title: str, y_title: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName(name)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.left_axis = TokenAxis("left")
        self.bottom_axis = TokenAxis("bottom")
        self.bottom_axis.setStyle(hideOverlappingLabels=False)  # the first and last tokens' labels too
        self.plot = self.addPlot(axisItems={"left": self.left_axis, "bottom": self.bottom_axis})
        self.plot.invertY(True)
        self.plot.setLabel("bottom", x_title)
        self.plot.setLabel("left", y_title)
        self.plot.hideButtons()
        self.hatch = QGraphicsRectItem()
        self.hatch.setPen(QPen(Qt.PenStyle.NoPen))
        self.hatch.setZValue(-10)
        self.plot.addItem(self.hatch)
        self.image = pg.ImageItem(axisOrder="row-major")
        self.plot.addItem(self.image)
        self.colorbar = pg.ColorBarItem(values=(0, 1), colorMap=pg.colormap.get("viridis"), interactive=False,
                                        width=14)
        self.colorbar.setImageItem(self.image, insert_in=self.plot)
        self.marker = QGraphicsRectItem()
        self.marker.setBrush(QBrush(Qt.BrushStyle.NoBrush))
        self.marker.setZValue(10)
        self.marker.hide()
        self.plot.addItem(self.marker)
        self.cell_text = CellText()
        self.plot.addItem(self.cell_text)
        self.data: np.ndarray | None = None
        self.cursor: tuple[int, int] | None = None
        self.plot.scene().sigMouseMoved.connect(self._hover)
        self.plot.scene().sigMouseClicked.connect(self._click)
        self.restyle()
        self.show_axes(False)

    def restyle(self) -> None:
        """Colours that follow the light/dark palette: the hatching of masked cells and the picked-cell frame."""
        m = muted_color()
        m.setAlpha(150)
        self.hatch.setBrush(QBrush(m, Qt.BrushStyle.BDiagPattern))
        self.marker.setPen(pg.mkPen(QColor("#ffffff") if is_dark() else QColor("#d62728"), width=2, cosmetic=True))

    def show_axes(self, on: bool) -> None:
        for side in ("left", "bottom"):
            self.plot.showAxis(side, on)
        self.colorbar.setVisible(on)

    def reset(self) -> None:
        """No data (not ``clear``: GraphicsLayoutWidget forwards that name to its layout)."""
        self.data = None
        self.cursor = None
        self.image.clear()
        self.cell_text.set_cells(None, None)
        self.hatch.setRect(QRectF())
        self.marker.hide()
        self.left_axis.set_labels([])
        self.bottom_axis.set_labels([])
        self.show_axes(False)

    def set_data(self, data: np.ndarray, row_labels: list[str], col_labels: list[str], levels: tuple[float, float],
                 cmap: str = "viridis", bar_ticks: list[tuple[float, str]] | None = None,
                 keep_view: bool = False, cell_text: Callable[[int, int], str] | None = None) -> None:
        """Show ``data`` (rows, cols) float (NaN: masked) with the colour map ``cmap`` over ``levels``;
        ``bar_ticks``: the colour bar's labels (default: its own numbers); ``cell_text(row, col)``: a text drawn in
        each cell once the zoom leaves room for it."""
        rows, cols = data.shape
        old = self.data.shape if self.data is not None else None
        self.data = data
        lo, hi = float(levels[0]), float(levels[1])
        if not hi > lo:
            hi = lo + 1.0
        self.show_axes(True)
        self.left_axis.set_labels(row_labels)
        self.bottom_axis.set_labels(col_labels)
        self.colorbar.setColorMap(pg.colormap.get(cmap))
        self.image.setImage(np.ascontiguousarray(data, dtype=np.float32), autoLevels=False, levels=(lo, hi))
        self.colorbar.setLevels((lo, hi))
        self.colorbar.axis.setTicks([bar_ticks] if bar_ticks else None)
        with np.errstate(invalid="ignore"):
            bright = (np.nan_to_num(data, nan=lo) - lo) / (hi - lo) > 0.6  # viridis: green-yellow from there on
        self.cell_text.set_cells(cell_text, bright)
        rect = QRectF(0, 0, cols, rows)
        self.image.setRect(rect)
        self.hatch.setRect(rect)
        self.plot.setLimits(xMin=0, xMax=cols, yMin=0, yMax=rows)
        if not keep_view or old != data.shape:
            self.plot.setRange(xRange=(0, cols), yRange=(0, rows), padding=0)
        if self.cursor is not None and not (self.cursor[0] < rows and self.cursor[1] < cols):
            self.cursor = None
        self._place_marker()

    def cell_at(self, scene_pos: object) -> tuple[int, int] | None:
        if self.data is None:
            return None
        vb = self.plot.vb
        if not vb.sceneBoundingRect().contains(scene_pos):
            return None
        p = vb.mapSceneToView(scene_pos)
        r, c = math.floor(p.y()), math.floor(p.x())
        rows, cols = self.data.shape
        return (r, c) if 0 <= r < rows and 0 <= c < cols else None

    def _hover(self, scene_pos: object) -> None:
        cell = self.cell_at(scene_pos)
        self.hovered.emit(*(cell or (-1, -1)))

    def _click(self, event: object) -> None:
        if event.button() != Qt.MouseButton.LeftButton:  # type: ignore[attr-defined]  # right: the plot menu
            return
        cell = self.cell_at(event.scenePos())  # type: ignore[attr-defined]
        if cell is not None:
            self.pick(*cell)

    def pick(self, row: int, col: int) -> None:
        """Mark cell (row, col) and announce it."""
        if self.data is None:
            return
        rows, cols = self.data.shape
        row, col = min(max(row, 0), rows - 1), min(max(col, 0), cols - 1)
        self.cursor = (row, col)
        self._place_marker()
        self.picked.emit(row, col)

    def _place_marker(self) -> None:
        if self.cursor is None or self.data is None:
            self.marker.hide()
            return
        r, c = self.cursor
        self.marker.setRect(QRectF(c, r, 1, 1))
        self.marker.show()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if self.data is None:
            super().keyPressEvent(event)
            return
        r, c = self.cursor or (0, 0)
        k = event.key()
        moves = {Qt.Key.Key_Left: (0, -1), Qt.Key.Key_Right: (0, 1), Qt.Key.Key_Up: (-1, 0),
                 Qt.Key.Key_Down: (1, 0)}
        if k in moves and self.cursor is not None:
            dr, dc = moves[k]
            self.pick(r + dr, c + dc)
        elif k in moves or k in (Qt.Key.Key_Return, Qt.Key.Key_Enter, Qt.Key.Key_Space):
            self.pick(r, c)
        elif k == Qt.Key.Key_Home:
            self.pick(r, 0)
        elif k == Qt.Key.Key_End:
            self.pick(r, self.data.shape[1] - 1)
        else:
            super().keyPressEvent(event)
