"""Qt item models over core objects. Every model answers ``data()`` lazily from the core structures: no widget
per row, no copy of a 262k-entry vocabulary."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
from PySide6.QtCore import QAbstractItemModel, QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt
from PySide6.QtCore import QSortFilterProxyModel as _Proxy
from PySide6.QtGui import QColor, QFont

from quantscope.core.bump import BumpFile
from quantscope.core.gguf import GGUFFile, MetadataValue, StringArray, TensorInfo, ValueType
from quantscope.core.model.memory import block_group, group_sort_key
from quantscope.core.summary import EXPERT_TENSOR, format_value, human_bytes
from quantscope.core.tokenizer import BYTE, CONTROL, NORMAL, UNKNOWN, UNUSED, USER_DEFINED

from .guard import qt_guarded

#: Role holding the value a column sorts by (numbers for numeric columns).
SORT_ROLE = Qt.ItemDataRole.UserRole + 1
#: Role holding the underlying object's key (metadata key, tensor name, array index).
KEY_ROLE = Qt.ItemDataRole.UserRole + 2

_Index = QModelIndex | QPersistentModelIndex
_ROOT = QModelIndex()  # the invalid index Qt passes as the root's parent
_ALIGN_RIGHT = int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
_MONO = QFont("monospace")
_MONO.setStyleHint(QFont.StyleHint.Monospace)

#: Names of ``tokenizer.ggml.token_type`` values (llama.cpp's token attributes).
TOKEN_TYPE_NAMES = {NORMAL: "NORMAL", UNKNOWN: "UNKNOWN", CONTROL: "CONTROL", USER_DEFINED: "USER_DEFINED",
                    UNUSED: "UNUSED", BYTE: "BYTE"}

_CONTROL = {"\n": "↵", "\r": "␍", "\t": "⇥", "\0": "␀"}


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 tensor``, ``2 tensors``, ``12,345 tokens`` (``many`` for irregular plurals)."""
    return f"{n:,} {word if n == 1 else many or word + 's'}"


def visible_text(s: str, limit: int = 400) -> str:
    """A string with control characters made visible (tokens are often just whitespace)."""
    if len(s) > limit:
        s = s[:limit] + "…"
    return "".join(_CONTROL.get(c, f"\\x{ord(c):02x}" if ord(c) < 32 else c) for c in s)


@qt_guarded
class SortFilterProxy(_Proxy):
    """Case-insensitive filtering over all columns, numeric sorting via :data:`SORT_ROLE`."""

    def __init__(self, parent: Any = None, recursive: bool = False) -> None:
        super().__init__(parent)
        self.setSortRole(SORT_ROLE)
        self.setFilterCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)
        self.setFilterKeyColumn(-1)
        self.setRecursiveFilteringEnabled(recursive)
        self.setAutoAcceptChildRows(recursive)


def natural_key(name: str) -> str:
    """A string that sorts ``blk.2`` before ``blk.10``: every run of digits zero-padded to 12."""
    return _DIGITS.sub(lambda m: m.group().zfill(12), name)


_DIGITS = re.compile(r"\d+")


@qt_guarded
class TensorFilterProxy(SortFilterProxy):
    """Tensors kept by a substring of their name or type, case-insensitive. Only those two texts are matched (the
    numbers are not: "b" must not match every "MiB"), and a layer row of the tree is kept when one of its tensors
    is. Cheap: one ``in`` test per tensor, no ``data()`` call."""

    def __init__(self, parent: Any = None, recursive: bool = False) -> None:
        super().__init__(parent, recursive)
        self.setAutoAcceptChildRows(False)
        self.needle = ""

    def set_needle(self, text: str) -> bool:
        """Filter by ``text``; False when it is what is already applied (nothing changed)."""
        text = text.strip().lower()
        if text == self.needle:
            return False
        self.beginFilterChange()
        self.needle = text
        self.endFilterChange(_Proxy.Direction.Rows)
        return True

    def filterAcceptsRow(self, row: int, parent: _Index) -> bool:
        if not self.needle:
            return True
        src = self.sourceModel()
        t = src.tensor_at(row, parent) if src is not None else None  # type: ignore[attr-defined]
        return t is not None and (self.needle in t.name.lower() or self.needle in t.type_name.lower())


@qt_guarded
class KeyValueModel(QAbstractTableModel):
    """Rows of strings (default two columns, name and value): hyperparameters, bump header fields, checks.

    ``colors`` optionally tints one column per row (``{row: QColor}`` applied to ``color_column``)."""

    def __init__(self, rows: list[tuple[str, ...]] | None = None,
                 headers: tuple[str, ...] = ("Key", "Value"), mono_columns: tuple[int, ...] = (1,)) -> None:
        super().__init__()
        self.rows = rows or []
        self.headers = headers
        self.mono_columns = mono_columns
        self.colors: dict[int, QColor] = {}
        self.color_column = 1

    def set_rows(self, rows: list[tuple[str, ...]], colors: dict[int, QColor] | None = None) -> None:
        self.beginResetModel()
        self.rows = rows
        self.colors = colors or {}
        self.endResetModel()

    def rowCount(self, parent: _Index = _ROOT) -> int:
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent: _Index = _ROOT) -> int:
        return 0 if parent.isValid() else len(self.headers)

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        if role in (Qt.ItemDataRole.DisplayRole, SORT_ROLE, Qt.ItemDataRole.ToolTipRole):
            return self.rows[index.row()][index.column()]
        if role == Qt.ItemDataRole.FontRole and index.column() in self.mono_columns:
            return _MONO
        if role == Qt.ItemDataRole.ForegroundRole and index.column() == self.color_column:
            return self.colors.get(index.row())
        return None

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if role == Qt.ItemDataRole.DisplayRole and orientation == Qt.Orientation.Horizontal:
            return self.headers[section]
        return None


@qt_guarded
class MetadataModel(QAbstractTableModel):
    """Every metadata key: key, value type, one-line value, byte offset."""

    COLUMNS = ("Key", "Type", "Value", "Offset")

    def __init__(self) -> None:
        super().__init__()
        self.items: list[MetadataValue] = []
        self._preview: dict[int, str] = {}

    def set_file(self, f: GGUFFile | None) -> None:
        self.set_items(list(f.metadata.values()) if f is not None else [])

    def set_items(self, items: list[Any]) -> None:
        """The rows: the file's entries, or the edited list (an edited or added entry has ``offset`` None and a
        ``status``; it is shown in italics with "edited"/"new" for its offset)."""
        self.beginResetModel()
        self.items = items
        self._preview = {}
        self.endResetModel()

    def item(self, row: int) -> MetadataValue:
        return self.items[row]

    def preview(self, row: int) -> str:
        s = self._preview.get(row)
        if s is None:
            s = visible_text(format_value(self.items[row], max_items=6, max_str=120), 300)
            self._preview[row] = s
        return s

    def rowCount(self, parent: _Index = _ROOT) -> int:
        return 0 if parent.isValid() else len(self.items)

    def columnCount(self, parent: _Index = _ROOT) -> int:
        return 0 if parent.isValid() else len(self.COLUMNS)

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        kv = self.items[index.row()]
        col = index.column()
        edited = kv.offset is None
        if role == Qt.ItemDataRole.DisplayRole:
            where = ("new" if kv.status == "added" else "edited") if edited else f"{kv.offset:,}"
            return (kv.key, kv.type_label, self.preview(index.row()), where)[col]
        if role == SORT_ROLE:  # the offset column sorts in the order the keys will be written
            return (kv.key, kv.type_label, self.preview(index.row()), index.row())[col]
        if role == Qt.ItemDataRole.FontRole and edited:
            f = QFont(_MONO if col in (1, 3) else QFont())
            f.setItalic(True)
            f.setBold(col == 0)
            return f
        if role == KEY_ROLE:
            return kv.key
        if role == Qt.ItemDataRole.ToolTipRole and col in (0, 2):
            return kv.key if col == 0 else self.preview(index.row())
        if role == Qt.ItemDataRole.TextAlignmentRole and col == 3:
            return _ALIGN_RIGHT
        if role == Qt.ItemDataRole.FontRole and col in (1, 3):
            return _MONO
        return None

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if role == Qt.ItemDataRole.DisplayRole and orientation == Qt.Orientation.Horizontal:
            return self.COLUMNS[section]
        return None


@qt_guarded
class ArrayModel(QAbstractTableModel):
    """A metadata array, element by element, read on demand. For ``tokenizer.ggml.tokens`` the token type and
    score arrays of the same length are shown beside each token. ``set_indices`` restricts the rows to a search
    result (an index array), so filtering costs one array, not one object per row."""

    def __init__(self) -> None:
        super().__init__()
        self.values: Any = None
        self.elem_type: ValueType | None = None
        self.extra: list[tuple[str, Any]] = []
        self.indices: np.ndarray | None = None

    def set_array(self, kv: MetadataValue | None, f: GGUFFile | None = None) -> None:
        self.beginResetModel()
        self.values = kv.value if kv is not None else None
        self.elem_type = kv.elem_type if kv is not None else None
        self.extra = []
        self.indices = None
        if kv is not None and f is not None and kv.key == "tokenizer.ggml.tokens":
            n = len(kv.value)
            for key, label in (("tokenizer.ggml.token_type", "Type"), ("tokenizer.ggml.scores", "Score")):
                v = f.get(key)
                if isinstance(v, np.ndarray) and v.ndim == 1 and len(v) == n:  # a wrong-typed value is skipped
                    self.extra.append((label, v))
        self.endResetModel()

    def set_indices(self, indices: np.ndarray | None) -> None:
        self.beginResetModel()
        self.indices = indices
        self.endResetModel()

    def source_index(self, row: int) -> int:
        return int(self.indices[row]) if self.indices is not None else row

    def rowCount(self, parent: _Index = _ROOT) -> int:
        if parent.isValid() or self.values is None:
            return 0
        return len(self.indices) if self.indices is not None else len(self.values)

    def columnCount(self, parent: _Index = _ROOT) -> int:
        return 0 if parent.isValid() else 2 + len(self.extra)

    def element_text(self, i: int) -> str:
        v = self.values[i]
        if isinstance(v, str):
            return visible_text(v)
        if isinstance(v, (list, StringArray, np.ndarray)) and self.elem_type == ValueType.ARRAY:
            return f"[{len(v)} elements]"
        if isinstance(v, (float, np.floating)):
            return f"{float(v):.7g}"
        if isinstance(v, (bool, np.bool_)):
            return str(bool(v))
        return str(v.item() if isinstance(v, np.generic) else v)

    def extra_text(self, col: int, i: int) -> str:
        """A token's type (by name: ``NORMAL``, ``CONTROL``…) or score, for column ``col`` >= 2."""
        label, arr = self.extra[col - 2]
        v = arr[i]
        if isinstance(v, (float, np.floating)):
            return f"{float(v):.6g}"
        if label == "Type":
            return TOKEN_TYPE_NAMES.get(int(v), str(int(v)))
        return str(int(v))

    def widest_extra(self, col: int) -> list[str]:
        """Texts as wide as any of column ``col``'s (>= 2), without formatting every row."""
        label, arr = self.extra[col - 2]
        if label == "Type":
            return [*TOKEN_TYPE_NAMES.values(), str(int(arr.min())) if len(arr) else "", str(int(arr.max()))
                    if len(arr) else ""]
        if np.issubdtype(arr.dtype, np.floating):
            return ["-9.99999e-99"]
        return [str(int(arr.min())), str(int(arr.max()))] if len(arr) else []

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or self.values is None:
            return None
        i = self.source_index(index.row())
        col = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            if col == 0:
                return f"{i:,}"
            if col == 1:
                return self.element_text(i)
            return self.extra_text(col, i)
        if role == KEY_ROLE:
            return i
        if role == Qt.ItemDataRole.TextAlignmentRole and col != 1:
            return _ALIGN_RIGHT
        if role == Qt.ItemDataRole.FontRole and col == 1:
            return _MONO
        return None

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if role == Qt.ItemDataRole.DisplayRole and orientation == Qt.Orientation.Horizontal:
            if section == 0:
                return "Index"
            if section == 1:
                return "Value" if self.elem_type != ValueType.STRING else "String"
            return self.extra[section - 2][0]
        return None


def shape_text(t: TensorInfo) -> str:
    return " × ".join(str(d) for d in t.ne) or "scalar"


@qt_guarded
class TensorTableModel(QAbstractTableModel):
    """Flat tensor table: name, type, shape (ne order), elements, bytes, offset, bits per weight."""

    COLUMNS = ("Name", "Type", "Shape (ne)", "Elements", "Bytes", "Offset", "bpw")

    def __init__(self) -> None:
        super().__init__()
        self.tensors: list[TensorInfo] = []
        self._texts: dict[int, list[str]] = {}

    def set_file(self, f: GGUFFile | None) -> None:
        self.beginResetModel()
        self.tensors = list(f.tensors) if f is not None else []
        self._texts = {}
        self.endResetModel()

    def column_texts(self, col: int) -> list[str]:
        """Every text of column ``col`` (the column fitter measures these, not the cells one by one)."""
        if col not in self._texts:
            self._texts[col] = sorted({tensor_cell(t, col, Qt.ItemDataRole.DisplayRole) for t in self.tensors},
                                      key=len)[-64:]
        return self._texts[col]

    def rowCount(self, parent: _Index = _ROOT) -> int:
        return 0 if parent.isValid() else len(self.tensors)

    def columnCount(self, parent: _Index = _ROOT) -> int:
        return 0 if parent.isValid() else len(self.COLUMNS)

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        return tensor_cell(self.tensors[index.row()], index.column(), role)

    def tensor_at(self, row: int, parent: _Index = _ROOT) -> TensorInfo | None:
        return None if parent.isValid() or not 0 <= row < len(self.tensors) else self.tensors[row]

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if role == Qt.ItemDataRole.DisplayRole and orientation == Qt.Orientation.Horizontal:
            return self.COLUMNS[section]
        return None


def tensor_cell(t: TensorInfo, col: int, role: int) -> Any:
    """Display/sort data of one tensor column (shared by the table and the tree)."""
    if role == Qt.ItemDataRole.DisplayRole:
        bpw = t.bits_per_weight
        return (t.name, t.type_name, shape_text(t), f"{t.n_elements:,}",
                human_bytes(t.n_bytes) if t.n_bytes is not None else "?", f"{t.data_offset:,}",
                f"{bpw:.2f}" if bpw is not None else "?")[col]
    if role == SORT_ROLE:
        return (natural_key(t.name), t.type_name, t.n_elements, t.n_elements, t.n_bytes or 0, t.data_offset,
                t.bits_per_weight or 0.0)[col]
    if role == KEY_ROLE:
        return t.name
    if role == Qt.ItemDataRole.TextAlignmentRole and col >= 3:
        return _ALIGN_RIGHT
    if role == Qt.ItemDataRole.ToolTipRole:
        if t.problem:
            return f"{t.name}: {t.problem}"
        return f"{t.name}: {t.n_bytes:,} bytes at file offset {t.data_offset:,}" if t.n_bytes is not None else t.name
    if role == Qt.ItemDataRole.ForegroundRole and t.problem:
        return QColor("#d64545")
    return None


@qt_guarded
class TensorTreeModel(QAbstractItemModel):
    """Tensors grouped by layer: the non-layer tensors, then ``blk.0`` … ``blk.N``; same columns as the table.

    Internal ids: group rows carry 0, tensor rows carry ``group index + 1``."""

    COLUMNS = TensorTableModel.COLUMNS

    def __init__(self) -> None:
        super().__init__()
        self.groups: list[tuple[str, list[TensorInfo]]] = []
        self._texts: dict[int, list[str]] = {}

    def set_file(self, f: GGUFFile | None) -> None:
        self.beginResetModel()
        acc: dict[str, list[TensorInfo]] = {}
        for t in f.tensors if f is not None else []:
            acc.setdefault(block_group(t.name), []).append(t)
        self.groups = sorted(acc.items(), key=lambda kv: group_sort_key(kv[0]))
        self._texts = {}
        self.endResetModel()

    def column_texts(self, col: int) -> list[str]:
        """Every text of column ``col``, tensors and layer rows (see :meth:`TensorTableModel.column_texts`)."""
        if col not in self._texts:
            cells = {tensor_cell(t, col, Qt.ItemDataRole.DisplayRole) for _, ts in self.groups for t in ts}
            cells |= {self.data(self.index(g, col)) or "" for g in range(len(self.groups))}
            self._texts[col] = sorted(cells, key=len)[-64:]
        return self._texts[col]

    def group_label(self, g: int) -> str:
        name, ts = self.groups[g]
        experts = ""
        if any(EXPERT_TENSOR.match(t.name) for t in ts):  # the 3-D expert tensors: their last dimension counts them
            counts = sorted({int(t.ne[-1]) for t in ts if EXPERT_TENSOR.match(t.name) and len(t.ne) == 3})
            experts = f"  ·  {'/'.join(map(str, counts)) or '?'} experts"
        return f"{name or 'model (outside the blocks)'}  ·  {plural(len(ts), 'tensor')}{experts}"

    def index(self, row: int, column: int, parent: _Index = _ROOT) -> QModelIndex:
        if not self.hasIndex(row, column, parent):
            return QModelIndex()
        if not parent.isValid():
            return self.createIndex(row, column, 0)
        return self.createIndex(row, column, parent.row() + 1)

    def parent(self, index: _Index = _ROOT) -> QModelIndex:  # type: ignore[override]
        if not index.isValid():
            return QModelIndex()
        g = index.internalId()
        return QModelIndex() if g == 0 else self.createIndex(g - 1, 0, 0)

    def rowCount(self, parent: _Index = _ROOT) -> int:
        if not parent.isValid():
            return len(self.groups)
        if parent.internalId() == 0 and parent.column() == 0:
            return len(self.groups[parent.row()][1])
        return 0

    def columnCount(self, parent: _Index = _ROOT) -> int:
        return len(self.COLUMNS)

    def tensor(self, index: _Index) -> TensorInfo | None:
        if not index.isValid() or index.internalId() == 0:
            return None
        return self.groups[index.internalId() - 1][1][index.row()]

    def tensor_at(self, row: int, parent: _Index = _ROOT) -> TensorInfo | None:
        """The tensor at ``row`` under ``parent`` (None for a layer row)."""
        if not parent.isValid() or parent.internalId() != 0:
            return None
        ts = self.groups[parent.row()][1]
        return ts[row] if 0 <= row < len(ts) else None

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        t = self.tensor(index)
        if t is not None:
            return tensor_cell(t, index.column(), role)
        name, ts = self.groups[index.row()]
        col = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            if col == 0:
                return self.group_label(index.row())
            if col == 4:
                return human_bytes(sum(t.n_bytes or 0 for t in ts))
            if col == 3:
                return f"{sum(t.n_elements for t in ts):,}"
            return None
        if role == SORT_ROLE:
            return group_sort_key(name)[1] if col == 0 else 0
        if role == Qt.ItemDataRole.ToolTipRole and col == 0:  # the whole label where the column elides it
            return self.group_label(index.row())
        if role == Qt.ItemDataRole.FontRole and col == 0:
            font = QFont()
            font.setBold(True)
            return font
        if role == Qt.ItemDataRole.TextAlignmentRole and col >= 3:
            return _ALIGN_RIGHT
        return None

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if role == Qt.ItemDataRole.DisplayRole and orientation == Qt.Orientation.Horizontal:
            return self.COLUMNS[section]
        return None


@qt_guarded
class BumpSectionsModel(QAbstractTableModel):
    """Sections of a bump file: name, dtype, code, offset, size."""

    COLUMNS = ("Section", "Dtype", "Code", "Offset", "Size", "Bytes")

    def __init__(self) -> None:
        super().__init__()
        self.bump: BumpFile | None = None

    def set_bump(self, b: BumpFile | None) -> None:
        self.beginResetModel()
        self.bump = b
        self.endResetModel()

    def rowCount(self, parent: _Index = _ROOT) -> int:
        return 0 if parent.isValid() or self.bump is None else len(self.bump.sections)

    def columnCount(self, parent: _Index = _ROOT) -> int:
        return 0 if parent.isValid() else len(self.COLUMNS)

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or self.bump is None:
            return None
        s = self.bump.sections[index.row()]
        col = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return (s.name, s.type_name, str(s.code), f"{s.offset:,}", human_bytes(s.size), f"{s.size:,}")[col]
        if role == SORT_ROLE:
            return (index.row(), s.type_name, s.code, s.offset, s.size, s.size)[col]
        if role == Qt.ItemDataRole.TextAlignmentRole and col >= 2:
            return _ALIGN_RIGHT
        if role == Qt.ItemDataRole.FontRole and col >= 3:
            return _MONO
        return None

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if role == Qt.ItemDataRole.DisplayRole and orientation == Qt.Orientation.Horizontal:
            return self.COLUMNS[section]
        return None
