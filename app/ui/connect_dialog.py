""""Connect to rig": the address of a headless `rigllm serve` and its admin key (which opens its /admin API
and also its OpenAI routes, so the app needs that one key).

The key is filled in when one is kept for that host and port, and kept when "Remember" is on: in the
keyring (service "rigllm", user "rig-key:HOST:PORT") when one is usable, and then Remember starts
ticked; else in a file only the user can read, which the box's label names, and then it starts
unticked. It never goes into the settings file, and failing to keep it never stops the connection
(`notice` says why). Nothing here touches the network: the main window checks the address and key off
the GUI thread.
"""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (QCheckBox, QDialog, QDialogButtonBox, QFormLayout, QLabel, QLineEdit, QSpinBox,
                               QVBoxLayout, QWidget)

from engine.errors import RigllmError

from app.key_store import keys_dir, secure_keyring
from app.rig_client import RigLink, rig_key_store
from app.theme import set_style


class ConnectDialog(QDialog):
    notice = Signal(str)

    def __init__(self, host: str = "", port: int = 8000, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Connect to rig")
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("A rig running <code>rigllm serve --host 0.0.0.0 --admin-key-file ...</code> "
                                "(see packaging/systemd): chat, load models and watch its cards from here."))
        form = QFormLayout()
        self.host = QLineEdit(host, placeholderText="rig.local or 192.168.1.20")
        self.port = QSpinBox(minimum=1, maximum=65535, value=port)
        self.key = QLineEdit(placeholderText="the key in the rig's /etc/rigllm/admin-key")
        self.key.setEchoMode(QLineEdit.Password)
        backend, why_not = secure_keyring()
        self.has_keyring = backend is not None
        if self.has_keyring:
            self.remember = QCheckBox("Remember the key in the system keyring")
        else:
            self.remember = QCheckBox(f"Remember the key in a file only you can read (in {keys_dir()}, mode 0600)")
            self.remember.setToolTip(why_not)
        self.remember.setChecked(self.has_keyring)
        form.addRow("Host", self.host)
        form.addRow("Port", self.port)
        form.addRow("Admin key", self.key)
        form.addRow("", self.remember)
        layout.addLayout(form)
        self.error = QLabel()
        set_style(self.error, "error")
        self.error.setWordWrap(True)
        layout.addWidget(self.error)
        buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        buttons.button(QDialogButtonBox.Ok).setText("Connect")
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        self.host.editingFinished.connect(self._fill_key)
        self.port.valueChanged.connect(lambda _v: self._fill_key())
        self._fill_key()

    def _fill_key(self) -> None:
        host = self.host.text().strip()
        if not host:
            return
        store = rig_key_store(host, self.port.value())
        try:
            key, _where = store.read()
        except RigllmError as err:
            self.error.setText(str(err))
            return
        if key:
            self.key.setText(key)
        if store.in_file():
            self.remember.setChecked(True)  # kept in its file before: the user chose that

    def link(self) -> RigLink:
        return RigLink(self.host.text().strip(), self.port.value(), self.key.text().strip())

    def accept(self) -> None:
        link = self.link()
        if not link.host:
            self.error.setText("enter the rig's host name or address")
            return
        problem = self._keep_key(link) if self.remember.isChecked() and link.key else ""
        super().accept()
        if problem:
            self.notice.emit(f"connecting without remembering the key: {problem}")

    def _keep_key(self, link: RigLink) -> str:
        """Keep the key where the Remember box says; "" when kept, else why not (never raises)."""
        store = rig_key_store(link.host, link.port)
        try:
            if self.has_keyring and not store.in_file():
                store.write_keyring(link.key)
            else:
                store.write_file(link.key)
        except (RigllmError, OSError) as err:
            return str(err)
        return ""
