"""One job strip: a status line, a progress bar, Cancel and a run button in one row, and the states they go
through (idle, running, cancelling, ended), so that each view with a background job shows it the same way."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QWidget

from ..guard import qt_guarded
from .progress import ProgressBar


@qt_guarded
class JobStrip(QWidget):
    """``[status …………][progress][Cancel][run]`` (``status_last``: ``[run][Cancel][progress][status …………]``). While a
    job runs the bar and Cancel show and the run button hides (``disable_run``: is greyed); when it ends they hide
    and the run button comes back (if :meth:`set_can_run` allows it). ``status`` may be the view's own label (e.g.
    an eliding one).

    ``what`` names the job in the accessible names ("Cancel the <what>", "<What> progress", "<What> status");
    ``run_text`` ``None`` keeps the run button hidden (the view starts the job some other way). The view keeps its
    :class:`~quantscope.gui.workers.JobSlot` and calls :meth:`started`, :meth:`progress`, :meth:`finished`,
    :meth:`failed` or :meth:`cancelled`; :meth:`set_busy` may be the slot's ``on_busy``."""

    run_clicked = Signal()
    cancel_clicked = Signal()

    def __init__(self, what: str, run_text: str | None = None, *, status_text: str = "", scale: int = 100,
                 progress_width: int = 220, cancel_text: str = "Cancel", run_name: str | None = None,
                 status: QLabel | None = None, status_last: bool = False, disable_run: bool = False,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.what = what
        self.busy = False
        self._can_run = True
        cap = what[:1].upper() + what[1:]
        self._disable_run = disable_run
        self.status = status if status is not None else QLabel()
        self.status.setText(status_text)
        self.status.setAccessibleName(f"{cap} status")
        if status is None:
            self.status.setWordWrap(True)
        self.progress = ProgressBar()
        self.progress.setAccessibleName(f"{cap} progress")
        self.progress.setRange(0, scale)
        self.progress.setValue(0)
        self.progress.setMaximumWidth(progress_width)
        self.cancel_btn = QPushButton(cancel_text)
        self.cancel_btn.setAccessibleName(f"Cancel the {what}")
        self.cancel_btn.clicked.connect(self.cancel_clicked)
        self._has_run = run_text is not None
        self.run_btn = QPushButton(run_text or "")
        self.run_btn.setAccessibleName(run_name or f"Run the {what}")
        self.run_btn.clicked.connect(self.run_clicked)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        parts = ((self.run_btn, self.cancel_btn, self.progress, self.status) if status_last else
                 (self.status, self.progress, self.cancel_btn, self.run_btn))
        for w in parts:
            lay.addWidget(w, 1 if w is self.status else 0)
        self._show()

    # -- states ------------------------------------------------------------------------------------------------
    def _show(self) -> None:
        self.progress.setVisible(self.busy)
        self.cancel_btn.setVisible(self.busy)
        self.cancel_btn.setEnabled(self.busy)
        if self._disable_run:  # the run button stays in place, greyed while a job runs
            self.run_btn.setVisible(self._has_run)
            self.run_btn.setEnabled(not self.busy and self._can_run)
        else:
            self.run_btn.setVisible(self._has_run and not self.busy and self._can_run)

    def set_busy(self, busy: bool) -> None:
        """Running or idle, the status left as it is (fits ``JobSlot(on_busy=...)``)."""
        self.busy = busy
        self._show()

    def set_can_run(self, can: bool) -> None:
        """Whether the idle strip offers its run button (e.g. not before a file is open)."""
        self._can_run = can
        self._show()

    def set_status(self, text: str) -> None:
        self.status.setText(text)

    def started(self, text: str | None = None) -> None:
        """A job started: the bar at zero, Cancel offered, the status ``text`` (if given)."""
        self.progress.setValue(0)
        if text is not None:
            self.status.setText(text)
        self.set_busy(True)

    def progress_to(self, done: int, total: int, text: str | None = None) -> None:
        """``done`` of ``total`` (a total of 0: nothing to do, the bar full); the status ``text`` if given."""
        top = self.progress.maximum()
        self.progress.setValue(min(top, int(top * done / total)) if total > 0 else top)
        if text is not None:
            self.status.setText(text)

    def cancelling(self, text: str = "Cancelling…") -> None:
        """Cancel was asked: the button is spent until the job reports how it ended."""
        if self.busy:
            self.cancel_btn.setEnabled(False)
            self.status.setText(text)

    def _ended(self, text: str | None, value: int) -> None:
        self.progress.setValue(value)
        if text is not None:
            self.status.setText(text)
        self.set_busy(False)

    def finished(self, text: str | None = None) -> None:
        self._ended(text, self.progress.maximum())

    def failed(self, text: str) -> None:
        self._ended(text, 0)

    def cancelled(self, text: str = "Cancelled.") -> None:
        self._ended(text, 0)
