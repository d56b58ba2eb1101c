"""Light and dark palettes (following the system colour scheme) and the colours every view shares."""

from __future__ import annotations

import os

import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QPainter, QPalette, QPen
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QProxyStyle,
    QStyle,
    QStyleOption,
    QStyleOptionComplex,
    QWidget,
)

from .guard import qt_guarded

#: Sub-block / scale-group colours (index = group % len): distinct hues readable on light and dark.
GROUP_COLORS = (
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7",
    "#9c755f", "#86bcb6", "#d37295", "#a0cbe8", "#8cd17d", "#f1ce63", "#499894", "#fabfd2",
)

#: Field colours of the hex view (by field order within a block).
FIELD_COLORS = ("#e15759", "#f28e2b", "#b07aa1", "#4e79a7", "#59a14f", "#76b7b2", "#edc948", "#9c755f")

OK_COLOR = "#2e9d4f"
BAD_COLOR = "#d64545"
INFO_COLOR = "#6b7a90"

#: The KL-divergence scale of the compared text (upper bounds in nats, as ``quantscope compare`` colours it) and its
#: backgrounds, green to red, with the text colour readable on each (the same on light and dark palettes).
KLD_BINS = (0.001, 0.01, 0.05, 0.1, 0.5, 1.0)
KLD_COLORS = ("#66bd63", "#a6d96a", "#d9ef8b", "#fee08b", "#fdae61", "#f46d43", "#d73027")
KLD_TEXT_COLORS = ("#111111",) * 6 + ("#ffffff",)


def kld_bin(k: float) -> int:
    """The index into :data:`KLD_COLORS` of a KL divergence."""
    return next((i for i, b in enumerate(KLD_BINS) if k < b), len(KLD_BINS))


#: On the dark palette: the outline of check boxes and radio buttons, and the keyboard focus ring.
DARK_INDICATOR_OUTLINE = "#9aa3ad"
DARK_FOCUS_RING = "#6ea8ff"


def group_color(i: int) -> QColor:
    return QColor(GROUP_COLORS[int(i) % len(GROUP_COLORS)])


def field_color(i: int) -> QColor:
    return QColor(FIELD_COLORS[int(i) % len(FIELD_COLORS)])


def _dark_palette() -> QPalette:
    p = QPalette()
    base = QColor(30, 32, 36)
    window = QColor(40, 43, 48)
    text = QColor(222, 225, 230)
    disabled = QColor(120, 124, 130)
    p.setColor(QPalette.ColorRole.Window, window)
    p.setColor(QPalette.ColorRole.WindowText, text)
    p.setColor(QPalette.ColorRole.Base, base)
    p.setColor(QPalette.ColorRole.AlternateBase, QColor(36, 39, 44))
    p.setColor(QPalette.ColorRole.ToolTipBase, QColor(50, 54, 60))
    p.setColor(QPalette.ColorRole.ToolTipText, text)
    p.setColor(QPalette.ColorRole.PlaceholderText, disabled)
    p.setColor(QPalette.ColorRole.Text, text)
    p.setColor(QPalette.ColorRole.Button, QColor(50, 54, 60))
    p.setColor(QPalette.ColorRole.ButtonText, text)
    p.setColor(QPalette.ColorRole.BrightText, QColor(255, 90, 90))
    p.setColor(QPalette.ColorRole.Link, QColor(110, 170, 255))
    p.setColor(QPalette.ColorRole.Highlight, QColor(58, 110, 190))
    p.setColor(QPalette.ColorRole.HighlightedText, QColor(255, 255, 255))
    p.setColor(QPalette.ColorRole.Mid, QColor(70, 74, 80))
    p.setColor(QPalette.ColorRole.Dark, QColor(25, 26, 30))
    p.setColor(QPalette.ColorRole.Light, QColor(70, 74, 82))
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.WindowText, QPalette.ColorRole.ButtonText):
        p.setColor(QPalette.ColorGroup.Disabled, role, disabled)
    return p


def _light_palette() -> QPalette:
    p = QPalette()
    p.setColor(QPalette.ColorRole.Window, QColor(242, 243, 245))
    p.setColor(QPalette.ColorRole.WindowText, QColor(28, 30, 33))
    p.setColor(QPalette.ColorRole.Base, QColor(255, 255, 255))
    p.setColor(QPalette.ColorRole.AlternateBase, QColor(246, 247, 249))
    p.setColor(QPalette.ColorRole.ToolTipBase, QColor(255, 255, 240))
    p.setColor(QPalette.ColorRole.ToolTipText, QColor(28, 30, 33))
    p.setColor(QPalette.ColorRole.Text, QColor(28, 30, 33))
    p.setColor(QPalette.ColorRole.Button, QColor(236, 237, 240))
    p.setColor(QPalette.ColorRole.ButtonText, QColor(28, 30, 33))
    p.setColor(QPalette.ColorRole.Highlight, QColor(48, 110, 200))
    p.setColor(QPalette.ColorRole.HighlightedText, QColor(255, 255, 255))
    p.setColor(QPalette.ColorRole.Link, QColor(30, 90, 200))
    p.setColor(QPalette.ColorRole.PlaceholderText, QColor(140, 144, 150))
    p.setColor(QPalette.ColorRole.Mid, QColor(200, 203, 208))
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.WindowText, QPalette.ColorRole.ButtonText):
        p.setColor(QPalette.ColorGroup.Disabled, role, QColor(150, 154, 160))
    return p


@qt_guarded
class QuantscopeStyle(QProxyStyle):
    """Fusion, plus what Fusion draws too faintly on a dark palette: the outline of check boxes and radio
    buttons (Fusion darkens the window colour for it) and the keyboard focus ring (a dimmed highlight)."""

    _FOCUS_PANELS = (QStyle.PrimitiveElement.PE_PanelButtonCommand, QStyle.PrimitiveElement.PE_PanelLineEdit,
                     QStyle.PrimitiveElement.PE_FrameFocusRect)

    def __init__(self) -> None:
        super().__init__("Fusion")

    def drawPrimitive(self, element: QStyle.PrimitiveElement, option: QStyleOption, painter: QPainter,
                      widget: QWidget | None = None) -> None:
        super().drawPrimitive(element, option, painter, widget)
        if not is_dark():
            return
        PE = QStyle.PrimitiveElement
        if element in (PE.PE_IndicatorCheckBox, PE.PE_IndicatorRadioButton):
            painter.save()
            painter.setRenderHint(QPainter.RenderHint.Antialiasing)
            painter.setPen(QPen(QColor(DARK_INDICATOR_OUTLINE), 1.2))
            painter.setBrush(Qt.BrushStyle.NoBrush)
            r = QRectF(option.rect).adjusted(0.6, 0.6, -0.6, -0.6)
            if element == PE.PE_IndicatorRadioButton:
                painter.drawEllipse(r)
            else:
                painter.drawRoundedRect(r, 2, 2)
            painter.restore()
        elif (element in self._FOCUS_PANELS and self._keyboard_focus(element, option)
              and not isinstance(widget, QAbstractItemView)):  # a view's current cell keeps Fusion's own
            self._ring(painter, option)

    def drawComplexControl(self, control: QStyle.ComplexControl, option: QStyleOptionComplex, painter: QPainter,
                           widget: QWidget | None = None) -> None:
        super().drawComplexControl(control, option, painter, widget)
        CC = QStyle.ComplexControl
        if (is_dark() and control in (CC.CC_ComboBox, CC.CC_SpinBox)
                and option.state & QStyle.StateFlag.State_HasFocus):
            self._ring(painter, option)

    @staticmethod
    def _keyboard_focus(element: QStyle.PrimitiveElement, option: QStyleOption) -> bool:
        if element == QStyle.PrimitiveElement.PE_FrameFocusRect:
            return True  # drawn only for the focused item or widget
        focus = bool(option.state & QStyle.StateFlag.State_HasFocus)
        if element == QStyle.PrimitiveElement.PE_PanelButtonCommand:
            return focus and bool(option.state & QStyle.StateFlag.State_KeyboardFocusChange)
        return focus

    @staticmethod
    def _ring(painter: QPainter, option: QStyleOption) -> None:
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setPen(QPen(QColor(DARK_FOCUS_RING), 2))
        painter.setBrush(Qt.BrushStyle.NoBrush)
        painter.drawRoundedRect(QRectF(option.rect).adjusted(1, 1, -1, -1), 3, 3)
        painter.restore()


def system_is_dark(app: QApplication) -> bool:
    """The scheme to use: ``QUANTSCOPE_THEME`` (dark/light) if set, else the system's colour scheme."""
    forced = os.environ.get("QUANTSCOPE_THEME", "").lower()
    if forced in ("dark", "light"):
        return forced == "dark"
    try:
        return app.styleHints().colorScheme() == Qt.ColorScheme.Dark
    except AttributeError:  # Qt < 6.5
        return app.palette().color(QPalette.ColorRole.Window).lightness() < 128


def apply_theme(app: QApplication, dark: bool | None = None) -> bool:
    """Fusion style with a light or dark palette; pyqtgraph follows. Returns whether dark was applied."""
    if dark is None:
        dark = system_is_dark(app)
    app.setProperty("quantscope_dark", dark)  # before the style: it reads is_dark() when painting
    app.setStyle(QuantscopeStyle())
    pal = _dark_palette() if dark else _light_palette()
    app.setPalette(pal)
    pg.setConfigOptions(
        background=pal.color(QPalette.ColorRole.Base),
        foreground=pal.color(QPalette.ColorRole.Text),
        antialias=True,
    )
    app.setProperty("quantscope_dark", dark)
    app.setStyleSheet(_stylesheet(dark))
    return dark


def is_dark() -> bool:
    app = QApplication.instance()
    return bool(app.property("quantscope_dark")) if app is not None else False


def _stylesheet(dark: bool) -> str:
    card = "#2c3036" if dark else "#ffffff"
    border = "#3a3f46" if dark else "#d9dce1"
    muted = "#9aa3ad" if dark else "#667080"
    return f"""
    QFrame#card {{ background: {card}; border: 1px solid {border}; border-radius: 6px; }}
    QLabel#cardTitle {{ color: {muted}; font-size: 8pt; }}
    QLabel#cardValue {{ font-size: 13pt; font-weight: 600; }}
    QLabel#muted {{ color: {muted}; }}
    QLabel#heading {{ font-size: 10pt; font-weight: 600; }}
    QGroupBox {{ font-weight: 600; border: 1px solid {border}; border-radius: 6px; margin-top: 10px;
                 padding-top: 6px; }}
    QGroupBox::title {{ subcontrol-origin: margin; left: 8px; padding: 0 4px; }}
    """


def muted_color() -> QColor:
    return QColor("#9aa3ad") if is_dark() else QColor("#667080")


def plot_pen_color() -> QColor:
    return QColor("#dee1e6") if is_dark() else QColor("#1c1e21")
