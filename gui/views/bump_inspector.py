"""The bump inspector: a BUMPWGT3 file's header, dtype table, sections and checksum status."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QSplitter,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from quantscope.core.bump import BumpFile, describe
from quantscope.core.summary import human_bytes

from ..document import Document
from ..guard import qt_guarded
from ..models import BumpSectionsModel, KeyValueModel, SortFilterProxy, plural
from ..theme import BAD_COLOR, OK_COLOR
from ..widgets.fit import CONTENTS_PRECISION
from ..widgets.jobstrip import JobStrip
from ..workers import JobSlot, TaskRunner


def _table(model: object, name: str) -> QTableView:
    v = QTableView()
    v.setModel(model)  # type: ignore[arg-type]
    v.setAccessibleName(name)
    v.verticalHeader().setVisible(False)
    v.verticalHeader().setDefaultSectionSize(21)
    v.horizontalHeader().setStretchLastSection(True)
    v.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    # measured from the rows in view (and a sample), not every row: Qt's default reads 1,000 rows per column, a
    # Python data() call each, on every layout (showing the tab stalled the window ~1 s on a 340-section file)
    v.horizontalHeader().setResizeContentsPrecision(CONTENTS_PRECISION)
    v.verticalHeader().setResizeContentsPrecision(CONTENTS_PRECISION)
    v.setAlternatingRowColors(True)
    v.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    return v


@qt_guarded
class BumpInspectorView(QWidget):
    """Shown instead of the GGUF tabs when a bump file is open."""

    def __init__(self, runner: TaskRunner, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.runner = runner
        self.bump: BumpFile | None = None
        self.checksum_ok: bool | None = None
        self.job = JobSlot(runner, self, on_busy=self._busy)
        self.title = QLabel()
        self.title.setObjectName("heading")
        self.title.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.strip = JobStrip("checksum", "Verify checksum", progress_width=240, run_name="Verify the checksum again")
        self.strip.status.setWordWrap(False)
        self.strip.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.strip.run_clicked.connect(self.start_checksum)
        self.strip.cancel_clicked.connect(self.job.cancel)
        self.checksum = self.strip.status
        self.progress = self.strip.progress
        self.verify_btn = self.strip.run_btn
        self.cancel_btn = self.strip.cancel_btn
        self.header_model = KeyValueModel(headers=("Header field", "Value"))
        self.header_table = _table(self.header_model, "Bump header")
        self.dtype_model = KeyValueModel(headers=("Code", "Type", "Sections", "Bytes"), mono_columns=(0, 2, 3))
        self.dtype_table = _table(self.dtype_model, "Dtype table")
        self.sections_model = BumpSectionsModel()
        self.sections_proxy = SortFilterProxy(self)
        self.sections_proxy.setSourceModel(self.sections_model)
        self.sections_table = _table(self.sections_proxy, "Bump sections")
        self.sections_table.setSortingEnabled(True)
        self.sections_table.sortByColumn(3, Qt.SortOrder.AscendingOrder)
        self.filter = QLineEdit()
        self.filter.setPlaceholderText("Filter sections, e.g. layer.3. or Q4_K…")
        self.filter.setClearButtonEnabled(True)
        self.filter.setAccessibleName("Filter bump sections")
        self.filter.textChanged.connect(self.sections_proxy.setFilterFixedString)

        top = QHBoxLayout()
        top.addWidget(self.title, 1)
        top.addWidget(self.strip)
        hb = QGroupBox("Header (128 bytes)")
        QVBoxLayout(hb).addWidget(self.header_table)
        db = QGroupBox("Dtype table")
        QVBoxLayout(db).addWidget(self.dtype_table)
        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        ll.addWidget(hb, 3)
        ll.addWidget(db, 1)
        sb = QGroupBox("Sections")
        sl = QVBoxLayout(sb)
        sl.addWidget(self.filter)
        sl.addWidget(self.sections_table)
        split = QSplitter()
        split.addWidget(left)
        split.addWidget(sb)
        split.setStretchFactor(0, 2)
        split.setStretchFactor(1, 3)
        lay = QVBoxLayout(self)
        lay.addLayout(top)
        lay.addWidget(split, 1)
        self._busy(False)

    def _busy(self, busy: bool) -> None:
        self.strip.set_busy(busy)

    def set_document(self, doc: Document | None) -> None:
        """The :class:`~quantscope.gui.views.registry.View` contract: the bump file of ``doc`` (None: none)."""
        self.set_bump(doc.bump if doc is not None else None)

    def set_bump(self, b: BumpFile | None) -> None:
        self.job.forget()
        self.bump = b
        self.checksum_ok = None
        self.checksum.setText("")
        self.sections_model.set_bump(b)
        if b is None:
            return
        d = describe(b, None)
        self.title.setText(f"{b.path.name} — BUMPWGT3 v{d['version']}, {human_bytes(d['file_size'])}, "
                           f"{plural(len(b.sections), 'section')}")
        prof = f"{d['profile']} ({d['profile_source']})"
        if d["profile_source"] == "ambiguous":
            prof += f"; also fits {', '.join(d['profiles_that_fit'])}"
        self.header_model.set_rows([
            ("magic", d["magic"]), ("version", str(d["version"])), ("model_type", str(d["model_type"])),
            ("num_layers", str(d["num_layers"])), ("vocab_size", f"{d['vocab_size']:,}"),
            ("embed_dim", str(d["embed_dim"])), ("context_len", f"{d['context_len']:,}"),
            ("num_heads", str(d["num_heads"])), ("head_dim", str(d["head_dim"])),
            ("aligned_embed_dim", str(d["aligned_embed_dim"])), ("aligned_head_dim", str(d["aligned_head_dim"])),
            ("aligned_context", f"{d['aligned_context']:,}"), ("checksum (sha256)", d["checksum"]),
            ("profile", prof), ("kv heads (solved)", str(d["num_kv_heads"])),
            ("ffn size (solved)", str(d["intermediate_size"])), ("file size", f"{d['file_size']:,} bytes"),
            *(("problem", note) for note in b.notes),
        ])
        per: dict[int, list[int]] = {}
        for s in b.sections:
            per.setdefault(s.code, []).append(s.size)
        self.dtype_model.set_rows([
            (code, str(name), f"{len(per.get(int(code), []))}", human_bytes(sum(per.get(int(code), []))))
            for code, name in d["dtype_table"].items()
        ])
        self.start_checksum()

    def start_checksum(self) -> None:
        b = self.bump
        if b is None:
            return
        self.strip.started("Checksum: verifying…")

        def work(report, token):  # type: ignore[no-untyped-def]
            from quantscope.core.bump import Cancelled

            def prog(done: int, total: int) -> None:
                if token.cancelled:
                    raise Cancelled("checksum cancelled")
                report(done, total)

            return b.checksum_ok(prog)

        def progress(done: int, total: int, _t: str) -> None:
            self.strip.progress_to(done, total)

        def done(ok: bool) -> None:
            if self.bump is not b:
                return
            self.checksum_ok = ok
            color, text = (OK_COLOR, "✓ checksum verifies") if ok else (BAD_COLOR, "✗ checksum DOES NOT verify")
            self.checksum.setText(f"<span style='color:{color}; font-weight:600'>{text}</span>")

        def ended_other(text: str) -> None:
            if self.bump is b:
                self.checksum.setText(text)

        self.job.start("bump-checksum", work, on_done=done, on_progress=progress,
                          on_cancelled=lambda: ended_other("Checksum: not verified (cancelled)"),
                          on_failed=lambda m, _tb: ended_other(f"Checksum: could not be read: {m}"))
