"""The view contract (issue 47, item 5): one registry of views that the tabs, the View menu, the Ctrl+N shortcuts,
the document hand-over and ``--screenshot --view NAME`` all read."""

from __future__ import annotations

import subprocess
import sys

import pytest
from PySide6.QtGui import QAction

from quantscope.gui.app import SCREENSHOT_VIEWS, build_parser, render_screenshot
from quantscope.gui.views.registry import SHOTS, VIEWS, first_view, shot, view

from .gui_helpers import window  # noqa: F401


def test_the_registry_is_consistent():
    keys = [e.key for e in VIEWS]
    assert len(set(keys)) == len(keys) and len({e.attr for e in VIEWS}) == len(VIEWS)
    assert [e.shortcut for e in VIEWS] == [f"Ctrl+{n}" for n in range(1, len(VIEWS) + 1)]
    assert all(e.label == e.menu.replace("&", "") for e in VIEWS)
    names = [s.name for s in SHOTS]
    assert len(set(names)) == len(names) and names[0] == "overview"
    assert all(s.tab is None or view(s.tab) is not None for s in SHOTS)  # every shot's tab is a registered view
    assert {s.tab for s in SHOTS} >= set(keys)  # and every view has a screenshot
    assert all(s.setup is not None for s in SHOTS if s.tab is None)  # a dialog is opened by its setup
    assert shot("tensors") is not None and shot("nope") is None and view("nope") is None
    assert first_view(None) is None


def test_view_choices_are_the_registry_shots(capsys):
    p = build_parser()
    assert SCREENSHOT_VIEWS == tuple(s.name for s in SHOTS)
    action = next(a for a in p._actions if a.dest == "view")
    assert tuple(action.choices) == SCREENSHOT_VIEWS and action.default == "overview"
    with pytest.raises(SystemExit) as exc:
        p.parse_args(["x.gguf", "--screenshot", "x.png", "--view", "nope"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --view: invalid choice: 'nope'" in err and "'probe-attention'" in err


def test_the_window_is_built_from_the_registry(window):  # noqa: F811
    tabs = window.tabs
    assert [tabs.tabText(i) for i in range(tabs.count())] == [e.label for e in VIEWS] + ["Library"]
    assert list(window._tab) == [e.key for e in VIEWS] + ["welcome"]
    view_menu = next(a.menu() for a in window.menuBar().actions() if a.text() == "&View")
    rows = [(a.objectName(), a.text(), a.shortcut().toString()) for a in view_menu.actions() if not a.isSeparator()]
    assert rows[:len(VIEWS)] == [(f"view-{e.key}", e.menu, e.shortcut) for e in VIEWS]
    for e in VIEWS:  # every registered widget keeps the contract
        assert callable(getattr(e.widget(window), "set_document", None)), e.key
        page = tabs.widget(window._tab[e.key])  # the view, or (it reads the whole file) the page that holds it
        assert page is e.widget(window) or (e.whole_file and page is window._hosts[e.key]
                                            and page.view is e.widget(window)), e.key
    assert window.current_view() == "welcome" and tabs.isTabVisible(window._tab["welcome"])


def test_the_document_reaches_every_view_through_the_registry(window, model_path):  # noqa: F811
    assert window.open_path(model_path("smollm2"))
    doc = window.doc
    tabs = window.tabs
    for e in VIEWS:
        assert tabs.isTabVisible(window._tab[e.key]) == e.accepts(doc) == (e.kind == "gguf"), e.key
    assert not tabs.isTabVisible(window._tab["welcome"]) and window.current_view() == first_view(doc).key == "overview"
    assert window.overview.doc is doc and window.chat_view.doc is doc and window.probe_view.doc is doc
    assert window.block_view.file is doc.gguf and window.bump_view.bump is None
    for e in (e for e in VIEWS if e.accepts(doc)):  # Ctrl+N's action shows the N-th view
        window.findChild(QAction, f"view-{e.key}").trigger()
        assert window.current_view() == e.key
    window.close_document()
    assert window.doc is None and window.current_view() == "welcome"
    assert not any(tabs.isTabVisible(window._tab[e.key]) for e in VIEWS)
    # the views that let go of a closed file did; the others keep theirs until the next GGUF
    assert window.chat_view.doc is None and window.probe_view.doc is None and window.serve_view.doc is None
    assert window.lab_view.doc is None and window.overview.doc is doc


def test_a_screenshot_setup_failure_is_one_line_with_its_code(qapp, window, model_path, tmp_path, capsys):  # noqa: F811
    assert window.open_path(model_path("smollm2"))
    out = tmp_path / "x.png"
    assert render_screenshot(qapp, window, "block", out, (800, 600), block="no.such.weight") == 2
    assert capsys.readouterr().err.strip() == ("quantscope: --block no.such.weight: no such tensor (or block) in "
                                               "the file")
    assert not out.exists() and not window.isVisible()


@pytest.mark.slow
def test_an_unknown_view_is_refused_before_anything_opens(tmp_path):
    r = subprocess.run([sys.executable, "-m", "quantscope.cli", "x.gguf", "--screenshot", str(tmp_path / "x.png"),
                        "--view", "nope"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "argument --view: invalid choice: 'nope'" in r.stderr
