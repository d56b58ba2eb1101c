"""File ▸ Compare with… (issue 19): the open GGUF against another one in a worker (gui/views/diff_view.py).

Two small GGUFs written with gguf-py's GGUFWriter differ in metadata (a value, a type, an array element, a string
with control characters, a long string, keys added and removed) and tensors (F32 retyped to Q8_0 and to Q4_K, an F16
element changed, one removed, one added, one reshaped, two the same). The tables must show exactly what
core.gguf.diff.diff_files reports, the located blocks must hold the values core.quant.decode_block reads from each
file's bytes (and gguf-py's dequantization of the same tensors), and the dialog must stay usable through cancel,
refusals and unreadable files, fit at 1100×700, and render for --screenshot --view diff.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QAction, QDragEnterEvent, QDropEvent, QImage
from PySide6.QtWidgets import (
    QAbstractItemView,
    QAbstractSpinBox,
    QApplication,
    QCheckBox,
    QFileDialog,
    QHeaderView,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QWidget,
)

from quantscope.core.fsutil import PathRefused
from quantscope.core.gguf import GGUFFile
from quantscope.core.gguf.diff import DiffCancelled, diff_files, locate_difference
from quantscope.core.native.kernels import quantize_rows
from quantscope.core.quant import decode_block
from quantscope.gui.models import KEY_ROLE, SORT_ROLE
from quantscope.gui.views import diff_view
from quantscope.gui.views.diff_view import CELL_CHARS, change_cells, fig, pair_text, shape_text, summary_text

from .gui_helpers import fit_problems, wait_idle, window  # noqa: F401

V = gguf.GGUFValueType
Q = gguf.GGMLQuantizationType
NOTE_A = "line one\nred \x1b[31mtext\x1b[0m \u202eevil"
LONG_A = "x" * 300 + " the end A"
LONG_B = "x" * 300 + " the end B"


def _finish(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_pair(folder: Path) -> tuple[Path, Path]:
    """A.gguf and B.gguf (B differs from A in every way the dialog shows)."""
    rng = np.random.default_rng(19)
    w = {
        "same.weight": rng.standard_normal((8, 64)).astype(np.float32),
        "q8.weight": rng.standard_normal((16, 256)).astype(np.float32),
        "q4k.weight": (rng.standard_normal((12, 512)) * 0.05).astype(np.float32),
        "f16.weight": rng.standard_normal((6, 32)).astype(np.float16),
        "removed.weight": rng.standard_normal((4, 32)).astype(np.float32),
        "added.weight": rng.standard_normal((2, 32)).astype(np.float32),
        "reshaped.weight": rng.standard_normal((4, 64)).astype(np.float32),
        "q8same.weight": rng.standard_normal((3, 64)).astype(np.float32),
    }
    w["q8.weight"][9, 77] = 40.0  # an outlier: the Q8_0 block holding it loses the most
    pa, pb = folder / "A.gguf", folder / "B.gguf"
    wa, wb = gguf.GGUFWriter(str(pa), "llama"), gguf.GGUFWriter(str(pb), "llama")
    for wr, name in ((wa, "model A"), (wb, "model B")):
        wr.add_key_value("general.name", name, V.STRING)
        wr.add_key_value("test.same", 42, V.UINT32)
    wa.add_key_value("test.count", 7, V.UINT32)
    wb.add_key_value("test.count", 7, V.INT32)  # type change
    wa.add_key_value("test.tokens", ["<s>", "hello", "world"], V.ARRAY, sub_type=V.STRING)
    wb.add_key_value("test.tokens", ["<s>", "hello", "World"], V.ARRAY, sub_type=V.STRING)
    wa.add_key_value("test.note", NOTE_A, V.STRING)
    wb.add_key_value("test.note", "plain", V.STRING)
    wa.add_key_value("test.long", LONG_A, V.STRING)
    wb.add_key_value("test.long", LONG_B, V.STRING)
    wa.add_key_value("test.removed", True, V.BOOL)
    wb.add_key_value("test.added", "new", V.STRING)
    for wr in (wa, wb):
        wr.add_tensor("same.weight", w["same.weight"])
        wr.add_tensor("q8same.weight", gguf.quants.quantize(w["q8same.weight"], Q.Q8_0), raw_dtype=Q.Q8_0)
    wa.add_tensor("q8.weight", w["q8.weight"])
    wb.add_tensor("q8.weight", gguf.quants.quantize(w["q8.weight"], Q.Q8_0), raw_dtype=Q.Q8_0)
    wa.add_tensor("q4k.weight", w["q4k.weight"])
    # gguf-py has no Q4_K quantizer (only its dequantizer): our native one writes ggml's bytes
    wb.add_tensor("q4k.weight", np.array(quantize_rows("Q4_K", w["q4k.weight"])), raw_dtype=Q.Q4_K)
    f16b = w["f16.weight"].copy()
    f16b[3, 17] = np.float16(100.0)
    wa.add_tensor("f16.weight", w["f16.weight"])
    wb.add_tensor("f16.weight", f16b)
    wa.add_tensor("removed.weight", w["removed.weight"])
    wb.add_tensor("added.weight", w["added.weight"])
    wa.add_tensor("reshaped.weight", w["reshaped.weight"])
    wb.add_tensor("reshaped.weight", w["reshaped.weight"].reshape(8, 32))
    _finish(wa)
    _finish(wb)
    return pa, pb


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_pair(tmp_path_factory.mktemp("gui-diff"))


def reference(pa: Path, pb: Path, **kw: object):  # type: ignore[no-untyped-def]
    with GGUFFile(pa) as a, GGUFFile(pb) as b:
        return diff_files(a, b, **kw)  # type: ignore[arg-type]


def open_dialog(window, qtbot, pa: Path, pb: Path | None = None):  # type: ignore[no-untyped-def]  # noqa: F811
    assert window.open_path(pa)
    wait_idle(qtbot, window)  # the views' own work on opening
    act = window.findChild(QAction, "diff")
    act.trigger()
    dlg = window.diff_dialog
    assert dlg is not None and dlg.isVisible()
    if pb is not None:
        dlg.set_other(pb)
    return dlg


def run(qtbot, dlg, timeout: int = 120000):  # type: ignore[no-untyped-def]
    with qtbot.waitSignal(dlg.diffFinished, timeout=timeout) as sig:
        dlg.start()
    return sig.args[0]


def diff_done(window, qtbot, pair):  # type: ignore[no-untyped-def]  # noqa: F811
    dlg = open_dialog(window, qtbot, *pair)
    d = run(qtbot, dlg)
    assert d is not None and dlg.state == "done", dlg.error
    return dlg, d


def locate_by_click(qtbot, dlg, name: str):  # type: ignore[no-untyped-def]
    r = dlg.tensor_row(name)
    assert r >= 0
    index = dlg.tensor_proxy.index(r, 1)
    with qtbot.waitSignal(dlg.locateFinished, timeout=120000) as sig:
        qtbot.mouseClick(dlg.tensors.viewport(), Qt.MouseButton.LeftButton,
                         pos=dlg.tensors.visualRect(index).center())
    return sig.args[0]


def table(dlg) -> dict[str, list[str]]:  # type: ignore[no-untyped-def]
    m = dlg.tensor_model
    return {m.index(r, 0).data(KEY_ROLE): [m.index(r, c).data() for c in range(m.columnCount())]
            for r in range(m.rowCount())}


# ------------------------------------------------------------------ the comparison


def test_the_diff_runs_in_the_worker_and_the_tables_show_what_diff_files_reports(window, qtbot, pair):  # noqa: F811
    dlg = open_dialog(window, qtbot, *pair)
    progress: list[tuple[int, int]] = []
    shown = dlg._progress  # recorded from the first report on (connecting after start() raced a fast worker)

    def record(d: int, t: int, *rest: object) -> None:
        progress.append((d, t))
        shown(d, t, *rest)

    dlg._progress = record
    with qtbot.waitSignal(dlg.diffFinished, timeout=120000) as sig:
        dlg.start()
        # start() returned at once: the work is a task of the window's runner, the controls wait for it
        assert dlg.state == "running" and dlg.result is None
        assert [t.name for t in window.runner.running()] == ["diff"]
        assert window.task_label.text() == "comparing files…"
        assert not dlg.setup.isEnabled() and not dlg.start_btn.isEnabled() and dlg.cancel_btn.isEnabled()
    d = sig.args[0]
    assert d is dlg.result and dlg.state == "done" and dlg.start_btn.isEnabled() and not dlg.cancel_btn.isEnabled()
    assert dlg.progress.value() == 1000 and dlg.export_btn.isEnabled()
    done = [p for p, _ in progress]
    assert progress and progress[-1][0] == progress[-1][1] and done == sorted(done)
    ref = reference(*pair)
    assert d.to_dict() == ref.to_dict()
    assert dlg.summary.text() == summary_text(ref)
    assert dlg.summary.text().startswith("7 metadata changes (4 value, 1 type, 1 added, 1 removed) · tensors: 4 "
                                         "changed (2 retyped, 1 reshaped, 3 with different values), 1 added, "
                                         "1 removed, 2 bit-identical")
    # the tensors: one row per TensorDiff, the figures as diff_files computed them
    rows = table(dlg)
    assert set(rows) == {t.name for t in ref.tensors} and len(rows) == len(ref.tensors) == 8
    m = dlg.tensor_model
    for t in ref.tensors:
        v = t.values
        cells = rows[t.name]
        assert cells[:4] == [t.name, "not compared" if t.status == "unchecked" else t.status,
                             pair_text(t.type_a, t.type_b),
                             pair_text(shape_text(t.shape_a) if t.shape_a else None,
                                       shape_text(t.shape_b) if t.shape_b else None)]
        want = ["", "", "", "", ""] if v is None else [fig(v.rmse), fig(v.max_abs), fig(v.cosine, ".6f"),
                                                       fig(v.rel_error), "yes" if v.exact else "no"]
        assert cells[4:] == want, t.name
        r = next(i for i in range(m.rowCount()) if m.index(i, 0).data(KEY_ROLE) == t.name)
        sorts = [m.index(r, c).data(SORT_ROLE) for c in (4, 5, 6, 7)]
        if v is None:
            assert sorts == [-math.inf] * 4
        else:
            assert sorts == [v.rmse, v.max_abs, v.cosine, v.rel_error]  # the numbers themselves
    assert rows["q8.weight"][1:4] == ["changed", "F32 → Q8_0", "[16, 256]"]
    assert rows["removed.weight"][1:4] == ["removed", "F32 → –", "[4, 32] → –"]
    assert rows["added.weight"][1:4] == ["added", "– → F32", "– → [2, 32]"]
    assert rows["reshaped.weight"][3] == "[4, 64] → [8, 32]"
    assert rows["same.weight"][8] == "yes" and rows["q8same.weight"][2] == "Q8_0"
    # the metadata: the changes in the files' order, each as change_cells says
    mm = dlg.meta_model
    got = [tuple(mm.index(r, c).data() for c in range(4)) for r in range(mm.rowCount())]
    assert [g[0] for g in got] == [c.key for c in ref.metadata]
    assert [g[1:] for g in got] == [tuple(x if len(x) <= CELL_CHARS else x[: CELL_CHARS - 1] + "…"
                                          for x in change_cells(c)) for c in ref.metadata]
    meta = {g[0]: g[1:] for g in got}
    assert meta["test.count"] == ("type changed", "UINT32: 7", "INT32: 7")
    assert meta["test.removed"] == ("removed in B", "BOOL: true", "")
    assert meta["test.added"] == ("added in B", "", "STRING: 'new'")
    assert meta["test.tokens"] == ("value changed", "ARRAY[STRING] × 3: at [2]: 'world' — '<s>', 'hello', 'world'",
                                   "ARRAY[STRING] × 3: at [2]: 'World' — '<s>', 'hello', 'World'")
    # control characters from the file are escaped, never shown raw
    note_a = meta["test.note"][1]
    assert note_a == "STRING: 'line one\\nred \\x1b[31mtext\\x1b[0m \\u202eevil'"
    # a long value: the cell is cut, its tool tip has the first difference and the text
    r = [g[0] for g in got].index("test.long")
    cell = mm.index(r, 2).data()
    assert len(cell) == CELL_CHARS and cell.endswith("…")
    assert cell.startswith(f"STRING: at character {len(LONG_A) - 1}: 'A' — 'xxx")
    tip = mm.index(r, 2).data(Qt.ItemDataRole.ToolTipRole)
    assert "A: STRING: at character 309: 'A' — 'xxx" in tip and "B: STRING: at character 309: 'B' — 'xxx" in tip
    assert dlg.tabs.tabText(0) == "Tensors (8)" and dlg.tabs.tabText(1) == "Metadata changes (7)"


def test_the_tensors_sort_by_relative_error_and_by_any_column(window, qtbot, pair):  # noqa: F811
    dlg, d = diff_done(window, qtbot, pair)
    by_name = {t.name: t for t in d.tensors}

    def rel(name: str) -> float:
        v = by_name[name].values
        return -math.inf if v is None else v.rel_error

    shown = dlg.tensor_names()
    assert dlg.tensors.horizontalHeader().sortIndicatorSection() == 7
    assert dlg.tensors.horizontalHeader().sortIndicatorOrder() == Qt.SortOrder.DescendingOrder
    assert [rel(n) for n in shown] == sorted((rel(n) for n in shown), reverse=True)
    assert shown[0] == "f16.weight"  # one element moved from ~1 to 100
    assert set(shown[-3:]) == {"added.weight", "removed.weight", "reshaped.weight"}  # no figures: last
    # a click on the Tensor header sorts by name, another reverses
    header = dlg.tensors.horizontalHeader()
    qtbot.mouseClick(header.viewport(), Qt.MouseButton.LeftButton,
                     pos=QPoint(header.sectionViewportPosition(0) + 10, header.height() // 2))
    assert dlg.tensor_names() == sorted(by_name)
    qtbot.mouseClick(header.viewport(), Qt.MouseButton.LeftButton,
                     pos=QPoint(header.sectionViewportPosition(0) + 10, header.height() // 2))
    assert dlg.tensor_names() == sorted(by_name, reverse=True)
    dlg.tensors.sortByColumn(4, Qt.SortOrder.AscendingOrder)  # RMSE, by number (not as text)
    rmse = [by_name[n].values.rmse if by_name[n].values else -math.inf for n in dlg.tensor_names()]
    assert rmse == sorted(rmse)
    # the filter box narrows both tables
    dlg.filter.setText("q8")
    assert sorted(dlg.tensor_names()) == ["q8.weight", "q8same.weight"]
    dlg.filter.setText("added")
    assert dlg.tensor_names() == ["added.weight"]
    assert [dlg.meta_proxy.index(r, 0).data() for r in range(dlg.meta_proxy.rowCount())] == ["test.added"]
    dlg.filter.clear()
    assert len(dlg.tensor_names()) == 8 and dlg.meta_proxy.rowCount() == 7


def test_the_options_reach_diff_files(window, qtbot, pair):  # noqa: F811
    dlg = open_dialog(window, qtbot, *pair)
    dlg.values_check.setChecked(False)
    assert run(qtbot, dlg).to_dict() == reference(*pair, values=False).to_dict()
    assert table(dlg)["q8.weight"][1:] == ["changed", "F32 → Q8_0", "[16, 256]", "", "", "", "", ""]
    assert table(dlg)["same.weight"][1] == "not compared"
    assert "headers only" in dlg.summary.text()
    dlg.values_check.setChecked(True)
    dlg.pattern.setText(r"^q\d")
    dlg.rows.setValue(3)
    d = run(qtbot, dlg)
    assert d.to_dict() == reference(*pair, tensor=r"^q\d", max_rows=3).to_dict()
    assert set(table(dlg)) == {"q8.weight", "q4k.weight", "q8same.weight"}
    assert d.tensor_filter == r"^q\d" and d.max_rows == 3 and d.tensors[0].values.rows_compared == 3
    assert "tensors matching '^q\\\\d'" in dlg.summary.text() and "at most 3 rows per tensor" in dlg.summary.text()
    # a pattern that is no regular expression is refused in the dialog: nothing runs
    dlg.pattern.setText("(")
    dlg.start()
    assert dlg.state == "done" and not window.runner.running() and "not a regular expression" in dlg.status.text()
    assert dlg.result is d  # the last result stays


def test_identical_files(window, qtbot, pair):  # noqa: F811
    dlg = open_dialog(window, qtbot, pair[0], pair[0])
    d = run(qtbot, dlg)
    with GGUFFile(pair[0]) as a:
        n_meta, n_tensors = len(a.metadata), len(a.tensors)
    assert d.identical and d.metadata_same == n_meta and len(d.tensors) == n_tensors == 7
    assert dlg.summary.text() == f"The files are identical: {n_meta} metadata keys and 7 tensors the same."
    assert set(r[1] for r in table(dlg).values()) == {"same"}


# ------------------------------------------------------------------ where a tensor differs most


def _check_side(side, path: Path, name: str, row: int, block: int, element: int, col: int,  # type: ignore[no-untyped-def]
                shown: tuple[int, int]):
    """The side's block is the file's block as decode_block reads its bytes, and the grid shows that value at the
    located column."""
    with GGUFFile(path) as f:
        t = f.tensor(name)
        b = decode_block(t.type, f.block_bytes(t, row, block))
        offset, size = f.block_location(t, row, block)
    s = side.block
    assert (s.block, s.element, s.offset, s.size, s.type_name) == (block, element, offset, size, t.type.name)
    np.testing.assert_array_equal(s.decoded.values, b.values)
    assert s.decoded.raw == b.raw
    value = float(b.values[element])
    assert side.shown_value() == fig(value, ".5g")
    assert side.explain.text() == b.explain(element)
    assert float(s.values[col - shown[0]]) == value
    assert [side.fields_model.rows[i][0] for i in range(len(b.fields))] == [fd.name for fd in b.fields]
    return value


def _gguf_py_value(path: Path, name: str, row: int, col: int) -> float:
    r = gguf.GGUFReader(str(path))
    t = next(t for t in r.tensors if t.name == name)
    x = gguf.quants.dequantize(t.data, t.tensor_type).reshape(-1, int(t.shape[0]))
    return float(x[row, col])


@pytest.mark.parametrize("name", ["q8.weight", "q4k.weight", "f16.weight"])
def test_a_click_shows_both_blocks_where_the_tensor_differs_most(window, qtbot, pair, name):  # noqa: F811
    pa, pb = pair
    dlg, _d = diff_done(window, qtbot, pair)
    found = locate_by_click(qtbot, dlg, name)
    assert found is not None and dlg.locate_state == "done" and dlg.located is found
    with GGUFFile(pa) as a, GGUFFile(pb) as b:
        loc = locate_difference(a, b, name)
    assert found.loc == loc
    if name == "q8.weight":
        assert (loc.row, loc.col // 32) == (9, 77 // 32)  # the outlier's block
        assert found.window == loc.region == (64, 96)
    if name == "f16.weight":
        assert (loc.row, loc.col) == (3, 17) and found.window == (16, 32)  # an element type: 16 columns shown
    va = _check_side(dlg.pair.a, pa, name, loc.row, loc.block_a, loc.element_a, loc.col, found.window)
    vb = _check_side(dlg.pair.b, pb, name, loc.row, loc.block_b, loc.element_b, loc.col, found.window)
    # gguf-py's dequantization of the same tensors agrees, and so does locate_difference
    assert va == _gguf_py_value(pa, name, loc.row, loc.col) == loc.value_a
    assert vb == _gguf_py_value(pb, name, loc.row, loc.col) == loc.value_b
    # every cell of the window is each file's value at that column
    for side, path in ((dlg.pair.a, pa), (dlg.pair.b, pb)):
        r = gguf.GGUFReader(str(path))
        t = next(t for t in r.tensors if t.name == name)
        row = gguf.quants.dequantize(t.data, t.tensor_type).reshape(-1, int(t.shape[0]))[loc.row]
        np.testing.assert_array_equal(side.block.values, row[found.window[0]:found.window[1]])
        wm = side.values_model
        cells = [wm.index_of(c).data(Qt.ItemDataRole.UserRole) for c in range(*found.window)]
        assert cells == [float(x) for x in row[found.window[0]:found.window[1]]]
        assert wm.index_of(loc.col).data(Qt.ItemDataRole.BackgroundRole).name() == diff_view.WORST_COLOR
    assert f"at column {loc.col:,}" in dlg.pair.info.text()
    # the button opens A's block in the main window's Block inspector, at the element
    assert dlg.pair.inspect_btn.isEnabled()
    qtbot.mouseClick(dlg.pair.inspect_btn, Qt.MouseButton.LeftButton)
    bv = window.block_view
    assert window.current_view() == "block" and bv.tensor_combo.currentData() == name
    assert (bv.row_spin.value(), bv.block_spin.value(), bv.element) == (loc.row, loc.block_a, loc.element_a)


def test_enter_locates_and_rows_without_values_say_why(window, qtbot, pair):  # noqa: F811
    dlg, _d = diff_done(window, qtbot, pair)
    dlg.tensors.setFocus()
    dlg.tensors.setCurrentIndex(dlg.tensor_proxy.index(dlg.tensor_row("q4k.weight"), 0))
    with qtbot.waitSignal(dlg.locateFinished, timeout=120000) as sig:
        qtbot.keyClick(dlg.tensors, Qt.Key.Key_Return)
    assert sig.args[0] is not None and sig.args[0].loc.tensor == "q4k.weight"
    assert dlg.state == "done" and not window.runner.running()  # Enter did not start another comparison
    assert [r[0] for r in dlg.pair.b.fields_model.rows] == ["d", "dmin", "scales", "qs"]
    assert dlg.pair.a.fields_model.rows[0][0] == "value"  # F32: one element per block
    for name, why in (("added.weight", "only in B"), ("removed.weight", "only in A"),
                      ("reshaped.weight", "the shapes differ"), ("same.weight", "bit-identical")):
        assert not dlg.locate(name)
        assert not window.runner.running(), name
        assert why in dlg.pair.info.text() and dlg.pair.title.text() == name
        assert dlg.located is None and not dlg.pair.inspect_btn.isEnabled() and dlg.pair.a.block is None


def test_cancel_stops_the_worker_and_leaves_the_dialog_usable(window, qtbot, pair, monkeypatch):  # noqa: F811
    total = 1 << 30
    seen: list[int] = []

    def slow(fa, fb, *, progress, cancel, **_kw):  # type: ignore[no-untyped-def]
        for i in range(1, 100_000):
            if cancel.cancelled:
                seen.append(i)
                raise DiffCancelled("cancelled")
            progress(min(total, i << 22), total)
            time.sleep(0.01)
        raise AssertionError("never cancelled")

    dlg = open_dialog(window, qtbot, *pair)
    monkeypatch.setattr(diff_view, "diff_files", slow)
    dlg.start()
    # the event loop runs while the worker works: progress, rate and status arrive
    # (the stand-in reports until it is cancelled, whatever the machine's speed: the bounds are hang guards)
    qtbot.waitUntil(lambda: dlg.progress.value() > 0 and "/s" in dlg.rate.text(), timeout=60000)
    assert "of 1.0 GiB (both files)" in dlg.status.full_text()
    window.show_view("tensors")
    assert window.current_view() == "tensors" and dlg.state == "running"
    with qtbot.waitSignal(dlg.diffFinished, timeout=60000) as sig:
        qtbot.mouseClick(dlg.cancel_btn, Qt.MouseButton.LeftButton)
    assert sig.args[0] is None and seen and dlg.state == "cancelled" and dlg.result is None
    assert dlg.status.full_text() == "Cancelled." and dlg.progress.value() == 0 and dlg.file_b is None
    assert dlg.setup.isEnabled() and dlg.start_btn.isEnabled() and not dlg.cancel_btn.isEnabled()
    wait_idle(qtbot, window)
    # and the real comparison runs afterwards
    monkeypatch.setattr(diff_view, "diff_files", diff_files)
    d = run(qtbot, dlg)
    assert d is not None and d.to_dict() == reference(*pair).to_dict()


def test_unreadable_files_show_the_reason_in_the_dialog(window, qtbot, pair, tmp_path):  # noqa: F811
    dlg = open_dialog(window, qtbot, pair[0])
    dlg.start()
    assert dlg.state == "idle" and not window.runner.running() and "Choose the other file" in dlg.status.text()
    text = tmp_path / "notes.txt"
    text.write_text("not a model at all\n")
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(pair[1].read_bytes()[:200])
    for path, why in ((text, "notes.txt is not a readable GGUF file"), (tmp_path / "none.gguf", "no such file"),
                      (tmp_path, "cannot be compared"), (truncated, "cut.gguf is not a readable GGUF file")):
        dlg.set_other(path)
        assert run(qtbot, dlg) is None
        assert dlg.state == "failed" and why in dlg.error, (path, dlg.error)
        assert why in dlg.status.full_text() and "The comparison failed" in dlg.summary.text()
        assert dlg.tensor_model.rowCount() == 0 and dlg.file_b is None and not dlg.export_btn.isEnabled()
    # the window and the dialog still work
    assert window.isVisible() and dlg.isVisible() and dlg.setup.isEnabled()
    window.show_view("metadata")
    assert window.current_view() == "metadata"
    dlg.set_other(pair[1])
    assert run(qtbot, dlg) is not None and dlg.state == "done"


# ------------------------------------------------------------------ copying, exporting, dropping


def test_rows_copy_and_the_comparison_exports_as_json(window, qtbot, pair, tmp_path, monkeypatch):  # noqa: F811
    dlg, d = diff_done(window, qtbot, pair)
    tmp_path = tmp_path / "exports"
    tmp_path.mkdir()
    index = dlg.tensor_proxy.index(dlg.tensor_row("q8.weight"), 3)
    menu = dlg.row_menu(dlg.tensors, index)
    acts = {a.text(): a for a in menu.actions() if a.text()}
    assert list(acts) == ["Copy name", "Copy values", "Show where the values differ most", "Export as JSON…"]
    acts["Copy name"].trigger()
    assert QApplication.clipboard().text() == "q8.weight"
    acts["Copy values"].trigger()
    assert QApplication.clipboard().text() == "\t".join(table(dlg)["q8.weight"])
    menu = dlg.row_menu(dlg.tensors, dlg.tensor_proxy.index(dlg.tensor_row("added.weight"), 0))
    assert not next(a for a in menu.actions() if a.text().startswith("Show where")).isEnabled()
    mi = dlg.meta_proxy.index(0, 0)
    menu = dlg.row_menu(dlg.meta, mi)
    next(a for a in menu.actions() if a.text() == "Copy key").trigger()
    assert QApplication.clipboard().text() == mi.data()
    # export: FileDiff.to_json, atomically; never over A or B
    out = dlg.export(tmp_path / "d.json")
    assert json.loads(out.read_text(encoding="utf-8")) == json.loads(d.to_json()) == json.loads(
        reference(*pair).to_json())
    with pytest.raises(PathRefused):
        dlg.export(pair[1])
    assert pair[1].read_bytes()[:4] == b"GGUF"
    # through the menu's file dialog (a name without a suffix gets .json)
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(tmp_path / "via-menu"), "JSON"))
    next(a for a in menu.actions() if a.text() == "Export as JSON…").trigger()
    assert json.loads((tmp_path / "via-menu.json").read_text(encoding="utf-8"))["counts"] == d.counts()
    assert "via-menu.json" in dlg.status.full_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.json", "via-menu.json"]  # no temporaries left
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(pair[0]), "JSON"))
    assert dlg.export_dialog() is None and "Could not export" in dlg.status.full_text()


def test_a_file_dropped_on_the_dialog_is_compared(window, qtbot, pair):  # noqa: F811
    dlg = open_dialog(window, qtbot, pair[0])
    md = QMimeData()
    md.setUrls([QUrl.fromLocalFile(str(pair[1]))])
    enter = QDragEnterEvent(QPoint(20, 20), Qt.DropAction.CopyAction, md, Qt.MouseButton.LeftButton,
                            Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(dlg, enter)
    assert enter.isAccepted()
    drop = QDropEvent(QPointF(20, 20), Qt.DropAction.CopyAction, md, Qt.MouseButton.LeftButton,
                      Qt.KeyboardModifier.NoModifier)
    with qtbot.waitSignal(dlg.diffFinished, timeout=120000) as sig:
        QApplication.sendEvent(dlg, drop)
    assert dlg.other.text() == str(pair[1]) and sig.args[0] is not None and dlg.state == "done"
    assert not dlg.other.acceptDrops()  # the box would take the URL as text
    text_only = QMimeData()
    text_only.setText("hello")
    enter = QDragEnterEvent(QPoint(20, 20), Qt.DropAction.CopyAction, text_only, Qt.MouseButton.LeftButton,
                            Qt.KeyboardModifier.NoModifier)
    enter.ignore()
    QApplication.sendEvent(dlg, enter)
    assert not enter.isAccepted()


# ------------------------------------------------------------------ the window


def test_the_menu_the_keyboard_and_the_renamed_quality_action(window, qtbot, pair):  # noqa: F811
    act = window.findChild(QAction, "diff")
    assert act is not None and not act.isEnabled() and act.shortcut().toString() == "Ctrl+Shift+D"
    menus = {m.title().replace("&", ""): [a.objectName() for a in m.actions()]
             for m in (a.menu() for a in window.menuBar().actions()) if m is not None}
    assert "diff" in menus["File"] and "diff" not in menus["Tools"]
    kld = window.findChild(QAction, "compare")
    assert kld.text().replace("&", "") == "Quality on a text (KL divergence)…"
    assert kld.shortcut().toString() == "Ctrl+Shift+K" and "compare" in menus["Tools"]
    texts = [a.text().replace("&", "") for a in window.actions()]
    assert texts.count("Compare with…") == 1
    dlg = open_dialog(window, qtbot, pair[0])
    assert act.isEnabled() and window.show_diff() is dlg  # the same file: the same dialog
    # every input has a name; Tab goes from B through the options to Compare, then to the results
    kinds = (QLineEdit, QPushButton, QAbstractItemView, QAbstractSpinBox, QCheckBox, QProgressBar)
    assert not [type(w).__name__ for w in dlg.findChildren(QWidget) if isinstance(w, kinds)
                and not isinstance(w, QHeaderView) and not w.accessibleName()
                and not isinstance(w.parentWidget(), QAbstractSpinBox)]
    chain, w = [], dlg.other
    w.setFocus()
    for _ in range(30):
        chain.append(w)
        w = w.nextInFocusChain()
        while not (w.focusPolicy() & Qt.FocusPolicy.TabFocus and w.isVisible() and w.isEnabled()):
            w = w.nextInFocusChain()
    assert chain.index(dlg.other) < chain.index(dlg.pattern) < chain.index(dlg.rows) < chain.index(dlg.start_btn)
    assert dlg.filter in chain and dlg.tensors in chain
    assert not any(b.isDefault() or b.autoDefault() for b in dlg.findChildren(QPushButton))
    # Enter in the B box compares
    dlg.set_other(pair[1])
    with qtbot.waitSignal(dlg.diffFinished, timeout=120000):
        qtbot.keyClick(dlg.other, Qt.Key.Key_Return)
    assert dlg.state == "done"
    # another open file: another dialog, the old one released
    assert window.open_path(pair[1])
    dlg2 = window.show_diff()
    assert dlg2 is not dlg and dlg2.file_a is window.doc.gguf and not dlg.isVisible() and dlg.file_b is None


def test_a_changed_file_a_closes_the_dialog(window, qtbot, pair, tmp_path):  # noqa: F811
    a = tmp_path / "A-copy.gguf"
    a.write_bytes(pair[0].read_bytes())
    dlg = open_dialog(window, qtbot, a, pair[1])
    assert run(qtbot, dlg) is not None
    with open(a, "ab") as fh:
        fh.write(b"\0" * 64)
    assert window.check_file() is not None
    assert window.diff_dialog is None and not dlg.isVisible() and dlg.file_b is None
    assert window.stale_bar.isVisible() and not window.findChild(QAction, "diff").isEnabled()


@pytest.mark.parametrize("size", [(1100, 700), (1920, 1080)])
def test_the_dialog_fits(window, qtbot, pair, size):  # noqa: F811
    dlg, _d = diff_done(window, qtbot, pair)
    dlg.resize(*size)
    assert locate_by_click(qtbot, dlg, "q4k.weight") is not None
    qtbot.wait(100)
    assert fit_problems(dlg) == []
    dlg.tabs.setCurrentIndex(1)
    dlg.pair.a.tabs.setCurrentIndex(1)
    dlg.pair.b.tabs.setCurrentIndex(1)
    qtbot.wait(50)
    assert fit_problems(dlg) == []
    # both grids line up: the same columns per row, the same first row
    ga, gb = dlg.pair.a.values_model, dlg.pair.b.values_model
    assert ga.n_cols == gb.n_cols >= 4 and ga.w0 == gb.w0


def test_the_element_of_largest_difference_stays_in_view_when_the_grid_reflows(window, qtbot, pair):  # noqa: F811
    """Widening the dialog puts more columns in each row of the values grid: the red cell stays in view (the scroll
    bar used to keep its row number, which then held other columns)."""
    dlg, _d = diff_done(window, qtbot, pair)
    dlg.resize(1100, 700)
    found = locate_by_click(qtbot, dlg, "q4k.weight")
    assert found is not None
    for size in ((1920, 1080), (1100, 700), (1920, 1080)):
        dlg.resize(*size)
        qtbot.wait(100)
        for side in (dlg.pair.a, dlg.pair.b):
            grid = side.values
            cell = grid.visualRect(side.values_model.index_of(found.loc.col))
            assert grid.viewport().rect().contains(cell.center()), (size, side.side, side.values_model.n_cols)


def test_the_screenshot_view(window, qtbot, pair, tmp_path):  # noqa: F811
    from quantscope.gui.app import build_parser, render_screenshot

    args = build_parser().parse_args(["a.gguf", "--screenshot", "x.png", "--view", "diff", "--compare-with", "b.gguf"])
    assert (args.view, args.compare_with) == ("diff", "b.gguf")
    assert window.open_path(pair[0])
    app = QApplication.instance()
    out = tmp_path / "diff.png"
    assert render_screenshot(app, window, "diff", out, (1100, 700), compare_with=str(pair[1])) == 0
    img = QImage(str(out))
    assert (img.width(), img.height()) == (1100, 700)
    dlg = window.diff_dialog
    assert dlg.state == "done" and dlg.located is not None
    assert dlg.located.loc.tensor == dlg.tensor_names()[0] == "f16.weight"  # the largest relative error


def test_the_screenshot_view_needs_the_other_file(window, qtbot, pair, tmp_path):  # noqa: F811
    from quantscope.gui.app import render_screenshot

    assert window.open_path(pair[0])
    app = QApplication.instance()
    assert render_screenshot(app, window, "diff", tmp_path / "no.png", (1100, 700)) == 1
    assert not (tmp_path / "no.png").exists()


def test_control_characters_in_names_are_escaped(window, qtbot, tmp_path):  # noqa: F811
    evil_tensor = "evil\x1b[2J\u202e.weight"
    evil_key = "test.\x1b]0;title\x07key"
    pa, pb = tmp_path / "a.gguf", tmp_path / "b.gguf"
    x = np.arange(64, dtype=np.float32).reshape(2, 32)
    for path, scale in ((pa, 1.0), (pb, 2.0)):
        w = gguf.GGUFWriter(str(path), "llama")
        w.add_key_value(evil_key, f"v{scale}", V.STRING)
        w.add_tensor(evil_tensor, x * scale)
        _finish(w)
    dlg = open_dialog(window, qtbot, pa, pb)
    d = run(qtbot, dlg)
    assert d is not None and [t.name for t in d.tensors] == [evil_tensor]
    m, mm = dlg.tensor_model, dlg.meta_model
    assert m.index(0, 0).data() == "evil\\x1b[2J\\u202e.weight" and m.index(0, 0).data(KEY_ROLE) == evil_tensor
    assert "\x1b" not in m.index(0, 0).data(Qt.ItemDataRole.ToolTipRole)
    assert mm.index(0, 0).data() == "test.\\x1b]0;title\\x07key"
    assert "\x1b" not in mm.index(0, 0).data(Qt.ItemDataRole.ToolTipRole)
    found = locate_by_click(qtbot, dlg, evil_tensor)  # the raw name finds the tensor
    assert found is not None and found.loc.tensor == evil_tensor
    assert dlg.pair.title.full_text().startswith("evil\\x1b[2J\\u202e.weight · row 1")
    assert not any(c in dlg.pair.title.full_text() + dlg.summary.text() for c in "\x1b\u202e\x07")


def test_a_comparison_that_ends_at_once_leaves_no_job(window, qtbot, pair, monkeypatch):  # noqa: F811
    """Issue 34: a comparison that ended before start() stored its task kept that task as the current one, so
    Cancel afterwards said "Cancelling…" with nothing running. However it ends, no job is left behind."""
    from .test_gui_jobs import run_at_once

    dlg = open_dialog(window, qtbot, *pair)
    run_at_once(window.runner, monkeypatch)
    dlg.start()  # the whole comparison ran inside start()
    assert dlg.state == "done" and dlg.result is not None, dlg.error
    assert dlg.task is None and dlg.start_btn.isEnabled() and not dlg.cancel_btn.isEnabled()
    dlg.cancel()
    assert dlg.status.full_text() != "Cancelling…" and dlg.state == "done"
    wait_idle(qtbot, window)


def test_the_located_difference_agrees_with_the_table(window, qtbot, pair):  # noqa: F811
    """q4k.weight: the region of the largest RMSE (row 9) is not where the tensor's largest |Δ| is (row 1): the
    panel's figures read as the table's, and it says where the table's max |Δ| lies."""
    dlg, d = diff_done(window, qtbot, pair)
    rows = table(dlg)
    col = [dlg.tensor_model.headerData(c, Qt.Orientation.Horizontal) for c in
           range(dlg.tensor_model.columnCount())].index("Max |Δ|")
    for name in ("q8.weight", "q4k.weight"):
        found = locate_by_click(qtbot, dlg, name)
        v = next(t for t in d.tensors if t.name == name).values
        info = dlg.pair.info.full_text()
        assert f"in these columns {fig(found.loc.abs_diff)} at column {found.loc.col:,}" in info
        if v.max_abs > found.loc.abs_diff:
            r, c = v.max_abs_at
            assert f"(the tensor's, the table's Max |Δ|: {rows[name][col]} at row {r:,}, column {c:,})" in info
        else:
            assert fig(found.loc.abs_diff) == rows[name][col] and "the table's" not in info
    assert "the table's Max |Δ|" in dlg.pair.info.full_text()  # q4k.weight, last
