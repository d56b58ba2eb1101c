"""What a new user hit (issue 34): the Tensors filter froze the window and matched the Bytes column, All tensors
sorted blk.10 before blk.2, a truncated file opened with no warning at the top of the Overview, Esc stopped a reply
only from the message box. These tests drive the paths through the event loop, so the watchdog (tests/watchdog.py)
times the slots they run."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QModelIndex, QPoint, Qt, QTimer
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

from quantscope.core.gguf import GGUFFile

from .gui_helpers import hold_model, wait_idle, window  # noqa: F401
from .test_integrity_first import truncated_file


def in_loop(qtbot, fn, wait_ms: int = 0) -> None:  # type: ignore[no-untyped-def]
    """Run ``fn`` from the event loop (as a user's key or click is), then let the loop run ``wait_ms`` more."""
    done: list[bool] = []
    QTimer.singleShot(0, lambda: (fn(), done.append(True)))
    qtbot.waitUntil(lambda: bool(done), timeout=60000)
    if wait_ms:
        qtbot.wait(wait_ms)


def _tree_tensors(tv) -> list[str]:  # type: ignore[no-untyped-def]
    p = tv.tree_proxy
    out = []
    for g in range(p.rowCount()):
        gi = p.index(g, 0)
        out += [p.index(r, 0, gi).data(Qt.ItemDataRole.UserRole + 2) for r in range(p.rowCount(gi))]
    return out


def test_typing_in_the_tensor_filter_keeps_the_loop_free_and_matches_names_and_types(
        window, qtbot, model_path):  # noqa: F811
    path = model_path("qwen2.5-coder")  # the largest catalogue model
    assert window.open_path(path)
    window.show_view("tensors")
    tv = window.tensors_view
    with GGUFFile(path) as f:
        names = [t.name for t in f.tensors]
        types = {t.name: t.type_name for t in f.tensors}
    tv.filter.setFocus()
    for tab in (0, 1):  # By layer, then All tensors: typed key by key, each key a pass of the event loop
        tv.lists.setCurrentIndex(tab)
        for text in ("b", "bl", "blk", "blk.1", "blk.1.", "blk.1.f", "w", "mib", "q4", ""):
            in_loop(qtbot, lambda t=text: tv.filter.setText(t))
        for ch in "ffn_down":
            in_loop(qtbot, lambda c=ch: QTest.keyClick(tv.filter, c))
        qtbot.waitUntil(lambda: tv.count.text().startswith(f"{sum('ffn_down' in n for n in names)} of"), timeout=60000)
        in_loop(qtbot, lambda: tv.filter.clear(), 300)
    # only the name and the type are matched: "mib" (every Bytes cell says MiB) matches nothing
    in_loop(qtbot, lambda: tv.filter.setText("mib"), 300)
    assert tv.table_proxy.rowCount() == 0 and _tree_tensors(tv) == []
    in_loop(qtbot, lambda: tv.filter.setText("Q8_0"), 300)
    want = sorted(n for n in names if "q8_0" in n.lower() or types[n].lower() == "q8_0")
    assert want and sorted(_tree_tensors(tv)) == want
    assert sorted(tv.table_proxy.index(r, 0).data() for r in range(tv.table_proxy.rowCount())) == want
    # selecting through the table with the keyboard, as a user does
    in_loop(qtbot, lambda: tv.filter.clear(), 300)
    tv.lists.setCurrentIndex(1)
    tv.table.setFocus()
    in_loop(qtbot, lambda: tv.table.setCurrentIndex(tv.table_proxy.index(0, 0)))
    for _ in range(6):
        in_loop(qtbot, lambda: QTest.keyClick(tv.table, Qt.Key.Key_Down), 20)
    wait_idle(qtbot, window)
    assert tv.tensor is not None and tv.tensor.name == tv.table_proxy.index(6, 0).data()


def test_all_tensors_sorts_layer_numbers_naturally(window, qtbot, model_path):  # noqa: F811
    assert window.open_path(model_path("qwen2.5-coder"))
    tv = window.tensors_view
    window.show_view("tensors")
    tv.lists.setCurrentIndex(1)
    tv.table.sortByColumn(0, Qt.SortOrder.AscendingOrder)
    rows = [tv.table_proxy.index(r, 0).data() for r in range(tv.table_proxy.rowCount())]
    blocks = [int(n.split(".")[1]) for n in rows if n.startswith("blk.")]
    assert blocks == sorted(blocks) and blocks[0] == 0 and blocks[-1] == 23
    assert rows.index("blk.2.attn_k.weight") < rows.index("blk.10.attn_k.weight")


def test_a_truncated_file_says_so_at_the_top_of_the_overview(window, qtbot, tmp_path, model_path):  # noqa: F811
    assert window.open_path(truncated_file(tmp_path / "cut.gguf"))
    ov = window.overview
    window.show_view("overview")
    assert ov.banner.isVisible() and "3 tensors of 4 run past the end of the file" in ov.banner.text()
    assert ov.banner.mapTo(ov, ov.banner.rect().topLeft()).y() < 10  # above everything, not below the fold
    shares = [ov.types_model.rows[r][4] for r in range(len(ov.types_model.rows))]
    assert shares and all(s == "—" for s in shares)
    assert window.open_path(model_path("smollm2"))  # a sound file: no banner, real shares
    assert not ov.banner.isVisible()
    assert all(s.endswith("%") for s in (r[4] for r in ov.types_model.rows))


@pytest.mark.parametrize("where", ["reply", "question", "stop button"])
def test_escape_stops_the_reply_wherever_the_focus_is_in_the_chat_pane(
        window, qtbot, model_path, monkeypatch, tmp_path, where):  # noqa: F811
    monkeypatch.setenv("QUANTSCOPE_DATA", str(tmp_path / "qs-data"))
    assert window.open_path(model_path("smollm2"))
    window.show_view("chat")
    chat = window.chat_view
    with qtbot.waitSignal(chat.engineLoaded, timeout=120_000):
        assert chat.load_model()
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=60000)
    qtbot.waitUntil(chat.composer.hasFocus, timeout=60000)  # after Load model, ready to type
    chat.apply_preset("Greedy")
    chat.max_spin.setValue(400)
    # the model thread is held after its second token until Esc was pressed: the key lands mid-reply on any machine
    with hold_model(chat.host._worker, "delta", lambda _r, _t, st: st.n_generated >= 2) as held, \
            qtbot.waitSignal(chat.replyFinished, timeout=240_000) as sig:
        assert chat.send("Tell me a long story about a dragon.")
        qtbot.waitUntil(lambda: held.is_set() and chat.reply.stats is not None, timeout=240_000)
        window.activateWindow()
        qtbot.waitUntil(window.isActiveWindow, timeout=60000)
        if where == "stop button":
            chat.stop_btn.setFocus()
        else:  # a click in a message, as a user reads or selects its text
            body = chat.views[-1 if where == "reply" else -2].body
            QTest.mouseClick(body.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(4, 4))
        focus = QApplication.focusWidget()
        assert focus is not None and focus is not chat.composer and chat.isAncestorOf(focus)
        in_loop(qtbot, lambda: QTest.keyClick(focus, Qt.Key.Key_Escape))
        held.release.set()
    assert sig.args[0].stop_reason == "cancelled" and sig.args[0].n_generated == held.args[2].n_generated
    assert chat.host.state == "ready"


def test_tree_index_helper_is_sane(window, model_path):  # noqa: F811
    """(The tree's proxy maps layer rows through the filter with no data() call: a layer row is no tensor.)"""
    assert window.open_path(model_path("smollm2"))
    m = window.tensors_view.tree_model
    assert m.tensor_at(0, QModelIndex()) is None
    assert m.tensor_at(0, m.index(0, 0)) is not None


def test_every_tab_has_a_shortcut_and_the_readme_lists_them(window, qtbot, model_path):  # noqa: F811
    import re
    from pathlib import Path

    from quantscope.gui.mainwindow import VIEW_KEYS

    assert window.open_path(model_path("smollm2"))
    tabs = {k for k, i in window._tab.items() if window.tabs.isTabVisible(i) and k != "welcome"}
    assert tabs <= {k for k, _ in VIEW_KEYS}  # the Quant lab too
    for n, (key, _label) in enumerate(VIEW_KEYS, start=1):
        action = window.findChild(type(window.save_as_action), f"view-{key}")
        assert action is not None and action.shortcut().toString() == f"Ctrl+{n}", key
        if window.tabs.isTabVisible(window._tab[key]):
            action.trigger()
            assert window.current_view() == key
    readme = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    m = re.search(r"Ctrl\+1…(\d+) switch views \(([^)]*)\)", readme.replace("\n  ", " "))
    assert m and int(m.group(1)) == len(VIEW_KEYS)
    assert [s.strip() for s in m.group(2).split(",")] == [lab.replace("&", "") for _, lab in VIEW_KEYS]


def test_the_shortcut_sheet_fits_700_pixels(window, qtbot, model_path):  # noqa: F811
    assert window.open_path(model_path("smollm2"))
    window.resize(1100, 700)
    box = window.show_shortcuts()
    qtbot.waitUntil(box.isVisible)
    assert box.height() <= 700 - 60 and box.width() <= 1100
    assert "Ctrl+Right" in box.text() and "Quant lab" in box.text()
    box.accept()


def test_show_in_the_heatmap_clears_a_filter_that_hides_the_tensor(window, qtbot, model_path):  # noqa: F811
    assert window.open_path(model_path("smollm2"))
    tv = window.tensors_view
    window.show_view("tensors")
    tv.filter.setText("ffn_down")
    qtbot.waitUntil(lambda: tv.table_proxy.rowCount() == 30, timeout=60000)
    tv.split.setSizes([150, 1250])
    window.show_channel("blk.3.attn_q.weight", "column", 7)
    assert tv.filter.text() == "" and tv.table_proxy.rowCount() == 272
    assert tv.tensor is not None and tv.tensor.name == "blk.3.attn_q.weight"
    assert tv.table_proxy.data(tv.table.currentIndex().siblingAtColumn(0)) == "blk.3.attn_q.weight"
    assert tv.split.sizes()[0] >= 300
    wait_idle(qtbot, window)


def test_a_one_row_heatmap_has_one_whole_row_tick(window, qtbot, model_path):  # noqa: F811
    assert window.open_path(model_path("smollm2"))
    tv = window.tensors_view
    window.show_view("tensors")
    with qtbot.waitSignal(tv.analysisReady, timeout=60000):
        tv.select_tensor("blk.0.attn_norm.weight")  # 576 values: one row
    ticks = tv.heat_plot.getAxis("left")._tickLevels
    assert ticks is not None and ticks[0] == [(0.5, "0")]
    with qtbot.waitSignal(tv.analysisReady, timeout=60000):
        tv.select_tensor("blk.0.attn_q.weight")  # many rows: pyqtgraph's own ticks again
    assert tv.heat_plot.getAxis("left")._tickLevels is None
    wait_idle(qtbot, window)


def test_the_open_dialog_shows_sizes_whole(qtbot, tmp_path):
    """Issue 34: the open dialog cut its Size column ("438…MiB"): Qt sizes it for "128.88 GB" and remembers a
    narrowed column between sessions. Each time a folder is listed, the column is as wide as its figures need
    (Qt's own dialog; a native one has no such view)."""
    from PySide6.QtWidgets import QFileSystemModel, QStyle, QTreeView

    from quantscope.gui.widgets.paths import open_file_dialog

    models = tmp_path / "models"
    models.mkdir()
    for name, size in (("model-q4_k_m.gguf", 459_836_123), ("tiny.gguf", 1234), ("big-f16.gguf", 1_073_000_000)):
        with open(models / name, "wb") as f:
            f.truncate(size)  # sparse: no disk used
    dialog = open_file_dialog(None, "Open a model file", str(tmp_path), "Model files (*.gguf);;All files (*)")
    qtbot.addWidget(dialog)
    dialog.show()
    view = dialog.findChild(QTreeView, "treeView")
    model = dialog.findChild(QFileSystemModel)
    assert view is not None and model is not None
    qtbot.waitUntil(lambda: model.rowCount(model.index(str(tmp_path))) == 1, timeout=60000)
    view.header().resizeSection(1, 40)  # as narrow columns remembered from an earlier session
    view.header().resizeSection(3, 40)
    dialog.setDirectory(str(models))
    root = model.index(str(models))
    qtbot.waitUntil(lambda: model.rowCount(root) == 3, timeout=60000)
    qtbot.wait(200)
    texts = [model.index(r, 1, root).data() for r in range(3)]
    assert any("MiB" in t for t in texts)
    margin = 2 * view.style().pixelMetric(QStyle.PixelMetric.PM_FocusFrameHMargin, None, view) + 2
    need = max(view.fontMetrics().horizontalAdvance(t) for t in texts) + margin
    assert view.header().sectionSize(1) >= need, (view.header().sectionSize(1), need, texts)
    dates = [model.index(r, 3, root).data() for r in range(3)]
    assert view.header().sectionSize(3) >= max(view.fontMetrics().horizontalAdvance(t) for t in dates) + margin
