"""The Metadata, Tensors and Block inspector views on the real models: search, sort, the 262k vocabulary, the
chat template, tensor statistics in a worker, the heatmap, and block-inspector values equal to the core decoder's."""

from __future__ import annotations

import time

import numpy as np
import pytest
from PySide6.QtCore import QPointF, Qt

from quantscope.core.analysis import analyze_tensor, code_layout, find_in_strings
from quantscope.core.gguf import GGUFFile
from quantscope.core.quant import can_decode, decode_block

from .gui_helpers import wait_idle, window  # noqa: F401


def test_metadata_filter_and_sort(window, model_path):  # noqa: F811
    assert window.open_path(model_path("qwen2.5-coder"))
    mv = window.metadata_view
    window.show_view("metadata")
    mv.filter.setText("head_count")
    keys = sorted(mv.proxy.index(r, 0).data() for r in range(mv.proxy.rowCount()))
    assert keys == ["qwen2.attention.head_count", "qwen2.attention.head_count_kv"]
    assert "2 of 26 keys" == mv.count.text()
    mv.filter.setText("uint32")  # the type column is searched too
    assert mv.proxy.rowCount() == sum(1 for kv in window.doc.gguf.metadata.values() if kv.type_label == "UINT32")
    mv.filter.clear()
    mv.table.sortByColumn(0, Qt.SortOrder.AscendingOrder)
    first = [mv.proxy.index(r, 0).data() for r in range(mv.proxy.rowCount())]
    assert first == sorted(first)
    mv.table.sortByColumn(3, Qt.SortOrder.DescendingOrder)  # offsets sort numerically, not as text
    offsets = [mv.proxy.index(r, 3).data(Qt.ItemDataRole.UserRole + 1) for r in range(mv.proxy.rowCount())]
    assert offsets == sorted(offsets, reverse=True)


def test_chat_template_is_shown_highlighted(window, model_path):  # noqa: F811
    assert window.open_path(model_path("qwen2.5-coder"))
    mv = window.metadata_view
    assert mv.detail_title.text() == "tokenizer.chat_template"  # selected by default when present
    template = window.doc.gguf.get("tokenizer.chat_template")
    assert mv.text.toPlainText() == template and mv.highlighter is not None
    mv.highlighter.rehighlight()
    block = mv.text.document().firstBlock()
    formats = block.layout().formats()
    assert block.text().startswith("{%- if tools %}") and any(r.length > 0 for r in formats)
    assert "never executed" in mv.detail_sub.text()


def test_vocabulary_pages_lazily_and_searches(window, qtbot, model_path):  # noqa: F811
    assert window.open_path(model_path("gemma3"))
    mv = window.metadata_view
    window.show_view("metadata")
    assert mv.select_key("tokenizer.ggml.tokens")
    av = mv.array
    assert mv.stack.currentWidget() is av
    toks = window.doc.gguf.get("tokenizer.ggml.tokens")
    m = av.model
    assert m.rowCount() == len(toks) == 262144
    horiz = Qt.Orientation.Horizontal
    assert m.headerData(2, horiz) == "Type" and m.headerData(3, horiz) == "Score"
    # scroll through the whole vocabulary: each page is read on demand
    t0 = time.perf_counter()
    bar = av.table.verticalScrollBar()
    for k in range(0, 101):
        bar.setValue(bar.maximum() * k // 100)
        if k % 25 == 0:
            qtbot.wait(0)
        top = av.table.rowAt(0)
        assert m.index(top, 1).data() is not None
    assert time.perf_counter() - t0 < 5.0
    assert av.table.rowAt(0) > 262000
    assert m.index(200000, 0).data() == "200,000"
    assert m.index(200000, 1).data() == toks[200000].replace("\n", "↵")
    av.go_to(150000)
    assert av.table.currentIndex().row() == 150000
    # search
    av.search.setText("hello")
    qtbot.waitUntil(lambda: m.indices is not None, timeout=3000)
    expected = find_in_strings(toks, "hello")
    assert m.rowCount() == len(expected) >= 8
    shown = [m.index(r, 1).data() for r in range(m.rowCount())]
    assert all("hello" in s.lower() for s in shown)
    assert [int(m.index(r, 0).data().replace(",", "")) for r in range(m.rowCount())] == expected.tolist()
    assert f"{len(expected):,} of 262,144" in av.status.text()
    av.search.clear()
    qtbot.waitUntil(lambda: m.indices is None, timeout=3000)
    assert m.rowCount() == 262144


def test_tensor_selection_runs_stats_in_a_worker_and_caches(window, qtbot, model_path):  # noqa: F811
    path = model_path("smollm2")
    assert window.open_path(path)
    tv = window.tensors_view
    window.show_view("tensors")
    wait_idle(qtbot, window)
    tv.filter.setText("ffn_down")
    assert tv.table_proxy.rowCount() == 30 and tv.count.text() == "30 of 272 tensors"
    tv.filter.setText("Q8_0")
    assert tv.table_proxy.rowCount() == 1
    tv.filter.clear()
    name = "blk.2.attn_v.weight"
    with qtbot.waitSignal(tv.analysisReady, timeout=30000) as sig:
        tv.select_tensor(name)
    assert sig.args == [name]
    with GGUFFile(path) as f:
        ref = analyze_tensor(f, name)
    a = tv.analysis
    assert a is not None and a.tensor == name
    assert a.stats == ref.stats
    assert np.array_equal(a.histogram.counts, ref.histogram.counts)
    rows = dict(tv.stats_model.rows)
    assert rows["min"] == f"{ref.stats.min:.7g}" and rows["NaN"] == "0"
    assert tv.image.image is not None and tv.image.image.shape == ref.heatmap.shape
    details = dict(tv.details_model.rows)
    assert details["type"].startswith("Q4_1") and details["shape (ne, ggml order)"] == "576 × 192"
    # the selection shows in the table and the tree
    assert tv.table_proxy.data(tv.table.currentIndex().siblingAtColumn(0)) == name
    # cached: selecting it again starts no worker
    tv.select_tensor("blk.0.attn_norm.weight")
    wait_idle(qtbot, window)
    tv.select_tensor(name)
    assert not window.runner.running() and tv.analysis is a


def test_tree_selection_and_heatmap_click_opens_the_block(window, qtbot, model_path):  # noqa: F811
    assert window.open_path(model_path("gemma3"))
    tv = window.tensors_view
    window.show_view("tensors")
    name = "blk.3.ffn_down.weight"  # Q4_K, 640 rows of 2048
    tree = tv.tree_proxy
    blk3 = next(tree.index(r, 0) for r in range(tree.rowCount()) if tree.index(r, 0).data().startswith("blk.3 "))
    child = next(tree.index(r, 0, blk3) for r in range(tree.rowCount(blk3))
                 if tree.index(r, 0, blk3).data() == name)
    with qtbot.waitSignal(tv.analysisReady, timeout=30000):
        tv.tree.setCurrentIndex(child)
    assert tv.tensor.name == name
    qtbot.wait(50)
    vb = tv.heat_plot.vb
    scene = vb.mapViewToScene(QPointF(2 * 256 + 37 + 0.5, 7 + 0.5))
    assert tv._matrix_pos(scene) == (7, 2 * 256 + 37)
    tv._heat_hover(scene)
    assert tv.hover.text().startswith("row 7, col 549 → block 2, element 37")

    class Click:
        def scenePos(self):
            return scene

    tv._heat_click(Click())
    bv = window.block_view
    assert window.current_view() == "block"
    assert bv.tensor.name == name and (bv.row_spin.value(), bv.block_spin.value(), bv.element) == (7, 2, 37)
    with GGUFFile(model_path("gemma3")) as f:
        b = decode_block("Q4_K", f.block_bytes(name, 7, 2))
    assert bv.explain.text() == b.explain(37)
    # zoom into a region and refine: the heatmap is recomputed there at full detail
    window.show_view("tensors")
    tv.heat_plot.setRange(xRange=(500, 600), yRange=(0, 20), padding=0)
    tv.refine_heatmap()
    wait_idle(qtbot, window)
    assert tv.heat.exact and tv.heat.row0 <= 1 and 499 <= tv.heat.col0 <= 500
    tv._reset_heatmap()
    assert tv.heat is tv.analysis.heatmap and not tv.heat.exact


def test_block_inspector_q4k_equals_core_decoder(window, model_path):  # noqa: F811
    assert window.open_path(model_path("gemma3"))
    bv = window.block_view
    window.show_view("block")
    name = "blk.3.ffn_down.weight"
    bv.show_block(name, 7, 2, 37)
    with GGUFFile(model_path("gemma3")) as f:
        raw = f.block_bytes(name, 7, 2)
        off, _ = f.block_location(name, 7, 2)
    b = decode_block("Q4_K", raw)
    assert np.array_equal(bv.values, b.values)
    assert np.array_equal(bv.bars.opts["height"], b.values)
    assert bv.hex.raw == raw and bv.hex.base == off == 197_430_624
    assert [r[0] for r in bv.fields_model.rows] == ["d", "dmin", "scales", "qs"]
    assert bv.fields_model.rows[1][4] == "0x1112 = 0.00061893463"
    assert bv.explain.text() == b.explain(37) and bv.explain.text().startswith("x[37] = d · sc[1] · q − dmin · m[1]")
    # scales unpacked bit by bit: 12 bytes, 8 scales + 8 mins
    assert bv.scales.bytes == list(range(4, 16)) and bv.scales.scales == b.scales
    assert bv.scales.value_label("sc", 4) == "sc[4]=63 ←b12[3:0]|b4[7:6]<<4"
    # the nibble grid: 128 code bytes, 2 nibbles each, element 37 highlighted in sub-block 1
    assert bv.codes.layout_ == code_layout(b) and bv.codes.highlight == 37 and bv.codes.highlight_group == 1
    assert bv.codes.groups == [int(g) for g in b.group]
    assert bv.hex.highlight == {21, 5, 9}  # the code byte, sc[1] (byte 5), m[1] (byte 9)
    bv.set_element(200)
    assert bv.explain.text() == b.explain(200) and bv.elem_spin.value() == 200
    # moving to another block through the spin boxes re-decodes
    bv.block_spin.setValue(3)
    with GGUFFile(model_path("gemma3")) as f:
        b3 = decode_block("Q4_K", f.block_bytes(name, 7, 3))
    assert np.array_equal(bv.values, b3.values)


@pytest.mark.parametrize("model", ["smollm2", "gemma3", "qwen2.5-coder"])
def test_block_inspector_every_type_equals_core_decoder(window, model_path, model):  # noqa: F811
    assert window.open_path(model_path(model))
    bv = window.block_view
    f = window.doc.gguf
    seen = set()
    for t in f.tensors:
        if t.type_name in seen:
            continue
        seen.add(t.type_name)
        row, block = t.n_rows - 1, max(0, t.row_len // t.type.block_elems - 1)
        bv.show_block(t.name, row, block)
        b = decode_block(t.type, f.block_bytes(t, row, block))
        assert can_decode(t.type)
        assert bv.decoded is not None and np.array_equal(bv.values, b.values, equal_nan=True), t.name
        assert bv.formula.text() == b.formula
        assert bv.codes_box.isVisibleTo(bv) == (b.code_bits > 0)
        assert bv.scales_box.isVisibleTo(bv) == bool(b.scales)
    assert len(seen) >= 3


def test_block_inspector_shows_undecodable_types_without_crashing(window, tmp_path):  # noqa: F811
    from .test_analysis import _tiny_gguf

    path = _tiny_gguf(tmp_path / "iq2.gguf", with_iq2=True)
    assert window.open_path(path)
    bv = window.block_view
    bv.show_block("iq2", 0, 0)
    assert bv.decoded is None and bv.message.isVisibleTo(bv)
    assert "No field decoder for IQ2_XXS" in bv.message.text() and len(bv.hex.raw) == 66
    window.tensors_view.select_tensor("iq2")
    assert "cannot be computed" in window.tensors_view.progress_label.text()
