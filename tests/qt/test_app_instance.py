"""One app, and the same app after a restart (issue 27, finding 10): a second launch focuses the running
window and hands it its GGUF, two apps never open one chat database, and a restart reopens the last
model with its profile and the API server as it was."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from app.chat_store import ChatStore, ChatStoreError
from app.single_instance import InstanceServer, forward_to_running, instance_name
from app.ui.main_window import MainWindow
from conftest import Recorder, destroy_in_gui_thread, free_port
from engine.telemetry import FakeSource, cmp_100_210

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "trained" / "fixture-q8_0.gguf"


def test_a_second_launch_reaches_the_running_app_with_its_model(qtbot, tmp_path):
    name = instance_name(tmp_path)
    assert not forward_to_running(name, "")  # nobody runs yet: this launch becomes the app
    server = InstanceServer(name)
    got = Recorder(server.message)
    assert forward_to_running(name, str(FIXTURE))
    qtbot.waitUntil(lambda: bool(got.calls), timeout=5000)
    assert got.calls == [(str(FIXTURE),)]
    server.close()


def test_the_running_window_opens_the_forwarded_model_in_the_sheet(qtbot, bare_window):
    bare_window.open_from_other_launch(str(FIXTURE))
    sheets = [w for w in bare_window.findChildren(type(bare_window.open_load_sheet())) if w.isVisible()]
    sheet = sheets[0]
    qtbot.waitUntil(lambda: sheet.inspected is not None and sheet.inspected.path == FIXTURE, timeout=60_000)
    assert sheet.path_edit.text() == str(FIXTURE)
    for s in sheets:
        s.close()


def test_two_apps_never_open_the_same_chat_database(tmp_path):
    first = ChatStore(tmp_path / "chats.sqlite3")
    with pytest.raises(ChatStoreError, match="open in another rigllm"):
        ChatStore(tmp_path / "chats.sqlite3")
    first.close()
    ChatStore(tmp_path / "chats.sqlite3").close()  # free again once the first has closed it


def test_a_restart_reopens_the_last_model_with_its_profile_and_the_api_server(qtbot, tmp_path, qsettings,
                                                                               memory_keyring):
    store = ChatStore(tmp_path / "chats.sqlite3")
    win = MainWindow(store, qsettings, FakeSource([cmp_100_210(0)]), poll_ms=50)
    win.apply_settings(replace(win.settings, api_port=free_port()))
    win.start(FIXTURE)
    qtbot.waitUntil(lambda: win.engine is not None, timeout=120_000)
    win.apply_settings(replace(win.settings, temperature=0.25, top_k=5, system_preset="Concise"))
    win.api.toggle.setChecked(True)
    assert win.api.server is not None
    win.close()
    destroy_in_gui_thread(win)
    store.close()
    store = ChatStore(tmp_path / "chats.sqlite3")
    again = MainWindow(store, qsettings, FakeSource([cmp_100_210(0)]), poll_ms=50)
    assert again.profiles.last_model == str(FIXTURE)
    again.start(None)
    qtbot.waitUntil(lambda: again.engine is not None and again.api.server is not None, timeout=120_000)
    assert again.engine.info.path == str(FIXTURE)  # not the demo model
    s = again.settings
    assert (s.temperature, s.top_k, s.system_preset, s.raw_prompt) == (0.25, 5, "Concise", True)
    again.close()
    destroy_in_gui_thread(again)
    store.close()
