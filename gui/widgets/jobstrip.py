"""One job strip: a status line, a progress bar, Cancel and a run button, and the states they go through (idle,
running, cancelling, ended), so that each view with a background job shows it the same way."""

from __future__ import annotations

from typing import Literal

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QBoxLayout, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from ..guard import qt_guarded
from .progress import ProgressBar

Layout = Literal["row", "two_rows", "column"]


@qt_guarded
class JobStrip(QWidget):
    """A view's job: its status, progress bar, Cancel and run button, laid out by ``layout``:

    - ``"row"``: ``[status …………][progress][Cancel][run]`` (``status_last``: ``[run][Cancel][progress][status …]``);
    - ``"two_rows"``: ``[controls …][run][Cancel]`` over ``[progress][status …………]``: ``controls`` is the view's
      own widget (its options; first in the tab order), extras may follow in :attr:`row` and :attr:`status_row`;
    - ``"column"``: ``[run][Cancel]`` over the bar (full width) over ``[status …]`` (a dialog's side panel).

    While a job runs the bar and Cancel show and the run button hides (``disable_run``: is greyed); when it ends they
    hide and the run button comes back (if :meth:`set_can_run` allows it). ``always_shown``: the bar and both buttons
    stay in place, Cancel greyed while idle and the run button while busy; the bar keeps how the job ended.
    ``place_buttons=False`` leaves the buttons out of the strip for the view to place (e.g. in its
    ``QDialogButtonBox``): the strip still keeps their states. ``status`` may be the view's own label (e.g. an
    eliding or rich-text one).

    ``what`` names the job in the accessible names ("Cancel the <what>", "<What> progress", "<What> status");
    ``run_text`` ``None`` keeps the run button hidden (the view starts the job some other way). The view keeps its
    :class:`~quantscope.gui.workers.JobSlot` and calls :meth:`started`, :meth:`progress_to`, :meth:`finished`,
    :meth:`failed` or :meth:`cancelled`; :meth:`set_busy` may be the slot's ``on_busy``."""

    run_clicked = Signal()
    cancel_clicked = Signal()

    def __init__(self, what: str, run_text: str | None = None, *, status_text: str = "", scale: int = 100,
                 progress_width: int | None = 220, cancel_text: str = "Cancel", run_name: str | None = None,
                 status: QLabel | None = None, status_last: bool = False, disable_run: bool = False,
                 layout: Layout = "row", always_shown: bool = False, place_buttons: bool = True,
                 controls: QWidget | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.what = what
        self.busy = False
        self._can_run = True
        cap = what[:1].upper() + what[1:]
        self._always = always_shown
        self._disable_run = disable_run or always_shown
        self.status = status if status is not None else QLabel()
        self.status.setText(status_text)
        self.status.setAccessibleName(f"{cap} status")
        if status is None:
            self.status.setWordWrap(True)
        self.progress = ProgressBar()
        self.progress.setAccessibleName(f"{cap} progress")
        self.progress.setRange(0, scale)
        self.progress.setValue(0)
        if progress_width is not None and layout != "column":
            self.progress.setMaximumWidth(progress_width)
        self.cancel_btn = QPushButton(cancel_text)
        self.cancel_btn.setAccessibleName(f"Cancel the {what}")
        self.cancel_btn.clicked.connect(self.cancel_clicked)
        self._has_run = run_text is not None
        self.run_btn = QPushButton(run_text or "")
        self.run_btn.setAccessibleName(run_name or f"Run the {what}")
        self.run_btn.clicked.connect(self.run_clicked)
        self.row, self.status_row = self._lay_out(layout, status_last, place_buttons, controls)
        self._show()

    def _lay_out(self, layout: Layout, status_last: bool, place_buttons: bool,
                 controls: QWidget | None) -> tuple[QBoxLayout, QBoxLayout]:
        """The strip's rows: (the one with the buttons, the one with the status)."""
        if controls is not None and layout == "row":
            raise ValueError("a single-row strip takes no controls")
        buttons = (self.run_btn, self.cancel_btn) if place_buttons else ()
        if layout == "row":
            row = QHBoxLayout(self)
            row.setContentsMargins(0, 0, 0, 0)
            parts = ((*buttons, self.progress, self.status) if status_last else
                     (self.status, self.progress, *buttons[::-1]))
            for w in parts:
                row.addWidget(w, 1 if w is self.status else 0)
            return row, row
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        row, status_row = QHBoxLayout(), QHBoxLayout()
        if controls is not None:  # laid out (and so parented) before the buttons: first in the tab order
            row.addWidget(controls, 1)
        for w in buttons:
            row.addWidget(w)
        lay.addLayout(row)
        if layout == "column":
            lay.addWidget(self.progress)
        else:
            status_row.addWidget(self.progress)
        status_row.addWidget(self.status, 1)
        lay.addLayout(status_row)
        return row, status_row

    # -- states ------------------------------------------------------------------------------------------------
    def _show(self) -> None:
        shown = self.busy or self._always
        self.progress.setVisible(shown)
        self.cancel_btn.setVisible(shown)
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


def controls_row(*parts: QWidget | tuple[QWidget, int] | int | None) -> QWidget:
    """A strip's ``controls``: one row of widgets (``(widget, stretch)`` to stretch one, an int: a spacing,
    ``None``: a stretch), without margins."""
    box = QWidget()
    row = QHBoxLayout(box)
    row.setContentsMargins(0, 0, 0, 0)
    for p in parts:
        if p is None:
            row.addStretch(1)
        elif isinstance(p, int):
            row.addSpacing(p)
        elif isinstance(p, tuple):
            row.addWidget(*p)
        else:
            row.addWidget(p)
    return box
