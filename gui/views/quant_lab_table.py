"""The Quant lab's tables: a type's round-trip figures (:class:`~quantscope.core.quant.lab.ErrorStats`) per row, for
one tensor, for every tensor of a file, or per type over the file; formatted for reading, sorted by number."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt
from PySide6.QtGui import QColor, QFont

from quantscope.core.quant.lab import CANDIDATE_TYPES, ErrorStats

from ..guard import qt_guarded
from ..models import KEY_ROLE, SORT_ROLE

_Index = QModelIndex | QPersistentModelIndex
_ROOT = QModelIndex()
_ALIGN_RIGHT = int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)

#: column key: header, tool tip
COLUMNS = {
    "tensor": ("Tensor", "the weight measured"),
    "source": ("From", "the type its values were read from (this file's, or the reference's)"),
    "type": ("Type", "the type its values were requantized into"),
    "bpw": ("bpw", "bits per weight of the type"),
    "rmse": ("RMSE", "root mean square of the round trip's error"),
    "max_abs": ("max |err|", "the largest error of any value"),
    "snr_db": ("SNR dB", "signal to noise: 10·log10(Σx² / Σ(x−y)²); ∞ when exact"),
    "cosine": ("cosine", "cosine similarity of the original and requantized values"),
    "weighted_rmse": ("w-RMSE", "RMSE with each column weighted by its importance (the imatrix)"),
    "n_tensors": ("Tensors", "tensors the type fits"),
    "n_elements": ("Elements", "their values"),
}

#: the first columns of each kind of table
_LEAD = {"tensor": ("type",), "file": ("tensor", "source", "type"), "summary": ("type",)}

#: the figures a plot can show: key, label, whether a logarithmic axis suits it
METRICS = (("rmse", "RMSE", True), ("max_abs", "max |error|", True), ("snr_db", "SNR (dB)", False),
           ("cosine", "cosine similarity", False), ("weighted_rmse", "importance-weighted RMSE", True))


def metric_text(key: str, v: float | None) -> str:
    """A figure as the tables show it: errors to 4 digits (``0 (exact)``), SNR in dB (``∞``), cosine to 6 places."""
    if v is None:
        return "–"
    if key == "bpw":
        return f"{v:.4g}"
    if key == "snr_db":
        return "∞" if v == math.inf else f"{v:.2f}"
    if key == "cosine":
        return f"{v:.6f}"
    if key in ("n_tensors", "n_elements"):
        return f"{int(v):,}"
    if math.isnan(v):
        return "nan"
    return "0 (exact)" if v == 0 else f"{v:.4g}"


def type_rank(qtype: str) -> int:
    """Sort position of a type: :data:`CANDIDATE_TYPES`' order (cheapest bits per weight first)."""
    return CANDIDATE_TYPES.index(qtype) if qtype in CANDIDATE_TYPES else len(CANDIDATE_TYPES)


@dataclass(frozen=True)
class ErrorRow:
    """One row: the figures of ``stats.type`` (on ``tensor``, or over the file with the counts)."""

    stats: ErrorStats
    tensor: str = ""
    source: str = ""  # the type the values were read from
    n_tensors: int = 0
    n_elements: int = 0

    def value(self, key: str) -> Any:
        if key == "tensor":
            return self.tensor
        if key == "source":
            return self.source
        if key == "type":
            return self.stats.type
        if key == "bpw":
            return self.stats.bits_per_weight
        if key in ("n_tensors", "n_elements"):
            return getattr(self, key)
        return getattr(self.stats, key)


@qt_guarded
class ErrorTableModel(QAbstractTableModel):
    """Rows of :class:`ErrorRow`. ``kind``: ``tensor`` (one tensor, one row per type), ``file`` (a row per tensor and
    type) or ``summary`` (a row per type over the file). The weighted-RMSE column is there only with an imatrix;
    ``current`` (the tensor's own type) is shown bold."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.rows: list[ErrorRow] = []
        self.weighted = False
        self.current: str | None = None
        self.keys: list[str] = self._keys()
        self._bold = QFont()
        self._bold.setBold(True)
        self.current_color = QColor("#e15759")

    def _keys(self) -> list[str]:
        keys = [*_LEAD[self.kind], "bpw", "rmse", "max_abs", "snr_db", "cosine"]
        if self.weighted:
            keys.append("weighted_rmse")
        if self.kind == "summary":
            keys += ["n_tensors", "n_elements"]
        return keys

    def set_rows(self, rows: list[ErrorRow], weighted: bool = False, current: str | None = None) -> None:
        self.beginResetModel()
        self.rows = list(rows)
        self.weighted = weighted
        self.current = current
        self.keys = self._keys()
        self.endResetModel()

    def column_texts(self, col: int) -> list[str]:
        """The longest texts of column ``col`` (the column fitter measures these, not each cell; bold rows get a
        character more)."""
        key = self.keys[col]
        texts = {str(r.value(key) or "") if key in ("tensor", "source", "type") else metric_text(key, r.value(key))
                 for r in self.rows}
        return [t + "W" for t in sorted(texts, key=len)[-16:]]

    def column(self, key: str) -> int:
        """The column of ``key`` (-1 when not shown)."""
        return self.keys.index(key) if key in self.keys else -1

    def rowCount(self, parent: _Index = _ROOT) -> int:
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent: _Index = _ROOT) -> int:
        return 0 if parent.isValid() else len(self.keys)

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        row = self.rows[index.row()]
        key = self.keys[index.column()]
        v = row.value(key)
        if role == Qt.ItemDataRole.DisplayRole:
            if key in ("tensor", "source", "type"):
                return v
            return metric_text(key, v)
        if role == SORT_ROLE:
            if key == "tensor":
                return index.row()  # file order
            if key in ("type", "source"):
                return type_rank(v)
            if v is None or (isinstance(v, float) and math.isnan(v)):
                return -math.inf
            return v
        if role == KEY_ROLE:
            return (row.tensor, row.stats.type) if self.kind == "file" else row.stats.type
        if role == Qt.ItemDataRole.TextAlignmentRole and key not in ("tensor", "source", "type"):
            return _ALIGN_RIGHT
        is_current = self.kind == "tensor" and row.stats.type == self.current
        if role == Qt.ItemDataRole.FontRole and is_current:
            return self._bold
        if role == Qt.ItemDataRole.ForegroundRole and is_current and key == "type":
            return self.current_color
        if role == Qt.ItemDataRole.ToolTipRole:
            if key == "tensor":
                return v
            if is_current:
                return f"{row.stats.type}: the tensor's type in this file"
            return None
        return None

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if orientation != Qt.Orientation.Horizontal or not 0 <= section < len(self.keys):
            return None
        head, tip = COLUMNS[self.keys[section]]
        if role == Qt.ItemDataRole.DisplayRole:
            return head
        if role == Qt.ItemDataRole.ToolTipRole:
            return tip
        return None
