"""Application entry point: ``quantscope [FILE] [--screenshot PNG [--view NAME]]``."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

SCREENSHOT_VIEWS = ("overview", "metadata", "metadata-edit", "tensors", "block", "chat", "convert", "bump", "quantize",
                    "requantize", "quant-stats", "budget", "compare", "imatrix", "diff", "probe", "probe-attention",
                    "probe-activations", "chat-tokens", "serve")

#: The short real exchange the chat screenshot runs (greedy, so the picture is reproducible).
CHAT_DEMO_SYSTEM = "You are a concise, helpful assistant."
CHAT_DEMO_PROMPTS = ("Write a Python function that checks whether a number is prime.", "What is its time complexity?")

#: The prompt the probe screenshots run (``--view probe``, ``probe-attention``, ``probe-activations``).
PROBE_DEMO_PROMPT = ("The capital of France is Paris, and the capital of Italy is Rome. The largest planet of the "
                     "solar system is Jupiter, and the smallest is")


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
    p.add_argument("file", nargs="?", help="GGUF or bump file to open")
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
    path = Path(args.file) if args.file else _default_file()

    from .qtdeps import startup_problem

    problem = startup_problem()  # Qt would abort with its own message, before any of ours
    if problem:
        print(f"quantscope: error: {problem}", file=sys.stderr)
        return 2

    from PySide6.QtWidgets import QApplication

    from .mainwindow import MainWindow, app_icon
    from .theme import apply_theme

    if os.environ.get("QT_QPA_PLATFORM") == "offscreen":
        from PySide6.QtCore import qInstallMessageHandler

        def quiet(_mode: object, _ctx: object, msg: str) -> None:  # the offscreen plugin's one harmless warning
            if "propagateSizeHints" not in msg:
                print(msg, file=sys.stderr)

        qInstallMessageHandler(quiet)
    app = QApplication.instance() or QApplication([sys.argv[0]])
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
    return int(app.exec())


def wait_idle(app: object, win: object, timeout: float = 90.0) -> bool:
    """Process events until no background task runs (or ``timeout`` seconds pass)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        app.processEvents()  # type: ignore[attr-defined]
        if not win.runner.running():  # type: ignore[attr-defined]
            for _ in range(5):
                app.processEvents()  # type: ignore[attr-defined]
                time.sleep(0.02)
            if not win.runner.running():  # type: ignore[attr-defined]
                return True
        time.sleep(0.02)
    return False


def wait_chat(app: object, chat: object, timeout: float = 600.0) -> bool:
    """Process events until the chat view's scripted exchange (load + replies) has ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        app.processEvents()  # type: ignore[attr-defined]
        if not chat.busy:  # type: ignore[attr-defined]
            return True
        time.sleep(0.01)
    return False


def _lab_screenshot(app: object, win: object, view: str) -> str | None:
    """The Quant lab for ``--view requantize`` (a representative tensor in every candidate type, its worst block
    shown), ``--view quant-stats`` (every weight × every type, rows sampled) or ``--view budget`` (the costs
    measured, the front drawn, the budget at Q4_K_M's size); a problem as text, or None."""
    lab = win.lab_view  # type: ignore[attr-defined]
    win.show_view("lab")  # type: ignore[attr-defined]
    if view == "requantize":
        name = lab.tensor_page.representative()
        if name is None:
            return "--view requantize: the file has no weight to requantize"
        lab.open_tensor(name)
        wait_idle(app, win, 600)
        page = lab.tensor_page
        return None if page.state == "done" else f"requantizing {name} failed: {page.error or page.state}"
    if view == "budget":  # every tensor's costs measured on the bundled sample text, the budget at Q4_K_M's size
        lab.pages.setCurrentWidget(lab.budget_page)
        if not lab.budget_page.start():
            return "--view budget: the file cannot be measured"
        wait_idle(app, win, 3600)
        page = lab.budget_page
        return None if page.state == "done" else f"measuring the costs failed: {page.error or page.state}"
    lab.pages.setCurrentWidget(lab.file_page)
    lab.file_page.start()
    wait_idle(app, win, 600)
    page = lab.file_page
    return None if page.state == "done" else f"the whole-file statistics failed: {page.error or page.state}"


def _analysis_screenshot(app: object, win: object, view: str, size: tuple[int, int], compare_with: str | None,
                         imatrix: str | None) -> tuple[object, str | None]:
    """The dialog of ``--view compare`` (the open file as the base, ``compare_with`` as the quant, the bundled
    sample text, run to the end, its worst position shown) or ``--view imatrix`` (``imatrix``, default the open
    file, read, a tensor selected), at the window's size; (the dialog, None) or (None, the problem)."""
    if view == "compare":
        if not compare_with:
            return None, "--view compare needs --compare-with GGUF (the quant)"
        cd = win.show_compare()  # type: ignore[attr-defined]
        if cd is None:
            return None, "--view compare needs a GGUF file"
        cd.resize(*size)
        cd.other.setText(compare_with)
        cd.start()
        wait_idle(app, win, 600)
        if cd.state != "done":
            return None, f"the comparison failed: {cd.error or cd.state}"
        cd.show_worst(0)
        return cd, None
    path = imatrix or str(win.doc.path)  # type: ignore[attr-defined]
    dlg = win.show_imatrix(path)  # type: ignore[attr-defined]
    dlg.resize(*size)
    wait_idle(app, win)
    if dlg.imatrix is None:
        return None, f"{path}: {dlg.error or 'not read'}"
    names = list(dlg.imatrix.entries)
    experts = [n for n in names if dlg.imatrix.entries[n].n_mat > 1]
    pick = next((n for n in names if "ffn_down" in n), names[0]) if not experts else experts[0]
    dlg.select_tensor(pick)
    return dlg, None


def _diff_screenshot(app: object, win: object, size: tuple[int, int],
                     compare_with: str | None) -> tuple[object, str | None]:
    """The dialog of ``--view diff``: the open file compared with ``compare_with`` to the end, the tensor of
    largest relative error located (both blocks shown), at the window's size; (the dialog, None) or (None, the
    problem)."""
    if not compare_with:
        return None, "--view diff needs --compare-with GGUF (the file compared with FILE)"
    dlg = win.show_diff()  # type: ignore[attr-defined]
    if dlg is None:
        return None, "--view diff needs a GGUF file"
    dlg.resize(*size)
    dlg.set_other(compare_with)
    dlg.start()
    wait_idle(app, win, 600)
    if dlg.state != "done":
        return None, f"the comparison failed: {dlg.error or dlg.state}"
    first = next((n for n in dlg.tensor_names() if dlg.why_not(n) is None), None)
    if first is not None:
        dlg.select_tensor(first)
        wait_idle(app, win, 600)
    return dlg, None


def _probe_screenshot(app: object, win: object, view: str) -> str | None:
    """The Probe tab after a run of :data:`PROBE_DEMO_PROMPT`: the logit lens (``probe``), the attention of the
    first sliding-window layer, else the middle one, averaged over the heads (``probe-attention``), or the
    activations of the layer with the largest outlier channel (``probe-activations``); a problem, or None."""
    pv = win.probe_view  # type: ignore[attr-defined]
    win.show_view("probe")  # type: ignore[attr-defined]
    pv.prompt.setPlainText(PROBE_DEMO_PROMPT)
    if not pv.run():
        return f"the probe did not start: {pv.error or pv.state}"
    wait_idle(app, win, 600)
    if pv.state != "done" or pv.result is None:
        return f"the probe failed: {pv.error or pv.state}"
    pr = pv.result.probe
    if view == "probe-attention":
        layers = [li for li in range(pr.n_layers) if pr.has_attention(li)]
        if not layers:
            return "the model has no attention layer"
        windowed = [li for li in layers if pr.window(li)]
        pv.pages.setCurrentWidget(pv.attention_page)
        pv.attention_page.select(windowed[0] if windowed else layers[len(layers) // 2], -1)
        wait_idle(app, win, 600)
        if pv.attention_page.shown is None:
            return f"the attention weights failed: {pv.error or pv.state}"
        pv.attention_page.heat.pick(pr.n_tokens - 1, 0)
    elif view == "probe-activations":
        pv.pages.setCurrentWidget(pv.activations_page)
    return None


def _serve_screenshot(app: object, win: object) -> str | None:
    """The Serve tab serving on a free port after three real requests (a streamed chat reply, a completion and a
    refused one), the chat reply opened with its tokens tinted; a problem, or None. The server stops when the
    window closes."""
    import json
    import threading
    import urllib.error
    import urllib.request

    sv = win.serve_view  # type: ignore[attr-defined]
    win.show_view("serve")  # type: ignore[attr-defined]
    sv.port_spin.setValue(0)
    sv.ctx_spin.setValue(min(sv.ctx_spin.value(), 2048))
    if not sv.start():
        return "the server did not start"
    deadline = time.monotonic() + 300
    while sv.state == "loading" and time.monotonic() < deadline:
        app.processEvents()  # type: ignore[attr-defined]
        time.sleep(0.02)
    if sv.state != "serving":
        return f"the server did not start: {sv.message or sv.state}"
    url, model = sv.server.url, sv.model_id
    bodies = [("/v1/chat/completions", {"model": model, "max_tokens": 60, "temperature": 0, "stream": True,
                                        "messages": [{"role": "user", "content": CHAT_DEMO_PROMPTS[0]}]}),
              ("/v1/completions", {"model": model, "max_tokens": 24, "temperature": 0,
                                   "prompt": "The three primary colours are"}),
              ("/v1/chat/completions", {"model": "no-such-model", "messages": [{"role": "user", "content": "Hi"}]})]

    def send() -> None:
        for path, body in bodies:
            req = urllib.request.Request(url + path, json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=300) as r:
                    r.read()
            except urllib.error.HTTPError:
                pass

    t = threading.Thread(target=send, daemon=True)
    t.start()
    while t.is_alive() and time.monotonic() < deadline:
        app.processEvents()  # type: ignore[attr-defined]
        time.sleep(0.02)
    for _ in range(20):
        app.processEvents()  # type: ignore[attr-defined]
        time.sleep(0.02)
    if sv.model.rowCount() < 3:
        return "the requests did not show in the panel"
    sv.table.selectRow(0)
    return None


def render_screenshot(app: object, win: object, view: str, out: Path, size: tuple[int, int] = (1440, 920),
                      block: str | None = None, compare_with: str | None = None, imatrix: str | None = None) -> int:
    """Show ``view`` with the file loaded, wait for its background work, save a PNG, close cleanly."""
    from .mainwindow import MainWindow

    assert isinstance(win, MainWindow)
    win.resize(*size)
    win.show()
    wait_idle(app, win)
    target = win
    tmp: tempfile.TemporaryDirectory[str] | None = None
    try:
        if view in ("tensors", "block", "metadata", "overview"):
            win.show_view(view)
        if view == "tensors":
            f = win.doc.gguf if win.doc else None
            if f is not None and f.tensors:  # a vocabulary-only file has none
                name = next((n for n in ("blk.0.attn_output.weight", "blk.0.ffn_down.weight") if f.has_tensor(n)),
                            f.tensors[0].name)
                win.tensors_view.select_tensor(name)
                win.tensors_view.lists.setCurrentIndex(0)
        if view == "block":
            if block:
                name, _, index = block.partition(":")
                f = win.doc.gguf if win.doc else None
                if f is None or not f.has_tensor(name) or (index and not index.isdigit()):
                    print(f"quantscope: --block {block}: no such tensor (or block) in the file", file=sys.stderr)
                    return 2
                win.block_view.show_block(name, 0, int(index or 0))
                wait_idle(app, win)
            win.block_view.set_element(37)
        if view == "chat":  # a short real exchange on the engine, saved to a throw-away database
            from quantscope.core.chat.store import ChatStore

            tmp = tempfile.TemporaryDirectory(prefix="quantscope-shot-")
            chat = win.chat_view
            chat.use_store(ChatStore(Path(tmp.name) / "chats.sqlite3"))
            win.show_view("chat")
            chat.run_script(list(CHAT_DEMO_PROMPTS), system=CHAT_DEMO_SYSTEM, preset="Greedy", max_tokens=200)
            if not wait_chat(app, chat) or chat.error:
                print(f"quantscope: the chat exchange failed: {chat.error or 'timed out'}", file=sys.stderr)
                return 1
            chat.tools.setCurrentIndex(1)  # the template preview: the exact prompt of this conversation
            chat.update_preview()
        if view == "chat-tokens":  # a reply coloured by probability, branched at its first uncertain word
            from quantscope.core.chat.store import ChatStore

            tmp = tempfile.TemporaryDirectory(prefix="quantscope-shot-")
            chat = win.chat_view
            chat.use_store(ChatStore(Path(tmp.name) / "chats.sqlite3"))
            win.show_view("chat")
            chat.run_script(["Name three colours and say in one sentence why you like each."],
                            system=CHAT_DEMO_SYSTEM, preset="Greedy", max_tokens=70)
            ok = wait_chat(app, chat) and not chat.error and chat.token_demo() and wait_chat(app, chat)
            if not ok or chat.error:
                print(f"quantscope: the token view's exchange failed: {chat.error or 'no branch point'}",
                      file=sys.stderr)
                return 1
        if view == "metadata-edit":  # the chat template editor, the sample conversation rendered with its tokens
            win.show_view("metadata")
            dlg = win.metadata_view.edit_template()
            if dlg is None:
                print("quantscope: --view metadata-edit needs a GGUF file", file=sys.stderr)
                return 2
            dlg.resize(*size)
            wait_idle(app, win)
            dlg.render_sample()  # again, now that the tokenizer is read: with the token ids
            wait_idle(app, win)
            target = dlg
        if view.startswith("probe"):  # the Probe tab after a real run of a fixed prompt
            problem = _probe_screenshot(app, win, view)
            if problem:
                print(f"quantscope: {problem}", file=sys.stderr)
                return 1
        if view == "serve":  # serving, after three real requests, one of them opened
            problem = _serve_screenshot(app, win)
            if problem:
                print(f"quantscope: {problem}", file=sys.stderr)
                return 1
        if view in ("requantize", "quant-stats", "budget"):  # the Quant lab after a real run
            problem = _lab_screenshot(app, win, view)
            if problem:
                print(f"quantscope: {problem}", file=sys.stderr)
                return 1
        if view in ("compare", "imatrix", "diff"):  # the dialog at the window's size, after its work has run
            shown, problem = (_diff_screenshot(app, win, size, compare_with) if view == "diff" else
                              _analysis_screenshot(app, win, view, size, compare_with, imatrix))
            if shown is None:
                print(f"quantscope: {problem}", file=sys.stderr)
                return 1
            target = shown
        if view == "quantize":  # the dialog at the window's size, after a real Q4_K_M run into a temporary folder
            tmp = tempfile.TemporaryDirectory(prefix="quantscope-shot-")
            qd = win.show_quantize()
            if qd is None:
                print("quantscope: --view quantize needs a GGUF file", file=sys.stderr)
                return 2
            qd.resize(*size)
            qd.output.setText(str(Path(tmp.name) / f"{win.doc.path.stem}-Q4_K_M.gguf"))  # type: ignore[union-attr]
            qd.start()
            wait_idle(app, win)
            if qd.state != "done":
                print(f"quantscope: quantization failed: {qd.error or qd.plan_error}", file=sys.stderr)
                return 1
            qd.table.scrollToTop()
            target = qd
        if view in ("convert", "bump"):
            tmp = tempfile.TemporaryDirectory(prefix="quantscope-shot-")
            dlg = win.show_convert()
            if dlg is None:
                print("quantscope: --view convert needs a GGUF file", file=sys.stderr)
                return 2
            dlg.output.setText(str(Path(tmp.name) / (win.doc.path.stem + ".bump")))  # type: ignore[union-attr]
            dlg.manifest_check.setChecked(True)
            dlg.manifest.setText(str(Path(tmp.name) / "manifest.json"))
            dlg.drop_head.setChecked(True)
            dlg.start()
            wait_idle(app, win)
            if view == "convert":
                target = dlg
            else:
                if dlg.result is None:
                    print(f"quantscope: conversion failed: {dlg.error}", file=sys.stderr)
                    return 1
                dlg._open_result()
        wait_idle(app, win)
        for _ in range(10):
            app.processEvents()  # type: ignore[attr-defined]
            time.sleep(0.01)
        from PySide6.QtCore import QBuffer, QByteArray, QIODevice

        from quantscope.core.fsutil import PathRefused, write_atomic

        data = QByteArray()
        buf = QBuffer(data)
        buf.open(QIODevice.OpenModeFlag.WriteOnly)
        ok = target.grab().save(buf, "PNG")
        buf.close()
        try:  # through a temporary and a rename; a FIFO, device or directory at OUT is refused
            if not ok:
                raise OSError("the picture could not be encoded")
            write_atomic(out, bytes(data.data()), "--screenshot", [win.doc.path] if win.doc else [])
        except (OSError, PathRefused) as exc:
            print(f"quantscope: error: could not write {out}: {exc}", file=sys.stderr)
            return 1
        print(f"wrote {out} ({view})")
        return 0
    finally:
        win.close()
        if tmp is not None:
            tmp.cleanup()
