"""End to end (issue 16): `rigllm serve` headless in a subprocess with no model, the desktop app connected
to it offscreen ("Connect to rig"), the demo model loaded through the app's loading sheet on the rig,
a chat answered by the rig, the rig's telemetry in the rig monitor, disconnect, and a clean SIGTERM stop.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import replace

import httpx
import pytest
from conftest import Recorder, free_port, served_in_process

from engine.api_keys import KEYRING_SERVICE
from engine.telemetry import NO_GPU

from app.remote_engine import RemoteChatEngine
from app.remote_loader import RemoteModelLoader
from app.rig_client import RigLink, keyring_user

KEY = "sk-rig-e2e"


@pytest.fixture
def served_rig():
    """`rigllm serve --no-model` on the reference backend with an API key and an admin key; yields (link,
    process). The app connects with the admin key: it drives /admin and chats with the one key."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "serve", "--no-model", "--backend", "reference",
                             "--port", str(port), "--api-key", "sk-rig-inference", "--admin-key", KEY,
                             "--shutdown-timeout", "5"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    try:
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)  # any answer: the server is up
                break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "rigllm serve did not start"
            time.sleep(0.1)
        yield RigLink("127.0.0.1", port, KEY), proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def rig_health(link: RigLink) -> dict:
    return httpx.get(f"{link.base_url}/health", timeout=5).json()


def test_the_app_drives_a_headless_rig(qtbot, bare_window, served_rig, memory_keyring):
    link, proc = served_rig
    win = bare_window
    assert rig_health(link)["status"] == "no_model"  # a 503, which a router reads as "send elsewhere"

    dialog = win.open_connect_dialog()
    dialog.host.setText(link.host)
    dialog.port.setValue(link.port)
    dialog.key.setText(KEY)
    dialog.accept()
    qtbot.waitUntil(lambda: win.rig_link is not None, timeout=30_000)  # swapped once the rig has answered
    assert win.rig_link == link and isinstance(win.loader, RemoteModelLoader)
    assert memory_keyring.values[(KEYRING_SERVICE, keyring_user(link.host, link.port))] == KEY
    assert (win.settings.rig_host, win.settings.rig_port) == (link.host, link.port)

    # telemetry: the rig's NVML reading, through GET /admin/cards
    qtbot.waitUntil(lambda: win.snapshot is not None, timeout=30_000)
    assert f"rig {link.name}" in win.rig.machine.text()
    if win.snapshot.cards:  # a rig with GPUs (the H200 machine): one tile per card
        qtbot.waitUntil(lambda: len(win.rig.tiles) == len(win.snapshot.cards))
    else:  # this machine: the rig reports no GPU and the monitor says so
        assert NO_GPU in win.snapshot.error
        assert "No NVIDIA GPU found" in win.rig.empty.text() and win.rig.empty.isVisibleTo(win.rig)
    assert f"no model loaded on rig {link.name}" in win.status_line.text()

    # the load sheet: the rig inspects its demo model, the app plans it, the rig loads it with progress
    sheet = win.open_load_sheet()
    qtbot.waitUntil(lambda: sheet.inspected is not None, timeout=60_000)
    assert f"on rig {link.name}" in sheet.model_label.text() and "demo model" in sheet.model_label.text()
    if not win.snapshot.cards:
        assert sheet.current.fits and "CPU reference backend" in sheet.verdict.text()
    progress, loaded, accepted = Recorder(win.loader.progress), Recorder(win.loader.loaded), Recorder(sheet.accepted)
    sheet.backend.setCurrentText("reference")
    sheet.context_spin.setValue(1024)
    sheet.start_load(anyway=True)
    qtbot.waitUntil(lambda: bool(loaded.calls) and win.engine is not None, timeout=120_000)
    engine = win.engine
    assert isinstance(engine, RemoteChatEngine) and loaded.calls[0][0] is engine
    qtbot.waitUntil(lambda: bool(accepted.calls))  # the sheet closed itself on the rig's "loaded"
    last = progress.calls[-1][0]
    assert last.done_bytes == last.total_bytes > 0
    assert engine.info.context == 1024 and engine.info.backend == "reference"
    assert f"on rig {link.name}" in engine.info.label and "demo model" in engine.info.label
    health = rig_health(link)
    assert health["status"] == "ok" and health["context_length"] == 1024 and health["model"] == engine.model_id
    assert not win.api.toggle.isEnabled()  # the rig serves its own API

    # chat: streamed from the rig's OpenAI endpoint into the same chat pane
    win.chat.send("hello rig", [])
    qtbot.waitUntil(lambda: win.chat.stream is None, timeout=60_000)
    answer = win.chat.messages[-1]
    assert answer.role == "assistant" and answer.status == "complete", answer.content
    assert 0 < answer.stats["tokens"] <= 6 and answer.stats["ttft_seconds"] > 0
    assert f"ctx {win._context_used}/1024" in win.status_line.text() and win._context_used > 6

    # Stop mid-stream: the answer keeps its text, marked stopped; the rig drops the job and answers the next
    win.settings = replace(win.settings, max_tokens=1000)
    win.chat.send("a long one", [])
    qtbot.waitUntil(lambda: bool(win.chat.messages[-1].content), timeout=60_000)
    win.chat.stop()
    stopped = win.chat.messages[-1]
    assert stopped.status == "stopped" and stopped.content and win.chat.stream is None
    qtbot.waitUntil(lambda: rig_health(link)["active"] == 0, timeout=30_000)
    win.settings = replace(win.settings, max_tokens=6)
    win.chat.send("and now?", [])
    qtbot.waitUntil(lambda: win.chat.stream is None, timeout=60_000)
    assert win.chat.messages[-1].status == "complete"

    # disconnect: back to this computer's cards; the rig keeps serving its model
    win.disconnect_rig()
    assert win.rig_link is None and win.loader is win.local_loader and win.engine is None
    assert win.status_line.text() == "no model loaded"
    qtbot.waitUntil(lambda: win.snapshot is not None and len(win.snapshot.cards) == 3, timeout=30_000)
    assert rig_health(link)["model"] == engine.model_id

    # a clean stop: uvicorn drains, then the model is unloaded before the process exits 0
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "[rigllm] stopped" in err, err


def test_a_wrong_key_is_reported_and_the_app_stays_local(qtbot, bare_window, served_rig):
    link, _proc = served_rig
    win = bare_window
    win.connect_rig(replace(link, key="wrong"))
    qtbot.waitUntil(lambda: "could not connect" in win.message.text(), timeout=30_000)
    assert win.rig_link is None
    assert "401" in win.message.text() and win.loader is win.local_loader


def test_unload_from_the_app_frees_the_rig(qtbot, bare_window, served_rig):
    link, _proc = served_rig
    httpx.post(f"{link.base_url}/admin/load", json={"context": 512}, headers={"Authorization": f"Bearer {KEY}"},
               timeout=10)
    win = bare_window
    win.connect_rig(link)  # the rig is loading or has loaded: the app follows and adopts the model
    qtbot.waitUntil(lambda: win.engine is not None, timeout=120_000)
    assert win.engine.info.context == 512
    win.unload_model()
    assert win.engine is None
    qtbot.waitUntil(lambda: rig_health(link)["status"] == "no_model", timeout=30_000)


def test_stream_chunks_turn_back_into_the_events_the_chat_pane_renders():
    """OpenAI's streamed form: a call's head, then its arguments in fragments; whole calls at the finish."""
    from engine.generation.output_parser import ContentDelta, ReasoningDelta, ToolCall

    from app.remote_engine import _Calls, delta_events

    def head(i: int, call_id: str, name: str) -> dict:
        return {"tool_calls": [{"index": i, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}]}

    def args(i: int, text: str) -> dict:
        return {"tool_calls": [{"index": i, "function": {"arguments": text}}]}

    deltas = [{"role": "assistant", "content": ""}, {"reasoning_content": "hm"}, {"content": "Hi"}, head(0, "call_1", "f"),
              args(0, '{"a": '), args(0, "1}"), head(1, "call_2", "g"), args(1, "{}")]
    calls = _Calls()
    events = [e for d in deltas for e in delta_events({"delta": d, "finish_reason": None}, calls)]
    assert events == [ReasoningDelta("hm"), ContentDelta("Hi")]
    assert delta_events({"delta": {}, "finish_reason": "tool_calls"}, calls) == [
        ToolCall(0, "call_1", "f", '{"a": 1}'), ToolCall(1, "call_2", "g", "{}")]


def test_the_remote_request_is_the_server_wire_format():
    from engine.server.wire import ChatCompletionRequest

    from app.chat_records import Message
    from app.remote_engine import request_body
    from app.settings import AppSettings

    settings = AppSettings(thinking=False, top_k=7, max_tokens=9)
    req = ChatCompletionRequest(**request_body("m", [Message("user", "hi")], settings))
    assert req.top_k == 7 and req.max_tokens == 9 and req.stream and req.stream_options.include_usage
    assert req.chat_template_kwargs == {"enable_thinking": False} and req.messages[-1].content == "hi"


def test_the_connect_dialog_fills_in_the_kept_key(qtbot, memory_keyring):
    from app.ui.connect_dialog import ConnectDialog

    memory_keyring.values[(KEYRING_SERVICE, keyring_user("rig.local", 8123))] = "kept"
    dialog = ConnectDialog("rig.local", 8000)
    qtbot.addWidget(dialog)
    assert dialog.key.text() == ""
    dialog.port.setValue(8123)
    assert dialog.link() == RigLink("rig.local", 8123, "kept")
    dialog.host.setText("")
    dialog.accept()
    assert "host" in dialog.error.text() and dialog.result() == 0


@pytest.fixture
def gated_rig():
    """An in-process rig (the real app and admin router) on two fake CMP cards whose loads report half
    their bytes, then wait for `gate` (so a test can cancel mid-load); yields (link, host, gate)."""
    import threading

    from engine.backends import open_backend
    from engine.model.load_progress import LoadProgress
    from engine.server.admin import admin_router
    from engine.server.admin_host import ModelHost
    from engine.server.admin_logs import LogRing
    from engine.fixtures.demo_model import ensure_demo_model
    from engine.server.app import create_app
    from engine.server.http_policy import HttpPolicy
    from engine.server.model_folders import ModelFolders
    from engine.telemetry import FakeSource, cmp_100_210

    gate = threading.Event()

    def opener(name, loaded, context, slots, progress, mmproj):
        for _ in range(200):  # progress until the gate opens (each report may raise LoadCancelled)
            progress(LoadProgress(0, "uploading weights", 50 << 20, 100 << 20, 0.5))
            if gate.wait(0.05):
                break
        progress(LoadProgress(0, "ready", 100 << 20, 100 << 20, 1.0))
        return open_backend("reference", loaded, context=context, slots=slots)

    host = ModelHost(backend="reference", opener=opener)
    app = create_app(host, policy=HttpPolicy(api_key="sk-rig-inference", admin_key=KEY))
    app.include_router(admin_router(host, FakeSource([cmp_100_210(0), cmp_100_210(1)]), LogRing(),
                                    ModelFolders([ensure_demo_model().parent])))
    with served_in_process(app) as port:
        yield RigLink("127.0.0.1", port, KEY), host, gate
    host.close()


def test_a_remote_load_shows_the_rigs_cards_and_progress_and_cancel_frees_them(qtbot, bare_window, gated_rig):
    link, host, gate = gated_rig
    win = bare_window
    win.connect_rig(link)
    qtbot.waitUntil(lambda: win.snapshot is not None and len(win.rig.tiles) == 2, timeout=30_000)
    assert not win.rig.empty.isVisibleTo(win.rig)  # the rig's two cards, not this computer's three
    sheet = win.open_load_sheet()
    qtbot.waitUntil(lambda: sheet.inspected is not None, timeout=60_000)
    assert sheet.card_list.count() == 2 and sheet.current.fits
    assert sheet.chosen_cards() == [0] and len(sheet.bars.bars) == 1  # the demo model fits the rig's first card
    cancelled = Recorder(win.loader.cancelled)
    sheet.backend.setCurrentText("reference")
    sheet.load_button.click()
    qtbot.waitUntil(lambda: 0 in sheet.rows and "uploading weights" in sheet.rows[0].detail.text(), timeout=30_000)
    assert sheet.rows[0].bar.value() == 500 and "52/105 MB" in sheet.rows[0].detail.text()
    sheet.cancel_button.click()
    qtbot.waitUntil(lambda: bool(cancelled.calls), timeout=30_000)
    qtbot.waitUntil(lambda: "cancelled" in sheet.stage_label.text())
    status = host.status()
    assert status["state"] == "failed" and status["error"] == "the load was cancelled" and host.current is None
    assert win.engine is None and not sheet.loading
    sheet.close()
