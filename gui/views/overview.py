"""Overview: what the file is (architecture, file type, size, parameters), its hyperparameters, the tensor-type
mix, the memory it needs for a chosen context, and integrity checks with a background NaN/Inf scale scan."""

from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QResizeEvent
from PySide6.QtWidgets import (
    QComboBox,
    QFrame,
    QGridLayout,
    QGroupBox,
    QLabel,
    QScrollArea,
    QSpinBox,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from quantscope.core.fsutil import printable
from quantscope.core.gguf.checks import integrity_checks, metadata_int
from quantscope.core.model.memory import KV_TYPES, memory_plan, weights_by_layer
from quantscope.core.quant.scales import ScaleScan, scan_scales
from quantscope.core.summary import embedding_summary, human_bytes

from ..document import Document
from ..exports import Exporter
from ..guard import qt_guarded
from ..models import KeyValueModel, plural
from ..theme import BAD_COLOR, INFO_COLOR, OK_COLOR, group_color
from ..widgets.fit import ElidedLabel, fit_columns
from ..widgets.jobstrip import JobStrip
from ..workers import JobSlot, TaskRunner


@qt_guarded
class Card(QFrame):
    """A titled number (its lines elided, whole in the tool tip, when the card is narrow)."""

    def __init__(self, title: str) -> None:
        super().__init__()
        self.setObjectName("card")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(12, 8, 12, 8)
        lay.setSpacing(2)
        self.title = ElidedLabel(title.upper())
        self.title.setObjectName("cardTitle")
        self.value = ElidedLabel("—")
        self.value.setObjectName("cardValue")
        self.value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.sub = ElidedLabel("")
        self.sub.setObjectName("muted")
        lay.addWidget(self.title)
        lay.addWidget(self.value)
        lay.addWidget(self.sub)
        self.setMinimumWidth(120)
        self.setAccessibleName(title)

    def set(self, value: str, sub: str = "") -> None:
        self.value.setText(value)
        self.sub.setText(sub)
        self.setAccessibleDescription(f"{value} {sub}".strip())


def _table(model: KeyValueModel, name: str) -> QTableView:
    v = QTableView()
    v.setModel(model)
    v.setAccessibleName(name)
    v.verticalHeader().setVisible(False)
    v.setSelectionBehavior(QTableView.SelectionBehavior.SelectRows)
    v.setAlternatingRowColors(True)
    v.verticalHeader().setDefaultSectionSize(22)
    v.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
    return v


#: Below these widths the overview reflows: the cards into two rows of three, the three columns into two.
WIDE_CARDS = 1180
WIDE_COLUMNS = 1500


def fit_rows(v: QTableView, max_rows: int = 14) -> None:
    """Make a short table exactly as tall as its rows (no empty space, no scroll bar)."""
    n = min(max_rows, v.model().rowCount())
    v.setFixedHeight(v.horizontalHeader().height() + n * v.verticalHeader().defaultSectionSize() + 4)


@qt_guarded
class OverviewView(QWidget):
    """The first tab."""

    def __init__(self, runner: TaskRunner, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.runner = runner
        self.doc: Document | None = None
        self.scan_result: ScaleScan | None = None
        self.scan_job = JobSlot(runner, self, on_busy=self._scan_busy)

        self.cards = {k: Card(k) for k in ("Architecture", "File type", "Parameters", "Size", "Tensors", "Opened in")}
        self.cards_grid = QGridLayout()

        self.hyper_model = KeyValueModel(headers=("Hyperparameter", "Value"))
        self.hyper_table = _table(self.hyper_model, "Hyperparameters")
        fit_columns(self.hyper_table, stretch=1, min_stretch=60)

        self.types_plot = pg.PlotWidget()
        self.types_plot.setAccessibleName("Tensor type mix: bytes per type")
        self.types_plot.setFixedHeight(190)
        self.types_plot.setMouseEnabled(x=False, y=False)
        self.types_plot.hideButtons()
        self.types_model = KeyValueModel(headers=("Type", "Tensors", "Elements", "Bytes", "Share", "bpw"),
                                         mono_columns=(1, 2, 3, 4, 5))
        self.types_table = _table(self.types_model, "Tensor types")
        fit_columns(self.types_table, stretch=0, optional=(2, 1), min_stretch=50)
        self.layers_plot = pg.PlotWidget()
        self.layers_plot.setAccessibleName("Weights per layer")
        self.layers_plot.setMinimumHeight(120)
        self.layers_plot.setMaximumHeight(200)
        self.layers_plot.setMouseEnabled(x=False, y=False)
        self.layers_plot.hideButtons()
        self.layers_plot.setLabel("left", "MiB")
        self.exporter = Exporter(self, runner)
        self.exporter.install_plot_menu(self.types_plot, "tensor types")
        self.exporter.install_plot_menu(self.layers_plot, "weights per layer")

        self.ctx_spin = QSpinBox()
        self.ctx_spin.setRange(0, 10_000_000)
        self.ctx_spin.setSingleStep(1024)
        self.ctx_spin.setGroupSeparatorShown(True)
        self.ctx_spin.setAccessibleName("Context length for the memory estimate")
        self.ctx_spin.setKeyboardTracking(False)
        self.kv_combo = QComboBox()
        self.kv_combo.addItems(list(KV_TYPES))
        self.kv_combo.setAccessibleName("KV cache type")
        self.kv_combo.setToolTip("The K cache's type (llama.cpp's --cache-type-k), and the V cache's unless set apart")
        self.kv_v_combo = QComboBox()  # llama.cpp's --cache-type-v: "as K" or its own
        self.kv_v_combo.addItem("V as K", "")
        for t in KV_TYPES:
            self.kv_v_combo.addItem(f"V {t}", t)
        self.kv_v_combo.setAccessibleName("V cache type")
        self.mem_weights = QLabel()
        self.mem_kv = QLabel()
        self.mem_total = QLabel()
        self.mem_total.setObjectName("cardValue")
        self.mem_note = QLabel()
        self.mem_note.setObjectName("muted")
        self.mem_note.setWordWrap(True)
        for w, n in ((self.mem_weights, "Weights memory"), (self.mem_kv, "KV cache memory"),
                     (self.mem_total, "Total memory")):
            w.setAccessibleName(n)
            w.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        self.checks_model = KeyValueModel(headers=("Check", "Status", "Detail"), mono_columns=())
        self.checks_table = _table(self.checks_model, "Integrity checks")
        fit_columns(self.checks_table, stretch=2, min_stretch=160)
        self.scan_strip = JobStrip("scale scan", "Scan again", status_text="NaN/Inf scale scan: waiting",
                                   cancel_text="Cancel scan", run_name="Run the scale scan again")
        self.scan_strip.status.setAccessibleName("NaN/Inf scale scan status")
        self.scan_strip.cancel_clicked.connect(lambda: self.scan_job.cancel())
        self.scan_strip.run_clicked.connect(self.start_scan)
        self.scan_label = self.scan_strip.status
        self.scan_progress = self.scan_strip.progress
        self.scan_cancel = self.scan_strip.cancel_btn
        self.scan_again = self.scan_strip.run_btn

        # layout: cards; hyperparameters | tensor types | memory + layers; integrity
        hb = QGroupBox("Hyperparameters")
        hl = QVBoxLayout(hb)
        hl.addWidget(self.hyper_table)
        hl.addStretch(1)
        tb = QGroupBox("Tensor types")
        tl = QVBoxLayout(tb)
        tl.addWidget(self.types_plot, 1)
        tl.addWidget(self.types_table)
        mb = QGroupBox("Memory to run it")
        g = QGridLayout(mb)
        g.addWidget(QLabel("Context"), 0, 0)
        g.addWidget(self.ctx_spin, 0, 1)
        g.addWidget(QLabel("KV cache"), 0, 2)
        g.addWidget(self.kv_combo, 0, 3)
        g.addWidget(self.kv_v_combo, 0, 4)
        g.addWidget(QLabel("Weights"), 1, 0)
        g.addWidget(self.mem_weights, 1, 1, 1, 4)
        g.addWidget(QLabel("KV cache"), 2, 0)
        g.addWidget(self.mem_kv, 2, 1, 1, 4)
        g.addWidget(QLabel("Total"), 3, 0)
        g.addWidget(self.mem_total, 3, 1, 1, 4)
        g.addWidget(self.mem_note, 4, 0, 1, 5)
        g.setColumnStretch(3, 1)
        self.mem_kv.setWordWrap(True)
        self.mem_weights.setWordWrap(True)
        lb = QGroupBox("Weights per layer")
        QVBoxLayout(lb).addWidget(self.layers_plot)
        ib = QGroupBox("Integrity")
        il = QVBoxLayout(ib)
        il.addWidget(self.checks_table)
        il.addWidget(self.scan_strip)
        self.column_boxes = (hb, tb, mb, lb)
        self.columns = QGridLayout()

        body = QWidget()
        bl = QVBoxLayout(body)
        bl.addLayout(self.cards_grid)
        bl.addLayout(self.columns, 0)
        bl.addWidget(ib)
        bl.addStretch(1)  # a tall window: empty space below, not inside the boxes
        self._wide: tuple[bool, bool] | None = None
        self._reflow(WIDE_COLUMNS)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        scroll.setWidget(body)
        # integrity first: a file whose layout is broken says so above everything (the figures below may be off)
        self.banner = QLabel()
        self.banner.setAccessibleName("Integrity warning")
        self.banner.setWordWrap(True)
        self.banner.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.banner.setStyleSheet(f"QLabel {{ background: {BAD_COLOR}; color: white; padding: 6px 10px; "
                                  "font-weight: bold; }")
        self.banner.hide()
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(self.banner)
        outer.addWidget(scroll)

        self.ctx_spin.valueChanged.connect(self.update_memory)
        self.kv_combo.currentIndexChanged.connect(self.update_memory)
        self.kv_v_combo.currentIndexChanged.connect(self.update_memory)
        self._scan_busy(False)

    # ------------------------------------------------------------------ reflow
    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._reflow(event.size().width())

    def _reflow(self, width: int) -> None:
        """Six cards in a row and three columns when wide; two rows of three cards, and the tables above the
        memory and per-layer boxes (two columns), when narrow."""
        wide = (width >= WIDE_CARDS, width >= WIDE_COLUMNS)
        if wide == self._wide:
            return
        self._wide = wide
        per_row = 6 if wide[0] else 3
        for i, c in enumerate(self.cards.values()):
            self.cards_grid.addWidget(c, i // per_row, i % per_row)
        for i in range(6):
            self.cards_grid.setColumnStretch(i, 1 if i < per_row else 0)
        hb, tb, mb, lb = self.column_boxes
        g = self.columns
        for w in self.column_boxes:
            g.removeWidget(w)
        for i in range(3):
            g.setColumnStretch(i, 0)
            g.setRowStretch(i, 0)
        if wide[1]:
            g.addWidget(hb, 0, 0, 2, 1)
            g.addWidget(tb, 0, 1, 2, 1)
            g.addWidget(mb, 0, 2)
            g.addWidget(lb, 1, 2)
            g.setRowStretch(1, 1)
            for i, s in enumerate((4, 5, 5)):
                g.setColumnStretch(i, s)
        else:
            g.addWidget(hb, 0, 0)
            g.addWidget(tb, 0, 1)
            g.addWidget(mb, 1, 0)
            g.addWidget(lb, 1, 1)
            g.setColumnStretch(0, 1)
            g.setColumnStretch(1, 1)

    # ------------------------------------------------------------------ content
    def set_document(self, doc: Document | None) -> None:
        self.scan_job.forget()
        self.doc = doc
        self.scan_result = None
        self.banner.hide()
        if doc is None or doc.gguf is None:
            return
        s = doc.summary
        problems = s.get("integrity") or []
        if problems:
            self.banner.setText("This file is damaged; figures that depend on its layout are not shown. "
                                + " ".join(problems))
            self.banner.show()
        ft = s["file_type"]
        emb = embedding_summary(doc.gguf)
        self.cards["Architecture"].set(s["architecture"] or "(none)", " · ".join(
            [str(s["name"])] * bool(s["name"]) + ([f"embedding model, {emb['pooling']} pooling"] if emb else [])))
        self.cards["File type"].set(ft["name"] or "(not set)",
                                    f"general.file_type = {ft['value']}" if ft["value"] is not None else "")
        bpw = s["bits_per_weight"]
        ex = s.get("experts")
        self.cards["Parameters"].set(
            _count(s["parameters"]) + (f" · {_count(ex['active_parameters'])} active" if ex else ""),
            " · ".join([f"{ex['count']} experts, {ex['used']} per token" if ex else f"{s['parameters']:,}"]
                       + ([f"{bpw:.2f} bits/weight"] if bpw else [])))
        shards = doc.gguf.shards if getattr(doc.gguf, "is_split", False) else []
        self.cards["Size"].set(human_bytes(s["file_size"]), f"{s['file_size']:,} bytes" + (
            f" in {len(shards)} files" if shards else ""))
        # a split model: every file of the set, with its tensors and size
        self.cards["Size"].setToolTip("\n".join(
            f"{sh.path.name if sh.path else '?'}: {sh.n_tensors:,} tensors, {human_bytes(sh.file_size)}"
            for sh in shards))
        self.cards["Tensors"].set(f"{s['tensor_count']:,}", f"{s['kv_count']} metadata keys · GGUF v{s['version']}")
        self.cards["Opened in"].set(f"{doc.open_ms:.0f} ms", "header, metadata and tensor index")
        rows = [(k, _short(v)) for k, v in s["hyperparameters"].items()]
        if emb:  # an embedding model: how its vectors come out (docs/embeddings.md)
            src = f"{emb['pooling_key']} = {emb['pooling_value']}" if emb["pooling_key"] else "no pooling_type key"
            rows = [("pooling", f"{emb['pooling']} ({src})"), ("head", emb["head"])] + [
                r for r in rows if r[0] != "pooling_type"]
        self.hyper_model.set_rows(rows)
        fit_rows(self.hyper_table, 16)
        self._types_chart(s["types"])
        self._layers_chart()
        ctx = metadata_int(s["hyperparameters"].get("context_length"))
        ctx = ctx if ctx is not None and ctx > 0 else 4096
        self.ctx_spin.blockSignals(True)
        self.ctx_spin.setValue(min(ctx, 8192))
        self.ctx_spin.blockSignals(False)
        self.update_memory()
        self._show_checks()
        self.start_scan()

    def _types_chart(self, types: list[dict]) -> None:
        p = self.types_plot
        p.clear()
        rows = [r for r in types if r["bytes"]]
        n = len(rows)
        mib = np.array([r["bytes"] / 2**20 for r in rows], dtype=float)
        y = np.arange(n)
        if n:  # pyqtgraph's bar item fails on zero bars (a vocabulary-only file has no tensors)
            bars = pg.BarGraphItem(x0=np.zeros(n), y=y, height=0.62, width=mib,
                                   brushes=[pg.mkBrush(group_color(i)) for i in range(n)], pens=[None] * n)
            p.addItem(bars)
        ax = p.getAxis("left")
        ax.setTicks([[(i, r["type"]) for i, r in enumerate(rows)]])
        p.getPlotItem().invertY(True)
        p.setLabel("bottom", "MiB")
        top = float(mib.max()) if n else 1.0
        for i, r in enumerate(rows):
            bpw = r["bits_per_weight"]
            label = (f" {human_bytes(r['bytes'])} · {plural(r['tensors'], 'tensor')}"
                     + (f" · {bpw:.2f} bpw" if bpw else ""))
            t = pg.TextItem(label, anchor=(0, 0.5), color=p.getAxis("bottom").textPen().color())
            t.setPos(mib[i], i)
            p.addItem(t)
        p.setXRange(0, top * 1.9, padding=0)
        p.setYRange(-0.6, max(n, 1) - 0.4, padding=0)
        self.types_model.set_rows([
            (r["type"], f"{r['tensors']:,}", f"{r['elements']:,}", human_bytes(r["bytes"]),
             f"{r['share']:.1%}" if r["share"] is not None else "—",
             f"{r['bits_per_weight']:.3f}" if r["bits_per_weight"] else "?")
            for r in types
        ])
        fit_rows(self.types_table, 8)

    def _layers_chart(self) -> None:
        assert self.doc is not None and self.doc.gguf is not None
        p = self.layers_plot
        p.clear()
        rows = weights_by_layer(self.doc.gguf)
        layers = [(g, b) for g, b in rows if g]
        if not layers:
            return
        x = np.array([int(g.split(".")[1]) for g, _ in layers])
        h = np.array([b / 2**20 for _, b in layers])
        p.addItem(pg.BarGraphItem(x=x, height=h, width=0.75, brush=pg.mkBrush(group_color(0))))
        outside = next((b for g, b in rows if not g), 0)
        p.setLabel("bottom", f"layer (outside the layers: {human_bytes(outside)})")
        p.setXRange(-1, int(x.max()) + 1, padding=0)

    def update_memory(self) -> None:
        if self.doc is None or self.doc.gguf is None:
            return
        m = memory_plan(self.doc.gguf, self.ctx_spin.value(), self.kv_combo.currentText(),
                        self.kv_v_combo.currentData() or None)
        k_t, _, v_t = m.kv_type.partition("/")
        rows = (f"({m.key_length} + {m.value_length}) × {k_t}" if not v_t
                else f"({m.key_length} × {k_t} + {m.value_length} × {v_t})")
        self.mem_weights.setText(f"{human_bytes(m.weights_bytes)}  ({m.weights_bytes:,} bytes as stored)")
        self.mem_kv.setText(f"{human_bytes(m.kv_bytes)}  = {plural(m.n_layers, 'layer')} × "
                            f"{plural(m.context, 'token')} × {plural(m.n_kv_heads, 'KV head')} × "
                            f"{rows} "
                            f"({human_bytes(m.kv_bytes_per_token)} per token)"
                            + (f" + {human_bytes(m.state_bytes)} recurrent state of "
                               f"{plural(m.n_recurrent, 'delta-net layer')} (fixed)" if m.n_recurrent else ""))
        self.mem_total.setText(human_bytes(m.total_bytes))
        ex = self.doc.summary.get("experts")
        experts = (f"all {ex['count']} experts of each layer stay in memory; a token reads {ex['used']} of them "
                   f"({human_bytes(ex['active_bytes'])} of weights per token); ") if ex else ""
        self.mem_note.setText(m.note + ("; " if m.note else "") + experts
                              + "compute buffers and the runtime come on top.")
        self.memory = m

    def _show_checks(self) -> None:
        assert self.doc is not None and self.doc.gguf is not None
        checks = integrity_checks(self.doc.gguf)
        rows, colors = [], {}
        for i, c in enumerate(checks):
            status = {True: "✓ ok", False: "✗ failed", None: "ℹ info"}[c.ok]
            colors[i] = QColor({True: OK_COLOR, False: BAD_COLOR, None: INFO_COLOR}[c.ok])
            rows.append((c.name, status, c.detail))
        self.checks = checks
        self.checks_model.set_rows(rows, colors)
        fit_rows(self.checks_table, 12)

    # ------------------------------------------------------------------ scale scan
    def start_scan(self) -> None:
        if self.doc is None or self.doc.gguf is None:
            return
        f = self.doc.gguf
        doc = self.doc
        if doc.remote is not None:  # every block's scales: the whole file
            self.scan_strip.set_can_run(False)
            self.scan_label.setText("NaN/Inf scale scan: not run, it reads every block and this file is on the hub "
                                    "(Download, above, to scan it)")
            return
        self.scan_strip.started("NaN/Inf scale scan: scanning every block's fp16 scales…")

        def work(report, token):  # type: ignore[no-untyped-def]
            return scan_scales(f, progress=lambda d, t: report(d, t), cancel=token)

        def progress(done: int, total: int, _text: str) -> None:
            self.scan_strip.progress_to(done, total)

        self.scan_job.start("scale-scan", work, on_done=lambda r: self._scan_done(doc, r), on_progress=progress,
                          on_failed=lambda m, _tb: self._scan_end(doc, f"NaN/Inf scale scan failed: {m}"),
                          on_cancelled=lambda: self._scan_end(doc, "NaN/Inf scale scan: cancelled"))

    def _scan_busy(self, busy: bool) -> None:
        self.scan_strip.set_can_run(self.doc is not None and self.doc.remote is None)
        self.scan_strip.set_busy(busy)

    def _scan_end(self, doc: Document, text: str) -> None:
        if doc is not self.doc:
            return
        self.scan_label.setText(text)

    def _scan_done(self, doc: Document, r: ScaleScan) -> None:
        if doc is not self.doc:
            return
        self.scan_result = r
        f = doc.gguf
        # a tensor that cannot be read (unknown type, data outside the file) is not scanned: never a clean bill
        damaged = [t.name for t in f.tensors if t.type is None or t.problem] if f is not None else []
        if damaged:
            names = ", ".join(html.escape(printable(n)) for n in damaged[:3]) + (", …" if len(damaged) > 3 else "")
            lost = (f"<span style='color:{BAD_COLOR}'>✗ {names} could not be read: not scanned</span>"
                    if len(damaged) == 1 else
                    f"<span style='color:{BAD_COLOR}'>✗ {len(damaged)} tensors ({names}) could not be read: not "
                    "scanned</span>")
        if r.n_bad:
            first = ", ".join(f"{b.tensor} block {b.block} {b.field}=0x{b.bits:x}" for b in r.bad[:3])
            text = (f"<span style='color:{BAD_COLOR}'>✗ {r.n_bad:,} NaN/Inf scales</span> in "
                    f"{plural(r.blocks_scanned, 'block')} of {plural(r.tensors_scanned, 'tensor')}, e.g. {first}")
        elif damaged:
            text = (f"{lost}; no NaN/Inf scales in the {plural(r.blocks_scanned, 'block')} of the "
                    f"{plural(r.tensors_scanned, 'tensor')} read ({r.seconds:.2f} s)")
        else:
            text = (f"<span style='color:{OK_COLOR}'>✓ no NaN/Inf scales</span> in "
                    f"{plural(r.blocks_scanned, 'block')} of {plural(r.tensors_scanned, 'tensor')} ({r.seconds:.2f} s)")
        if damaged and r.n_bad:
            text += f"; {lost}"
        if r.skipped:
            text += f"; {plural(len(r.skipped), 'tensor')} of types without known scale fields skipped"
        self._scan_end(doc, text)


def _count(n: int) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.1f}{unit}" if unit != "B" else f"{n / div:.2f}B"
    return str(n)


def _short(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.7g}"
    return str(v)
