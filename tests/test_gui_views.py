"""The Metadata, Tensors and Block inspector views on the real models: search, sort, the 262k vocabulary, the
chat template, tensor statistics in a worker, the heatmap, and block-inspector values equal to the core decoder's."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import QPointF, Qt

from quantscope.core.analysis import analyze_tensor, code_layout, find_in_strings
from quantscope.core.gguf import GGUFFile
from quantscope.core.quant import can_decode, decode_block

from .gui_helpers import fit_problems, wait_idle, window  # noqa: F401


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
    # scroll through the whole vocabulary: each page is read on demand (counted: the elements formatted, not the
    # seconds it took, so that a loaded machine cannot fail it; reading every row would format 262,144)
    formatted = [0]
    real_text = m.element_text

    def counting(i: int) -> str:
        formatted[0] += 1
        return real_text(i)

    m.element_text = counting
    bar = av.table.verticalScrollBar()
    for k in range(0, 101):
        bar.setValue(bar.maximum() * k // 100)
        if k % 25 == 0:
            qtbot.wait(0)
        top = av.table.rowAt(0)
        assert m.index(top, 1).data() is not None
    del m.element_text
    assert 0 < formatted[0] < 5_000, formatted[0]
    assert av.table.rowAt(0) > 262000
    assert m.index(200000, 0).data() == "200,000"
    assert m.index(200000, 1).data() == toks[200000].replace("\n", "↵")
    av.go_to(150000)
    assert av.table.currentIndex().row() == 150000
    # search
    av.search.setText("hello")
    qtbot.waitUntil(lambda: m.indices is not None, timeout=60000)  # a search over 262,144 tokens
    expected = find_in_strings(toks, "hello")
    assert m.rowCount() == len(expected) >= 8
    shown = [m.index(r, 1).data() for r in range(m.rowCount())]
    assert all("hello" in s.lower() for s in shown)
    assert [int(m.index(r, 0).data().replace(",", "")) for r in range(m.rowCount())] == expected.tolist()
    assert f"{len(expected):,} of 262,144" in av.status.text()
    av.search.clear()
    qtbot.waitUntil(lambda: m.indices is None, timeout=60000)
    assert m.rowCount() == 262144


def test_tensor_selection_runs_stats_in_a_worker_and_caches(window, qtbot, model_path):  # noqa: F811
    path = model_path("smollm2")
    assert window.open_path(path)
    tv = window.tensors_view
    window.show_view("tensors")
    wait_idle(qtbot, window)
    tv.filter.setText("ffn_down")  # applied after a pause in the typing
    qtbot.waitUntil(lambda: tv.count.text() == "30 of 272 tensors", timeout=60000)
    assert tv.table_proxy.rowCount() == 30
    tv.filter.setText("Q8_0")
    qtbot.waitUntil(lambda: tv.table_proxy.rowCount() == 1, timeout=60000)
    tv.filter.clear()
    name = "blk.2.attn_v.weight"
    with qtbot.waitSignal(tv.analysisReady, timeout=120000) as sig:
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
    with qtbot.waitSignal(tv.analysisReady, timeout=120000):
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

        def button(self):
            return Qt.MouseButton.LeftButton

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
    assert "No field decoder for Q1_0" in bv.message.text() and len(bv.hex.raw) == 18
    window.tensors_view.select_tensor("iq2")
    assert "cannot be computed" in window.tensors_view.progress_label.text()


def _settle(qtbot, window, size):  # noqa: F811
    window.resize(*size)
    wait_idle(qtbot, window)
    qtbot.wait(30)  # resize and layout events


@pytest.mark.parametrize("size", [(1100, 700), (1024, 640)])
def test_every_view_fits_without_sideways_scrolling_or_cut_text(window, qtbot, model_path, size):  # noqa: F811
    assert window.open_path(model_path("gemma3"))
    for view in ("overview", "metadata", "tensors", "block"):
        window.show_view(view)
        _settle(qtbot, window, size)
        assert fit_problems(window) == [], view
    mv = window.metadata_view
    window.show_view("metadata")
    assert mv.select_key("tokenizer.ggml.tokens")
    mv.array.search.setText("hello")
    mv.array.apply_search()
    _settle(qtbot, window, size)
    assert fit_problems(window) == [], "metadata: token search"
    tv = window.tensors_view
    window.show_view("tensors")
    with qtbot.waitSignal(tv.analysisReady, timeout=120000):
        tv.select_tensor("blk.0.attn_output.weight")
    for page in (0, 1):  # by layer, and the table with every column it can fit
        tv.lists.setCurrentIndex(page)
        _settle(qtbot, window, size)
        assert fit_problems(window) == [], f"tensors page {page}"
    window.show_view("block")
    window.block_view.show_block("blk.0.attn_output.weight", 0, 0, 37)
    _settle(qtbot, window, size)
    assert fit_problems(window) == [], "block inspector"
    # another file in the same window: its names and numbers are fitted again
    assert window.open_path(model_path("qwen2.5-coder"))
    for view in ("overview", "metadata", "tensors", "block"):
        window.show_view(view)
        _settle(qtbot, window, size)
        assert fit_problems(window) == [], f"{view} after opening another file"


def test_convert_dialog_and_bump_view_fit(window, qtbot, tmp_path, model_path):  # noqa: F811
    assert window.open_path(model_path("qwen2.5-coder"))
    dlg = window.show_convert()
    dlg.output.setText(str(tmp_path / "q.bump"))
    dlg.manifest_check.setChecked(True)
    dlg.config_check.setChecked(True)
    assert fit_problems(dlg) == []
    with qtbot.waitSignal(dlg.conversionFinished, timeout=120000):
        dlg.start()
    qtbot.wait(30)
    assert dlg.state == "done" and fit_problems(dlg) == []
    dlg.open_btn.click()
    assert window.current_view() == "bump"
    for size in ((1100, 700), (1024, 640)):
        _settle(qtbot, window, size)
        assert fit_problems(window) == [], size


def test_fit_problems_reports_what_is_cut(qtbot):
    """The helper itself: it finds a cut label, button and combo, a sideways scroll bar and a clipping table, and
    passes wrapped and elided labels."""
    from PySide6.QtGui import QStandardItemModel
    from PySide6.QtWidgets import (
        QComboBox,
        QHBoxLayout,
        QLabel,
        QPushButton,
        QScrollArea,
        QTableView,
        QVBoxLayout,
        QWidget,
    )

    from quantscope.gui.widgets.fit import ElidedLabel

    long = "a rather long piece of text that cannot fit in sixty pixels"
    root = QWidget()
    qtbot.addWidget(root)
    lay = QVBoxLayout(root)
    row = QHBoxLayout()
    cut, wrapped, elided = QLabel(long), QLabel(long), ElidedLabel(long)
    cut.setObjectName("cut")
    wrapped.setWordWrap(True)
    button = QPushButton(long)
    combo = QComboBox()
    combo.addItem(long)
    for w in (cut, wrapped, elided, button, combo):
        w.setFixedWidth(60)
        row.addWidget(w)
    lay.addLayout(row)
    scroll = QScrollArea()
    inner = QWidget()
    inner.setMinimumWidth(2000)
    scroll.setWidget(inner)
    lay.addWidget(scroll)
    table = QTableView()
    model = QStandardItemModel(3, 3)
    table.setModel(model)
    table.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    for c in range(3):
        table.setColumnWidth(c, 400)
    lay.addWidget(table)
    root.resize(700, 500)
    root.show()
    qtbot.waitExposed(root)
    problems = fit_problems(root)
    text = "\n".join(problems)
    assert "QLabel('cut')" in text and "QPushButton" in text and "QComboBox" in text
    assert "horizontal scroll bar in QScrollArea" in text and "QTableView clips its columns" in text
    assert len(problems) == 5, problems  # the wrapped label and the elided one fit
    assert elided.text().endswith("…") and elided.toolTip() == long and elided.full_text() == long
    combo.setToolTip(long)  # a combo box that cuts its text but shows it whole in the tool tip
    assert "QComboBox" not in "\n".join(fit_problems(root))


def test_block_inspector_keeps_the_selected_element_while_hovering(window, qtbot, model_path):  # noqa: F811
    assert window.open_path(model_path("gemma3"))
    bv = window.block_view
    window.show_view("block")
    name = "blk.3.ffn_down.weight"
    bv.show_block(name, 7, 2)
    bv.elem_spin.setValue(37)  # chosen with the keyboard
    with GGUFFile(model_path("gemma3")) as f:
        b = decode_block("Q4_K", f.block_bytes(name, 7, 2))
    assert bv.element == 37 and bv.explain.text() == b.explain(37)
    # hovering the code grid, then the plot, shows another element without changing the selection
    bv.codes.elementHovered.emit(5)
    assert bv.explain.text() == b.explain(5) and "selected: 37" in bv.explain_detail.text()
    assert bv.elem_spin.value() == 37 and bv.element == 37 and bv.codes.highlight == 5
    vb = bv.plot.getPlotItem().vb
    qtbot.wait(30)
    bv.plot.scene().sigMouseMoved.emit(vb.mapViewToScene(QPointF(120, 0)))
    assert bv.hovered == 120 and bv.explain.text() == b.explain(120)
    assert bv.elem_spin.value() == 37 and bv.marker.data["x"][0] == 37 and bv.hover_marker.data["x"][0] == 120
    # the mouse leaves: the selected element is shown again
    bv.plot.scene().sigMouseMoved.emit(QPointF(-50, -50))
    assert bv.hovered == -1 and bv.explain.text() == b.explain(37) and bv.codes.highlight == 37
    assert len(bv.hover_marker.data) == 0
    # a click selects: on the code grid, and on the plot
    bv.codes.elementClicked.emit(64)
    assert bv.element == 64 and bv.elem_spin.value() == 64

    class Click:
        def scenePos(self):
            return vb.mapViewToScene(QPointF(200, 0))

        def button(self):
            return Qt.MouseButton.LeftButton

    bv._plot_click(Click())
    assert bv.element == 200 and bv.elem_spin.value() == 200 and bv.explain.text() == b.explain(200)
    # the view's keys step the element, the block and the row
    bv.step("element", 1)
    bv.step("block", 1)
    bv.step("row", -1)
    assert (bv.row_spin.value(), bv.block_spin.value(), bv.element) == (6, 3, 201)
    bv.step("row", -100)
    assert bv.row_spin.value() == 0  # clamped
    # its keys work wherever the focus is while the view shows (the tab bar's too), and are off elsewhere
    keys = {sc.key().toString(): sc for sc in bv.shortcuts}
    assert set(keys) == {"Ctrl+Left", "Ctrl+Right", "Ctrl+Up", "Ctrl+Down", "Alt+Up", "Alt+Down"}
    assert all(sc.isEnabled() and sc.context() == Qt.ShortcutContext.WindowShortcut for sc in bv.shortcuts)
    keys["Ctrl+Right"].activated.emit()
    assert bv.element == 202
    window.show_view("overview")
    assert not any(sc.isEnabled() for sc in bv.shortcuts)


def test_scale_bit_labels_are_readable(window, model_path):  # noqa: F811
    from PySide6.QtGui import QFontMetrics

    from quantscope.gui.widgets.blockwidgets import ScaleBitDiagram, mono_font

    assert window.open_path(model_path("gemma3"))
    d = window.block_view.scales
    assert d.bytes  # a Q4_K block is shown: its packed scale bytes
    fm = QFontMetrics(mono_font(ScaleBitDiagram.LABEL_PT))
    assert ScaleBitDiagram.LABEL_PT >= 7.5
    assert fm.horizontalAdvance("sc7.5") <= d._bit_rect(0, 0).width()  # the widest label fits its cell


def test_token_search_hits_show_whole_indices_and_type_names(window, qtbot, model_path):  # noqa: F811
    from quantscope.gui.models import TOKEN_TYPE_NAMES

    assert window.open_path(model_path("gemma3"))
    mv = window.metadata_view
    window.show_view("metadata")
    window.resize(1100, 700)
    assert mv.select_key("tokenizer.ggml.tokens")
    av, m = mv.array, mv.array.model
    types = window.doc.gguf.get("tokenizer.ggml.token_type")
    assert m.index(2, 2).data() == TOKEN_TYPE_NAMES[int(types[2])] == "CONTROL"  # <bos>
    assert {m.index(r, 2).data() for r in range(0, 262144, 997)} <= set(TOKEN_TYPE_NAMES.values())
    av.search.setText("ing")
    av.apply_search()
    assert m.indices is not None and m.indices[-1] > 100_000
    av.go_to(int(m.indices[-1]))
    qtbot.wait(30)
    fm = av.table.fontMetrics()
    width = av.table.columnWidth(0)
    first = av.table.rowAt(0)
    rows = range(first, min(m.rowCount(), first + 20))
    assert all(fm.horizontalAdvance(m.index(r, 0).data()) + 6 <= width for r in rows)
    assert all(fm.horizontalAdvance(m.index(r, 2).data()) + 6 <= av.table.columnWidth(2) for r in rows)


def test_tensor_enter_double_click_and_context_menu(window, qtbot, model_path):  # noqa: F811
    from PySide6.QtWidgets import QApplication

    assert window.open_path(model_path("gemma3"))
    tv = window.tensors_view
    window.show_view("tensors")
    # no tensor chosen yet: no axes around an empty heatmap
    assert not tv.heat_plot.getAxis("bottom").isVisible() and not tv.colorbar.isVisible()
    assert not tv.hist.getPlotItem().getAxis("bottom").isVisible()
    name = "blk.2.ffn_up.weight"
    tv.lists.setCurrentIndex(1)
    src = tv._source_index(tv.table_model, name)
    idx = tv.table_proxy.mapFromSource(src)
    tv.table.setCurrentIndex(idx)
    wait_idle(qtbot, window)
    assert tv.heat_plot.getAxis("bottom").isVisible() and tv.colorbar.isVisible()
    assert tv.hist.getPlotItem().getAxis("bottom").isVisible()
    qtbot.keyClick(tv.table, Qt.Key.Key_Return)
    assert window.current_view() == "block" and window.block_view.tensor.name == name
    window.show_view("tensors")
    other = tv.table_proxy.mapFromSource(tv._source_index(tv.table_model, "blk.1.attn_q.weight"))
    tv.table.scrollTo(other)
    rect = tv.table.visualRect(other)
    qtbot.mouseClick(tv.table.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())  # a double click's press
    qtbot.mouseDClick(tv.table.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert window.current_view() == "block" and window.block_view.tensor.name == "blk.1.attn_q.weight"
    # the context menu: copy the name, open the block, show in the heatmap, requantize in the Quant lab
    window.show_view("tensors")
    tv._context_menu(tv.table, tv.table.visualRect(idx).center())
    assert [a.text() for a in tv.context_menu.actions()] == [
        "Copy name", "Open in the block inspector", "Show in the heatmap", "Export values as .npy (float32)…",
        "Export raw blocks as .npy…", "Requantize in the Quant lab"]
    tv.context_menu.close()
    copy, block, heat, _values, _raw = tv.context_actions("blk.4.attn_k.weight")
    copy.trigger()
    assert QApplication.clipboard().text() == "blk.4.attn_k.weight"
    heat.trigger()
    assert tv.tensor.name == "blk.4.attn_k.weight" and window.current_view() == "tensors"
    block.trigger()
    assert window.current_view() == "block" and window.block_view.tensor.name == "blk.4.attn_k.weight"
    wait_idle(qtbot, window)


def test_counts_say_one_tensor_not_one_tensors(window, qtbot, model_path):  # noqa: F811
    import pyqtgraph as pg

    from quantscope.gui.models import plural

    assert (plural(1, "tensor"), plural(2, "tensor"), plural(12345, "token")) == ("1 tensor", "2 tensors",
                                                                                   "12,345 tokens")
    assert window.open_path(model_path("qwen2.5-coder"))
    labels = [i.textItem.toPlainText() for i in window.overview.types_plot.getPlotItem().items
              if isinstance(i, pg.TextItem)]
    counts = window.doc.summary["types"]
    assert labels and all(f" {plural(r['tensors'], 'tensor')}" in lab for r, lab in
                          zip([r for r in counts if r["bytes"]], labels, strict=True))
    assert not any(" 1 tensors" in lab for lab in labels)
    window.tensors_view.filter.setText("output_norm")
    qtbot.waitUntil(lambda: window.tensors_view.count.text() == "1 of 291 tensors", timeout=60000)


@pytest.mark.parametrize("name", ["IQ2_XXS", "IQ1_M", "TQ1_0", "NVFP4"])
def test_block_inspector_decodes_the_low_bit_families(window, tmp_path, name):  # noqa: F811
    """A real block of each family (tests/data/iq_blocks): fields, the formula with the hovered element's numbers,
    and the heatmap statistics of the tensor."""
    from pathlib import Path

    import gguf

    t = gguf.GGMLQuantizationType[name]
    raw = np.frombuffer((Path(__file__).parent / "data" / "iq_blocks" / f"{name}.bin").read_bytes(), np.uint8)
    elems, nbytes = gguf.GGML_QUANT_SIZES[t]
    per_row = 1536 // elems  # rows of 1536 elements, as many as the 64 recorded blocks fill
    rows = 64 // per_row
    path = tmp_path / f"{name}.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("w", raw[: rows * per_row * nbytes].reshape(rows, -1), raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert window.open_path(path)
    bv = window.block_view
    bv.show_block("w", 1, 2)
    assert bv.decoded is not None and bv.decoded.type.name == name
    assert not bv.message.isVisibleTo(bv)
    bv.set_element(5)
    assert "x[5] = " in bv.formula.text() or "x[5] = " in bv.explain.text()
    # the code grid's note says what a code byte is: a grid row's index, or each element's own code
    note = {"IQ2_XXS": "one per code-book row of 8 elements", "IQ1_M": "one per code-book row of 8 elements",
            "NVFP4": "2 × 4-bit slots per byte"}.get(name)
    if note is None:
        assert not bv.codes_box.isVisibleTo(bv)  # TQ1_0's base-3 digits are not bit slots
    else:
        assert note in bv.codes_note.text(), bv.codes_note.text()
    with GGUFFile(path) as f:
        s = analyze_tensor(f, "w").stats
    assert s.n_nan == 0 and s.n_elements == rows * 1536 and s.std > 0


def test_a_mixture_of_experts_file_shows_its_experts(window, tmp_path):  # noqa: F811
    """The Overview counts the parameters a token reads, the memory note says every expert stays resident, and the
    tensor tree names each layer's experts (the qwen3moe fixture: 16 experts per layer, 4 per token)."""
    from . import arch_fixtures

    path = arch_fixtures.write_fixture("qwen3moe", tmp_path / "moe.gguf")
    assert window.open_path(path)
    card = window.overview.cards["Parameters"]
    assert card.value.full_text() == "453.0K · 231.8K active", card.value.full_text()
    assert card.sub.full_text() == "16 experts, 4 per token · 32.00 bits/weight", card.sub.full_text()
    assert "all 16 experts of each layer stay in memory; a token reads 4 of them" in window.overview.mem_note.text()
    tm = window.tensors_view.tree_model
    labels = [tm.group_label(g) for g in range(len(tm.groups))]
    assert labels[1] == "blk.0  ·  12 tensors  ·  16 experts", labels
    assert tm.index(1, 0).data(Qt.ItemDataRole.ToolTipRole) == labels[1]  # whole, where the column elides it
    assert "experts" not in labels[0]


@pytest.mark.parametrize("width", [1100, 1660])
def test_a_filter_keeps_the_by_layer_columns(window, qtbot, model_path, width):  # noqa: F811
    """Filtering opens every layer: the tree's vertical scroll bar comes, and the columns shown stay the same."""
    assert window.open_path(model_path("smollm2"))
    window.show_view("tensors")
    tv = window.tensors_view
    tree = tv.tree
    window.resize(width, 800)
    fitter = tree._column_fitter

    def shown() -> list[str]:
        qtbot.waitUntil(lambda: not fitter._later.isActive())
        m = tree.model()
        return [m.headerData(c, Qt.Orientation.Horizontal) for c in range(m.columnCount())
                if not tree.isColumnHidden(c)]

    qtbot.waitUntil(lambda: tree.isVisible() and tree.viewport().width() > 0)
    base = shown()
    assert not tree.verticalScrollBar().isVisible()  # the layers, closed, fit
    for text in ("ffn_down", "Q4_1", "norm"):
        tv.filter.setText(text)
        tv.flush_filter()
        qtbot.waitUntil(tree.verticalScrollBar().isVisible)
        assert shown() == base, text
    tv.filter.setText("")
    tv.flush_filter()
    assert shown() == base


def test_a_negative_minimum_is_written_as_a_subtraction(window, model_path):  # noqa: F811
    """Q4_1 (the demo model): x = d · q + m with m < 0 reads "… − 0.856", never "+ -0.856"."""
    assert window.open_path(model_path("smollm2"))
    bv = window.block_view
    f = window.doc.gguf
    t = f.tensor("blk.0.attn_q.weight")
    assert t.type_name == "Q4_1"
    for block in range(8):
        window.inspect_block(t.name, 0, block, 3)
        m = next(fd.value["float"] for fd in bv.decoded.fields if fd.name == "m")
        text = bv.explain.text()
        assert "+ -" not in text and "− -" not in text, text
        if m < 0:
            assert f"− {abs(m):.7g} = " in text, text
