"""Hostile web pages and API clients get nothing they should not (issue 24, findings 6 and 7).

The server is the keyless loopback default with the admin API turned on (`rigllm serve --admin`), the
case where only the Host, Origin and content-type checks stand between a web page and `/admin`.
"""

import os
import time
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from engine.cli import main
from engine.fixtures.demo_model import ensure_demo_model
from engine.server.admin import admin_router
from engine.server.admin_host import ModelHost
from engine.server.admin_logs import LogRing
from engine.server.app import create_app
from engine.server.http_policy import HttpPolicy
from engine.server.model_folders import ModelFolders
from engine.telemetry import FakeSource

EVIL = "http://evil.example"
FORM = {"content-type": "application/x-www-form-urlencoded"}
REFUSED_WITHIN = 2.0


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    host = ModelHost(backend="reference")
    host.load(ensure_demo_model(), context=256)
    policy = HttpPolicy(allowed_hosts=("rig.lan",), cors_origins=("http://ui.lan:3000",))
    app = create_app(host, policy=policy)
    app.include_router(admin_router(host, FakeSource([]), LogRing(), ModelFolders([ensure_demo_model().parent, folder])))
    with TestClient(app, base_url="http://localhost:8000") as client:
        yield SimpleNamespace(client=client, host=host, folder=folder)
    host.close()


def test_a_foreign_host_is_421_even_for_reads(rig):
    for method, path in (("GET", "/v1/models"), ("GET", "/admin/logs"), ("POST", "/admin/unload")):
        r = rig.client.request(method, path, headers={"host": "evil.example:8000"})
        assert r.status_code == 421 and r.json()["error"]["code"] == "host_not_allowed", path
    assert rig.host.current is not None
    for name in ("localhost:8000", "127.0.0.1:8000", "[::1]:8000", "rig.lan"):
        assert rig.client.get("/v1/models", headers={"host": name}).status_code == 200, name


def test_a_form_post_from_a_foreign_page_cannot_unload_the_model(rig):
    attempts = [{"origin": EVIL, **FORM}, {"origin": "null", **FORM}, {"referer": f"{EVIL}/page.html", **FORM},
                {"origin": EVIL, "content-type": "application/json"}]
    for headers in attempts:
        r = rig.client.post("/admin/unload", content=b"x=1", headers=headers)
        assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed", headers
    no_origin = rig.client.post("/admin/unload", content=b"x=1", headers=FORM)  # old browsers, curl -d
    assert no_origin.status_code == 415 and no_origin.json()["error"]["code"] == "unsupported_media_type"
    text = rig.client.post("/v1/chat/completions", content=b'{"messages": []}', headers={"content-type": "text/plain"})
    assert text.status_code == 415
    assert rig.host.current is not None  # none of them did anything


def test_same_origin_and_cors_origins_may_post_json(rig):
    for origin in ("http://localhost:8000", "http://ui.lan:3000"):
        r = rig.client.post("/v1/tokenize", json={"content": "hi"}, headers={"origin": origin})
        assert r.status_code == 200, (origin, r.text)


def test_model_paths_reach_only_gguf_files_in_the_model_folders(rig, tmp_path):
    outside = tmp_path / "secret.gguf"
    outside.write_bytes(b"root:x:0:0")
    fifo = rig.folder / "fifo.gguf"
    os.mkfifo(fifo)
    (rig.folder / "escape.gguf").symlink_to(outside)
    (rig.folder / "notes.txt").write_text("root")
    probes = ["/etc/passwd", "/etc/shadow", "/proc/self/environ", str(outside), str(tmp_path / "none.gguf"),
              str(tmp_path), "../../../../etc/passwd", "notes.txt", str(fifo), "escape.gguf", "/dev/zero", "a\x00b"]
    messages = set()
    for probe in probes:
        for route in ("/admin/plan", "/admin/inspect"):
            started = time.monotonic()
            r = rig.client.get(route, params={"model": probe})
            assert r.status_code == 400 and time.monotonic() - started < REFUSED_WITHIN, (route, probe)
            message = r.json()["error"]["message"]
            assert "root" not in message.replace(probe, "") and "magic" not in message, message
            messages.add(message.replace(probe[:200], "PATH"))
        assert rig.client.post("/admin/load", json={"model": probe}).status_code == 400
    assert len(messages) == 1, messages  # one sentence for all: no oracle for what exists where
    assert rig.client.get("/admin/plan", params={"model": ensure_demo_model().name}).status_code == 200
    assert rig.client.get("/v1/models").status_code == 200  # nothing blocked on the FIFO


def test_a_keyed_server_has_no_admin_api_without_an_admin_key():
    host = ModelHost(backend="reference")
    app = create_app(host, "sk-inference")
    app.include_router(admin_router(host, FakeSource([]), LogRing(), ModelFolders([])))
    with TestClient(app, base_url="http://localhost") as client:
        r = client.post("/admin/load", json={}, headers={"Authorization": "Bearer sk-inference"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "admin_disabled"
    host.close()


@pytest.mark.parametrize("args, says", [
    (["--admin", "--api-key", "k"], "keyless loopback"),
    (["--admin", "--host", "0.0.0.0", "--api-key", "k"], "keyless loopback"),
    (["--admin-key", "same", "--api-key", "same"], "must differ"),
    (["--no-model"], "--no-model needs the admin API"),
    (["--max-body-mb", "0"], "must be positive"),
])
def test_serve_refuses_admin_setups_that_share_or_drop_a_key(capsys, args, says):
    assert main(["serve", *args]) == 2
    assert says in capsys.readouterr().err
