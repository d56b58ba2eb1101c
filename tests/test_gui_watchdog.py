"""The event-loop watchdog itself (tests/watchdog.py): it reports a slot that blocks the loop and names it, and it
does not count the test's own synchronous work, an idle loop, or a GUI thread that only waits."""

from __future__ import annotations

import time

from PySide6.QtCore import QTimer

from .watchdog import Watchdog


def _spin(ms: float) -> None:
    end = time.thread_time() + ms / 1000
    while time.thread_time() < end:
        pass


def _busy_slot() -> None:
    _spin(300)


def test_a_busy_slot_is_reported_by_name(qtbot):
    dog = Watchdog()
    dog.start()
    try:
        QTimer.singleShot(0, _busy_slot)
        qtbot.wait(600)
    finally:
        blocks = dog.stop()
    assert len(blocks) == 1
    assert blocks[0].cpu_ms > 150
    assert "_busy_slot" in blocks[0].describe()


def test_the_tests_own_work_and_idle_waits_are_not_blocks(qtbot):
    dog = Watchdog()
    dog.start()
    try:
        _spin(300)  # the test's own synchronous code: not the loop's
        qtbot.wait(300)  # an idle loop
        QTimer.singleShot(0, lambda: time.sleep(0.3))  # a slot that waits burns no CPU (not counted)
        qtbot.wait(500)
        QTimer.singleShot(0, lambda: _spin(40))  # short slots, many of them
        QTimer.singleShot(30, lambda: _spin(40))
        qtbot.wait(200)
    finally:
        blocks = dog.stop()
    assert blocks == []
