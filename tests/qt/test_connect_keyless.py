"""Connecting to a rig without a key (issue 27, finding 2): a keyless `rigllm serve` is reached with no
Authorization header at all (an empty key used to send "Bearer ", an illegal header value), and a rig
that cannot be reached leaves the local model loaded."""

from __future__ import annotations

import pytest
from conftest import Recorder, free_port, served_in_process

from engine.server.admin import admin_router
from engine.server.admin_host import ModelHost
from engine.server.admin_logs import LogRing
from engine.server.model_folders import ModelFolders
from engine.fixtures.demo_model import ensure_demo_model
from engine.server.app import create_app
from engine.telemetry import FakeSource, cmp_100_210

from app.rig_client import RigLink, auth_headers


@pytest.fixture
def keyless_rig():
    """An in-process rig (the real app and admin router) started without a key, as `rigllm serve --admin`
    on loopback does."""
    host = ModelHost(backend="reference")
    app = create_app(host, None)
    app.include_router(admin_router(host, FakeSource([cmp_100_210(0)]), LogRing(),
                                    ModelFolders([ensure_demo_model().parent])))
    with served_in_process(app) as port:
        yield RigLink("127.0.0.1", port, "")
    host.close()


def test_an_empty_key_sends_no_authorization_header():
    assert auth_headers("") == {} and auth_headers("sk") == {"Authorization": "Bearer sk"}
    client = RigLink("127.0.0.1", 1, "").client()
    assert "authorization" not in client.http.headers
    client.close()


def test_an_empty_key_connects_to_a_keyless_rig(qtbot, window, keyless_rig):
    notices = Recorder(window.notified)
    window.connect_rig(keyless_rig)
    qtbot.waitUntil(lambda: window.rig_link is not None, timeout=20_000)
    qtbot.waitUntil(lambda: any("connected to rig" in str(c[0]) for c in notices.calls), timeout=20_000)
    assert not any("Illegal header" in str(c[0]) or "could not connect" in str(c[0]) for c in notices.calls)
    qtbot.waitUntil(lambda: window.snapshot is not None and len(window.rig.tiles) == 1, timeout=20_000)
    window.disconnect_rig()


def test_a_rig_that_cannot_be_reached_leaves_the_local_model_loaded(qtbot, window):
    local = window.engine
    notices = Recorder(window.notified)
    window.connect_rig(RigLink("127.0.0.1", free_port(), ""))  # nothing listens there
    qtbot.waitUntil(lambda: any("could not connect" in str(c[0]) for c in notices.calls), timeout=20_000)
    assert window.engine is local and window.rig_link is None and window.loader is window.local_loader
    window.chat.send("still here?", [])
    qtbot.waitUntil(lambda: window.chat.stream is None, timeout=60_000)
    assert window.chat.messages[-1].role == "assistant" and window.chat.messages[-1].content
