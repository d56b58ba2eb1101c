"""Export and copy actions the views share: a tensor as .npy (dequantized float32 or its raw blocks), a block as CSV
or JSON, the metadata as JSON, a plot as PNG or SVG.

The writing is :mod:`quantscope.core.export`'s (streamed, atomic, nothing left behind on cancel or error); this
module only asks for the path and runs the long writes in the window's task runner, so the status bar shows their
progress and Ctrl+. cancels them. Every method takes an optional ``path`` (tests, scripted use); without it a save
dialog asks. Results are reported through :attr:`Exporter.finished` / :attr:`Exporter.failed` (the main window
shows them in the status bar and an error box).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QObject, QPoint, Qt, Signal
from PySide6.QtGui import QAction, QCursor, QGuiApplication, QImage
from PySide6.QtWidgets import QFileDialog, QMenu, QMessageBox, QToolTip, QWidget

from quantscope.core.fsutil import PathRefused, portable_name, printable, write_atomic
from quantscope.core.gguf import GGUFFile
from quantscope.core.summary import human_bytes

from .guard import qt_guarded
from .workers import Task, TaskRunner

PLOT_FILTERS = "PNG image (*.png);;SVG drawing (*.svg)"


def _safe_name(name: str) -> str:
    """A tensor or key name as the start of a file name every OS accepts, a suffix to follow: at most 120
    characters, no leading dot, path separators and what Windows forbids replaced, a Windows device name (``CON``,
    ``aux.weight``) prefixed (:func:`~quantscope.core.fsutil.portable_name`); ``export`` when nothing is left."""
    out = "".join(c if c.isprintable() else "_" for c in name)[:120].strip(". ")
    return portable_name(out, "export")


@qt_guarded
class Exporter(QObject):
    """Asks where, writes (in the runner when it may take a while) and reports."""

    finished = Signal(str)  # "Wrote …" for the status bar
    failed = Signal(str)  # a one-line error

    def __init__(self, parent: QWidget, runner: TaskRunner | None = None, *, standalone: bool = False) -> None:
        """``standalone``: nobody listens to the signals (a dialog's plots): a failure opens a message box of its
        own and a success shows a tool tip."""
        super().__init__(parent)
        self.widget = parent
        self.runner = runner
        self.last_dir: str | None = None
        if standalone:
            self.finished.connect(lambda msg: QToolTip.showText(QCursor.pos(), msg, self.widget))
            self.failed.connect(self._error_box)

    def _error_box(self, message: str) -> None:
        box = QMessageBox(QMessageBox.Icon.Warning, "Quantscope", f"Export failed: {message}",
                          QMessageBox.StandardButton.Ok, self.widget)
        box.setAccessibleName("Error")
        box.open()
        self.error_box = box

    # ------------------------------------------------------------------ asking
    def ask_path(self, title: str, default_name: str, filters: str, near: str | os.PathLike[str] | None = None
                 ) -> str | None:
        """A save dialog in the last export folder (else beside ``near``); the suffix of the chosen filter is added
        when the name has none. ``None`` when the user cancels."""
        folder = self.last_dir or (str(Path(near).parent) if near else os.getcwd())
        path, chosen = QFileDialog.getSaveFileName(self.widget, title, str(Path(folder) / default_name), filters)
        if not path:
            return None
        if not Path(path).suffix and "(*." in chosen:
            path += chosen.split("(*", 1)[1].split(")", 1)[0].split()[0]
        self.last_dir = str(Path(path).parent)
        return path

    def _report(self, message: str) -> None:
        self.finished.emit(message)

    def _fail(self, message: str) -> None:
        self.failed.emit(" ".join(printable(message).split()))

    def _run(self, name: str, fn: Callable[[Callable[..., None], Any], Any], done: Callable[[Any], str]) -> Task | None:
        """``fn(report, token)`` in the runner (or right here without one); ``done(result)`` makes the message."""
        if self.runner is None:
            try:
                result = fn(lambda *a: None, None)
            except Exception as exc:  # the same one line a worker's failure gives
                self._fail(str(exc) or type(exc).__name__)
                return None
            self._report(done(result))
            return None
        return self.runner.start(name, fn, on_done=lambda r: self._report(done(r)),
                                 on_failed=lambda msg, _tb: self._fail(msg),
                                 on_cancelled=lambda: self._report("Export cancelled: nothing was written"))

    # ------------------------------------------------------------------ tensors
    def tensor_npy(self, f: GGUFFile, name: str, *, raw: bool = False, path: str | None = None,
                   threads: int = 2) -> Task | None:
        """``name`` as .npy: its values as float32 (numpy shape), or with ``raw`` its stored blocks."""
        from quantscope.core.export import export_tensor_npy

        if path is None:
            path = self.ask_path("Export the raw blocks as .npy" if raw else "Export the values as .npy (float32)",
                                 f"{_safe_name(name)}{'-raw' if raw else ''}.npy", "NumPy array (*.npy)", f.path)
            if path is None:
                return None
        out = path

        def work(report: Callable[..., None], token: Any) -> Any:
            return export_tensor_npy(f, name, out, raw=raw, threads=threads,
                                     progress=lambda d, t: report(d, t, f"exporting {name}"), cancel=token)

        return self._run("export", work, lambda r: f"Wrote {r.path} ({human_bytes(r.data_bytes)}, "
                         f"{r.dtype} {list(r.shape)})")

    # ------------------------------------------------------------------ blocks
    def block(self, f: GGUFFile, name: str, row: int, block: int, *, fmt: str = "csv",
              path: str | None = None) -> Path | None:
        """Block ``block`` of row ``row`` of ``name``, decoded, as CSV or JSON (small: written right away)."""
        from quantscope.core.export import export_block

        if path is None:
            path = self.ask_path(f"Export the block as {fmt.upper()}",
                                 f"{_safe_name(name)}-r{row}-b{block}.{fmt}",
                                 "CSV table (*.csv)" if fmt == "csv" else "JSON (*.json)", f.path)
            if path is None:
                return None
        try:
            out = export_block(f, name, row, block, path, fmt=fmt)
        except (OSError, ValueError, IndexError, KeyError, PathRefused) as exc:
            self._fail(str(exc) or type(exc).__name__)
            return None
        self._report(f"Wrote {out}")
        return out

    # ------------------------------------------------------------------ metadata
    def metadata(self, f: GGUFFile, *, path: str | None = None) -> Task | None:
        """Every metadata entry in full and the tensor index as JSON (in the runner: arrays can be large)."""
        from quantscope.core.export import export_metadata

        if path is None:
            stem = Path(f.path).stem if f.path else "model"
            path = self.ask_path("Export the metadata as JSON", f"{_safe_name(stem)}-metadata.json", "JSON (*.json)",
                                 f.path)
            if path is None:
                return None
        out = path
        return self._run("export", lambda _report, token: export_metadata(f, out, cancel=token),
                         lambda p: f"Wrote {p}")

    # ------------------------------------------------------------------ plots
    def plot(self, view: pg.GraphicsView, *, fmt: str = "png", path: str | None = None,
             name: str = "plot") -> Path | None:
        """What ``view`` shows as a PNG (at twice the on-screen size) or SVG file."""
        if path is None:
            path = self.ask_path("Save the plot", f"{_safe_name(name)}.{fmt}", PLOT_FILTERS)
            if path is None:
                return None
        kind = "svg" if path.lower().endswith(".svg") or (fmt == "svg" and not path.lower().endswith(".png")) \
            else "png"
        try:
            data = plot_svg(view) if kind == "svg" else plot_png(view)
            write_atomic(path, data, "plot")
        except (OSError, PathRefused, RuntimeError) as exc:
            self._fail(str(exc) or type(exc).__name__)
            return None
        self._report(f"Wrote {path}")
        return Path(path)

    def copy_plot(self, view: pg.GraphicsView) -> None:
        QGuiApplication.clipboard().setImage(plot_image(view))
        self._report("Copied the plot as an image")

    def plot_actions(self, view: pg.GraphicsView, name: str) -> list[QAction]:
        """Save as PNG…, Save as SVG…, Copy image: the plot part of a context menu."""
        out = []
        for text, fn in (("Save plot as PNG…", lambda: self.plot(view, fmt="png", name=name)),
                         ("Save plot as SVG…", lambda: self.plot(view, fmt="svg", name=name)),
                         ("Copy plot image", lambda: self.copy_plot(view))):
            a = QAction(text, self.widget)
            a.triggered.connect(fn)
            out.append(a)
        return out

    def install_plot_menu(self, view: pg.GraphicsView, name: str,
                          extra: Callable[[], list[QAction]] | None = None) -> None:
        """Right click on ``view`` opens a menu of :meth:`plot_actions` (after ``extra()``'s actions), replacing
        pyqtgraph's own view-box menu."""
        for item in view.scene().items():
            if isinstance(item, pg.ViewBox):
                item.setMenuEnabled(False)
        view.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)

        def show(pos: QPoint) -> None:
            menu = QMenu(view)
            menu.setAccessibleName(f"Actions for the {name} plot")
            if extra is not None:
                for a in extra():
                    menu.addAction(a)
                menu.addSeparator()
            for a in self.plot_actions(view, name):
                a.setParent(menu)
                menu.addAction(a)
            view.setProperty("lastMenu", menu)  # tests find it
            menu.popup(view.mapToGlobal(pos))

        view.customContextMenuRequested.connect(show)


def plot_image(view: pg.GraphicsView, scale: float = 2.0) -> QImage:
    """The view's scene rendered at ``scale`` × its on-screen size (sharp on a high-DPI screen or in a document)."""
    from pyqtgraph.exporters import ImageExporter

    ex = ImageExporter(view.scene())
    w = max(1, int(view.width() * scale))
    ex.parameters()["width"] = w
    img = ex.export(toBytes=True)
    if not isinstance(img, QImage) or img.isNull():
        raise RuntimeError("the plot could not be rendered")
    return img


def plot_png(view: pg.GraphicsView) -> bytes:
    buf = QBuffer()
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    if not plot_image(view).save(buf, "PNG"):
        raise RuntimeError("the plot could not be encoded as PNG")
    return bytes(QByteArray(buf.data()).data())


def plot_svg(view: pg.GraphicsView) -> bytes:
    """What the view shows as an SVG drawing, painted by Qt's SVG generator (vector items stay vectors; the
    heatmaps' images are embedded). pyqtgraph's own SVG exporter fails on some of the paths Qt 6 draws."""
    from PySide6.QtCore import QRectF, QSize
    from PySide6.QtGui import QPainter
    from PySide6.QtSvg import QSvgGenerator

    vp = view.viewport().rect()
    buf = QBuffer()
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    gen = QSvgGenerator()
    gen.setOutputDevice(buf)
    gen.setSize(QSize(vp.width(), vp.height()))
    gen.setResolution(view.logicalDpiX())  # the default 72 dpi would scale fonts and pens against the axes
    gen.setViewBox(QRectF(0, 0, vp.width(), vp.height()))
    gen.setTitle(view.accessibleName() or "plot")
    gen.setDescription("Exported by Quantscope")
    painter = QPainter()
    if not painter.begin(gen):
        raise RuntimeError("the plot could not be rendered as SVG")
    try:
        painter.fillRect(QRectF(0, 0, vp.width(), vp.height()), view.backgroundBrush())
        view.scene().render(painter, QRectF(0, 0, vp.width(), vp.height()), view.mapToScene(vp).boundingRect())
    finally:
        painter.end()
    data = bytes(QByteArray(buf.data()).data())
    if b"<svg" not in data[:1000]:
        raise RuntimeError("the plot could not be rendered as SVG")
    return data
