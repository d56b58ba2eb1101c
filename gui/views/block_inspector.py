"""The block inspector: one quantization block of any tensor, decoded field by field.

Raw bytes as coloured hex, fp16 scales as bits, packed 6-bit scales unpacked bit by bit (Q4_K/Q5_K/Q3_K/IQ4_XS),
the code grid showing which sub-block each nibble belongs to, and the dequantized values plotted by sub-block
with the formula evaluated for the hovered element. Everything shown is a field of the core decoder's
:class:`~quantscope.core.quant.DecodedBlock`."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPoint, Qt, Signal
from PySide6.QtGui import (
    QAction,
    QGuiApplication,
    QHideEvent,
    QKeySequence,
    QResizeEvent,
    QShortcut,
    QShowEvent,
)
from PySide6.QtWidgets import (
    QBoxLayout,
    QComboBox,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMenu,
    QScrollArea,
    QSizePolicy,
    QSpinBox,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from quantscope.core.analysis import (
    blocks_per_row,
    code_layout,
    field_at,
    fp16_parts,
    scale_bit_owners,
)
from quantscope.core.gguf import GGUFFile, TensorInfo
from quantscope.core.gguf.checks import INT32_MAX
from quantscope.core.hub import RemoteGGUF
from quantscope.core.quant import DecodedBlock, can_decode, decode_block

from ..document import Document
from ..exports import Exporter
from ..guard import qt_guarded
from ..models import KeyValueModel
from ..theme import group_color, muted_color
from ..widgets.blockwidgets import CodeGrid, Fp16Strip, HexView, ScaleBitDiagram, mono_font
from ..widgets.plots import CompactPlot
from ..workers import JobSlot, TaskRunner


@qt_guarded
class FieldModel(KeyValueModel):
    """Fields of a decoded block: name, offset, size, kind, value, description."""

    def __init__(self) -> None:
        super().__init__(headers=("Field", "Offset", "Bytes", "Kind", "Value", "Meaning"), mono_columns=(1, 2, 4))


def _field_value_text(v: object) -> str:
    if isinstance(v, dict) and "bits" in v:
        return f"0x{v['bits']:04x} = {v['float']:.8g}"
    if isinstance(v, list):
        head = " ".join(str(x) for x in v[:12])
        return head + (" …" if len(v) > 12 else "")
    if isinstance(v, int):
        return f"0x{v:08x}"
    if isinstance(v, float):
        return f"{v:.8g}"
    return str(v)


@qt_guarded
class BlockInspectorView(QWidget):
    """Pick a tensor, row and block; see inside it."""

    blockShown = Signal(str, int, int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.file: GGUFFile | None = None
        self.tensor: TensorInfo | None = None
        #: Asked before a block's bytes are read from the mapping (the window answers False once the file changed).
        self.may_read: Callable[[], bool] | None = None
        self.decoded: DecodedBlock | None = None
        self.file_offset = 0
        self.element = -1  # selected (Element box, click); kept while the mouse hovers others
        self.hovered = -1  # under the mouse in the plot or the code grid, or -1
        self._updating = False
        self.fetch_job: JobSlot | None = None  # a remote file's blocks are read in it (see use_runner)
        self._fetch_waiting = False  # a remote block to fetch once the view is shown

        top = self._build_location()
        raw_box, fields_box = self._build_block_boxes()
        self._build_columns(raw_box, self._build_values_box(), fields_box)

        body = QWidget()
        body_lay = QVBoxLayout(body)
        body_lay.addLayout(top)
        body_lay.addWidget(self.info)
        body_lay.addWidget(self.message)
        body_lay.addLayout(self.columns, 1)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(body)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(scroll)

        self.tensor_combo.currentIndexChanged.connect(self._tensor_changed)
        self.row_spin.valueChanged.connect(self._location_changed)
        self.block_spin.valueChanged.connect(self._location_changed)
        self.elem_spin.valueChanged.connect(lambda v: self.set_element(v))
        self.codes.elementHovered.connect(self.preview_element)
        self.codes.elementClicked.connect(self.set_element)
        self.scales.scaleHovered.connect(self._scale_hovered)
        self._install_keys()
        # right click anywhere on the block (bytes, fields, scales, codes) or on its plot: copy and export
        self.exporter = Exporter(self)
        self.exporter.install_plot_menu(self.plot, "block values", self.block_actions)
        body.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        body.customContextMenuRequested.connect(lambda pos: self._block_menu(body.mapToGlobal(pos)))

    # ------------------------------------------------------------------ construction
    def _build_location(self) -> QHBoxLayout:
        """Tensor, Row, Block and Element (the row returned); the location line and the message under it."""
        self.tensor_combo = QComboBox()
        self.tensor_combo.setAccessibleName("Tensor to inspect")
        self.tensor_combo.setMinimumContentsLength(28)
        self.tensor_combo.setMaximumWidth(460)
        self.tensor_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.row_spin = QSpinBox()
        self.row_spin.setAccessibleName("Row")
        self.block_spin = QSpinBox()
        self.block_spin.setAccessibleName("Block within the row")
        self.elem_spin = QSpinBox()
        self.elem_spin.setAccessibleName("Element within the block")
        for s in (self.row_spin, self.block_spin, self.elem_spin):
            s.setKeyboardTracking(False)
            s.setMinimumWidth(90)
        self.info = QLabel()
        self.info.setObjectName("muted")
        self.info.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.info.setAccessibleName("Block location")
        self.info.setWordWrap(True)
        self.message = QLabel()
        self.message.setWordWrap(True)
        self.message.setAccessibleName("Inspector message")

        top = QHBoxLayout()
        for label, w in (("Tensor", self.tensor_combo), ("Row", self.row_spin), ("Block", self.block_spin),
                         ("Element", self.elem_spin)):
            lab = QLabel(label)
            lab.setBuddy(w)
            top.addWidget(lab)
            top.addWidget(w, 3 if w is self.tensor_combo else 0)
        top.addStretch(1)
        return top

    def _build_block_boxes(self) -> tuple[QGroupBox, QGroupBox]:
        """The raw bytes (hex and fp16 values) and the fields (returned), the scales and the codes (kept)."""
        self.hex = HexView()
        self.fields_model = FieldModel()
        self.fields_table = QTableView()
        self.fields_table.setModel(self.fields_model)
        self.fields_table.setAccessibleName("Block fields")
        self.fields_table.verticalHeader().setVisible(False)
        self.fields_table.horizontalHeader().setStretchLastSection(True)
        self.fields_table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.fields_table.horizontalHeader().setSectionResizeMode(5, QHeaderView.ResizeMode.Stretch)
        self.fields_table.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Expanding)
        self.fields_table.setMinimumHeight(70)
        # a width of its own: a type with no scales or codes panel (F32, TQ1_0, ...) would otherwise leave the
        # right column a sliver beside the bytes instead of reflowing below them
        self.fields_table.setMinimumWidth(self.fields_table.fontMetrics().averageCharWidth() * 80)
        self.fields_table.setWordWrap(True)
        self.fp16_box = QWidget()
        self.fp16_layout = QGridLayout(self.fp16_box)
        self.fp16_layout.setContentsMargins(0, 0, 0, 0)
        self.scales = ScaleBitDiagram()
        self.scales_note = QLabel()
        self.scales_note.setObjectName("muted")
        self.scales_note.setWordWrap(True)
        self.codes = CodeGrid()
        self.codes_note = QLabel()
        self.codes_note.setObjectName("muted")
        self.codes_note.setWordWrap(True)

        raw_box = QGroupBox("Raw bytes")
        lay = QVBoxLayout(raw_box)
        lay.addWidget(self.hex)
        lay.addWidget(self.fp16_box)
        fields_box = QGroupBox("Fields")
        lay = QVBoxLayout(fields_box)
        lay.addWidget(self.fields_table)
        self.scales_box = QGroupBox("Scales")
        lay = QVBoxLayout(self.scales_box)
        lay.addWidget(self.scales)
        lay.addWidget(self.scales_note)
        self.codes_box = QGroupBox("Codes")
        lay = QVBoxLayout(self.codes_box)
        lay.addWidget(self.codes)
        lay.addWidget(self.codes_note)
        return raw_box, fields_box

    def _build_values_box(self) -> QGroupBox:
        """The formula, the selected element's dequantization and the plot of the block's values."""
        self.formula = QLabel()
        self.formula.setFont(mono_font(10, bold=True))
        self.formula.setAccessibleName("Dequantization formula")
        self.plot = CompactPlot((500, 220))
        self.plot.setAccessibleName("Dequantized values of the block, coloured by sub-block")
        self.plot.setMinimumHeight(200)
        self.plot.showGrid(x=True, y=True, alpha=0.25)
        self.plot.setLabel("bottom", "element")
        self.plot.setLabel("left", "value")
        self.plot.setMouseEnabled(x=True, y=False)
        self.plot.getAxis("left").enableAutoSIPrefix(False)
        self.bars: pg.BarGraphItem | None = None
        self.marker = pg.ScatterPlotItem(size=11, pen=pg.mkPen("w", width=1.5), brush=pg.mkBrush("#e15759"))
        self.hover_marker = pg.ScatterPlotItem(size=13, pen=pg.mkPen(muted_color(), width=2), brush=None)
        self.vline = pg.InfiniteLine(angle=90, movable=False, pen=pg.mkPen(muted_color(), style=Qt.PenStyle.DashLine))
        self.plot.addItem(self.vline)
        self.plot.addItem(self.marker)
        self.plot.addItem(self.hover_marker)
        self.plot.scene().sigMouseMoved.connect(self._plot_hover)
        self.plot.scene().sigMouseClicked.connect(self._plot_click)
        self.explain = QLabel()
        self.explain.setFont(mono_font(10.5, bold=True))
        self.explain.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.explain.setAccessibleName("Dequantization of the selected or hovered element")
        self.explain.setWordWrap(True)
        self.explain_detail = QLabel()
        self.explain_detail.setObjectName("muted")
        self.explain_detail.setAccessibleName("Where the element's bits live")
        self.explain_detail.setWordWrap(True)
        values_box = QGroupBox("Dequantized values")
        lay = QVBoxLayout(values_box)
        lay.addWidget(self.formula)
        lay.addWidget(self.explain)
        lay.addWidget(self.explain_detail)
        lay.addWidget(self.plot, 1)
        return values_box

    def _build_columns(self, raw_box: QGroupBox, values_box: QGroupBox, fields_box: QGroupBox) -> None:
        """Bytes and values on the left, scales, codes and fields on the right (one column when narrow)."""
        left = QVBoxLayout()
        left.addWidget(raw_box)
        left.addWidget(values_box, 1)
        right = QVBoxLayout()
        right.addWidget(self.scales_box)
        right.addWidget(self.codes_box)
        right.addWidget(fields_box, 1)
        self.columns = QBoxLayout(QBoxLayout.Direction.LeftToRight)  # one column when both do not fit (reflow)
        self.columns.addLayout(left, 1)
        self.columns.addLayout(right, 0)
        self._left, self._right = left, right

    def block_actions(self) -> list[QAction]:
        """Copy values, copy the bytes as hex, export the block as CSV or JSON (disabled without a block)."""
        b, t = self.decoded, self.tensor
        out = []
        for text, fn in (("Copy values", self.copy_values), ("Copy bytes as hex", self.copy_hex),
                         ("Export block as CSV…", lambda: self.export_block("csv")),
                         ("Export block as JSON…", lambda: self.export_block("json"))):
            a = QAction(text, self)
            a.triggered.connect(fn)
            a.setEnabled(b is not None and t is not None)
            out.append(a)
        return out

    def _block_menu(self, where: QPoint) -> None:
        menu = QMenu(self)
        menu.setAccessibleName("Block actions")
        for a in self.block_actions():
            a.setParent(menu)
            menu.addAction(a)
        self.context_menu = menu
        menu.popup(where)

    def copy_values(self) -> None:
        """The block's dequantized values, one per line (as float32 prints them)."""
        if self.decoded is not None:
            QGuiApplication.clipboard().setText("\n".join(repr(float(v)) for v in self.values))

    def copy_hex(self) -> None:
        if self.decoded is not None:
            QGuiApplication.clipboard().setText(bytes(self.decoded.raw).hex(" "))

    def export_block(self, fmt: str, path: str | None = None) -> object:
        """The shown block, decoded, as CSV or JSON (asks where unless ``path``)."""
        if self.file is None or self.tensor is None or self.decoded is None:
            return None
        return self.exporter.block(self.file, self.tensor.name, self.row_spin.value(), self.block_spin.value(),
                                   fmt=fmt, path=path)

    #: Keys of this view (also listed by F1): keys, what they do, and the step they take.
    KEYS = (("Ctrl+Left", "previous element", "element", -1), ("Ctrl+Right", "next element", "element", 1),
            ("Ctrl+Up", "previous block of the row", "block", -1), ("Ctrl+Down", "next block of the row", "block", 1),
            ("Alt+Up", "previous row", "row", -1), ("Alt+Down", "next row", "row", 1))

    def key_help(self) -> list[tuple[str, str]]:
        """(keys, what they do) of this view's shortcuts, for the F1 list."""
        return [(QKeySequence(k).toString(QKeySequence.SequenceFormat.NativeText), what)
                for k, what, _, _ in self.KEYS]

    def _install_keys(self) -> None:
        """Window-wide while this view is shown (whatever has the focus, the tab bar included), off while hidden."""
        self.shortcuts: list[QShortcut] = []
        for keys, what, target, step in self.KEYS:
            sc = QShortcut(QKeySequence(keys), self)
            sc.setContext(Qt.ShortcutContext.WindowShortcut)
            sc.setWhatsThis(what)
            sc.setEnabled(False)
            sc.activated.connect(lambda t=target, d=step: self.step(t, d))
            self.shortcuts.append(sc)

    def step(self, target: str, delta: int) -> None:
        """Move the selected element, block or row by ``delta`` (clamped to the tensor)."""
        spin = {"element": self.elem_spin, "block": self.block_spin, "row": self.row_spin}[target]
        spin.setValue(max(spin.minimum(), min(spin.maximum(), spin.value() + delta)))

    # ------------------------------------------------------------------ reflow
    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._reflow()

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        for sc in self.shortcuts:
            sc.setEnabled(True)
        self._reflow()
        if self._fetch_waiting:  # a remote file's block is read when it is shown, not when the file opens
            self._fetch_waiting = False
            self._decode()

    def use_runner(self, runner: TaskRunner) -> None:
        """Where a remote file's blocks are fetched (one at a time: a newer block replaces a pending one)."""
        self.fetch_job = JobSlot(runner, self)

    def hideEvent(self, event: QHideEvent) -> None:
        super().hideEvent(event)
        for sc in self.shortcuts:
            sc.setEnabled(False)

    def _reflow(self) -> None:
        """Raw bytes and values beside scales, codes and fields when both columns fit; one column otherwise."""
        self._left.invalidate()  # the painted widgets' sizes changed with the block: no cached minimum
        self._right.invalidate()
        need = self._left.minimumSize().width() + self._right.minimumSize().width() + 60
        direction = QBoxLayout.Direction.LeftToRight if self.width() >= need else QBoxLayout.Direction.TopToBottom
        if self.columns.direction() != direction:
            self.columns.setDirection(direction)
            self.columns.setStretch(1, 1 if direction == QBoxLayout.Direction.TopToBottom else 0)

    # ------------------------------------------------------------------ document
    def set_document(self, doc: Document | None) -> None:
        """The :class:`~quantscope.gui.views.registry.View` contract: the GGUF file of ``doc`` (None: none)."""
        self.set_file(doc.gguf if doc is not None else None)

    def set_file(self, f: GGUFFile | None) -> None:
        self.file = f
        self._fetch_waiting = False
        if self.fetch_job is not None:
            self.fetch_job.forget()
        self._updating = True
        self.tensor_combo.clear()
        if f is not None:
            ordered = sorted(f.tensors, key=lambda t: (not (t.type is not None and t.type.is_quantized), 0))
            for t in ordered:
                self.tensor_combo.addItem(f"{t.name}   [{t.type_name}]", t.name)
        self._updating = False
        self.decoded = None
        if f is not None and self.tensor_combo.count():
            default = self.default_tensor(f)
            self.show_block(default, 0, 0)

    @staticmethod
    def default_tensor(f: GGUFFile) -> str:
        """The first Q4_K tensor (the signature view), else the first decodable quantized one."""
        for want in ("Q4_K", None):
            for t in f.tensors:
                if t.type is not None and t.type.is_quantized and can_decode(t.type) and not t.problem \
                        and (want is None or t.type.name == want):
                    return t.name
        return f.tensors[0].name if f.tensors else ""

    def show_block(self, tensor: str, row: int, block: int, element: int | None = None) -> None:
        """Show block ``block`` of row ``row`` of ``tensor`` (and highlight ``element``)."""
        i = self.tensor_combo.findData(tensor)
        if i < 0:
            return
        self._updating = True
        self.tensor_combo.setCurrentIndex(i)
        self.tensor_combo.setToolTip(self.tensor_combo.currentText())
        self._configure_spins()
        self.row_spin.setValue(row)
        self.block_spin.setValue(block)
        self._updating = False
        self._decode()
        if element is not None:
            self.set_element(element)

    def _configure_spins(self) -> None:
        f = self.file
        name = self.tensor_combo.currentData()
        if f is None or name is None:
            return
        t = f.tensor(name)
        self.tensor = t
        self.row_spin.setRange(0, min(INT32_MAX, max(0, t.n_rows - 1)))  # a spin box holds 32 bits
        self.block_spin.setRange(0, min(INT32_MAX, max(0, blocks_per_row(t) - 1)))
        self.elem_spin.setRange(0, max(0, (t.type.block_elems if t.type else 1) - 1))

    def _tensor_changed(self) -> None:
        self.tensor_combo.setToolTip(self.tensor_combo.currentText())
        if self._updating:
            return
        self._updating = True
        self._configure_spins()
        self.row_spin.setValue(0)
        self.block_spin.setValue(0)
        self._updating = False
        self._decode()

    def _location_changed(self) -> None:
        if not self._updating:
            self._decode()

    # ------------------------------------------------------------------ decoding
    def _decode(self) -> None:
        f, t = self.file, self.tensor
        if f is None or t is None:
            return
        if self.may_read is not None and not self.may_read():
            return
        row, block = self.row_spin.value(), self.block_spin.value()
        self.decoded = None
        if t.type is None or t.problem:
            self._show_message(f"{t.name} cannot be decoded: {t.problem or t.type_name}. Its bytes are not shown "
                               "because their extent is unknown.")
            return
        if t.n_rows == 0 or blocks_per_row(t) == 0:
            self._show_message(f"{t.name} has no blocks: its shape ne = {list(t.ne)} has a zero dimension or "
                               f"rows shorter than one {t.type.name} block.")
            return
        self.file_offset, size = f.block_location(t, row, block)
        if isinstance(f, RemoteGGUF) and not f.has_block(t, row, block):
            self._fetch(f, t, row, block, size)
            return
        raw = f.block_bytes(t, row, block)
        self.info.setText(f"{t.type.name} · {size} bytes / {t.type.block_elems} elements · file offset "
                          f"{self.file_offset:,} · row {row:,} of {t.n_rows:,} · block {block:,} of "
                          f"{blocks_per_row(t):,}")
        if not can_decode(t.type):
            self._show_message(f"No field decoder for {t.type.name} yet: the raw bytes are shown undivided.",
                               keep_info=True)
            from quantscope.core.quant import BlockField

            self.hex.set_block(raw, [BlockField("raw", 0, len(raw), "u8[]", list(raw), "undecoded")],
                               self.file_offset)
            return
        b = decode_block(t.type, raw)
        self.decoded = b
        self.message.hide()
        self._populate(b)
        self._reflow()
        self.blockShown.emit(t.name, row, block)

    def _fetch(self, f: RemoteGGUF, t: TensorInfo, row: int, block: int, size: int) -> None:
        """A remote file's block not read yet: one ranged read of its ``size`` bytes in a worker (only while this
        view is shown), then the block is decoded from the file's cache."""
        where = f"block {block:,} of row {row:,} of {t.name}"
        if not self.isVisible() or self.fetch_job is None:
            self._fetch_waiting = True
            self._show_message(f"{where} is read from the hub when this view is shown.")
            return
        self._show_message(f"Reading {where} from the hub ({size} bytes at offset {self.file_offset:,})…")

        def fetched(_raw: bytes) -> None:
            if self.file is f:
                self._decode()  # from the cache (the location shown now: another fetch if it moved meanwhile)

        self.fetch_job.start("block-fetch", lambda _r, _t: f.block_bytes(t, row, block), on_done=fetched,
                             on_failed=lambda m, _tb: self._show_message(f"{where} could not be read from the hub: "
                                                                         f"{m}"))

    def _show_message(self, text: str, keep_info: bool = False) -> None:
        """``text`` in place of the block: nothing of the block shown before stays (its location header, fields,
        fp16 bits, scales, codes, plot and markers). ``keep_info``: the header was set for this block."""
        self.message.setText(text)
        self.message.show()
        if not keep_info:
            self.info.setText("")
        self.formula.setText("")
        self.fields_model.set_rows([])
        self.hex.set_block(b"", [], 0)
        self._clear_fp16()
        self.scales_box.hide()
        self.codes_box.hide()
        if self.bars is not None:
            self.plot.removeItem(self.bars)
            self.bars = None
        self.marker.setData([], [])
        self.hover_marker.setData([], [])
        self.vline.hide()
        self.explain.setText("")
        self.explain_detail.setText("")

    def _clear_fp16(self) -> None:
        while self.fp16_layout.count():
            item = self.fp16_layout.takeAt(0)
            if item is not None and item.widget() is not None:
                item.widget().hide()  # gone from this paint on; deleted when the loop next runs
                item.widget().deleteLater()

    def _populate(self, b: DecodedBlock) -> None:
        self.formula.setText(b.formula)
        self.hex.set_block(b.raw, b.fields, self.file_offset)
        self.fields_model.set_rows([
            (fd.name, str(fd.offset), str(fd.size), fd.kind, _field_value_text(fd.value), fd.description)
            for fd in b.fields
        ])
        self.fields_table.resizeRowsToContents()
        # fp16 fields as bits
        self._clear_fp16()
        col = 0
        for fd in b.fields:
            if fd.kind == "fp16":
                parts = fp16_parts(fd.value["bits"])
                name = QLabel(f"<b>{fd.name}</b> @{fd.offset}<br>fp16 0x{parts.bits:04x}<br>= {parts.value:.8g}")
                name.setFont(mono_font(8.5))
                strip = Fp16Strip()
                strip.set_value(fd.name, fd.offset, parts)
                self.fp16_layout.addWidget(name, 0, col)
                self.fp16_layout.addWidget(strip, 0, col + 1)
                col += 2
        self.fp16_layout.setColumnStretch(col, 1)
        # scales
        if b.scales:
            self.scales_box.show()
            self.scales.set_scales(b.raw, scale_bit_owners(b), b.scales, b.scale_sources)
            n_groups = int(b.group.max()) + 1
            if b.scale_sources:
                names = " and ".join(f"{len(v)} {k}" for k, v in b.scales.items())
                self.scales_note.setText(
                    f"{names} for {n_groups} sub-blocks of {b.group_size}: a bit's colour is its sub-block (solid "
                    f"= {next(iter(b.scales))}, outlined = {', '.join(list(b.scales)[1:]) or '-'}); label = value.bit")
            else:
                self.scales_note.setText(f"{n_groups} sub-blocks of {b.group_size} elements, one scale each "
                                         "(stored whole, no bit packing).")
        else:
            self.scales_box.hide()
        # code grid
        lay = code_layout(b)
        if lay is not None:
            self.codes_box.show()
            self.codes.set_codes(lay, b.raw_code, b.group)
            fields = sorted({field_at(b, x) for x in lay.bytes})
            per_slot = len(b.values) // max(1, len(lay.bytes) * lay.slots_per_byte)
            if per_slot > 1:  # a code-book type: one byte selects a whole row of the grid
                self.codes_note.setText(
                    f"{len(lay.bytes)} bytes of {', '.join(fields)}, one per code-book row of {per_slot} elements: "
                    "the low 8 bits of the row's grid index (the fields list says where its other bits and the "
                    "signs are), coloured by its sub-block")
            else:
                self.codes_note.setText(
                    f"{len(lay.bytes)} bytes of {', '.join(fields)}, {lay.slots_per_byte} × {lay.slot_bits}-bit slots "
                    f"per byte (high bits left): the element's {b.code_bits}-bit code, coloured by its sub-block")
        else:
            self.codes_box.hide()
        # values
        if self.bars is not None:
            self.plot.removeItem(self.bars)
        n = len(b.values)
        brushes = [pg.mkBrush(group_color(int(g))) for g in b.group]
        heights = np.where(np.isfinite(b.values), b.values, 0.0)
        self.bars = pg.BarGraphItem(x=np.arange(n), height=heights, width=0.8, brushes=brushes, pens=[None] * n)
        self.plot.addItem(self.bars)
        self.plot.setXRange(-1, n, padding=0)
        self.plot.enableAutoRange(axis="y")
        self.set_element(self.element if 0 <= self.element < n else 0)

    @property
    def values(self) -> np.ndarray:
        """The plotted values (the core decoder's ``DecodedBlock.values``)."""
        return self.decoded.values if self.decoded is not None else np.empty(0, np.float32)

    # ------------------------------------------------------------------ linking
    def set_element(self, i: int) -> None:
        """Select element ``i`` (the Element box, a click on the plot or the code grid): it stays selected while
        the mouse hovers others."""
        b = self.decoded
        if b is None or not 0 <= i < len(b.values):
            return
        self.element = i
        self.hovered = -1
        self.hover_marker.setData([], [])
        if self.elem_spin.value() != i:
            self.elem_spin.blockSignals(True)
            self.elem_spin.setValue(i)
            self.elem_spin.blockSignals(False)
        v = float(b.values[i])
        self.marker.setData([i], [v if np.isfinite(v) else 0.0])
        self._show_element(i)

    def preview_element(self, i: int) -> None:
        """Show the formula and the bits of hovered element ``i`` without changing the selection; ``-1`` (the
        mouse left) shows the selected element again."""
        b = self.decoded
        if b is None:
            return
        if not 0 <= i < len(b.values) or i == self.element:
            if self.hovered != -1:
                self.hovered = -1
                self.hover_marker.setData([], [])
                if 0 <= self.element < len(b.values):
                    self._show_element(self.element)
            return
        if i == self.hovered:
            return
        self.hovered = i
        v = float(b.values[i])
        self.hover_marker.setData([i], [v if np.isfinite(v) else 0.0])
        self._show_element(i)

    def _show_element(self, i: int) -> None:
        b = self.decoded
        assert b is not None
        g = int(b.group[i])
        self.explain.setText(b.explain(i))
        byte, shift = int(b.code_byte[i]), int(b.code_shift[i])
        where = (f"code {int(b.raw_code[i])} in byte +{byte} ({field_at(b, byte)}) bits {shift}+ · "
                 if b.code_bits else "")
        state = (f"hovered element {i} (selected: {self.element}; click to select)" if i != self.element
                 else f"element {i}")
        self.explain_detail.setText(f"{state} · {where}sub-block {g} (elements {g * b.group_size}–"
                                    f"{(g + 1) * b.group_size - 1}) · absolute offset of the block "
                                    f"{self.file_offset:,}")
        self.codes.set_highlight(i, g)
        self.scales.set_highlight_group(g)
        lit = {byte} if b.code_bits else set()
        for (sbyte, _bit), owner in scale_bit_owners(b).items():
            if owner.index == g:
                lit.add(sbyte)
        self.hex.set_highlight(lit)
        self.vline.setValue(i)
        self.vline.show()

    def _scale_hovered(self, name: str, index: int) -> None:
        b = self.decoded
        if b is None:
            return
        if index < 0:
            shown = self.hovered if self.hovered >= 0 else self.element
            if 0 <= shown < len(b.values):
                self._show_element(shown)
            return
        self.codes.set_highlight(-1, index)
        lit = {sb for (sb, _), o in scale_bit_owners(b).items() if (o.name, o.index) == (name, index)}
        self.hex.set_highlight(lit)

    def _plot_element(self, pos: object) -> int:
        """The element under scene position ``pos`` in the values plot, or -1."""
        b = self.decoded
        if b is None or self.bars is None:
            return -1
        vb = self.plot.getPlotItem().vb
        if not vb.sceneBoundingRect().contains(pos):
            return -1
        i = round(vb.mapSceneToView(pos).x())
        return i if 0 <= i < len(b.values) else -1

    def _plot_hover(self, pos: object) -> None:
        self.preview_element(self._plot_element(pos))

    def _plot_click(self, event: object) -> None:
        if event.button() != Qt.MouseButton.LeftButton:  # type: ignore[attr-defined]  # right: the plot menu
            return
        i = self._plot_element(event.scenePos())  # type: ignore[attr-defined]
        if i >= 0:
            self.set_element(i)
