"""The model browser: search the Hugging Face Hub for Qwen3.5/3.6 GGUFs, see each file's size, quant and fit
verdict on the user's cards (at a chosen context and KV format), and download one with its paired mmproj:
bytes, MB/s and ETA, Cancel, and a resume the next time after an interruption.

Repositories the Hub reports as MoE or another architecture are listed greyed with the reason. Without a
network the page says plainly that the Hub is unreachable; the library (model_library.py) still works.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (QAbstractItemView, QComboBox, QDialog, QHBoxLayout, QHeaderView, QLabel, QLineEdit,
                               QListWidget, QListWidgetItem, QProgressBar, QPushButton, QSplitter, QTableWidget,
                               QTableWidgetItem, QVBoxLayout, QWidget)

from engine.hub.catalog import RepoHit
from engine.hub.download import Progress
from engine.hub.fit import RepoModel, cards_label
from engine.hub.library import Library
from engine.hub.names import context_label, params_label
from engine.hub.pull import Pulled
from engine.model.memory_plan import CardProfile, cards_16gb, format_bytes

from app.model_hub import HubTasks

CONTEXTS = (8192, 32768, 131072, 262144)
KV_CHOICES = ("f16", "k8v8", "k8v3", "k3v3")
DEFAULT_QUERY = "Qwen3.5 GGUF"
COLUMNS = ("File", "Quant", "Size", "Fit on your cards")
GREY = QColor("gray")


class ModelBrowser(QDialog):
    downloaded = Signal(object)  # Path of the pulled model

    def __init__(self, library: Library, cards: list[CardProfile], tasks: HubTasks | None = None,
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Find models on the Hugging Face Hub")
        self.library = library
        self.tasks = tasks or HubTasks()
        self.repo: RepoModel | None = None
        self.card_sets: list[tuple[str, list[CardProfile]]] = []
        if cards:
            self.card_sets.append((f"this machine: {cards_label(cards)}", cards))
        self.card_sets += [(f"{n} × 16 GB", cards_16gb(n)) for n in (1, 2, 3, 4)]
        layout = QVBoxLayout(self)

        row = QHBoxLayout()
        self.query = QLineEdit(DEFAULT_QUERY, placeholderText="search the Hub, e.g. Qwen3.5 27B")
        self.query.returnPressed.connect(self.search)
        self.search_button = QPushButton("Search")
        self.search_button.clicked.connect(self.search)
        row.addWidget(self.query, 1)
        row.addWidget(self.search_button)
        layout.addLayout(row)
        self.status = QLabel()
        self.status.setWordWrap(True)
        layout.addWidget(self.status)

        split = QSplitter()
        self.results = QListWidget()
        self.results.setWordWrap(True)
        self.results.setSpacing(2)
        self.results.setMinimumWidth(340)
        self.results.currentItemChanged.connect(lambda item, _old: self._open(item))
        split.addWidget(self.results)
        right = QWidget()
        side = QVBoxLayout(right)
        side.setContentsMargins(0, 0, 0, 0)
        self.repo_label = QLabel("choose a repository")
        self.repo_label.setWordWrap(True)
        side.addWidget(self.repo_label)
        knobs = QHBoxLayout()
        self.cards_box, self.context_box, self.kv_box = QComboBox(), QComboBox(), QComboBox()
        for label, _ in self.card_sets:
            self.cards_box.addItem(label)
        for tokens in CONTEXTS:
            self.context_box.addItem(f"{tokens // 1024}K context", tokens)
        self.context_box.setCurrentIndex(CONTEXTS.index(32768))
        self.kv_box.addItems(KV_CHOICES)
        self.kv_box.setCurrentText("k8v3")
        for box, text in ((self.cards_box, "Cards:"), (self.context_box, ""), (self.kv_box, "KV:")):
            if text:
                knobs.addWidget(QLabel(text))
            knobs.addWidget(box)
            box.currentIndexChanged.connect(lambda _i: self.show_verdicts())
        knobs.addStretch(1)
        side.addLayout(knobs)
        self.files = QTableWidget(0, len(COLUMNS))
        self.files.setHorizontalHeaderLabels(COLUMNS)
        self.files.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.files.setSelectionMode(QAbstractItemView.SingleSelection)
        self.files.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.files.verticalHeader().setVisible(False)
        header = self.files.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.Stretch)
        header.setSectionResizeMode(3, QHeaderView.Stretch)
        self.files.itemSelectionChanged.connect(self._selection_changed)
        side.addWidget(self.files, 1)
        dl = QHBoxLayout()
        self.download_button = QPushButton("Download")
        self.download_button.setEnabled(False)
        self.download_button.clicked.connect(self.download)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress_label = QLabel()
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self.tasks.cancel)
        dl.addWidget(self.download_button)
        dl.addWidget(self.progress, 1)
        dl.addWidget(self.progress_label)
        dl.addWidget(self.cancel_button)
        side.addLayout(dl)
        split.addWidget(right)
        split.setStretchFactor(1, 1)
        layout.addWidget(split, 1)
        self.folder_label = QLabel(f"Downloads go to {library.root}")
        self.folder_label.setStyleSheet("color: gray")
        layout.addWidget(self.folder_label)

        self.tasks.searched.connect(self.show_hits)
        self.tasks.read.connect(self.show_repo)
        self.tasks.progress.connect(self.show_progress)
        self.tasks.pulled.connect(self._pulled)
        self.tasks.cancelled.connect(lambda msg: self._pull_over(msg))
        self.tasks.failed.connect(self._failed)
        self.tasks.unreachable.connect(self._unreachable)
        self.resize(1100, 620)

    # search and repositories

    def search(self) -> None:
        self.status.setStyleSheet("")
        self.status.setText("searching the Hub...")
        self.results.clear()
        self.tasks.search(self.query.text().strip() or DEFAULT_QUERY)

    def show_hits(self, hits: list[RepoHit]) -> None:
        self.results.clear()
        for h in hits:
            item = QListWidgetItem(f"{h.repo}\n{h.note}\n{params_label(h.parameters)} · {h.downloads:,} downloads"
                                   + (" · gated" if h.gated else ""))
            item.setData(Qt.UserRole, h.repo)
            item.setToolTip(h.note)
            if h.runnable is False:
                item.setForeground(GREY)
            self.results.addItem(item)
        runnable = sum(h.runnable is True for h in hits)
        self.status.setText(f"{len(hits)} GGUF repositories, {runnable} of them Qwen3.5/3.6 dense" if hits
                            else "no GGUF repositories match")

    def _open(self, item: QListWidgetItem | None) -> None:
        if item is None:
            return
        self.repo = None
        self.files.setRowCount(0)
        self.download_button.setEnabled(False)
        self.repo_label.setText(f"<b>{item.data(Qt.UserRole)}</b> · reading its files and a GGUF header...")
        self.tasks.open_repo(item.data(Qt.UserRole))

    def show_repo(self, repo: RepoModel) -> None:
        current = self.results.currentItem()
        if current is not None and current.data(Qt.UserRole) != repo.listing.repo:
            return  # an answer for a repository the user has left
        self.repo = repo
        listing = repo.listing
        vision = f"vision: {listing.mmproj} (downloaded with the model)" if listing.mmproj else "no vision projector"
        shape = ""
        if repo.model is not None:
            cfg = repo.model.config
            shape = f" · {cfg.n_layers} layers · trained context {context_label(cfg.context_length)}"
        self.repo_label.setText(f"<b>{listing.repo}</b> · {listing.note}{shape} · {vision}")
        self.files.setRowCount(len(listing.files))
        for row, f in enumerate(listing.files):
            cells = (f.name.name, f.name.quant or "?", format_bytes(f.size), "")
            for col, text in enumerate(cells):
                cell = QTableWidgetItem(text)
                cell.setData(Qt.UserRole, f.name.name)
                self.files.setItem(row, col, cell)
        self.show_verdicts()

    def show_verdicts(self) -> None:
        if self.repo is None:
            return
        cards = self.card_sets[self.cards_box.currentIndex()][1]
        verdicts = self.repo.verdicts(cards, self.context_box.currentData(), self.kv_box.currentText())
        for row in range(self.files.rowCount()):
            name = self.files.item(row, 0).data(Qt.UserRole)
            v = verdicts.get(name)
            text = ("vision projector · paired" if name == self.repo.listing.mmproj else "vision projector") if v is None else v.text
            cell = self.files.item(row, 3)
            cell.setText(text)
            fits = v is not None and v.cards is not None
            colour = QColor("#2e7d32") if fits else GREY if v is None or not v.runnable else QColor("#c62828")
            for col in range(len(COLUMNS)):
                self.files.item(row, col).setForeground(colour if col == 3 or not fits else self.palette().text().color())
        self.files.resizeRowsToContents()
        self._selection_changed()

    def select_file(self, name: str) -> None:
        for row in range(self.files.rowCount()):
            if self.files.item(row, 0).data(Qt.UserRole) == name:
                self.files.selectRow(row)

    def _selected(self) -> str | None:
        rows = self.files.selectionModel().selectedRows() if self.files.selectionModel() else []
        return self.files.item(rows[0].row(), 0).data(Qt.UserRole) if rows else None

    def _selection_changed(self) -> None:
        name = self._selected()
        model = self.repo is not None and name is not None and self.repo.listing.file(name).name.kind == "model"
        self.download_button.setEnabled(bool(model) and not self.tasks.pulling)

    # downloads

    def download(self) -> None:
        name = self._selected()
        if self.repo is None or name is None:
            return
        self.download_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.progress.setValue(0)
        self.progress_label.setText(f"starting {name}...")
        self.tasks.pull(self.library, self.repo.listing.repo, name, self.repo.listing)

    def show_progress(self, p: Progress) -> None:
        self.progress.setValue(int(1000 * p.done_bytes / max(p.total_bytes, 1)))
        done = " · sha256 verified" if p.stage == "verified" else ""
        self.progress_label.setText(f"{p.file}: {p.line()}{done}")

    def _pulled(self, done: Pulled) -> None:
        extra = f" and {done.mmproj.name}" if done.mmproj else ""
        self._pull_over(f"downloaded {done.model.name}{extra} to the library (checked against the Hub's sha256)")
        self.downloaded.emit(Path(done.model))

    def _pull_over(self, message: str) -> None:
        self.cancel_button.setEnabled(False)
        self.progress_label.setText(message)
        self._selection_changed()

    def _failed(self, what: str, message: str) -> None:
        if what == "pull":
            self._pull_over(message)
        elif what == "repo":
            self.repo_label.setText(message)
        else:
            self.status.setText(message)

    def _unreachable(self, message: str) -> None:
        self.status.setStyleSheet("color: #c62828")
        self.status.setText(message)
        if self.cancel_button.isEnabled():
            self._pull_over("the Hub became unreachable: the part is kept, Download again resumes it")
