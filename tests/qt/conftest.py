"""Desktop-app tests run on Qt's offscreen platform (no display, no system packages beyond pip)."""

import os
import socket
from contextlib import contextmanager

os.environ["QT_QPA_PLATFORM"] = "offscreen"  # must be set before anything imports Qt

import keyring  # noqa: E402
import pytest  # noqa: E402
from keyring.backend import KeyringBackend  # noqa: E402
from PySide6.QtCore import QObject, QSettings  # noqa: E402

from engine.telemetry import FakeSource, cmp_100_210  # noqa: E402


@pytest.fixture
def qsettings(tmp_path):
    return QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat)


@pytest.fixture
def store(tmp_path):
    from app.chat_store import ChatStore

    s = ChatStore(tmp_path / "chats.sqlite3")
    yield s
    s.close()


@pytest.fixture
def rig():
    """Three CMP 100-210 cards; card 1 has 1.2 GiB used by another process."""
    return FakeSource([cmp_100_210(0), cmp_100_210(1, memory_used=1200 << 20), cmp_100_210(2)])


@pytest.fixture
def bare_window(qtbot, store, qsettings, rig):
    """The main window with no model loaded and short, greedy answers."""
    from dataclasses import replace

    from app.ui.main_window import MainWindow

    win = MainWindow(store, qsettings, rig, poll_ms=50)
    qtbot.addWidget(win)
    win.settings = replace(win.settings, max_tokens=6, thinking=False, temperature=0.0)
    win.show()
    yield win
    win.close()
    destroy_in_gui_thread(win)


@pytest.fixture
def window(qtbot, bare_window):
    """The main window with the demo model loaded on the CPU."""
    bare_window.start_default_model(None)
    qtbot.waitUntil(lambda: bare_window.engine is not None, timeout=120_000)
    return bare_window


def destroy_in_gui_thread(widget) -> None:
    """Delete the widget's C++ side now, on this thread, then collect cycles here too.

    Left to Python's garbage collector, a window caught in a reference cycle can be freed on whatever
    thread happens to trigger a collection (e.g. the generation worker), and Qt then fires a GUI-thread
    timer of the freed object: a segfault in the next test.
    """
    import gc

    import shiboken6

    if shiboken6.isValid(widget):
        shiboken6.delete(widget)
    gc.collect()


class Recorder(QObject):
    """Records a signal's emissions on the GUI thread.

    Signals emitted on engine threads reach a QObject's method queued, in its thread; a plain Python
    callable (pytest-qt's waitSignal included) would run on the emitting thread instead.
    """

    def __init__(self, signal=None):
        super().__init__()
        self.calls: list[tuple] = []
        if signal is not None:
            signal.connect(self.record)

    def record(self, *args) -> None:
        self.calls.append(args)


class MemoryKeyring(KeyringBackend):
    priority = 1

    def __init__(self):
        super().__init__()
        self.values: dict[tuple[str, str], str] = {}

    def get_password(self, service, username):
        return self.values.get((service, username))

    def set_password(self, service, username, password):
        self.values[(service, username)] = password

    def delete_password(self, service, username):
        self.values.pop((service, username), None)


@pytest.fixture
def memory_keyring():
    old = keyring.get_keyring()
    ring = MemoryKeyring()
    keyring.set_keyring(ring)
    yield ring
    keyring.set_keyring(old)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def served_in_process(app):
    """`app` on uvicorn on a free loopback port, on a thread; yields the port and stops it afterwards."""
    import threading
    import time

    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the in-process rig did not start"
        time.sleep(0.01)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=20)
