"""The hub view (gui/views/hub.py) against the hub that runs here (tests/hubserver.py): search, a repository's
files with their fit, Download into a Hugging Face cache of the test's, and Cancel at an exact point of the
transfer. The real ``huggingface_hub`` client runs in-process: it reads HF_ENDPOINT and the cache folder at import,
so the test sets the same values on ``huggingface_hub.constants`` (which every call reads)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from quantscope.gui.views.hub import HubView

from .gui_helpers import cancel_when
from .hubserver import HubServer
from .test_hub import _big

MiB = 1 << 20


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    from .arch_fixtures import write_fixture

    d = tmp_path_factory.mktemp("guihub")
    return {"q8": write_fixture("llama", d / "tiny-Q8_0.gguf", quant="Q8_0"),
            "f16": write_fixture("llama", d / "tiny-F16.gguf", quant="F16"), "big": _big(d / "big-F32.gguf")}


@pytest.fixture
def server(files, tmp_path, monkeypatch):
    from huggingface_hub import constants

    s = HubServer()
    s.add_repo("org/tiny-GGUF", {"tiny-Q8_0.gguf": files["q8"], "tiny-F16.gguf": files["f16"]}, downloads=9)
    s.add_repo("org/big-GGUF", {"big-F32.gguf": files["big"]}, downloads=1)
    with s:
        for var in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("HF_HOME", str(tmp_path))
        monkeypatch.setattr(constants, "ENDPOINT", s.url)
        template = s.url + "/{repo_id}/resolve/{revision}/{filename}"
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_IMPLICIT_TOKEN", True)
        yield s


def _view(qtbot) -> HubView:
    view = HubView()
    qtbot.addWidget(view)
    view.resize(1100, 700)
    view.show()
    return view


def _open_repo(qtbot, view: HubView, name: str, rows: int) -> None:
    view.search_box.setText("gguf")
    view.search_btn.click()
    qtbot.waitUntil(lambda: view.repos.rowCount() == 2 and not view.job.busy, timeout=60000)
    row = [h.id for h in view.hits].index(name)
    view.repos.selectRow(row)
    qtbot.waitUntil(lambda: view.files.rowCount() == rows and not view.job.busy, timeout=60000)


def test_search_files_and_download(qtbot, server, files, tmp_path):
    view = _view(qtbot)
    try:
        _open_repo(qtbot, view, "org/tiny-GGUF", 2)
        assert [view.repos.item(i, 0).text() for i in range(2)] == ["org/tiny-GGUF", "org/big-GGUF"]
        assert [view.files.item(i, 0).text() for i in range(2)] == ["Q8_0", "F16"]
        assert view.files.item(0, 3).text() in ("fits", "tight", "too large")
        assert "KV cache at 4,096 tokens" in view.files_label.text()
        assert not view.strip.run_btn.isEnabled()  # nothing chosen yet
        view.files.selectRow(0)
        assert view.strip.run_btn.isEnabled()
        with qtbot.waitSignal(view.downloaded, timeout=60000) as sig:
            view.strip.run_btn.click()
        path = Path(sig.args[0])
        assert path.read_bytes() == files["q8"].read_bytes() and str(tmp_path / "hub") in str(path)
        assert view.strip.status.text() == "Downloaded tiny-Q8_0.gguf into the Hugging Face cache."
        assert view.strip.status.toolTip() == str(path)
        shot = os.environ.get("QUANTSCOPE_HUB_SHOT")  # a look at the view: QUANTSCOPE_HUB_SHOT=/tmp/hub.png
        if shot:
            view.grab().save(shot)
    finally:
        view.shutdown()


def test_open_without_downloading_hands_the_window_the_header_read_for_the_fit(qtbot, server, files, tmp_path):
    view = _view(qtbot)
    try:
        _open_repo(qtbot, view, "org/big-GGUF", 1)
        assert not view.peek_btn.isEnabled()
        view.files.selectRow(0)
        ref = "hf://org/big-GGUF/big-F32.gguf"
        with qtbot.waitSignal(view.openRequested, timeout=60000) as sig:
            view.peek_btn.click()
        assert sig.args == [ref]
        p = view.known_peek(ref)  # the header the fit read: the window opens it without reading it again
        assert p is not None and p.ref == ref and p.fetched == 1 << 20 and p.size == files["big"].stat().st_size
        assert p.gguf.has_tensor("token_embd.weight") and view.known_peek(ref) is None  # handed over once
        assert server.bytes_served("org/big-GGUF", "big-F32.gguf") == 1 << 20
        assert not (tmp_path / "hub").exists() or not list((tmp_path / "hub").rglob("*.gguf"))
    finally:
        view.shutdown()


def test_cancel_leaves_nothing(qtbot, server, tmp_path):
    view = _view(qtbot)
    try:
        _open_repo(qtbot, view, "org/big-GGUF", 1)
        view.files.selectRow(0)
        # cancelled at the client's first 10 MiB piece: the next piece stops the transfer
        with cancel_when(view.runner, "hub-download", lambda d, _t, _x: d > 0):
            view.strip.run_btn.click()
            qtbot.waitUntil(lambda: not view.download_job.busy, timeout=60000)
        assert view.strip.status.text() == "Download cancelled; nothing was kept."
        left = [p for p in (tmp_path / "hub").rglob("*") if p.is_file() or p.is_symlink()]
        assert not [p for p in left if "blobs" in p.parts or p.name.endswith((".gguf", ".incomplete"))], left
    finally:
        view.shutdown()


def test_the_window_opens_a_download(qtbot, server, files, tmp_path, monkeypatch):
    from PySide6.QtCore import QSettings

    from quantscope.gui.mainwindow import MainWindow

    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user" / ".cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "user" / ".local" / "share"))
    w = MainWindow(QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(w)
    w.show()
    try:
        w.findChild(type(w.open_action), "hub").trigger()  # File ▸ Models from the hub…
        view = w.hub_view
        assert view is not None and w.hub_dialog is not None and w.hub_dialog.isVisible()
        _open_repo(qtbot, view, "org/tiny-GGUF", 2)
        view.files.selectRow(1)
        view.strip.run_btn.click()
        qtbot.waitUntil(lambda: w.doc is not None, timeout=60000)
        assert w.doc.path.name == "tiny-F16.gguf" and w.doc.gguf is not None
    finally:
        w.confirm_discard = lambda: True
        w.close()
