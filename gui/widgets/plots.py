"""pyqtgraph widgets with size hints that suit a dense layout (pyqtgraph's default asks for 640 × 480)."""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import QSize

from ..guard import qt_guarded


@qt_guarded
class CompactPlot(pg.PlotWidget):
    """A PlotWidget that asks for ``hint`` (width, height) and grows from there."""

    def __init__(self, hint: tuple[int, int] = (400, 220), **kwargs: object) -> None:
        super().__init__(**kwargs)
        self._hint = QSize(*hint)

    def sizeHint(self) -> QSize:
        return self._hint
