"""The "Convert to bump" dialog: options, a background conversion with progress, MB/s, ETA and cancel, then
a result summary and "Open the result"."""

from __future__ import annotations

import html
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from quantscope.core.bump import (
    DEFAULT_PROFILE,
    PROFILES,
    ConvertJob,
    ConvertProgress,
    ConvertResult,
)
from quantscope.core.fsutil import PathRefused, printable
from quantscope.core.jobs import RateMeter, format_duration
from quantscope.core.summary import human_bytes

from ..guard import qt_guarded
from ..theme import BAD_COLOR, OK_COLOR
from ..widgets.jobstrip import JobStrip
from ..widgets.paths import browse_row, output_path
from ..workers import JobSlot, Task, TaskRunner


@qt_guarded
class ConvertDialog(QDialog):
    """Converts ``gguf_path`` to BUMPWGT3 in a worker; emits ``openRequested(path)`` for "Open the result".

    As it opens, a worker plans the conversion for every profile (the header only): a profile that refuses the file
    is said then, not after Convert; when none takes it, Convert is disabled and "Requantize first…" emits
    ``quantizeRequested(preset)`` (the main window opens the Quantize dialog on that preset)."""

    openRequested = Signal(str)
    conversionFinished = Signal(object)  # ConvertResult, or None when cancelled / failed
    profilesChecked = Signal(object)  # {profile: why it refuses this file} (empty: every profile takes it)
    quantizeRequested = Signal(str)  # the preset to requantize to (REQUANT_PRESET)

    #: What "Requantize first…" proposes: Q8_0 blocks of 32 fit any row, and the ckernel profile takes Q8_0.
    REQUANT_PRESET = "Q8_0"

    def __init__(self, gguf_path: Path, runner: TaskRunner, parent: QWidget | None = None,
                 default_context: int | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle(f"Convert {gguf_path.name} to bump")
        self.setAccessibleName("Convert to bump")
        self.gguf_path = gguf_path
        self.runner = runner
        self.task: Task | None = None
        self.job_slot = JobSlot(self.runner, self)  # the job and its callbacks, connected before it is queued
        self.result: ConvertResult | None = None
        self.error: str | None = None
        self.state = "idle"  # idle | running | done | cancelled | failed
        self.meter = RateMeter()
        #: Why each profile refuses this file (filled by the check that starts as the dialog opens; None before).
        self.refusals: dict[str, str] | None = None
        self.check_slot = JobSlot(self.runner, self)

        out = output_path(gguf_path, gguf_path.with_suffix(".bump").name)
        self.output = QLineEdit(str(out))
        self.output.setAccessibleName("Output bump file")
        self.profile = QComboBox()
        self.profile.addItems(list(PROFILES))
        self.profile.setCurrentText(DEFAULT_PROFILE)
        self.profile.setAccessibleName("Dtype profile")
        self.profile.setToolTip("ckernel: C-Kernel-Engine's runtime codes (Q4_K, Q6_K, Q8_0, Q5_0, Q5_1, F32); "
                                "seed: the original converter's codes (Q4_K, Q6_K, F32)")
        self.ctx_check = QCheckBox("Override")
        self.ctx_check.setAccessibleName("Override the context length")
        self.ctx = QSpinBox()
        self.ctx.setRange(1, 10_000_000)
        self.ctx.setGroupSeparatorShown(True)
        self.ctx.setValue(max(1, min(default_context or 4096, 10_000_000)))  # a file may claim 2^40
        self.ctx.setEnabled(False)
        self.ctx.setAccessibleName("Context length")
        self.ctx_check.toggled.connect(self.ctx.setEnabled)
        self.config_check = QCheckBox("Write config.json")
        self.config_check.setAccessibleName("Also write config.json")
        self.config = QLineEdit(str(out.with_name("config.json")))
        self.config.setToolTip("config.json (bump.md §6) beside the output by default")
        self.config.setAccessibleName("config.json path")
        self.manifest_check = QCheckBox("Write manifest")
        self.manifest_check.setAccessibleName("Also write a manifest")
        self.manifest = QLineEdit(str(out.with_name("manifest.json")))
        self.manifest.setAccessibleName("Manifest path")
        self.output.textChanged.connect(self._output_changed)
        self.drop_head = QCheckBox("Convert even if output.weight is a distinct lm_head (it is dropped)")
        self.drop_head.setAccessibleName("Drop an untied lm_head")

        form = QFormLayout()
        form.addRow("Source", QLabel(str(gguf_path)))
        form.addRow("Output", browse_row(self.output, "Bump output", "Bump files (*.bump *.bin);;All files (*)", self,
                                         save=True)[0])
        form.addRow("Profile", self.profile)
        ctx_row = QWidget()
        cl = QHBoxLayout(ctx_row)
        cl.setContentsMargins(0, 0, 0, 0)
        cl.addWidget(self.ctx_check)
        cl.addWidget(self.ctx, 1)
        form.addRow("Context", ctx_row)
        form.addRow(self.config_check, browse_row(self.config, "config.json", "JSON (*.json)", self, save=True)[0])
        form.addRow(self.manifest_check, browse_row(self.manifest, "Manifest", "JSON (*.json)", self, save=True)[0])
        form.addRow("lm_head", self.drop_head)
        self.options = QWidget()
        self.options.setLayout(form)

        # the bar over the status, always shown; Convert and Cancel (greyed when not usable) in the button box
        self.strip = JobStrip("conversion", "Convert", status_text="Ready.", scale=1000, layout="column",
                              always_shown=True, place_buttons=False, run_name="Start the conversion")
        self.strip.progress.setTextVisible(True)
        self.strip.progress.setFormat("%p%")
        self.strip.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)  # the command
        self.strip.run_clicked.connect(self.start)
        self.strip.cancel_clicked.connect(self.cancel)
        self.progress = self.strip.progress
        self.status = self.strip.status
        self.rate = QLabel()
        self.rate.setObjectName("muted")
        self.rate.setAccessibleName("Conversion speed and time left")
        self.summary = QTextBrowser()
        self.summary.setAccessibleName("Conversion result")
        self.summary.setMinimumHeight(170)
        self.summary.hide()

        self.buttons = QDialogButtonBox()
        self.start_btn = self.strip.run_btn
        self.cancel_btn = self.strip.cancel_btn
        self.buttons.addButton(self.start_btn, QDialogButtonBox.ButtonRole.AcceptRole)
        self.buttons.addButton(self.cancel_btn, QDialogButtonBox.ButtonRole.ActionRole)
        self.open_btn = self.buttons.addButton("Open the result", QDialogButtonBox.ButtonRole.ActionRole)
        self.open_btn.setAccessibleName("Open the converted bump file")
        self.open_btn.hide()
        self.close_btn = self.buttons.addButton("Close", QDialogButtonBox.ButtonRole.RejectRole)
        self.close_btn.setAccessibleName("Close the dialog")
        self.requant_btn = QPushButton(f"Requantize to {self.REQUANT_PRESET} first…")
        self.requant_btn.setAccessibleName("Requantize the model first")
        self.requant_btn.setToolTip(f"Open Tools ▸ Quantize on {self.REQUANT_PRESET} (a type the ckernel profile "
                                    "takes); convert the file it writes")
        self.requant_btn.clicked.connect(lambda: self.quantizeRequested.emit(self.REQUANT_PRESET))
        self.requant_btn.hide()
        self.profile.currentTextChanged.connect(lambda _t: self._show_refusal())
        self.open_btn.clicked.connect(self._open_result)
        self.close_btn.clicked.connect(self.close)
        self.strip.status_row.addWidget(self.requant_btn)

        lay = QVBoxLayout(self)
        lay.addWidget(self.options)
        lay.addWidget(self.strip)
        lay.addWidget(self.rate)
        lay.addWidget(self.summary, 1)
        lay.addWidget(self.buttons)
        self.resize(760, 580)
        self._check_profiles()

    # ------------------------------------------------------------------ does a profile take this file?
    def _check_profiles(self) -> None:
        """Plan the conversion for every profile in a worker (header and tensor table only, no lm_head check)."""
        path = self.gguf_path
        self.status.setText("Checking whether the profiles take this file…")

        def work(_report, _token):  # type: ignore[no-untyped-def]
            from quantscope.core.bump.plan import plan_conversion
            from quantscope.core.gguf import GGUFFile

            out: dict[str, str] = {}
            with GGUFFile(path) as f:
                for name in PROFILES:
                    try:
                        plan_conversion(f, name, check_head=False)
                    except Exception as exc:  # a refusal (or a file that cannot be planned): said, not raised
                        out[name] = printable(str(exc)) or type(exc).__name__
            return out

        def failed(msg: str, _tb: str) -> None:
            self.refusals = {name: printable(msg) for name in PROFILES}
            self._show_refusal()
            self.profilesChecked.emit(self.refusals)

        self.check_slot.start("convert-check", work, on_done=self._profiles_checked, on_failed=failed)

    def _profiles_checked(self, refusals: dict[str, str]) -> None:
        self.refusals = refusals
        current = self.profile.currentText()
        if current in refusals and self.state != "running":  # another profile takes it: choose that one
            ok = [p for p in PROFILES if p not in refusals]
            if ok:
                self.profile.setCurrentText(ok[0])
        for i in range(self.profile.count()):
            name = self.profile.itemText(i)
            self.profile.setItemData(i, refusals.get(name, ""), Qt.ItemDataRole.ToolTipRole)
        self._show_refusal()
        self.profilesChecked.emit(refusals)

    def _show_refusal(self) -> None:
        """The chosen profile's refusal (and the way out when no profile takes the file), or ready."""
        if self.refusals is None or self.state == "running":
            return
        why = self.refusals.get(self.profile.currentText())
        none_take = len(self.refusals) == len(PROFILES)
        self.requant_btn.setVisible(none_take)
        self.strip.set_can_run(why is None)
        if why is None:
            if self.state == "idle":
                self.status.setText("Ready.")
            return
        why = why.replace(" Requantize the model or pick another profile.", "")  # the way out is said below
        src = html.escape(printable(str(self.gguf_path)))
        if none_take:
            head = "Neither profile can convert this file:"
            tail = (f" Requantize it first to types a profile takes ({self.REQUANT_PRESET}, which the ckernel profile "
                    "takes, suits every model) "
                    f"with Tools ▸ Quantize, or <code>quantscope quantize --allow-requantize {src} "
                    f"OUT.gguf {self.REQUANT_PRESET}</code>, then convert the result.")
        else:
            head = f"The {html.escape(self.profile.currentText())} profile cannot convert this file:"
            tail = " Choose the other profile."
        self.status.setText(f"<span style='color:{BAD_COLOR}; font-weight:600'>{head}</span> "
                            f"{html.escape(why)}{tail}")

    def _output_changed(self, text: str) -> None:
        """Keep config.json and the manifest beside the output until the user picks their own paths."""
        folder = Path(text).expanduser().parent
        for check, edit, name in ((self.config_check, self.config, "config.json"),
                                  (self.manifest_check, self.manifest, "manifest.json")):
            if not check.isChecked():
                edit.setText(str(folder / name))

    # ------------------------------------------------------------------ job
    def job(self) -> ConvertJob:
        return ConvertJob(
            self.gguf_path, Path(self.output.text()).expanduser(), profile=self.profile.currentText(),
            context=self.ctx.value() if self.ctx_check.isChecked() else None,
            config_path=Path(self.config.text()).expanduser() if self.config_check.isChecked() else None,
            manifest_path=Path(self.manifest.text()).expanduser() if self.manifest_check.isChecked() else None,
            drop_untied_head=self.drop_head.isChecked(),
        )

    def start(self) -> None:
        if self.state == "running":
            return
        if not self.output.text().strip():
            self.status.setText("Choose an output path first.")
            return
        job = self.job()
        try:
            job.check()  # an output that is the source or another output, a FIFO/device/folder: refused here
        except PathRefused as exc:
            self.error = str(exc)
            self.status.setText(f"<span style='color:{BAD_COLOR}; font-weight:600'>Cannot convert:</span> "
                                f"{html.escape(printable(exc))}")
            return
        self.state = "running"
        self.result = None
        self.error = None
        self.meter = RateMeter()
        self.options.setEnabled(False)
        self.open_btn.hide()
        self.summary.hide()
        self.strip.started("Planning (checking every tensor has a slot, deciding the lm_head)…")

        def work(report, token):  # type: ignore[no-untyped-def]
            def on_progress(p: ConvertProgress) -> None:
                label = "planning" if p.phase == "planning" else (
                    f"{p.phase}: section {p.section_index + 1}/{p.n_sections} {p.section}")
                report(p.done, p.total, label)

            return job.run(on_progress, token)

        task = self.job_slot.start("convert", work, on_done=self._done, on_progress=self._progress,
                              on_failed=self._failed, on_cancelled=self._cancelled)
        self.task = task if self.job_slot.busy else None  # (None: it has ended already)

    def _progress(self, done: int, total: int, text: str) -> None:
        if total > 0:
            self.progress.setValue(int(1000 * done / total))
            rate, eta = self.meter.update(done, total)
            self.rate.setText(f"{human_bytes(done)} of {human_bytes(total)} · {rate / 1e6:,.0f} MB/s · "
                              f"{format_duration(eta)} left")
        self.status.setText(text[:1].upper() + text[1:] if text else "Working…")

    def _finish(self, state: str) -> None:
        self.state = state
        self.task = None
        self.options.setEnabled(True)
        self.strip.set_can_run(self.refusals is None or self.profile.currentText() not in self.refusals)
        self.strip.set_busy(False)
        self.start_btn.setText("Convert again")

    def _done(self, res: ConvertResult) -> None:
        self.result = res
        self._finish("done")
        self.strip.finished()
        plan = res.plan
        h = plan.hyper
        types: dict[str, int] = {}
        for s in plan.sections:
            types[s.type_name] = types.get(s.type_name, 0) + 1
        lm = plan.lm_head
        rows = [
            ("File", f"{res.path} ({res.size:,} bytes, {human_bytes(res.size)})"),
            ("Time", f"{res.seconds:.2f} s, {res.mb_per_s:,.0f} MB/s"),
            ("Profile", plan.profile),
            ("Model", f"{h.arch}: {h.n_layers} layers, embed {h.embed}, heads {h.heads}/{h.kv_heads} × "
                      f"{h.head_dim}, ffn {h.ffn}, vocab {h.vocab:,}, context {h.context:,}"),
            ("Sections", f"{len(plan.sections)}: " + ", ".join(f"{n} × {k}" for k, n in sorted(types.items()))),
            ("Biases", f"{len(plan.biases)} q/k/v bias tensors carried" if plan.biases else "none (zeros)"),
            ("lm_head", f"{lm.decision}: {lm.message}" if lm is not None else "?"),
            ("SHA-256", res.sha256),
        ]
        for label, p in (("config.json", res.config_path), ("Manifest", res.manifest_path)):
            if p:
                rows.append((label, str(p)))
        html = "".join(f"<tr><td style='padding-right:12px'><b>{k}</b></td><td>{v}</td></tr>" for k, v in rows)
        self.summary.setHtml(f"<p style='color:{OK_COLOR}; font-weight:600'>✓ Converted</p><table>{html}</table>")
        self.summary.show()
        self.status.setText(f"Done: {res.path.name}")
        self.open_btn.show()
        self.conversionFinished.emit(res)

    def _failed(self, msg: str, _tb: str) -> None:
        self.error = msg
        self._finish("failed")
        self.progress.setValue(0)
        self.status.setText(f"<span style='color:{BAD_COLOR}; font-weight:600'>Conversion failed.</span> "
                            "Nothing was left at the target path.")
        self.summary.setPlainText(msg)
        self.summary.show()
        self.conversionFinished.emit(None)

    def _cancelled(self) -> None:
        self._finish("cancelled")
        self.progress.setValue(0)
        self.rate.setText("")
        self.status.setText("Cancelled: nothing was written at the target path.")
        self.conversionFinished.emit(None)

    def cancel(self) -> None:
        if self.task is not None:
            self.strip.cancelling()
            self.task.cancel()

    def _open_result(self) -> None:
        if self.result is not None:
            self.openRequested.emit(str(self.result.path))
            self.close()

    def closeEvent(self, event: object) -> None:
        if self.state == "running":
            self.cancel()
        super().closeEvent(event)  # type: ignore[arg-type]

    def reject(self) -> None:  # Esc
        if self.state == "running":
            self.cancel()
            return
        super().reject()

