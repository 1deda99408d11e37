"""Child process for the crash test: starts answering a long message, says so, then waits to be killed.

    python crash_child.py CHATS_DB SETTINGS_INI
"""

import os
import sys
from dataclasses import replace

os.environ["QT_QPA_PLATFORM"] = "offscreen"

from PySide6.QtCore import QSettings, QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from engine.telemetry import FakeSource  # noqa: E402

from app.chat_store import ChatStore  # noqa: E402
from app.ui.main_window import MainWindow  # noqa: E402


def main(db: str, ini: str) -> None:
    app = QApplication([])
    window = MainWindow(ChatStore(db), QSettings(ini, QSettings.IniFormat), FakeSource([]))
    window.settings = replace(window.settings, max_tokens=100_000, thinking=False)

    def poll() -> None:
        if window.engine is not None and window.chat.conversation_id is None:
            window.chat.send("Tell me everything", [])
        stream = window.chat.stream
        if stream is not None and stream.saved and stream.message.content:
            print("STREAMING", flush=True)  # the partial answer is on disk now
            timer.stop()

    timer = QTimer(interval=20)
    timer.timeout.connect(poll)
    timer.start()
    window.start_default_model(None)
    app.exec()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
