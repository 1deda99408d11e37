"""Start the desktop app: `rigllm gui [MODEL]` or `python -m app [MODEL]`.

With no model given: where no NVIDIA GPU is found the app loads the generated demo model on the CPU
reference backend (clearly labelled), so everything can be tried; with GPUs it opens the loading
sheet. `--smoke-test` opens the window, loads the demo model, answers one message and exits 0
(packaging uses it to check a built bundle).

One app runs per user and data folder: a second launch hands its model to the running window (which
comes to the front and opens it in the loading sheet) and exits.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

SMOKE_TIMEOUT_MS = 120_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", type=Path, help="GGUF model to load at start")
    p.add_argument("--smoke-test", action="store_true",
                   help="open the window, load the demo model, answer one message, quit (exit 0 on success)")


def chats_path() -> Path:
    from engine.paths import user_data_dir

    return user_data_dir() / "chats.sqlite3"


def run(args: argparse.Namespace) -> int:
    from PySide6.QtCore import QSettings
    from PySide6.QtGui import QIcon
    from PySide6.QtWidgets import QApplication

    from engine.paths import RESOURCES_DIR
    from engine.telemetry import open_source

    from engine.paths import user_data_dir

    from app.chat_store import ChatStore, ChatStoreError
    from app.single_instance import InstanceServer, forward_to_running, instance_name
    from app.ui.main_window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("rigllm")
    app.setOrganizationName("rigllm")
    app.setDesktopFileName("rigllm")  # Wayland app id = packaging/linux/rigllm.desktop (X11 uses the name above)
    app.setWindowIcon(QIcon(str(RESOURCES_DIR / "icons" / "hicolor" / "256x256" / "apps" / "rigllm.png")))
    name = instance_name(user_data_dir())
    if not args.smoke_test and forward_to_running(name, str(args.model.resolve()) if args.model else ""):
        print("rigllm gui: already running; its window was brought to the front")
        return 0
    try:
        store = ChatStore(chats_path())
    except ChatStoreError as err:
        print(f"rigllm gui: {err}", file=sys.stderr)
        return 1
    window = MainWindow(store, QSettings(), open_source())
    window.show()
    if args.smoke_test:
        return _smoke(app, window)
    instances = InstanceServer(name, window)
    instances.message.connect(window.open_from_other_launch)
    window.start(args.model)
    code = app.exec()
    store.close()
    return code


def _smoke(app, window) -> int:
    """Demo model → one message → a complete answer, or a non-zero exit with the reason."""
    from PySide6.QtCore import QObject, QTimer

    from app.chat_records import COMPLETE

    class SmokeTest(QObject):
        """Its slots are methods of a GUI-thread object, so the loader's signals reach them queued."""

        status = "timed out"

        def loaded(self, _engine: object) -> None:
            window.chat.send("Hello from the smoke test", [])

        def changed(self) -> None:
            last = window.chat.messages[-1] if window.chat.messages else None
            if window.chat.stream is None and last is not None and last.role == "assistant":
                self.status = last.status
                app.quit()

        def failed(self, message: str) -> None:
            self.status = f"failed: {message}"
            app.quit()

    smoke = SmokeTest()
    window.loader.loaded.connect(smoke.loaded)
    window.loader.failed.connect(smoke.failed)
    window.chat.notice.connect(smoke.failed)
    window.chat.conversations_changed.connect(smoke.changed)
    window.start_default_model(None)
    QTimer.singleShot(SMOKE_TIMEOUT_MS, app.quit)
    app.exec()
    window.close()
    print(f"smoke test: {smoke.status}")
    return 0 if smoke.status == COMPLETE else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app", description="rigllm desktop app")
    add_arguments(parser)
    return run(parser.parse_args(argv))
