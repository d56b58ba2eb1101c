"""File ▸ Compare with…: what changed between the open GGUF (A, the reference) and another one (B).

The comparison is :func:`quantscope.core.gguf.diff.diff_files`, run in a worker with progress, rate and cancel.
The dialog shows a summary line, the metadata keys that differ and a sortable table of every tensor (status, type
and shape A → B, RMSE, max |Δ|, cosine, relative error, exact), largest relative error first. A click (or Enter) on
a tensor whose values differ finds where they differ most (:func:`~quantscope.core.gguf.diff.locate_difference`,
in a worker) and shows both files' blocks there side by side: each block's fields and the values of the region
around it, the element of largest |Δ| highlighted; A's block opens in the Block inspector. Rows copy their name or
cells; the whole comparison exports as JSON (``FileDiff.to_json``), written atomically."""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, QPoint, Qt, Signal
from PySide6.QtGui import QColor, QDragEnterEvent, QDropEvent, QFont, QFontMetrics, QResizeEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QCheckBox,
    QDialog,
    QFileDialog,
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMenu,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTableView,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from quantscope.core.fsutil import PathRefused, check_input, printable, write_atomic
from quantscope.core.gguf import GGUFError, GGUFFile
from quantscope.core.gguf.diff import (
    FileDiff,
    Located,
    MetadataChange,
    SideBlock,
    TensorDiff,
    ValueDiff,
    diff_files,
    locate_blocks,
)
from quantscope.core.jobs import RateMeter, format_duration
from quantscope.core.summary import human_bytes

from ..guard import qt_guarded
from ..models import KEY_ROLE, SORT_ROLE, KeyValueModel, SortFilterProxy, plural
from ..theme import BAD_COLOR, OK_COLOR, muted_color
from ..widgets.blockwidgets import mono_font
from ..widgets.fit import ElidedLabel, fit_columns
from ..widgets.jobstrip import JobStrip
from ..widgets.paths import output_path
from ..workers import JobSlot, Task, TaskRunner

DIFF_TASK = "diff"
LOCATE_TASK = "diff-locate"
#: Characters of a table cell shown (the whole text is in its tool tip).
CELL_CHARS = 120
#: Characters of a tool tip at most (values are previews already; keys are file-controlled).
TIP_CHARS = 2000
#: A string longer than this leads with its first difference.
LONG_STRING = 60
WORST_COLOR = "#e15759"  # the element of largest |Δ|
DELTA_COLOR = "#f28e2b"  # the other elements, by |Δ|
CHANGED_COLOR = "#d08000"
_Index = QModelIndex | QPersistentModelIndex
_ROOT = QModelIndex()
_ALIGN_RIGHT = int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
_MISSING = -math.inf  # sort value of an empty figure: below every number


# --------------------------------------------------------------------------------------------------- text
def fig(x: float | None, fmt: str = ".4g") -> str:
    """A figure as the tables show it: ``""`` when absent, ``nan``, ``inf``, ``-inf`` spelled out."""
    if x is None:
        return ""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return format(x, fmt)


def sort_value(x: float | None) -> float:
    """The number a figure sorts by (absent and NaN below every number)."""
    return _MISSING if x is None or math.isnan(x) else float(x)


def shape_text(s: tuple[int, ...] | None) -> str:
    return "–" if s is None else "[" + ", ".join(f"{d:,}" for d in s) + "]"


def pair_text(a: str | None, b: str | None) -> str:
    """``Q4_K`` when both are the same, ``F32 → Q8_0`` when not, ``– → F32`` for one missing."""
    if a == b:
        return a or "–"
    return f"{a or '–'} → {b or '–'}"


def cut(text: str, n: int = CELL_CHARS) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def value_text(v: Any) -> str:
    """A metadata preview as one line: strings quoted, arrays as ``a, b, …``, floats to 9 digits; control
    characters escaped (the text comes from the files)."""
    if isinstance(v, dict) and "count" in v:
        head = v.get("head", [])
        inner = ", ".join(value_text(x) for x in head)
        if v["count"] > len(head):
            inner += ", …"
        return f"[{v['type']} × {v['count']:,}: {inner}]" if "head" in v else f"[{v['type']} × {v['count']:,}]"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return fig(v, ".9g")
    if v is None:
        return "(none)"
    if isinstance(v, str):
        return printable(f"'{v}'")
    return printable(v)


def _items(value: dict[str, Any]) -> str:
    head = value["head"]
    return ", ".join(value_text(x) for x in head) + (", …" if value["count"] > len(head) else "")


def _side_text(type_name: str | None, value: Any, first: int | None, at: Any) -> str:
    """One file's side of a metadata change: type and value; for an array (and a long string) the first
    difference leads (``at`` is what this file holds there)."""
    if type_name is None:
        return ""
    there = "(end)" if at is None else value_text(at)
    if isinstance(value, dict) and "head" in value:  # an array: its type names the element type already
        lead = f"{type_name} × {value['count']:,}: "
        if first is not None:
            return lead + f"at [{first:,}]: {there} — {_items(value)}"
        return lead + _items(value)
    if first is not None and isinstance(value, str) and len(value) > LONG_STRING:
        return f"{type_name}: at character {first:,}: {there} — {value_text(value)}"
    return f"{type_name}: {value_text(value)}"


def change_cells(m: MetadataChange) -> tuple[str, str, str]:
    """What the metadata table shows of a change: its kind, A's type and value, B's type and value (for arrays
    and long strings the first difference first)."""
    kind = {"added": "added in B", "removed": "removed in B", "type": "type changed",
            "value": "value changed"}.get(m.kind, m.kind)
    first = m.first_diff if m.kind == "value" else None
    return kind, _side_text(m.type_a, m.value_a, first, m.at_a), _side_text(m.type_b, m.value_b, first, m.at_b)


def change_tip(m: MetadataChange) -> str:
    kind, a, b = change_cells(m)
    lines = [printable(m.key), kind, f"A: {a}" if a else "A: (no such key)", f"B: {b}" if b else "B: (no such key)"]
    if m.digest_a or m.digest_b:
        lines.append(f"BLAKE2b of the elements: A {m.digest_a or '–'} · B {m.digest_b or '–'}")
    return cut("\n".join(lines), TIP_CHARS)


def summary_text(d: FileDiff) -> str:
    """One line: identical, or the metadata changes and what happened to the tensors."""
    scope = []
    if d.tensor_filter is not None:
        scope.append(f"tensors matching {d.tensor_filter!r}")
    if not d.values_compared:
        scope.append("headers only")
    elif d.max_rows is not None:
        scope.append(f"value figures on at most {d.max_rows:,} rows per tensor")
    where = f" ({'; '.join(scope)})" if scope else ""
    if d.identical:
        what = "No differences in the headers" if not d.values_compared else "The files are identical"
        return printable(f"{what}{where}: {plural(d.metadata_same, 'metadata key')} and "
                         f"{plural(len(d.tensors), 'tensor')} the same.")
    c = d.counts()
    kinds = [(c.get("metadata_value", 0), "value"), (c.get("metadata_type", 0), "type"),
             (c.get("metadata_added", 0), "added"), (c.get("metadata_removed", 0), "removed")]
    if d.metadata:
        meta = f"{plural(len(d.metadata), 'metadata change')} (" + ", ".join(f"{n} {w}" for n, w in kinds if n) + ")"
    else:
        meta = "metadata the same"
    changed = c.get("tensors_changed", 0)
    how = [f"{n:,} {w}" for n, w in ((c["tensors_retyped"], "retyped"), (c["tensors_reshaped"], "reshaped"),
                                      (c["tensors_values_differ"], "with different values")) if n]
    parts = []
    if changed:
        parts.append(f"{changed:,} changed" + (f" ({', '.join(how)})" if how else ""))
    parts += [f"{n:,} {w}" for n, w in ((c.get("tensors_added", 0), "added"), (c.get("tensors_removed", 0), "removed"),
                                       (c.get("tensors_same", 0), "bit-identical"),
                                       (c.get("tensors_unchecked", 0), "not compared")) if n]
    tensors = f"tensors: {', '.join(parts)}" if parts else "no tensors"
    return printable(f"{meta} · {tensors}{where}")


def field_value_text(v: object) -> str:
    """A decoded block field's value in one cell (fp16 as bits and float, lists cut after 12)."""
    if isinstance(v, dict) and "bits" in v:
        return f"0x{v['bits']:04x} = {v['float']:.8g}"
    if isinstance(v, list):
        return " ".join(str(x) for x in v[:12]) + (" …" if len(v) > 12 else "")
    if isinstance(v, int):
        return f"0x{v:08x}"
    if isinstance(v, float):
        return f"{v:.8g}"
    return str(v)


# --------------------------------------------------------------------------------------------------- work
def open_other(path: Path) -> GGUFFile:
    """Open B for a comparison (problems in its tensors are listed, not fatal); ``ValueError`` says why not."""
    try:
        check_input(path)
    except PathRefused as exc:
        raise ValueError(f"{printable(path)} cannot be compared: {exc}") from None
    try:
        return GGUFFile(path, strict=False)
    except GGUFError as exc:
        raise ValueError(f"{printable(path.name)} is not a readable GGUF file: {printable(exc)}") from None
    except OSError as exc:
        raise ValueError(f"{printable(path.name)} cannot be read: {printable(exc)}") from None


# --------------------------------------------------------------------------------------------------- models
_STATUS_COLORS = {"added": OK_COLOR, "removed": BAD_COLOR, "changed": CHANGED_COLOR}
_STATUS_TEXT = {"unchecked": "not compared"}


@qt_guarded
class _DiffRows(QAbstractTableModel):
    """What the two diff tables share: one row per item with its cells (shown cut), a tooltip, the item's key
    under :data:`KEY_ROLE`, the sort value under :data:`SORT_ROLE` and a tab-separated copy; the subclasses add
    their columns' other roles in :meth:`extra`."""

    COLUMNS: tuple[str, ...] = ()

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[Any] = []
        self.cells: list[tuple[str, ...]] = []
        self.tips: list[str] = []
        self._mono = QFont(mono_font(9))

    def key(self, r: int) -> str:
        raise NotImplementedError

    def sort_value(self, r: int, c: int) -> Any:
        return self.cells[r][c]

    def extra(self, r: int, c: int, role: int) -> Any:
        return None

    def rowCount(self, parent: _Index = _ROOT) -> int:
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent: _Index = _ROOT) -> int:
        return 0 if parent.isValid() else len(self.COLUMNS)

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        r, c = index.row(), index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return cut(self.cells[r][c])
        if role == SORT_ROLE:
            return self.sort_value(r, c)
        if role == KEY_ROLE:
            return self.key(r)
        if role == Qt.ItemDataRole.ToolTipRole:
            return self.tips[r]
        return self.extra(r, c, role)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return self.COLUMNS[section]
        return None

    def row_text(self, r: int) -> str:
        """Row ``r``'s cells, whole, tab-separated (Copy values)."""
        return "\t".join(self.cells[r])


@qt_guarded
class TensorDiffModel(_DiffRows):
    """Every tensor of the comparison: name, status, type and shape A → B, RMSE, max |Δ|, cosine, relative error,
    exact. :data:`SORT_ROLE` holds the numbers, :data:`KEY_ROLE` the name."""

    COLUMNS = ("Tensor", "Status", "Type A → B", "Shape A → B", "RMSE", "Max |Δ|", "Cosine", "Rel. error", "Exact")
    KEYS = ("name", "status", "type", "shape", "rmse", "max_abs", "cosine", "rel_error", "exact")
    NUMERIC = (4, 5, 6, 7)

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[TensorDiff] = []
        self.sorts: list[tuple[Any, ...]] = []

    def set_diff(self, d: FileDiff | None) -> None:
        self.beginResetModel()
        self.rows = list(d.tensors) if d is not None else []
        self.cells, self.sorts, self.tips = [], [], []
        for t in self.rows:
            v = t.values
            exact = "" if v is None else ("yes" if v.exact else "no")
            self.cells.append((printable(t.name), _STATUS_TEXT.get(t.status, t.status), pair_text(t.type_a, t.type_b),
                               pair_text(shape_text(t.shape_a) if t.shape_a is not None else None,
                                         shape_text(t.shape_b) if t.shape_b is not None else None),
                               fig(v.rmse if v else None), fig(v.max_abs if v else None),
                               fig(v.cosine if v else None, ".6f"), fig(v.rel_error if v else None), exact))
            self.sorts.append((t.name, t.status, pair_text(t.type_a, t.type_b), self.cells[-1][3],
                               sort_value(v.rmse if v else None), sort_value(v.max_abs if v else None),
                               sort_value(v.cosine if v else None), sort_value(v.rel_error if v else None),
                               -1 if v is None else int(v.exact)))
            self.tips.append(self._tip(t))
        self.endResetModel()

    @staticmethod
    def _tip(t: TensorDiff) -> str:
        lines = [printable(t.name), f"status: {_STATUS_TEXT.get(t.status, t.status)}"]
        if t.retyped:
            lines.append(f"type {t.type_a} → {t.type_b}")
        if t.reshaped:
            lines.append(f"shape {shape_text(t.shape_a)} → {shape_text(t.shape_b)}")
        v = t.values
        if v is not None:
            if v.exact:
                lines.append("bit-identical (same type, same bytes)")
            else:
                lines.append(f"RMSE {fig(v.rmse, '.6g')} · max |Δ| {fig(v.max_abs, '.6g')}"
                             + (f" at (row {v.max_abs_at[0]:,}, column {v.max_abs_at[1]:,})" if v.max_abs_at else ""))
                lines.append(f"cosine {fig(v.cosine, '.8f')} · relative error {fig(v.rel_error, '.6g')} (RMSE / RMS "
                             f"of A = {fig(v.rms_a, '.6g')})")
                if v.first_diff_row is not None:
                    lines.append(f"first row whose bytes differ: {v.first_diff_row:,}")
            if v.sampled:
                lines.append(f"figures on {v.rows_compared:,} of {v.rows_total:,} rows")
            if v.nonfinite_a or v.nonfinite_b:
                lines.append(f"non-finite values left out: {v.nonfinite_a:,} in A, {v.nonfinite_b:,} in B")
            if not v.exact:
                lines.append("Click (or Enter) to see where the values differ most.")
        if t.note:
            lines.append(printable(t.note))
        return cut("\n".join(lines), TIP_CHARS)

    def key(self, r: int) -> str:
        return self.rows[r].name

    def sort_value(self, r: int, c: int) -> Any:
        return self.sorts[r][c]

    def extra(self, r: int, c: int, role: int) -> Any:
        if role == Qt.ItemDataRole.TextAlignmentRole and c in self.NUMERIC:
            return _ALIGN_RIGHT
        if role == Qt.ItemDataRole.FontRole and c in self.NUMERIC:
            return self._mono
        if role == Qt.ItemDataRole.ForegroundRole:
            t = self.rows[r]
            if c == 1 and t.status in _STATUS_COLORS:
                return QColor(_STATUS_COLORS[t.status])
            if (c == 1 and t.status == "unchecked") or (c == 8 and t.values is not None and t.values.exact):
                return muted_color()
            if (c == 2 and t.retyped) or (c == 3 and t.reshaped):
                return QColor(CHANGED_COLOR)
        return None

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.ToolTipRole:
            return {4: "sqrt(Σ(b − a)² / n) over the values finite in both files",
                    5: "the largest |b − a|", 6: "Σab / sqrt(Σa² · Σb²)",
                    7: "RMSE / RMS of A (the default order: largest first)",
                    8: "same type and the same bytes"}.get(section)
        return super().headerData(section, orientation, role)


@qt_guarded
class MetadataDiffModel(_DiffRows):
    """The metadata keys that differ: key, kind of change, A's type and value, B's type and value."""

    COLUMNS = ("Key", "Change", "A (type: value)", "B (type: value)")

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[MetadataChange] = []

    def set_diff(self, d: FileDiff | None) -> None:
        self.beginResetModel()
        self.rows = list(d.metadata) if d is not None else []
        self.cells = [(printable(m.key), *change_cells(m)) for m in self.rows]
        self.tips = [change_tip(m) for m in self.rows]
        self.endResetModel()

    def key(self, r: int) -> str:
        return self.rows[r].key

    def extra(self, r: int, c: int, role: int) -> Any:
        if role == Qt.ItemDataRole.FontRole and c in (2, 3):
            return self._mono
        if role == Qt.ItemDataRole.ForegroundRole and c == 1:
            kind = self.rows[r].kind
            return QColor(OK_COLOR if kind == "added" else BAD_COLOR if kind == "removed" else CHANGED_COLOR)
        return None


@qt_guarded
class WindowModel(QAbstractTableModel):
    """One file's values over the shown columns, ``n_cols`` per row (rows headed by their first column): the
    cells of this file's block in full colour, the others dimmed, each tinted by |Δ| to the other file, the
    element of largest |Δ| in red."""

    def __init__(self) -> None:
        super().__init__()
        self.mine = np.empty(0, np.float32)
        self.other = np.empty(0, np.float32)
        self.w0 = 0
        self.col = -1
        self.block_cols = (0, 0)
        self.block_elems = 1
        self.side = "A"
        self.n_cols = 8
        self.delta = np.empty(0, np.float64)
        self.max_delta = 0.0
        self.mono = QFont(mono_font(9))
        self._bold = QFont(mono_font(9, bold=True))

    def set_values(self, side: str, mine: np.ndarray, other: np.ndarray, w0: int, col: int, block: int,
                   block_elems: int) -> None:
        self.beginResetModel()
        self.side = side
        self.mine, self.other = mine, other
        self.w0, self.col = w0, col
        self.block_elems = block_elems
        self.block_cols = (block * block_elems, (block + 1) * block_elems)
        with np.errstate(invalid="ignore", over="ignore"):
            d = np.abs(other.astype(np.float64) - mine.astype(np.float64))
        d[~np.isfinite(d)] = 0.0
        self.delta = d
        self.max_delta = float(d.max()) if d.size else 0.0
        self.endResetModel()

    def clear(self) -> None:
        self.set_values(self.side, np.empty(0, np.float32), np.empty(0, np.float32), 0, -1, 0, 1)

    def set_columns(self, n: int) -> None:
        if n != self.n_cols:
            self.beginResetModel()
            self.n_cols = n
            self.endResetModel()

    def index_of(self, col: int) -> QModelIndex:
        """The cell of tensor column ``col``."""
        i = col - self.w0
        return self.index(i // self.n_cols, i % self.n_cols) if 0 <= i < self.mine.size else QModelIndex()

    def _i(self, index: _Index) -> int:
        i = index.row() * self.n_cols + index.column()
        return i if i < self.mine.size else -1

    def rowCount(self, parent: _Index = _ROOT) -> int:
        return 0 if parent.isValid() else (self.mine.size + self.n_cols - 1) // self.n_cols

    def columnCount(self, parent: _Index = _ROOT) -> int:
        return 0 if parent.isValid() else (self.n_cols if self.mine.size else 0)

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        i = self._i(index)
        if i < 0:
            return None
        col = self.w0 + i
        worst = col == self.col
        inside = self.block_cols[0] <= col < self.block_cols[1]
        if role == Qt.ItemDataRole.DisplayRole:
            return fig(float(self.mine[i]), ".5g")
        if role == Qt.ItemDataRole.UserRole:
            return float(self.mine[i])
        if role == Qt.ItemDataRole.ToolTipRole:
            a, b = (self.mine[i], self.other[i]) if self.side == "A" else (self.other[i], self.mine[i])
            be = self.block_elems
            return (f"column {col:,} · {self.side}'s block {col // be:,}, element {col % be}"
                    + (" (the largest |Δ|)" if worst else "")
                    + f"\nA {fig(float(a), '.8g')}\nB {fig(float(b), '.8g')}"
                    + f"\nB − A {fig(float(b) - float(a), '+.6g')}")
        if role == Qt.ItemDataRole.TextAlignmentRole:
            return _ALIGN_RIGHT
        if role == Qt.ItemDataRole.FontRole:
            return self._bold if worst else self.mono
        if role == Qt.ItemDataRole.BackgroundRole:
            if worst:
                return QColor(WORST_COLOR)
            if self.max_delta > 0 and self.delta[i] > 0:
                c = QColor(DELTA_COLOR)
                c.setAlpha(int(12 + 78 * self.delta[i] / self.max_delta))
                return c
            return None
        if role == Qt.ItemDataRole.ForegroundRole:
            if worst:
                return QColor("#ffffff")
            if not inside:
                return muted_color()
        return None

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if role != Qt.ItemDataRole.DisplayRole:
            return None
        if orientation == Qt.Orientation.Horizontal:
            return f"+{section}"
        return f"{self.w0 + section * self.n_cols:,}"


@qt_guarded
class WindowTable(QTableView):
    """The values grid: as many columns as fit (2, 4, 8, 16 or 32), never a horizontal scroll bar."""

    def __init__(self, model: WindowModel) -> None:
        super().__init__()
        self.setModel(model)
        self.wmodel = model
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setWordWrap(False)
        self.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.setShowGrid(True)
        h = self.horizontalHeader()
        h.setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        h.setMinimumSectionSize(20)
        v = self.verticalHeader()
        v.setDefaultSectionSize(self.fontMetrics().height() + 6)
        v.setSectionResizeMode(QHeaderView.ResizeMode.Fixed)
        self.setMinimumHeight(80)

    def cell_width(self) -> int:
        return QFontMetrics(self.wmodel.mono).horizontalAdvance("-1.2345e-05") + 10

    def fit(self) -> None:
        v = self.verticalHeader()
        room = self.width() - 2 * self.frameWidth() - max(v.width(), v.sizeHint().width()) \
            - self.verticalScrollBar().sizeHint().width()
        per = room // max(1, self.cell_width())
        n = next((k for k in (32, 16, 8, 4) if per >= k), 2)  # rows start at a power of two: blocks line up
        if n != self.wmodel.n_cols:
            self.wmodel.set_columns(n)
            # the rows flow anew: keep the element of largest |Δ| in view (the scroll bar keeps a row, not it)
            at = self.wmodel.index_of(self.wmodel.col)
            if at.isValid():
                self.scrollTo(at, QAbstractItemView.ScrollHint.PositionAtCenter)

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self.fit()


@qt_guarded
class SideView(QWidget):
    """One file's block at the located difference: where it is, the worst element's dequantization written out,
    the values of the shown columns and the block's fields."""

    def __init__(self, side: str) -> None:
        super().__init__()
        self.side = side
        self.block: SideBlock | None = None
        self.head = ElidedLabel(f"{side}")
        self.head.setObjectName("heading")
        self.head.setAccessibleName(f"{side}'s block")
        self.sub = ElidedLabel()
        self.sub.setObjectName("muted")
        self.sub.setAccessibleName(f"Where {side}'s block is")
        self.explain = QLabel()
        self.explain.setTextFormat(Qt.TextFormat.PlainText)
        self.explain.setWordWrap(True)
        self.explain.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.explain.setFont(mono_font(9, bold=True))
        self.explain.setMinimumHeight(2 * self.explain.fontMetrics().lineSpacing() + 2)
        self.explain.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
        self.explain.setAccessibleName(f"Dequantization of {side}'s element of largest difference")
        self.values_model = WindowModel()
        self.values = WindowTable(self.values_model)
        self.values.setAccessibleName(f"{side}'s values around the largest difference")
        self.fields_model = KeyValueModel(headers=("Field", "Offset", "Bytes", "Kind", "Value", "Meaning"),
                                          mono_columns=(1, 2, 4))
        self.fields = QTableView()
        self.fields.setModel(self.fields_model)
        self.fields.setAccessibleName(f"Fields of {side}'s block")
        self.fields.verticalHeader().setVisible(False)
        self.fields.setWordWrap(False)
        fit_columns(self.fields, stretch=5, optional=(3, 1, 2), min_stretch=80)
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.tabs.setAccessibleName(f"{side}'s block")
        self.tabs.addTab(self.values, "Values")
        self.tabs.addTab(self.fields, "Block fields")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(2)
        lay.addWidget(self.head)
        lay.addWidget(self.sub)
        lay.addWidget(self.explain)
        lay.addWidget(self.tabs, 1)
        self.clear()

    def clear(self, text: str = "") -> None:
        self.block = None
        self.head.setText(f"{self.side}")
        self.sub.setText(text)
        self.explain.setText("")
        self.values_model.clear()
        self.fields_model.set_rows([])

    def set_block(self, found: Located, file_name: str) -> None:
        s = found.a if self.side == "A" else found.b
        other = found.b if self.side == "A" else found.a
        loc = found.loc
        self.block = s
        self.head.setText(printable(f"{self.side} · {s.type_name} · block {s.block:,} of row {loc.row:,}  —  "
                                    f"{file_name}"))
        c0 = s.block * s.block_elems
        cols = f"column {c0:,}" if s.block_elems == 1 else f"columns {c0:,}–{c0 + s.block_elems - 1:,}"
        self.sub.setText(f"element {s.element} = column {loc.col:,} · {s.size} bytes at file offset {s.offset:,} "
                         f"({cols})")
        v = s.decoded.values[s.element] if s.decoded is not None else s.values[loc.col - found.window[0]]
        self.explain.setText(s.decoded.explain(s.element) if s.decoded is not None else
                             f"x[{s.element}] = {fig(float(v), '.7g')}  (no field decoder for {s.type_name})")
        self.values_model.set_values(self.side, s.values, other.values, found.window[0], loc.col, s.block,
                                     s.block_elems)
        rows = [] if s.decoded is None else [
            (fd.name, str(fd.offset), str(fd.size), fd.kind, field_value_text(fd.value), fd.description)
            for fd in s.decoded.fields]
        self.fields_model.set_rows(rows)
        self.values.fit()
        self.values.scrollTo(self.values_model.index_of(loc.col), QAbstractItemView.ScrollHint.PositionAtCenter)

    def shown_value(self) -> str:
        """The text of the grid's cell at the located element."""
        if self.block is None:
            return ""
        return str(self.values_model.index_of(self.values_model.col).data())


@qt_guarded
class BlockPairView(QWidget):
    """Both files' blocks where a tensor differs most, side by side, and a button to open A's block in the
    Block inspector (``inspectRequested``)."""

    inspectRequested = Signal()

    HINT = "Click a tensor whose values differ (or select it and press Enter) to see where they differ most."

    def __init__(self) -> None:
        super().__init__()
        self.found: Located | None = None
        self.name: str | None = None
        self.title = ElidedLabel("Where the values differ most")
        self.title.setObjectName("heading")
        self.title.setAccessibleName("Tensor located")
        self.inspect_btn = QPushButton("Open A's block in the inspector")
        self.inspect_btn.setAccessibleName("Open A's block in the Block inspector")
        self.inspect_btn.setToolTip("A's block at this element, in the main window's Block inspector")
        self.inspect_btn.setEnabled(False)
        self.inspect_btn.clicked.connect(self.inspectRequested)
        self.info = ElidedLabel(self.HINT)
        self.info.setObjectName("muted")
        self.info.setAccessibleName("Located difference")
        self.a = SideView("A")
        self.b = SideView("B")
        head = QHBoxLayout()
        head.addWidget(self.title, 1)
        head.addWidget(self.inspect_btn)
        sides = QSplitter(Qt.Orientation.Horizontal)
        sides.setChildrenCollapsible(False)
        sides.setHandleWidth(14)  # room between the two files' headings
        sides.addWidget(self.a)
        sides.addWidget(self.b)
        self.sides = sides
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 4, 0, 0)
        lay.setSpacing(2)
        lay.addLayout(head)
        lay.addWidget(self.info)
        lay.addWidget(sides, 1)

    def show_message(self, text: str, title: str = "Where the values differ most") -> None:
        self.found = None
        self.title.setText(title)
        self.info.setText(text)
        self.a.clear()
        self.b.clear()
        self.inspect_btn.setEnabled(False)

    def show_progress(self, name: str, frac: float) -> None:
        self.title.setText(printable(name))
        self.info.setText(f"Finding where the values differ most… {100 * frac:.0f} %")

    def set_found(self, found: Located, names: tuple[str, str], values: ValueDiff | None = None) -> None:
        """Show ``found``; ``values`` (the table's figures of the tensor) names the tensor's largest |Δ| when it lies
        outside these columns (the region shown is the one of the largest RMSE, not always the one of the max)."""
        self.found = found
        loc = found.loc
        self.name = loc.tensor
        c0, c1 = loc.region
        self.title.setText(printable(f"{loc.tensor} · row {loc.row:,} · columns {c0:,}–{c1 - 1:,}"))
        elsewhere = ""
        if values is not None and values.max_abs_at is not None and values.max_abs > loc.abs_diff:
            r, c = values.max_abs_at
            elsewhere = f" (the tensor's, the table's Max |Δ|: {fig(values.max_abs)} at row {r:,}, column {c:,})"
        self.info.setText(f"Largest |Δ| in these columns {fig(loc.abs_diff)} at column {loc.col:,}{elsewhere}: "
                          f"A {fig(loc.value_a, '.6g')} → B {fig(loc.value_b, '.6g')} · RMSE of these "
                          f"{c1 - c0:,} columns {fig(loc.region_rmse)}, the largest of the tensor")
        self.a.set_block(found, names[0])
        self.b.set_block(found, names[1])
        self.inspect_btn.setEnabled(True)


# --------------------------------------------------------------------------------------------------- dialog
@qt_guarded
class DiffDialog(QDialog):
    """Compares the open file (``file_a`` at ``doc_path``) with another GGUF in a worker. ``diffFinished`` carries
    the :class:`FileDiff` (None when cancelled or failed), ``locateFinished`` the :class:`Located` (None when the
    values are equal, or it failed or was cancelled), ``inspectRequested`` (tensor, row, block, element) A's
    block for the Block inspector."""

    diffFinished = Signal(object)
    locateFinished = Signal(object)
    inspectRequested = Signal(str, int, int, int)

    def __init__(self, doc_path: Path, file_a: GGUFFile, runner: TaskRunner, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle(printable(f"Compare {doc_path.name} with another GGUF"))
        self.setAccessibleName("Compare two files")
        self.setAcceptDrops(True)
        self.doc_path = doc_path
        self.file_a = file_a
        self.runner = runner
        self.file_b: GGUFFile | None = None
        self.other_path: Path | None = None
        self.result: FileDiff | None = None
        self.error: str | None = None
        self.state = "idle"  # idle | running | done | cancelled | failed
        self.job = JobSlot(runner, self)  # the comparison: its callbacks connected before it is queued
        self.locate_task: Task | None = None
        self.locate_state = "idle"  # idle | running | done | failed | cancelled
        self.locate_error: str | None = None
        self.located: Located | None = None
        self.seconds = 0.0
        self.meter = RateMeter()
        self._t0 = 0.0
        self._locate_seq = 0
        self._locating: str | None = None
        self._tasks: set[Task] = set()
        self._retired: list[GGUFFile] = []

        files = self._build_files(doc_path)
        self._build_strip()
        self._build_results()
        bottom = self._build_buttons()

        lay = QVBoxLayout(self)
        lay.addLayout(files)
        lay.addWidget(self.strip)
        summary_row = QHBoxLayout()
        summary_row.addWidget(self.summary, 1)
        summary_row.addWidget(self.filter, 0, Qt.AlignmentFlag.AlignBottom)
        lay.addLayout(summary_row)
        lay.addWidget(self.split, 1)
        lay.addLayout(bottom)
        self.resize(1280, 860)
        for btn in self.findChildren(QPushButton):  # no default button: Enter in the tables or the filter box
            btn.setAutoDefault(False)  # must not start a comparison (the B and pattern boxes start one)
            btn.setDefault(False)
        self._show_tables(None)

    # ------------------------------------------------------------------ construction
    def _build_files(self, doc_path: Path) -> QGridLayout:
        """A (the open file) and B (a path box and Browse…)."""
        self.a_label = ElidedLabel(printable(doc_path), Qt.TextElideMode.ElideMiddle)
        self.a_label.setAccessibleName("File A (the reference)")
        self.other = QLineEdit()
        self.other.setAccessibleName("File B")
        self.other.setPlaceholderText("the GGUF to compare with A: type a path, browse, or drop a file here")
        self.other.setAcceptDrops(False)  # a dropped file goes to the dialog (the path, not a file:// URL)
        self.other.returnPressed.connect(self.start)  # Enter here (or in the pattern box) compares
        self.browse_btn = QPushButton("Browse…")
        self.browse_btn.setAccessibleName("Browse for file B")
        self.browse_btn.clicked.connect(self.browse)
        files = QGridLayout()
        files.setHorizontalSpacing(8)
        files.setVerticalSpacing(4)
        a_title = QLabel("A (open file)")
        b_title = QLabel("B")
        b_title.setBuddy(self.other)
        files.addWidget(a_title, 0, 0)
        files.addWidget(self.a_label, 0, 1, 1, 2)
        files.addWidget(b_title, 1, 0)
        files.addWidget(self.other, 1, 1)
        files.addWidget(self.browse_btn, 1, 2)
        files.setColumnStretch(1, 1)
        return files

    def _build_strip(self) -> None:
        """The options (values, pattern, rows) and the comparison's :class:`JobStrip` with its rate."""
        self.values_check = QCheckBox("Compare values")
        self.values_check.setChecked(True)
        self.values_check.setAccessibleName("Compare the tensors' values")
        self.values_check.setToolTip("Read both files' tensors and compare their values (RMSE, max |Δ|, cosine, "
                                     "relative error); off: the headers only (metadata and tensor table)")
        self.pattern = QLineEdit()
        self.pattern.setAccessibleName("Only the tensors matching")
        self.pattern.setPlaceholderText("every tensor; or a regular expression, e.g. ffn_down")
        self.pattern.returnPressed.connect(self.start)
        self.pattern.setToolTip("Only the tensors whose name this regular expression finds (metadata is always "
                                "compared)")
        self.rows = QSpinBox()
        self.rows.setAccessibleName("Rows per tensor")
        self.rows.setRange(0, 1 << 30)
        self.rows.setSpecialValueText("all")
        self.rows.setMaximumWidth(self.rows.fontMetrics().horizontalAdvance("1,000,000") + 50)
        self.rows.setGroupSeparatorShown(True)
        self.rows.setToolTip("Compute the value figures on at most this many evenly spaced rows per tensor (all: "
                             "every row); the bit-identical check still reads every byte")
        self.setup = QWidget()
        opts = QHBoxLayout(self.setup)
        opts.setContentsMargins(0, 0, 0, 0)
        opts.addWidget(self.values_check)
        opts.addSpacing(8)
        match_label = QLabel("Only tensors matching")
        match_label.setBuddy(self.pattern)
        opts.addWidget(match_label)
        opts.addWidget(self.pattern, 1)
        opts.addSpacing(8)
        rows_label = QLabel("Rows per tensor")
        rows_label.setBuddy(self.rows)
        opts.addWidget(rows_label)
        opts.addWidget(self.rows)
        # [options …][Compare][Cancel] over [progress][status …][rate], all in place (greyed when not usable)
        self.strip = JobStrip("comparison", "Compare", status_text="Choose the other file, then Compare.",
                              scale=1000, status=ElidedLabel(), layout="two_rows", always_shown=True,
                              run_name="Start the comparison", controls=self.setup)
        self.strip.run_clicked.connect(self.start)
        self.strip.cancel_clicked.connect(self.cancel)
        self.start_btn = self.strip.run_btn
        self.cancel_btn = self.strip.cancel_btn
        self.progress = self.strip.progress
        self.status: ElidedLabel = self.strip.status  # type: ignore[assignment]
        self.rate = QLabel()
        self.rate.setObjectName("muted")
        self.rate.setAccessibleName("Comparison rate")
        self.strip.status_row.addWidget(self.rate)

    def _build_results(self) -> None:
        """The summary, the filter, the tensor and metadata tabs over the block pair."""
        self.summary = QLabel("No comparison yet.")
        self.summary.setObjectName("heading")
        self.summary.setAccessibleName("Summary of the differences")
        self.summary.setWordWrap(True)
        self.summary.setTextFormat(Qt.TextFormat.PlainText)  # names and patterns from the user and the files
        self.summary.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self._build_tensor_table()
        self._build_meta_table()
        for view in (self.tensors, self.meta):
            view.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
            view.customContextMenuRequested.connect(lambda pos, v=view: self._context_menu(v, pos))
        self.filter = QLineEdit()
        self.filter.setAccessibleName("Filter the tables")
        self.filter.setPlaceholderText("Filter names, types, statuses…")
        self.filter.setClearButtonEnabled(True)
        self.filter.setFixedWidth(max(220, self.filter.fontMetrics().horizontalAdvance("Filter names, types, "
                                                                                     "statuses…") + 40))
        self.filter.textChanged.connect(self._filter)
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.tabs.setAccessibleName("Differences")
        self.tabs.addTab(self.tensors, "Tensors")
        self.tabs.addTab(self.meta, "Metadata")
        self.pair = BlockPairView()
        self.pair.inspectRequested.connect(self._inspect)
        self.split = QSplitter(Qt.Orientation.Vertical)
        self.split.setChildrenCollapsible(False)
        self.split.addWidget(self.tabs)
        self.split.addWidget(self.pair)
        self.split.setStretchFactor(0, 1)
        self.split.setStretchFactor(1, 1)

    def _build_tensor_table(self) -> None:
        """The tensors compared, worst first."""
        self.tensor_model = TensorDiffModel()
        self.tensor_proxy = SortFilterProxy(self)
        self.tensor_proxy.setSourceModel(self.tensor_model)
        self.tensors = QTableView()
        self.tensors.setModel(self.tensor_proxy)
        self.tensors.setAccessibleName("Tensors compared")
        self.tensors.setSortingEnabled(True)
        self.tensors.sortByColumn(7, Qt.SortOrder.DescendingOrder)
        self.tensors.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.tensors.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.tensors.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.tensors.verticalHeader().setVisible(False)
        self.tensors.verticalHeader().setDefaultSectionSize(self.fontMetrics().height() + 6)
        self.tensors.setWordWrap(False)
        fit_columns(self.tensors, stretch=0, optional=(3, 8, 6), min_stretch=160, max_stretch=420)
        self.tensors.clicked.connect(self._tensor_activated)
        self.tensors.activated.connect(self._tensor_activated)

    def _build_meta_table(self) -> None:
        """The metadata keys that differ, in the files' order."""
        self.meta_model = MetadataDiffModel()
        self.meta_proxy = SortFilterProxy(self)
        self.meta_proxy.setSourceModel(self.meta_model)
        self.meta = QTableView()
        self.meta.setModel(self.meta_proxy)
        self.meta.setAccessibleName("Metadata keys that differ")
        self.meta.setSortingEnabled(True)
        self.meta.sortByColumn(-1, Qt.SortOrder.AscendingOrder)  # the files' order until a header is clicked
        self.meta.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.meta.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.meta.verticalHeader().setVisible(False)
        self.meta.setWordWrap(False)
        self.meta.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.meta.setTextElideMode(Qt.TextElideMode.ElideRight)
        mh = self.meta.horizontalHeader()
        mh.setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        mh.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)

    def _build_buttons(self) -> QHBoxLayout:
        """Export as JSON… and Close."""
        self.export_btn = QPushButton("Export as JSON…")
        self.export_btn.setAccessibleName("Export the comparison as JSON")
        self.export_btn.setEnabled(False)
        self.export_btn.clicked.connect(self.export_dialog)
        self.close_btn = QPushButton("Close")
        self.close_btn.setAccessibleName("Close the comparison")
        self.close_btn.clicked.connect(self.close)
        bottom = QHBoxLayout()
        bottom.addWidget(self.export_btn)
        bottom.addStretch(1)
        bottom.addWidget(self.close_btn)
        return bottom

    # ------------------------------------------------------------------ the other file
    def set_other(self, path: str | Path) -> None:
        self.other.setText(str(path))

    def browse(self) -> None:
        start = self.other.text().strip() or str(self.doc_path.parent)
        path, _ = QFileDialog.getOpenFileName(self, "Compare with", start, "GGUF (*.gguf);;All files (*)")
        if path:
            self.set_other(path)

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        md = event.mimeData()
        if md.hasUrls() and any(u.isLocalFile() for u in md.urls()):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        """A file dropped on the dialog becomes B; the comparison starts (unless one is running)."""
        for u in event.mimeData().urls():
            if u.isLocalFile():
                self.set_other(u.toLocalFile())
                event.acceptProposedAction()
                if self.state != "running":
                    self.start()
                return

    # ------------------------------------------------------------------ run
    def _refuse(self, message: str) -> None:
        self.status.setText(message)
        self.status.setStyleSheet(f"color:{BAD_COLOR}; font-weight:600")

    def _say(self, message: str) -> None:
        self.status.setStyleSheet("")
        self.status.setText(message)

    def start(self) -> None:
        """Compare A with the file named in the B box, in a worker (the options as they are now)."""
        if self.state == "running":
            return
        text = self.other.text().strip()
        if not text:
            self._refuse("Choose the other file first.")
            return
        pattern = self.pattern.text().strip()
        pat: re.Pattern[str] | None = None
        if pattern:
            try:
                pat = re.compile(pattern)
            except re.error as exc:
                self._refuse(f"{printable(pattern)!r} is not a regular expression: {exc}")
                return
        other = Path(text).expanduser()
        values = self.values_check.isChecked()
        max_rows = self.rows.value() or None
        fa = self.file_a
        self._cancel_locate()
        self._retire_b()
        self.state = "running"
        self.error = None
        self.result = None
        self.other_path = other
        self.meter = RateMeter()
        self._t0 = time.monotonic()
        self._set_running(True)
        self.strip.started()
        self.rate.setText("")
        self._say(printable(f"Opening {other.name}…"))
        self._show_tables(None)
        self.summary.setText(printable(f"Comparing {self.doc_path.name} with {other.name}…"))
        self.summary.setStyleSheet("")
        self.pair.show_message(BlockPairView.HINT)

        def work(report, token):  # type: ignore[no-untyped-def]
            fb = open_other(other)
            try:
                d = diff_files(fa, fb, values=values, tensor=pat, max_rows=max_rows, threads=0,
                               progress=lambda done, total: report(done, total), cancel=token)
            except BaseException:
                fb.close()
                raise
            return d, fb

        self._track(self.job.start(DIFF_TASK, work, on_done=self._done, on_progress=self._progress,
                                   on_failed=self._failed, on_cancelled=self._cancelled))

    @property
    def task(self) -> Task | None:
        """The comparison running (None when none is)."""
        return self.job.task

    def _run(self, name: str, fn: Any, done: Any, progress: Any, failed: Any, cancelled: Any) -> Task:
        return self._track(self.runner.start(name, fn, on_done=done, on_progress=progress, on_failed=failed,
                                             on_cancelled=cancelled))

    def _track(self, task: Task) -> Task:
        """Keep B open until ``task`` (which may read it) has ended."""
        self._tasks.add(task)
        task.signals.ended.connect(lambda t=task: self._ended(t))
        if task.done:  # refused at once (the runner is closed): no end signal is pending any more
            self._ended(task)
        return task

    def _ended(self, task: Task) -> None:
        self._tasks.discard(task)
        if not self._tasks:
            self._close_retired()

    def _retire_b(self) -> None:
        """Let go of B: closed now, or when the last task that may read it has ended."""
        if self.file_b is not None:
            self._retired.append(self.file_b)
            self.file_b = None
        if not self._tasks:
            self._close_retired()

    def _close_retired(self) -> None:
        files, self._retired = self._retired, []
        for f in files:
            f.close()

    def _set_running(self, on: bool) -> None:
        self.setup.setEnabled(not on)
        self.other.setEnabled(not on)
        self.browse_btn.setEnabled(not on)
        self.strip.set_busy(on)
        self.export_btn.setEnabled(not on and self.result is not None)

    def _progress(self, done: int, total: int, _text: str) -> None:
        if self.state != "running":
            return
        self.progress.setValue(int(1000 * done / total) if total > 0 else 0)
        if total > 0 and done > 0:
            rate, eta = self.meter.update(done, total)
            self.rate.setText(f"{human_bytes(rate)}/s · {format_duration(eta)} left" if rate > 0 else "")
        self._say(f"Reading tensor data: {human_bytes(done)} of {human_bytes(total)} (both files)")

    def _finish(self, state: str) -> None:
        self.state = state
        self.seconds = time.monotonic() - self._t0
        self._set_running(False)

    def _done(self, out: tuple[FileDiff, GGUFFile]) -> None:
        d, fb = out
        self.file_b = fb
        self.result = d
        self._finish("done")
        self.strip.finished()
        self.rate.setText(f"{self.seconds:.1f} s")
        self._say(printable(f"Compared {self.doc_path.name} (A) with {fb.path.name if fb.path else 'B'} (B)."))
        self.summary.setText(summary_text(d))
        self.summary.setStyleSheet("")
        self._show_tables(d)
        self.export_btn.setEnabled(True)
        self.tensors.setFocus()  # arrows pick a tensor, Enter shows where it differs most
        self.diffFinished.emit(d)

    def _failed(self, msg: str, _tb: str) -> None:
        self.error = msg
        self._finish("failed")
        self.progress.setValue(0)
        self.rate.setText("")
        self._refuse(f"The comparison failed: {printable(msg)}")
        self.summary.setText(f"The comparison failed: {printable(msg)}")
        self.summary.setStyleSheet(f"color:{BAD_COLOR}")
        self.diffFinished.emit(None)

    def _cancelled(self) -> None:
        self._finish("cancelled")
        self.progress.setValue(0)
        self.rate.setText("")
        self._say("Cancelled.")
        self.summary.setText("The comparison was cancelled.")
        self.summary.setStyleSheet("")
        self.diffFinished.emit(None)

    def cancel(self) -> None:
        """Stop the comparison and the search for a difference (both end at their next chunk)."""
        if self.task is not None:
            self.status.setStyleSheet("")
            self.strip.cancelling()
            self.task.cancel()
        self._cancel_locate()

    def _cancel_locate(self) -> None:
        if self.locate_task is not None:
            self.locate_task.cancel()
        self._locate_seq += 1  # whatever it still reports is ignored
        self.locate_task = None
        self._locating = None
        if self.locate_state == "running":
            self.locate_state = "cancelled"

    # ------------------------------------------------------------------ tables
    def _show_tables(self, d: FileDiff | None) -> None:
        self.tensor_model.set_diff(d)
        self.meta_model.set_diff(d)
        n_t = len(d.tensors) if d is not None else 0
        n_m = len(d.metadata) if d is not None else 0
        self.tabs.setTabText(0, f"Tensors ({n_t:,})" if d is not None else "Tensors")
        self.tabs.setTabText(1, f"Metadata changes ({n_m:,})" if d is not None else "Metadata changes")
        if d is not None:
            self.tensors.sortByColumn(7, Qt.SortOrder.DescendingOrder)
            if (not d.tensors and d.metadata) or (n_m and not any(t.status != "same" for t in d.tensors)):
                self.tabs.setCurrentIndex(1)
            else:
                self.tabs.setCurrentIndex(0)

    def _filter(self, text: str) -> None:
        self.tensor_proxy.setFilterFixedString(text)
        self.meta_proxy.setFilterFixedString(text)

    def tensor_names(self) -> list[str]:
        """The tensors table's names as shown (filtered, sorted)."""
        p = self.tensor_proxy
        return [p.index(r, 0).data(KEY_ROLE) for r in range(p.rowCount())]

    def tensor_row(self, name: str) -> int:
        """The row of ``name`` in the shown tensors table (-1: not shown)."""
        names = self.tensor_names()
        return names.index(name) if name in names else -1

    def select_tensor(self, name: str) -> bool:
        """Make ``name`` the current row of the tensors table (clearing a filter that hides it) and locate it."""
        if self.tensor_row(name) < 0 and self.filter.text():
            self.filter.clear()
        r = self.tensor_row(name)
        if r < 0:
            return False
        self.tabs.setCurrentIndex(0)
        index = self.tensor_proxy.index(r, 0)
        self.tensors.setCurrentIndex(index)
        self.tensors.scrollTo(index)
        return self.locate(name)

    def _tensor_activated(self, index: QModelIndex) -> None:
        name = index.siblingAtColumn(0).data(KEY_ROLE) if index.isValid() else None
        if isinstance(name, str):
            self.locate(name)

    def row_menu(self, view: QTableView, index: QModelIndex) -> QMenu:
        """The context menu of a row of ``view`` (tensors or metadata): copy its name or cells, export."""
        menu = QMenu(view)
        src = self.tensor_model if view is self.tensors else self.meta_model
        proxy = self.tensor_proxy if view is self.tensors else self.meta_proxy
        if index.isValid():
            r = proxy.mapToSource(index).row()
            key = index.siblingAtColumn(0).data(KEY_ROLE)
            what = "name" if view is self.tensors else "key"
            menu.addAction(f"Copy {what}", lambda: QApplication.clipboard().setText(str(key)))
            menu.addAction("Copy values", lambda: QApplication.clipboard().setText(src.row_text(r)))
            if view is self.tensors and isinstance(key, str):
                menu.addAction("Show where the values differ most", lambda: self.locate(key)).setEnabled(
                    self.why_not(key) is None)
            menu.addSeparator()
        export = menu.addAction("Export as JSON…", self.export_dialog)
        export.setEnabled(self.result is not None)
        return menu

    def _context_menu(self, view: QTableView, pos: QPoint) -> None:
        menu = self.row_menu(view, view.indexAt(pos))
        menu.popup(view.viewport().mapToGlobal(pos))

    # ------------------------------------------------------------------ where a tensor differs most
    def why_not(self, name: str) -> str | None:
        """Why ``name``'s difference cannot be located (None: it can)."""
        d = self.result
        t = next((t for t in d.tensors if t.name == name), None) if d is not None else None
        if t is None:
            return "not in the comparison"
        if t.status == "added":
            return "only in B: nothing to compare it with"
        if t.status == "removed":
            return "only in A: nothing to compare it with"
        if t.reshaped:
            return f"the shapes differ ({shape_text(t.shape_a)} → {shape_text(t.shape_b)}): no element matches"
        if t.values is None:
            return printable(t.note) if t.note else "its values were not compared (Compare values is off)"
        if t.values.exact:
            return "bit-identical in both files: nothing differs"
        return None

    def locate(self, name: str) -> bool:
        """Find where tensor ``name`` differs most, in a worker, and show both blocks there; False (and the reason
        in the block panel) when it cannot be located."""
        if self.result is None or self.file_b is None or self.state == "running":
            return False
        if name == self._locating or (self.located is not None and self.located.loc.tensor == name
                                      and self.locate_state == "done"):
            return True  # already shown, or on its way
        why = self.why_not(name)
        if why is not None:
            self._cancel_locate()
            self.located = None
            self.locate_state = "idle"
            self.pair.show_message(f"{why}.", printable(name))
            return False
        self._cancel_locate()
        self._locate_seq += 1
        seq = self._locate_seq
        fa, fb = self.file_a, self.file_b
        self._locating = name
        self.located = None
        self.locate_state = "running"
        self.locate_error = None
        self.pair.show_message("Finding where the values differ most…", printable(name))

        def work(report, token):  # type: ignore[no-untyped-def]
            return locate_blocks(fa, fb, name, progress=lambda done, total: report(done, total), cancel=token)

        self.locate_task = self._run(
            LOCATE_TASK, work, lambda r, s=seq: self._located(s, r),
            lambda done, total, _m, s=seq: self._locate_progress(s, name, done, total),
            lambda msg, _tb, s=seq: self._locate_failed(s, name, msg),
            lambda s=seq: self._locate_cancelled(s))
        return True

    def _locate_progress(self, seq: int, name: str, done: int, total: int) -> None:
        if seq == self._locate_seq:
            self.pair.show_progress(name, done / total if total > 0 else 0.0)

    def _located(self, seq: int, found: Located | None) -> None:
        if seq != self._locate_seq:
            return
        name = self._locating or ""
        self.locate_task = None
        self._locating = None
        self.locate_state = "done"
        self.located = found
        if found is None:
            self.pair.show_message("The values are equal everywhere (the types differ, the numbers do not).",
                                   printable(name))
        else:
            b = self.file_b.path.name if self.file_b is not None and self.file_b.path else "B"
            td = next((t for t in self.result.tensors if t.name == found.loc.tensor), None) \
                if self.result is not None else None
            self.pair.set_found(found, (self.doc_path.name, b), td.values if td is not None else None)
        self.locateFinished.emit(found)

    def _locate_failed(self, seq: int, name: str, msg: str) -> None:
        if seq != self._locate_seq:
            return
        self.locate_task = None
        self._locating = None
        self.locate_state = "failed"
        self.locate_error = msg
        self.pair.show_message(f"Could not locate the difference: {printable(msg)}", printable(name))
        self.locateFinished.emit(None)

    def _locate_cancelled(self, seq: int) -> None:
        if seq != self._locate_seq:
            return
        self.locate_task = None
        self._locating = None
        self.locate_state = "cancelled"
        self.pair.show_message("Cancelled.")
        self.locateFinished.emit(None)

    def _inspect(self) -> None:
        f = self.located
        if f is not None:
            self.inspectRequested.emit(f.loc.tensor, f.loc.row, f.a.block, f.a.element)

    # ------------------------------------------------------------------ export
    def export(self, path: str | Path) -> Path:
        """Write the comparison as JSON (``FileDiff.to_json``) to ``path``, atomically, never over A or B.
        Raises OSError / PathRefused."""
        d = self.result
        if d is None:
            raise OSError("nothing compared yet")
        inputs = [p for p in (self.doc_path, self.other_path) if p is not None]
        return write_atomic(Path(path).expanduser(), d.to_json() + "\n", "Export", inputs)

    def export_dialog(self) -> Path | None:
        if self.result is None:
            return None
        b = self.other_path.stem if self.other_path is not None else "B"
        start = str(output_path(self.doc_path, f"{self.doc_path.stem}-vs-{b}.diff.json"))
        path, _ = QFileDialog.getSaveFileName(self, "Export the comparison as JSON", start, "JSON (*.json)")
        if not path:
            return None
        p = Path(path)
        if not p.suffix:
            p = p.with_name(p.name + ".json")
        try:
            out = self.export(p)
        except (OSError, PathRefused) as exc:
            self._refuse(f"Could not export: {printable(exc)}")
            return None
        self._say(printable(f"Exported to {out}"))
        return out

    # ------------------------------------------------------------------ closing
    def release(self) -> None:
        """Cancel the work and let go of B (A belongs to the window)."""
        self.cancel()
        self._retire_b()

    def closeEvent(self, event: Any) -> None:
        self.cancel()  # B stays open: the results can still be explored when the dialog is shown again
        super().closeEvent(event)

    def reject(self) -> None:  # Esc
        if self.state == "running":
            self.cancel()
            return
        super().reject()
