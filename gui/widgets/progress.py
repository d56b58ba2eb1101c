"""A progress bar that never repaints synchronously: QProgressBar.setValue repaints at once (and, on a
non-opaque style, everything behind it), which a worker's progress, many times a second, turns into a stutter."""

from __future__ import annotations

from PySide6.QtWidgets import QProgressBar

from ..guard import qt_guarded


@qt_guarded
class ProgressBar(QProgressBar):
    """A :class:`QProgressBar` whose new value is painted with the next paint of the window (``update()``)."""

    def setValue(self, value: int) -> None:  # type: ignore[override]
        if value == self.value():
            return
        was = self.updatesEnabled()
        self.setUpdatesEnabled(False)  # QProgressBar's own repaint() is skipped…
        super().setValue(value)
        self.setUpdatesEnabled(was)  # …and this schedules an ordinary update
        if was:
            self.update()
