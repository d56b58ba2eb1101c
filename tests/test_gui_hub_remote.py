"""A GGUF on the hub opened as a document without a download (``hf://org/repo/file.gguf``; File ▸ Models from the hub
▸ Open without downloading), against the hub that runs here (tests/hubserver.py) with the real ``huggingface_hub``
client in-process: the Overview, Metadata and Tensors from the header alone, the Block inspector fetching exactly the
blocks it shows (the server counts the bytes it serves), the views that need the whole file saying so with Download,
and Download replacing the remote document with the local file. Nothing is timed: each step waits for a state."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import QSettings

from quantscope.core import hub as core_hub
from quantscope.core.gguf import GGUFFile
from quantscope.gui.mainwindow import MainWindow

from .hubserver import HubServer

MiB = 1 << 20
REF = "hf://org/mix-GGUF/mix-Q8_0.gguf"


def mixed_file(path: Path) -> Path:
    """A llama GGUF of about 2.3 MiB: a 2 MiB F32 embedding first, then a Q8_0 and a Q4_0 matrix whose blocks lie past
    the client's first 1 MiB read (each block the inspector shows is a ranged read of its own)."""
    import gguf
    from gguf import GGMLQuantizationType as Q

    w = gguf.GGUFWriter(str(path), "llama")
    for key, v in (("context_length", 256), ("embedding_length", 256), ("block_count", 1),
                   ("attention.head_count", 4), ("attention.head_count_kv", 4)):
        w.add_uint32(f"llama.{key}", v)
    w.add_string("general.name", "mix")
    rng = np.random.default_rng(1)
    w.add_tensor("token_embd.weight", rng.standard_normal((2048, 256), dtype=np.float32))
    for name, q in (("blk.0.attn_q.weight", Q.Q8_0), ("blk.0.ffn_down.weight", Q.Q4_0)):
        w.add_tensor(name, gguf.quants.quantize(rng.standard_normal((256, 256), dtype=np.float32), q),
                     raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("remote")
    mix = mixed_file(d / "mix-Q8_0.gguf")
    hostile = bytearray(mix.read_bytes())
    struct.pack_into("<Q", hostile, 24, 1 << 40)  # the first metadata key claims to be 1 TiB long
    (d / "bad-Q8_0.gguf").write_bytes(hostile)
    from quantscope.core.gguf.split import plan_split, write_plan

    from .arch_fixtures import write_fixture

    q8 = write_fixture("llama", d / "tiny-Q8_0.gguf", quant="Q8_0")
    with GGUFFile(q8) as f:
        shards = write_plan(f, plan_split(f, d / "tiny-Q8_0", max_tensors=8))
    return {"mix": mix, "bad": d / "bad-Q8_0.gguf", **{f"shard{i}": p for i, p in enumerate(shards)}}


@pytest.fixture
def server(files, tmp_path, monkeypatch):
    from huggingface_hub import constants

    s = HubServer()
    s.add_repo("org/mix-GGUF", {"mix-Q8_0.gguf": files["mix"], "bad-Q8_0.gguf": files["bad"]}, downloads=3)
    s.add_repo("org/other-GGUF", {"mix-Q8_0.gguf": files["mix"]}, downloads=1)
    s.add_repo("org/split-GGUF", {files[f"shard{i}"].name: files[f"shard{i}"] for i in range(3)})
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


@pytest.fixture
def window(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user" / ".cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "user" / ".local" / "share"))
    w = MainWindow(QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(w)
    w.resize(1100, 700)
    w.show()
    yield w
    w.confirm_discard = lambda: True  # type: ignore[method-assign]
    w.close()


def _served(server: HubServer, name: str = "mix-Q8_0.gguf") -> int:
    return server.bytes_served("org/mix-GGUF", name)


def _inspect(qtbot, w: MainWindow, tensor: str, row: int, block: int) -> None:
    bv = w.block_view
    w.inspect_block(tensor, row, block, 3)
    qtbot.waitUntil(lambda: bv.decoded is not None and bv.tensor is not None and bv.tensor.name == tensor
                    and bv.row_spin.value() == row and bv.block_spin.value() == block
                    and not (bv.fetch_job and bv.fetch_job.busy), timeout=60000)


def test_a_remote_file_is_a_document_read_one_block_at_a_time(qtbot, server, files, window, tmp_path):
    w = window
    assert w.open_path(REF)  # the read starts; the window goes on
    qtbot.waitUntil(lambda: w.doc is not None and not w.remote_job.busy, timeout=60000)
    doc = w.doc
    assert doc.remote is not None and doc.location == REF and doc.title == "mix-Q8_0.gguf"
    header = doc.remote.fetched
    assert header == MiB < files["mix"].stat().st_size  # one ranged read of the first MiB: the header
    assert _served(server) == header
    # the Overview, Metadata and Tensors from the header alone
    assert w.current_view() == "overview" and w.windowTitle() == "mix-Q8_0.gguf — Quantscope"
    assert w.overview.cards["Architecture"].value.text() == "llama"
    assert "on the hub" in w.overview.scan_label.text() and w.overview.scan_again.isHidden()
    assert w.remote_bar.isVisible() and "read from the hub over range requests" in w.remote_bar.label.text()
    assert w.file_label.full_text().startswith(REF)
    assert w.metadata_view.edits is None and "on the hub" in w.metadata_view.edit_refusal
    tv = w.tensors_view
    assert tv.table_model.rowCount() == 3
    w.show_view("tensors")
    tv.select_tensor("blk.0.attn_q.weight")
    assert "on the hub: Download it" in tv.progress_label.text() and not tv.stats_job.busy
    assert not tv.context_actions("blk.0.attn_q.weight")[2].isEnabled()  # the heatmap: every value
    # the views that run or requantize the model say so, with Download
    for key in ("chat", "probe", "lab", "serve"):
        host = w._hosts[key]
        assert w.tabs.isTabVisible(w._tab[key]) and host.remote_shown, key
        assert "which needs the whole file. Download it to use this view." in host.line.text(), key
    w.show_view("chat")
    assert w._hosts["chat"].download_btn.isVisible() and w.lab_view.doc is None
    assert w.show_quantize() is None and w.remote_box is not None and w.remote_box.isVisible()
    assert "Quantizing reads the whole file" in w.remote_box.text()
    w.remote_box.close()
    assert _served(server) == header  # nothing read for any of that (the inspector is not shown yet)

    # the Block inspector: each block it shows is one ranged read of its bytes, kept once read
    local = GGUFFile(files["mix"])
    try:
        q8, q4 = local.tensor("blk.0.attn_q.weight"), local.tensor("blk.0.ffn_down.weight")
        assert q8.data_offset > MiB and q4.data_offset > MiB  # past the first read
        _inspect(qtbot, w, "blk.0.attn_q.weight", 200, 5)
        assert w.current_view() == "block"
        assert w.block_view.decoded.raw == local.block_bytes(q8, 200, 5)
        assert _served(server) == header + 34  # one Q8_0 block
        _inspect(qtbot, w, "blk.0.ffn_down.weight", 7, 3)
        assert w.block_view.decoded.raw == local.block_bytes(q4, 7, 3)
        assert _served(server) == header + 34 + 18  # and one Q4_0 block
        _inspect(qtbot, w, "blk.0.attn_q.weight", 200, 5)  # shown again: from the cache
        _inspect(qtbot, w, "token_embd.weight", 0, 1)  # in the first read already
        assert _served(server) == header + 34 + 18
        assert doc.remote.gguf.blocks_fetched == 2 and doc.remote.gguf.bytes_fetched == 52
        # (the line as set: ElidedLabel.text() is what fits the status bar, which depends on the window's width)
        line = f"{REF}  ·  on the hub: 1.0 MiB of 2.1 MiB read (the header) + 2 blocks (52 B)"
        assert w.file_label.full_text() == line
    finally:
        local.close()

    # Download: the whole file into the Hugging Face cache, then the local copy is the open document
    w.remote_bar.download_btn.click()
    qtbot.waitUntil(lambda: w.doc is not None and w.doc.remote is None, timeout=60000)
    assert w.doc.path.read_bytes() == files["mix"].read_bytes() and str(tmp_path / "hub") in str(w.doc.path)
    assert not w.remote_bar.isVisible() and not w._hosts["chat"].remote_shown


def test_the_hub_window_opens_a_file_without_a_download(qtbot, server, window, tmp_path):
    w = window
    w.show_hub()
    view = w.hub_view
    assert view is not None
    view.search_box.setText("gguf")
    view.search_btn.click()
    qtbot.waitUntil(lambda: view.repos.rowCount() == len(server.repos) and not view.job.busy, timeout=60000)
    view.repos.selectRow([h.id for h in view.hits].index("org/mix-GGUF"))
    qtbot.waitUntil(lambda: view.files.rowCount() == 2 and not view.job.busy, timeout=60000)
    row = [s.name for s in view.sets].index("mix-Q8_0.gguf")
    view.files.selectRow(row)
    assert view.peek_btn.isEnabled()
    view.peek_btn.click()
    qtbot.waitUntil(lambda: w.doc is not None and not w.remote_job.busy, timeout=60000)
    assert w.doc.remote is not None and w.doc.location == REF
    # the header read for the repository's fit is the one opened: nothing read twice, nothing downloaded
    assert _served(server) == MiB
    assert not (tmp_path / "hub").exists() or not list((tmp_path / "hub").rglob("*.gguf"))


def test_a_hostile_remote_header_is_refused_in_one_line(qtbot, server, window):
    w = window
    assert w.open_path("hf://org/mix-GGUF/bad-Q8_0.gguf")
    qtbot.waitUntil(lambda: w.error_box is not None and w.error_box.isVisible(), timeout=60000)
    assert w.error_box.text() == "hf://org/mix-GGUF/bad-Q8_0.gguf is not a readable GGUF file."
    assert "bytes" in w.error_box.informativeText()
    assert w.doc is None
    assert _served(server, "bad-Q8_0.gguf") <= core_hub.PEEK_FIRST


def test_a_missing_remote_file_is_one_line(qtbot, server, window):
    w = window
    assert w.open_path("hf://org/mix-GGUF/nope-Q8_0.gguf")
    qtbot.waitUntil(lambda: w.error_box is not None and w.error_box.isVisible(), timeout=60000)
    assert w.error_box.text() == "hf://org/mix-GGUF/nope-Q8_0.gguf cannot be read from the hub."
    assert "not in the repository" in w.error_box.informativeText() and w.doc is None


def _shot(server: HubServer, tmp_path: Path, args: list[str], out: Path) -> str:
    import os
    import subprocess
    import sys

    env = server.env(tmp_path / "child-hf", {**os.environ, "HOME": str(tmp_path / "child")})
    env["QT_QPA_PLATFORM"] = "offscreen"
    env.pop("DISPLAY", None)
    r = subprocess.run([sys.executable, "-m", "quantscope.cli", *args, "--screenshot", str(out), "--size", "1100x700",
                        "--theme", "dark"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_the_screenshot_of_a_remote_files_block_reads_the_header_and_one_block(server, files, tmp_path):
    from PySide6.QtGui import QImage

    out = tmp_path / "block.png"
    assert _shot(server, tmp_path, [REF, "--view", "block", "--block", "blk.0.ffn_down.weight:3"], out) \
        == f"wrote {out} (block)\n"
    assert QImage(str(out)).size().toTuple() == (1100, 700)
    assert _served(server) == MiB + 18  # the header, then the one Q4_0 block shown
    assert not (tmp_path / "child-hf" / "hub").exists()  # nothing downloaded


def test_the_hub_screenshot_is_searched_on_the_hub_it_is_given(server, files, tmp_path):
    from PySide6.QtGui import QImage

    out = tmp_path / "hub.png"
    assert _shot(server, tmp_path, [str(files["mix"]), "--view", "hub"], out) == f"wrote {out} (hub)\n"
    assert QImage(str(out)).size().toTuple() == (1100, 700)  # the dialog, at --size
    # searched, the most downloaded repository's files listed (the fit read from its smallest file's header)
    assert ("GET", "/api/models", None) in {(m, p.split("?")[0], x) for m, p, x in server.log}
    assert ("GET", "/api/models/org/mix-GGUF/tree/main", None) in {(m, p, x) for m, p, x in server.log}
    assert _served(server, "bad-Q8_0.gguf") == MiB and _served(server) == 0


def test_a_remote_shard_says_it_is_one_file_of_a_set(qtbot, server, files, window):
    w = window
    first = files["shard0"]
    assert w.open_path(f"hf://org/split-GGUF/{first.name}")
    qtbot.waitUntil(lambda: w.doc is not None and not w.remote_job.busy, timeout=60000)
    with GGUFFile(first, whole_set=False) as f:
        assert w.tensors_view.table_model.rowCount() == len(f.tensors)  # that file's tensors
    assert "It is the first of 3 shards: what is listed is that file's." in w.remote_bar.label.text()
