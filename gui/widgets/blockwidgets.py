"""Painted widgets of the block inspector: the coloured hex dump, the scale bit diagram, the code grid and the
fp16 bit strip. They draw what :mod:`quantscope.core.quant.blocks` and :mod:`quantscope.core.analysis` computed;
hovering emits which byte / scale / element is under the mouse, and ``set_highlight`` shows the linked parts."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import QPoint, QRect, QSize, Qt, Signal
from PySide6.QtGui import QColor, QFont, QFontMetrics, QMouseEvent, QPainter, QPaintEvent, QPen
from PySide6.QtWidgets import QSizePolicy, QToolTip, QWidget

from quantscope.core.analysis import BitOwner, CodeLayout, Fp16Parts
from quantscope.core.quant import BitSource, BlockField

from ..guard import qt_guarded
from ..theme import field_color, group_color, is_dark, muted_color


def mono_font(point: float = 9.0, bold: bool = False) -> QFont:
    f = QFont("DejaVu Sans Mono")
    f.setStyleHint(QFont.StyleHint.Monospace)
    f.setPointSizeF(point)
    f.setBold(bold)
    return f


def _text_color() -> QColor:
    return QColor("#e6e8eb") if is_dark() else QColor("#1c1e21")


def _fill(c: QColor, alpha: int) -> QColor:
    c = QColor(c)
    c.setAlpha(alpha)
    return c


@qt_guarded
class _Painted(QWidget):
    """Common plumbing: mouse tracking, a fixed preferred size, hover bookkeeping."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setMouseTracking(True)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self._size = QSize(200, 40)

    def sizeHint(self) -> QSize:
        return self._size

    def minimumSizeHint(self) -> QSize:
        return self._size

    def _resize_to(self, w: int, h: int) -> None:
        self._size = QSize(w, h)
        self.setMinimumSize(self._size)
        self.updateGeometry()
        self.update()


@qt_guarded
class HexView(_Painted):
    """A block's bytes, 16 per row, each cell tinted with the colour of the field it belongs to."""

    byteHovered = Signal(int)  # block byte offset, -1 when leaving

    CELL_W, CELL_H, LEFT = 24, 20, 134

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.raw = b""
        self.fields: list[BlockField] = []
        self.base = 0
        self.highlight: set[int] = set()
        self.hover = -1
        self.setAccessibleName("Raw block bytes (hex), coloured by field")

    def set_block(self, raw: bytes, fields: Sequence[BlockField], base: int) -> None:
        self.raw, self.fields, self.base = raw, list(fields), base
        self.highlight = set()
        rows = (len(raw) + 15) // 16
        legend_rows = (len(self.fields) + 3) // 4
        self._resize_to(self.LEFT + 16 * self.CELL_W + 8, rows * self.CELL_H + 8 + legend_rows * 20 + 6)

    def set_highlight(self, offsets: set[int]) -> None:
        self.highlight = offsets
        self.update()

    def field_index(self, byte: int) -> int:
        for k, fd in enumerate(self.fields):
            if fd.offset <= byte < fd.offset + fd.size:
                return k
        return -1

    def _cell(self, i: int) -> QRect:
        return QRect(self.LEFT + (i % 16) * self.CELL_W, 4 + (i // 16) * self.CELL_H, self.CELL_W - 2, self.CELL_H - 2)

    def byte_at(self, pos: QPoint) -> int:
        if pos.x() < self.LEFT:
            return -1
        col = (pos.x() - self.LEFT) // self.CELL_W
        row = (pos.y() - 4) // self.CELL_H
        i = row * 16 + col
        return i if 0 <= col < 16 and 0 <= i < len(self.raw) else -1

    def paintEvent(self, event: QPaintEvent) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        font = mono_font(9)
        p.setFont(font)
        text = _text_color()
        muted = muted_color()
        rows = (len(self.raw) + 15) // 16
        for r in range(rows):
            y = 4 + r * self.CELL_H
            p.setPen(muted)
            p.drawText(QRect(4, y, self.LEFT - 8, self.CELL_H - 2), Qt.AlignmentFlag.AlignVCenter,
                       f"+{16 * r:03d} {self.base + 16 * r:>11,}")
        for i, b in enumerate(self.raw):
            rect = self._cell(i)
            k = self.field_index(i)
            color = field_color(k) if k >= 0 else QColor("#888888")
            p.setPen(Qt.PenStyle.NoPen)
            p.setBrush(_fill(color, 230 if i in self.highlight else 70))
            p.drawRoundedRect(rect, 3, 3)
            if i == self.hover:
                p.setPen(QPen(text, 1.5))
                p.setBrush(Qt.BrushStyle.NoBrush)
                p.drawRoundedRect(rect, 3, 3)
            p.setPen(QColor("white") if i in self.highlight else text)
            p.drawText(rect, Qt.AlignmentFlag.AlignCenter, f"{b:02x}")
        # legend
        y = 4 + rows * self.CELL_H + 8
        x = self.LEFT
        p.setFont(mono_font(8.5))
        fm = QFontMetrics(p.font())
        for k, fd in enumerate(self.fields):
            label = f"{fd.name} @{fd.offset} ({fd.size} B)"
            w = fm.horizontalAdvance(label) + 22
            if x + w > self.width() and x > self.LEFT:
                x = self.LEFT
                y += 20
            p.setPen(Qt.PenStyle.NoPen)
            p.setBrush(_fill(field_color(k), 200))
            p.drawRoundedRect(QRect(x, y + 3, 12, 12), 2, 2)
            p.setPen(text)
            p.drawText(QRect(x + 16, y, w, 18), Qt.AlignmentFlag.AlignVCenter, label)
            x += w + 10
        p.end()

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        i = self.byte_at(event.position().toPoint())
        if i != self.hover:
            self.hover = i
            self.update()
            self.byteHovered.emit(i)
        if i >= 0:
            k = self.field_index(i)
            name = self.fields[k].name if k >= 0 else "?"
            QToolTip.showText(event.globalPosition().toPoint(),
                              f"byte +{i} (file offset {self.base + i:,})\n0x{self.raw[i]:02x} = {self.raw[i]} = "
                              f"0b{self.raw[i]:08b}\nfield: {name}", self)

    def leaveEvent(self, event: object) -> None:
        self.hover = -1
        self.update()
        self.byteHovered.emit(-1)


def source_text(sources: Sequence[BitSource]) -> str:
    """``b12[3:0] | b4[7:6]<<4``: where a packed value's bits come from (block byte offsets), as C would write
    the unpacking."""
    parts = []
    for s in sources:
        hi = s.bit_lo + s.n_bits - 1
        part = f"b{s.byte}[{hi}:{s.bit_lo}]" if s.n_bits > 1 else f"b{s.byte}[{s.bit_lo}]"
        if s.value_bit:
            part += f"<<{s.value_bit}"
        parts.append(part)
    return " | ".join(parts)


@qt_guarded
class ScaleBitDiagram(_Painted):
    """The packed scale bytes drawn bit by bit, each bit tinted by the sub-block whose scale (solid) or min
    (outlined) it feeds, beside the unpacked values and where their bits come from."""

    scaleHovered = Signal(str, int)  # name, index ("" / -1 when leaving)

    BIT_W, ROW_H, LEFT = 34, 28, 76
    LABEL_PT = 7.5  # the value.bit label under each bit (``sc1.5``)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.raw = b""
        self.owners: dict[tuple[int, int], BitOwner] = {}
        self.scales: dict[str, list[int]] = {}
        self.sources: dict[str, list[list[BitSource]]] = {}
        self.group_of: dict[str, list[int]] = {}
        self.bytes: list[int] = []
        self.highlight: tuple[str, int] | None = None
        self.highlight_group: int | None = None
        self.hover_bit: tuple[int, int] | None = None
        self._value_rects: list[tuple[QRect, str, int]] = []
        self.VAL_W = 200
        self.setAccessibleName("Scale bytes unpacked bit by bit")

    def set_scales(self, raw: bytes, owners: dict[tuple[int, int], BitOwner], scales: dict[str, list[int]],
                   sources: dict[str, list[list[BitSource]]]) -> None:
        self.raw, self.owners, self.scales, self.sources = raw, owners, scales, sources
        self.bytes = sorted({b for b, _ in owners})
        self.highlight = None
        self.highlight_group = None
        names = list(scales)
        n_vals = max((len(v) for v in scales.values()), default=0)
        fm = QFontMetrics(mono_font(8, bold=True))
        labels = [self.value_label(n, i) for n in names for i in range(len(scales[n]))]
        self.VAL_W = max((fm.horizontalAdvance(x) for x in labels), default=120) + 30
        bits_h = len(self.bytes) * self.ROW_H + 30 if self.bytes else 0
        vals_w = self.VAL_W * len(names)
        vals_h = n_vals * 20 + 30
        left_w = self.LEFT + 8 * self.BIT_W + 16 if self.bytes else 0
        self._resize_to(left_w + vals_w + 10, max(bits_h, vals_h) + 6)

    def set_highlight_group(self, group: int | None) -> None:
        self.highlight_group = group
        self.update()

    def _is_lit(self, owner: BitOwner) -> bool:
        if self.highlight is not None:
            return (owner.name, owner.index) == self.highlight
        return self.highlight_group is not None and owner.index == self.highlight_group

    def _bit_rect(self, row: int, bit: int) -> QRect:
        return QRect(self.LEFT + (7 - bit) * self.BIT_W, 26 + row * self.ROW_H, self.BIT_W - 3, self.ROW_H - 3)

    def paintEvent(self, event: QPaintEvent) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        text, muted = _text_color(), muted_color()
        p.setFont(mono_font(8))
        if self.bytes:
            p.setPen(muted)
            for bit in range(8):
                r = self._bit_rect(0, bit)
                p.drawText(QRect(r.x(), 6, r.width(), 16), Qt.AlignmentFlag.AlignCenter, f"b{bit}")
        for row, byte in enumerate(self.bytes):
            y = 26 + row * self.ROW_H
            v = self.raw[byte] if byte < len(self.raw) else 0
            p.setPen(text)
            p.setFont(mono_font(8.5))
            p.drawText(QRect(4, y, self.LEFT - 6, self.ROW_H - 3), Qt.AlignmentFlag.AlignVCenter,
                       f"b{byte:<3d} 0x{v:02x}")
            for bit in range(8):
                rect = self._bit_rect(row, bit)
                owner = self.owners.get((byte, bit))
                bit_v = (v >> bit) & 1
                if owner is None:
                    p.setPen(QPen(muted, 1, Qt.PenStyle.DotLine))
                    p.setBrush(Qt.BrushStyle.NoBrush)
                    p.drawRoundedRect(rect, 3, 3)
                    p.setPen(muted)
                    p.drawText(rect, Qt.AlignmentFlag.AlignCenter, str(bit_v))
                    continue
                group = self._group(owner)
                color = group_color(group)
                lit = self._is_lit(owner)
                solid = owner.name == self._first_name()
                if solid:
                    p.setPen(QPen(color.darker(130) if lit else Qt.GlobalColor.transparent, 2 if lit else 0))
                    p.setBrush(_fill(color, 255 if lit else 150))
                else:
                    p.setPen(QPen(color, 2.5 if lit else 1.6))
                    p.setBrush(_fill(color, 110 if lit else 28))
                p.drawRoundedRect(rect, 3, 3)
                p.setPen(QColor("white") if solid and lit else text)
                p.setFont(mono_font(9, bold=True))
                p.drawText(rect.adjusted(0, 1, 0, -rect.height() // 2), Qt.AlignmentFlag.AlignCenter, str(bit_v))
                p.setFont(mono_font(self.LABEL_PT))
                p.drawText(rect.adjusted(0, rect.height() // 2 - 2, 0, 0), Qt.AlignmentFlag.AlignCenter,
                           f"{owner.name[:2]}{owner.index}.{owner.value_bit}")
        # unpacked values
        x0 = self.LEFT + 8 * self.BIT_W + 16 if self.bytes else 4
        self._value_rects = []
        for col, (name, values) in enumerate(self.scales.items()):
            x = x0 + col * self.VAL_W
            p.setPen(muted)
            p.setFont(mono_font(8.5, bold=True))
            p.drawText(QRect(x, 4, self.VAL_W - 8, 18), Qt.AlignmentFlag.AlignVCenter, f"{name} (unpacked)")
            for i in range(len(values)):
                y = 26 + i * 20
                rect = QRect(x, y, self.VAL_W - 8, 18)
                self._value_rects.append((rect, name, i))
                group = self.group_of.get(name, list(range(len(values))))[i] if name in self.group_of else i
                color = group_color(group)
                lit = self.highlight == (name, i) or (self.highlight is None and self.highlight_group == group)
                if lit:
                    p.setPen(Qt.PenStyle.NoPen)
                    p.setBrush(_fill(color, 60))
                    p.drawRoundedRect(rect, 3, 3)
                p.setPen(Qt.PenStyle.NoPen)
                p.setBrush(_fill(color, 220))
                p.drawRoundedRect(QRect(x + 2, y + 4, 10, 10), 2, 2)
                p.setPen(text)
                p.setFont(mono_font(8, bold=lit))
                p.drawText(rect.adjusted(16, 0, 0, 0), Qt.AlignmentFlag.AlignVCenter, self.value_label(name, i))
        p.end()

    def value_label(self, name: str, i: int) -> str:
        """``sc[4]=60 ←b12[3:0]|b4[7:6]<<4``."""
        src = ("←" + source_text(self.sources[name][i]).replace(" ", "")) if name in self.sources else ""
        return f"{name}[{i}]={self.scales[name][i]:<3d}{src}"

    def _first_name(self) -> str:
        return next(iter(self.scales), "")

    def _group(self, owner: BitOwner) -> int:
        g = self.group_of.get(owner.name)
        return g[owner.index] if g is not None and owner.index < len(g) else owner.index

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        pos = event.position().toPoint()
        hit: tuple[str, int] | None = None
        for rect, name, i in self._value_rects:
            if rect.contains(pos):
                hit = (name, i)
        if hit is None and self.bytes:
            for row, byte in enumerate(self.bytes):
                for bit in range(8):
                    if self._bit_rect(row, bit).contains(pos):
                        owner = self.owners.get((byte, bit))
                        if owner is not None:
                            hit = (owner.name, owner.index)
                            QToolTip.showText(event.globalPosition().toPoint(),
                                              f"byte {byte} bit {bit} → bit {owner.value_bit} of "
                                              f"{owner.name}[{owner.index}]", self)
        if hit != self.highlight:
            self.highlight = hit
            self.update()
            self.scaleHovered.emit(*(hit or ("", -1)))

    def leaveEvent(self, event: object) -> None:
        if self.highlight is not None:
            self.highlight = None
            self.update()
            self.scaleHovered.emit("", -1)


@qt_guarded
class CodeGrid(_Painted):
    """The code bytes of a block, each split into its code slots (nibbles, 2-bit crumbs or whole bytes),
    tinted by the sub-block of the element stored there and labelled with that element's code."""

    elementHovered = Signal(int)  # -1 when leaving
    elementClicked = Signal(int)

    CELL_H = 17

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.layout_: CodeLayout | None = None
        self.codes: list[int] = []
        self.groups: list[int] = []
        self.highlight = -1
        self.highlight_group: int | None = None
        self.per_row = 16
        self.cell_w = 14
        self.setAccessibleName("Code grid: which element and sub-block each slot of the code bytes holds")

    def set_codes(self, layout: CodeLayout | None, codes: Sequence[int], groups: Sequence[int]) -> None:
        self.layout_ = layout
        self.codes = [int(c) for c in codes]
        self.groups = [int(g) for g in groups]
        self.highlight = -1
        self.highlight_group = None
        if layout is None:
            self._resize_to(10, 10)
            return
        spb = layout.slots_per_byte
        self.per_row = min(16, len(layout.bytes))
        self.cell_w = 30 if spb == 1 else (15 if spb == 2 else 10)
        rows = (len(layout.bytes) + self.per_row - 1) // self.per_row
        self._resize_to(60 + self.per_row * (spb * self.cell_w + 3) + 8, rows * self.CELL_H + 24)

    def set_highlight(self, element: int, group: int | None = None) -> None:
        self.highlight = element
        self.highlight_group = group
        self.update()

    def _slots(self) -> list[tuple[QRect, int]]:
        lay = self.layout_
        if lay is None:
            return []
        spb = lay.slots_per_byte
        out = []
        for k, byte in enumerate(lay.bytes):
            row, col = divmod(k, self.per_row)
            x = 60 + col * (spb * self.cell_w + 3)
            y = 20 + row * self.CELL_H
            for s in range(spb):
                shift = (spb - 1 - s) * lay.slot_bits  # high bits on the left
                e = lay.element_at.get((byte, shift), -1)
                out.append((QRect(x + s * self.cell_w, y, self.cell_w - 1, self.CELL_H - 3), e))
        return out

    def paintEvent(self, event: QPaintEvent) -> None:
        lay = self.layout_
        if lay is None:
            return
        p = QPainter(self)
        text, muted = _text_color(), muted_color()
        spb = lay.slots_per_byte
        p.setFont(mono_font(7.5))
        p.setPen(muted)
        rows = (len(lay.bytes) + self.per_row - 1) // self.per_row
        for r in range(rows):
            first = lay.bytes[r * self.per_row]
            p.drawText(QRect(2, 20 + r * self.CELL_H, 54, self.CELL_H - 3), Qt.AlignmentFlag.AlignVCenter,
                       f"b{first}")
        for c in range(0, self.per_row, 2 if spb == 1 else 4):
            x = 60 + c * (spb * self.cell_w + 3)
            p.drawText(QRect(x, 2, 40, 16), Qt.AlignmentFlag.AlignVCenter, f"+{c}")
        for rect, e in self._slots():
            if e < 0:
                p.setPen(QPen(muted, 1, Qt.PenStyle.DotLine))
                p.setBrush(Qt.BrushStyle.NoBrush)
                p.drawRect(rect)
                continue
            g = self.groups[e]
            lit = e == self.highlight
            dim = self.highlight_group is not None and g != self.highlight_group
            p.setPen(QPen(text, 2) if lit else Qt.PenStyle.NoPen)
            p.setBrush(_fill(group_color(g), 255 if lit else (70 if dim else 170)))
            p.drawRect(rect)
            p.setPen(QColor("white") if lit else text)
            p.setFont(mono_font(7.5 if spb > 1 else 8, bold=lit))
            code = self.codes[e]
            label = f"{code:x}" if spb == 2 and 0 <= code < 16 else str(code)
            p.drawText(rect, Qt.AlignmentFlag.AlignCenter, label)
        p.end()

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        e = self.element_at(event.position().toPoint())
        if e >= 0 and e != self.highlight:
            self.elementHovered.emit(e)

    def element_at(self, pos: QPoint) -> int:
        for rect, e in self._slots():
            if rect.contains(pos) and e >= 0:
                return e
        return -1

    def mousePressEvent(self, event: QMouseEvent) -> None:
        e = self.element_at(event.position().toPoint())
        if e >= 0 and event.button() == Qt.MouseButton.LeftButton:
            self.elementClicked.emit(e)

    def leaveEvent(self, event: object) -> None:
        self.elementHovered.emit(-1)


@qt_guarded
class Fp16Strip(_Painted):
    """One fp16 field: its 16 bits (sign | 5 exponent | 10 mantissa) and the value they encode."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.name = ""
        self.parts: Fp16Parts | None = None
        self.offset = 0
        self._resize_to(16 * 11 + 14, 42)

    def set_value(self, name: str, offset: int, parts: Fp16Parts) -> None:
        self.name, self.offset, self.parts = name, offset, parts
        self.setAccessibleName(f"fp16 field {name}")
        self.setToolTip(f"{name} = {parts.value:.8g} ({parts.kind})")
        self.update()

    def paintEvent(self, event: QPaintEvent) -> None:
        if self.parts is None:
            return
        p = QPainter(self)
        text, muted = _text_color(), muted_color()
        colors = [QColor("#e15759")] + [QColor("#f28e2b")] * 5 + [QColor("#4e79a7")] * 10
        for k in range(16):
            bit = 15 - k
            rect = QRect(2 + k * 11 + (3 if k >= 1 else 0) + (3 if k >= 6 else 0), 2, 10, 18)
            p.setPen(Qt.PenStyle.NoPen)
            p.setBrush(_fill(colors[k], 200 if (self.parts.bits >> bit) & 1 else 50))
            p.drawRoundedRect(rect, 2, 2)
            p.setPen(text)
            p.setFont(mono_font(7))
            p.drawText(rect, Qt.AlignmentFlag.AlignCenter, str((self.parts.bits >> bit) & 1))
        p.setPen(muted)
        p.setFont(mono_font(7))
        p.drawText(QRect(2, 21, 200, 18), Qt.AlignmentFlag.AlignVCenter,
                   f"s={self.parts.sign} e={self.parts.exponent} m={self.parts.mantissa}  ({self.parts.kind})")
        p.end()
