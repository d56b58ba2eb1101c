"""Tools ▸ Quality on a text (KL divergence)… and Tools ▸ Importance matrix…: a comparison runs in the worker and shows
compare_models' figures, the text coloured token by token (hover, worst positions, keyboard), cancel, refusals shown
in the view; the importance-matrix viewer lists and plots every entry (experts, log scale, sorting), bad files show
the reason; the --screenshot views. The tiny llama fixture (tests/arch_fixtures.py) in F32, Q8_0 and Q4_0, and the
committed imatrix files of tests/data/quantize."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import QEvent, QPoint, QSettings, Qt
from PySide6.QtGui import QAction, QColor, QHelpEvent, QImage, QTextCursor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QAbstractSpinBox,
    QApplication,
    QComboBox,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QTextEdit,
    QToolTip,
    QWidget,
)

from quantscope.core.engine.compare import compare_models
from quantscope.core.quant.imatrix import read_imatrix

from .arch_fixtures import vocabulary, write_fixture
from .gui_helpers import cancel_when, fit_problems, wait_idle, window  # noqa: F401

DATA = Path(__file__).parent / "data"
TEXT = (DATA / "english.txt").read_text(encoding="utf-8")
IMATRIX = DATA / "quantize"
N_CTX, N_CHUNKS = 64, 4


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The llama fixture in F32, Q8_0 and Q4_0, one with a token renamed, and llama-perplexity's F32 base file."""
    d = tmp_path_factory.mktemp("gui-compare")
    v = vocabulary()
    out = {q: write_fixture("llama", d / f"llama-{q}.gguf", q, vocab=v) for q in ("F32", "Q8_0", "Q4_0")}
    renamed = dict(v, tokens=[*v["tokens"][:500], "zz-renamed", *v["tokens"][501:]])  # type: ignore[misc]
    out["renamed"] = write_fixture("llama", d / "renamed.gguf", vocab=renamed)
    out["kld"] = d / "llama-F32.kld"
    out["kld"].write_bytes(gzip.decompress((DATA / "arch" / "llama-F32.kld.gz").read_bytes()))
    return out


def reference(base: Path, quant: Path, text: str = TEXT, **kw: object):  # type: ignore[no-untyped-def]
    kw = {"n_ctx": N_CTX, "max_chunks": N_CHUNKS} | kw
    return compare_models(base, quant, text, **kw)  # type: ignore[arg-type]


def setup(window, qtbot, path: Path, other: Path, role: str = "base",  # type: ignore[no-untyped-def]  # noqa: F811
          text: str = TEXT):
    assert window.open_path(path)
    wait_idle(qtbot, window)  # the views' own work on opening
    dlg = window.show_compare()
    assert dlg is not None and dlg.isVisible()
    dlg.set_role(role)
    dlg.other.setText(str(other))
    dlg.set_typed_text(text)
    dlg.ctx.setValue(N_CTX)
    dlg.chunks.setValue(N_CHUNKS)
    return dlg


def run(qtbot, dlg, timeout: int = 120000):  # type: ignore[no-untyped-def]
    with qtbot.waitSignal(dlg.compareFinished, timeout=timeout) as sig:
        dlg.start()
    return sig.args[0]


def summary_without_time(r) -> dict[str, object]:  # type: ignore[no-untyped-def]
    return {k: v for k, v in r.summary().items() if k != "seconds"}


def compare_done(window, qtbot, files, quant: str):  # type: ignore[no-untyped-def]  # noqa: F811
    dlg = setup(window, qtbot, files["F32"], files[quant])
    r = run(qtbot, dlg)
    assert r is not None and dlg.state == "done", dlg.error
    return dlg, r


# ------------------------------------------------------------------ the comparison


def test_the_comparison_runs_in_the_worker_and_shows_compare_models_figures(window, qtbot, files):  # noqa: F811
    dlg = setup(window, qtbot, files["F32"], files["Q8_0"])
    progress: list[tuple[int, int, str]] = []
    with qtbot.waitSignal(dlg.compareFinished, timeout=120000) as sig:
        dlg.start()
        # start() returned at once: the work is a task of the window's runner, the controls wait for it
        assert dlg.state == "running" and dlg.result is None and [t.name for t in window.runner.running()] == [
            "compare"]
        assert not dlg.setup.isEnabled() and not dlg.start_btn.isEnabled() and dlg.cancel_btn.isEnabled()
        assert window.task_label.text() == "comparing…"
        dlg.task.signals.progress.connect(lambda d, t, m: progress.append((d, t, m)))
    r = sig.args[0]
    assert r is dlg.result and dlg.state == "done" and dlg.start_btn.isEnabled() and not dlg.cancel_btn.isEnabled()
    ref = reference(files["F32"], files["Q8_0"])
    assert summary_without_time(r) == summary_without_time(ref)
    assert [t.kld for t in r.tokens] == [t.kld for t in ref.tokens]
    cards = {k: c.value.full_text() for k, c in dlg.cards.items()}
    assert cards["PPL base"] == f"{ref.ppl_base:.5g}" and cards["PPL quant"] == f"{ref.ppl_quant:.5g}"
    assert cards["PPL ratio"] == f"{ref.ppl_ratio:.4f}"
    assert cards["KLD mean"] == f"{ref.kld_mean:.6f}" and cards["KLD median"] == f"{ref.kld_median:.6f}"
    assert cards["KLD p90"] == f"{ref.kld_p90:.6f}" and cards["KLD p99"] == f"{ref.kld_p99:.6f}"
    assert cards["KLD max"] == f"{ref.kld_max:.6f}"
    assert cards["Top-1 agreement"] == f"{100 * ref.top1_agreement:.2f} %"
    assert cards["Positions"] == f"{ref.n_scored:,}" and dlg.cards["Positions"].sub.full_text() == "4 × 64 tokens"
    assert dlg.headline.full_text() == "llama-F32.gguf  →  llama-Q8_0.gguf"
    # the worst positions, largest first
    worst = ref.worst(50)
    assert dlg.worst_model.rowCount() == 50
    assert [dlg.worst_model.index(i, 0).data() for i in range(50)] == [f"{t.kld:.5f}" for t in worst]
    assert [r.tokens[dlg.worst_token(i)].position for i in range(50)] == [t.position for t in worst]
    # the histogram counts every scored position
    (_edges, counts), = [item.getData() for item in dlg.hist.getPlotItem().listDataItems()]
    assert counts.sum() == ref.n_scored
    # progress: the chunks in order, the bar full, the status names what was scored
    chunks = [d for d, _t, m in progress if m.startswith("chunk")]
    assert chunks == sorted(chunks) and chunks[-1] == N_CHUNKS
    assert dlg.progress.value() == 1000 and "4 chunks of 64 tokens, 124 positions" in dlg.status.text()


def test_the_open_file_as_the_quant_and_a_kld_base_file(window, qtbot, files):  # noqa: F811
    dlg = setup(window, qtbot, files["Q8_0"], files["F32"], role="quant")
    assert dlg.other_label.text() == "Base" and dlg.kld_base.isEnabled()
    r = run(qtbot, dlg)
    assert (r.base_name, r.quant_name) == ("llama-F32.gguf", "llama-Q8_0.gguf")
    assert summary_without_time(r) == summary_without_time(reference(files["F32"], files["Q8_0"]))
    # llama-perplexity's base file: its context and chunks, its tokens as the text
    dlg.other.setText(str(files["kld"]))
    dlg.kld_base.setChecked(True)
    assert dlg.source_name() == "kld" and not dlg.ctx.isEnabled() and not dlg.text_edit.isVisible()
    dlg.chunks.setValue(0)
    r = run(qtbot, dlg)
    ref = compare_models(files["kld"], files["Q8_0"], "", base_is_kld=True)
    assert r.base_is_kld and summary_without_time(r) == summary_without_time(ref)
    assert "(KLD base file)" in dlg.headline.full_text()
    # back to the base role: the KLD option goes, and so does its text source
    dlg.set_role("base")
    assert not dlg.kld_base.isChecked() and not dlg.kld_base.isEnabled()
    assert dlg.text_source.findData("kld") < 0 and dlg.ctx.isEnabled()


def test_the_text_from_a_file(window, qtbot, files, tmp_path):  # noqa: F811
    dlg = setup(window, qtbot, files["F32"], files["Q8_0"])
    dlg.set_source("file")
    assert dlg.text_file_row.isVisible() and not dlg.text_edit.isVisible()
    dlg.text_file.setText(str(DATA / "english.txt"))
    r = run(qtbot, dlg)
    assert summary_without_time(r) == summary_without_time(reference(files["F32"], files["Q8_0"]))
    dlg.text_file.setText(str(tmp_path / "none.txt"))
    assert run(qtbot, dlg) is None
    assert dlg.state == "failed" and "none.txt: cannot read the text" in dlg.status.text()


def test_the_sample_text_is_the_default(window, files):  # noqa: F811
    from quantscope.gui.views.compare_dialog import sample_text_path

    assert window.open_path(files["F32"])
    dlg = window.show_compare()
    p = sample_text_path()
    assert p is not None and p.parent.name == "resources"
    assert dlg.source_name() == "sample" and dlg.text_edit.isReadOnly()
    assert dlg.text_edit.toPlainText() == p.read_text(encoding="utf-8") and len(dlg.text_edit.toPlainText()) > 3000
    assert dlg.ctx.value() == 512 and dlg.chunks.value() == 0 and dlg.chunks.text() == "all"
    # typing keeps the text; the sample stays as it is
    dlg.set_source("typed")
    assert not dlg.text_edit.isReadOnly()
    dlg.text_edit.setPlainText("my own words")
    dlg.set_source("sample")
    assert dlg.text_edit.toPlainText() == p.read_text(encoding="utf-8")
    dlg.set_source("typed")
    assert dlg.text_edit.toPlainText() == "my own words"


# ------------------------------------------------------------------ the coloured text


def test_the_text_has_one_span_per_token_coloured_by_kld(window, qtbot, files):  # noqa: F811
    from quantscope.cli.model import KLD_BINS as CLI_BINS
    from quantscope.cli.model import KLD_COLOURS, _kld_colour
    from quantscope.gui.theme import KLD_BINS, KLD_COLORS, kld_bin
    from quantscope.gui.views.compare_dialog import shown_piece

    assert KLD_BINS == CLI_BINS  # the app's scale is the command line's, bin for bin
    for k in (0.0, 0.0009, 0.001, 0.009, 0.01, 0.03, 0.05, 0.07, 0.1, 0.4, 0.5, 0.99, 1.0, 7.5):
        assert kld_bin(k) == KLD_COLOURS.index(_kld_colour(k))
    assert (kld_bin(0.0), kld_bin(0.001), kld_bin(0.2), kld_bin(1.0)) == (0, 1, 4, 6)
    dlg, r = compare_done(window, qtbot, files, "Q4_0")
    doc = dlg.text.document()
    assert doc.toPlainText() == "".join(shown_piece(p) for _, p in r.context)
    scored = {t.position for t in r.tokens}

    def fmt(pos: int):  # type: ignore[no-untyped-def]
        c = QTextCursor(doc)
        c.setPosition(pos + 1)  # the format of the character before the cursor
        return c.charFormat()

    anchors: dict[str, set[int]] = {}
    for p, (_tid, piece) in enumerate(r.context):
        a, b = dlg.text.starts[p], dlg.text.ends[p]
        assert b - a == len(piece)
        for k in range(a, b):
            if piece[k - a] == "\n":
                continue  # a paragraph break carries no format
            f = fmt(k)
            if p in scored:
                anchors.setdefault(f.anchorHref(), set()).add(p)
            else:  # context: dimmed, no background, no anchor
                assert not f.isAnchor() and f.background().style() == Qt.BrushStyle.NoBrush
    # one anchor per scored token (those with a visible character), each on exactly that token
    visible = {t.position for t in r.tokens if t.piece.strip("\n")}
    assert len(anchors) == len(visible) and all(len(ps) == 1 for ps in anchors.values())
    for i, t in enumerate(r.tokens):
        if t.position in visible:
            assert anchors[f"tok:{i}"] == {t.position}
            k = dlg.text.starts[t.position] + next(j for j, ch in enumerate(t.piece) if ch != "\n")
            assert fmt(k).background().color() == QColor(KLD_COLORS[kld_bin(t.kld)])
    # the worst token is red, and it is the reddest
    worst = r.worst(1)[0]
    k = dlg.text.starts[worst.position]
    red = fmt(k).background().color()
    assert worst.kld >= KLD_BINS[-1] and red == QColor(KLD_COLORS[-1])
    assert (red.hue() < 15 or red.hue() > 345) and red.saturation() > 150 and red.red() > 2 * red.green()
    # a Q8_0 comparison's text is mostly the green end of the scale
    _dlg2, r2 = compare_done(window, qtbot, files, "Q8_0")
    assert np.mean([kld_bin(t.kld) <= 3 for t in r2.tokens]) > 0.5


def _token_point(text, i: int) -> QPoint:  # type: ignore[no-untyped-def]
    """A viewport point inside scored token ``i``'s first character."""
    a, _b = text.token_range(i)
    c = QTextCursor(text.document())
    c.setPosition(a)
    left = text.cursorRect(c)
    c.setPosition(a + 1)
    right = text.cursorRect(c)
    x = (left.left() + right.left()) // 2 if right.top() == left.top() else left.left() + 2
    return QPoint(x, left.center().y())


def test_hovering_a_token_shows_its_figures(window, qtbot, files):  # noqa: F811
    dlg, r = compare_done(window, qtbot, files, "Q4_0")
    worst = r.worst(1)[0]
    i = r.tokens.index(worst)
    dlg.text.show_token(i)
    qtbot.wait(20)
    point = _token_point(dlg.text, i)
    assert dlg.text.token_at(point) == i
    vp = dlg.text.viewport()
    QApplication.sendEvent(vp, QHelpEvent(QEvent.Type.ToolTip, point, vp.mapToGlobal(point)))
    tip = QToolTip.text()
    assert QToolTip.isVisible() and tip == dlg.text.tooltip_for(i)
    assert f"KLD {worst.kld:.6f} nats at position {worst.position:,}" in tip
    assert f"base:  log p {worst.base_logp:.4f}" in tip and f"quant: log p {worst.quant_logp:.4f}" in tip
    assert f"top-1 '{r.token_text[worst.base_top1]}' (id {worst.base_top1})" in tip
    assert f"top-1 '{r.token_text[worst.quant_top1]}' (id {worst.quant_top1})" in tip
    # over the dimmed context: no tool tip
    dlg.text.verticalScrollBar().setValue(0)
    qtbot.wait(20)
    c = QTextCursor(dlg.text.document())
    c.setPosition(1)
    ctx_point = dlg.text.cursorRect(c).center()
    assert dlg.text.token_at(ctx_point) is None
    QApplication.sendEvent(vp, QHelpEvent(QEvent.Type.ToolTip, ctx_point, vp.mapToGlobal(ctx_point)))
    qtbot.waitUntil(lambda: not QToolTip.isVisible(), timeout=60000)
    # a click on a token makes it current: selected, its figures under the text
    dlg.text.verticalScrollBar().setValue(dlg.text.verticalScrollBar().maximum())
    qtbot.wait(20)
    j = r.tokens.index(r.worst(2)[1])
    dlg.text.show_token(j)
    qtbot.wait(20)
    qtbot.mouseClick(vp, Qt.MouseButton.LeftButton, pos=_token_point(dlg.text, i))
    assert dlg.details.text() == dlg.text.tooltip_for(i)


def test_the_worst_list_finds_each_position_in_the_text(window, qtbot, files):  # noqa: F811
    dlg = setup(window, qtbot, files["F32"], files["Q4_0"])
    dlg.resize(1100, 700)
    dlg.chunks.setValue(0)  # every chunk of the text
    r = run(qtbot, dlg)
    assert r.n_chunks > N_CHUNKS
    bar = dlg.text.verticalScrollBar()
    assert bar.maximum() > 0  # the text is taller than its view
    for row in (0, 5, 17):
        bar.setValue(0 if r.tokens[dlg.worst_token(row)].position > len(r.context) // 2 else bar.maximum())
        rect = dlg.worst.visualRect(dlg.worst_model.index(row, 2))
        dlg.worst.scrollTo(dlg.worst_model.index(row, 2))
        rect = dlg.worst.visualRect(dlg.worst_model.index(row, 2))
        qtbot.mouseClick(dlg.worst.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
        i = dlg.worst_token(row)
        a, b = dlg.text.token_range(i)
        cur = dlg.text.textCursor()
        assert (cur.selectionStart(), cur.selectionEnd()) == (a, b)
        centre = dlg.text.cursorRect(cur).center()
        assert dlg.text.viewport().rect().contains(centre)  # scrolled to it
        if 0 < bar.value() < bar.maximum():  # ... into the middle of the view
            assert abs(centre.y() - dlg.text.viewport().height() // 2) < dlg.text.viewport().height() // 6
        assert dlg.details.text() == dlg.text.tooltip_for(i)
    # the keyboard: Down in the list moves to the next position
    dlg.worst.setFocus()
    qtbot.keyClick(dlg.worst, Qt.Key.Key_Down)
    i = dlg.worst_token(18)
    cur = dlg.text.textCursor()
    assert (cur.selectionStart(), cur.selectionEnd()) == dlg.text.token_range(i)
    # ... and the caret moved in the text with the keyboard makes the token under it current
    dlg.text.setFocus()
    j = r.tokens.index(r.worst(30)[29])
    a, _b = dlg.text.token_range(j)
    c = dlg.text.textCursor()
    c.setPosition(a)
    dlg.text.setTextCursor(c)
    qtbot.keyClick(dlg.text, Qt.Key.Key_Right)
    assert dlg.details.text() == dlg.text.tooltip_for(j)


# ------------------------------------------------------------------ cancel and refusals


def test_cancel_stops_the_comparison_and_another_can_run(window, qtbot, files):  # noqa: F811
    dlg = setup(window, qtbot, files["F32"], files["Q8_0"], text=TEXT * 40)
    dlg.chunks.setValue(0)  # every chunk of a long text: seconds of work
    reports: list[tuple[int, int, str]] = []
    with cancel_when(window.runner, "compare", lambda _d, _t, message: message.startswith("chunk"), reports), \
            qtbot.waitSignal(dlg.compareFinished, timeout=120000) as sig:
        dlg.start()
    assert sig.args[0] is None and dlg.state == "cancelled" and dlg.result is None
    seen = [(done, total) for done, total, message in reports if message.startswith("chunk")]
    total = seen[0][1]
    assert total > 100 and max(d for d, _t in seen) < total // 2  # it stopped long before the end
    assert dlg.status.text() == "Cancelled." and dlg.progress.value() == 0 and "cancelled" in dlg.text.toPlainText()
    assert dlg.setup.isEnabled() and dlg.start_btn.isEnabled() and not dlg.cancel_btn.isEnabled()
    assert all(c.value.full_text() == "—" for c in dlg.cards.values()) and dlg.worst_model.rowCount() == 0
    wait_idle(qtbot, window)
    # Esc while running cancels instead of closing
    dlg.start()
    qtbot.keyClick(dlg, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: dlg.state == "cancelled", timeout=120000)
    assert dlg.isVisible()
    # the next run goes through
    dlg.set_typed_text(TEXT)
    dlg.chunks.setValue(N_CHUNKS)
    assert run(qtbot, dlg) is not None and dlg.state == "done"


def test_refusals_are_shown_in_the_view_and_the_window_keeps_running(window, qtbot, files, tmp_path):  # noqa: F811
    dlg = setup(window, qtbot, files["F32"], files["renamed"])
    assert run(qtbot, dlg) is None
    assert dlg.state == "failed" and "do not share a vocabulary: token 500" in dlg.error
    for shown in (dlg.status.text(), dlg.text.toPlainText()):
        assert "do not share a vocabulary" in shown and "zz-renamed" in shown
    assert "The comparison failed" in dlg.text.toPlainText() and dlg.worst_model.rowCount() == 0
    # a text shorter than one chunk
    dlg.other.setText(str(files["Q8_0"]))
    dlg.set_typed_text("A few words.")
    assert run(qtbot, dlg) is None
    assert "at least 64 are needed" in dlg.status.text() and "at least 64 are needed" in dlg.text.toPlainText()
    # a file that is not there, and a KLD option on a GGUF
    dlg.set_typed_text(TEXT)
    dlg.other.setText(str(tmp_path / "none.gguf"))
    assert run(qtbot, dlg) is None and "none.gguf" in dlg.status.text()
    dlg.set_role("quant")
    dlg.other.setText(str(files["F32"]))
    dlg.kld_base.setChecked(True)
    assert run(qtbot, dlg) is None and "not a llama-perplexity log-probability file" in dlg.status.text()
    # nothing to compare with, or no text: refused at once, no task
    dlg.kld_base.setChecked(False)
    dlg.other.setText("")
    dlg.start()
    assert dlg.state == "failed" and not window.runner.running() and "Choose the other file" in dlg.status.text()
    dlg.other.setText(str(files["F32"]))
    dlg.set_typed_text("   ")
    dlg.start()
    assert not window.runner.running() and "Type or paste a text" in dlg.status.text()
    # the window and the dialog still work
    assert window.isVisible() and dlg.isVisible() and dlg.setup.isEnabled()
    window.show_view("tensors")
    assert window.current_view() == "tensors"
    dlg.set_typed_text(TEXT)
    assert run(qtbot, dlg) is not None and dlg.state == "done"


def test_the_dialog_follows_the_open_file_and_is_reachable_by_keyboard(window, qtbot, files):  # noqa: F811
    act = window.findChild(QAction, "compare")
    assert act is not None and not act.isEnabled() and act.shortcut().toString() == "Ctrl+Shift+K"
    menus = {m.title().replace("&", ""): [a.objectName() for a in m.actions()]
             for m in (a.menu() for a in window.menuBar().actions()) if m is not None}
    assert {"compare", "imatrix"} <= set(menus["Tools"])
    assert window.open_path(files["F32"]) and act.isEnabled()
    act.trigger()
    dlg = window.compare_dialog
    assert dlg is not None and dlg.isVisible() and dlg.doc_path == files["F32"]
    assert window.show_compare() is dlg  # the same file: the same dialog
    assert window.open_path(files["Q8_0"])
    dlg2 = window.show_compare()
    assert dlg2 is not dlg and dlg2.doc_path == files["Q8_0"] and not dlg.isVisible()
    # every control has a name, and Tab reaches the inputs and the button in order
    kinds = (QLineEdit, QAbstractItemView, QComboBox, QAbstractSpinBox, QProgressBar, QPlainTextEdit, QTextEdit)
    missing = [type(w).__name__ for w in dlg2.findChildren(QWidget)
               if isinstance(w, kinds) and not w.accessibleName()
               and not isinstance(w.parentWidget(), (QComboBox, QAbstractSpinBox, QAbstractItemView))
               and not isinstance(w.parentWidget().parentWidget() if w.parentWidget() else None, QComboBox)]
    assert not missing, missing
    chain, w = [], dlg2.role
    w.setFocus()
    for _ in range(40):
        chain.append(w)
        w = w.nextInFocusChain()
        while not (w.focusPolicy() & Qt.FocusPolicy.TabFocus and w.isVisible() and w.isEnabled()):
            w = w.nextInFocusChain()
    assert chain.index(dlg2.other) < chain.index(dlg2.text_source) < chain.index(dlg2.ctx) < chain.index(
        dlg2.start_btn)
    assert dlg2.text in chain and dlg2.worst in chain
    # the text box does not swallow Tab
    assert dlg2.text_edit.tabChangesFocus()


def test_the_result_fits_at_1100x700(window, qtbot, files):  # noqa: F811
    dlg, _r = compare_done(window, qtbot, files, "Q4_0")
    dlg.resize(1100, 700)
    qtbot.wait(100)
    assert fit_problems(dlg) == []


# ------------------------------------------------------------------ the importance matrix


def open_imatrix(window, qtbot, path: Path):  # type: ignore[no-untyped-def]  # noqa: F811
    dlg = window.show_imatrix()
    with qtbot.waitSignal(dlg.loaded, timeout=120000) as sig:
        dlg.open_file(path)
    return dlg, sig.args[0]


def cli_rows(capsys, path: Path) -> list[dict[str, object]]:
    from quantscope.cli.main import main

    assert main(["imatrix", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)["entries"]


def test_the_imatrix_viewer_lists_every_entry_and_plots_the_selected_one(window, qtbot, capsys):  # noqa: F811
    path = IMATRIX / "qwen3moe.imatrix.gguf"
    dlg, im = open_imatrix(window, qtbot, path)
    assert im is dlg.imatrix and dlg.error is None
    ref = read_imatrix(path)
    assert dlg.model.rowCount() == len(ref.entries) == 16 and sorted(dlg.names()) == sorted(ref.entries)
    assert "gguf imatrix, 16 entries (6 with experts), 8 chunks of 128 tokens" in dlg.info.text()
    # the table is quantscope imatrix's
    rows = cli_rows(capsys, path)
    model = dlg.model
    for r, row in enumerate(rows):
        cells = [model.index(r, c).data() for c in range(7)]
        assert cells == [row["name"], f"{row['n_cols']:,}", f"{row['n_mat']:,}", f"{row['count']:,}",
                         f"{row['mean']:.4g}", f"{row['max']:.4g}", f"{row['zeros']:,}"]
    # the first row is selected and plotted
    assert dlg.tensor == "blk.0.attn_k.weight" and not dlg.expert.isEnabled()
    x, y = dlg.curve.getData()
    assert np.array_equal(y, ref.weights("blk.0.attn_k.weight")) and np.array_equal(x, np.arange(256))
    # a 3-D entry: one expert at a time
    name = "blk.0.ffn_down_exps.weight"
    e = ref.entries[name]
    w = ref.weights(name).reshape(e.n_mat, e.n_cols)
    dlg.select_tensor(name)
    assert dlg.title.full_text() == name and dlg.expert.isEnabled() and dlg.expert.maximum() == e.n_mat - 1 == 7
    assert np.array_equal(dlg.curve.getData()[1], w[0])
    assert f"{int(e.counts[0]):,} activation rows" in dlg.expert_info.text()
    dlg.expert.setValue(3)
    assert np.array_equal(dlg.curve.getData()[1], w[3]) and not np.array_equal(w[3], w[0])
    assert f"{int(e.counts[3]):,} activation rows" in dlg.expert_info.text()
    qtbot.keyClick(dlg.expert, Qt.Key.Key_Up)
    assert dlg.expert.value() == 4 and np.array_equal(dlg.curve.getData()[1], w[4])
    # log scale
    dlg.log_y.setChecked(True)
    assert dlg.plot.getPlotItem().getAxis("left").logMode and np.array_equal(dlg.curve.yData, w[4])
    dlg.log_y.setChecked(False)
    assert not dlg.plot.getPlotItem().getAxis("left").logMode
    # sorting by a column, filtering by name
    dlg.table.sortByColumn(5, Qt.SortOrder.DescendingOrder)
    best = max(rows, key=lambda row: row["max"])["name"]
    assert dlg.names()[0] == best and len(dlg.names()) == 16
    dlg.table.sortByColumn(4, Qt.SortOrder.AscendingOrder)
    means = [next(row["mean"] for row in rows if row["name"] == n) for n in dlg.names()]
    assert means == sorted(means)
    # by name: layers in numeric order
    dlg.table.sortByColumn(0, Qt.SortOrder.AscendingOrder)
    names = ["blk.2.ffn_up.weight", "blk.10.attn_k.weight", "blk.1.ffn_up.weight", "output.weight"]
    dlg.model.set_rows([dict(rows[0], name=n) for n in names])
    assert dlg.names() == ["blk.1.ffn_up.weight", "blk.2.ffn_up.weight", "blk.10.attn_k.weight", "output.weight"]
    dlg.model.set_rows(rows)
    dlg.filter.setText("exps")
    assert len(dlg.names()) == 6 and all("exps" in n for n in dlg.names()) and dlg.count.text() == "6 of 16 tensors"


def test_the_legacy_format(window, qtbot, capsys):  # noqa: F811
    path = IMATRIX / "llama.imatrix.dat"
    dlg, im = open_imatrix(window, qtbot, path)
    assert im is not None and im.is_legacy and dlg.model.rowCount() == 28
    assert "legacy imatrix, 28 entries, 8 chunks" in dlg.info.text()
    rows = cli_rows(capsys, path)
    assert [dlg.model.index(r, 3).data() for r in range(28)] == [f"{row['count']:,}" for row in rows]
    dlg.select_tensor("blk.1.ffn_up.weight")
    assert np.array_equal(dlg.curve.getData()[1], im.weights("blk.1.ffn_up.weight"))
    assert "calls" in dlg.expert_info.text() and not dlg.expert.isEnabled()


def test_a_bad_imatrix_file_shows_the_reason(window, qtbot, files, tmp_path):  # noqa: F811
    dlg, im = open_imatrix(window, qtbot, IMATRIX / "llama.imatrix.gguf")
    assert im is not None and dlg.model.rowCount() == 28
    junk = tmp_path / "junk.dat"
    junk.write_bytes(b"\xff\xff\xff\x7fnot an imatrix at all")
    cases = [(junk, "entries cannot fit in"),
             (files["F32"], "missing imatrix metadata"),
             (tmp_path / "none.gguf", "no such file")]
    for path, reason in cases:
        dlg2, im = open_imatrix(window, qtbot, path)
        assert dlg2 is dlg and im is None and reason in dlg.error
        assert "Cannot read this file" in dlg.info.text() and reason in dlg.info.text()
        assert dlg.model.rowCount() == 0 and dlg.tensor is None and dlg.curve.getData()[1] is None
    assert window.isVisible()
    _dlg, im = open_imatrix(window, qtbot, IMATRIX / "qwen2.imatrix.gguf")
    assert im is not None and dlg.model.rowCount() == 28 and dlg.error is None


def test_file_open_shows_an_imatrix_gguf_in_the_viewer(window, qtbot, tmp_path):  # noqa: F811
    act = window.findChild(QAction, "imatrix")
    assert act is not None and act.isEnabled() and act.shortcut().toString() == "Ctrl+Shift+M"
    act.trigger()
    assert window.imatrix_dialog is not None and window.imatrix_dialog.isVisible()
    assert window.imatrix_dialog.imatrix is None
    window.imatrix_dialog.close()
    p = tmp_path / "m.imatrix.gguf"
    shutil.copy(IMATRIX / "qwen3moe.imatrix.gguf", p)
    assert window.open_path(p)
    dlg = window.imatrix_dialog
    assert dlg.isVisible()
    qtbot.waitUntil(lambda: dlg.imatrix is not None, timeout=120000)
    assert dlg.imatrix.path == p and dlg.model.rowCount() == 16


def test_the_imatrix_viewer_fits_at_1100x700(window, qtbot):  # noqa: F811
    dlg, _im = open_imatrix(window, qtbot, IMATRIX / "qwen3moe.imatrix.gguf")
    dlg.resize(1100, 700)
    qtbot.wait(100)
    assert fit_problems(dlg) == []
    kinds = (QLineEdit, QAbstractItemView, QComboBox, QAbstractSpinBox)
    assert all(w.accessibleName() for w in dlg.findChildren(QWidget) if isinstance(w, kinds)
               and not isinstance(w.parentWidget(), (QComboBox, QAbstractSpinBox, QAbstractItemView)))


# ------------------------------------------------------------------ --screenshot


def _fresh_window(tmp_path: Path):  # type: ignore[no-untyped-def]
    from quantscope.gui.mainwindow import MainWindow

    return MainWindow(QSettings(str(tmp_path / "shot.ini"), QSettings.Format.IniFormat))


def test_the_screenshot_views(qtbot, files, tmp_path):
    from quantscope.gui.app import build_parser, render_screenshot

    args = build_parser().parse_args(["f.gguf", "--screenshot", "x.png", "--view", "compare", "--compare-with",
                                      "q.gguf", "--imatrix", "m.gguf"])
    assert (args.view, args.compare_with, args.imatrix) == ("compare", "q.gguf", "m.gguf")
    app = QApplication.instance()
    for view, kw in (("compare", {"compare_with": str(files["Q4_0"])}),
                     ("imatrix", {"imatrix": str(IMATRIX / "qwen3moe.imatrix.gguf")})):
        win = _fresh_window(tmp_path)
        assert win.open_path(files["F32"])
        out = tmp_path / f"{view}.png"
        assert render_screenshot(app, win, view, out, (1100, 700), **kw) == 0
        img = QImage(str(out))
        assert (img.width(), img.height()) == (1100, 700)
    # the compare dialog was run to the end, its worst position shown
    win = _fresh_window(tmp_path)
    assert win.open_path(files["F32"])
    assert render_screenshot(app, win, "compare", tmp_path / "no.png", (1100, 700)) == 1
    assert not (tmp_path / "no.png").exists()
    win = _fresh_window(tmp_path)
    assert win.open_path(files["F32"])
    assert render_screenshot(app, win, "imatrix", tmp_path / "no.png", (1100, 700)) == 1  # a model, no imatrix
    assert not (tmp_path / "no.png").exists()
