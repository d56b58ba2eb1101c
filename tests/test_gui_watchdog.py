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


def test_a_slot_over_the_limit_fails_the_test_and_one_over_the_aim_warns(tmp_path):
    """The hook itself (conftest → watch()), in a pytest of its own: a slot over FAIL_MS fails the test that ran
    it, naming the slot; one over BLOCK_MS only warns."""
    import os
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    (tmp_path / "conftest.py").write_text(textwrap.dedent("""
        import pytest
        from tests.watchdog import watch

        @pytest.hookimpl(wrapper=True)
        def pytest_runtest_call(item):
            return (yield from watch(item))
    """))
    (tmp_path / "test_blocks.py").write_text(textwrap.dedent("""
        import time
        from PySide6.QtCore import QTimer
        from tests.watchdog import BLOCK_MS, FAIL_MS

        def spin(ms):
            end = time.thread_time() + ms / 1000
            while time.thread_time() < end:
                pass

        def long_slot():
            spin(FAIL_MS + 150)

        def short_slot():
            spin(BLOCK_MS + 60)

        def test_long(qtbot):
            QTimer.singleShot(0, long_slot)
            qtbot.wait(int(FAIL_MS) + 600)

        def test_short(qtbot):
            QTimer.singleShot(0, short_slot)
            qtbot.wait(int(BLOCK_MS) + 500)
    """))
    root = str(Path(__file__).parent.parent)
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("QUANTSCOPE_WATCHDOG_SURVEY", None)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "default",
                        "--rootdir", str(tmp_path), str(tmp_path)], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path, env=env)
    out = r.stdout + r.stderr
    assert "1 failed, 1 passed" in out, out[-3000:]
    assert "the Qt event loop was blocked" in out and "long_slot" in out
    assert "LoopBlocked" in out and "short_slot" in out
