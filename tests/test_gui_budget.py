"""The Quant lab's Budget page (issue 39): measuring in a worker with progress (cached: a second run measures nothing),
the front and the presets on it, the slider changing the mix as the core's solver says, cancel, the check of the mix
(refine), Write producing a file within the budget (and its rule file), the sensitivity tables, and no clipping."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantscope.core.engine.kld import chunk_ids
from quantscope.core.gguf import GGUFFile
from quantscope.core.quant.sensitivity import CostCache, calibration_identity, file_identity
from quantscope.core.quant.target import target_space
from quantscope.core.tokenizer import Tokenizer

from .arch_fixtures import vocabulary, write_fixture
from .gui_helpers import cancel_when, fit_problems, wait_idle, window  # noqa: F401

TEXT = Path(__file__).parent / "data" / "english.txt"
TYPES = "Q4_0,Q5_0,Q8_0"


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return write_fixture("llama", tmp_path_factory.mktemp("budget") / "llama-F32.gguf", "F32", vocab=vocabulary())


def _page(window, path: Path, cache: Path):  # noqa: F811
    assert window.open_path(path)
    window.show_view("lab")
    lv = window.lab_view
    lv.pages.setCurrentWidget(lv.budget_page)
    page = lv.budget_page
    page.cache_dir = cache
    page.threads = 1
    page.text_path.setText(str(TEXT))
    page.types_edit.setText(TYPES)
    page.ctx_spin.setValue(32)
    return page


def _measure(qtbot, page, timeout: int = 120000) -> None:
    with qtbot.waitSignal(page.measureFinished, timeout=timeout):
        assert page.start()
    assert page.state == "done", page.error


def test_measure_the_front_and_the_slider_change_the_mix(window, qtbot, llama, tmp_path):  # noqa: F811
    page = _page(window, llama, tmp_path / "costs")
    assert not page.slider.isEnabled() and not page.write_btn.isEnabled()
    seen: list[tuple[int, int]] = []
    with qtbot.waitSignal(page.measureFinished, timeout=120000):
        assert page.start()
        assert page.job_slot.busy and page.cancel_btn.isVisible() and not page.measure_btn.isEnabled()
        page.job_slot.task.signals.progress.connect(lambda d, t, _s: seen.append((d, t)))
    assert page.state == "done", page.error
    run = page.run
    assert seen and seen[-1][0] == seen[-1][1]
    # the costs are the core's, measured once per tensor (each tensor's smallest type) and cached on disk
    with GGUFFile(llama) as f:
        chunks = chunk_ids(Tokenizer(f).encode(TEXT.read_text(encoding="utf-8")), 32, 1, min_chunks=1)
        cache = CostCache(tmp_path / "costs", file_identity(llama), calibration_identity(chunks, None))
        space = target_space(f, types=TYPES.split(","), threads=1)
        assert [n for n, _ in space.candidates] == [c.name for c in run.costs]
    for c in run.costs:
        if len(c.costs) > 1:
            assert cache.get(c.name, c.anchor) == c.costs[c.anchor] and c.measured[c.anchor]
    # the front: sizes grow, predicted divergences fall; the presets drawn on it
    sizes = [m.file_bytes for m in run.front]
    costs = [m.cost for m in run.front]
    assert len(run.front) >= 5 and sizes == sorted(sizes) and costs == sorted(costs, reverse=True)
    assert set(run.presets) == {"Q3_K_M", "Q4_K_M", "Q5_K_M"}
    assert set(page.plot.labels) == set(run.presets)
    assert len(page.plot.points.data) == len(run.front)
    for p, m in run.presets.items():  # the preset's own file size, as the quantizer lays it out
        assert page.preset_btns[p].isVisible()
        with GGUFFile(llama) as f:
            from quantscope.core.quant.quantize import QuantizeOptions, plan_quantize

            assert m.file_bytes == plan_quantize(f, QuantizeOptions(p, allow_requantize=False)).file_bytes
    # it starts at Q4_K_M's size; the best mix there is no worse than the preset (same costs, same bytes)
    q4 = run.presets["Q4_K_M"]
    assert page.budget == q4.file_bytes and page.mix is not None
    assert page.mix.file_bytes <= q4.file_bytes and page.mix.cost <= q4.cost + 1e-12
    assert page.mix_model.rowCount() == len(run.costs)
    # the slider: at the smallest end every tensor takes its smallest type, at the largest its largest
    page.slider.setValue(0)
    qtbot.waitUntil(lambda: page.mix is not None and page.budget == run.space.smallest_file_bytes, timeout=60000)
    qtbot.wait(20)
    small = dict(page.mix.choices)
    assert page.mix.file_bytes == run.space.smallest_file_bytes
    page.slider.setValue(page.slider.maximum())
    qtbot.waitUntil(lambda: page.mix is not None and page.mix.choices != small, timeout=60000)
    big = page.mix
    assert big.file_bytes <= page.budget == run.space.largest_file_bytes and big.cost == costs[-1] < costs[0]
    assert all(q == "Q8_0" for n, q in big.choices.items() if dict(run.space.candidates)[n].count("Q8_0"))
    # the chosen-type table follows the mix, with a reason on each row
    col = {page.mix_model.headers[i]: i for i in range(page.mix_model.columnCount())}
    for r, n in enumerate(page.mix_model.keys):
        assert page.mix_model.index(r, col["Type"]).data() == big.choices[n]
        assert page.mix_model.index(r, col["Why"]).data()
    # the sensitivity tables: a row per tensor (a column per type), a row per layer
    assert page.tensor_model.rowCount() == len(run.costs)
    assert {"Q4_0", "Q5_0", "Q8_0"} <= set(page.tensor_model.headers)
    assert page.layer_model.rowCount() >= 2
    # a second run reuses the cache: nothing measured again, the same costs
    before = [c.costs for c in run.costs]
    _measure(qtbot, page)
    assert "kld_runs" not in page.run.timings and [c.costs for c in page.run.costs] == before


def test_cancel_stops_measuring_and_keeps_what_was_measured(window, qtbot, llama, tmp_path):  # noqa: F811
    page = _page(window, llama, tmp_path / "costs")
    page.chunks_spin.setValue(4)
    page.ctx_spin.setValue(64)
    reports: list[tuple[int, int, str]] = []
    with cancel_when(page.job_slot.runner, "budget-measure", lambda done, _t, _s: done >= 2, reports), \
            qtbot.waitSignal(page.measureFinished, timeout=120000) as sig:
        assert page.start()
    seen = [done for done, _t, _s in reports]
    assert sig.args == [None] and page.state == "cancelled" and page.run is None
    assert not page.job_slot.busy and page.measure_btn.isEnabled() and not page.slider.isEnabled()
    assert "Cancelled" in page.status.full_text()
    with GGUFFile(llama) as f:
        n_tensors = len(target_space(f, types=TYPES.split(","), threads=1).candidates)
    assert seen and max(seen) < n_tensors  # stopped part way
    saved = list((tmp_path / "costs").glob("kld-*.json"))
    assert len(saved) == 1  # what was measured before the cancel is kept for the next run
    import json

    kld = {k for k in json.loads(saved[0].read_text())["kld"] if not k.startswith("E:")}
    assert 2 <= len(kld) < n_tensors
    wait_idle(qtbot, window)


def test_write_makes_a_file_within_the_budget_and_check_measures_the_mix(
        window, qtbot, llama, tmp_path):  # noqa: F811
    page = _page(window, llama, tmp_path / "costs")
    _measure(qtbot, page)
    run = page.run
    budget = (run.presets["Q4_K_M"].file_bytes + run.presets["Q5_K_M"].file_bytes) // 2
    page.set_budget(budget)
    assert page.budget == budget and page.mix.file_bytes <= budget
    out = tmp_path / "out" / "mix.gguf"
    out.parent.mkdir()
    page.output.setText(str(out))
    with qtbot.waitSignal(page.writeFinished, timeout=120000) as sig:
        assert page.write()
    assert sig.args == [out] and page.write_state == "done", page.error
    assert out.stat().st_size == page.mix.file_bytes <= budget
    with GGUFFile(out) as f:
        got = {t.name: t.type_name for t in f.tensors}
    assert all(got[n] == q for n, q in page.mix.choices.items())
    rules = out.with_name("mix.tensor-types.txt").read_text().split()
    assert len(rules) == len(page.mix.choices)
    assert sorted(p.name for p in out.parent.iterdir()) == ["mix.gguf", "mix.tensor-types.txt"]  # no debris
    # the check: estimates measured, solved again, the whole mix measured once
    with qtbot.waitSignal(page.refineFinished, timeout=120000) as sig:
        assert page.refine()
    r = sig.args[0]
    assert r is not None and r.measured_kld > 0 and r.newly_measured > 0
    assert r.plan.plan.file_bytes <= budget
    assert "measures" in page.status.full_text()
    # the output may not be the open file
    page.output.setText(str(llama))
    assert not page.write() and "Cannot write" in page.status.full_text()


@pytest.fixture(scope="module")
def every_type(tmp_path_factory) -> tuple[Path, Path]:
    """A model whose rows take every type (256-blocks too), and a cost cache shared by the tests that use it."""
    from . import quantize_models

    d = tmp_path_factory.mktemp("budget-every-type")
    return quantize_models.write_model("llama", d / "llama.gguf"), d / "costs"


@pytest.mark.parametrize("size", [(1100, 700), (1920, 1080)])
def test_the_budget_page_fits_with_every_default_type(window, qtbot, every_type, size):  # noqa: F811
    from quantscope.core.quant.target import DEFAULT_TYPES

    path, cache = every_type
    page = _page(window, path, cache)
    page.types_edit.setText(",".join(DEFAULT_TYPES))
    _measure(qtbot, page)
    assert set(DEFAULT_TYPES) <= set(page.tensor_model.headers)  # a column per default type
    window.resize(*size)
    qtbot.wait(100)
    for i in range(page.tables.count()):
        page.tables.setCurrentIndex(i)
        qtbot.wait(50)
        assert fit_problems(window.lab_view) == [], (size, i)
    hidden = [c for c in range(page.tensor_model.columnCount()) if page.tensor_table.isColumnHidden(c)]
    if size == (1920, 1080):
        assert hidden == []  # room for every type
    else:
        assert 0 not in hidden  # the tensor names stay; the widest types give way


def test_numbers_and_reasons():
    from quantscope.gui.views.quant_lab_budget import milli_text

    assert [milli_text(v) for v in (0, 0.0996, 1.234, 0.0086, 0.00001, 1.2e-6)] == \
        ["0", "100", "1,234", "8.6", "0.01", "1e-03"]


def test_the_screenshot_view_measures_and_draws(llama, tmp_path):
    import os
    import subprocess
    import sys

    from PySide6.QtGui import QImage

    out = tmp_path / "budget.png"
    env = {**os.environ, "HOME": str(tmp_path), "QT_QPA_PLATFORM": "offscreen"}
    env.pop("XDG_CACHE_HOME", None)  # the cost cache follows it: the child's must be under this HOME
    env.pop("DISPLAY", None)
    r = subprocess.run([sys.executable, "-m", "quantscope.cli", str(llama), "--screenshot", str(out), "--view",
                        "budget", "--size", "1100x700", "--theme", "dark"], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    img = QImage(str(out))
    assert (img.width(), img.height()) == (1100, 700)
    assert len(list((tmp_path / ".cache" / "quantscope" / "costs").glob("kld-*.json"))) == 1  # measured, cached


def test_a_cancelled_write_leaves_nothing(window, qtbot, llama, tmp_path):  # noqa: F811
    import threading

    page = _page(window, llama, tmp_path / "costs")
    _measure(qtbot, page)
    out = tmp_path / "out" / "mix.gguf"
    out.parent.mkdir()
    page.output.setText(str(out))
    gate = threading.Event()
    runner = window.runner
    n = runner.pool.maxThreadCount()
    for _ in range(n):  # every worker thread busy: the write is queued, and cancelled before it runs
        runner.start("hold", lambda _r, _t: gate.wait(30))
    try:
        with qtbot.waitSignal(page.writeFinished, timeout=60000) as sig:
            assert page.write()
            assert page.job_slot.busy and not page.write_btn.isEnabled()
            page.cancel()
            gate.set()
    finally:
        gate.set()
    assert sig.args == [None] and page.write_state == "cancelled"
    assert "nothing was written" in page.status.full_text()
    assert list(out.parent.iterdir()) == []
    wait_idle(qtbot, window)


def test_a_calibration_text_that_is_no_file_is_refused_in_one_line(window, qtbot, llama, tmp_path):  # noqa: F811
    import os

    page = _page(window, llama, tmp_path / "costs")
    fifo = tmp_path / "text.fifo"
    os.mkfifo(fifo)
    for bad, why in ((fifo, "FIFO"), (tmp_path, "directory"), (tmp_path / "missing.txt", "")):
        page.text_path.setText(str(bad))
        with qtbot.waitSignal(page.measureFinished, timeout=60000) as sig:
            assert page.start()
        assert sig.args == [None] and page.state == "failed"
        msg = page.status.full_text()
        assert msg.startswith("Measuring failed:") and "calibration text" in msg and "\n" not in msg, msg
        assert why.lower() in msg.lower() or why == "", msg
    assert not (tmp_path / "costs").exists()  # refused before any measuring


def test_an_imatrix_change_asks_for_another_measure(window, qtbot, llama, tmp_path):  # noqa: F811
    from quantscope.core.engine.imatrix import compute_imatrix

    page = _page(window, llama, tmp_path / "costs")
    lv = window.lab_view
    assert not lv.types.isEnabled() and not lv.ref_btn.isEnabled()  # the other pages' controls
    _measure(qtbot, page)
    assert page.write_btn.isEnabled() and page.refine_btn.isEnabled()
    before = {c.name: dict(c.costs) for c in page.run.costs}
    lv.imatrix = compute_imatrix(llama, TEXT.read_text(encoding="utf-8"), n_ctx=32, max_chunks=2, threads=1)
    lv.imatrix_path = tmp_path / "im.gguf"
    lv._sources_changed()
    assert not page.write_btn.isEnabled() and not page.refine_btn.isEnabled()
    assert "Measure again" in page.status.full_text()
    _measure(qtbot, page)  # with the imatrix: other costs, another cache file
    assert page.write_btn.isEnabled()
    assert {c.name: dict(c.costs) for c in page.run.costs} != before
    assert len(list((tmp_path / "costs").glob("kld-*.json"))) == 2
    lv.pages.setCurrentWidget(lv.file_page)
    assert lv.types.isEnabled() and lv.ref_btn.isEnabled()


def test_the_check_replaces_the_mix_openly_and_write_writes_the_checked_mix(
        window, qtbot, llama, tmp_path):  # noqa: F811
    """At Q4_K_M's size the check's measurements change two tensors' types: the page says the mix was replaced
    (before → after), shows the checked mix, and Write writes that one, saying it was checked."""
    page = _page(window, llama, tmp_path / "costs")
    _measure(qtbot, page)
    page.set_budget_to_preset("Q4_K_M")
    before = page.mix
    with qtbot.waitSignal(page.refineFinished, timeout=120000) as sig:
        assert page.refine()
    r = sig.args[0]
    assert r is not None and r.swapped  # (this fixture's costs: the check swaps blk.0's ffn_gate and ffn_down)
    status = page.status.full_text()
    assert "replaced" in status and f"{before.cost:.3g}" in status and f"{r.plan.predicted_cost:.3g}" in status
    assert page.mix.choices == r.plan.choices and page.mix.file_bytes == r.plan.plan.file_bytes
    assert "checked" in page.summary.text().lower() and f"{r.measured_kld:.4g}" in page.summary.text()
    out = tmp_path / "out" / "mix.gguf"
    out.parent.mkdir()
    page.output.setText(str(out))
    with qtbot.waitSignal(page.writeFinished, timeout=120000) as sig:
        assert page.write()
    assert sig.args == [out]
    with GGUFFile(out) as f:
        got = {t.name: t.type_name for t in f.tensors}
    assert all(got[n] == q for n, q in r.plan.choices.items())
    assert "the checked mix" in page.status.full_text()
    # another budget: the mix shown is no longer the checked one, and the page says so
    page.set_budget_to_preset("Q5_K_M")
    assert "not the checked mix" in page.summary.text().lower()


def test_cancelling_a_second_measure_keeps_the_first_ones_results(window, qtbot, llama, tmp_path):  # noqa: F811
    page = _page(window, llama, tmp_path / "costs")
    _measure(qtbot, page)
    run, mix = page.run, page.mix
    rows, points = page.mix_model.rowCount(), len(page.plot.points.data)
    assert rows > 0 and points > 0
    page.chunks_spin.setValue(3)  # another calibration: measured anew (nothing cached)

    with cancel_when(page.job_slot.runner, "budget-measure", lambda done, _t, _s: done >= 1), \
            qtbot.waitSignal(page.measureFinished, timeout=120000) as sig:
        assert page.start()
    assert sig.args == [None] and page.state == "cancelled"
    assert page.run is run and page.mix is not None and page.mix.choices == mix.choices
    assert page.mix_model.rowCount() == rows and len(page.plot.points.data) == points
    assert page.tensor_model.rowCount() == len(run.costs)
    assert page.slider.isEnabled() and page.write_btn.isEnabled()
    assert "kept" in page.status.full_text()


def test_the_mix_against_a_preset_in_words():
    from quantscope.gui.views.quant_lab_budget import against_text

    assert against_text(0.15, 1.143) == "7.6× less"  # (never "87 %"-style rounding up to "100 % less")
    assert against_text(0.001, 0.9) == "900× less"
    assert against_text(0.6, 1.0) == "40 % less"
    assert against_text(0.996, 1.0) == "0.4 % less"
    assert against_text(1.2, 1.0) == "20 % more"
    assert against_text(1.0, 1.0) == "the same"
