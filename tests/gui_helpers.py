"""Shared pieces of the GUI tests (pytest-qt, offscreen)."""

from __future__ import annotations

import contextlib

import pytest


@pytest.fixture
def window(qtbot, tmp_path):
    """A main window with its own settings file; closed (workers shut down) at teardown."""
    from PySide6.QtCore import QSettings

    from quantscope.gui.mainwindow import MainWindow

    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    w = MainWindow(settings)
    qtbot.addWidget(w)
    w.resize(1400, 900)
    w.show()
    # pytest-qt closes the window before this fixture's teardown: a test that failed mid-edit must not leave the
    # unsaved-changes question box waiting (tests of the guard replace this with their own answers)
    w.confirm_discard = lambda: True
    yield w
    w.close()
    assert not w.runner.running()


def wait_idle(qtbot, w, timeout=60000):
    """Wait until the window's background tasks have all ended."""
    qtbot.waitUntil(lambda: not w.runner.running(), timeout=timeout)


@contextlib.contextmanager
def cancel_when(runner, name, when, seen=None):
    """Within the block, the next task ``name`` started on ``runner`` is cancelled from its own worker thread at
    the first report ``(done, total, text)`` for which ``when`` is true (each report before throttling is also
    appended to ``seen``): a cancel at an exact point of the work, however fast or loaded the machine is."""
    def attach(task) -> None:  # type: ignore[no-untyped-def]
        if task.name != name:
            return

        def report(done: int, total: int, text: str) -> None:
            if seen is not None:
                seen.append((done, total, text))
            if when(done, total, text):
                task.cancel()

        task.observers.append(report)

    runner.on_start.append(attach)
    try:
        yield
    finally:
        runner.on_start.remove(attach)


#: How long :func:`hold_when` keeps a worker waiting for its cancel: a hang guard, never reached when the code works.
HOLD_S = 300.0


@contextlib.contextmanager
def hold_when(runner, name, when):
    """Within the block, the first task ``name`` started on ``runner`` to make a report ``(done, total, text)`` for
    which ``when`` is true stops there, in its own worker thread, and waits until it is cancelled (at most
    :data:`HOLD_S`) or until the test sets ``held.release``; that report reaches the GUI only afterwards. Yields a
    :class:`threading.Event` set once the worker is held: the test then acts (clicks Cancel, closes the window) on
    work that is certainly under way and certainly not finished, however fast or loaded the machine is, and the
    event loop must keep running meanwhile (a GUI thread that waited for the worker would hang here instead of
    passing by luck). The held worker's thread is recorded in ``held.thread``.
    """
    import threading
    import time

    held = threading.Event()
    held.thread = None  # type: ignore[attr-defined]
    held.release = threading.Event()  # type: ignore[attr-defined]

    def attach(task) -> None:  # type: ignore[no-untyped-def]
        if task.name != name:
            return

        def report(done: int, total: int, text: str) -> None:
            if held.is_set() or not when(done, total, text):
                return
            held.thread = threading.current_thread()  # type: ignore[attr-defined]
            held.set()
            end = time.monotonic() + HOLD_S
            while not held.release.is_set() and time.monotonic() < end:  # type: ignore[attr-defined]
                if task.token.wait(0.01):
                    break

        task.observers.append(report)

    runner.on_start.append(attach)
    try:
        yield held
    finally:
        runner.on_start.remove(attach)


@contextlib.contextmanager
def hold_model(worker, signal: str, when):
    """Within the block, the model thread stops (on its own thread) at the first emission of ``worker``'s
    ``signal`` whose arguments satisfy ``when``, until the test sets ``held.release`` or the worker is unloaded
    (its load-cancel event: unload, a file switch, closing the window). Yields that :class:`threading.Event`, set
    once the thread is held; ``held.thread`` is the thread it was held on, ``held.args`` the signal's arguments.
    The test then acts on a load or a reply that is certainly under way, however fast or loaded the machine is."""
    import threading
    import time

    from PySide6.QtCore import Qt

    held = threading.Event()
    held.release = threading.Event()  # type: ignore[attr-defined]
    held.thread = None  # type: ignore[attr-defined]

    def on_signal(*args) -> None:  # runs on the model thread (a direct connection)
        if held.is_set() or not when(*args):
            return
        held.thread = threading.current_thread()  # type: ignore[attr-defined]
        held.args = args  # type: ignore[attr-defined]
        held.set()
        end = time.monotonic() + HOLD_S
        while not worker.cancel_load.is_set() and time.monotonic() < end:
            if held.release.wait(0.01):  # type: ignore[attr-defined]
                break

    sig = getattr(worker, signal)
    sig.connect(on_signal, Qt.ConnectionType.DirectConnection)
    try:
        yield held
    finally:
        held.release.set()  # type: ignore[attr-defined]
        try:
            sig.disconnect(on_signal)
        except (RuntimeError, TypeError):
            pass


def fit_problems(root) -> list[str]:
    """What does not fit in ``root``'s visible widget tree at its current size, one line per problem.

    Reported: a visible horizontal scroll bar; a scroll area whose horizontal bar is off but whose content (a
    table's or tree's columns) is wider than its viewport; a QLabel, QAbstractButton or QComboBox whose text is
    wider (font metrics) than the room its contents rectangle leaves. Labels that wrap are not checked (they
    reflow); an elided label shows text that fits and keeps the whole text in its tool tip; a combo box whose tool
    tip holds its text is allowed to cut it. Hidden widgets (other tabs) are skipped. Use after the window has its
    size and its events were processed::

        window.resize(1100, 700); qtbot.wait(50)
        assert fit_problems(window) == []
    """
    from PySide6.QtCore import Qt
    from PySide6.QtGui import Qt as QtGui_Qt
    from PySide6.QtGui import QTextDocument
    from PySide6.QtWidgets import (
        QAbstractButton,
        QAbstractScrollArea,
        QCheckBox,
        QComboBox,
        QLabel,
        QPushButton,
        QRadioButton,
        QScrollArea,
        QScrollBar,
        QStyle,
        QStyleOptionComboBox,
        QTableView,
        QTreeView,
        QWidget,
    )

    def name(w) -> str:
        n = w.accessibleName() or w.objectName()
        return f"{type(w).__name__}({n!r})" if n else type(w).__name__

    def text_width(w, text: str, rich: bool) -> int:
        if rich:
            doc = QTextDocument()
            doc.setDefaultFont(w.font())
            doc.setDocumentMargin(0)
            doc.setHtml(text)
            return int(doc.idealWidth())
        return max((w.fontMetrics().horizontalAdvance(line) for line in text.split("\n")), default=0)

    problems: list[str] = []
    widgets = [root, *root.findChildren(QWidget)]
    for w in widgets:
        if not w.isVisible() or w.width() <= 0:
            continue
        if isinstance(w, QScrollBar):
            if w.orientation() == Qt.Orientation.Horizontal and w.maximum() > w.minimum():
                owner = w.parent().parent() if w.parent() is not None else None
                problems.append(f"horizontal scroll bar in {name(owner) if owner is not None else '?'} "
                                f"(range {w.maximum() - w.minimum()} px)")
        elif isinstance(w, QScrollArea):
            inner = w.widget()
            if (w.horizontalScrollBarPolicy() == Qt.ScrollBarPolicy.ScrollBarAlwaysOff and inner is not None
                    and inner.width() > w.viewport().width()):
                problems.append(f"{name(w)} clips its content: {inner.width()} px in {w.viewport().width()} px")
        elif isinstance(w, (QTableView, QTreeView)):
            head = w.header() if isinstance(w, QTreeView) else w.horizontalHeader()
            if (w.horizontalScrollBarPolicy() == Qt.ScrollBarPolicy.ScrollBarAlwaysOff
                    and head.length() > w.viewport().width() + 1):
                problems.append(f"{name(w)} clips its columns: {head.length()} px in {w.viewport().width()} px")
        elif isinstance(w, QLabel):
            text = w.text()
            if not text or w.wordWrap() or isinstance(w, QAbstractScrollArea):
                continue
            rich = w.textFormat() == Qt.TextFormat.RichText or (
                w.textFormat() == Qt.TextFormat.AutoText and QtGui_Qt.mightBeRichText(text))
            room = w.contentsRect().width() - 2 * max(0, w.margin()) - max(0, w.indent())
            need = text_width(w, text, rich)
            if need > room + 1:
                problems.append(f"{name(w)} text {text[:60]!r} needs {need} px, has {room}")
        elif isinstance(w, QAbstractButton):
            text = w.text().replace("&&", "\0").replace("&", "").replace("\0", "&")
            if not text:
                continue
            need = w.fontMetrics().horizontalAdvance(text)
            if not w.icon().isNull():
                need += w.iconSize().width() + 4
            st = w.style()
            if isinstance(w, (QCheckBox, QRadioButton)):
                ind = QStyle.PixelMetric.PM_IndicatorWidth if isinstance(w, QCheckBox) else \
                    QStyle.PixelMetric.PM_ExclusiveIndicatorWidth
                need += st.pixelMetric(ind, None, w) + st.pixelMetric(QStyle.PixelMetric.PM_CheckBoxLabelSpacing,
                                                                       None, w)
            elif isinstance(w, QPushButton):
                need += 2 * st.pixelMetric(QStyle.PixelMetric.PM_ButtonMargin, None, w) // 2
            if need > w.contentsRect().width() + 1:
                problems.append(f"{name(w)} text {text!r} needs {need} px, has {w.contentsRect().width()}")
        elif isinstance(w, QComboBox) and not w.isEditable():
            text = w.currentText()
            if not text or text in w.toolTip():
                continue
            opt = QStyleOptionComboBox()
            w.initStyleOption(opt)
            field = w.style().subControlRect(QStyle.ComplexControl.CC_ComboBox, opt,
                                             QStyle.SubControl.SC_ComboBoxEditField, w)
            need = w.fontMetrics().horizontalAdvance(text)
            if need > field.width() + 1:
                problems.append(f"{name(w)} text {text!r} needs {need} px, has {field.width()}")
    return problems


def clipping_problems(root):
    """What is cut off in ``root``: labels narrower than their text (or, wrapped, shorter than it), buttons and
    combo boxes below their minimum size, widgets outside the area their parent shows, conversation content
    wider than its scroll area, and visible horizontal scroll bars. An elided label is fine when its tooltip has
    the whole text. Stricter than :func:`fit_problems` about geometry (wrapped labels cut short, widgets pushed
    outside their parent), which the chat pane's dynamic message column needs."""
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QAbstractButton, QAbstractScrollArea, QComboBox, QLabel, QScrollArea, QWidget

    from quantscope.gui.widgets.fit import ElidedLabel

    def in_scroll(w):
        p = w.parentWidget()
        while p is not None and p is not root:
            if isinstance(p, QAbstractScrollArea):
                return True
            p = p.parentWidget()
        return False

    out = []
    for w in [root, *root.findChildren(QWidget)]:
        if not w.isVisible() or w.width() <= 0:
            continue
        name = f"{type(w).__name__} {w.accessibleName() or w.objectName()!r}"
        if isinstance(w, ElidedLabel):
            if w.elided and w.full_text() not in w.toolTip():
                out.append(f"{name}: elided without the whole text in its tooltip")
        elif isinstance(w, QLabel) and w.text() and w.textFormat() != Qt.TextFormat.RichText and "<" not in w.text():
            room = w.contentsRect().width() - 2 * w.margin() - w.indent() if w.indent() > 0 else \
                w.contentsRect().width() - 2 * w.margin()
            if w.wordWrap():
                if w.heightForWidth(w.width()) > w.height() + 1:
                    out.append(f"{name}: wrapped text taller than the label ({w.text()[:40]!r})")
            elif max(w.fontMetrics().horizontalAdvance(t) for t in w.text().split("\n")) > room + 1:
                out.append(f"{name}: text wider than the label ({w.text()[:40]!r})")
        elif isinstance(w, QLabel) and w.wordWrap() and w.heightForWidth(w.width()) > w.height() + 1:
            out.append(f"{name}: wrapped text taller than the label")
        if isinstance(w, (QAbstractButton, QComboBox)) and w.width() < w.minimumSizeHint().width() - 1:
            out.append(f"{name}: {w.width()} px wide, needs {w.minimumSizeHint().width()}")
        if isinstance(w, QAbstractScrollArea):
            if w.horizontalScrollBar().isVisible():
                out.append(f"{name}: horizontal scroll bar")
            if isinstance(w, QScrollArea) and w.widget() is not None and \
                    w.widget().width() > w.viewport().width() + 1:
                out.append(f"{name}: content {w.widget().width()} px in a {w.viewport().width()} px viewport")
        p = w.parentWidget()
        if p is not None and w is not root and not in_scroll(w) and w.isWindow() is False:
            g = w.geometry()
            if g.right() > p.rect().right() + 1 or g.bottom() > p.rect().bottom() + 1 or g.x() < -1 or g.y() < -1:
                out.append(f"{name}: outside its parent ({g.x()},{g.y()} {g.width()}x{g.height()} in "
                           f"{p.width()}x{p.height()})")
    return out


def unsupported_model(path):
    """A small valid GGUF of an architecture the engine does not run (mamba): the model views must say why."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_embedding_length(8)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["a", "b"])
    w.add_token_merges(["a b"])
    w.add_tensor("token_embd.weight", np.zeros((2, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
