"""The main window: menus, shortcuts, recent files, drag-and-drop, the tabs, and the background task bar."""

from __future__ import annotations

import platform
import sys
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyqtgraph as pg
import PySide6
from PySide6.QtCore import QEvent, QFileSystemWatcher, QSettings, Qt, QTimer, qVersion
from PySide6.QtGui import (
    QAction,
    QCloseEvent,
    QDragEnterEvent,
    QDropEvent,
    QGuiApplication,
    QIcon,
    QKeySequence,
    QShortcut,
)
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFrame,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMessageBox,
    QPushButton,
    QTabWidget,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from quantscope.core.cpu import default_threads, isa, isa_detected

from .document import Document, OpenError, open_document
from .guard import qt_guarded
from .views.block_inspector import BlockInspectorView
from .views.bump_inspector import BumpInspectorView
from .views.chat import ChatView
from .views.compare_dialog import CompareDialog
from .views.convert_dialog import ConvertDialog
from .views.diff_view import DiffDialog
from .views.imatrix_dialog import ImatrixDialog
from .views.library import LibraryView
from .views.metadata import MetadataView
from .views.overview import OverviewView
from .views.probe import ProbeView
from .views.quant_lab import QuantLabView
from .views.quantize_dialog import QuantizeDialog
from .views.registry import VIEWS as VIEW_REGISTRY
from .views.registry import first_view
from .views.registry import view as registered_view
from .views.remote import RemoteBar, RemoteHost, remote_line
from .views.serve import ServeView
from .views.tensors import TensorsView
from .widgets.fit import ElidedLabel
from .widgets.paths import pick_file
from .widgets.progress import ProgressBar
from .workers import JobSlot, TaskRunner, task_label

if TYPE_CHECKING:
    from .views.hub import HubView

MAX_RECENT = 10
#: The View menu: Ctrl+1… in this order (the README lists the same), every tab of a file reachable by a key; read
#: from the registry of views (:data:`~quantscope.gui.views.registry.VIEWS`).
VIEW_KEYS = tuple((e.key, e.menu) for e in VIEW_REGISTRY)
FILE_CHECK_MS = 2000  # the open file's size/mtime/inode is compared this often (watchers miss some changes)
RESOURCES = Path(__file__).resolve().parent.parent / "resources"


def app_icon() -> QIcon:
    for p in (RESOURCES / "icons" / "quantscope.svg", RESOURCES / "icons" / "quantscope.png",
              Path(getattr(sys, "_MEIPASS", "")) / "resources" / "icons" / "quantscope.png"):
        if p.is_file():
            return QIcon(str(p))
    return QIcon()


def versions() -> dict[str, str]:
    """Versions shown in the About box."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        qs = version("quantscope")
    except PackageNotFoundError:
        qs = "dev"
    return {
        "Quantscope": qs, "Python": platform.python_version(), "Qt": qVersion(), "PySide6": PySide6.__version__,
        "pyqtgraph": pg.__version__, "numpy": np.__version__,
        "Kernel ISA": f"{isa()} (CPU supports {isa_detected()}, {default_threads()} threads)",
    }


@qt_guarded
class ShortcutSheet(QDialog):
    """The keyboard shortcuts (F1): rich text in a scrolled browser, at most 620 pixels tall."""

    def __init__(self, html: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Keyboard shortcuts")
        self.setAccessibleName("Keyboard shortcuts")
        self._html = html
        self.browser = QTextBrowser()
        self.browser.setHtml(html)
        self.browser.setFrameShape(QTextBrowser.Shape.NoFrame)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok)
        buttons.accepted.connect(self.accept)
        lay = QVBoxLayout(self)
        lay.addWidget(self.browser, 1)
        lay.addWidget(buttons)
        screen = (parent.screen() if parent is not None else None) or QGuiApplication.primaryScreen()
        room = screen.availableGeometry().height() - 80 if screen is not None else 620
        self.resize(min(960, max(600, int(self.browser.document().idealWidth()) + 60)), max(300, min(620, room)))

    def text(self) -> str:
        return self._html


@qt_guarded
class MainWindow(QMainWindow):
    """Quantscope's window. ``settings`` defaults to the user's QSettings (tests pass their own)."""

    def __init__(self, settings: QSettings | None = None) -> None:
        super().__init__()
        self.settings = settings or QSettings()
        self.doc: Document | None = None
        self.convert_dialog: ConvertDialog | None = None
        self.quantize_dialog: QuantizeDialog | None = None
        self.compare_dialog: CompareDialog | None = None
        self.diff_dialog: DiffDialog | None = None
        self.imatrix_dialog: ImatrixDialog | None = None
        self.error_box: QMessageBox | None = None
        self.about_box: QMessageBox | None = None
        self.setWindowTitle("Quantscope")
        self.setWindowIcon(app_icon())
        self.setAcceptDrops(True)
        self.resize(1440, 920)
        self.runner = TaskRunner(self)

        self.overview = OverviewView(self.runner)
        self.metadata_view = MetadataView()
        self.tensors_view = TensorsView(self.runner)
        self.block_view = BlockInspectorView()
        self.lab_view = QuantLabView(self.runner)
        self.chat_view = ChatView(self.runner)
        self.bump_view = BumpInspectorView(self.runner)
        self.probe_view = ProbeView(self.runner)
        self.serve_view = ServeView()
        self.library_view = LibraryView()  # the start page: every GGUF already on this machine
        self.hub_dialog: QDialog | None = None  # File ▸ Models from the hub (made on first use)
        self.hub_view: HubView | None = None
        self.welcome = self.library_view
        self.tabs = QTabWidget()
        self.tabs.setAccessibleName("Views")
        self.tabs.setDocumentMode(True)
        self._tab: dict[str, int] = {}
        self._hosts: dict[str, RemoteHost] = {}  # a view that reads the whole file: its page says so for a remote file
        # the tabs stand in the order of View ▸ Ctrl+1…9 (the N-th tab shown is Ctrl+N's view), the start page last
        for key, w, label in (*((e.key, e.widget(self), e.label) for e in VIEW_REGISTRY),
                              ("welcome", self.welcome, "Library")):
            w.setAccessibleName(w.accessibleName() or label)
            entry = registered_view(key)
            if entry is not None and entry.whole_file:
                host = RemoteHost(w, entry.whole_file)  # type: ignore[arg-type]
                host.downloadRequested.connect(self.download_remote)
                self._hosts[key] = host
                w = host
            self._tab[key] = self.tabs.addTab(w, label)
        central = QWidget()
        lay = QVBoxLayout(central)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(0)
        lay.addWidget(self._build_stale_bar())
        self.remote_bar = RemoteBar()
        self.remote_bar.downloadRequested.connect(self.download_remote)
        lay.addWidget(self.remote_bar)
        lay.addWidget(self.tabs, 1)
        self.setCentralWidget(central)
        self._show_tabs(None)

        # the open file, watched: a change on disk stops every reader of its old mapping (see file_changed)
        self.stale_path: Path | None = None
        self.file_watcher = QFileSystemWatcher(self)
        self.file_watcher.fileChanged.connect(lambda _p: self.check_file())
        self.file_timer = QTimer(self)
        self.file_timer.setInterval(FILE_CHECK_MS)
        self.file_timer.timeout.connect(self.check_file)
        self.runner.may_start = self._file_unchanged
        self.runner.changed.connect(lambda: QTimer.singleShot(0, self.check_file))  # a task ended: perhaps failed
        self.chat_view.replyFailed.connect(lambda _m: self.check_file())
        self.block_view.may_read = lambda: self.check_file() is None
        self.block_view.use_runner(self.runner)  # a remote file's blocks are fetched in it
        self.block_view.blockShown.connect(lambda *_: self._remote_read())  # what a remote file's reads came to
        self.remote_job = JobSlot(self.runner, self)  # File ▸ Models from the hub ▸ Open: the header's read
        self.remote_box: QMessageBox | None = None

        # exports from any view: long writes in the runner, the result in the status bar, a failure in a box
        for view in (self.overview, self.metadata_view, self.tensors_view, self.block_view):
            view.exporter.runner = self.runner
            view.exporter.finished.connect(lambda msg: self.statusBar().showMessage(msg, 10000))
            view.exporter.failed.connect(lambda msg: self.show_error(f"Export failed: {msg}"))

        # metadata editing: saving runs in the runner and opens the result; the title marks unsaved changes
        self.metadata_view.runner = self.runner
        self.metadata_view.openRequested.connect(self.open_path)
        self.metadata_view.dirtyChanged.connect(self._dirty_changed)

        self.tensors_view.inspectRequested.connect(self.inspect_block)
        self.tensors_view.tensorSelected.connect(self.lab_view.follow_tensor)
        self.tensors_view.requantizeRequested.connect(self.requantize_tensor)
        self.lab_view.inspectRequested.connect(self.inspect_block)
        self.probe_view.channelLinkRequested.connect(self.show_channel)
        self.serve_view.probeRequested.connect(self.probe_prompt)
        self.library_view.actionRequested.connect(self.library_action)
        self.chat_view.model_bar.serve_btn.clicked.connect(lambda: self.show_view("serve"))
        # the chat's "Colour by" choice is remembered between sessions
        self.chat_view.settings.set_color_mode(str(self.settings.value("chat/colourBy", "off")))
        self.chat_view.settings.colorModeChanged.connect(lambda m: self.settings.setValue("chat/colourBy", m))

        # status bar: message, background task, ISA
        self.task_label = QLabel()
        self.task_label.setObjectName("muted")
        self.task_progress = ProgressBar()
        self.task_progress.setMaximumWidth(160)
        self.task_progress.setRange(0, 0)
        self.task_progress.setAccessibleName("Background work")
        self.task_cancel = QPushButton("Cancel")
        self.task_cancel.setAccessibleName("Cancel background work")
        self.task_cancel.clicked.connect(lambda: self.runner.cancel())
        isa_label = QLabel(f"kernels: {isa()}")
        isa_label.setObjectName("muted")
        isa_label.setAccessibleName("Kernel instruction set")
        self.file_label = ElidedLabel(mode=Qt.TextElideMode.ElideMiddle)
        self.file_label.setAccessibleName("Open file")
        sb = self.statusBar()
        sb.addWidget(self.file_label, 1)  # a widget, not a message: menus' status tips do not erase it
        sb.addPermanentWidget(self.task_label)
        sb.addPermanentWidget(self.task_progress)
        sb.addPermanentWidget(self.task_cancel)
        sb.addPermanentWidget(isa_label)
        self.runner.changed.connect(self._tasks_changed)
        self._tasks_changed()

        self._build_menus()

    def _build_stale_bar(self) -> QFrame:
        """The notice shown when the open file changed on disk: what happened, Reload, Close (non-modal)."""
        bar = QFrame()
        bar.setObjectName("staleBar")
        bar.setAccessibleName("File changed on disk")
        bar.setFrameShape(QFrame.Shape.StyledPanel)
        bar.setStyleSheet("#staleBar { background: palette(alternate-base); border-bottom: 2px solid #d08000; }")
        h = QHBoxLayout(bar)
        h.setContentsMargins(10, 6, 10, 6)
        self.stale_label = QLabel()
        self.stale_label.setWordWrap(True)
        self.stale_reload = QPushButton("Reload")
        self.stale_reload.setAccessibleName("Reload the changed file")
        self.stale_reload.clicked.connect(self.reload_stale)
        self.stale_close = QPushButton("Close")
        self.stale_close.setAccessibleName("Close the changed file")
        self.stale_close.clicked.connect(self.dismiss_stale)
        h.addWidget(self.stale_label, 1)
        h.addWidget(self.stale_reload)
        h.addWidget(self.stale_close)
        bar.hide()
        self.stale_bar = bar
        return bar

    # ------------------------------------------------------------------ the open file changing on disk
    def _file_unchanged(self) -> bool:
        """Asked before each background task starts: refuse (and handle the change soon) when the file changed."""
        doc = self.doc
        if doc is None or doc.change() is None:
            return True
        QTimer.singleShot(0, self.check_file)
        return False

    def check_file(self) -> str | None:
        """Compare the open file with its identity at open time; on a change, stop using it (see file_changed)."""
        doc = self.doc
        if doc is None:
            return None
        what = doc.change()
        if what is not None:
            self.file_changed(doc, what)
        return what

    def file_changed(self, doc: Document, what: str) -> None:
        """The file behind ``doc`` changed on disk: its mapping may now fault on any read. Cancel and wait for every
        worker (the chat model thread included), let every view go of the document, and offer Reload / Close."""
        if self.doc is not doc:
            return
        for dlg in (self.convert_dialog, self.quantize_dialog, self.compare_dialog, self.diff_dialog):
            if dlg is not None:
                dlg.cancel()
        if self.quantize_dialog is not None and self.quantize_dialog.gguf is doc.gguf:
            self.quantize_dialog.close()  # it plans from the old mapping
            self.quantize_dialog = None
        self.runner.cancel()
        self.runner.wait(30000)  # readers of the dead mapping end at once: cancelled, or MappedFileError
        if self.diff_dialog is not None and self.diff_dialog.file_a is doc.gguf:
            self.diff_dialog.release()  # its results point into the old mapping
            self.diff_dialog.close()
            self.diff_dialog = None
        self.chat_view.set_document(None)
        self.chat_view.host.wait_retired(30000)
        self.set_document(None)  # no view keeps the old mapping: nothing touches it again
        self.stale_path = doc.path
        self.setWindowTitle(f"{doc.title} (changed on disk) — Quantscope")
        self.stale_label.setText(f"<b>{doc.title} changed on disk</b> ({what}). Its views were closed: they were "
                                 "reading the old contents. Reload it, or close it.")
        self.stale_bar.show()
        self.file_label.setText(f"{doc.path} changed on disk")

    def reload_stale(self) -> bool:
        """Open the changed file again (the bar stays when it cannot be opened any more)."""
        if self.stale_path is None:
            return False
        return self.open_path(self.stale_path)

    def dismiss_stale(self) -> None:
        self.stale_path = None
        self.stale_bar.hide()
        self.close_document()

    def _watch(self, doc: Document | None) -> None:
        old = self.file_watcher.files()
        if old:
            self.file_watcher.removePaths(old)
        if doc is None or doc.remote is not None:  # a remote file does not change under us: nothing is mapped
            self.file_timer.stop()
            return
        self.file_watcher.addPath(str(doc.path))
        self.file_timer.start()

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.ActivationChange and self.isActiveWindow():
            self.check_file()  # back from another program (which may have rewritten the file)

    # ------------------------------------------------------------------ menus
    def _action(self, text: str, slot: object, shortcut: QKeySequence | str | None = None,
                name: str | None = None) -> QAction:
        a = QAction(text, self)
        if shortcut is not None:
            a.setShortcut(QKeySequence(shortcut))
        a.triggered.connect(slot)  # type: ignore[arg-type]
        a.setObjectName(name or text)
        self.addAction(a)
        return a

    def _build_menus(self) -> None:
        mb = self.menuBar()
        m = mb.addMenu("&File")
        self.open_action = self._action("&Open…", self.open_dialog, QKeySequence.StandardKey.Open, "open")
        m.addAction(self.open_action)
        self.recent_menu = m.addMenu("Open &Recent")
        self.recent_menu.setAccessibleName("Recent files")
        self._fill_recent()
        m.addAction(self._action("Open the &demo model", self.open_demo, None, "open-demo"))
        m.addAction(self._action("Models from the &hub…", self.show_hub, "Ctrl+Shift+H", "hub"))
        self.save_as_action = self._action("&Save as…", self.save_as, "Ctrl+Shift+S", "save-as")
        self.save_as_action.setEnabled(False)
        m.addAction(self.save_as_action)
        m.addSeparator()
        self.diff_action = self._action("Compare &with…", self.show_diff, "Ctrl+Shift+D", "diff")
        self.diff_action.setStatusTip("What changed between the open GGUF and another one: metadata, tensors, values")
        self.diff_action.setEnabled(False)  # until a GGUF is open
        m.addAction(self.diff_action)
        m.addSeparator()
        m.addAction(self._action("&Close file", self.close_document, "Ctrl+W", "close-file"))
        m.addAction(self._action("&Quit", self.close, "Ctrl+Q", "quit"))
        v = mb.addMenu("&View")
        for e in VIEW_REGISTRY:
            v.addAction(self._action(e.menu, lambda _=False, k=e.key: self.show_view(k), e.shortcut, f"view-{e.key}"))
        v.addSeparator()
        v.addAction(self._action("Li&brary (models on this machine)", self.show_library, "Ctrl+L", "view-library"))
        v.addAction(self._action("&Find", self.focus_filter, QKeySequence.StandardKey.Find, "find"))
        t = mb.addMenu("&Tools")
        self.convert_action = self._action("&Convert to bump…", self.show_convert, "Ctrl+Shift+B", "convert")
        t.addAction(self.convert_action)
        self.quantize_action = self._action("&Quantize…", self.show_quantize, "Ctrl+Shift+Q", "quantize")
        t.addAction(self.quantize_action)
        self.lab_action = self._action("Quant &lab (what each type loses)", lambda: self.show_view("lab"),
                                       "Ctrl+Shift+L", "quant-lab")
        t.addAction(self.lab_action)
        self.compare_action = self._action("Quality on a &text (KL divergence)…", self.show_compare,
                                           "Ctrl+Shift+K", "compare")
        self.compare_action.setEnabled(False)  # until a GGUF is open
        t.addAction(self.compare_action)
        t.addAction(self._action("Importance &matrix…", lambda: self.show_imatrix(), "Ctrl+Shift+M", "imatrix"))
        self.probe_action = self._action("&Probe a prompt (logit lens, attention, activations)",
                                         lambda: self.show_view("probe"), "Ctrl+Shift+P", "probe")
        t.addAction(self.probe_action)
        self.serve_action = self._action("&Serve the model (OpenAI API)…", lambda: self.show_view("serve"),
                                         "Ctrl+Shift+E", "serve")
        self.serve_action.setStatusTip("Serve the open model over a local OpenAI-compatible API and look inside "
                                       "each request")
        t.addAction(self.serve_action)
        t.addSeparator()
        t.addAction(self._action("Cancel background &work", lambda: self.runner.cancel(), "Ctrl+.", "cancel-work"))
        h = mb.addMenu("&Help")
        h.addAction(self._action("&Keyboard shortcuts", self.show_shortcuts, "F1", "shortcuts"))
        h.addAction(self._action("&About Quantscope", self.show_about, None, "about"))

    # ------------------------------------------------------------------ recent files
    def recent_files(self) -> list[str]:
        v = self.settings.value("recentFiles", [])
        if isinstance(v, str):
            v = [v]
        return [str(x) for x in (v or [])]

    def _remember(self, path: Path) -> None:
        p = str(path.resolve())
        files = [p] + [x for x in self.recent_files() if x != p]
        self.settings.setValue("recentFiles", files[:MAX_RECENT])
        self.settings.sync()
        self._fill_recent()

    def _fill_recent(self) -> None:
        self.recent_menu.clear()
        files = self.recent_files()
        for i, f in enumerate(files):
            a = self.recent_menu.addAction(f"&{(i + 1) % 10} {Path(f).name}   —   {Path(f).parent}")
            a.setData(f)
            a.triggered.connect(lambda _=False, p=f: self.open_path(p))
        if files:
            self.recent_menu.addSeparator()
            self.recent_menu.addAction("Clear the list", self._clear_recent)
        else:
            self.recent_menu.addAction("(no recent files)").setEnabled(False)

    def _clear_recent(self) -> None:
        self.settings.setValue("recentFiles", [])
        self._fill_recent()

    # ------------------------------------------------------------------ opening
    def open_dialog(self) -> None:
        start = str(Path(self.recent_files()[0]).parent) if self.recent_files() else str(Path.home())
        path = pick_file(self, "Open a model file", start, "Model files (*.gguf *.bump *.bin);;All files (*)")
        if path:
            self.open_path(path)

    def open_demo(self) -> None:
        from quantscope.core import catalog

        name = catalog.DEFAULT_MODEL
        if not catalog.is_present(name):
            self.show_error("The demo model is not downloaded yet.",
                            f"Run `quantscope models fetch {name}` (or ./dev run) once to fetch it.")
            return
        self.open_path(catalog.model_path(name))

    def _dirty_changed(self, dirty: bool) -> None:
        title = self.windowTitle().removeprefix("* ")
        self.setWindowTitle(f"* {title}" if dirty else title)

    def confirm_discard(self) -> bool:
        """True when nothing unsaved would be lost, or the user chose to discard the metadata changes."""
        mv = self.metadata_view
        if not mv.dirty:
            return True
        box = QMessageBox(QMessageBox.Icon.Warning, "Unsaved changes",
                          f"The metadata has {len(mv.edits or ())} unsaved change(s). Discard them?",
                          QMessageBox.StandardButton.Cancel, self)
        box.setInformativeText("Save them first with File ▸ Save as… (Ctrl+Shift+S).")
        discard = box.addButton("Discard", QMessageBox.ButtonRole.DestructiveRole)
        box.exec()
        return box.clickedButton() is discard

    def save_as(self) -> object:
        """File ▸ Save as…: the Metadata view's edits written to a new file."""
        if self.doc is None or self.doc.gguf is None or self.needs_local("Saving a copy"):
            return None
        self.show_view("metadata")
        return self.metadata_view.save_as()

    def open_path(self, path: str | Path) -> bool:
        """Open a GGUF or bump file; on failure show an error dialog and keep the current file. ``hf://…``: see
        :meth:`open_remote` (True: its read has started)."""
        if isinstance(path, str) and path.startswith("hf://"):
            return self.open_remote(path)
        if not self.confirm_discard():
            return False
        try:
            doc = open_document(path)
        except OpenError as exc:
            self.show_error(str(exc), exc.detail)
            return False
        self.set_document(doc)
        self._remember(doc.path)
        if doc.gguf is not None and doc.gguf.get("general.type") == "imatrix":  # llama-imatrix's output: shown too
            self.show_imatrix(doc.path)
        return True

    def set_document(self, doc: Document | None) -> None:
        self.runner.cancel()
        self.doc = doc
        self._watch(doc)
        if doc is not None:
            self.stale_path = None
            self.stale_bar.hide()
        self.setWindowTitle(f"{doc.title} — Quantscope" if doc else "Quantscope")
        for entry in VIEW_REGISTRY:  # each view takes the document it shows, or lets go (see ViewEntry.release)
            entry.show_document(self, doc)
        for host in self._hosts.values():
            host.set_document(doc)
        self.remote_bar.set_document(doc)
        if doc is None:
            self.file_label.setText("")
        elif doc.remote is not None:
            self.file_label.setText(remote_line(doc))
        else:
            fmt = "BUMPWGT3, " if doc.kind == "bump" else ""
            self.file_label.setText(f"{doc.path}  ·  {fmt}opened in {doc.open_ms:.0f} ms")
        self._show_tabs(doc)
        self.convert_action.setEnabled(doc is not None and doc.gguf is not None)
        self.save_as_action.setEnabled(doc is not None and doc.gguf is not None)
        self.quantize_action.setEnabled(doc is not None and doc.gguf is not None)
        self.compare_action.setEnabled(doc is not None and doc.gguf is not None)
        self.diff_action.setEnabled(doc is not None and doc.gguf is not None)

    def close_document(self) -> None:
        if not self.confirm_discard():
            return
        self.set_document(None)
        self.statusBar().clearMessage()

    def _show_tabs(self, doc: Document | None) -> None:
        for entry in VIEW_REGISTRY:
            self.tabs.setTabVisible(self._tab[entry.key], entry.tab_shown(doc))
        self.tabs.setTabVisible(self._tab["welcome"], doc is None)
        first = first_view(doc)
        self.tabs.setCurrentIndex(self._tab[first.key if first is not None else "welcome"])

    def show_library(self) -> None:
        """The library (the start page), also while a file is open."""
        i = self._tab["welcome"]
        self.tabs.setTabVisible(i, True)
        self.tabs.setCurrentIndex(i)

    def show_hub(self) -> None:
        """The Hugging Face hub (gui/views/hub.py) in its own window: a finished download is opened here and the
        library rescanned."""
        if self.hub_dialog is None:
            from PySide6.QtWidgets import QVBoxLayout

            from .views.hub import HubView

            dlg = QDialog(self)
            dlg.setWindowTitle("Models from the Hugging Face hub")
            dlg.resize(1100, 700)
            lay = QVBoxLayout(dlg)
            lay.setContentsMargins(0, 0, 0, 0)
            self.hub_view = HubView(dlg)
            lay.addWidget(self.hub_view)
            self.hub_view.downloaded.connect(self._hub_downloaded)
            self.hub_view.openRequested.connect(self.open_remote)
            self.hub_dialog = dlg
        self.hub_dialog.show()
        self.hub_dialog.raise_()
        self.hub_dialog.activateWindow()

    # ------------------------------------------------------------------ a file on the hub, not downloaded
    def open_remote(self, ref: str) -> bool:
        """Open ``hf://org/repo/file.gguf`` without a download: its header is read over range requests in a worker
        (the window stays responsive; the status bar shows the task), then it is the open document. True: the
        read started."""
        from .document import open_remote_document

        if not self.confirm_discard():
            return False

        known = self.hub_view.known_peek(ref) if self.hub_view is not None else None

        def work(_report: object, _token: object) -> Document | OpenError:
            try:
                return open_remote_document(ref, known)
            except OpenError as exc:  # the message and its detail, for the error box
                return exc

        def opened(doc: Document | OpenError) -> None:
            if isinstance(doc, OpenError):
                self.statusBar().clearMessage()
                self.show_error(str(doc), doc.detail)
                return
            self.statusBar().clearMessage()  # the file label says what was read
            self.set_document(doc)

        self.statusBar().showMessage(f"Reading the header of {ref} from the hub…")
        self.remote_job.start("remote-open", work, on_done=opened,
                              on_failed=lambda msg, _tb: self.show_error(f"{ref} could not be opened.", msg))
        return True

    def _remote_read(self) -> None:
        if self.doc is not None and self.doc.remote is not None:
            self.file_label.setText(remote_line(self.doc))
            self.remote_bar.set_document(self.doc)

    def download_remote(self) -> None:
        """Download the open remote file (its whole shard set) in the hub window; it opens here when done."""
        doc = self.doc
        if doc is None or doc.remote is None:
            return
        self.show_hub()
        assert self.hub_view is not None
        self.hub_view.download_file(doc.remote.repo, doc.remote.filename)

    def needs_local(self, what: str) -> bool:
        """True when the open file is remote: then one line says ``what`` reads the whole file, with Download."""
        doc = self.doc
        if doc is None or doc.remote is None:
            return False
        box = QMessageBox(QMessageBox.Icon.Information, "Quantscope",
                          f"{what} reads the whole file, and {doc.title} is on the hub (read over range requests). "
                          "Download it first.", QMessageBox.StandardButton.Cancel, self)
        box.setAccessibleName("Needs the whole file")
        download = box.addButton("Download", QMessageBox.ButtonRole.AcceptRole)
        download.clicked.connect(self.download_remote)
        box.open()
        self.remote_box = box
        return True

    def _hub_downloaded(self, path: str) -> None:
        if not self.library_view.job.busy:
            self.library_view.scan()
        self.open_path(path)

    def library_action(self, path: str, action: str) -> None:
        """A library row's Open, Chat, Serve or Quantize: the file opened, then that view or dialog."""
        if not self.open_path(path):
            return
        if action in ("chat", "serve"):
            self.show_view(action)
        elif action == "quantize":
            self.show_quantize()

    def show_view(self, key: str) -> None:
        i = self._tab.get(key)
        if i is not None and self.tabs.isTabVisible(i):
            self.tabs.setCurrentIndex(i)

    def current_view(self) -> str:
        i = self.tabs.currentIndex()
        return next(k for k, v in self._tab.items() if v == i)

    def focus_filter(self) -> None:
        entry = registered_view(self.current_view())
        if entry is not None and entry.find:
            w = entry.widget(self).filter  # type: ignore[attr-defined]
            w.setFocus()
            w.selectAll()

    def inspect_block(self, tensor: str, row: int, block: int, element: int) -> None:
        if self.check_file() is not None:  # the block's bytes would be read from a mapping that may be gone
            return
        self.block_view.show_block(tensor, row, block, element)
        self.show_view("block")

    def show_channel(self, tensor: str, axis: str, index: int) -> None:
        """From the Probe tab: ``tensor`` in the Tensors tab, its ``axis`` (column or row) ``index`` marked in the
        heatmap."""
        if self.check_file() is not None or self.doc is None or self.doc.gguf is None:
            return
        if not self.doc.gguf.has_tensor(tensor):
            return
        self.show_view("tensors")
        self.tensors_view.show_heatmap(tensor)
        self.tensors_view.mark_line(axis, index)

    def probe_prompt(self, text: str) -> bool:
        """Open the Probe tab on ``text`` and run it (a served request's prompt)."""
        self.probe_view.prompt.setPlainText(text)
        self.show_view("probe")
        return self.probe_view.run()

    def requantize_tensor(self, tensor: str) -> None:
        """Open the Quant lab on ``tensor``, requantized into the chosen types."""
        if self.check_file() is None and self.lab_view.open_tensor(tensor):
            self.show_view("lab")

    # ------------------------------------------------------------------ dialogs
    def show_error(self, message: str, detail: str = "") -> QMessageBox:
        """A non-blocking error dialog (the window stays usable)."""
        box = QMessageBox(QMessageBox.Icon.Critical, "Quantscope", message, QMessageBox.StandardButton.Ok, self)
        box.setAccessibleName("Error")
        if detail:
            box.setInformativeText(detail)
        box.setWindowModality(Qt.WindowModality.WindowModal)
        box.open()
        self.error_box = box
        self.statusBar().showMessage(message, 10000)
        return box

    def show_convert(self) -> ConvertDialog | None:
        if self.doc is None or self.doc.gguf is None:
            return None
        if self.needs_local("Converting to bump"):
            return None
        if self.convert_dialog is not None and self.convert_dialog.state == "running":
            self.convert_dialog.show()
            self.convert_dialog.raise_()
            return self.convert_dialog
        ctx = self.doc.gguf.arch_get("context_length")
        dlg = ConvertDialog(self.doc.path, self.runner, self, int(ctx) if isinstance(ctx, int) else None)
        dlg.openRequested.connect(self.open_path)
        dlg.quantizeRequested.connect(self._quantize_for_bump)
        self.convert_dialog = dlg
        dlg.show()
        return dlg

    def _quantize_for_bump(self, preset: str) -> None:
        """Convert's way out for a file no bump profile takes: the Quantize dialog on ``preset``, requantizing."""
        dlg = self.show_quantize()
        if dlg is None or dlg.state == "running":
            return
        i = dlg.preset.findData(preset)
        if i >= 0:
            dlg.preset.setCurrentIndex(i)
        dlg.requant.setChecked(True)

    def show_quantize(self) -> QuantizeDialog | None:
        if self.doc is None or self.doc.gguf is None:
            return None
        if self.needs_local("Quantizing"):
            return None
        dlg = self.quantize_dialog
        if dlg is not None and (dlg.state == "running" or dlg.gguf is self.doc.gguf):
            dlg.show()
            dlg.raise_()
            return dlg
        dlg = QuantizeDialog(self.doc.path, self.doc.gguf, self.runner, self)
        dlg.openRequested.connect(self.open_path)
        self.quantize_dialog = dlg
        dlg.show()
        return dlg

    def show_compare(self) -> CompareDialog | None:
        """Tools ▸ Compare with…: the open GGUF against another one (or a KLD base file) on a text."""
        if self.doc is None or self.doc.gguf is None:
            return None
        if self.needs_local("Measuring quality on a text"):
            return None
        dlg = self.compare_dialog
        if dlg is not None and (dlg.state == "running" or dlg.doc_path == self.doc.path):
            dlg.show()
            dlg.raise_()
            return dlg
        if dlg is not None:
            dlg.close()
        dlg = CompareDialog(self.doc.path, self.runner, self)
        self.compare_dialog = dlg
        dlg.show()
        return dlg

    def show_diff(self) -> DiffDialog | None:
        """File ▸ Compare with…: what changed between the open GGUF and another one."""
        if self.doc is None or self.doc.gguf is None:
            return None
        if self.needs_local("Comparing values"):
            return None
        dlg = self.diff_dialog
        if dlg is not None and (dlg.state == "running" or dlg.file_a is self.doc.gguf):
            dlg.show()
            dlg.raise_()
            return dlg
        if dlg is not None:
            dlg.release()
            dlg.close()
        dlg = DiffDialog(self.doc.path, self.doc.gguf, self.runner, self)
        dlg.inspectRequested.connect(lambda *loc, d=dlg: self._inspect_from_diff(d, *loc))
        self.diff_dialog = dlg
        dlg.show()
        return dlg

    def _inspect_from_diff(self, dlg: DiffDialog, tensor: str, row: int, block: int, element: int) -> None:
        """A's block from the comparison, in the Block inspector (when A is still the open file)."""
        if self.doc is None or self.doc.gguf is not dlg.file_a:
            self.statusBar().showMessage("File A of that comparison is no longer the open file.", 10000)
            return
        self.inspect_block(tensor, row, block, element)
        self.raise_()
        self.activateWindow()

    def show_imatrix(self, path: str | Path | None = None) -> ImatrixDialog:
        """Tools ▸ Importance matrix…: the viewer, reading ``path`` when given."""
        if self.imatrix_dialog is None:
            self.imatrix_dialog = ImatrixDialog(self.runner, self)
        dlg = self.imatrix_dialog
        dlg.show()
        dlg.raise_()
        if path is not None:
            dlg.open_file(path)
        return dlg

    def about_text(self) -> str:
        rows = "".join(f"<tr><td><b>{k}</b></td><td>{v}</td></tr>" for k, v in versions().items())
        return ("<h3>Quantscope</h3><p>A desktop explorer for quantized LLM files (GGUF): metadata, tensors, the "
                f"inside of every quantization block, conversion to bump.</p><table>{rows}</table>")

    def show_about(self) -> QMessageBox:
        box = QMessageBox(QMessageBox.Icon.NoIcon, "About Quantscope", self.about_text(),
                          QMessageBox.StandardButton.Ok, self)
        box.setIconPixmap(self.windowIcon().pixmap(64, 64))
        box.setAccessibleName("About Quantscope")
        box.open()
        self.about_box = box
        return box

    def shortcut_sections(self) -> list[tuple[str, list[tuple[str, str]]]]:
        """Every keyboard shortcut, by where it works: the window's actions, then each view's own keys (its
        ``key_help()``, and the QShortcuts inside it described by their what's-this text)."""
        native = QKeySequence.SequenceFormat.NativeText
        out = [("Everywhere", [(a.shortcut().toString(native), a.text().replace("&", ""))
                               for a in self.actions() if not a.shortcut().isEmpty()])]
        for i in self._tab.values():
            view = self.tabs.widget(i)
            view = view.view if isinstance(view, RemoteHost) else view
            rows = list(view.key_help()) if hasattr(view, "key_help") else []
            seen = {k for k, _ in rows}
            for sc in view.findChildren(QShortcut):
                k = sc.key().toString(native)
                what = sc.whatsThis()
                if k and what and k not in seen and sc.isEnabled():
                    rows.append((k, what))
                    seen.add(k)
            if rows:
                out.append((self.tabs.tabText(i), rows))
        return out

    def show_shortcuts(self) -> ShortcutSheet:
        """F1: every shortcut by view, in two columns and scrolled when the screen is short (it fits 700 px)."""
        sections = self.shortcut_sections()
        half, acc, total = 0, 0, sum(len(r) + 2 for _, r in sections)
        while half < len(sections) and acc + len(sections[half][1]) + 2 <= total / 2:
            acc += len(sections[half][1]) + 2
            half += 1
        half = max(1, half)

        def column(part: list[tuple[str, list[tuple[str, str]]]]) -> str:
            html = ""
            for title, rows in part:
                html += f"<tr><td colspan=2><br><b>{escape(title)}</b></td></tr>"
                html += "".join(f"<tr><td><code>{escape(k)}</code>&nbsp;&nbsp;</td><td>{escape(v)}</td></tr>"
                                for k, v in rows)
            return f"<table>{html}</table>"

        html = (f"<table width='100%'><tr><td valign='top' width='50%'>{column(sections[:half])}</td>"
                f"<td valign='top' width='50%'>{column(sections[half:])}</td></tr></table>")
        box = ShortcutSheet(html, self)
        box.open()
        self.shortcuts_box = box
        return box

    # ------------------------------------------------------------------ background tasks
    def _tasks_changed(self) -> None:
        running = self.runner.running()
        on = bool(running)
        self.task_progress.setVisible(on)
        self.task_cancel.setVisible(on)
        self.task_label.setText(", ".join(sorted({task_label(t.name) for t in running})) + "…" if on else "")

    # ------------------------------------------------------------------ drag and drop
    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if event.mimeData().hasUrls() and any(u.isLocalFile() for u in event.mimeData().urls()):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        for u in event.mimeData().urls():
            if u.isLocalFile():
                self.open_path(u.toLocalFile())
                event.acceptProposedAction()
                return

    # ------------------------------------------------------------------ closing
    def closeEvent(self, event: QCloseEvent) -> None:
        """Cancel every background job and wait for the workers before the window goes (unsaved metadata changes
        ask first)."""
        if not self.confirm_discard():
            event.ignore()
            return
        for dlg in (self.convert_dialog, self.quantize_dialog, self.compare_dialog, self.imatrix_dialog,
                    self.diff_dialog):
            if dlg is not None:
                dlg.cancel()
        self.chat_view.shutdown(30000)
        self.serve_view.shutdown(30)
        self.remote_job.forget()
        self.runner.shutdown(30000)
        self.lab_view.shutdown()
        self.probe_view.shutdown()
        self.library_view.shutdown()
        if self.hub_view is not None:
            self.hub_view.shutdown()
        if self.doc is not None:
            self.doc.close()
        event.accept()

