"""The chat pane's conversation list: saved conversations with the model each belongs to, new, rename, delete
(confirmed) and export. The panel only shows and asks; the view does the work (signals)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QPainter, QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QMessageBox,
    QPushButton,
    QSizePolicy,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from quantscope.core.chat.store import ConversationInfo

from ..guard import qt_guarded
from ..widgets.fit import ElidedLabel

MODEL_ROLE = Qt.ItemDataRole.UserRole + 1  # the list's "name · quant" line


@qt_guarded
class ConversationDelegate(QStyledItemDelegate):
    """A conversation in the list: its title, and under it in a smaller muted line the model it belongs to
    (``name · quant``, from ``model_role``); both elided to the width, the whole in the tooltip."""

    def __init__(self, model_role: int, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model_role = model_role

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex) -> QSize:
        fm = option.fontMetrics  # type: ignore[attr-defined]
        return QSize(super().sizeHint(option, index).width(), 2 * fm.height() + 8)

    def paint(self, painter: QPainter, option: QStyleOptionViewItem,
              index: QModelIndex | QPersistentModelIndex) -> None:
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        title, model = opt.text, str(index.data(self.model_role) or "")  # type: ignore[attr-defined]
        opt.text = ""  # type: ignore[attr-defined]
        style = opt.widget.style() if opt.widget is not None else QApplication.style()  # type: ignore[attr-defined]
        style.drawControl(QStyle.ControlElement.CE_ItemViewItem, opt, painter, opt.widget)  # type: ignore[attr-defined]
        r = opt.rect.adjusted(6, 3, -6, -3)  # type: ignore[attr-defined]
        fm = opt.fontMetrics  # type: ignore[attr-defined]
        selected = bool(opt.state & QStyle.StateFlag.State_Selected)  # type: ignore[attr-defined]
        pal = opt.palette  # type: ignore[attr-defined]
        painter.save()
        painter.setPen(pal.color(QPalette.ColorRole.HighlightedText if selected else QPalette.ColorRole.Text))
        painter.drawText(r.x(), r.y() + fm.ascent(), fm.elidedText(title, Qt.TextElideMode.ElideRight, r.width()))
        muted = pal.color(QPalette.ColorRole.HighlightedText if selected else QPalette.ColorRole.PlaceholderText)
        painter.setPen(muted)
        name, sep, quant = model.rpartition(" · ")
        if sep and fm.horizontalAdvance(model) > r.width():  # the name is elided, the quantization stays whole
            quant = sep + quant
            model = fm.elidedText(name, Qt.TextElideMode.ElideRight, max(0, r.width() - fm.horizontalAdvance(quant)))
            model += quant
        painter.drawText(r.x(), r.y() + fm.height() + fm.ascent() + 2,
                         fm.elidedText(model, Qt.TextElideMode.ElideRight, r.width()))
        painter.restore()


@qt_guarded
class ConversationPanel(QWidget):
    """The list of saved conversations (title, and under it the model: name · quantization)."""

    newRequested = Signal()
    openRequested = Signal(int)
    renameRequested = Signal(int, str)
    deleteRequested = Signal(int)
    exportRequested = Signal(str)  # "markdown" or "json"

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.filling = False
        self.confirm_box: QMessageBox | None = None
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 4, 0)
        title = QLabel("Conversations")
        title.setObjectName("heading")
        self.new_btn = QPushButton("New chat")
        self.new_btn.setAccessibleName("New conversation")
        self.new_btn.clicked.connect(self.newRequested.emit)
        head = QHBoxLayout()
        head.addWidget(title)
        head.addStretch(1)
        head.addWidget(self.new_btn)
        self.list = QListWidget()
        self.list.setAccessibleName("Saved conversations")
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setUniformItemSizes(True)
        self.list.setItemDelegate(ConversationDelegate(MODEL_ROLE, self.list))
        self.list.setEditTriggers(QAbstractItemView.EditTrigger.EditKeyPressed
                                  | QAbstractItemView.EditTrigger.DoubleClicked)
        self.list.itemActivated.connect(lambda it: self.openRequested.emit(int(it.data(Qt.ItemDataRole.UserRole))))
        self.list.itemClicked.connect(lambda it: self.openRequested.emit(int(it.data(Qt.ItemDataRole.UserRole))))
        self.list.itemChanged.connect(self._item_renamed)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu)
        self.rename_btn = QToolButton()
        self.rename_btn.setText("Rename")
        self.rename_btn.setAccessibleName("Rename the selected conversation")
        self.rename_btn.clicked.connect(self.rename_selected)
        self.delete_btn = QToolButton()
        self.delete_btn.setText("Delete")
        self.delete_btn.setAccessibleName("Delete the selected conversation")
        self.delete_btn.clicked.connect(self.delete_selected)
        self.export_btn = QToolButton()
        self.export_btn.setText("Export")
        self.export_btn.setAccessibleName("Export the conversation")
        self.export_btn.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        menu = QMenu(self.export_btn)
        menu.addAction("As Markdown…", lambda: self.exportRequested.emit("markdown"))
        menu.addAction("As JSON…", lambda: self.exportRequested.emit("json"))
        self.export_btn.setMenu(menu)
        row = QHBoxLayout()
        row.setSpacing(4)
        for b in (self.rename_btn, self.delete_btn, self.export_btn):
            b.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
            row.addWidget(b)
        self.store_label = ElidedLabel(mode=Qt.TextElideMode.ElideMiddle)  # a path: elided in the middle
        self.store_label.setObjectName("muted")
        self.store_label.setAccessibleName("Where conversations are saved")
        lay.addLayout(head)
        lay.addWidget(self.list, 1)
        lay.addLayout(row)
        lay.addWidget(self.store_label)

    def fill(self, rows: Sequence[ConversationInfo], current: int | None) -> None:
        """Show ``rows`` (``current`` selected) without emitting renames."""
        self.filling = True
        try:
            self.list.clear()
            for c in rows:
                it = QListWidgetItem(c.title)
                it.setData(Qt.ItemDataRole.UserRole, c.id)
                it.setData(MODEL_ROLE, c.identity.label)
                it.setFlags(it.flags() | Qt.ItemFlag.ItemIsEditable)
                when = time.strftime("%Y-%m-%d %H:%M", time.localtime(c.updated))
                it.setToolTip(f"{c.title}\n{c.identity.label}\n{c.n_messages} messages · {when}")
                self.list.addItem(it)
                if c.id == current:
                    self.list.setCurrentItem(it)
        finally:
            self.filling = False

    def clear_selection(self) -> None:
        self.list.clearSelection()
        self.list.setCurrentRow(-1)

    def update_buttons(self, busy: bool, can_export: bool) -> None:
        for b in (self.rename_btn, self.delete_btn):
            b.setEnabled(not busy and self.list.currentItem() is not None)
        self.export_btn.setEnabled(can_export)
        self.list.setEnabled(not busy)
        self.new_btn.setEnabled(not busy)

    def selected_id(self) -> int | None:
        it = self.list.currentItem()
        return int(it.data(Qt.ItemDataRole.UserRole)) if it is not None else None

    def _item_renamed(self, item: QListWidgetItem) -> None:
        if self.filling:
            return
        cid = int(item.data(Qt.ItemDataRole.UserRole))
        QTimer.singleShot(0, lambda: self.renameRequested.emit(cid, item.text()))

    def rename_selected(self) -> None:
        it = self.list.currentItem()
        if it is not None:
            self.list.editItem(it)

    def delete_selected(self) -> None:
        cid = self.selected_id()
        if cid is None:
            return
        box = QMessageBox(QMessageBox.Icon.Question, "Delete conversation",
                          f"Delete “{self.list.currentItem().text()}” and its messages?",
                          QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel, self)
        box.setAccessibleName("Confirm deletion")
        box.accepted.connect(lambda: self.deleteRequested.emit(cid))
        box.open()
        self.confirm_box = box

    def _menu(self, pos: Any) -> None:
        it = self.list.itemAt(pos)
        if it is None:
            return
        self.list.setCurrentItem(it)
        menu = QMenu(self)
        menu.addAction(QAction("Rename", menu, triggered=self.rename_selected))
        menu.addAction(QAction("Delete…", menu, triggered=self.delete_selected))
        menu.exec(self.list.viewport().mapToGlobal(pos))
