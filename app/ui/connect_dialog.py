""""Connect to rig": the address of a headless `rigllm serve` and its admin key (which opens its /admin API
and also its OpenAI routes, so the app needs that one key).

The key is filled in from the keyring when one is kept for that host and port, and kept there when
"Remember" is on (service "rigllm", user "rig-key:HOST:PORT"); it never goes into the settings file.
Nothing here touches the network: the main window checks the address and key off the GUI thread.
"""

from __future__ import annotations

from PySide6.QtWidgets import (QCheckBox, QDialog, QDialogButtonBox, QFormLayout, QLabel, QLineEdit, QSpinBox,
                               QVBoxLayout, QWidget)

from engine.errors import RigllmError

from app.rig_client import RigLink, store_rig_key, stored_rig_key
from app.theme import set_style


class ConnectDialog(QDialog):
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
        self.remember = QCheckBox("Remember the key in the system keyring")
        self.remember.setChecked(True)
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
        try:
            key = stored_rig_key(host, self.port.value())
        except RigllmError as err:
            self.error.setText(str(err))
            return
        if key:
            self.key.setText(key)

    def link(self) -> RigLink:
        return RigLink(self.host.text().strip(), self.port.value(), self.key.text().strip())

    def accept(self) -> None:
        link = self.link()
        if not link.host:
            self.error.setText("enter the rig's host name or address")
            return
        if self.remember.isChecked() and link.key:
            try:
                store_rig_key(link)
            except RigllmError as err:
                self.error.setText(str(err))
                return
        super().accept()
