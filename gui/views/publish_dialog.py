"""Publish… (the Quant lab, after a Write): the written GGUF and its model card uploaded to a repository on the
Hugging Face hub in one commit, by core/publish.py (``huggingface_hub``) in this dialog's own worker, with progress
and Cancel. The card is core/publish.py's, written from the file's header and what the lab measured (the
target-size figures); it is shown before anything is sent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QCloseEvent, QFontDatabase
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QVBoxLayout,
    QWidget,
)

from quantscope.core import publish as core_publish
from quantscope.core.fsutil import printable
from quantscope.core.summary import human_bytes

from ..guard import qt_guarded
from ..widgets.fit import ElidedLabel
from ..widgets.jobstrip import JobStrip
from ..workers import JobSlot, TaskRunner

TASK = "hub-publish"


def suggested_repo(path: Path) -> str:
    """``your-name/<file stem>-GGUF``: the user's name is not known here, the field says what to change."""
    return f"your-name/{path.stem}-GGUF"


@qt_guarded
class PublishDialog(QDialog):
    """Repository, token (HF_TOKEN or a saved one, or pasted here), private, the card, Publish / Cancel."""

    published = Signal(str)  # the commit's URL

    def __init__(self, path: Path, inputs: core_publish.CardInputs, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.path = path
        self.inputs = inputs
        self.url: str | None = None
        self.error: str | None = None
        self.state = "idle"  # idle | running | done | cancelled | failed
        self.card = ""
        self.gguf: Any = None  # the written file's header, read once (the card is written from it)
        self.runner = TaskRunner(self, max_threads=1)  # its own: opening another file does not stop an upload
        self.job = JobSlot(self.runner, self, on_busy=self._busy)
        self.setWindowTitle("Publish to the Hugging Face hub")
        self.setAccessibleName("Publish to the Hugging Face hub")
        self._build()
        self.resize(820, 640)
        self._card_timer = QTimer(self)  # the card follows the repository name once typing pauses
        self._card_timer.setSingleShot(True)
        self._card_timer.setInterval(200)
        self._card_timer.timeout.connect(self._render_card)
        self.repo.textChanged.connect(lambda _t: self._card_timer.start())
        self._open_file()

    def _build(self) -> None:
        size = human_bytes(self.path.stat().st_size) if self.path.is_file() else "?"
        self.file_label = ElidedLabel(printable(f"{self.path.name} ({size}) and its model card (README.md), in one "
                                                "commit"), Qt.TextElideMode.ElideMiddle)
        self.file_label.setToolTip(printable(str(self.path)))
        self.repo = QLineEdit(suggested_repo(self.path))
        self.repo.setAccessibleName("Repository (org/name)")
        self.repo.setToolTip("The repository to create (kept if it exists): your user name or an organization "
                             "you may write to, then a name")
        self.token = QLineEdit()
        self.token.setAccessibleName("Hugging Face token")
        self.token.setEchoMode(QLineEdit.EchoMode.Password)
        found = core_publish.saved_token() is not None
        self.token.setPlaceholderText("the token found (HF_TOKEN or a saved one) is used" if found else
                                      "paste a token with write access (none in HF_TOKEN or saved)")
        self.token_note = QLabel("A token was found (HF_TOKEN or `hf auth login`); a token pasted here is used "
                                 "instead, for this upload only." if found else
                                 "No token found: set HF_TOKEN or run `hf auth login`, or paste one here.")
        self.token_note.setObjectName("muted")
        self.private = QCheckBox("Private repository (when it is created)")
        self.private.setAccessibleName("Create the repository private")
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        form.addRow("File", self.file_label)
        form.addRow("Repository", self.repo)
        form.addRow("Token", self.token)
        form.addRow("", self.token_note)
        form.addRow("", self.private)
        self.preview = QPlainTextEdit()
        self.preview.setReadOnly(True)
        self.preview.setAccessibleName("The model card (README.md)")
        self.preview.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        self.preview.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.preview.setPlainText("Reading the file's header…")
        self.strip = JobStrip("publish", "Publish", status_text="", disable_run=True,
                              run_name="Publish the file and its card")
        self.strip.run_clicked.connect(self.start)
        self.strip.cancel_clicked.connect(self.cancel)
        self.strip.set_can_run(False)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.close)
        card_label = QLabel("Model card")
        card_label.setBuddy(self.preview)
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addWidget(card_label)
        lay.addWidget(self.preview, 1)
        bottom = QHBoxLayout()
        bottom.addWidget(self.strip, 1)
        bottom.addWidget(buttons)
        lay.addLayout(bottom)

    # -- the card ----------------------------------------------------------------------------------------------
    def _open_file(self) -> None:
        path = self.path

        def read(_r: Any, _t: Any) -> Any:
            from quantscope.core.gguf import GGUFFile

            return GGUFFile(path)

        def failed(msg: str, _tb: str) -> None:
            self.preview.setPlainText(printable(f"{path.name} cannot be read: {msg}"))

        self.job.start("publish-card", read, on_done=self._opened, on_failed=failed)

    def _opened(self, f: Any) -> None:
        self.gguf = f
        self._render_card()

    def repo_id(self) -> str | None:
        """The repository typed, when it is one (org/name)."""
        from quantscope.core.hub import HubError, parse_repo_ref

        try:
            repo, quant = parse_repo_ref(self.repo.text())
        except HubError:
            return None
        return repo if quant is None else None

    def _render_card(self) -> None:
        if self.gguf is None:
            return
        repo = self.repo_id()
        try:
            self.card = core_publish.model_card(self.gguf, repo or suggested_repo(self.path), [self.path.name],
                                                self.inputs)
        except (OSError, ValueError) as exc:
            self.card = ""
            self.preview.setPlainText(printable(f"The card cannot be written: {exc}"))
            self._can_run()
            return
        self.preview.setPlainText(self.card)
        self.strip.set_status("" if repo else "Give the repository as org/name.")
        self._can_run()

    def _can_run(self) -> None:
        self.strip.set_can_run(bool(self.card) and self.repo_id() is not None and not self.job.busy)

    # -- publishing --------------------------------------------------------------------------------------------
    def start(self) -> bool:
        """Create the repository (kept if it exists) and commit the file and its card, in the worker."""
        repo = self.repo_id()
        if repo is None or not self.card or self.job.busy:
            return False
        self._card_timer.stop()
        self._render_card()  # the card as the repository is named now
        card, path, private = self.card, self.path, self.private.isChecked()
        token = self.token.text().strip() or core_publish.saved_token()
        self.state = "running"
        self.url = None
        self.error = None
        self.strip.started(f"Publishing to {printable(repo)}…")

        def work(report: Any, cancel: Any) -> str:
            return core_publish.publish(repo, [path], card, private=private, token=token,
                                        progress=lambda text: report(0, 0, text),
                                        transfer=lambda what, d, t: report(d, t, what), cancel=cancel)

        def done(url: str) -> None:
            self.state = "done"
            self.url = url
            self.strip.finished(printable(f"Published {path.name} and its card to {repo}: {url}"))
            self.strip.status.setToolTip(printable(url))
            self.published.emit(url)

        def failed(msg: str, _tb: str) -> None:
            self.state = "failed"
            self.error = msg
            self.strip.failed(printable(f"Publishing failed: {msg}"))

        def cancelled() -> None:
            self.state = "cancelled"
            self.strip.cancelled("Publishing cancelled: nothing was committed.")

        self.job.start(TASK, work, on_done=done, on_failed=failed, on_cancelled=cancelled,
                       on_progress=lambda d, t, text: self.strip.progress_to(d, t, printable(text.capitalize())))
        return True

    def cancel(self) -> None:
        self.strip.cancelling()
        self.job.cancel()

    def _busy(self, busy: bool) -> None:
        self.strip.set_busy(busy)
        for w in (self.repo, self.token, self.private):
            w.setEnabled(not busy)
        self._can_run()

    def shutdown(self, timeout_ms: int = 30000) -> bool:
        """Cancel and wait for the worker, then let go of the file (a window closing, the lab going)."""
        self.job.forget()
        ok = self.runner.shutdown(timeout_ms)
        if ok and self.gguf is not None:
            self.gguf.close()
            self.gguf = None
        return ok

    def closeEvent(self, event: QCloseEvent) -> None:
        """Closing while publishing cancels it (nothing is committed) and waits for the worker."""
        if self.job.busy:
            self.cancel()
        self.shutdown()
        super().closeEvent(event)
