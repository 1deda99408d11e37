"""The conversation list: search, new, rename, and delete with Undo (deleting only hides until exit)."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QHBoxLayout, QInputDialog, QLineEdit, QListWidget, QListWidgetItem, QPushButton,
                               QVBoxLayout, QWidget)

from app.chat_store import ChatStore


class ConversationList(QWidget):
    selected = Signal(object)  # conversation id or None
    deleted = Signal(int, str)  # id, title (the window offers Undo)

    def __init__(self, store: ChatStore, parent: QWidget | None = None):
        super().__init__(parent)
        self.store = store
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.search = QLineEdit(placeholderText="Search chats")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(lambda _t: self.refresh())
        layout.addWidget(self.search)
        self.list = QListWidget()
        self.list.setTextElideMode(Qt.ElideRight)  # a long title ends in "...", the list never scrolls sideways
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.list.currentItemChanged.connect(self._current_changed)
        layout.addWidget(self.list, 1)
        row = QHBoxLayout()
        self.new_button = QPushButton("New")
        self.new_button.clicked.connect(self.new_chat)
        self.rename_button = QPushButton("Rename")
        self.rename_button.clicked.connect(self.rename_current)
        self.delete_button = QPushButton("Delete")
        self.delete_button.clicked.connect(self.delete_current)
        for b in (self.new_button, self.rename_button, self.delete_button):
            row.addWidget(b)
        layout.addLayout(row)
        self.refresh()

    def current_id(self) -> int | None:
        item = self.list.currentItem()
        return None if item is None else item.data(Qt.UserRole)

    def refresh(self, select: int | None = None) -> None:
        keep = select if select is not None else self.current_id()
        self.list.blockSignals(True)
        self.list.clear()
        for conv in self.store.conversations(self.search.text()):
            item = QListWidgetItem(" ".join(conv.title.split()))  # one row, also for titles stored with newlines
            item.setData(Qt.UserRole, conv.id)
            self.list.addItem(item)
            if conv.id == keep:
                self.list.setCurrentItem(item)
        self.list.blockSignals(False)

    def new_chat(self) -> None:
        """A new chat starts empty; it is stored when its first message is sent."""
        self.list.setCurrentItem(None)
        self.selected.emit(None)

    def rename_current(self) -> None:
        cid = self.current_id()
        if cid is None:
            return
        title, ok = QInputDialog.getText(self, "Rename chat", "Title:", text=self.list.currentItem().text())
        if ok and title.strip():
            self.store.rename(cid, " ".join(title.split()))
            self.refresh()

    def delete_current(self) -> None:
        cid = self.current_id()
        if cid is None:
            return
        title = self.list.currentItem().text()
        self.store.delete(cid)
        self.refresh()
        self.selected.emit(self.current_id())
        self.deleted.emit(cid, title)

    def _current_changed(self, current: QListWidgetItem | None, _previous) -> None:
        self.selected.emit(None if current is None else current.data(Qt.UserRole))
