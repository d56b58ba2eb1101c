"""The job strip (issue 47 item 5): one widget for a view's run / cancel / progress / status, its states after each
call, its signals and its accessible names."""

from __future__ import annotations

from PySide6.QtCore import Qt

from quantscope.gui.widgets.jobstrip import JobStrip


def _strip(qtbot, **kw) -> JobStrip:  # type: ignore[no-untyped-def]
    s = JobStrip("scale scan", "Scan again", status_text="waiting", **kw)
    qtbot.addWidget(s)
    s.show()
    return s


def _running(s: JobStrip) -> bool:
    return s.progress.isVisible() and s.cancel_btn.isVisible() and not s.run_btn.isVisible()


def _idle(s: JobStrip) -> bool:
    return not s.progress.isVisible() and not s.cancel_btn.isVisible() and s.run_btn.isVisible()


def test_idle_then_running_then_each_ending(qtbot) -> None:  # type: ignore[no-untyped-def]
    s = _strip(qtbot)
    assert _idle(s) and not s.busy and s.status.text() == "waiting" and s.progress.maximum() == 100
    for end, text, value in (("finished", "done", 100), ("failed", "it broke", 0), ("cancelled", "Cancelled.", 0)):
        s.started("scanning…")
        assert _running(s) and s.busy and s.cancel_btn.isEnabled() and s.progress.value() == 0
        assert s.status.text() == "scanning…"
        s.progress_to(3, 4, "three of four")
        assert s.progress.value() == 75 and s.status.text() == "three of four"
        s.progress_to(5, 4)  # never past the end; no text keeps the status
        assert s.progress.value() == 100 and s.status.text() == "three of four"
        if end == "cancelled":
            s.cancelling()
            assert s.status.text() == "Cancelling…" and not s.cancel_btn.isEnabled() and s.cancel_btn.isVisible()
            s.cancelled()
        elif end == "failed":
            s.failed(text)
        else:
            s.finished(text)
        assert _idle(s) and not s.busy and s.status.text() == text and s.progress.value() == value


def test_nothing_to_do_fills_the_bar_and_cancelling_when_idle_says_nothing(qtbot) -> None:  # type: ignore[no-untyped-def]
    s = _strip(qtbot, scale=1000)
    s.started()
    assert s.status.text() == "waiting"  # started() without text keeps it
    s.progress_to(0, 0)
    assert s.progress.value() == 1000
    s.finished()
    assert s.status.text() == "waiting" and s.progress.value() == 1000
    s.cancelling()
    assert s.status.text() == "waiting"


def test_can_run_and_set_busy(qtbot) -> None:  # type: ignore[no-untyped-def]
    s = _strip(qtbot)
    s.set_can_run(False)
    assert not s.run_btn.isVisible() and not s.progress.isVisible()
    s.set_can_run(True)
    s.set_busy(True)
    assert _running(s) and s.status.text() == "waiting"  # set_busy leaves the status alone
    s.set_busy(False)
    assert _idle(s)


def test_without_a_run_button(qtbot) -> None:  # type: ignore[no-untyped-def]
    s = JobStrip("checksum")
    qtbot.addWidget(s)
    s.show()
    assert not s.run_btn.isVisible() and not s.cancel_btn.isVisible()
    s.started("verifying")
    assert s.cancel_btn.isVisible() and not s.run_btn.isVisible()
    s.finished("ok")
    assert not s.run_btn.isVisible()


def test_signals(qtbot) -> None:  # type: ignore[no-untyped-def]
    s = _strip(qtbot)
    with qtbot.waitSignal(s.run_clicked, timeout=1000):
        qtbot.mouseClick(s.run_btn, Qt.MouseButton.LeftButton)
    s.started()
    with qtbot.waitSignal(s.cancel_clicked, timeout=1000):
        qtbot.mouseClick(s.cancel_btn, Qt.MouseButton.LeftButton)


def test_accessible_names(qtbot) -> None:  # type: ignore[no-untyped-def]
    s = _strip(qtbot)
    assert s.status.accessibleName() == "Scale scan status"
    assert s.progress.accessibleName() == "Scale scan progress"
    assert s.cancel_btn.accessibleName() == "Cancel the scale scan" and s.cancel_btn.text() == "Cancel"
    assert s.run_btn.accessibleName() == "Run the scale scan" and s.run_btn.text() == "Scan again"
    named = JobStrip("checksum", "Verify checksum", run_name="Verify the checksum", cancel_text="Stop")
    qtbot.addWidget(named)
    assert named.run_btn.accessibleName() == "Verify the checksum" and named.cancel_btn.text() == "Stop"


def test_status_last_own_label_and_a_greyed_run_button(qtbot) -> None:  # type: ignore[no-untyped-def]
    from PySide6.QtWidgets import QLabel

    own = QLabel()
    s = JobStrip("budget", "Measure", status=own, status_last=True, disable_run=True)
    qtbot.addWidget(s)
    s.show()
    lay = s.layout()
    assert [lay.itemAt(i).widget() for i in range(lay.count())] == [s.run_btn, s.cancel_btn, s.progress, own]
    assert s.status is own and own.accessibleName() == "Budget status"
    assert s.run_btn.isVisible() and s.run_btn.isEnabled()
    s.started("measuring")
    assert s.run_btn.isVisible() and not s.run_btn.isEnabled() and s.cancel_btn.isVisible()
    s.finished("measured")
    assert s.run_btn.isEnabled() and not s.cancel_btn.isVisible()
    s.set_can_run(False)
    assert s.run_btn.isVisible() and not s.run_btn.isEnabled()


def test_default_order(qtbot) -> None:  # type: ignore[no-untyped-def]
    s = _strip(qtbot)
    lay = s.layout()
    assert [lay.itemAt(i).widget() for i in range(lay.count())] == [s.status, s.progress, s.cancel_btn, s.run_btn]


def _widgets(lay) -> list:  # type: ignore[no-untyped-def]
    return [lay.itemAt(i).widget() for i in range(lay.count()) if lay.itemAt(i).widget() is not None]


def test_two_rows_with_the_views_controls_first(qtbot) -> None:  # type: ignore[no-untyped-def]
    from PySide6.QtWidgets import QLineEdit

    from quantscope.gui.widgets.jobstrip import controls_row

    edit = QLineEdit()
    box = controls_row(edit, 8, None)
    s = JobStrip("requantize", "Requantize", layout="two_rows", disable_run=True, controls=box)
    qtbot.addWidget(s)
    s.show()
    assert _widgets(s.row) == [box, s.run_btn, s.cancel_btn]
    assert _widgets(s.status_row) == [s.progress, s.status]
    assert edit.nextInFocusChain() is s.run_btn  # the view's options, then Requantize
    assert s.run_btn.isVisible() and not s.progress.isVisible() and not s.cancel_btn.isVisible()
    s.started("reading")
    assert s.progress.isVisible() and s.cancel_btn.isEnabled() and not s.run_btn.isEnabled()
    s.cancelling()
    assert not s.cancel_btn.isEnabled() and s.status.text() == "Cancelling…"
    s.cancelled()
    assert s.run_btn.isEnabled() and not s.progress.isVisible() and not s.cancel_btn.isVisible()


def test_always_shown_greys_rather_than_hides(qtbot) -> None:  # type: ignore[no-untyped-def]
    s = JobStrip("comparison", "Compare", layout="two_rows", always_shown=True, scale=1000)
    qtbot.addWidget(s)
    s.show()
    assert s.progress.isVisible() and s.cancel_btn.isVisible() and not s.cancel_btn.isEnabled()
    assert s.run_btn.isVisible() and s.run_btn.isEnabled()
    s.started("opening")
    assert s.cancel_btn.isEnabled() and s.run_btn.isVisible() and not s.run_btn.isEnabled()
    s.progress_to(1, 2)
    s.finished("compared")
    assert s.progress.isVisible() and s.progress.value() == 1000  # how it ended stays shown
    assert s.cancel_btn.isVisible() and not s.cancel_btn.isEnabled() and s.run_btn.isEnabled()
    s.started()
    s.failed("it broke")
    assert s.progress.value() == 0 and s.status.text() == "it broke" and s.run_btn.isEnabled()
    s.set_can_run(False)
    assert s.run_btn.isVisible() and not s.run_btn.isEnabled()


def test_column_with_the_buttons_placed_by_the_view(qtbot) -> None:  # type: ignore[no-untyped-def]
    from PySide6.QtWidgets import QDialogButtonBox

    s = JobStrip("conversion", "Convert", layout="column", always_shown=True, place_buttons=False,
                 progress_width=120)
    qtbot.addWidget(s)
    box = QDialogButtonBox()
    box.addButton(s.run_btn, QDialogButtonBox.ButtonRole.AcceptRole)
    box.addButton(s.cancel_btn, QDialogButtonBox.ButtonRole.ActionRole)
    qtbot.addWidget(box)
    s.show()
    box.show()
    assert _widgets(s.layout()) == [s.progress] and _widgets(s.status_row) == [s.status]
    assert s.progress.maximumWidth() > 120  # a column's bar takes the width
    assert s.run_btn.parent() is box and s.run_btn.isEnabled() and not s.cancel_btn.isEnabled()
    s.started("converting")
    assert not s.run_btn.isEnabled() and s.cancel_btn.isEnabled()
    s.finished("done")
    assert s.run_btn.isEnabled() and not s.cancel_btn.isEnabled() and s.progress.value() == 100


def test_a_column_with_its_buttons(qtbot) -> None:  # type: ignore[no-untyped-def]
    import pytest

    s = JobStrip("comparison", "Compare", layout="column")
    qtbot.addWidget(s)
    assert _widgets(s.row) == [s.run_btn, s.cancel_btn]
    assert _widgets(s.layout()) == [s.progress] and _widgets(s.status_row) == [s.status]
    with pytest.raises(ValueError):
        JobStrip("scan", "Scan", controls=JobStrip("inner"))
