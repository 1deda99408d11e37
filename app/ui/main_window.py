"""The main window: conversations on the left; Chat, Rig monitor and API server tabs; a status line
with the model, its cards, the context used and the KV format.

"Connect to rig" swaps the local engine for a remote one: the remote loader, engine and telemetry
source have the local ones' signals and calls, so the chat pane, the loading sheet and the rig
monitor are the same widgets for both. Disconnecting goes back to this computer.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QSettings, QTimer, Qt, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (QApplication, QFileDialog, QLabel, QMainWindow, QMessageBox, QPushButton,
                               QSplitter, QTabWidget)

from engine.telemetry import RigSnapshot, TelemetrySource

from app import chat_export, settings as settings_io
from app.chat_engine import ChatEngine
from app.chat_store import ChatStore
from app.model_loader import LoadRequest, ModelLoader
from app.model_profiles import DEMO, ModelProfile, ModelProfiles, chat_part
from app.monitor_service import POLL_MS, MonitorService
from app.remote_engine import RemoteChatEngine
from app.remote_loader import RemoteModelLoader
from app.remote_telemetry import RemoteTelemetry
from app.rig_client import RigLink
from app.settings import AppSettings
from app.theme import apply_theme, span
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
    notified = Signal(str)  # each status-bar notice, as `notify` shows it

    def __init__(self, store: ChatStore, qsettings: QSettings, source: TelemetrySource, poll_ms: int = POLL_MS):
        super().__init__()
        self.setWindowTitle("rigllm")
        self.store = store
        self.qsettings = qsettings
        self.settings: AppSettings = settings_io.load(qsettings)
        self.profiles = ModelProfiles(qsettings)
        self._restore_api = False  # set at start when the API server was on as the app last closed
        apply_theme(QApplication.instance(), self.settings.theme)
        self.engine: ChatEngine | RemoteChatEngine | None = None
        self.snapshot: RigSnapshot | None = None
        self.local_loader = ModelLoader()
        self.loader: ModelLoader | RemoteModelLoader = self.local_loader
        self.loader.loaded.connect(self._loaded)
        self.loader.failed.connect(self._load_failed)
        self.rig_link: RigLink | None = None  # set while connected to a rig
        self._pending_rig: tuple[RigLink, RemoteModelLoader] | None = None  # asked to connect, not answered yet
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
        self.chat.context_changed.connect(self._context_changed)
        self.chat.raw_prompt_toggled.connect(self._raw_prompt_toggled)
        self.rig.alert.connect(self.notify)
        self.api.notice.connect(self.notify)

        self.status_line = QLabel("no model loaded")
        self.statusBar().addPermanentWidget(self.status_line)
        # Notices in a wrapping label, not showMessage (which cuts a long reason off at the window's edge).
        self.message = QLabel()
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.statusBar().addWidget(self.message, 1)
        self.undo_button = QPushButton()
        self.undo_button.setVisible(False)
        self.undo_button.clicked.connect(self._undo_delete)
        self.statusBar().addWidget(self.undo_button)
        self._undo: tuple[int, str] | None = None
        self._undo_timer = QTimer(self, singleShot=True, interval=UNDO_SECONDS * 1000)
        self._undo_timer.timeout.connect(lambda: self.undo_button.setVisible(False))
        self._context_used = -1  # the chat pane's count (its meter shows the same)
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
        """At launch: load `path`; with no path, the model loaded when the app last closed (with its profile,
        and the API server as it was); failing that, the demo model on the CPU when the first rig reading
        finds no GPU, else the loading sheet (decided when that reading arrives, off the GUI thread)."""
        self._restore_api = self.profiles.api_server_on
        last = self.profiles.last_model
        if path is None and last and Path(last).is_file():
            path = Path(last)
        if path is not None:
            self.start_default_model(path)
        else:
            self._start_pending = True

    def start_default_model(self, path: Path | None) -> None:
        """Load `path` (or the demo model on the CPU when there is no GPU and no path) without the sheet."""
        self.notify("loading the demo model (CPU reference backend)..." if path is None else f"loading {path}...")
        profile = self.profiles.get(DEMO if path is None else str(path)) or ModelProfile()
        self.loader.load(LoadRequest(path, profile.backend, profile.context, profile.kv_format, profile.cards,
                                     profile.split))

    def open_load_sheet(self) -> LoadSheet:
        cards = list(self.snapshot.cards) if self.snapshot else []
        sheet = LoadSheet(cards, self.loader, self.snapshot.error if self.snapshot else None, self, self.rig_link,
                          profiles=self.profiles if self.rig_link is None else None)
        sheet.setAttribute(Qt.WA_DeleteOnClose)
        sheet.show()
        return sheet

    def open_from_other_launch(self, model: str) -> None:
        """A second launch of the app: come to the front, and open the GGUF it was given in the sheet."""
        self.showNormal()
        self.raise_()
        self.activateWindow()
        if model and self.rig_link is not None:
            self.notify(f"disconnect from rig {self.rig_link.name} to open {Path(model).name} on this computer")
        elif model:
            self.open_load_sheet().choose(Path(model))

    def unload_model(self) -> None:
        """Close the model; on a rig, also unload it there (freeing the rig's cards)."""
        if isinstance(self.loader, RemoteModelLoader) and self.engine is not None:
            self.loader.unload()
        self.set_engine(None)

    def set_engine(self, engine: ChatEngine | RemoteChatEngine | None) -> None:
        if engine is self.engine:
            return
        if isinstance(engine, ChatEngine):
            self._adopt_profile(engine)
        old, self.engine = self.engine, engine
        self.api.set_engine(engine if isinstance(engine, ChatEngine) else None)  # a rig serves its own API
        self.chat.set_engine(engine)
        if old is not None:
            old.close()
        self.rig.set_model(engine.info.cards if engine else ())
        self.update_status()
        if engine is not None:
            self.notify(f"{engine.info.name} ready on the {engine.info.backend} backend")
        if isinstance(engine, ChatEngine) and self._restore_api:
            self._restore_api = False
            self.api.toggle.setChecked(True)

    def _adopt_profile(self, engine: ChatEngine) -> None:
        """Restore the model's chat settings (a file without its own chat template starts in raw prompt
        mode), and remember how it was loaded and that it is the one to reopen after a restart."""
        i = engine.info
        known = self.profiles.get(i.path)
        if known is not None and known.chat:
            settings = known.with_chat(self.settings)
        else:
            settings = replace(self.settings, raw_prompt=not i.chat_template)
        self.profiles.put(i.path, ModelProfile(i.backend, i.cards, i.split, i.context, i.kv_format, chat_part(settings)))
        self.profiles.last_model = i.path
        self.settings = settings
        settings_io.save(self.qsettings, settings)

    # rig

    def open_connect_dialog(self) -> ConnectDialog:
        dialog = ConnectDialog(self.settings.rig_host, self.settings.rig_port, self)
        dialog.setAttribute(Qt.WA_DeleteOnClose)
        dialog.accepted.connect(lambda: self.connect_rig(dialog.link()))
        dialog.notice.connect(self.notify)
        dialog.show()
        return dialog

    def connect_rig(self, link: RigLink) -> None:
        """Chat, load and monitor on `link`'s rig instead of this computer. The local model is closed only
        once the rig has answered: a wrong address or key leaves this computer as it was."""
        if self._pending_rig is not None:
            self._pending_rig[1].shutdown()
        remote = RemoteModelLoader(link)
        remote.notice.connect(self.notify)
        remote.unreachable.connect(self._rig_unreachable)
        remote.reachable.connect(self._rig_reachable)
        self._pending_rig = (link, remote)
        self.notify(f"connecting to rig {link.name}...")
        remote.check()

    def _rig_reachable(self) -> None:
        if self._pending_rig is None or self.sender() is not self._pending_rig[1]:
            return
        link, remote = self._pending_rig
        self._pending_rig = None
        self.disconnect_rig()
        self._start_pending = False  # the demo-model start is for this computer only
        self.set_engine(None)
        self.apply_settings(replace(self.settings, rig_host=link.host, rig_port=link.port))
        self.rig_link = link
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
        if self._pending_rig is not None and self.sender() is self._pending_rig[1]:
            pending = self._pending_rig[1]
            pending.shutdown()  # never connected: the local model and monitor stay as they were
            self._pending_rig = None
        elif self.sender() is self.loader:
            self.disconnect_rig()
        self.notify(f"could not connect: {message}")

    def _loaded(self, engine: ChatEngine | RemoteChatEngine) -> None:
        if self.sender() is not self.loader:  # queued before a connect or disconnect: the other machine's
            engine.close()
            return
        self.set_engine(engine)

    def _load_failed(self, message: str) -> None:
        self.notify(f"loading failed: {message}")

    def _context_changed(self, used: int, _total: int) -> None:
        self._context_used = used
        self.update_status()

    def _raw_prompt_toggled(self, on: bool) -> None:
        self.apply_settings(replace(self.settings, raw_prompt=on))
        self.chat.composer.keep_whitespace = on
        self.chat.update_context_meter()

    def update_status(self) -> None:
        e = self.engine
        if e is None:
            where = f" on rig {self.rig_link.name}" if self.rig_link else ""
            self.status_line.setText(f"no model loaded{where}")
            return
        i = e.info
        cards = f"cards {', '.join(map(str, i.cards))}" if i.cards else "CPU"
        used = "?" if self._context_used < 0 else self._context_used
        text = f"{i.name} · {i.backend} · {cards} · ctx {used}/{i.context} · KV {i.kv_format}"
        if i.label:
            text = span(f"{text} · {i.label}", "warning")
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
        if isinstance(self.engine, ChatEngine):
            self.profiles.remember_chat(self.engine.info.path, new)
        apply_theme(QApplication.instance(), new.theme)
        self.update_status()  # its rich text carries the theme's colours

    def notify(self, message: str) -> None:
        """Show `message` whole in the status bar (wrapped onto more lines when long) until the next one."""
        self.message.setText(message)
        self.message.setToolTip(message)
        self.notified.emit(message)

    def closeEvent(self, event) -> None:
        if self.chat.stream is not None:
            self.chat.stop()
        if self._pending_rig is not None:
            self._pending_rig[1].shutdown()
            self._pending_rig = None
        self.disconnect_rig()
        self.profiles.api_server_on = self.api.server is not None
        self.api.shutdown()
        self.monitor.shutdown()
        self.loader.shutdown()
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        self.store.purge_deleted()
        super().closeEvent(event)
