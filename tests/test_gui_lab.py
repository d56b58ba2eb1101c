"""The Quant lab tab (issue 18, "see what a type loses"): a tensor requantized into every type that fits in a worker,
the table and the plot hold the core's figures, the heatmap's worst block is an injected outlier, a click shows the
block before and after (its bytes decoded), cancel stops, the window keeps answering, the whole-file table fills and
exports, a reference file and an imatrix change the figures as the core says, and the screenshots render."""

from __future__ import annotations

import csv
import json
import math
import threading
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import QPointF, Qt, QTimer
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QApplication, QFileDialog

from quantscope.core.fsutil import PathRefused, json_text
from quantscope.core.gguf import GGUFFile
from quantscope.core.quant import decode_block, lab
from quantscope.core.quant.imatrix import read_imatrix
from quantscope.core.quant.quantize import QuantizeOptions, quantize_file
from quantscope.gui.views.quant_lab import FILE_TASK, TENSOR_TASK

from . import quantize_models
from .gui_helpers import fit_problems, hold_when, wait_idle, window  # noqa: F401

DATA = Path(__file__).parent / "data" / "quantize"
OUTLIER = ("blk.1.attn_q.weight", 37, 200, 6.0)  # tensor, row, column, value written over the random weight


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("gui-lab")
    quantize_models.write_model("llama", d / "llama.gguf")  # F32, rows of 256 and 512: every type fits
    quantize_models.write_model("qwen2", d / "qwen2.gguf")  # F16, ffn_down rows of 544: 32-blocks only
    # the llama model with one value made huge: its block is the worst of every type
    out = d / "outlier.gguf"
    out.write_bytes((d / "llama.gguf").read_bytes())
    name, row, col, value = OUTLIER
    with GGUFFile(out) as f:
        t = f.tensor(name)
        assert t.type_name == "F32"
        pos = t.data_offset + 4 * (row * t.ne[0] + col)
    with open(out, "r+b") as fh:
        fh.seek(pos)
        fh.write(np.float32(value).tobytes())
    quantize_file(d / "llama.gguf", d / "llama-Q8_0.gguf", QuantizeOptions("Q8_0"))
    return d


def _values(path: Path, name: str, **kw: object) -> np.ndarray:
    with GGUFFile(path) as f:
        ref = kw.pop("reference", None)
        if ref is not None:
            with GGUFFile(ref) as r:  # type: ignore[arg-type]
                return lab.tensor_values(f, name, reference=r, **kw)  # type: ignore[arg-type]
        return lab.tensor_values(f, name, **kw)  # type: ignore[arg-type]


def _run(qtbot, page, timeout: int = 120000) -> None:
    qtbot.waitUntil(lambda: page.state in ("done", "failed", "cancelled"), timeout=timeout)
    assert page.state == "done", page.error


def _table(page) -> dict[str, dict[str, str]]:
    """The Requantize table as {type: {column key: text}}."""
    m = page.model
    return {r.stats.type: {k: m.index(i, c).data() for c, k in enumerate(m.keys)} for i, r in enumerate(m.rows)}


def _same_figures(page, want: list[lab.ErrorStats]) -> None:
    from quantscope.gui.views.quant_lab_table import metric_text

    rows = _table(page)
    assert list(rows) == [e.type for e in want]
    for e in want:
        for key in ("rmse", "max_abs", "snr_db", "cosine"):
            assert rows[e.type][key] == metric_text(key, getattr(e, key)), (e.type, key)
        assert rows[e.type]["bpw"] == metric_text("bpw", e.bits_per_weight)
    for e, got in zip(want, page.run.errors, strict=True):
        assert got.rmse == e.rmse and got.max_abs == e.max_abs and got.weighted_rmse == e.weighted_rmse
        np.testing.assert_array_equal(got.block_rmse, e.block_rmse)


def test_requantize_fills_the_table_and_the_plot_for_every_type_that_fits(window, qtbot, models):  # noqa: F811
    assert window.open_path(models / "llama.gguf")
    window.show_view("lab")
    lv, page = window.lab_view, window.lab_view.tensor_page
    name = "blk.0.ffn_down.weight"  # rows of 512: every candidate type fits
    assert lv.open_tensor(name)
    _run(qtbot, page)
    want = lab.requantize_errors(_values(models / "llama.gguf", name, max_rows=1024), lab.CANDIDATE_TYPES,
                                 blocks=True)
    assert len(want) == len(lab.CANDIDATE_TYPES)
    _same_figures(page, want)
    assert not page.note.isVisible()
    assert "all 256 rows" in page.status.full_text() and "17 types" in page.status.full_text()
    # the plot: a labelled point per type at (log10 bpw, log10 RMSE)
    plot = page.plot
    assert sorted(plot.label_texts()) == sorted(e.type for e in want)  # F32 is no candidate: no "this file"
    assert len(plot.points.data) == len(want)
    for e in want:
        x, y = plot.positions[e.type]
        assert x == pytest.approx(math.log10(e.bits_per_weight)) and y == pytest.approx(math.log10(e.rmse))
    # labels sit inside the plot, and (almost all) clear of each other
    qtbot.wait(50)
    plot.place_labels()
    area = plot.getPlotItem().vb.sceneBoundingRect()
    rects = plot.label_rects()
    assert all(area.adjusted(-2, -2, 2, 2).contains(r) for r in rects.values()), rects
    overlaps = [(a, b) for a in rects for b in rects if a < b and rects[a].intersects(rects[b])]
    assert len(overlaps) <= 2, overlaps
    # another metric or another selected type updates the labels in place (no TextItem made anew each time)
    items = {t.data(0): t for t in plot.labels}
    plot.set_selected("Q8_0")
    assert {t.data(0): t for t in plot.labels} == items
    assert items["Q8_0"].textItem.font().bold() and not items["Q4_0"].textItem.font().bold()
    # another metric: SNR (linear); the table sorts by number
    page.metric.setCurrentIndex(page.metric.findData("snr_db"))
    assert all(a is b for a, b in zip(sorted(plot.labels, key=lambda t: t.data(0)),
                                      sorted(items.values(), key=lambda t: t.data(0)), strict=True))
    e = next(e for e in want if e.type == "Q8_0")
    assert plot.positions["Q8_0"][1] == pytest.approx(e.snr_db)
    col = page.model.column("rmse")
    page.table.sortByColumn(col, Qt.SortOrder.DescendingOrder)
    shown = [page.proxy.index(r, 0).data() for r in range(page.proxy.rowCount())]
    assert shown == [e.type for e in sorted(want, key=lambda e: -e.rmse)]
    # nothing is cut off at a small window
    window.resize(1100, 700)
    qtbot.wait(80)
    assert fit_problems(window.lab_view) == []


def test_types_that_do_not_fit_are_named_not_measured(window, qtbot, models):  # noqa: F811
    assert window.open_path(models / "qwen2.gguf")
    window.show_view("lab")
    page = window.lab_view.tensor_page
    name = "blk.0.ffn_down.weight"  # rows of 544 = 17 blocks of 32, no block of 256
    assert window.lab_view.open_tensor(name)
    _run(qtbot, page)
    fit = [q for q in lab.CANDIDATE_TYPES if lab.fits(q, 544)]
    assert set(fit) == {"MXFP4", "Q4_0", "IQ4_NL", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "F16", "BF16"}
    _same_figures(page, lab.requantize_errors(_values(models / "qwen2.gguf", name), fit, blocks=True))
    assert page.note.isVisible() and "Q4_K" in page.note.text() and "rows of 544" in page.note.text()
    # the file's type F16 round-trips exactly: ringed, labelled, drawn on the floor line below the others
    assert _table(page)["F16"]["rmse"] == "0 (exact)" and _table(page)["F16"]["snr_db"] == "∞"
    assert "F16 · exact · this file" in page.plot.label_texts()
    assert page.plot.positions["F16"][1] < min(y for q, (_x, y) in page.plot.positions.items() if q != "F16")
    assert len(page.plot.rings.data) == 1
    # the heatmap starts on the nearest type that loses something, not on the exact one
    assert page.selected == "BF16" and page.heatmap.qtype == "BF16"


def test_the_worst_block_is_the_outlier_and_a_click_shows_it_before_and_after(window, qtbot, models):  # noqa: F811
    name, orow, ocol, _value = OUTLIER
    assert window.open_path(models / "outlier.gguf")
    window.show_view("lab")
    lv, page = window.lab_view, window.lab_view.tensor_page
    assert lv.open_tensor(name, "Q4_0")
    _run(qtbot, page)
    values = _values(models / "outlier.gguf", name)
    assert page.selected == "Q4_0"
    assert page.table.currentIndex().siblingAtColumn(0).data() == "Q4_0"
    e = lab.error_stats(values, "Q4_0", blocks=True)
    hm = page.heatmap
    np.testing.assert_array_equal(hm.block_rmse, e.block_rmse)
    np.testing.assert_array_equal(hm.image.image, e.block_rmse.T)  # rows along x, blocks along y
    assert lab.worst_block(hm.block_rmse)[:2] == (orow, ocol // 32)
    assert (hm.worst_marker.data["x"][0], hm.worst_marker.data["y"][0]) == (orow + 0.5, ocol // 32 + 0.5)
    # the worst block is shown at once: the outlier and what Q4_0 made of it
    cmp_ = page.compare
    assert (cmp_.pair.row, cmp_.pair.block) == (orow, ocol // 32) and page.block == (orow, ocol // 32)
    assert cmp_.pair.original[ocol % 32] == np.float32(OUTLIER[3])
    # hover and a real click on another block of the heatmap
    vb = hm.plot.vb
    qtbot.wait(50)
    scene = vb.mapViewToScene(QPointF(5 + 0.5, 2 + 0.5))
    hm.plot.scene().sigMouseMoved.emit(scene)
    assert hm.hover.full_text() == f"row 5 · block 2, columns 64–95 · RMSE {float(e.block_rmse[5, 2]):.5g}"
    pos = hm.gl.mapFromScene(scene)
    qtbot.mouseClick(hm.gl.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    qtbot.waitUntil(lambda: page.block == (5, 2), timeout=60000)
    _raw, y = lab.requantize(values, "Q4_0")
    raw_rows, _ = lab.requantize(values, "Q4_0")
    pair = cmp_.pair
    np.testing.assert_array_equal(pair.original, values[5, 64:96])
    np.testing.assert_array_equal(pair.requantized, y[5, 64:96])
    assert pair.raw == raw_rows[5, 2 * 18:3 * 18].tobytes()  # Q4_0: 18 bytes a block
    np.testing.assert_array_equal(cmp_.decoded_values(), y[5, 64:96])
    np.testing.assert_array_equal(cmp_.orig.data["y"], values[5, 64:96])
    np.testing.assert_array_equal(cmp_.requant.data["y"], y[5, 64:96])
    assert cmp_.hex.raw == pair.raw
    d = decode_block("Q4_0", pair.raw)
    assert cmp_.formula.text() == d.formula and cmp_.fields_model.rowCount() == len(d.fields)
    assert (hm.pick_marker.data["x"][0], hm.pick_marker.data["y"][0]) == (5.5, 2.5)
    assert "tensor row 5 · block 2 (columns 64–95)" in cmp_.title.full_text()
    # another type from the table: its blocks of 256, the worst again the outlier's
    page.table.selectRow(next(r for r in range(page.proxy.rowCount()) if page.proxy.index(r, 0).data() == "Q4_K"))
    assert page.selected == "Q4_K" and hm.block_rmse.shape == (values.shape[0], values.shape[1] // 256)
    assert page.block == (orow, ocol // 256)
    # a click on a point of the plot selects its type
    page.plot.typeClicked.emit("Q8_0")
    assert page.selected == "Q8_0" and page.table.currentIndex().siblingAtColumn(0).data() == "Q8_0"
    # "Open in the inspector": this file's block holding those columns (F32: one value a block)
    cmp_.inspect_btn.click()
    assert window.current_view() == "block"
    bv = window.block_view
    assert (cmp_.pair.row, cmp_.pair.block) == (orow, ocol // 32)  # Q8_0's worst block: the outlier's again
    assert bv.tensor.name == name and bv.row_spin.value() == orow and bv.block_spin.value() == ocol // 32 * 32


def test_cancel_stops_the_run_and_the_window_keeps_answering(window, qtbot, model_path):  # noqa: F811
    assert window.open_path(model_path("qwen2.5-coder"))
    window.show_view("lab")
    page = window.lab_view.tensor_page
    page.rows_spin.setValue(0)  # every row: 151,936 rows of 896, seventeen times over: minutes
    # the worker is held at its first report of progress until it is cancelled: the Cancel click lands on a run
    # certainly under way, however fast or loaded the machine is
    with hold_when(window.runner, TENSOR_TASK, lambda done, _t, _m: done > 0) as held:
        assert window.lab_view.open_tensor("token_embd.weight")
        assert page.state == "running" and page.cancel_btn.isVisible()
        qtbot.waitUntil(held.is_set, timeout=120000)
        # the work runs in a worker and the event loop keeps running meanwhile: a timer fires, the view answers
        # (a GUI thread that waited for the worker would hang here; time spent in slots is the watchdog's)
        assert held.thread is not threading.main_thread()
        responsive(qtbot)
        assert page.state == "running"
        page.cancel_btn.click()
        qtbot.waitUntil(lambda: page.state == "cancelled", timeout=120000)
    wait_idle(qtbot, window)
    assert page.run is None and page.model.rowCount() == 0 and not page.cancel_btn.isVisible()
    assert page.status.full_text().startswith("Cancelled")
    # the whole-file statistics cancel too
    fp = window.lab_view.file_page
    window.lab_view.pages.setCurrentWidget(fp)
    fp.rows_spin.setValue(0)
    with hold_when(window.runner, FILE_TASK, lambda done, _t, _m: done > 0) as held:
        fp.start()
        qtbot.waitUntil(held.is_set, timeout=120000)
        assert fp.state == "running"
        fp.cancel_btn.click()
        qtbot.waitUntil(lambda: fp.state == "cancelled", timeout=120000)
    assert fp.result is None and fp.model.rowCount() == 0 and not fp.export_btn.isEnabled()


def responsive(qtbot) -> None:
    """The event loop runs: a timer fires."""
    fired: list[bool] = []
    QTimer.singleShot(20, lambda: fired.append(True))
    qtbot.waitUntil(lambda: bool(fired), timeout=60000)


def test_file_stats_fill_sort_and_export(window, qtbot, models, tmp_path, monkeypatch):  # noqa: F811
    path = models / "llama.gguf"
    assert window.open_path(path)
    window.show_view("lab")
    lv, fp = window.lab_view, window.lab_view.file_page
    lv.pages.setCurrentWidget(fp)
    types = ["Q4_0", "Q4_K", "Q8_0"]
    lv.types.set_types(types)
    assert lv.types.text() == "Types: 3 of 17"
    fp.rows_spin.setValue(64)
    with qtbot.waitSignal(fp.runFinished, timeout=120000):
        fp.start()
    assert fp.state == "done", fp.error
    with GGUFFile(path) as f:
        want = lab.file_stats(f, types, max_rows=64)
    summary = lab.summarize(want, types)
    assert fp.model.rowCount() == sum(len(s.errors) for s in want) == 3 * len(want)
    got = {(r.tensor, r.stats.type): r.stats for r in fp.model.rows}
    assert {r.source for r in fp.model.rows} == {"F32"}
    for s in want:
        for e in s.errors:
            g = got[(s.name, e.type)]
            assert (g.rmse, g.max_abs, g.snr_db, g.cosine) == (e.rmse, e.max_abs, e.snr_db, e.cosine)
    assert [fp.sum_proxy.index(r, 0).data() for r in range(fp.sum_proxy.rowCount())] == types  # by bpw
    for u in summary:
        row = next(r for r in fp.sum_model.rows if r.stats.type == u.stats.type)
        assert row.stats.rmse == u.stats.rmse and row.n_tensors == u.n_tensors == len(want)
    # the row filter, and numeric sorting
    fp.filter.setText("ffn_down")
    assert fp.proxy.rowCount() == 3 * sum(1 for s in want if "ffn_down" in s.name)
    fp.filter.clear()
    fp.table.sortByColumn(fp.model.column("snr_db"), Qt.SortOrder.AscendingOrder)
    col = fp.model.column("snr_db")
    snr = [fp.proxy.index(r, col).data(Qt.ItemDataRole.UserRole + 1) for r in range(fp.proxy.rowCount())]
    assert snr == sorted(snr)
    # export: JSON (quant-stats --json's document) and CSV
    out = fp.export(tmp_path / "stats.json")
    doc = json.loads(out.read_text())
    ref = json.loads(json_text(lab.stats_report(want, summary)))
    assert doc["tensors"] == ref["tensors"] and doc["summary"] == ref["summary"]
    assert doc["file"] == str(path) and doc["types"] == types and doc["max_rows"] == 64
    with fp.export(tmp_path / "stats.csv").open() as fh:
        rows = list(csv.reader(fh))
    assert tuple(rows[0]) == lab.CSV_COLUMNS and len(rows) == 1 + 3 * len(want) + 3
    assert rows[-1][0] == "summary" and rows[1][1] == want[0].name
    # through the save dialog (the suffix follows the chosen filter)
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(tmp_path / "picked"), "CSV (*.csv)"))
    assert fp.export_dialog() == tmp_path / "picked.csv" and (tmp_path / "picked.csv").read_text().startswith("scope,")
    # never over the open file
    before = path.read_bytes()
    with pytest.raises(PathRefused):
        fp.export(path)
    assert path.read_bytes() == before
    # a double click on a row requantizes that tensor, with that type selected
    r = next(r for r in range(fp.proxy.rowCount()) if fp.proxy.index(r, 0).data() == "blk.2.attn_v.weight"
             and fp.proxy.index(r, fp.model.column("type")).data() == "Q4_K")
    fp._open_row(fp.proxy.index(r, 0))
    page = lv.tensor_page
    assert lv.pages.currentWidget() is page
    _run(qtbot, page)
    assert page.tensor == "blk.2.attn_v.weight" and page.selected == "Q4_K"
    assert [e.type for e in page.run.errors] == types


def test_reference_values_and_importance_weights(window, qtbot, models):  # noqa: F811
    q8, f32 = models / "llama-Q8_0.gguf", models / "llama.gguf"
    assert window.open_path(q8)
    window.show_view("lab")
    lv, page = window.lab_view, window.lab_view.tensor_page
    lv.types.set_types(["IQ4_XS", "Q4_K", "Q6_K"])
    name = "blk.1.attn_k.weight"
    assert lv.open_tensor(name)
    _run(qtbot, page)
    deq = lab.requantize_errors(_values(q8, name), ["IQ4_XS", "Q4_K", "Q6_K"], blocks=True)
    _same_figures(page, deq)
    assert "Q8_0 values, dequantized" in page.status.full_text()
    # the values from the F32 original: other figures, the core's
    lv.load_reference(f32)
    qtbot.waitUntil(lambda: lv.reference is not None and page.state == "done"
                    and "llama.gguf" in page.status.full_text(), timeout=120000)
    ref = lab.requantize_errors(_values(q8, name, reference=f32), ["IQ4_XS", "Q4_K", "Q6_K"], blocks=True)
    _same_figures(page, ref)
    assert ref[0].rmse != deq[0].rmse and lv.source_label.full_text() == "reference llama.gguf"
    # an importance matrix: the quantizers weigh the columns, the weighted RMSE appears
    lv.load_imatrix(DATA / "llama.imatrix.gguf")
    qtbot.waitUntil(lambda: lv.imatrix is not None and page.state == "done" and page.model.weighted, timeout=120000)
    w = read_imatrix(DATA / "llama.imatrix.gguf").weights(name)
    weighted = lab.requantize_errors(_values(q8, name, reference=f32), ["IQ4_XS", "Q4_K", "Q6_K"], w, blocks=True)
    _same_figures(page, weighted)
    assert page.model.column("weighted_rmse") >= 0 and all(e.weighted_rmse is not None for e in page.run.errors)
    assert page.metric.model().item(page.metric.findData("weighted_rmse")).isEnabled()
    assert "importance-weighted" in page.status.full_text()
    # the block view quantizes with the row's weights too
    q = page.selected
    r, b = page.block
    pair = lab.requantize_block(_values(q8, name, reference=f32), q, r, b, w)
    assert page.compare.pair.raw == pair.raw
    # back to this file, without weights
    lv.clear_imatrix()
    lv.clear_reference()
    _run(qtbot, page)
    _same_figures(page, deq)
    assert page.model.column("weighted_rmse") == -1


def test_follows_the_tensors_view_and_its_context_menu(window, qtbot, models):  # noqa: F811
    assert window.open_path(models / "llama.gguf")
    window.show_view("tensors")
    tv, page = window.tensors_view, window.lab_view.tensor_page
    tv.select_tensor("blk.3.ffn_up.weight")
    assert page.tensor == "blk.3.ffn_up.weight"
    assert page.tensor_combo.currentData() == "blk.3.ffn_up.weight"
    assert not window.runner.running("requantize") and page.pending  # not computed while hidden
    window.show_view("lab")
    _run(qtbot, page)
    assert page.run.name == "blk.3.ffn_up.weight"
    # the Tensors view's context menu opens the lab on its tensor, at once
    window.show_view("tensors")
    action = tv.lab_action("blk.0.attn_output.weight")
    assert action.isEnabled() and not tv.lab_action("blk.0.attn_norm.weight").isEnabled()
    action.trigger()
    assert window.current_view() == "lab"
    _run(qtbot, page)
    assert page.run.name == "blk.0.attn_output.weight"
    # Tools > Quant lab, and the tensor box: a typed name runs it
    window.show_view("overview")
    window.lab_action.trigger()
    assert window.current_view() == "lab"
    page.tensor_combo.setEditText("blk.1.attn_v.weight")
    page._combo_text_entered()
    _run(qtbot, page)
    assert page.run.name == "blk.1.attn_v.weight"


def test_odd_files_open_in_the_lab(window, qtbot, tmp_path, model_path):  # noqa: F811
    from .hostile_files import ODD_FILES

    smol = model_path("smollm2")
    for kind, make in ODD_FILES.items():
        path = make(tmp_path / f"{kind}.gguf", smol)
        assert window.open_path(path), kind
        window.show_view("lab")
        page = window.lab_view.tensor_page
        name = page.representative()
        if name is not None:
            page.rows_spin.setValue(8)
            window.lab_view.open_tensor(name)
            qtbot.waitUntil(lambda p=page: p.state in ("done", "failed", "cancelled"), timeout=120000)
            assert page.state in ("done", "failed"), kind
        wait_idle(qtbot, window)


@pytest.mark.parametrize("view", ["requantize", "quant-stats"])
def test_screenshot_views(window, qtbot, models, tmp_path, view):  # noqa: F811
    from quantscope.gui.app import render_screenshot

    assert window.open_path(models / "outlier.gguf")
    out = tmp_path / f"{view}.png"
    assert render_screenshot(QApplication.instance(), window, view, out, (1100, 700)) == 0
    img = QImage(str(out))
    assert (img.width(), img.height()) == (1100, 700)
    lv = window.lab_view
    if view == "requantize":
        assert lv.tensor_page.state == "done" and len(lv.tensor_page.run.errors) == len(lab.CANDIDATE_TYPES)
    else:
        assert lv.file_page.state == "done" and lv.file_page.sum_model.rowCount() == len(lab.CANDIDATE_TYPES)


def test_ticking_types_requantizes_again_once(window, qtbot, models, monkeypatch):  # noqa: F811
    assert window.open_path(models / "llama.gguf")
    window.show_view("lab")
    lv, page = window.lab_view, window.lab_view.tensor_page
    assert lv.open_tensor("blk.2.attn_output.weight")
    _run(qtbot, page)
    assert len(page.run.errors) == 17
    starts: list[int] = []
    real = page.start
    monkeypatch.setattr(page, "start", lambda: (starts.append(1), real())[1])
    lv.types.menu_.popup(lv.types.mapToGlobal(lv.types.rect().bottomLeft()))
    lv.types.boxes["Q4_K"].click()
    lv.types.boxes["F16"].click()
    lv.types.boxes["TQ1_0"].click()
    assert lv.types.menu_.isVisible() and lv.types.text() == "Types: 14 of 17"  # the menu stays open
    qtbot.waitUntil(lambda: page.run is not None and len(page.run.errors) == 14, timeout=120000)
    assert starts == [1]
    assert {e.type for e in page.run.errors} == set(lab.CANDIDATE_TYPES) - {"Q4_K", "F16", "TQ1_0"}
    lv.types.menu_.close()
    # no type at all: nothing runs, the reason is shown
    lv.types.set_types([])
    qtbot.waitUntil(lambda: "at least one type" in page.status.full_text(), timeout=60000)
    assert page.model.rowCount() == 0
