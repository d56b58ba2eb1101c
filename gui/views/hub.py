"""Models from the Hugging Face hub in the app: search GGUF repositories, a repository's GGUFs by quantization with
sizes, shards and whether each fits this machine, Download (progress, Cancel) into the Hugging Face cache, and Open
without downloading (the window reads the header over range requests). Everything goes through core/hub.py
(``huggingface_hub``) in this view's own worker; a finished download is announced with :attr:`HubView.downloaded`
(the first file's path), for the window to open or list it; Open with :attr:`HubView.openRequested`
(``hf://org/repo/file.gguf``)."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from quantscope.core import hub
from quantscope.core.fsutil import printable
from quantscope.core.summary import human_bytes

from ..guard import qt_guarded
from ..widgets.jobstrip import JobStrip
from ..workers import JobSlot, TaskRunner

REPO_COLUMNS = ("Repository", "Downloads", "Likes", "Updated")
FILE_COLUMNS = ("Quantization", "Size", "Shards", "Fits (RAM)", "File")
SORT_LABELS = (("Most downloaded", "downloads"), ("Most liked", "likes"), ("Recently updated", "recent"))
CONTEXT = 4096


def _table(columns: tuple[str, ...], name: str, stretch: int) -> QTableWidget:
    """A read-only table of rows; column ``stretch`` takes the room left (its text elided in the middle), the
    others fit their contents."""
    t = QTableWidget(0, len(columns))
    t.setAccessibleName(name)
    t.setHorizontalHeaderLabels(list(columns))
    t.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    t.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    t.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    t.verticalHeader().setVisible(False)
    t.setWordWrap(False)
    t.setTextElideMode(Qt.TextElideMode.ElideMiddle)
    h = t.horizontalHeader()
    h.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    h.setSectionResizeMode(stretch, QHeaderView.ResizeMode.Stretch)
    h.setStretchLastSection(False)
    return t


def _item(text: str, align_right: bool = False) -> QTableWidgetItem:
    it = QTableWidgetItem(printable(text))
    if align_right:
        it.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
    return it


@qt_guarded
class HubView(QWidget):
    """Search, a repository's files, Download."""

    downloaded = Signal(str)
    openRequested = Signal(str)  # hf://org/repo/file.gguf: open it without a download

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Hugging Face hub")
        self.runner = TaskRunner(self, max_threads=2)
        self.job = JobSlot(self.runner, self)  # search and a repository's files
        self.download_job = JobSlot(self.runner, self, on_busy=self._busy)
        self.hits: list[hub.RepoHit] = []
        self.sets: list[hub.QuantSet] = []
        self.repo: str | None = None
        self.paths: list[str] = []
        self.peeked: dict[str, hub.Peek] = {}  # hf://… -> the header the fit was read from (Open reuses it)
        self._build()

    def _build(self) -> None:
        intro = QLabel("<b>Models from the Hugging Face hub</b> — search GGUF repositories, pick a quantization and "
                       "download it into the Hugging Face cache (checked against the hub's SHA-256), where the "
                       "library and other tools find it, or open it without downloading (its header and the blocks "
                       "you inspect are read over range requests). Gated repositories need HF_TOKEN or a saved "
                       "token.")
        intro.setWordWrap(True)
        self.search_box = QLineEdit()
        self.search_box.setPlaceholderText("Search GGUF repositories by name")
        self.search_box.setAccessibleName("Search the hub")
        self.search_box.setClearButtonEnabled(True)
        self.search_box.returnPressed.connect(self.search)
        self.sort = QComboBox()
        self.sort.setAccessibleName("Sort the results")
        for label, key in SORT_LABELS:
            self.sort.addItem(label, key)
        self.search_btn = QPushButton("Search")
        self.search_btn.clicked.connect(self.search)
        tools = QHBoxLayout()
        tools.addWidget(self.search_box, 1)
        tools.addWidget(self.sort)
        tools.addWidget(self.search_btn)
        self.repos = _table(REPO_COLUMNS, "Repositories found", 0)
        self.repos.itemSelectionChanged.connect(self._repo_selected)
        self.files = _table(FILE_COLUMNS, "GGUF files of the repository", len(FILE_COLUMNS) - 1)
        self.files.itemSelectionChanged.connect(self._file_selected)
        self.files_label = QLabel("Select a repository to see its GGUF files.")
        self.files_label.setWordWrap(True)
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.addWidget(self.files_label)
        rl.addWidget(self.files, 1)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.repos)
        split.addWidget(right)
        split.setStretchFactor(0, 2)
        split.setStretchFactor(1, 3)
        self.strip = JobStrip("download", "Download", status_text="", disable_run=True)
        self.strip.run_clicked.connect(self.download)
        self.strip.cancel_clicked.connect(self._cancel)
        self.strip.set_can_run(False)
        self.peek_btn = QPushButton("Open without downloading")
        self.peek_btn.setAccessibleName("Open the file from the hub without downloading it")
        self.peek_btn.setToolTip("Open the file in the window over range requests: its header (Overview, Metadata, "
                                 "Tensors), and each block the Block inspector shows; nothing is downloaded")
        self.peek_btn.setEnabled(False)
        self.peek_btn.clicked.connect(self.peek)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(12, 10, 12, 10)
        lay.addWidget(intro)
        lay.addLayout(tools)
        lay.addWidget(split, 1)
        bottom = QHBoxLayout()
        bottom.addWidget(self.strip, 1)
        bottom.addWidget(self.peek_btn, 0, Qt.AlignmentFlag.AlignBottom)
        lay.addLayout(bottom)

    # -- search ------------------------------------------------------------------------------------------------
    def search(self) -> None:
        text, sort = self.search_box.text().strip(), str(self.sort.currentData())
        self.strip.set_status("Searching the hub…")
        self.job.start("hub-search", lambda _r, _t: hub.search(text, sort, 50), on_done=self._found,
                       on_failed=lambda m, _tb: self.strip.set_status(f"Search failed: {m}"))

    def _found(self, hits: list[hub.RepoHit]) -> None:
        self.hits = hits
        self.repos.setRowCount(0)
        self.repos.setRowCount(len(hits))
        for i, h in enumerate(hits):
            self.repos.setItem(i, 0, _item(h.id + ("  (gated)" if h.gated else "")))
            self.repos.setItem(i, 1, _item(f"{h.downloads or 0:,}", True))
            self.repos.setItem(i, 2, _item(f"{h.likes or 0:,}", True))
            self.repos.setItem(i, 3, _item((h.last_modified or "")[:10]))
        self.strip.set_status(f"{len(hits)} GGUF repositor{'ies' if len(hits) != 1 else 'y'} found"
                              if hits else "No GGUF repositories found.")

    # -- a repository's files ----------------------------------------------------------------------------------
    def _repo_selected(self) -> None:
        rows = self.repos.selectionModel().selectedRows()
        if not rows:
            return
        repo = self.hits[rows[0].row()].id
        self.repo = repo
        self.sets = []
        self.files.setRowCount(0)
        self.strip.set_can_run(False)
        self.files_label.setText(f"Reading {printable(repo)}…")

        def work(_report: Any, _token: Any) -> tuple[list[hub.QuantSet], int | None, int | None, Any]:
            from quantscope.core.gguf import GGUFError
            from quantscope.core.model.memory import memory_plan
            from quantscope.core.sysinfo import memory_available, memory_total

            sets = hub.gguf_sets(hub.repo_files(repo))
            kv, peeked = None, None
            ok = [s for s in sets if not s.problem]
            if ok:
                try:
                    peeked = hub.peek(repo, ok[0].files[0].path)
                    plan = memory_plan(peeked.gguf, CONTEXT)
                    kv = plan.kv_bytes + plan.state_bytes
                except (hub.HubError, GGUFError, ValueError):
                    kv = None
            return sets, kv, memory_available() or memory_total(), peeked

        self.job.start("hub-files", work, on_done=lambda r: self._listed(repo, *r),
                       on_failed=lambda m, _tb: self.files_label.setText(printable(m)))

    def _listed(self, repo: str, sets: list[hub.QuantSet], kv: int | None, room: int | None,
                peeked: hub.Peek | None) -> None:
        self.sets = sets
        self.peeked = {peeked.ref: peeked} if peeked is not None else {}
        self.files.setRowCount(len(sets))
        for i, s in enumerate(sets):
            need = s.size + (kv or 0)
            self.files.setItem(i, 0, _item(s.quant or "–"))
            self.files.setItem(i, 1, _item(human_bytes(s.size), True))
            self.files.setItem(i, 2, _item(str(s.shards), True))
            self.files.setItem(i, 3, _item(s.problem or hub.fit_text(need, room)))
            self.files.setItem(i, 4, _item(s.name))
        kv_text = f"weights + {human_bytes(kv)} KV cache at {CONTEXT:,} tokens" if kv is not None else "weights only"
        self.files_label.setText(printable(
            f"{repo}: {len(sets)} GGUF model{'s' * (len(sets) != 1)}; fits: {kv_text} against "
            f"{human_bytes(room) if room else '?'} of memory available" if sets else f"{repo} has no GGUF files."))

    def _file_selected(self) -> None:
        s = self.selected_set()
        self.strip.set_can_run(s is not None and not s.problem)
        self.peek_btn.setEnabled(s is not None)

    # -- open without downloading ------------------------------------------------------------------------------
    def peek(self) -> None:
        """Open the selected file (its first shard) in the window, read over range requests."""
        s, repo = self.selected_set(), self.repo
        if s is None or repo is None:
            return
        self.openRequested.emit(f"hf://{repo}/{s.files[0].path}")

    def known_peek(self, ref: str) -> hub.Peek | None:
        """The header of ``ref`` this view read already (for the fit), once: the window opens it without reading
        it again."""
        return self.peeked.pop(ref, None)

    def selected_set(self) -> hub.QuantSet | None:
        rows = self.files.selectionModel().selectedRows()
        return self.sets[rows[0].row()] if rows and rows[0].row() < len(self.sets) else None

    # -- download ----------------------------------------------------------------------------------------------
    def download(self) -> None:
        s, repo = self.selected_set(), self.repo
        if s is None or repo is None:
            return
        self._download(repo, s.name, lambda: s)

    def download_file(self, repo: str, name: str) -> None:
        """Download ``name`` of ``repo`` (the window's remote document): the set it belongs to, every shard."""

        def find() -> hub.QuantSet:
            files = hub.repo_files(repo)
            for s in hub.gguf_sets(files):
                if any(f.path == name for f in s.files):
                    if s.problem:
                        raise hub.HubError(f"{repo}: {s.name}: {s.problem}")
                    return s
            raise hub.HubError(f"{repo}: {name} is not in the repository")

        self._download(repo, name, find)

    def _download(self, repo: str, name: str, qset: Any) -> None:
        self.strip.started(f"Downloading {printable(name)}…")

        def work(report: Any, token: Any) -> list[str]:
            paths = hub.download(repo, qset(), progress=lambda n, d, t: report(d, t, f"Downloading {n}"),
                                 verify=lambda n, d, t: report(d, t, f"Checking SHA-256 of {n}"), cancel=token)
            return [str(p) for p in paths]

        self.download_job.start(
            "hub-download", work, on_done=self._downloaded,
            on_progress=lambda d, t, text: self.strip.progress_to(d, t, printable(text)),
            on_failed=lambda m, _tb: self.strip.failed(f"Download failed: {printable(m)}"),
            on_cancelled=lambda: self.strip.cancelled("Download cancelled; nothing was kept."))

    def _downloaded(self, paths: list[str]) -> None:
        self.paths = paths
        from pathlib import Path

        self.strip.finished(f"Downloaded {printable(Path(paths[0]).name)}"
                            + (f" and {len(paths) - 1} more shards" if len(paths) > 1 else "")
                            + " into the Hugging Face cache.")
        self.strip.status.setToolTip(printable("\n".join(paths)))
        self.downloaded.emit(paths[0])

    def _cancel(self) -> None:
        self.strip.cancelling()
        self.download_job.cancel()

    def _busy(self, busy: bool) -> None:
        self.strip.set_busy(busy)

    def shutdown(self, timeout_ms: int = 30000) -> bool:
        self.job.forget()
        self.download_job.forget()
        return self.runner.shutdown(timeout_ms)
