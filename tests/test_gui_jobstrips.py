"""The views' job strips (issue 47 item 5): every view's run / Cancel / progress / status is a JobStrip (none built
by hand), its attribute names kept; each strip's idle look (hidden or greyed), and its states through a real job
held under way: running, Cancel greyed with "Cancelling…" once clicked, idle again when the job has ended."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialogButtonBox, QProgressBar, QWidget

from quantscope.core.quant.quantize import QuantizeOptions, quantize_file
from quantscope.gui.views.quant_lab import FILE_TASK
from quantscope.gui.widgets.jobstrip import JobStrip

from . import quantize_models
from .gui_helpers import hold_when, wait_idle, window  # noqa: F401


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("gui-jobstrips")
    a = quantize_models.write_model("llama", d / "llama.gguf")
    b = d / "llama-Q8_0.gguf"
    quantize_file(a, b, QuantizeOptions("Q8_0"))
    return a, b


def _hand_built_bars(root: QWidget) -> list[str]:
    """Progress bars that are not a JobStrip's."""
    return [b.accessibleName() for b in root.findChildren(QProgressBar) if not isinstance(b.parentWidget(), JobStrip)]


def _tab_chain(start: QWidget, n: int = 12) -> list[QWidget]:
    """The widgets Tab reaches from ``start`` (visible, enabled, taking Tab focus), in order."""
    chain, w = [start], start.nextInFocusChain()
    while len(chain) < n and w is not start:
        if w.focusPolicy() & Qt.FocusPolicy.TabFocus and w.isVisible() and w.isEnabled():
            chain.append(w)
        w = w.nextInFocusChain()
    return chain


def _aliases(view: object, **names: str) -> None:
    strip = view.strip  # type: ignore[attr-defined]
    assert isinstance(strip, JobStrip)
    for alias, part in names.items():
        assert getattr(view, alias) is getattr(strip, part), alias


def _idle_hidden(strip: JobStrip) -> bool:
    return not strip.progress.isVisible() and not strip.cancel_btn.isVisible() and strip.run_btn.isVisible()


def _idle_greyed(strip: JobStrip) -> bool:
    return (strip.progress.isVisible() and strip.cancel_btn.isVisible() and not strip.cancel_btn.isEnabled()
            and strip.run_btn.isVisible())


def test_every_view_shows_its_job_in_a_strip(window, qtbot, files):  # noqa: F811
    assert window.open_path(files[0])
    for key in ("lab", "probe"):
        window.show_view(key)
    lab, probe = window.lab_view, window.probe_view
    for page in (lab.tensor_page, lab.file_page):
        _aliases(page, run_btn="run_btn", cancel_btn="cancel_btn", progress="progress", status="status")
    _aliases(probe, run_btn="run_btn", cancel_btn="cancel_btn", progress="progress", status="status")
    window.show_view("lab")
    lab.pages.setCurrentWidget(lab.file_page)
    fp = lab.file_page
    assert _idle_hidden(fp.strip) and fp.run_btn.isEnabled() and fp.export_btn.isVisible()
    # the options, then the buttons, then Export (greyed until a result) in the first row; the bar and the status
    # under them
    chain = _tab_chain(fp.pattern)
    assert chain.index(fp.pattern) < chain.index(fp.rows_spin) < chain.index(fp.run_btn)
    assert fp.strip.row.indexOf(fp.export_btn) == fp.strip.row.count() - 1 and not fp.export_btn.isEnabled()
    assert fp.strip.status_row.indexOf(fp.progress) == 0 and fp.strip.status_row.indexOf(fp.status) == 1
    window.show_view("probe")
    assert _idle_hidden(probe.strip) and probe.run_btn.isEnabled()

    dialogs = {"diff": window.show_diff(), "compare": window.show_compare(), "convert": window.show_convert(),
               "quantize": window.show_quantize()}
    for name, dlg in dialogs.items():
        assert dlg is not None, name
        _aliases(dlg, start_btn="run_btn", cancel_btn="cancel_btn", progress="progress", status="status")
        assert _idle_greyed(dlg.strip), name  # the bar and Cancel in place, Cancel greyed while nothing runs
    # the dialogs' buttons: the diff and compare strips hold theirs; convert and quantize put theirs in the box
    for name in ("convert", "quantize"):
        dlg = dialogs[name]
        assert dlg.start_btn.parentWidget() is dlg.buttons and dlg.cancel_btn.parentWidget() is dlg.buttons
        assert dlg.buttons.buttonRole(dlg.start_btn) == QDialogButtonBox.ButtonRole.AcceptRole
        assert dlg.buttons.buttonRole(dlg.cancel_btn) == QDialogButtonBox.ButtonRole.ActionRole
    assert dialogs["diff"].strip.row.indexOf(dialogs["diff"].setup) == 0
    assert dialogs["diff"].strip.status_row.indexOf(dialogs["diff"].rate) == 2
    views = (window.overview, window.tensors_view, window.block_view, lab, window.bump_view, probe,
             window.serve_view)
    for root in (*views, *dialogs.values()):
        assert _hand_built_bars(root) == [], root
    for dlg in dialogs.values():
        dlg.close()


def test_the_whole_file_strip_through_a_held_run(window, qtbot, files):  # noqa: F811
    assert window.open_path(files[0])
    window.show_view("lab")
    lab = window.lab_view
    fp = lab.file_page
    lab.pages.setCurrentWidget(fp)
    with hold_when(window.runner, FILE_TASK, lambda done, _t, _m: done > 0) as held:
        fp.start()
        assert fp.strip.busy and fp.progress.isVisible() and fp.cancel_btn.isVisible() and fp.cancel_btn.isEnabled()
        assert fp.run_btn.isVisible() and not fp.run_btn.isEnabled()  # greyed in place while it runs
        assert not fp.pattern.isEnabled() and fp.status.full_text() == "Checking the tensors…"
        qtbot.waitUntil(held.is_set, timeout=120000)
        fp.cancel_btn.click()
        assert fp.status.full_text() == "Cancelling…" and not fp.cancel_btn.isEnabled() and fp.cancel_btn.isVisible()
        qtbot.waitUntil(lambda: fp.state == "cancelled", timeout=120000)
    wait_idle(qtbot, window)
    assert _idle_hidden(fp.strip) and fp.run_btn.isEnabled() and fp.pattern.isEnabled()
    assert fp.status.full_text() == "Cancelled: nothing measured." and fp.progress.value() == 0
    # measured to the end: idle again, the figures shown
    with qtbot.waitSignal(fp.runFinished, timeout=120000):
        fp.start()
    wait_idle(qtbot, window)
    assert fp.state == "done" and _idle_hidden(fp.strip) and fp.run_btn.isEnabled() and fp.export_btn.isEnabled()


def test_the_diff_strip_through_a_held_run(window, qtbot, files):  # noqa: F811
    from quantscope.gui.views.diff_view import DIFF_TASK

    assert window.open_path(files[0])
    dlg = window.show_diff()
    assert dlg is not None
    dlg.set_other(files[1])
    assert dlg.status.full_text() == "Choose the other file, then Compare." and dlg.progress.value() == 0
    with hold_when(window.runner, DIFF_TASK, lambda _d, _t, _m: True) as held:
        dlg.start()
        assert dlg.strip.busy and dlg.cancel_btn.isEnabled() and not dlg.start_btn.isEnabled()
        assert not dlg.setup.isEnabled() and dlg.progress.isVisible()
        qtbot.waitUntil(held.is_set, timeout=120000)
        dlg.cancel_btn.click()
        assert dlg.status.full_text() == "Cancelling…" and not dlg.cancel_btn.isEnabled()
        qtbot.waitUntil(lambda: dlg.state != "running", timeout=120000)
    wait_idle(qtbot, window)
    # however it ended (the held report may have been the last), the strip is idle: Compare back, Cancel greyed
    assert _idle_greyed(dlg.strip) and dlg.start_btn.isEnabled() and dlg.setup.isEnabled() and not dlg.strip.busy
    with qtbot.waitSignal(dlg.diffFinished, timeout=120000):
        dlg.start()
    wait_idle(qtbot, window)
    assert dlg.state == "done" and dlg.progress.value() == 1000 and _idle_greyed(dlg.strip)
    dlg.close()


def test_the_quantize_strip_through_a_held_run(window, qtbot, files, tmp_path):  # noqa: F811
    assert window.open_path(files[0])
    dlg = window.show_quantize()
    assert dlg is not None
    dlg.output.setText(str(tmp_path / "out.gguf"))
    with hold_when(window.runner, "quantize", lambda _d, _t, _m: True) as held:
        dlg.start()
        assert dlg.strip.busy and dlg.cancel_btn.isEnabled() and not dlg.start_btn.isEnabled()
        qtbot.waitUntil(held.is_set, timeout=120000)
        dlg.cancel_btn.click()
        assert dlg.status.text() == "Cancelling…" and not dlg.cancel_btn.isEnabled()
        qtbot.waitUntil(lambda: dlg.state != "running", timeout=120000)
    wait_idle(qtbot, window)
    assert _idle_greyed(dlg.strip) and dlg.start_btn.isEnabled() and dlg.start_btn.text() == "Quantize again"
    dlg.close()
