"""Starting the desktop app from the ``quantscope`` command (no verb): refuses clearly without a display, renders a
``--screenshot`` offscreen, and reports a missing Qt instead of a traceback."""

from __future__ import annotations

import sys

from quantscope.core import catalog, sysinfo

NO_DISPLAY_MESSAGE = ("quantscope: no display: set DISPLAY, run under xvfb-run, or use --screenshot / "
                      "quantscope inspect")


def launch_gui(argv: list[str]) -> int:
    """`quantscope [FILE] [--screenshot PNG] [--view NAME]`: the desktop app. Without a display (Linux and the BSDs:
    no DISPLAY, WAYLAND_DISPLAY or QT_QPA_PLATFORM) a screenshot renders offscreen; anything else exits 2 with a
    clear message instead of letting Qt abort."""
    import os

    headless = not sysinfo.has_display()  # macOS and Windows always have their window system
    wants_shot = any(a == "--screenshot" or a.startswith("--screenshot=") for a in argv)
    wants_help = any(a in ("-h", "--help") for a in argv)
    if headless and not wants_shot and not wants_help:
        print(NO_DISPLAY_MESSAGE, file=sys.stderr)
        return 2
    if os.environ.get("QT_QPA_PLATFORM") in ("offscreen", "minimal") and not wants_shot and not wants_help:
        print(f"quantscope: QT_QPA_PLATFORM={os.environ['QT_QPA_PLATFORM']} shows no window: use --screenshot PNG, "
              "or unset it to open the app", file=sys.stderr)
        return 2
    if headless:
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
    try:
        from quantscope.gui.app import main as gui_main
    except ImportError as exc:
        print(f"quantscope: the desktop app cannot start: {exc} (pip install -e . installs PySide6 and pyqtgraph; "
              "`quantscope inspect FILE` works without them)", file=sys.stderr)
        return 2
    try:
        return gui_main(argv)
    except catalog.FetchError as exc:
        print(f"quantscope: error: {exc}", file=sys.stderr)
        return 2
