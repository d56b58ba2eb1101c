"""The "Quantize…" dialog: llama-quantize's presets and options, a per-tensor plan with overrides and the size it
will have, then a background quantization with progress, cancel and "Open the result" (docs/quantize.md)."""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QTableWidget,
    QTableWidgetItem,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from quantscope.core.bump import Cancelled
from quantscope.core.fsutil import OutputSet, PathRefused, printable
from quantscope.core.gguf import GGUFFile
from quantscope.core.jobs import RateMeter, format_duration
from quantscope.core.quant.imatrix import Imatrix, ImatrixError, read_imatrix
from quantscope.core.quant.mixture import PRESETS
from quantscope.core.quant.quantize import (
    QuantizeCancelled,
    QuantizeError,
    QuantizeOptions,
    QuantizePlan,
    QuantizeProgress,
    plan_quantize,
    quantize_file,
    supported_types,
)
from quantscope.core.summary import human_bytes

from ..guard import qt_guarded
from ..theme import BAD_COLOR, OK_COLOR
from ..widgets.jobstrip import JobStrip
from ..widgets.paths import browse_row, output_path
from ..workers import JobSlot, Task, TaskRunner

DEFAULT_PRESET = "Q4_K_M"
_RULE = "preset rule"
_COLS = ("Tensor", "Shape", "From", "To", "Why", "Override", "Size")


@qt_guarded
class QuantizeDialog(QDialog):
    """Quantizes ``gguf_path`` in a worker; emits ``openRequested(path)`` for "Open the result"."""

    openRequested = Signal(str)
    quantizeFinished = Signal(object)  # the QuantizePlan, or None when cancelled / failed

    def __init__(self, gguf_path: Path, gguf: GGUFFile, runner: TaskRunner, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle(f"Quantize {gguf_path.name}")
        self.setAccessibleName("Quantize")
        self.gguf_path = gguf_path
        self.gguf = gguf
        self.runner = runner
        self.task: Task | None = None
        self.job_slot = JobSlot(self.runner, self)  # the job and its callbacks, connected before it is queued
        self.imatrix: Imatrix | None = None
        self.plan: QuantizePlan | None = None
        self.plan_error: str | None = None
        self.result_path: Path | None = None
        self.error: str | None = None
        self.state = "idle"  # idle | running | done | cancelled | failed
        self.meter = RateMeter()
        self.overrides: dict[str, str] = {}
        self._filling = False
        quantized_src = any(t.type is not None and t.type.is_quantized for t in gguf.tensors)

        self.preset = QComboBox()
        self.preset.setAccessibleName("Quantization preset")
        have = set(supported_types())
        for name, p in PRESETS.items():
            self.preset.addItem(f"{name}  —  {p.description}", name)
            if p.default not in have:
                i = self.preset.count() - 1
                item = self.preset.model().item(i)  # type: ignore[attr-defined]
                item.setEnabled(False)
                item.setToolTip(f"{p.default}: Quantscope has no quantizer for this type yet")
        self.preset.setCurrentIndex(max(0, self.preset.findData(DEFAULT_PRESET)))
        self.output = QLineEdit()
        self.output.setAccessibleName("Output GGUF file")
        self.imatrix_path = QLineEdit()
        self.imatrix_path.setAccessibleName("Importance matrix file")
        self.imatrix_path.setPlaceholderText("none (llama-imatrix's .gguf or legacy .dat)")
        self.imatrix_info = QLabel("")
        self.imatrix_info.setObjectName("muted")
        self.imatrix_info.setWordWrap(True)
        self.imatrix_info.hide()
        self.out_type = self._type_combo("Output tensor type")
        self.embd_type = self._type_combo("Token embedding type")
        self.pure = QCheckBox("Pure (the preset's type everywhere, no mixture rules)")
        self.pure.setAccessibleName("Pure")
        self.leave_output = QCheckBox("Leave output.weight as it is")
        self.leave_output.setAccessibleName("Leave the output tensor")
        self.requant = QCheckBox("Allow requantizing quantized tensors (adds a second rounding error)")
        self.requant.setAccessibleName("Allow requantize")
        self.requant.setChecked(quantized_src)
        self.requant.setVisible(quantized_src)

        form = QFormLayout()
        form.addRow("Source", QLabel(printable(str(gguf_path))))
        form.addRow("Preset", self.preset)
        form.addRow("Output", browse_row(self.output, "Quantized output", "GGUF (*.gguf);;All files (*)", self,
                                         save=True)[0])
        form.addRow("imatrix", browse_row(self.imatrix_path, "Importance matrix",
                                          "imatrix (*.gguf *.dat);;All files (*)", self, save=False)[0])
        form.addRow(self.imatrix_info)
        types_row = QWidget()
        tl = QHBoxLayout(types_row)
        tl.setContentsMargins(0, 0, 0, 0)
        tl.addWidget(QLabel("output.weight"))
        tl.addWidget(self.out_type, 1)
        tl.addWidget(QLabel("token_embd"))
        tl.addWidget(self.embd_type, 1)
        form.addRow("Types", types_row)
        form.addRow("", self.pure)
        form.addRow("", self.leave_output)
        if quantized_src:
            form.addRow("", self.requant)
        self.options = QWidget()
        self.options.setLayout(form)

        self.table = QTableWidget(0, len(_COLS))
        self.table.setAccessibleName("Per-tensor plan")
        self.table.setHorizontalHeaderLabels(list(_COLS))
        self.table.verticalHeader().setVisible(False)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        vh = self.table.verticalHeader()
        vh.setSectionResizeMode(QHeaderView.ResizeMode.Fixed)
        vh.setDefaultSectionSize(QComboBox().sizeHint().height() + 2)  # rows with and without a combo alike
        hh = self.table.horizontalHeader()
        hh.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for c in range(1, len(_COLS)):
            hh.setSectionResizeMode(c, QHeaderView.ResizeMode.ResizeToContents)
        self.estimate = QLabel("")
        self.estimate.setAccessibleName("Size estimate")
        self.estimate.setWordWrap(True)
        self.estimate.setTextFormat(Qt.TextFormat.RichText)

        # the bar over the status, always shown; Quantize and Cancel (greyed when not usable) in the button box
        self.strip = JobStrip("quantization", "Quantize", status_text="Ready.", scale=1000, layout="column",
                              always_shown=True, place_buttons=False, run_name="Start quantizing")
        self.strip.cancel_btn.setAccessibleName("Cancel quantizing")
        self.strip.progress.setFormat("%p%")
        self.strip.run_clicked.connect(self.start)
        self.strip.cancel_clicked.connect(self.cancel)
        self.progress = self.strip.progress
        self.status = self.strip.status
        self.rate = QLabel()
        self.rate.setObjectName("muted")
        self.summary = QTextBrowser()
        self.summary.setAccessibleName("Quantization result")
        self.summary.setMaximumHeight(120)
        self.summary.hide()

        self.buttons = QDialogButtonBox()
        self.start_btn = self.strip.run_btn
        self.cancel_btn = self.strip.cancel_btn
        self.buttons.addButton(self.start_btn, QDialogButtonBox.ButtonRole.AcceptRole)
        self.buttons.addButton(self.cancel_btn, QDialogButtonBox.ButtonRole.ActionRole)
        self.open_btn = self.buttons.addButton("Open the result", QDialogButtonBox.ButtonRole.ActionRole)
        self.open_btn.setAccessibleName("Open the quantized file")
        self.open_btn.hide()
        self.close_btn = self.buttons.addButton("Close", QDialogButtonBox.ButtonRole.RejectRole)
        self.open_btn.clicked.connect(self._open_result)
        self.close_btn.clicked.connect(self.close)

        lay = QVBoxLayout(self)
        lay.addWidget(self.options)
        lay.addWidget(self.estimate)
        lay.addWidget(self.table, 1)
        lay.addWidget(self.summary)
        lay.addWidget(self.strip)
        lay.addWidget(self.rate)
        lay.addWidget(self.buttons)
        self.resize(980, 720)

        self.preset.currentIndexChanged.connect(self._preset_changed)
        for w in (self.pure, self.leave_output, self.requant):
            w.toggled.connect(self.refresh_plan)
        for c in (self.out_type, self.embd_type):
            c.currentIndexChanged.connect(self.refresh_plan)
        self.imatrix_path.editingFinished.connect(self._load_imatrix)
        self.imatrix_path.textChanged.connect(self._imatrix_text_changed)
        self._preset_changed()

    # ------------------------------------------------------------------ options
    def _type_combo(self, name: str) -> QComboBox:
        c = QComboBox()
        c.setAccessibleName(name)
        c.addItem(_RULE, None)
        for t in supported_types():
            c.addItem(t, t)
        return c

    def preset_name(self) -> str:
        return str(self.preset.currentData())

    def _preset_changed(self) -> None:
        name = self.preset_name()
        cur = Path(self.output.text()) if self.output.text() else None
        stem = self.gguf_path.stem
        for p in PRESETS:  # "model-Q8_0" -> "model": the suffix is the preset's
            stem = re.sub(rf"[-._]{re.escape(p)}$", "", stem, flags=re.IGNORECASE)
        if cur is None or cur.name.startswith(stem):
            want = f"{stem}-{name}.gguf"  # (a folder the user chose stays)
            self.output.setText(str(cur.with_name(want) if cur is not None else output_path(self.gguf_path, want)))
        self.refresh_plan()

    def _imatrix_text_changed(self, text: str) -> None:
        if not text.strip() and self.imatrix is not None:
            self.imatrix = None
            self._imatrix_note("")
            self.refresh_plan()

    def _imatrix_note(self, text: str) -> None:
        self.imatrix_info.setText(text)
        self.imatrix_info.setVisible(bool(text))

    def _load_imatrix(self) -> None:
        """Read the importance matrix in a worker; the plan is refreshed when it is in."""
        text = self.imatrix_path.text().strip()
        if not text:
            return
        path = Path(text).expanduser()
        self._imatrix_note("Reading…")

        def work(report, token):  # type: ignore[no-untyped-def]
            return read_imatrix(path)

        def done(im: Imatrix) -> None:
            if self.imatrix_path.text().strip() != text:
                return
            self.imatrix = im
            s = im.summary()
            self._imatrix_note(printable(
                f"{s['format']} imatrix: {s['entries']} entries, {s['chunk_count']} chunks"
                + (f" of {s['chunk_size']}" if s["chunk_size"] else "")
                + (f", dataset {im.datasets[0]}" if im.datasets else "")))
            self.refresh_plan()

        def failed(msg: str, _tb: str) -> None:
            self.imatrix = None
            self._imatrix_note(f"<span style='color:{BAD_COLOR}'>{html.escape(printable(msg))}</span>")
            self.refresh_plan()

        self.runner.start("imatrix", work, on_done=done, on_failed=failed)

    def options_now(self) -> QuantizeOptions:
        tt = tuple((f"^{re.escape(name)}$", t) for name, t in self.overrides.items())
        return QuantizeOptions(self.preset_name(), self.imatrix, self.imatrix_path.text().strip(), tt,
                               self.out_type.currentData(), self.embd_type.currentData(), self.requant.isChecked(),
                               self.pure.isChecked(), self.leave_output.isChecked())

    # ------------------------------------------------------------------ plan
    def refresh_plan(self) -> None:
        """Re-plan from the options (metadata only: fast) and show every tensor's type and the sizes."""
        try:
            self.plan = plan_quantize(self.gguf, self.options_now())
            self.plan_error = None
        except (QuantizeError, ImatrixError, ValueError) as exc:
            self.plan = None
            self.plan_error = str(exc)
        self._fill_table()
        if self.plan is None:
            self.estimate.setText(f"<span style='color:{BAD_COLOR}; font-weight:600'>Cannot quantize:</span> "
                                  f"{html.escape(printable(self.plan_error or ''))}")
        else:
            p = self.plan
            types = ", ".join(f"{k} ×{v}" for k, v in p.type_counts().items())
            warn = (f"<br><span style='color:{BAD_COLOR}'>{len(p.warnings)} warning(s): "
                    f"{html.escape(printable(p.warnings[0]))}{' …' if len(p.warnings) > 1 else ''}</span>"
                    if p.warnings else "")
            self.estimate.setText(
                f"<b>{human_bytes(p.in_bytes)}</b> ({p.bits_per_weight(False):.2f} bpw) → "
                f"<b>{human_bytes(p.file_bytes)}</b> ({p.bits_per_weight(True):.2f} bpw, "
                f"{p.file_bytes:,} bytes); {len(p.jobs)} tensors: {html.escape(types)}{warn}")
        self.strip.set_can_run(self.plan is not None)  # (greyed while it runs whatever the plan)

    def _fill_table(self) -> None:
        self._filling = True
        try:
            self.table.setRowCount(0)
            if self.plan is None:
                return
            jobs = self.plan.jobs
            self.table.setRowCount(len(jobs))
            choices = [_RULE, *supported_types()]
            for r, j in enumerate(jobs):
                t = j.info
                cells = (t.name, " × ".join(str(x) for x in t.ne), j.choice.source, j.choice.target,
                         j.choice.reason + (f" (from {j.choice.fell_back_from})" if j.choice.fell_back_from else ""),
                         None, human_bytes(j.out_bytes))
                for c, v in enumerate(cells):
                    if v is None:
                        continue
                    item = QTableWidgetItem(printable(v))
                    if c == 3 and j.choice.target != j.choice.source:
                        item.setForeground(Qt.GlobalColor.darkCyan)
                    if c == 6:
                        item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                    self.table.setItem(r, c, item)
                if j.choice.reason == "kept" and t.name not in self.overrides:
                    self.table.setItem(r, 5, QTableWidgetItem(""))
                    continue
                combo = QComboBox()
                combo.setAccessibleName(f"Override the type of {t.name}")
                combo.addItems(choices)
                combo.setCurrentText(self.overrides.get(t.name, _RULE))
                combo.currentTextChanged.connect(lambda text, name=t.name: self._override(name, text))
                self.table.setCellWidget(r, 5, combo)
        finally:
            self._filling = False

    def _override(self, name: str, text: str) -> None:
        if self._filling:
            return
        if text == _RULE:
            self.overrides.pop(name, None)
        else:
            self.overrides[name] = text
        self.refresh_plan()

    # ------------------------------------------------------------------ run
    def start(self) -> None:
        if self.state == "running":
            return
        self.refresh_plan()
        if self.plan is None:
            self.status.setText("Fix the options first (see above).")
            return
        out = Path(self.output.text().strip()).expanduser()
        if not self.output.text().strip():
            self.status.setText("Choose an output path first.")
            return
        try:
            OutputSet([("Output", out)], inputs=[self.gguf_path])  # the source itself, a FIFO, a folder: refused
        except PathRefused as exc:
            self.status.setText(f"<span style='color:{BAD_COLOR}; font-weight:600'>Cannot quantize:</span> "
                                f"{html.escape(printable(exc))}")
            return
        opts = self.options_now()
        src = self.gguf_path
        self.state = "running"
        self.error = None
        self.result_path = None
        self.meter = RateMeter()
        self.options.setEnabled(False)
        self.table.setEnabled(False)
        self.open_btn.hide()
        self.summary.hide()
        self.strip.started("Quantizing…")

        def work(report, token):  # type: ignore[no-untyped-def]
            def on_progress(p: QuantizeProgress) -> None:
                report(p.done_bytes, p.total_bytes,
                       f"tensor {min(p.index + 1, p.count)}/{p.count} {p.tensor}" if p.tensor else "finishing")

            try:
                plan = quantize_file(src, out, opts, on_progress, token)
            except QuantizeCancelled:
                raise Cancelled("quantization cancelled") from None
            return plan, out

        task = self.job_slot.start("quantize", work, on_done=self._done, on_progress=self._progress,
                              on_failed=self._failed, on_cancelled=self._cancelled)
        self.task = task if self.job_slot.busy else None  # (None: it has ended already)

    def _progress(self, done: int, total: int, text: str) -> None:
        if total > 0:
            self.progress.setValue(int(1000 * done / total))
            rate, eta = self.meter.update(done, total)
            self.rate.setText(f"{human_bytes(done)} of {human_bytes(total)} written · {rate / 1e6:,.1f} MB/s · "
                              f"{format_duration(eta)} left")
        self.status.setText(printable(text[:1].upper() + text[1:]) if text else "Working…")

    def _finish(self, state: str) -> None:
        self.state = state
        self.task = None
        self.options.setEnabled(True)
        self.table.setEnabled(True)
        self.strip.set_can_run(self.plan is not None)
        self.strip.set_busy(False)
        self.start_btn.setText("Quantize again")

    def _done(self, res: Any) -> None:
        plan, out = res
        self.result_path = out
        self._finish("done")
        self.strip.finished()
        rows = [("File", f"{out} ({plan.file_bytes:,} bytes, {human_bytes(plan.file_bytes)})"),
                ("Preset", f"{plan.preset.name} (general.file_type {int(plan.preset.ftype)})"),
                ("Size", f"{human_bytes(plan.in_bytes)} ({plan.bits_per_weight(False):.2f} bpw) → "
                         f"{human_bytes(plan.out_bytes)} ({plan.bits_per_weight(True):.2f} bpw)"),
                ("Types", ", ".join(f"{k} ×{v}" for k, v in plan.type_counts().items()))]
        rows += [("Warning", w) for w in plan.warnings[:20]]
        body = "".join(f"<tr><td style='padding-right:12px'><b>{html.escape(k)}</b></td>"
                       f"<td>{html.escape(printable(v))}</td></tr>" for k, v in rows)
        self.summary.setHtml(f"<p style='color:{OK_COLOR}; font-weight:600'>✓ Quantized</p><table>{body}</table>")
        self.summary.show()
        self.status.setText(printable(f"Done: {out.name}"))
        self.open_btn.show()
        self.quantizeFinished.emit(plan)

    def _failed(self, msg: str, _tb: str) -> None:
        self.error = msg
        self._finish("failed")
        self.progress.setValue(0)
        self.status.setText(f"<span style='color:{BAD_COLOR}; font-weight:600'>Quantization failed.</span> "
                            "Nothing was left at the target path.")
        self.summary.setPlainText(printable(msg))
        self.summary.show()
        self.quantizeFinished.emit(None)

    def _cancelled(self) -> None:
        self._finish("cancelled")
        self.progress.setValue(0)
        self.rate.setText("")
        self.status.setText("Cancelled: nothing was written at the target path.")
        self.quantizeFinished.emit(None)

    def cancel(self) -> None:
        if self.task is not None:
            self.strip.cancelling()
            self.task.cancel()

    def _open_result(self) -> None:
        if self.result_path is not None:
            self.openRequested.emit(str(self.result_path))
            self.close()

    def closeEvent(self, event: Any) -> None:
        if self.state == "running":
            self.cancel()
        super().closeEvent(event)

    def reject(self) -> None:  # Esc
        if self.state == "running":
            self.cancel()
            return
        super().reject()
