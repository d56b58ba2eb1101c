"""Application entry point: ``quantscope [FILE] [--screenshot PNG [--view NAME]]``."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from .screenshots import ShotContext, ShotFailed, wait_chat, wait_idle  # noqa: F401  (wait_*: as before)
from .views.registry import SHOTS, shot

#: ``--view``'s choices: the registry's shots (:data:`~quantscope.gui.views.registry.SHOTS`), in its order.
SCREENSHOT_VIEWS = tuple(s.name for s in SHOTS)


def has_display() -> bool:
    """True when Qt can open a window (:func:`~quantscope.core.sysinfo.has_display`: always on macOS and Windows;
    elsewhere a display is set, or a platform plugin was chosen explicitly)."""
    from quantscope.core import sysinfo

    return sysinfo.has_display()


def window_size(text: str) -> tuple[int, int]:
    """``WIDTHxHEIGHT`` (e.g. ``1100x700``) as a pair of pixels, each 200…16384 (argparse type)."""
    w, sep, h = text.lower().partition("x")
    if not sep or not w.strip().isdigit() or not h.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not WIDTHxHEIGHT, e.g. 1100x700")
    size = int(w), int(h)
    if not all(200 <= v <= 16384 for v in size):
        raise argparse.ArgumentTypeError(f"{text!r}: width and height must be 200 to 16384 pixels")
    return size


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="quantscope", description="Quantscope: explore quantized LLM files (GGUF) "
                                "and bump files. Without FILE the default demo model is opened.")
    p.add_argument("file", nargs="?", help="GGUF or bump file to open (hf://org/repo/file.gguf: a GGUF on "
                   "the hub, read over range requests without a download)")
    p.add_argument("--screenshot", metavar="PNG", help="render a view with the file loaded into PNG and exit")
    p.add_argument("--view", choices=SCREENSHOT_VIEWS, default="overview", help="view for --screenshot")
    p.add_argument("--theme", choices=("system", "light", "dark"), default="system", help="colour scheme")
    p.add_argument("--size", type=window_size, default=(1440, 920), metavar="WxH",
                   help="window size for --screenshot, e.g. 1100x700 (the convert dialog keeps its own size; the "
                   "quantize, compare, diff and imatrix dialogs take it)")
    p.add_argument("--block", metavar="TENSOR[:BLOCK]",
                   help="with --view block: the tensor (and block of its first row, default 0) to show")
    p.add_argument("--compare-with", metavar="GGUF",
                   help="with --view compare: the quant compared with FILE (the base) on the bundled sample text; "
                   "with --view diff: the file compared with FILE (File ▸ Compare with…)")
    p.add_argument("--imatrix", metavar="FILE",
                   help="with --view imatrix: the importance matrix to show (default: FILE itself)")
    return p


def install_excepthook(win: object) -> None:
    """Make an exception that escapes a Qt slot non-fatal: printed to stderr, shown in the window's error dialog,
    and the event loop keeps running (Ctrl-C still ends the app)."""
    import traceback

    previous = sys.excepthook

    def hook(etype: type[BaseException], value: BaseException, tb: object) -> None:
        if issubclass(etype, KeyboardInterrupt):
            previous(etype, value, tb)  # type: ignore[arg-type]
            return
        text = "".join(traceback.format_exception(etype, value, tb))  # type: ignore[arg-type]
        print(text, file=sys.stderr)
        try:
            win.show_error(f"Unexpected error: {etype.__name__}: {value}",  # type: ignore[attr-defined]
                           "Quantscope keeps running; the last action may be incomplete.\n\n" + text[-3000:])
        except Exception:  # the window itself is gone: stderr has it
            pass

    sys.excepthook = hook


def _default_file() -> Path:
    from quantscope.core import catalog

    name = catalog.DEFAULT_MODEL
    if not catalog.is_present(name):
        print(f"Default model {name!r} is not cached yet; fetching it (once).", file=sys.stderr)
        catalog.fetch(name, progress=lambda m: print(m, file=sys.stderr))
    return catalog.model_path(name)


def open_documents_from_the_system(app: object, win: object) -> object:
    """Files the system asks the app to open after it started (macOS Finder's open-document event, QFileOpenEvent:
    on macOS a double-clicked .gguf arrives as that event, not as an argument) open in ``win``. Returns the event
    filter (installed on ``app``; keep a reference)."""
    from PySide6.QtCore import QEvent, QObject

    class FileOpenFilter(QObject):
        def eventFilter(self, obj: QObject, event: QEvent) -> bool:
            if event.type() == QEvent.Type.FileOpen:
                path = event.file() or event.url().toLocalFile()  # type: ignore[attr-defined]
                if path:
                    win.open_path(Path(path))  # type: ignore[attr-defined]
                    return True
            return False

    f = FileOpenFilter(app)  # type: ignore[arg-type]
    app.installEventFilter(f)  # type: ignore[attr-defined]
    return f


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.screenshot and not has_display():
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
    if args.theme != "system":
        os.environ["QUANTSCOPE_THEME"] = args.theme
    remote = args.file if args.file and args.file.startswith("hf://") else None  # on the hub: not downloaded
    path = Path(args.file) if args.file else _default_file()

    from .qtdeps import startup_problem

    problem = startup_problem()  # Qt would abort with its own message, before any of ours
    if problem:
        print(f"quantscope: error: {problem}", file=sys.stderr)
        return 2

    from PySide6.QtWidgets import QApplication

    from .gc_thread import GuiThreadCollector
    from .mainwindow import MainWindow, app_icon
    from .theme import apply_theme

    if os.environ.get("QT_QPA_PLATFORM") == "offscreen":
        from PySide6.QtCore import qInstallMessageHandler

        def quiet(_mode: object, _ctx: object, msg: str) -> None:  # the offscreen plugin's one harmless warning
            if "propagateSizeHints" not in msg:
                print(msg, file=sys.stderr)

        qInstallMessageHandler(quiet)
    app = QApplication.instance() or QApplication([sys.argv[0]])
    collector = GuiThreadCollector()  # cycles are collected on this thread only (a worker's would delete Qt objects)
    app.setOrganizationName("Quantscope")
    app.setApplicationName("Quantscope")
    app.setDesktopFileName("quantscope")
    app.setWindowIcon(app_icon())
    apply_theme(app)
    try:  # follow the system when it switches between light and dark
        app.styleHints().colorSchemeChanged.connect(lambda *_: apply_theme(app))
    except AttributeError:
        pass
    win = MainWindow()
    install_excepthook(win)
    open_documents_from_the_system(app, win)
    try:
        if remote is not None:
            ok = win.open_remote(remote)  # its header, read in a worker
            if args.screenshot:
                wait_idle(app, win, 600.0)
                ok = win.doc is not None
        else:
            ok = win.open_path(path)
    except Exception as exc:  # a view that fails on this file: say so, keep the window
        win.show_error(f"{path.name} could not be shown: {type(exc).__name__}: {exc}")
        ok = False
    if args.screenshot:
        if not ok:
            msg = win.error_box.text() if win.error_box else "cannot open"
            detail = win.error_box.informativeText() if win.error_box else ""
            print(f"quantscope: {msg} {detail}".rstrip(), file=sys.stderr)
            win.close()
            return 2
        return render_screenshot(app, win, args.view, Path(args.screenshot), args.size, block=args.block,
                                 compare_with=args.compare_with, imatrix=args.imatrix)
    win.show()
    try:
        return int(app.exec())
    finally:
        collector.stop()


def render_screenshot(app: object, win: object, view: str, out: Path, size: tuple[int, int] = (1440, 920),
                      block: str | None = None, compare_with: str | None = None, imatrix: str | None = None) -> int:
    """Show ``view`` (a :data:`~quantscope.gui.views.registry.SHOTS` name) with the file loaded, wait for its
    background work, save a PNG, close cleanly."""
    from .mainwindow import MainWindow

    assert isinstance(win, MainWindow)
    entry = shot(view)
    if entry is None:
        print(f"quantscope: --view {view}: no such view", file=sys.stderr)
        return 2
    win.resize(*size)
    win.show()
    wait_idle(app, win)
    c = ShotContext(app, win, view, size, block, compare_with, imatrix)
    try:
        if entry.tab is not None and not entry.setup_shows:
            win.show_view(entry.tab)
        try:
            shown = entry.setup(c) if entry.setup is not None else None
        except ShotFailed as exc:
            print(f"quantscope: {exc}", file=sys.stderr)
            return exc.code
        target = shown if shown is not None else win
        wait_idle(app, win)
        for _ in range(10):
            app.processEvents()  # type: ignore[attr-defined]
            time.sleep(0.01)
        from PySide6.QtCore import QBuffer, QByteArray, QIODevice

        from quantscope.core.fsutil import PathRefused, write_atomic

        data = QByteArray()
        buf = QBuffer(data)
        buf.open(QIODevice.OpenModeFlag.WriteOnly)
        ok = target.grab().save(buf, "PNG")  # type: ignore[attr-defined]
        buf.close()
        try:  # through a temporary and a rename; a FIFO, device or directory at OUT is refused
            if not ok:
                raise OSError("the picture could not be encoded")
            inputs = [win.doc.path] if win.doc and not win.doc.remote else []
            write_atomic(out, bytes(data.data()), "--screenshot", inputs)
        except (OSError, PathRefused) as exc:
            print(f"quantscope: error: could not write {out}: {exc}", file=sys.stderr)
            return 1
        print(f"wrote {out} ({view})")
        return 0
    finally:
        win.close()
        if c.tmp is not None:
            c.tmp.cleanup()
