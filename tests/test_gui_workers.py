"""Background work in the GUI: conversion through the dialog (verifies; cancel leaves nothing), the bump
inspector, the event loop ticking while statistics and a conversion run, and closing mid-job."""

from __future__ import annotations

import threading

from PySide6.QtCore import Qt, QTimer

from quantscope.core.bump import verify_against

from .gui_helpers import hold_when, wait_idle, window  # noqa: F401


def test_convert_dialog_writes_a_file_that_verifies_and_opens(window, qtbot, tmp_path, model_path):  # noqa: F811
    src = model_path("qwen2.5-coder")
    assert window.open_path(src)
    dlg = window.show_convert()
    assert dlg is not None and dlg.isVisible()
    out = tmp_path / "out" / "qwen.bump"
    out.parent.mkdir()  # writers refuse a missing folder
    dlg.output.setText(str(out))
    assert dlg.manifest.text() == str(out.parent / "manifest.json")  # follows the output folder
    dlg.manifest_check.setChecked(True)
    dlg.config_check.setChecked(True)
    progress = []

    def record(task) -> None:  # type: ignore[no-untyped-def]  # connected before the task is queued: every report
        if task.name == "convert":
            task.signals.progress.connect(lambda d, t, _s: progress.append((d, t)))

    window.runner.on_start.append(record)
    try:
        with qtbot.waitSignal(dlg.conversionFinished, timeout=120000) as sig:
            dlg.start()
    finally:
        window.runner.on_start.remove(record)
    res = sig.args[0]
    assert res is not None and dlg.state == "done" and res.path == out
    assert progress and progress[-1][0] == progress[-1][1] == out.stat().st_size
    assert "MB/s" in dlg.rate.text() and "left" in dlg.rate.text()
    html = dlg.summary.toPlainText()
    assert "✓ Converted" in html and res.sha256 in html and "lm_head" in html and "copy" in html
    assert "Sections" in html and "Q5_0" in html
    assert (out.parent / "manifest.json").is_file() and (out.parent / "config.json").is_file()
    rep = verify_against(out, src)
    assert rep.ok, rep.problems
    # "Open the result" shows the bump inspector
    dlg.open_btn.click()
    assert window.doc.kind == "bump" and window.current_view() == "bump"
    bv = window.bump_view
    qtbot.waitUntil(lambda: bv.checksum_ok is not None, timeout=120000)
    assert bv.checksum_ok is True and "checksum verifies" in bv.checksum.text()
    assert bv.sections_model.rowCount() == 14 * 24 + 4
    header = dict(bv.header_model.rows)
    assert header["magic"] == "BUMPWGT3" and header["num_layers"] == "24" and header["checksum (sha256)"] == res.sha256
    assert {r[1] for r in bv.dtype_model.rows} >= {"F32", "Q5_0", "Q4_K", "Q6_K", "Q8_0"}
    # bump files open directly too (menu / command line)
    window.close_document()
    assert window.open_path(out) and window.doc.kind == "bump"
    assert window.tabs.isTabVisible(window._tab["bump"]) and not window.tabs.isTabVisible(window._tab["tensors"])


def test_cancel_leaves_nothing_behind(window, qtbot, tmp_path, model_path):  # noqa: F811
    assert window.open_path(model_path("qwen2.5-coder"))
    dlg = window.show_convert()
    out_dir = tmp_path / "cancelled"
    out_dir.mkdir()
    dlg.output.setText(str(out_dir / "x.bump"))
    dlg.manifest_check.setChecked(True)
    with qtbot.waitSignal(dlg.conversionFinished, timeout=120000) as sig:
        dlg.start()
        # cancel from inside the worker as soon as the first bytes are written (deterministic)
        dlg.task.signals.progress.connect(
            lambda d, t, s, task=dlg.task: task.cancel() if d > 0 else None, Qt.ConnectionType.DirectConnection)
    assert sig.args == [None] and dlg.state == "cancelled"
    assert "nothing was written" in dlg.status.text()
    assert list(out_dir.iterdir()) == []


def test_refused_conversion_says_why(window, qtbot, tmp_path, model_path):  # noqa: F811
    assert window.open_path(model_path("smollm2"))  # Q4_1 weights: no BUMPWGT3 runtime takes them
    dlg = window.show_convert()
    dlg.output.setText(str(tmp_path / "s.bump"))
    with qtbot.waitSignal(dlg.conversionFinished, timeout=120000) as sig:
        dlg.start()
    assert sig.args == [None] and dlg.state == "failed"
    assert "Q4_1" in dlg.error and "Conversion failed" in dlg.status.text()
    assert list(tmp_path.glob("*.bump")) == [] and list(tmp_path.glob(".*tmp*")) == []


def test_stats_and_conversion_run_in_workers_while_the_loop_runs(window, qtbot, tmp_path, model_path):  # noqa: F811
    """Statistics and a conversion at once, each held in its worker mid-way: the event loop keeps running (a timer
    fires, the views answer) while both are under way, then both finish and are drawn. Held, not timed: a GUI
    thread that did the work or waited for a worker would hang here on any machine, while timer gaps measured in
    wall time grow on a loaded one. Time spent in the slots that draw the results is the watchdog's to judge
    (tests/watchdog.py, GUI-thread CPU time)."""
    assert window.open_path(model_path("qwen2.5-coder"))
    wait_idle(qtbot, window)
    tv = window.tensors_view
    dlg = window.show_convert()
    dlg.output.setText(str(tmp_path / "tick.bump"))
    qtbot.waitExposed(dlg)
    qtbot.waitUntil(lambda: dlg.refusals is not None, timeout=120000)  # the profile check it runs on opening
    wait_idle(qtbot, window)
    first = lambda done, _t, _m: done > 0  # noqa: E731
    with hold_when(window.runner, "tensor-stats", first) as stats, hold_when(window.runner, "convert", first) as conv:
        tv.select_tensor("output.weight")  # 151936 × 896 Q8_0: 136 M values through the native kernels
        dlg.start()
        assert len(window.runner.running()) == 2
        qtbot.waitUntil(lambda: stats.is_set() and conv.is_set(), timeout=120000)
        assert stats.thread is not threading.main_thread() and conv.thread is not threading.main_thread()
        assert stats.thread is not conv.thread
        fired: list[bool] = []
        QTimer.singleShot(20, lambda: fired.append(True))
        qtbot.waitUntil(lambda: bool(fired), timeout=60000)
        window.show_view("metadata")  # the window answers while both work
        window.show_view("tensors")
        assert dlg.state == "running" and len(window.runner.running()) == 2
        stats.release.set()
        conv.release.set()
        wait_idle(qtbot, window, timeout=300000)
    assert tv.analysis is not None and tv.analysis.tensor == "output.weight" and dlg.state == "done"


def test_closing_mid_job_shuts_down_cleanly(qtbot, tmp_path, model_path):
    from PySide6.QtCore import QSettings

    from quantscope.gui.mainwindow import MainWindow

    w = MainWindow(QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(w)
    w.show()
    assert w.open_path(model_path("qwen2.5-coder"))
    dlg = w.show_convert()
    out_dir = tmp_path / "closing"
    out_dir.mkdir()  # (a missing folder is refused before anything starts)
    dlg.output.setText(str(out_dir / "c.bump"))
    # the file's scan and the dialog's profile check end first: the pool's two threads are then the statistics'
    # and the conversion's (else the conversion could wait in the queue behind them)
    qtbot.waitUntil(lambda: dlg.refusals is not None, timeout=120000)
    wait_idle(qtbot, w, timeout=300000)
    w.tensors_view.select_tensor("output.weight")
    # the conversion is held in its worker at its first report until the window's close cancels it: closing
    # lands mid-job on any machine (a close that waited for the job instead of cancelling it would not return
    # until the hold's guard, and the whole file would be left)
    with hold_when(w.runner, "convert", lambda done, _t, _m: done > 0) as held:
        dlg.start()
        qtbot.waitUntil(held.is_set, timeout=120000)
        assert dlg.state == "running"
        assert w.close()
    assert not w.runner.running() and w.runner.pool.activeThreadCount() == 0
    assert list(out_dir.iterdir()) == []  # cancelled: no output, no temporary


def test_a_file_no_profile_takes_is_said_when_the_dialog_opens(window, qtbot, model_path):  # noqa: F811
    """SmolLM2 Q4_1: both profiles refuse its weights. The dialog says so as it opens (checked in a worker), with
    Convert disabled, and offers the way out: requantize first (the Quantize dialog on Q8_0, which ckernel takes)."""
    assert window.open_path(model_path("smollm2"))
    dlg = window.show_convert()
    qtbot.waitUntil(lambda: dlg.refusals is not None, timeout=120000)
    assert set(dlg.refusals) == {"ckernel", "seed"} and "Q4_1" in dlg.refusals["ckernel"]
    assert not dlg.start_btn.isEnabled() and dlg.requant_btn.isVisible()
    text = dlg.status.text()
    assert "Q4_1" in text and "neither profile" in text.lower() and "quantscope quantize" in text
    dlg.requant_btn.click()
    q = window.quantize_dialog
    assert q is not None and q.isVisible() and q.preset_name() == "Q8_0" and q.requant.isChecked()
    q.close()
    dlg.close()


def test_a_file_a_profile_takes_opens_ready(window, qtbot, model_path):  # noqa: F811
    assert window.open_path(model_path("qwen2.5-coder"))
    dlg = window.show_convert()
    qtbot.waitUntil(lambda: dlg.refusals is not None, timeout=120000)
    assert dlg.refusals.get("ckernel") is None and dlg.start_btn.isEnabled() and not dlg.requant_btn.isVisible()
    dlg.close()


def test_opening_a_bump_reads_only_the_section_rows_in_view(
        window, qtbot, tmp_path, model_path, monkeypatch):  # noqa: F811
    """Showing the bump inspector measured its columns over every section (Qt's ResizeToContents reads 1,000 rows
    per column, a Python call each, on each layout: "Open the result" stalled the window ~1 s). Only the rows in
    view are read for display now (sorting reads its own role)."""
    from quantscope.core.bump import ConvertJob
    from quantscope.gui.models import BumpSectionsModel

    out = tmp_path / "qwen.bump"
    ConvertJob(model_path("qwen2.5-coder"), out).run()
    read: list[int] = []
    original = BumpSectionsModel.data.qt_original

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):  # type: ignore[no-untyped-def]
        if role == Qt.ItemDataRole.DisplayRole and index.isValid():
            read.append(index.row())
        return original(self, index, role)

    monkeypatch.setattr(BumpSectionsModel.data, "qt_original", data)
    window.resize(1100, 700)
    assert window.open_path(out) and window.current_view() == "bump"
    bv = window.bump_view
    qtbot.waitExposed(bv.sections_table)
    qtbot.waitUntil(lambda: bv.checksum_ok is not None, timeout=120000)
    shown = bv.sections_table.rowAt(bv.sections_table.viewport().height() - 1)
    n = bv.sections_model.rowCount()
    assert n > 300 and 0 < shown < 100
    assert read and len({r for r in read}) <= shown + 2, (len(set(read)), shown)
