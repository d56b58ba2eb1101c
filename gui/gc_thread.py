"""Python's cyclic garbage collection on the GUI thread only.

CPython collects reference cycles on whichever thread allocates past the threshold: a worker parsing a file, the
server's model loader. When such a cycle holds the wrapper of a Qt object, PySide deletes the object right there,
off the thread it belongs to; a timer or widget deleted that way leaves the GUI thread's event dispatcher pointing
at freed memory, and the process dies later on the GUI thread, far from the cause. So while the GUI runs, automatic
collection is off and a GUI-thread timer collects instead (pyqtgraph's ``GarbageCollector``, made for exactly this:
each generation past its threshold, once a second). Reference counting, which frees almost everything, is
unaffected.
"""

from __future__ import annotations

import gc

from pyqtgraph.util.garbage_collector import GarbageCollector


class GuiThreadCollector:
    """Between construction (on the GUI thread, a QApplication existing) and :meth:`stop`, cycles are collected on
    the GUI thread only."""

    def __init__(self, interval_s: float = 1.0) -> None:
        self._was_enabled = gc.isenabled()
        self._collector: GarbageCollector | None = GarbageCollector(interval=interval_s)

    def stop(self) -> None:
        """Collect what is left here, on the GUI thread, and give collection back to the interpreter."""
        if self._collector is None:
            return
        self._collector.timer.stop()
        self._collector = None
        gc.collect()
        if self._was_enabled:
            gc.enable()
