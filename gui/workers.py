"""Background work: a function run on a QThreadPool with throttled progress, cancellation and clean shutdown.

A task function has the signature ``fn(report, token) -> result``: ``report(done, total, text="")`` may be called
as often as it likes (signals go out at most every 50 ms), and ``token.cancelled`` turns true on cancel; the
function stops by raising :class:`~quantscope.core.jobs.Cancelled` or a subclass (or by returning).
Signals are delivered on the GUI thread.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from typing import Any

import shiboken6
from PySide6.QtCore import QObject, QRunnable, QThreadPool, Signal

from quantscope.core.jobs import Cancelled, CancelToken

from .guard import qt_guarded

Report = Callable[..., None]
TaskFn = Callable[[Report, CancelToken], Any]

_PROGRESS_INTERVAL = 0.05

#: What the status bar calls each task (a task's ``name`` is internal; tests/test_gui_app.py checks that every
#: name the views start has an entry here).
TASK_LABELS: dict[str, str] = {
    "tensor-stats": "statistics", "scale-scan": "scale scan", "heatmap": "heatmap", "convert": "conversion",
    "convert-check": "checking the bump profiles", "bump-checksum": "checksum", "tokenizer": "reading the tokenizer",
    "tokenizer-edit": "reading the tokenizer", "template": "template preview", "template-edit": "template preview",
    "tokenize": "tokenizing", "cuda-check": "CUDA check", "quantize": "quantizing", "imatrix": "reading the imatrix",
    "requantize": "requantizing", "quant-stats": "quant statistics", "lab-open": "opening a file",
    "compare": "comparing", "diff": "comparing files", "diff-locate": "locating a difference",
    "probe-run": "probing", "probe-lens": "logit lens", "probe-attention": "attention weights",
    "budget-measure": "measuring each tensor's cost", "budget-refine": "checking the mix",
    "budget-write": "writing the mix", "save-metadata": "saving the edited file", "export": "exporting",
    "library-scan": "scanning the library", "hub-search": "searching the hub", "hub-files": "reading a repository",
    "hub-download": "downloading", "hub-peek": "reading a remote header",
    "remote-open": "reading a remote header", "block-fetch": "reading a block from the hub",
    "hub-publish": "publishing to the hub", "publish-card": "writing the model card",
}


def task_label(name: str) -> str:
    """The status bar's words for task ``name`` (an unlisted name: its words, never its dashes)."""
    return TASK_LABELS.get(name) or name.replace("-", " ").replace("_", " ")


@qt_guarded
class TaskSignals(QObject):
    """Signals of one task (they live on the GUI thread; the worker only emits)."""

    progress = Signal(object, object, str)  # done, total, text (ints may exceed 32 bits)
    finished = Signal(object)
    failed = Signal(str, str)  # message, traceback
    cancelled = Signal()
    ended = Signal()  # after any of the three above


@qt_guarded
class Task(QRunnable):
    """One unit of background work. Keep the :class:`TaskRunner` that started it alive until it ends."""

    def __init__(self, name: str, fn: TaskFn) -> None:
        super().__init__()
        self.setAutoDelete(False)
        self.name = name
        self.fn = fn
        self.token = CancelToken()
        self.signals = TaskSignals()
        self.done = False
        self._last_emit = 0.0
        # one progress signal in flight at a time: a GUI thread slower than the worker gets the latest, not a queue
        self._in_flight = False
        self.signals.progress.connect(self._delivered)
        #: called on the worker's thread with every report, before throttling (tests act at an exact point of the
        #: work, e.g. cancel after the second tensor, however fast or loaded the machine is)
        self.observers: list[Callable[[int, int, str], None]] = []

    def cancel(self) -> None:
        self.token.cancel()

    @property
    def cancelled(self) -> bool:
        return self.token.cancelled

    def _report(self, done: int, total: int, text: str = "") -> None:
        for observe in self.observers:
            observe(done, total, text)
        now = time.monotonic()
        if (now - self._last_emit >= _PROGRESS_INTERVAL and not self._in_flight) or done >= total:
            self._last_emit = now
            self._in_flight = True
            self.signals.progress.emit(done, total, text)

    def _delivered(self, *_args: object) -> None:
        self._in_flight = False

    def run(self) -> None:
        try:
            if self.token.cancelled:
                raise Cancelled("cancelled before it started")
            result = self.fn(self._report, self.token)
        except Cancelled:
            self.signals.cancelled.emit()
        except BaseException as exc:
            self.signals.failed.emit(str(exc) or type(exc).__name__, traceback.format_exc())
        else:
            if self.token.cancelled:
                self.signals.cancelled.emit()
            else:
                self.signals.finished.emit(result)
        finally:
            self.done = True
            self.signals.ended.emit()


@qt_guarded
class TaskRunner(QObject):
    """Starts tasks on its own thread pool, tracks the running ones, cancels and waits for them on shutdown."""

    changed = Signal()  # a task started or ended

    def __init__(self, parent: QObject | None = None, max_threads: int = 2) -> None:
        super().__init__(parent)
        self.pool = QThreadPool(self)
        self.pool.setMaxThreadCount(max_threads)
        self.active: list[Task] = []
        self.closed = False
        #: Asked before each task starts; False cancels it at once (the window refuses work on a changed file).
        self.may_start: Callable[[], bool] | None = None
        #: called with each task before it is queued (on the GUI thread): where a test attaches Task.observers
        self.on_start: list[Callable[[Task], None]] = []

    def start(self, name: str, fn: TaskFn, *, on_done: Callable[[Any], None] | None = None,
              on_progress: Callable[[int, int, str], None] | None = None,
              on_failed: Callable[[str, str], None] | None = None,
              on_cancelled: Callable[[], None] | None = None,
              on_ended: Callable[[], None] | None = None) -> Task:
        """Queue ``fn``; callbacks run on the GUI thread. Every callback is connected before the task is queued, so
        a task that ends at once still reports; ``on_ended`` runs after the result callback, however it ended."""
        task = Task(name, fn)
        if self.closed:  # the window is going: nothing runs (and nothing may call back into deleted widgets)
            task.cancel()
            task.done = True
            return task
        if self.may_start is not None and not self.may_start():
            task.cancel()
        if on_progress:
            task.signals.progress.connect(on_progress)
        if on_done:
            task.signals.finished.connect(on_done)
        if on_failed:
            task.signals.failed.connect(on_failed)
        if on_cancelled:
            task.signals.cancelled.connect(on_cancelled)
        task.signals.ended.connect(lambda t=task: self._ended(t))
        if on_ended:
            task.signals.ended.connect(on_ended)
        self.active.append(task)
        for hook in self.on_start:
            hook(task)
        self.pool.start(task)
        self.changed.emit()
        return task

    def _ended(self, task: Task) -> None:
        if not shiboken6.isValid(self):  # a queued end delivered after the window (and this runner) was deleted
            return
        if task in self.active:
            self.active.remove(task)
        self.changed.emit()

    def running(self, name: str | None = None) -> list[Task]:
        """Tasks started and not yet ended *as seen by the GUI thread* (their result callbacks have not run)."""
        return [t for t in self.active if name is None or t.name == name]

    def cancel(self, name: str | None = None) -> None:
        for t in self.running(name):
            if not t.done:
                t.cancel()

    def wait(self, timeout_ms: int = -1) -> bool:
        """Block until every queued task has finished (used at shutdown and by tests)."""
        return bool(self.pool.waitForDone(timeout_ms))

    def shutdown(self, timeout_ms: int = 30000) -> bool:
        """Cancel everything, refuse new work and wait; returns whether all tasks ended in time."""
        self.closed = True
        self.cancel()
        self.pool.clear()
        ok = self.wait(timeout_ms)
        if ok:  # every worker has returned; their queued end signals will not be delivered to a closed window
            self.active = []
            self.changed.emit()
        return ok


@qt_guarded
class JobSlot(QObject):
    """One view's background job, and the busy state that follows it: the helper every worker-backed control uses.

    :meth:`start` queues the task with every callback connected first and calls ``on_busy(True)``; however the job
    ends (done, cancelled, failed, refused before it ran, or so fast that it ended before :meth:`start` returned)
    its result callback runs and then ``on_busy(False)``. Starting another job, or :meth:`forget` (a new file),
    cancels the current one and drops its results: only the current job's callbacks run. ``busy`` is true exactly
    while a job is current."""

    busyChanged = Signal(bool)

    def __init__(self, runner: TaskRunner, parent: QObject | None = None,
                 on_busy: Callable[[bool], None] | None = None) -> None:
        super().__init__(parent)
        self.runner = runner
        self.task: Task | None = None
        self.on_busy = on_busy
        self._ticket: object | None = None

    @property
    def busy(self) -> bool:
        return self.task is not None

    def _set_busy(self, busy: bool) -> None:
        if self.on_busy is not None:
            self.on_busy(busy)
        self.busyChanged.emit(busy)

    def start(self, name: str, fn: TaskFn, *, on_done: Callable[[Any], None] | None = None,
              on_progress: Callable[[int, int, str], None] | None = None,
              on_failed: Callable[[str, str], None] | None = None,
              on_cancelled: Callable[[], None] | None = None) -> Task:
        """Cancel the current job (its results are dropped) and start ``fn`` as the new one."""
        if self.task is not None:
            self.task.cancel()
        ticket = object()  # this job's: callbacks of a replaced or forgotten job find another one
        self._ticket = ticket

        def current() -> bool:
            return shiboken6.isValid(self) and self._ticket is ticket

        def guard(cb: Callable[..., None] | None) -> Callable[..., None] | None:
            if cb is None:
                return None

            def call(*args: Any) -> None:
                if current():
                    cb(*args)
            return call

        def ended() -> None:
            if current():
                self._ticket = None
                self.task = None
                self._set_busy(False)

        task = self.runner.start(name, fn, on_done=guard(on_done), on_progress=guard(on_progress),
                                 on_failed=guard(on_failed), on_cancelled=guard(on_cancelled), on_ended=ended)
        if self._ticket is not ticket:  # it has ended already (a task run at once): the view is idle
            return task
        if task.done and task not in self.runner.active:  # refused (the window is closing): nothing will report
            self._ticket = None
            self.task = None
            if on_cancelled is not None:
                on_cancelled()
            self._set_busy(False)
            return task
        self.task = task
        self._set_busy(True)
        return task

    def cancel(self) -> None:
        """Ask the current job to stop; it reports cancelled (and the view goes idle) when it has."""
        if self.task is not None:
            self.task.cancel()

    def forget(self) -> None:
        """Cancel the current job and go idle now; nothing it reports later reaches the view."""
        self._ticket = None
        if self.task is not None:
            self.task.cancel()
            self.task = None
            self._set_busy(False)
