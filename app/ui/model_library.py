"""The model library: the GGUFs in the models folder with name, quant, size, vision yes/no and when each was
last used; Open hands a model to the loading sheet, Delete removes it (and its mmproj when no other model
beside it needs it). It reads only the local folder, so it works without a network."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, QUrl, Signal
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (QAbstractItemView, QDialog, QFileDialog, QHBoxLayout, QHeaderView, QLabel, QMessageBox, QPushButton,
                               QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from engine.errors import RigllmError
from engine.hub.library import Entry, Library
from engine.model.memory_plan import format_bytes

COLUMNS = ("Model", "Quant", "Size", "Vision", "Last used")


class ModelLibrary(QDialog):
    open_model = Signal(object)  # Path: the main window opens the loading sheet on it
    browse = Signal()  # "Find models...": the main window opens the browser
    folder_chosen = Signal(object)  # Path: the main window saves it as the models_dir setting

    def __init__(self, library: Library, parent: QWidget | None = None, confirm: bool = True):
        super().__init__(parent)
        self.setWindowTitle("Model library")
        self.library = library
        self.confirm = confirm
        self.entries: list[Entry] = []
        layout = QVBoxLayout(self)
        self.folder = QLabel()
        self.folder.setStyleSheet("color: gray")
        layout.addWidget(self.folder)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.Stretch)
        self.table.itemSelectionChanged.connect(self._selection_changed)
        self.table.itemDoubleClicked.connect(lambda _item: self.open_selected())
        layout.addWidget(self.table, 1)
        buttons = QHBoxLayout()
        find = QPushButton("Find models on the Hub...")
        find.clicked.connect(self.browse.emit)
        folder = QPushButton("Show folder")
        folder.clicked.connect(lambda: QDesktopServices.openUrl(QUrl.fromLocalFile(str(self.library.root))))
        self.delete_button = QPushButton("Delete")
        self.delete_button.clicked.connect(self.delete_selected)
        self.open_button = QPushButton("Open...")
        self.open_button.setDefault(True)
        self.open_button.clicked.connect(self.open_selected)
        move = QPushButton("Change folder...")
        move.clicked.connect(self._choose_folder)
        for b in (find, folder, move):
            buttons.addWidget(b)
        buttons.addStretch(1)
        for b in (self.delete_button, self.open_button):
            buttons.addWidget(b)
        layout.addLayout(buttons)
        self.resize(900, 420)
        self.refresh()

    def refresh(self) -> None:
        try:
            self.entries = self.library.entries()
        except RigllmError as err:
            self.entries = []
            self.folder.setText(str(err))
        else:
            self.folder.setText(f"{self.library.root} · {len(self.entries)} model(s)" if self.entries else
                                f"{self.library.root} is empty: find a model on the Hub")
        self.table.setRowCount(len(self.entries))
        for row, e in enumerate(self.entries):
            used = e.last_used.replace("T", " ")[:16] if e.last_used else "never"
            for col, text in enumerate((e.name, e.quant or "?", format_bytes(e.size), "yes" if e.vision else "no", used)):
                cell = QTableWidgetItem(text)
                if col == 0:
                    cell.setToolTip(str(e.path))
                self.table.setItem(row, col, cell)
        self._selection_changed()

    def _choose_folder(self) -> None:
        chosen = QFileDialog.getExistingDirectory(self, "Models folder", str(self.library.root))
        if chosen:
            self.set_folder(Path(chosen))

    def set_folder(self, folder: Path) -> None:
        self.library = Library(folder)
        self.folder_chosen.emit(folder)
        self.refresh()

    def select(self, path: Path) -> None:
        for row, e in enumerate(self.entries):
            if e.path == Path(path):
                self.table.selectRow(row)

    def selected(self) -> Entry | None:
        rows = self.table.selectionModel().selectedRows()
        return self.entries[rows[0].row()] if rows else None

    def _selection_changed(self) -> None:
        chosen = self.selected() is not None
        self.open_button.setEnabled(chosen)
        self.delete_button.setEnabled(chosen)

    def open_selected(self) -> None:
        entry = self.selected()
        if entry is not None:
            self.library.mark_used(entry.path)
            self.open_model.emit(entry.path)
            self.refresh()

    def delete_selected(self) -> None:
        entry = self.selected()
        if entry is None:
            return
        if self.confirm and QMessageBox.question(
                self, "Delete model", f"Delete {entry.path.name} ({format_bytes(entry.size)}) from the disk?"
        ) != QMessageBox.Yes:
            return
        self.library.remove(entry)
        self.refresh()
