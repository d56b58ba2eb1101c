"""The library view (gui/views/library.py), the window's start page: the models of real stores laid out in a home
folder of the test's, scanned in a worker, filtered, and a row opened in the app, the chat or the quantize dialog."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from quantscope.gui.views.library import LibraryView

from .arch_fixtures import vocabulary, write_fixture
from .gui_helpers import window  # noqa: F401
from .test_library import ollama_store


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_fixture("llama", tmp_path_factory.mktemp("glib") / "llama.gguf", vocab=vocabulary())


@pytest.fixture
def stores(tmp_path, monkeypatch, tiny) -> Path:
    home = tmp_path / "home"
    for var in ("HF_HUB_CACHE", "HF_HOME", "OLLAMA_MODELS", "LLAMA_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    ollama_store(home / ".ollama" / "models", "tiny", "q8", tiny)
    lm = home / ".lmstudio" / "models" / "someone" / "Tiny-GGUF"
    lm.mkdir(parents=True)
    shutil.copyfile(tiny, lm / "tiny.gguf")
    (lm / "broken.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")
    return home


def _scanned(qtbot, view: LibraryView, n: int) -> None:
    qtbot.waitUntil(lambda: not view.job.busy and view.model.rowCount() == n, timeout=30000)


def test_the_scan_lists_filters_and_acts_on_rows(qtbot, stores):
    view = LibraryView()
    qtbot.addWidget(view)
    view.resize(1100, 600)
    view.show()  # the first show scans
    _scanned(qtbot, view, 3)
    names = {view.model.rows[i].name: view.model.rows[i] for i in range(3)}
    assert set(names) == {"tiny:q8", "someone/Tiny-GGUF/tiny.gguf", "someone/Tiny-GGUF/broken.gguf"}
    assert "3 models" in view.strip.status.text()
    text = [view.proxy.index(r, c).data() for r in range(view.proxy.rowCount()) for c in range(3)]
    assert "Ollama" in text and "LM Studio" in text and "llama" in text
    assert not any(b.isEnabled() for b in view.action_btns.values())  # nothing selected
    view.filter.setText("ollama")
    assert view.proxy.rowCount() == 1
    view.table.selectRow(0)
    assert all(b.isEnabled() for b in view.action_btns.values())
    with qtbot.waitSignal(view.actionRequested) as sig:
        view.action_btns["chat"].click()
    assert sig.args == [names["tiny:q8"].path, "chat"]
    view.filter.setText("broken")
    view.table.selectRow(0)
    assert view.selected().problem and not view.action_btns["open"].isEnabled()  # an unreadable header
    view.shutdown()


def test_nothing_found_says_where_it_looked(qtbot, tmp_path, monkeypatch):
    home = tmp_path / "empty"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    for var in ("HF_HUB_CACHE", "HF_HOME", "OLLAMA_MODELS", "LLAMA_CACHE"):
        monkeypatch.delenv(var, raising=False)
    view = LibraryView()
    qtbot.addWidget(view)
    view.show()
    qtbot.waitUntil(lambda: view.scanned and not view.job.busy and view.empty.isVisible(), timeout=30000)
    assert "No GGUF found" in view.empty.text() and ".ollama" in view.empty.text()
    view.shutdown()


def test_the_window_starts_on_the_library_and_opens_a_row_in_the_chat(qtbot, stores, window):  # noqa: F811
    lib = window.library_view
    assert window.current_view() == "welcome" and window.tabs.tabText(window._tab["welcome"]) == "Library"
    _scanned(qtbot, lib, 3)
    row = next(e for e in lib.model.rows if e.name == "tiny:q8")
    window.library_action(row.path, "chat")
    assert window.doc is not None and str(window.doc.path) == row.path and window.current_view() == "chat"
    assert not window.tabs.isTabVisible(window._tab["welcome"])
    window.show_library()  # View ▸ Library, with the file still open
    assert window.current_view() == "welcome" and window.doc is not None
