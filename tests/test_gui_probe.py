"""The Probe tab on SmolLM2 (and four architecture fixtures) through the real worker: the logit lens, attention
and activations pages show exactly what :mod:`quantscope.core.engine.probe` computes (the oracle: the core run
again on the same tokens), a channel link marks the weight's column in the Tensors tab, cancel leaves the view
usable, a too-long prompt and a file the engine cannot run are refused with a message."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import Qt

from quantscope.core.engine import probe as P
from quantscope.core.engine.generate import Engine

from .gui_helpers import hold_when, unsupported_model, wait_idle, window  # noqa: F401

PROMPT = "The capital of France is Paris, and the capital of Italy is"
TIMEOUT = 120_000


@pytest.fixture(scope="module")
def oracle(model_path):
    """The core's probe of PROMPT on its own engine (not the view's)."""
    eng = Engine(model_path("smollm2"), n_ctx=64, backend="cpu", repack=False)
    ids = eng.tokenizer.encode(PROMPT)
    pr = P.run_probe(eng.model, ids, [eng.tokenizer.decode([t]) for t in ids])
    return eng, pr


def run_probe(window, qtbot, model_path, prompt=PROMPT):  # noqa: F811
    assert window.open_path(model_path("smollm2"))
    window.show_view("probe")
    pv = window.probe_view
    assert window.current_view() == "probe" and pv.isVisible()
    pv.prompt.setPlainText(prompt)
    with qtbot.waitSignal(pv.ranOut, timeout=TIMEOUT) as sig:
        assert pv.run()
    assert sig.args == ["done"], pv.error
    wait_idle(qtbot, window, TIMEOUT)
    # the attention page may ask for its layer's weights once the run has ended: a second, short job
    qtbot.waitUntil(lambda: not pv.busy and pv._pending_layer is None and not window.runner.running(), timeout=TIMEOUT)
    return pv


def test_logit_lens_page_equals_core(window, qtbot, model_path, oracle):  # noqa: F811
    _eng, pr = oracle
    pv = run_probe(window, qtbot, model_path)
    r = pv.result
    assert r is not None and r.probe.tokens == pr.tokens and pv.state == "done"
    want = P.logit_lens(pr, 5, "final")
    lens = r.lens
    assert lens.target_kind == "final"
    np.testing.assert_array_equal(lens.top_ids, want.top_ids)
    np.testing.assert_array_equal(lens.target_rank, want.target_rank)
    np.testing.assert_allclose(lens.top_probs, want.top_probs, rtol=1e-6)
    page = pv.lens_page
    heat = page.heat
    assert heat.data.shape == (pr.n_layers + 1, pr.n_tokens)
    np.testing.assert_allclose(heat.data, want.target_prob, rtol=1e-6)
    assert heat.left_axis.labels[0] == "emb" and heat.left_axis.labels[-1] == str(pr.n_layers - 1)
    assert len(heat.bottom_axis.labels) == pr.n_tokens
    # zoomed in, each cell shows its top token (drawn for the visible cells only)
    from quantscope.gui.views.probe_widgets import token_label

    heat.plot.setRange(xRange=(0, 4), yRange=(0, 4), padding=0)
    heat.grab()
    assert 0 < heat.cell_text.painted <= 25
    assert heat.cell_text.text(3, 2) == token_label(pv.piece(int(want.top_ids[3, 2, 0])), 12)
    heat.plot.setRange(xRange=(0, pr.n_tokens), yRange=(0, pr.n_layers + 1), padding=0)
    heat.cell_text.painted = 0
    heat.resize(300, 200)
    heat.grab()
    assert heat.cell_text.painted == 0  # cells too small for text: none drawn
    # rank mode: -log10(rank + 1), the colour bar labelled in ranks
    page.mode.setCurrentIndex(1)
    np.testing.assert_allclose(heat.data, -np.log10(want.target_rank + 1.0), rtol=1e-6)
    # picking a cell (arrow keys from the initial pick: the last layer at the last position) fills the side table
    assert heat.cursor == (pr.n_layers, pr.n_tokens - 1)
    heat.setFocus()
    qtbot.keyClick(heat, Qt.Key.Key_Up)
    qtbot.keyClick(heat, Qt.Key.Key_Left)
    row, col = pr.n_layers - 1, pr.n_tokens - 2
    assert heat.cursor == (row, col)
    tok = pv.engine.tokenizer
    for i in range(5):
        assert page.top.item(i, 2).text() == str(int(want.top_ids[row, col, i]))
        assert float(page.top.item(i, 1).text()) == pytest.approx(float(want.top_probs[row, col, i]), abs=5e-5)
    assert page.top.item(0, 0).toolTip() == repr(tok.decode([int(want.top_ids[row, col, 0])]))
    assert f"rank {int(want.target_rank[row, col]) + 1:,}" in page.describe(row, col)
    # the other target: the lens is recomputed in the worker
    with qtbot.waitSignal(pv.ranOut, timeout=TIMEOUT):
        pv.target.setCurrentIndex(1)
    nxt = P.logit_lens(pr, 5, "next")
    assert pv.result.lens.target_kind == "next"
    np.testing.assert_array_equal(pv.result.lens.targets[:-1], pr.tokens[1:])
    np.testing.assert_allclose(heat.data, -np.log10(nxt.target_rank + 1.0), rtol=1e-6)
    wait_idle(qtbot, window, TIMEOUT)


def test_attention_page_equals_core(window, qtbot, model_path, oracle):  # noqa: F811
    _eng, pr = oracle
    pv = run_probe(window, qtbot, model_path)
    page = pv.attention_page
    pv.pages.setCurrentWidget(page)
    with qtbot.waitSignal(pv.ranOut, timeout=TIMEOUT):
        page.select(3, 2)
    wait_idle(qtbot, window, TIMEOUT)
    want = pr.attention(3)
    assert page.layer == 3 and page.weights.shape == want.shape
    np.testing.assert_allclose(page.heat.data, want[2], rtol=1e-5, atol=1e-7)
    masked = np.isnan(page.heat.data)
    assert masked.sum() == pr.n_tokens * (pr.n_tokens - 1) // 2  # the future keys: strictly above the diagonal
    assert masked[0, 1] and not masked[1, 0] and not np.isnan(np.diag(page.heat.data)).any()
    page.head_box.setCurrentIndex(page.head_box.findData(-1))
    np.testing.assert_allclose(page.heat.data, P.head_average(want), rtol=1e-5, atol=1e-7)
    assert "whole prefix" in page.note.text()
    page._hover(2, 5)
    assert "not seen" in page.hover.full_text()
    page._hover(5, 2)
    assert f"{float(P.head_average(want)[5, 2]):.4f}" in page.hover.full_text()
    assert page.layer_box.count() == pr.n_layers


def test_activations_and_channel_link(window, qtbot, model_path, oracle):  # noqa: F811
    _eng, pr = oracle
    pv = run_probe(window, qtbot, model_path)
    page = pv.activations_page
    pv.pages.setCurrentWidget(page)
    acts = P.activations(pr)
    idx = page.index
    assert idx == int(np.argmax([acts.outlier_ratio(i) for i in range(len(pr.resid))]))
    top = acts.top_channels(idx, 16)
    assert [int(page.table.item(i, 0).text()) for i in range(page.table.rowCount())] == [c for c, _, _ in top]
    assert f"{acts.outlier_ratio(idx):,.1f}×" in page.summary.text()
    page.select_layer(4)
    assert page.index == 4
    chan = acts.top_channels(4, 1)[0][0]
    assert int(page.table.item(0, 0).text()) == chan and page.channel == chan
    links = [page.links.item(i).data(Qt.ItemDataRole.UserRole) for i in range(page.links.count())]
    want = P.channel_links(pv.tensor_names(), pr.n_layers, 4)
    assert [(n, a) for n, a, _ in links] == want and ("blk.4.attn_q.weight", "column") in want
    i = next(k for k, (n, _a, _c) in enumerate(links) if n == "blk.4.attn_q.weight")
    page.links.setCurrentRow(i)
    page.show_btn.click()
    tv = window.tensors_view
    assert window.current_view() == "tensors"
    assert tv.tensor is not None and tv.tensor.name == "blk.4.attn_q.weight"
    assert tv.mark == ("column", chan)
    wait_idle(qtbot, window, TIMEOUT)
    assert tv.heat is not None and tv.mark_item.isVisible()
    assert tv.mark_item.angle == 90 and tv.mark_item.value() == pytest.approx(chan + 0.5)
    # a row link marks a horizontal line; another tensor clears the mark
    assert tv.mark_line("row", 3) and tv.mark_item.angle == 0
    assert not tv.mark_line("row", tv.tensor.n_rows)
    tv.select_tensor("blk.4.ffn_down.weight")
    assert tv.mark is None and not tv.mark_item.isVisible()


def test_cancel_keeps_the_view_usable(window, qtbot, model_path):  # noqa: F811
    pv = run_probe(window, qtbot, model_path, "Hello there")
    first = pv.result
    long_prompt = " ".join(["The quick brown fox jumps over the lazy dog."] * 60)
    pv.prompt.setPlainText(long_prompt)
    # the worker is held as it starts the layers until Cancel was clicked: the click lands on a run under way
    with hold_when(window.runner, "probe-run", lambda done, _t, _m: done >= 100) as held, \
            qtbot.waitSignal(pv.ranOut, timeout=TIMEOUT) as sig:
        assert pv.run()
        assert not pv.run()  # never two probe tasks at once
        assert pv.cancel_btn.isVisible() and not pv.run_btn.isEnabled()
        qtbot.waitUntil(held.is_set, timeout=TIMEOUT)
        assert pv.busy
        pv.cancel_btn.click()
    assert sig.args == ["cancelled"] and pv.state == "cancelled"
    wait_idle(qtbot, window, TIMEOUT)
    assert pv.result is first and "Cancelled" in pv.status.full_text()
    assert pv.run_btn.isEnabled() and not pv.cancel_btn.isVisible()
    pv.prompt.setPlainText("Paris is")
    with qtbot.waitSignal(pv.ranOut, timeout=TIMEOUT) as sig:
        assert pv.run()
    assert sig.args == ["done"] and pv.result.probe.n_tokens == len(pv.engine.tokenizer.encode("Paris is"))


def test_too_long_prompt_is_refused(window, qtbot, model_path):  # noqa: F811
    pv = run_probe(window, qtbot, model_path, "Hi")
    text = " ".join(f"w{i}" for i in range(1200))
    pv.prompt.setPlainText(text)
    pv.update_count()
    n = len(pv.engine.tokenizer.encode(text))
    assert n > P.MAX_PROBE_TOKENS and pv.n_tokens == n and "too long" in pv.count.text()
    with qtbot.waitSignal(pv.ranOut, timeout=5000) as sig:
        assert not pv.run()
    assert sig.args == ["refused"] and "at most 1,024" in pv.status.full_text()
    assert not window.runner.running() and pv.result.probe.tokens == pv.engine.tokenizer.encode("Hi")
    # before the model is loaded, the worker refuses it the same way
    assert window.open_path(model_path("smollm2"))
    window.show_view("probe")
    assert pv.engine is None and pv.result is None
    pv.prompt.setPlainText(text)
    with qtbot.waitSignal(pv.ranOut, timeout=TIMEOUT) as sig:
        assert pv.run()
    assert sig.args == ["failed"] and "at most 1,024" in pv.error and pv.result is None


def test_a_file_the_engine_cannot_run_says_why(window, qtbot, tmp_path):  # noqa: F811

    bad = unsupported_model(tmp_path / "mamba.gguf")
    assert window.open_path(bad)
    window.show_view("probe")
    pv = window.probe_view
    pv.prompt.setPlainText("ab")
    with qtbot.waitSignal(pv.ranOut, timeout=TIMEOUT) as sig:
        assert pv.run()
    assert sig.args == ["failed"]
    assert "cannot run" in pv.error and "mamba" in pv.error and pv.error in pv.status.full_text()
    assert window.error_box is None and pv.engine is None
    qtbot.waitUntil(pv.run_btn.isEnabled, timeout=TIMEOUT)  # greyed while the job runs, back once its slot is idle


def test_probe_tab_fits_1100x700(window, qtbot, model_path):  # noqa: F811
    from .gui_helpers import fit_problems

    pv = run_probe(window, qtbot, model_path)
    window.resize(1100, 700)
    for page in (pv.lens_page, pv.attention_page, pv.activations_page):
        pv.pages.setCurrentWidget(page)
        wait_idle(qtbot, window, TIMEOUT)
        qtbot.wait(50)
        assert fit_problems(pv) == [], page


@pytest.mark.parametrize("arch", ["gemma2", "gemma4", "gpt-oss", "qwen35"])
def test_every_page_works_on_other_architectures(window, qtbot, tmp_path, arch):  # noqa: F811
    """Sliding windows (gemma2's 16, gpt-oss's), gemma4's per-layer shapes and shared caches, gpt-oss's sinks and
    qwen35's delta-net layers (no attention: listed, not selectable): the pages show the core's numbers."""
    from .arch_fixtures import vocabulary, write_fixture

    path = write_fixture(arch, tmp_path / f"{arch}.gguf", vocab=vocabulary())
    assert window.open_path(path)
    window.show_view("probe")
    pv = window.probe_view
    pv.prompt.setPlainText("the cat sat on the mat while the dog ran in the park and the bird sang in the tree")
    with qtbot.waitSignal(pv.ranOut, timeout=TIMEOUT) as sig:
        assert pv.run()
    assert sig.args == ["done"], pv.error
    wait_idle(qtbot, window, TIMEOUT)
    pr = pv.result.probe
    T, L = pr.n_tokens, pr.n_layers
    assert T > 20 and pv.lens_page.heat.data.shape == (L + 1, T)
    page = pv.attention_page
    pv.pages.setCurrentWidget(page)
    box = page.layer_box.model()
    windows = set()
    for li in range(L):
        j = page.layer_box.findData(li)
        enabled = bool(box.flags(box.index(j, 0)) & Qt.ItemFlag.ItemIsEnabled)
        assert enabled == pr.has_attention(li), li
        if not pr.has_attention(li):
            continue
        page.select(li, -1)  # computed in the worker, or drawn from the cache at once
        qtbot.waitUntil(lambda li=li: page.layer == li and page.shown is not None and not pv.busy, timeout=TIMEOUT)
        want = P.head_average(pr.attention(li))
        np.testing.assert_allclose(page.heat.data, want, rtol=1e-5, atol=1e-7)
        np.testing.assert_array_equal(~np.isnan(page.heat.data), P.visible_mask(T, pr.window(li)))
        if pr.window(li) and pr.window(li) < T:
            windows.add(li)
            assert f"sliding window: {pr.window(li)}" in page.note.text()
    assert bool(windows) == (arch in ("gemma2", "gemma4", "gpt-oss")), windows
    assert any(not pr.has_attention(li) for li in range(L)) == (arch == "qwen35")
    act = pv.activations_page
    pv.pages.setCurrentWidget(act)
    top = P.activations(pr).top_channels(act.index, 16)
    assert [int(act.table.item(i, 0).text()) for i in range(act.table.rowCount())] == [c for c, _, _ in top]
