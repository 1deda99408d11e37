"""The main window: conversations on the left; Chat, Rig monitor and API server tabs; a status line
with the model, its cards, the context used and the KV format.

"Connect to rig" swaps the local engine for a remote one: the remote loader, engine and telemetry
source have the local ones' signals and calls, so the chat pane, the loading sheet and the rig
monitor are the same widgets for both. Disconnecting goes back to this computer.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QSettings, QTimer, Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (QApplication, QFileDialog, QLabel, QMainWindow, QMessageBox, QPushButton,
                               QSplitter, QTabWidget)

from engine.generation.serving.generation_job import Finished
from engine.telemetry import RigSnapshot, TelemetrySource

from app import chat_export, settings as settings_io
from app.chat_engine import ChatEngine
from app.chat_store import ChatStore
from app.model_loader import LoadRequest, ModelLoader
from app.monitor_service import POLL_MS, MonitorService
from app.remote_engine import RemoteChatEngine
from app.remote_loader import RemoteModelLoader
from app.remote_telemetry import RemoteTelemetry
from app.rig_client import RigLink
from app.settings import AppSettings
from app.theme import apply_theme
from app.ui.api_panel import ApiPanel
from app.ui.chat_pane import ChatPane
from app.ui.connect_dialog import ConnectDialog
from app.ui.conversation_list import ConversationList
from app.ui import library_pages
from app.ui.load_sheet import LoadSheet
from app.ui.rig_monitor import RigMonitor
from app.ui.settings_dialog import SettingsDialog

UNDO_SECONDS = 15


class MainWindow(QMainWindow):
    def __init__(self, store: ChatStore, qsettings: QSettings, source: TelemetrySource, poll_ms: int = POLL_MS):
        super().__init__()
        self.setWindowTitle("rigllm")
        self.store = store
        self.qsettings = qsettings
        self.settings: AppSettings = settings_io.load(qsettings)
        apply_theme(QApplication.instance(), self.settings.theme)
        self.engine: ChatEngine | RemoteChatEngine | None = None
        self.snapshot: RigSnapshot | None = None
        self.local_loader = ModelLoader()
        self.loader: ModelLoader | RemoteModelLoader = self.local_loader
        self.loader.loaded.connect(self._loaded)
        self.loader.failed.connect(self._load_failed)
        self.rig_link: RigLink | None = None  # set while connected to a rig
        self.remote_monitor: MonitorService | None = None
        self._poll_ms = poll_ms

        self.conversations = ConversationList(store)
        self.chat = ChatPane(store, lambda: self.settings)
        self.rig = RigMonitor()
        self.api = ApiPanel(self.settings.api_port)
        self.tabs = QTabWidget()
        self.tabs.addTab(self.chat, "Chat")
        self.tabs.addTab(self.rig, "Rig monitor")
        self.tabs.addTab(self.api, "API server")
        splitter = QSplitter()
        splitter.addWidget(self.conversations)
        splitter.addWidget(self.tabs)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([240, 900])
        self.setCentralWidget(splitter)

        self.conversations.selected.connect(self.chat.show_conversation)
        self.conversations.deleted.connect(self._offer_undo)
        self.chat.conversations_changed.connect(lambda: self.conversations.refresh(self.chat.conversation_id))
        self.chat.notice.connect(self.notify)
        self.chat.answer_speed.connect(self.rig.set_speed)
        self.rig.alert.connect(self.notify)
        self.api.notice.connect(self.notify)

        self.status_line = QLabel("no model loaded")
        self.statusBar().addPermanentWidget(self.status_line)
        self.undo_button = QPushButton()
        self.undo_button.setVisible(False)
        self.undo_button.clicked.connect(self._undo_delete)
        self.statusBar().addWidget(self.undo_button)
        self._undo: tuple[int, str] | None = None
        self._undo_timer = QTimer(self, singleShot=True, interval=UNDO_SECONDS * 1000)
        self._undo_timer.timeout.connect(lambda: self.undo_button.setVisible(False))
        self._context_used = 0
        self._start_pending = False
        self._build_menus()

        self.monitor = MonitorService(source, poll_ms)
        self.monitor.snapshot.connect(self._snapshot)
        self.resize(1200, 780)

    def _build_menus(self) -> None:
        def action(menu, text: str, slot, shortcut: str | None = None) -> QAction:
            act = QAction(text, self)
            if shortcut:
                act.setShortcut(QKeySequence(shortcut))
            act.triggered.connect(slot)
            menu.addAction(act)
            return act

        chat = self.menuBar().addMenu("&Chat")
        action(chat, "New chat", self.conversations.new_chat, "Ctrl+N")
        action(chat, "Import chat...", self.import_chat)
        action(chat, "Export chat as JSON...", lambda: self.export_chat("json"))
        action(chat, "Export chat as Markdown...", lambda: self.export_chat("md"))
        chat.addSeparator()
        action(chat, "Quit", self.close, "Ctrl+Q")
        model = self.menuBar().addMenu("&Model")
        action(model, "Load model...", self.open_load_sheet, "Ctrl+L")
        action(model, "Unload model", self.unload_model)
        action(model, "Find models on the Hub...", lambda: library_pages.open_model_browser(self))
        action(model, "Model library...", lambda: library_pages.open_model_library(self), "Ctrl+Shift+L")
        rig = self.menuBar().addMenu("&Rig")
        action(rig, "Connect to rig...", self.open_connect_dialog)
        action(rig, "Disconnect from rig", self.disconnect_rig)
        action(self.menuBar().addMenu("&Settings"), "Settings...", self.open_settings, "Ctrl+,")

    # model

    def start(self, path: Path | None) -> None:
        """At launch: load `path`; with no path, the demo model on the CPU when the first rig reading
        finds no GPU, else the loading sheet (decided when that reading arrives, off the GUI thread)."""
        if path is not None:
            self.start_default_model(path)
        else:
            self._start_pending = True

    def start_default_model(self, path: Path | None) -> None:
        """Load `path` (or the demo model on the CPU when there is no GPU and no path) without the sheet."""
        self.notify("loading the demo model (CPU reference backend)..." if path is None else f"loading {path}...")
        self.loader.load(LoadRequest(path, "auto", None, "f16", ()))

    def open_load_sheet(self) -> LoadSheet:
        cards = list(self.snapshot.cards) if self.snapshot else []
        sheet = LoadSheet(cards, self.loader, self.snapshot.error if self.snapshot else None, self, self.rig_link)
        sheet.setAttribute(Qt.WA_DeleteOnClose)
        sheet.show()
        return sheet

    def unload_model(self) -> None:
        """Close the model; on a rig, also unload it there (freeing the rig's cards)."""
        if isinstance(self.loader, RemoteModelLoader) and self.engine is not None:
            self.loader.unload()
        self.set_engine(None)

    def set_engine(self, engine: ChatEngine | RemoteChatEngine | None) -> None:
        if engine is self.engine:
            return
        old, self.engine = self.engine, engine
        self.api.set_engine(engine if isinstance(engine, ChatEngine) else None)  # a rig serves its own API
        self.chat.set_engine(engine)
        if old is not None:
            old.close()
        if engine is not None:
            engine.finished.connect(self._answer_finished)
        self.rig.set_model(engine.info.cards if engine else ())
        self._context_used = 0
        self.update_status()
        if engine is not None:
            self.notify(f"{engine.info.name} ready on the {engine.info.backend} backend")

    # rig

    def open_connect_dialog(self) -> ConnectDialog:
        dialog = ConnectDialog(self.settings.rig_host, self.settings.rig_port, self)
        dialog.setAttribute(Qt.WA_DeleteOnClose)
        dialog.accepted.connect(lambda: self.connect_rig(dialog.link()))
        dialog.show()
        return dialog

    def connect_rig(self, link: RigLink) -> None:
        """Chat, load and monitor on `link`'s rig instead of this computer (the local model is closed)."""
        self.disconnect_rig()
        self._start_pending = False  # the demo-model start is for this computer only
        self.set_engine(None)
        self.apply_settings(replace(self.settings, rig_host=link.host, rig_port=link.port))
        self.rig_link = link
        remote = RemoteModelLoader(link)
        remote.notice.connect(self.notify)
        remote.unreachable.connect(self._rig_unreachable)
        self._use_loader(remote)
        self.monitor.snapshot.disconnect(self._snapshot)
        self.snapshot = None
        self.rig.show_machine(f"rig {link.name}")
        self.remote_monitor = MonitorService(RemoteTelemetry(link), self._poll_ms)
        self.remote_monitor.snapshot.connect(self._snapshot)
        self.update_status()
        remote.attach()

    def disconnect_rig(self) -> None:
        """Back to this computer; the rig keeps its model loaded and goes on serving its API."""
        if self.rig_link is None:
            return
        name = self.rig_link.name
        self.set_engine(None)
        remote = self.loader
        self._use_loader(self.local_loader)
        remote.shutdown()
        assert self.remote_monitor is not None
        self.remote_monitor.snapshot.disconnect(self._snapshot)
        self.remote_monitor.shutdown()
        self.remote_monitor = None
        self.rig_link = None
        self.snapshot = None
        self.rig.show_machine("this computer")
        self.monitor.snapshot.connect(self._snapshot)
        self.update_status()
        self.notify(f"disconnected from rig {name}")

    def _use_loader(self, loader: ModelLoader | RemoteModelLoader) -> None:
        self.loader.loaded.disconnect(self._loaded)
        self.loader.failed.disconnect(self._load_failed)
        self.loader = loader
        loader.loaded.connect(self._loaded)
        loader.failed.connect(self._load_failed)

    def _rig_unreachable(self, message: str) -> None:
        self.disconnect_rig()
        self.notify(f"could not connect: {message}")

    def _loaded(self, engine: ChatEngine | RemoteChatEngine) -> None:
        if self.sender() is not self.loader:  # queued before a connect or disconnect: the other machine's
            engine.close()
            return
        self.set_engine(engine)

    def _load_failed(self, message: str) -> None:
        self.notify(f"loading failed: {message}")

    def _answer_finished(self, _job_id: int, result: Finished) -> None:
        self._context_used = result.prompt_tokens + result.completion_tokens
        self.update_status()

    def update_status(self) -> None:
        e = self.engine
        if e is None:
            where = f" on rig {self.rig_link.name}" if self.rig_link else ""
            self.status_line.setText(f"no model loaded{where}")
            return
        i = e.info
        cards = f"cards {', '.join(map(str, i.cards))}" if i.cards else "CPU"
        text = (f"{i.name} · {i.backend} · {cards} · ctx {self._context_used}/{i.context} · KV {i.kv_format}")
        if i.label:
            text = f"<span style='color:#c77c00'>{text} · {i.label}</span>"
        self.status_line.setText(text)

    def _snapshot(self, snap: RigSnapshot) -> None:
        if self.sender() is not (self.remote_monitor or self.monitor):
            return  # queued before a connect or disconnect: it describes the other machine
        self.snapshot = snap
        self.rig.show_snapshot(snap)
        if self._start_pending:
            self._start_pending = False
            if snap.cards:
                self.open_load_sheet()
            else:
                self.start_default_model(None)

    # chats

    def _offer_undo(self, conversation_id: int, title: str) -> None:
        self._undo = (conversation_id, title)
        self.undo_button.setText(f"Deleted '{title}': Undo")
        self.undo_button.setVisible(True)
        self._undo_timer.start()

    def _undo_delete(self) -> None:
        if self._undo is not None:
            self.store.restore(self._undo[0])
            self.conversations.refresh(select=self._undo[0])
            self.chat.show_conversation(self._undo[0])
            self._undo = None
        self.undo_button.setVisible(False)

    def export_chat(self, kind: str) -> None:
        cid = self.chat.conversation_id
        if cid is None:
            self.notify("open a chat to export it")
            return
        title = self.store.conversation(cid).title
        path, _ = QFileDialog.getSaveFileName(self, "Export chat", f"{title}.{kind}",
                                              "JSON (*.json)" if kind == "json" else "Markdown (*.md)")
        if path:
            writer = chat_export.to_json if kind == "json" else chat_export.to_markdown
            Path(path).write_text(writer(title, self.store.messages(cid)), encoding="utf-8")
            self.notify(f"exported to {path}")

    def import_chat(self, path: str | None = None) -> int | None:
        if not path:
            path, _ = QFileDialog.getOpenFileName(self, "Import chat", "", "Chats (*.json *.md)")
        if not path:
            return None
        text = Path(path).read_text(encoding="utf-8")
        try:
            title, messages = (chat_export.from_json if path.endswith(".json") else chat_export.from_markdown)(text)
        except chat_export.ChatImportError as err:
            QMessageBox.warning(self, "Import chat", f"{Path(path).name}: {err}")
            return None
        cid = self.store.create_conversation(title)
        for m in messages:
            self.store.add_message(cid, m)
        self.conversations.refresh(select=cid)
        self.chat.show_conversation(cid)
        return cid

    # settings

    def open_settings(self) -> SettingsDialog:
        dialog = SettingsDialog(self.settings, self)
        dialog.setAttribute(Qt.WA_DeleteOnClose)
        dialog.accepted.connect(lambda: self.apply_settings(dialog.result_settings(self.settings)))
        dialog.show()
        return dialog

    def apply_settings(self, new: AppSettings) -> None:
        self.settings = new
        settings_io.save(self.qsettings, new)
        apply_theme(QApplication.instance(), new.theme)

    def notify(self, message: str) -> None:
        self.statusBar().showMessage(message, 10000)

    def closeEvent(self, event) -> None:
        if self.chat.stream is not None:
            self.chat.stop()
        self.disconnect_rig()
        self.api.shutdown()
        self.monitor.shutdown()
        self.loader.shutdown()
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        self.store.purge_deleted()
        super().closeEvent(event)
