"""Cycles are collected on the GUI thread only (gui/gc_thread.py), in the app and in every GUI test: a worker that
allocates heavily must never be the thread that finalizes a Qt object's wrapper (PySide would delete the object off
its thread; CI once died of a segfault on the GUI thread while the Serve tab's loader parsed a file)."""

from __future__ import annotations

import gc
import threading

from PySide6.QtCore import QObject


class Holder(QObject):
    """A Qt object in a reference cycle; its finalizer records the thread it ran on."""

    def __init__(self, seen: list[int]) -> None:
        super().__init__()
        self.me = self
        self.seen = seen

    def __del__(self) -> None:
        self.seen.append(threading.get_ident())


def churn(stop: threading.Event) -> None:
    """What a loader does: allocate container objects (each counts toward a collection) until told to stop."""
    while not stop.is_set():
        junk = [[i] for i in range(2000)]
        del junk


def test_a_cycle_left_while_a_worker_allocates_is_collected_on_the_gui_thread(qtbot):
    assert not gc.isenabled()  # no automatic collection, on any thread, while a GUI test runs
    seen: list[int] = []
    stop = threading.Event()
    worker = threading.Thread(target=churn, args=(stop,), name="churn", daemon=True)
    worker.start()
    try:
        for _ in range(5):
            Holder(seen)  # garbage at once: only a collection finds it
        qtbot.waitUntil(lambda: len(seen) == 5, timeout=30000)  # the GUI-thread timer collects it
    finally:
        stop.set()
        worker.join()
    assert set(seen) == {threading.main_thread().ident}


def test_collection_is_given_back_after_a_gui_test():
    assert gc.isenabled()  # a test without qtbot: the interpreter's own collection, as outside the GUI
