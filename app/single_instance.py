"""One running app per user and data folder: a second launch hands its GGUF (if any) to the running window
and exits, so two instances never write the same chat database and a double-clicked model opens where
the user already is.

The running app listens on a QLocalServer named after the data folder; a new launch first tries to
connect, and if someone answers it sends one line (the model path, or nothing) and is done. A server
name left behind by a crashed app answers nobody, so it is removed and taken over.
"""

from __future__ import annotations

import getpass
import hashlib
from pathlib import Path

from PySide6.QtCore import QObject, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket

CONNECT_MS = 1000


def instance_name(data_dir: Path) -> str:
    digest = hashlib.sha256(str(data_dir.resolve()).encode("utf-8")).hexdigest()[:12]
    return f"rigllm-{getpass.getuser()}-{digest}"


def forward_to_running(name: str, message: str) -> bool:
    """Send `message` (a GGUF path, or "") to the app already running under `name`; False when none is."""
    socket = QLocalSocket()
    socket.connectToServer(name)
    if not socket.waitForConnected(CONNECT_MS):
        return False
    socket.write(message.encode("utf-8") + b"\n")
    socket.waitForBytesWritten(CONNECT_MS)
    socket.disconnectFromServer()
    return True


class InstanceServer(QObject):
    """Listens for later launches; `message` carries what each one sent (a path, or "" to just focus)."""

    message = Signal(str)

    def __init__(self, name: str, parent: QObject | None = None):
        super().__init__(parent)
        self.server = QLocalServer(self)
        self.server.setSocketOptions(QLocalServer.UserAccessOption)
        if not self.server.listen(name):  # left behind by an app that crashed: nobody answered on it
            QLocalServer.removeServer(name)
            self.server.listen(name)
        self.server.newConnection.connect(self._accept)

    def _accept(self) -> None:
        while self.server.hasPendingConnections():
            socket = self.server.nextPendingConnection()
            buffer = bytearray()

            def read(socket=socket, buffer=buffer) -> None:
                buffer.extend(bytes(socket.readAll()))
                if b"\n" in buffer:
                    self.message.emit(bytes(buffer).split(b"\n", 1)[0].decode("utf-8", "replace"))
                    socket.disconnectFromServer()

            socket.readyRead.connect(read)
            socket.disconnected.connect(socket.deleteLater)
            if socket.bytesAvailable():
                read()

    def close(self) -> None:
        self.server.close()
