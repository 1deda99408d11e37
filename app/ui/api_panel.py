"""The API server panel: a switch, the port, the key (masked, with Copy and New key, and where it is kept:
keyring, a private file the user ticked, or this session only) and the clients."""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (QCheckBox, QFormLayout, QHBoxLayout, QLabel, QLineEdit, QPushButton, QSpinBox,
                               QVBoxLayout, QWidget)

from engine.errors import RigllmError

from app.api_key import ApiKey
from app.key_store import KEYRING
from app.api_server import ApiServer
from app.chat_engine import ChatEngine


class ApiPanel(QWidget):
    notice = Signal(str)

    def __init__(self, port: int, parent: QWidget | None = None):
        super().__init__(parent)
        self.engine: ChatEngine | None = None
        self.server: ApiServer | None = None
        self.api_key = ApiKey()
        layout = QVBoxLayout(self)
        self.toggle = QCheckBox("Serve the loaded model through the OpenAI-compatible API")
        self.toggle.toggled.connect(self._toggled)
        layout.addWidget(self.toggle)
        form = QFormLayout()
        self.port = QSpinBox(minimum=1, maximum=65535, value=port)
        self.lan = QCheckBox("Reachable from other machines (listen on 0.0.0.0)")
        self.url = QLabel("off")
        self.url.setTextInteractionFlags(Qt.TextSelectableByMouse)
        key_row = QHBoxLayout()
        self.key = QLineEdit()
        self.key.setReadOnly(True)
        self.key.setPlaceholderText("made when the server first starts")
        self.key.setEchoMode(QLineEdit.Password)
        self.show_key = QCheckBox("show")
        self.show_key.toggled.connect(lambda on: self.key.setEchoMode(QLineEdit.Normal if on else QLineEdit.Password))
        self.copy_key = QPushButton("Copy")
        self.copy_key.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.key.text()))
        self.new_key = QPushButton("New key")
        self.new_key.setToolTip("Replace the key; clients using the old one are refused")
        self.new_key.clicked.connect(self._new_key)
        for w in (self.key, self.show_key, self.copy_key, self.new_key):
            key_row.addWidget(w)
        self.key_place = QLabel()
        self.key_place.setWordWrap(True)
        self.key_place.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.key_file = QCheckBox(f"Keep the key in a file only you can read ({self.api_key.store.file}, mode 0600)")
        self.key_file.setChecked(self.api_key.store.in_file())
        self.key_file.toggled.connect(self._key_file_toggled)
        self.clients = QLabel("none")
        form.addRow("Port", self.port)
        form.addRow("", self.lan)
        form.addRow("Base URL", self.url)
        form.addRow("API key", key_row)
        form.addRow("", self.key_place)
        form.addRow("", self.key_file)
        form.addRow("Clients (last minute)", self.clients)
        layout.addLayout(form)
        layout.addStretch(1)
        self._timer = QTimer(self, interval=1000)
        self._timer.timeout.connect(self._refresh_clients)
        self._show_key_place()
        self.set_engine(None)

    def set_engine(self, engine: ChatEngine | None) -> None:
        """A new model stops the server (it served the old worker)."""
        if self.server is not None:
            self.toggle.setChecked(False)
        self.engine = engine
        self.toggle.setEnabled(engine is not None)
        self.toggle.setToolTip("" if engine else "Load a model first")

    def _toggled(self, on: bool) -> None:
        if on:
            self._start()
        else:
            self._stop()

    def _start(self) -> None:
        assert self.engine is not None
        try:
            key = self.api_key.current()
            server = ApiServer(self.engine, key, "0.0.0.0" if self.lan.isChecked() else "127.0.0.1", self.port.value())
            server.start()
        except RigllmError as err:
            self.notice.emit(str(err))
            self.toggle.blockSignals(True)
            self.toggle.setChecked(False)
            self.toggle.blockSignals(False)
            return
        self.server = server
        self.key.setText(key)
        self._show_key_place()
        self.url.setText(server.base_url)
        self.port.setEnabled(False)
        self.lan.setEnabled(False)
        self._timer.start()
        self.notice.emit(f"API server on {server.base_url}")

    def _stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
        self._timer.stop()
        self.url.setText("off")
        self.clients.setText("none")
        self.port.setEnabled(True)
        self.lan.setEnabled(True)

    def _new_key(self) -> None:
        try:
            self.key.setText(self.api_key.renew())
        except RigllmError as err:
            self.notice.emit(str(err))
            return
        self._show_key_place()
        if self.server is not None:  # the running app holds the old key: restart it with the new one
            self._stop()
            self._start()

    def _key_file_toggled(self, on: bool) -> None:
        try:
            self.api_key.keep_in_file(on)
        except (RigllmError, OSError) as err:
            self.notice.emit(f"could not {'keep the key in' if on else 'remove'} {self.api_key.store.file}: {err}")
        self.key_file.blockSignals(True)
        self.key_file.setChecked(self.api_key.store.in_file())
        self.key_file.blockSignals(False)
        if self.api_key.key:
            self.key.setText(self.api_key.key)
        self._show_key_place()

    def _show_key_place(self) -> None:
        """Say where the key is kept; offer the file only where there is no keyring (or it is in use)."""
        self.key_place.setText(self.api_key.describe())
        self.key_file.setVisible(self.api_key.place() != KEYRING)

    def _refresh_clients(self) -> None:
        if self.server is not None:
            hosts = self.server.clients.recent()
            busy = self.server.clients.in_flight
            self.clients.setText((", ".join(hosts) or "none") + (f" · {busy} request(s) running" if busy else ""))

    def shutdown(self) -> None:
        self._stop()
