"""Every Python method Qt calls back is guarded (issue 33 item 6): an exception in an override (showEvent, paint,
data(), an event filter…) reaches the app's error dialog instead of unwinding into Qt, which killed PySide 6.11
(exit 139: a conversation with a non-numeric date crashed every start once Chat was shown)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys
import textwrap

import pytest

import quantscope.gui
from quantscope.gui.guard import _qt_bases_define, is_callback, qt_guarded


def gui_classes() -> list[type]:
    """Every class defined in the gui package (module level and nested in classes) with a Qt base."""
    out: list[type] = []
    for info in pkgutil.walk_packages(quantscope.gui.__path__, "quantscope.gui."):
        mod = importlib.import_module(info.name)
        todo = [v for v in vars(mod).values() if inspect.isclass(v) and v.__module__ == mod.__name__]
        while todo:
            cls = todo.pop()
            out.append(cls)
            todo += [v for v in vars(cls).values() if inspect.isclass(v) and v.__module__ == mod.__name__]
    return out


def overrides() -> list[tuple[type, str]]:
    return [(cls, name) for cls in gui_classes() for name, fn in vars(cls).items()
            if callable(fn) and not inspect.isclass(fn) and is_callback(name) and _qt_bases_define(cls, name)]


def test_every_override_of_a_qt_callback_in_the_gui_package_is_guarded():
    found = overrides()
    assert len(found) > 100  # the scan sees the package (showEvent, paint, data, eventFilter… of ~80 classes)
    names = {n for _, n in found}
    assert {"showEvent", "paintEvent", "resizeEvent", "eventFilter", "keyPressEvent", "closeEvent",
            "data", "rowCount", "paint", "filterAcceptsRow"} <= names
    bare = [f"{c.__module__}.{c.__qualname__}.{n}" for c, n in found if not getattr(vars(c)[n], "qt_guarded", False)]
    assert bare == [], "Qt overrides without @qt_guarded (gui/guard.py): " + ", ".join(bare)


def test_each_guarded_override_reports_its_exception_and_returns(monkeypatch):
    seen: list[BaseException] = []
    monkeypatch.setattr(sys, "excepthook", lambda _t, exc, _tb: seen.append(exc))
    found = overrides()
    for i, (cls, name) in enumerate(found):
        wrapper = vars(cls)[name]

        def boom(*_a, _i=i, _n=name, **_k):  # type: ignore[no-untyped-def]
            raise ValueError(f"override {_i} ({_n}) failed")

        monkeypatch.setattr(wrapper, "qt_original", boom)
        wrapper(object(), *([None] * 2))  # never raises: reported, and Qt gets a neutral value
        assert seen and str(seen[-1]) == f"override {i} ({name}) failed", f"{cls.__qualname__}.{name}"
    assert len(seen) == len(found)


def test_a_neutral_value_where_the_base_has_none(qtbot, monkeypatch):
    from PySide6.QtCore import QAbstractTableModel, QModelIndex

    @qt_guarded
    class Broken(QAbstractTableModel):
        def rowCount(self, parent=None):  # type: ignore[no-untyped-def]
            raise ValueError("rows")

        def columnCount(self, parent=None):  # type: ignore[no-untyped-def]
            return 2

        def data(self, index, role=0):  # type: ignore[no-untyped-def]
            raise ValueError("cell")

    seen: list[str] = []
    monkeypatch.setattr(sys, "excepthook", lambda _t, exc, _tb: seen.append(str(exc)))
    m = Broken()
    assert m.rowCount() == 0 and m.rowCount() == 0 and m.data(QModelIndex()) is None
    assert seen == ["rows", "cell"]  # (the same error again within a second is reported once)


SCRIPT = textwrap.dedent("""
    import os, sys
    os.environ["QT_QPA_PLATFORM"] = "offscreen"
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication
    app = QApplication([])
    from quantscope.gui.app import install_excepthook
    from quantscope.gui.mainwindow import MainWindow
    from quantscope.gui.views.chat_persist import Conversations

    import inspect
    real = Conversations.refresh

    def broken(self):  # what a conversation with a text 'created' did, in showEvent
        if inspect.stack()[1].function == "showEvent":
            raise ValueError("could not convert string to float: 'yesterday'")
        return real(self)

    Conversations.refresh = broken
    win = MainWindow(QSettings(sys.argv[2], QSettings.Format.IniFormat))
    install_excepthook(win)
    win.show()
    assert win.open_path(sys.argv[1])
    win.show_view("chat")
    for _ in range(20):
        app.processEvents()
    print("ERROR BOX:", win.error_box.text() if win.error_box else None)
    win.show_view("overview")
    for _ in range(5):
        app.processEvents()
    print("STILL RUNNING")
    win.close()
""")


def test_an_exception_in_show_event_reaches_the_error_dialog_and_the_app_lives(tmp_path, model_path):
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(model_path("smollm2")), str(tmp_path / "s.ini")],
                       capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "QUANTSCOPE_DATA": str(tmp_path / "data")})
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert "ERROR BOX: Unexpected error: ValueError: could not convert string to float" in r.stdout
    assert "STILL RUNNING" in r.stdout


@pytest.mark.parametrize("name", ["showEvent", "paint", "data", "eventFilter"])
def test_callback_names(name):
    assert is_callback(name)
