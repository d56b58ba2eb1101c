"""Shared pieces of the GUI tests (pytest-qt, offscreen)."""

from __future__ import annotations

import pytest


@pytest.fixture
def window(qtbot, tmp_path):
    """A main window with its own settings file; closed (workers shut down) at teardown."""
    from PySide6.QtCore import QSettings

    from quantscope.gui.mainwindow import MainWindow

    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    w = MainWindow(settings)
    qtbot.addWidget(w)
    w.resize(1400, 900)
    w.show()
    yield w
    w.close()
    assert not w.runner.running()


def wait_idle(qtbot, w, timeout=60000):
    """Wait until the window's background tasks have all ended."""
    qtbot.waitUntil(lambda: not w.runner.running(), timeout=timeout)
