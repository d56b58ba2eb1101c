"""Exports from the views (issue 19, "Export"): a tensor as .npy from the Tensors view (values equal gguf-py's
dequantization, raw equals the file's bytes) in the runner, a block as CSV/JSON from the Block inspector (the JSON is
`dump-block --json`'s), the metadata as JSON and copied values from the Metadata view, every plot as PNG/SVG from its
right-click menu, and a failed export reported without a file left behind."""

from __future__ import annotations

import csv
import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import gguf
import numpy as np
import pytest
from PySide6.QtCore import QPoint
from PySide6.QtGui import QContextMenuEvent, QImage
from PySide6.QtWidgets import QApplication

from quantscope.cli.main import main as cli_main
from quantscope.core.gguf import GGUFFile

from .gui_helpers import wait_idle, window  # noqa: F401


def _gguf_values(path: Path, name: str) -> np.ndarray:
    r = gguf.GGUFReader(str(path))
    t = next(t for t in r.tensors if t.name == name)
    return gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)


def test_tensor_npy_values_and_raw(window, qtbot, model_path, tmp_path):  # noqa: F811
    path = model_path("gemma3")
    assert window.open_path(path)
    tv = window.tensors_view
    name = "blk.0.attn_q.weight"  # Q4_K? whatever the file holds: checked against gguf-py either way
    messages: list[str] = []
    tv.exporter.finished.connect(messages.append)
    out = tmp_path / "values.npy"
    tv.export_tensor(name, raw=False, path=str(out))
    wait_idle(qtbot, window)
    x = np.load(out)
    want = _gguf_values(path, name)
    assert x.dtype == np.float32 and x.shape == want.shape and np.array_equal(x, want)
    raw = tmp_path / "raw.npy"
    tv.export_tensor(name, raw=True, path=str(raw))
    wait_idle(qtbot, window)
    with GGUFFile(path) as f:
        t = f.tensor(name)
        assert np.load(raw).tobytes() == bytes(f.tensor_bytes(t))
    assert any(str(out) in m for m in messages) and any(str(raw) in m for m in messages)
    # the status bar shows the last one
    assert str(raw) in window.statusBar().currentMessage()


def test_failed_export_is_reported_and_leaves_nothing(window, qtbot, model_path, tmp_path):  # noqa: F811
    assert window.open_path(model_path("gemma3"))
    errors: list[str] = []
    window.tensors_view.exporter.failed.connect(errors.append)
    target = tmp_path / "out"
    target.mkdir()
    window.tensors_view.export_tensor("blk.0.attn_q.weight", raw=False, path=str(target) + "/")
    wait_idle(qtbot, window)
    assert errors and "not a file name" in errors[0]
    assert window.error_box is not None and "Export failed" in window.error_box.text()
    window.error_box.close()
    assert list(target.iterdir()) == []


def test_block_export_csv_and_json(window, qtbot, model_path, tmp_path):  # noqa: F811
    path = model_path("gemma3")
    assert window.open_path(path)
    bv = window.block_view
    name = bv.default_tensor(window.doc.gguf)
    window.inspect_block(name, 3, 1, 0)
    names = [a.text() for a in bv.block_actions()]
    assert names == ["Copy values", "Copy bytes as hex", "Export block as CSV…", "Export block as JSON…"]
    js = tmp_path / "b.json"
    bv.export_block("json", str(js))
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert cli_main(["dump-block", str(path), name, "--row", "3", "--block", "1", "--json"]) == 0
    assert json.loads(js.read_text()) == json.loads(buf.getvalue())
    cs = tmp_path / "b.csv"
    bv.export_block("csv", str(cs))
    rows = list(csv.DictReader(cs.open()))
    vals = [float(r["value"]) for r in rows if r["section"] == "element" and r["name"] == "value"]
    assert len(vals) == len(bv.values) and np.array_equal(np.float32(vals), bv.values)
    bv.copy_values()
    assert [float(v) for v in QApplication.clipboard().text().split()] == [float(v) for v in bv.values]
    bv.copy_hex()
    assert bytes.fromhex(QApplication.clipboard().text()) == bytes(bv.decoded.raw)


def test_metadata_row_menu_and_json_export(window, qtbot, model_path, tmp_path):  # noqa: F811
    path = model_path("smollm2")
    assert window.open_path(path)
    mv = window.metadata_view
    copy_key, copy_value, copy_kv, export_all = mv.row_actions("general.architecture")
    copy_value.trigger()
    assert QApplication.clipboard().text() == "llama"
    copy_kv.trigger()
    assert QApplication.clipboard().text() == "general.architecture = llama"
    copy_key.trigger()
    assert QApplication.clipboard().text() == "general.architecture"
    # an array is copied as JSON; one longer than COPY_MAX_ELEMENTS is not (export it instead)
    _, merges, _, _ = mv.row_actions("tokenizer.ggml.merges")
    merges.trigger()
    r = gguf.GGUFReader(str(path))
    field = r.fields["tokenizer.ggml.merges"]
    assert json.loads(QApplication.clipboard().text()) == [bytes(field.parts[i]).decode() for i in field.data]
    mv.COPY_MAX_ELEMENTS = 1000
    _, merges, _, _ = mv.row_actions("tokenizer.ggml.merges")
    assert not merges.isEnabled()
    assert export_all.isEnabled() and export_all.text() == "Export all metadata as JSON…"
    out = tmp_path / "m.json"
    mv.export_metadata(str(out))
    wait_idle(qtbot, window)
    d = json.loads(out.read_text())
    assert d["metadata"]["general.architecture"] == {"type": "STRING", "value": "llama"}
    toks = r.fields["tokenizer.ggml.tokens"]
    assert d["metadata"]["tokenizer.ggml.tokens"]["value"][:5] == [
        bytes(toks.parts[i]).decode() for i in toks.data[:5]]
    assert len(d["tensors"]) == len(r.tensors)
    # right click on a row opens the menu with the row's key
    mv.select_key("general.name")
    idx = mv.table.currentIndex()
    mv._context_menu(mv.table.visualRect(idx).center())
    assert mv.context_menu.accessibleName() == "Actions for general.name"
    mv.context_menu.close()


@pytest.mark.parametrize("fmt", ["png", "svg"])
def test_plots_save_from_their_menu(window, qtbot, model_path, tmp_path, fmt):  # noqa: F811
    assert window.open_path(model_path("gemma3"))
    wait_idle(qtbot, window)
    plots = {"types": (window.overview.exporter, window.overview.types_plot),
             "hist": (window.tensors_view.exporter, window.tensors_view.hist),
             "block": (window.block_view.exporter, window.block_view.plot)}
    window.show_view("tensors")
    window.tensors_view.select_tensor("blk.0.attn_q.weight")
    wait_idle(qtbot, window)
    for key, (ex, view) in plots.items():
        out = tmp_path / f"{key}.{fmt}"
        assert ex.plot(view, fmt=fmt, path=str(out)) == out
        data = out.read_bytes()
        if fmt == "png":
            img = QImage(str(out))
            assert not img.isNull() and img.width() >= view.width()
        else:
            assert b"<svg" in data[:400]
    # the right-click menu: the plot's actions, after the tensor's exports on the Tensors view's plots
    window.show_view("tensors")
    hist = window.tensors_view.hist
    QApplication.sendEvent(hist.viewport(), QContextMenuEvent(QContextMenuEvent.Reason.Mouse, QPoint(20, 20),
                                                              hist.viewport().mapToGlobal(QPoint(20, 20))))
    menu = hist.property("lastMenu")
    texts = [a.text() for a in menu.actions() if not a.isSeparator()]
    assert texts == ["Export values as .npy (float32)…", "Export raw blocks as .npy…", "Save plot as PNG…",
                     "Save plot as SVG…", "Copy plot image"]
    menu.close()


def test_a_shard_opens_the_whole_set(window, qtbot, tmp_path):  # noqa: F811
    """Opening the third file of a llama-gguf-split set shows the model: every tensor, the block of one in the last
    file, and the set's files under the size; a set with a missing file is refused with its name."""
    import shutil

    src = Path(__file__).parent / "data" / "shards"
    for p in src.glob("small-0000*-of-00004.gguf"):
        shutil.copy(p, tmp_path / p.name)
    assert window.open_path(tmp_path / "small-00003-of-00004.gguf")
    wait_idle(qtbot, window)
    f = window.doc.gguf
    with GGUFFile(src / "small.gguf") as whole:
        assert [t.name for t in f.tensors] == [t.name for t in whole.tensors]
        last = f.tensors[-1]
        assert last.shard == 3
        window.inspect_block(last.name, 0, 0, 0)
        b = window.block_view.decoded
        assert b is not None and bytes(b.raw) == bytes(whole.tensor_bytes(whole.tensor(last.name)))[: len(b.raw)]
    card = window.overview.cards["Size"]
    assert card.sub.text().endswith("in 4 files")
    assert card.toolTip().count("\n") == 3 and "small-00004-of-00004.gguf" in card.toolTip()
    # the metadata of a set is not edited as a set: the toolbar says why
    assert window.metadata_view.edits is None and not window.metadata_view.actions_["edit"].isEnabled()
    assert "split" in window.metadata_view.dirty_label.text()
    window.close_document()
    (tmp_path / "small-00002-of-00004.gguf").unlink()
    assert not window.open_path(tmp_path / "small-00003-of-00004.gguf")
    assert "small-00002-of-00004.gguf" in window.error_box.text() + window.error_box.informativeText()
    window.error_box.close()
