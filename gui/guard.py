"""Python methods that Qt calls back (event handlers, item-model methods, paint, event filters) must never let an
exception unwind into Qt: PySide 6.11 may abort the process (exit 139) instead of reporting it. :func:`qt_guarded`
wraps every such override of a class once: an exception goes to ``sys.excepthook`` (the app's error dialog,
pytest-qt's capture in the tests) and Qt gets the base class's behaviour, or a neutral value.

Every Qt subclass in the gui package carries the decorator; ``tests/test_gui_guard.py`` scans the package for an
override that does not.
"""

from __future__ import annotations

import atexit
import functools
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import shiboken6
from PySide6.QtCore import QMimeData, QModelIndex, QRectF, QSize

T = TypeVar("T", bound=type)

#: Methods Qt calls that are not ``…Event`` handlers: item models and proxies, views, graphics items, styles,
#: validators, highlighters. (A QRunnable's ``run`` is a worker thread's: :class:`~.workers.Task` catches itself.)
CALLBACKS = frozenset({
    "event", "eventFilter", "viewportEvent", "sceneEvent", "paint", "boundingRect", "shape", "itemChange",
    "data", "setData", "headerData", "rowCount", "columnCount", "index", "parent", "flags", "hasChildren",
    "canFetchMore", "fetchMore", "sort", "mimeData", "mimeTypes", "roleNames", "sibling", "buddy",
    "filterAcceptsRow", "filterAcceptsColumn", "lessThan", "mapToSource", "mapFromSource",
    "sizeHint", "minimumSizeHint", "heightForWidth", "hasHeightForWidth", "sizeHintForColumn", "sizeHintForRow",
    "initStyleOption", "createEditor", "setEditorData", "setModelData", "updateEditorGeometry", "displayText",
    "drawBackground", "drawForeground", "drawItems", "scrollContentsBy", "focusNextPrevChild", "keyboardSearch",
    "highlightBlock", "loadResource", "canInsertFromMimeData", "insertFromMimeData", "createMimeDataFromSelection",
    "validate", "fixup", "textFromValue", "valueFromText", "stepBy", "stepEnabled",
    "drawControl", "drawPrimitive", "drawComplexControl", "pixelMetric", "styleHint", "subElementRect",
    "subControlRect", "sizeFromContents", "standardIcon", "standardPalette", "polish", "unpolish",
    "generatePicture", "timerEvent", "childEvent", "customEvent", "closeEvent", "done", "accept", "reject",
})

#: What Qt gets when an override failed and its base class has no implementation of its own (a pure virtual).
_NEUTRAL: dict[str, Callable[[], Any]] = {
    "rowCount": lambda: 0, "columnCount": lambda: 0, "index": QModelIndex, "parent": QModelIndex,
    "sibling": QModelIndex, "boundingRect": QRectF, "sizeHint": QSize, "minimumSizeHint": QSize,
    "hasChildren": lambda: False, "canFetchMore": lambda: False, "filterAcceptsRow": lambda: True,
    "filterAcceptsColumn": lambda: True, "lessThan": lambda: False, "event": lambda: False,
    "eventFilter": lambda: False, "viewportEvent": lambda: False, "sceneEvent": lambda: False,
}

_last_report: tuple[str, float] = ("", 0.0)


def is_callback(name: str) -> bool:
    """Whether Qt calls a method of this name on an object (an event handler or one of :data:`CALLBACKS`)."""
    return name in CALLBACKS or (name.endswith("Event") and not name.startswith("_"))


def report(exc: BaseException) -> None:
    """Hand ``exc`` to ``sys.excepthook`` (the error dialog); the same error repeated within a second (a paint
    that fails on every frame) is reported once."""
    global _last_report
    key = f"{type(exc).__name__}: {exc}"
    now = time.monotonic()
    if key == _last_report[0] and now - _last_report[1] < 1.0:
        return
    _last_report = (key, now)
    try:
        if threading.current_thread() is threading.main_thread():
            sys.excepthook(type(exc), exc, exc.__traceback__)
        else:  # no dialog from another thread
            traceback.print_exception(exc)
    except Exception:  # a broken hook must not turn into the crash this prevents
        pass


def _qt_bases_define(cls: type, name: str) -> bool:
    return any(name in vars(base) for base in cls.__mro__[1:] if _is_binding(base))


def _is_binding(base: type) -> bool:
    return isinstance(base, type) and base.__module__.startswith(("PySide6.", "shiboken6"))


def _wrap(cls: type, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return guarded.qt_original(self, *args, **kwargs)  # type: ignore[attr-defined]
        except Exception as exc:
            report(exc)
            return _fallback(cls, self, name, args, kwargs)

    guarded.qt_original = fn  # type: ignore[attr-defined]  # (the tests swap it for one that raises)
    guarded.qt_guarded = True  # type: ignore[attr-defined]
    return guarded


def _fallback(cls: type, obj: Any, name: str, args: tuple, kwargs: dict) -> Any:
    """The base class's behaviour for a failed override, else a neutral value."""
    try:
        if shiboken6.isValid(obj):
            return getattr(super(cls, obj), name)(*args, **kwargs)
    except Exception:  # a pure virtual, or arguments the base refuses
        pass
    make = _NEUTRAL.get(name)
    return make() if make is not None else None


def qt_guarded(cls: T) -> T:
    """Class decorator: every method of ``cls`` (its own, not inherited) that overrides a Qt callback reports an
    exception instead of raising it into Qt. Idempotent."""
    for name, fn in list(vars(cls).items()):
        if (callable(fn) and not isinstance(fn, (staticmethod, classmethod, type)) and is_callback(name)
                and not getattr(fn, "qt_guarded", False) and _qt_bases_define(cls, name)):
            setattr(cls, name, _wrap(cls, name, fn))
    return cls


_release_registered = False


def mime_data(text: str) -> QMimeData:
    """Plain-text mime data made in Python for Qt to own (what a ``createMimeDataFromSelection`` override returns).

    A platform without a clipboard of its own (offscreen, minimal, VNC, linuxfb) keeps the clipboard's data in a Qt
    global that an exit handler deletes after Python has finalized; the destructor of data made in Python then calls
    into the dead interpreter (SIGSEGV at exit). The first call therefore has :func:`release_clipboard` run at
    interpreter exit, while Python still runs."""
    global _release_registered
    if not _release_registered:
        atexit.register(release_clipboard)  # after PySide's own exit handlers were registered: runs before them
        _release_registered = True
    data = QMimeData()
    data.setText(text)
    return data


def release_clipboard() -> None:
    """Swap clipboard data made in Python for the same text set through Qt: Qt deletes the Python-made data now and
    keeps data it made itself, which needs no interpreter when Qt frees it."""
    from PySide6.QtGui import QClipboard, QGuiApplication

    app = QGuiApplication.instance()
    if not isinstance(app, QGuiApplication):
        return
    board = QGuiApplication.clipboard()
    modes = [QClipboard.Mode.Clipboard] + ([QClipboard.Mode.Selection] if board.supportsSelection() else [])
    for mode in modes:
        data = board.mimeData(mode)
        if data is not None and shiboken6.isValid(data) and shiboken6.createdByPython(data):
            board.setText(data.text(), mode)
