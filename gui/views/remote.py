"""A GGUF opened from the hub without a download (``hf://org/repo/file.gguf``, core/hub.py's peek): the window's bar
that says so, with Download, and the page a tab shows instead of its view when what the view does reads the whole
file (chat, probe, the Quant lab, serving)."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QStackedWidget, QVBoxLayout, QWidget

from quantscope.core.fsutil import printable
from quantscope.core.summary import human_bytes

from ..document import Document
from ..guard import qt_guarded


def remote_line(doc: Document) -> str:
    """``hf://… · read from the hub: N of M bytes (header) + K blocks`` for the status bar and the bar."""
    p = doc.remote
    if p is None:
        return ""
    f = p.gguf
    blocks = f.blocks_fetched
    more = f" + {blocks:,} block{'s' * (blocks != 1)} ({human_bytes(f.bytes_fetched)})" if blocks else ""
    return printable(f"{p.ref}  ·  on the hub: {human_bytes(p.fetched)} of {human_bytes(p.size)} read (the "
                     f"header){more}")


@qt_guarded
class RemoteBar(QFrame):
    """Above the tabs while a remote document is open: where it is, what was read, Download."""

    downloadRequested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("remoteBar")
        self.setAccessibleName("Remote file")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setStyleSheet("#remoteBar { background: palette(alternate-base); border-bottom: 2px solid #2a7ab0; }")
        h = QHBoxLayout(self)
        h.setContentsMargins(10, 6, 10, 6)
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setTextFormat(Qt.TextFormat.PlainText)
        self.download_btn = QPushButton("Download")
        self.download_btn.setAccessibleName("Download the remote file")
        self.download_btn.setToolTip("Download the file (every shard) into the Hugging Face cache and open it here")
        self.download_btn.clicked.connect(self.downloadRequested)
        h.addWidget(self.label, 1)
        h.addWidget(self.download_btn)
        self.hide()

    def set_document(self, doc: Document | None) -> None:
        if doc is None or doc.remote is None:
            self.hide()
            return
        count = doc.gguf.get("split.count") if doc.gguf is not None else None
        shards = (f" It is the first of {count} shards: what is listed is that file's."
                  if isinstance(count, int) and count > 1 else "")
        self.label.setText(f"{doc.title} is read from the hub over range requests, not downloaded: the header, then "
                           f"each block the inspector shows. Views that need the whole file say so.{shards}")
        self.label.setToolTip(remote_line(doc))
        self.show()


@qt_guarded
class RemoteHost(QStackedWidget):
    """A tab's page: its view, or (a remote document) one line saying why the view needs the whole file, and
    Download."""

    downloadRequested = Signal()

    def __init__(self, view: QWidget, what: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.view = view
        self.what = what
        self.setAccessibleName(view.accessibleName())
        self.notice = QWidget()
        self.notice.setAccessibleName("Needs the whole file")
        self.line = QLabel()
        self.line.setWordWrap(True)
        self.line.setTextFormat(Qt.TextFormat.PlainText)
        self.line.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.download_btn = QPushButton("Download")
        self.download_btn.setAccessibleName("Download the remote file")
        self.download_btn.clicked.connect(self.downloadRequested)
        lay = QVBoxLayout(self.notice)
        lay.addStretch(1)
        lay.addWidget(self.line)
        lay.addWidget(self.download_btn, 0, Qt.AlignmentFlag.AlignHCenter)
        lay.addStretch(2)
        self.addWidget(view)
        self.addWidget(self.notice)

    def set_document(self, doc: Document | None) -> None:
        """Show the notice for a remote ``doc`` (the view itself is handed documents by the registry)."""
        if doc is not None and doc.remote is not None:
            self.line.setText(f"{doc.title} is on the hub, read over range requests: {self.what}, which needs the "
                              "whole file. Download it to use this view.")
            self.setCurrentWidget(self.notice)
        else:
            self.setCurrentWidget(self.view)

    @property
    def remote_shown(self) -> bool:
        return self.currentWidget() is self.notice
