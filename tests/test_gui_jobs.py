"""Every worker-backed control goes idle again however its job ends (issue 34): normally, cancelled, failed, or so
fast that the task ended before the code that started it could connect anything (the Probe stayed "running"
forever that way). The views use one helper for it, :class:`~quantscope.gui.workers.JobSlot`; these tests drive it
and each view that uses it through the four endings."""

from __future__ import annotations

import pytest

from quantscope.core.jobs import Cancelled
from quantscope.gui.workers import JobSlot, TaskRunner

from .gui_helpers import wait_idle, window  # noqa: F401


def run_at_once(runner: TaskRunner, monkeypatch) -> None:
    """Make ``runner`` run each task inside ``start()``, on the GUI thread: it has ended, every signal emitted,
    before ``start()`` returns — the race of a task that ends before its end signal is connected, made certain."""
    monkeypatch.setattr(runner.pool, "start", lambda task: task.run())


class Recorder:
    def __init__(self) -> None:
        self.events: list[object] = []

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return lambda *a: self.events.append((name, *a))


def _slot(qtbot):  # type: ignore[no-untyped-def]
    runner = TaskRunner()
    rec = Recorder()
    slot = JobSlot(runner, on_busy=rec.busy)
    return runner, slot, rec


def _callbacks(rec: Recorder) -> dict:
    return {"on_done": rec.done, "on_failed": lambda m, _tb: rec.failed(m), "on_cancelled": rec.cancelled}


def test_normal_end(qtbot):
    runner, slot, rec = _slot(qtbot)
    slot.start("job", lambda _r, _t: 42, **_callbacks(rec))
    assert slot.busy and rec.events == [("busy", True)]
    qtbot.waitUntil(lambda: not slot.busy, timeout=60000)
    assert rec.events == [("busy", True), ("done", 42), ("busy", False)]
    runner.shutdown()


def test_cancelled(qtbot):
    runner, slot, rec = _slot(qtbot)

    def work(_r, token):  # type: ignore[no-untyped-def]
        while not token.cancelled:
            pass
        raise Cancelled("stop")

    slot.start("job", work, **_callbacks(rec))
    slot.cancel()
    qtbot.waitUntil(lambda: not slot.busy, timeout=60000)
    assert rec.events == [("busy", True), ("cancelled",), ("busy", False)]
    runner.shutdown()


def test_failed(qtbot):
    runner, slot, rec = _slot(qtbot)

    def work(_r, _t):  # type: ignore[no-untyped-def]
        raise ValueError("bad input")

    slot.start("job", work, **_callbacks(rec))
    qtbot.waitUntil(lambda: not slot.busy, timeout=60000)
    assert rec.events == [("busy", True), ("failed", "bad input"), ("busy", False)]
    runner.shutdown()


@pytest.mark.parametrize("outcome", ["done", "failed", "cancelled"])
def test_ended_before_start_returned(qtbot, monkeypatch, outcome):
    runner, slot, rec = _slot(qtbot)
    run_at_once(runner, monkeypatch)

    def work(_r, _t):  # type: ignore[no-untyped-def]
        if outcome == "failed":
            raise ValueError("bad input")
        if outcome == "cancelled":
            raise Cancelled("stop")
        return 7

    slot.start("job", work, **_callbacks(rec))
    assert not slot.busy and not runner.running()
    assert rec.events[0][0] == outcome and rec.events[-1] == ("busy", False)
    assert ("busy", True) not in rec.events


def test_refused_by_a_closed_runner_is_idle_at_once(qtbot):
    runner, slot, rec = _slot(qtbot)
    runner.shutdown()
    slot.start("job", lambda _r, _t: 1, **_callbacks(rec))
    assert not slot.busy and rec.events == [("cancelled",), ("busy", False)]


def test_a_replaced_or_forgotten_job_reports_nothing(qtbot):
    runner, slot, rec = _slot(qtbot)

    def slow(_r, token):  # type: ignore[no-untyped-def]
        while not token.cancelled:
            pass
        return "old"

    slot.start("job", slow, **_callbacks(rec))
    slot.start("job", lambda _r, _t: "new", **_callbacks(rec))
    qtbot.waitUntil(lambda: not slot.busy, timeout=120000)
    wait_runner = runner.wait(120000)  # a hang guard: the old job ends once it sees its cancel
    assert wait_runner
    qtbot.wait(50)  # the ended tasks' signals are queued already: delivered here
    assert ("done", "old") not in rec.events and ("done", "new") in rec.events
    assert rec.events[-1] == ("busy", False)
    slot.start("job", slow, **_callbacks(rec))
    slot.forget()
    assert not slot.busy and rec.events[-1] == ("busy", False)
    assert runner.wait(120000)
    qtbot.wait(50)
    assert rec.events[-1] == ("busy", False) and ("cancelled",) not in rec.events
    runner.shutdown()


# ---------------------------------------------------------------------------------------------- the views
def _probe_idle(pv) -> bool:  # type: ignore[no-untyped-def]
    return (not pv.busy and pv.run_btn.isEnabled() and pv.target.isEnabled() and not pv.progress.isVisible()
            and not pv.cancel_btn.isVisible())


def test_probe_is_idle_after_a_run_and_after_an_attention_job_that_ends_at_once(window, qtbot, model_path,  # noqa: F811
                                                                                 monkeypatch):
    assert window.open_path(model_path("smollm2"))
    window.show_view("probe")
    pv = window.probe_view
    pv.prompt.setPlainText("The capital of France is")
    with qtbot.waitSignal(pv.ranOut, timeout=120000) as sig:
        assert pv.run()
    assert sig.args == ["done"]
    qtbot.waitUntil(lambda: _probe_idle(pv), timeout=120000)
    wait_idle(qtbot, window)
    # the attention page asks for a layer: a job so short that it ended before start() returned
    run_at_once(window.runner, monkeypatch)
    pv._attention.clear()
    pv.want_attention(1)
    assert 1 in pv._attention and pv.state == "done"
    qtbot.wait(10)
    assert _probe_idle(pv), "the Probe stayed busy after a job that ended at once"
    # and the logit lens recomputed for the other target (instant too)
    pv.target.setCurrentIndex(1)
    qtbot.wait(10)
    assert pv.result.lens.target_kind == "next" and _probe_idle(pv)


def test_probe_is_idle_after_a_cancel_and_after_a_failure(window, qtbot, model_path, monkeypatch):  # noqa: F811
    from quantscope.gui.views import probe as probe_module

    assert window.open_path(model_path("smollm2"))
    window.show_view("probe")
    pv = window.probe_view
    pv.prompt.setPlainText("The capital of France is")

    def failing_load(*_a):  # type: ignore[no-untyped-def]
        raise RuntimeError("no engine today")

    monkeypatch.setattr(probe_module, "_load_engine", failing_load)
    with qtbot.waitSignal(pv.ranOut, timeout=120000) as sig:
        assert pv.run()
    assert sig.args == ["failed"] and "no engine today" in pv.status.full_text()
    qtbot.waitUntil(lambda: _probe_idle(pv), timeout=60000)

    def slow_load(_path, cancel, _report):  # type: ignore[no-untyped-def]
        while not cancel.cancelled:
            pass
        raise Cancelled("stop")

    monkeypatch.setattr(probe_module, "_load_engine", slow_load)
    assert pv.run() and pv.busy and pv.cancel_btn.isVisible() and not pv.run_btn.isEnabled()
    with qtbot.waitSignal(pv.ranOut, timeout=120000) as sig:
        pv.cancel_btn.click()
    assert sig.args == ["cancelled"]
    qtbot.waitUntil(lambda: _probe_idle(pv), timeout=60000)


def _stats_idle(tv) -> bool:  # type: ignore[no-untyped-def]
    return not tv.stats_job.busy and not tv.progress.isVisible() and not tv.cancel_btn.isVisible()


@pytest.mark.parametrize("ending", ["done", "failed", "cancelled", "at once"])
def test_tensor_statistics_end_idle(window, qtbot, model_path, monkeypatch, ending):  # noqa: F811
    from quantscope.gui.views import tensors as tensors_module

    assert window.open_path(model_path("smollm2"))
    window.show_view("tensors")
    tv = window.tensors_view
    real = tensors_module.analyze_tensor
    if ending == "failed":
        def analyze(*_a, **_k):  # type: ignore[no-untyped-def]
            raise RuntimeError("kernel trouble")
        monkeypatch.setattr(tensors_module, "analyze_tensor", analyze)
    elif ending == "cancelled":
        def analyze(*_a, cancel=None, **_k):  # type: ignore[no-untyped-def]
            while not cancel.cancelled:
                pass
            raise Cancelled("stop")
        monkeypatch.setattr(tensors_module, "analyze_tensor", analyze)
    elif ending == "at once":
        monkeypatch.setattr(tensors_module, "analyze_tensor", real)
        run_at_once(window.runner, monkeypatch)
    tv.select_tensor("blk.0.attn_q.weight")
    if ending == "cancelled":
        assert tv.stats_job.busy and tv.cancel_btn.isVisible()
        tv.cancel_btn.click()
    qtbot.waitUntil(lambda: _stats_idle(tv), timeout=120000)
    text = tv.progress_label.text()
    assert {"done": "Computed in", "at once": "Computed in", "failed": "Statistics failed: kernel trouble",
            "cancelled": "Statistics cancelled."}[ending] in text
    assert tv.retry_btn.isVisible() == (ending in ("failed", "cancelled"))
    wait_idle(qtbot, window)


def test_a_new_file_leaves_no_message_of_the_last(window, qtbot, model_path, tmp_path):  # noqa: F811
    """Issue 34 item 4: "Values of … cannot be computed" and "Computed in … (cached)" stayed under an empty
    "Select a tensor" after opening another file."""
    from .test_integrity_first import truncated_file

    assert window.open_path(truncated_file(tmp_path / "cut.gguf"))
    window.show_view("tensors")
    tv = window.tensors_view
    tv.select_tensor("blk.3.ffn_down.weight")
    assert "cannot be computed" in tv.progress_label.text() and tv.progress_label.isVisible()
    assert window.open_path(model_path("smollm2"))
    assert tv.title.text() == "Select a tensor"
    assert not tv.progress_label.isVisible() or tv.progress_label.text() == ""
    tv.select_tensor("blk.0.attn_q.weight")
    qtbot.waitUntil(lambda: "Computed in" in tv.progress_label.text(), timeout=120000)
    wait_idle(qtbot, window)
    assert window.open_path(model_path("gemma3"))
    assert tv.title.text() == "Select a tensor" and "Computed" not in tv.progress_label.text()


def _scan_idle(ov) -> bool:  # type: ignore[no-untyped-def]
    return (not ov.scan_job.busy and not ov.scan_progress.isVisible() and not ov.scan_cancel.isVisible()
            and ov.scan_again.isVisible())


@pytest.mark.parametrize("ending", ["done", "failed", "cancelled", "at once"])
def test_overview_scale_scan_ends_idle(window, qtbot, model_path, monkeypatch, ending):  # noqa: F811
    from quantscope.gui.views import overview as overview_module

    real = overview_module.scan_scales
    if ending == "failed":
        def scan(*_a, **_k):  # type: ignore[no-untyped-def]
            raise RuntimeError("unreadable")
        monkeypatch.setattr(overview_module, "scan_scales", scan)
    elif ending == "cancelled":
        def scan(*_a, cancel=None, **_k):  # type: ignore[no-untyped-def]
            while not cancel.cancelled:
                pass
            raise Cancelled("stop")
        monkeypatch.setattr(overview_module, "scan_scales", scan)
    elif ending == "at once":
        monkeypatch.setattr(overview_module, "scan_scales", real)
        run_at_once(window.runner, monkeypatch)
    assert window.open_path(model_path("smollm2"))
    ov = window.overview
    if ending == "cancelled":
        assert ov.scan_job.busy and ov.scan_cancel.isVisible()
        ov.scan_cancel.click()
    qtbot.waitUntil(lambda: _scan_idle(ov), timeout=120000)
    assert {"done": "no NaN/Inf scales", "at once": "no NaN/Inf scales", "failed": "failed: unreadable",
            "cancelled": "cancelled"}[ending] in ov.scan_label.text()
    wait_idle(qtbot, window)


def test_a_conversion_that_ends_at_once_leaves_the_dialog_idle(
        window, qtbot, model_path, monkeypatch, tmp_path):  # noqa: F811
    assert window.open_path(model_path("smollm2"))
    dlg = window.show_convert()
    dlg.output.setText(str(tmp_path / "smol.bump"))
    run_at_once(window.runner, monkeypatch)
    dlg.start()  # the whole conversion ran inside start()
    assert dlg.state in ("done", "failed"), dlg.state
    assert dlg.task is None and dlg.start_btn.isEnabled() and not dlg.cancel_btn.isEnabled()
    dlg.reject()


@pytest.mark.parametrize("ending", ["done", "at once", "failed at once", "cancelled"])
def test_the_imatrix_viewer_ends_idle(window, qtbot, monkeypatch, tmp_path, ending):  # noqa: F811
    """The importance-matrix viewer's read: shown (or its error shown) however it ends, never left "Reading…"."""
    from quantscope.core.jobs import Cancelled
    from quantscope.gui.views import imatrix_dialog as imatrix_module

    from .test_gui_compare import IMATRIX

    dlg = window.show_imatrix()
    path = IMATRIX / "qwen2.imatrix.gguf"
    if ending == "failed at once":
        path = tmp_path / "bad.imatrix.gguf"
        path.write_bytes(b"GGUF" + b"\xff" * 60)
    if ending == "cancelled":
        def read(_p, *_a, **_k):  # type: ignore[no-untyped-def]
            raise Cancelled("stopped")
        monkeypatch.setattr(imatrix_module, "read_imatrix", read)
    if ending != "done":
        run_at_once(window.runner, monkeypatch)
    dlg.open_file(path)
    qtbot.waitUntil(lambda: not dlg.busy, timeout=120000)
    assert "Reading" not in dlg.info.text()
    if ending in ("done", "at once"):
        assert dlg.imatrix is not None and dlg.model.rowCount() == 28 and dlg.error is None
    elif ending == "failed at once":
        assert dlg.imatrix is None and dlg.error and "Cannot read this file" in dlg.info.text()
    else:
        assert dlg.imatrix is None and dlg.error is None and "cancelled" in dlg.info.text().lower()
    dlg.close()
    wait_idle(qtbot, window)
