"""The /admin API mounted in create_app (its own admin key), driving a ModelHost on the demo model and the reference backend."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from engine.cli import main
from engine.commands.serve import stop_requests
from engine.errors import RigllmError
from engine.backends import open_backend
from engine.model.load_progress import LoadProgress
from engine.fixtures.demo_model import ensure_demo_model
from engine.model.model_footprint import footprint_of
from engine.gguf.loader import load_model
from engine.server.admin import admin_router
from engine.server.admin_footprint import footprint_from_json
from engine.server.admin_host import DEMO_LABEL, ModelHost
from engine.server.admin_logs import LogRing, install_log_ring, remove_log_ring
from engine.server.app import create_app
from engine.server.http_policy import HttpPolicy
from engine.server.model_folders import ModelFolders
from engine.telemetry import FakeSource, cmp_100_210

KEY = "sk-admin"
AUTH = {"Authorization": f"Bearer {KEY}"}
API_KEY = "sk-inference"


def reporting_opener(gate: threading.Event):
    """Opens the reference backend after reporting two cards' upload progress (as the CUDA backend does);
    waits for `gate` halfway."""

    def opener(name, loaded, context, slots, progress, mmproj):
        for card in (0, 1):
            progress(LoadProgress(card, "uploading weights", 50, 100, 0.5))
        assert gate.wait(20)
        for card in (0, 1):
            progress(LoadProgress(card, "ready", 100, 100, 1.0))
        return open_backend("reference", loaded, context=context, slots=slots)

    return opener


@pytest.fixture
def rig(tmp_path):
    """A host with the demo model loaded, and a TestClient on create_app + the admin router (model
    folders: the demo model's and `tmp_path`)."""
    ring = install_log_ring(capacity=100)
    gate = threading.Event()
    gate.set()
    host = ModelHost(backend="reference", opener=reporting_opener(gate))
    host.load(ensure_demo_model(), label="demo")
    app = create_app(host, policy=HttpPolicy(api_key=API_KEY, admin_key=KEY))
    folders = ModelFolders([ensure_demo_model().parent, tmp_path])
    app.include_router(admin_router(host, FakeSource([cmp_100_210(0), cmp_100_210(1)]), ring, folders))
    with TestClient(app) as client:
        yield SimpleNamespace(client=client, host=host, gate=gate)
    host.close()
    remove_log_ring(ring)


def wait_for(client, state: str) -> dict:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status = client.get("/admin/load", headers=AUTH).json()
        if status["state"] == state:
            return status
        time.sleep(0.02)
    raise AssertionError(f"load state never became {state}: {status}")


def test_admin_routes_need_the_admin_key_not_the_api_key(rig):
    inference = {"Authorization": f"Bearer {API_KEY}"}
    for path in ("/admin/load", "/admin/cards", "/admin/logs", "/admin/plan"):
        for headers in ({}, inference):
            r = rig.client.get(path, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_admin_key", path
    assert rig.client.post("/admin/unload").status_code == 401
    assert rig.client.post("/admin/unload", headers=inference).status_code == 401
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for headers in (inference, AUTH):  # the admin key also works for the OpenAI routes (one key per rig)
        assert rig.client.post("/v1/chat/completions", json=chat, headers=headers).status_code == 200
    assert rig.host.current is not None  # the refused unload did nothing


def test_plan_is_rigllm_info_verdict(rig, capsys):
    path = str(ensure_demo_model())
    r = rig.client.get("/admin/plan", params={"model": path, "context": 2048, "kv": "f16"}, headers=AUTH)
    assert r.status_code == 200
    assert main(["info", path, "--json", "--context", "2048", "--kv", "f16"]) == 0
    assert r.json() == json.loads(capsys.readouterr().out)
    assert r.json()["plans"][0]["fits"] is True
    loaded = rig.client.get("/admin/plan", headers=AUTH).json()  # no model: the loaded one
    assert loaded["file"] == path and loaded["plan_settings"]["kv_format"] == "k8v3"
    bad = rig.client.get("/admin/plan", params={"kv": "k9v9"}, headers=AUTH)
    assert bad.status_code == 400 and "k9v9" in bad.json()["error"]["message"]


def test_load_reports_progress_and_replaces_the_model(rig):
    first = rig.client.get("/admin/load", headers=AUTH).json()
    assert first["state"] == "loaded" and first["backend"] == "reference" and first["label"] == "demo"
    assert first["cards"] == [{"card": 0, "stage": "ready", "done_bytes": 100, "total_bytes": 100, "bytes_per_s": 100,
                               "eta_s": 0.0},
                              {"card": 1, "stage": "ready", "done_bytes": 100, "total_bytes": 100, "bytes_per_s": 100,
                               "eta_s": 0.0}]
    rig.gate.clear()  # hold the next load halfway through its upload
    r = rig.client.post("/admin/load", json={"model": str(ensure_demo_model()), "context": 512}, headers=AUTH)
    assert r.status_code == 202
    deadline = time.monotonic() + 30
    while (status := rig.client.get("/admin/load", headers=AUTH).json())["done_bytes"] != 100:
        assert time.monotonic() < deadline, status
        time.sleep(0.02)
    assert status["state"] == "loading" and status["total_bytes"] == 200 and status["model"] is None
    assert status["cards"][0]["eta_s"] == 0.5  # 50 bytes left at 100 B/s
    busy = rig.client.post("/admin/load", json={"model": str(ensure_demo_model())}, headers=AUTH)
    assert busy.status_code == 409
    rig.gate.set()
    done = wait_for(rig.client, "loaded")
    assert done["context"] == 512 and done["done_bytes"] == 200 and done["error"] is None
    records = rig.client.get("/admin/logs", params={"n": 50}, headers=AUTH).json()["records"]
    assert any("loaded rigllm-demo-random-q8_0 on the reference backend (context 512)" in r["message"] for r in records)
    assert [r["seq"] for r in records] == sorted(r["seq"] for r in records)


def test_unload_frees_the_model_and_bad_loads_are_reported(rig, tmp_path):
    r = rig.client.post("/admin/unload", headers=AUTH)
    assert r.status_code == 200 and r.json()["unloaded"] is True and r.json()["state"] == "empty"
    assert rig.host.current is None
    assert rig.client.post("/admin/unload", headers=AUTH).json()["unloaded"] is False
    missing = rig.client.post("/admin/load", json={"model": str(tmp_path / "nope.gguf")}, headers=AUTH)
    assert missing.status_code == 400 and "not a .gguf file in the server's model folders" in missing.json()["error"]["message"]
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 10)
    assert rig.client.post("/admin/load", json={"model": str(bad)}, headers=AUTH).status_code == 202
    failed = wait_for(rig.client, "failed")
    assert "bad.gguf" in failed["error"] and failed["model"] is None
    errors = rig.client.get("/admin/logs", params={"level": "ERROR"}, headers=AUTH).json()["records"]
    assert errors and all(r["level"] == "ERROR" for r in errors)
    wrong = rig.client.post("/admin/load", json={"model": str(bad), "backend": "tpu"}, headers=AUTH)
    assert wrong.status_code == 400


def test_cards_are_the_telemetry_snapshot(rig):
    body = rig.client.get("/admin/cards", headers=AUTH).json()
    assert body["error"] is None and [c["pci_bus_id"] for c in body["cards"]] == ["00000000:03:00.0", "00000000:04:00.0"]
    card = body["cards"][0]
    assert card["name"] == "NVIDIA CMP 100-210" and card["pcie_generation"] == 1 and card["pcie_width"] == 1
    assert card["memory_free"] == card["memory_total"] - card["memory_used"]
    assert rig.client.get("/admin/logs", params={"n": 0}, headers=AUTH).status_code == 400
    assert rig.client.get("/admin/logs", params={"level": "LOUD"}, headers=AUTH).status_code == 400


def test_a_load_can_be_cancelled_midway(rig):
    rig.gate.clear()
    assert rig.client.post("/admin/load/cancel", headers=AUTH).json()["cancelled"] is False  # nothing loading
    rig.client.post("/admin/load", json={"model": str(ensure_demo_model())}, headers=AUTH)
    deadline = time.monotonic() + 30
    while rig.client.get("/admin/load", headers=AUTH).json()["done_bytes"] != 100:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    r = rig.client.post("/admin/load/cancel", headers=AUTH).json()
    assert r["cancelled"] is True and r["stage"] == "cancelling"
    rig.gate.set()
    failed = wait_for(rig.client, "failed")
    assert failed["error"] == "the load was cancelled" and rig.host.current is None


def test_the_log_ring_keeps_only_the_newest_records():
    ring = LogRing(capacity=3)
    logger = logging.getLogger("rigllm.test-ring")
    logger.addHandler(ring)
    logger.setLevel(logging.INFO)
    try:
        for i in range(5):
            logger.info("record %d", i)
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("it failed")
    finally:
        logger.removeHandler(ring)
    records = ring.recent(10)
    assert [r["message"].splitlines()[0] for r in records] == ["record 3", "record 4", "it failed"]
    assert "ValueError: boom" in records[-1]["message"] and records[-1]["level"] == "ERROR"
    assert ring.recent(1, logging.ERROR) == records[-1:]


def test_chat_follows_the_loaded_model(rig):
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    r = rig.client.post("/v1/chat/completions", json=chat, headers=AUTH)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 3
    assert rig.client.post("/admin/unload", headers=AUTH).json()["state"] == "empty"
    gone = rig.client.post("/v1/chat/completions", json=chat, headers=AUTH)
    assert gone.status_code == 503 and gone.json()["error"]["code"] == "model_not_loaded"
    assert rig.client.post("/v1/tokenize", json={"content": "hi"}, headers=AUTH).status_code == 503
    assert rig.client.get("/v1/models", headers=AUTH).json()["data"] == []
    empty = rig.client.get("/health")
    assert empty.status_code == 503 and empty.json()["status"] == "no_model"
    rig.client.post("/admin/load", json={"context": 256}, headers=AUTH)  # no model: the demo model
    done = wait_for(rig.client, "loaded")
    assert done["label"] == DEMO_LABEL and done["path"] == str(ensure_demo_model())
    assert rig.client.post("/v1/chat/completions", json=chat, headers=AUTH).status_code == 200
    health = rig.client.get("/health").json()
    assert health["context_length"] == 256 and health["label"] == DEMO_LABEL


def test_health_is_503_while_a_model_loads_and_after_it_unloads(rig):
    """A router must not send requests to a rig that has no model to run them (issue 32)."""
    serving = rig.client.get("/health")
    assert serving.status_code == 200 and serving.json()["status"] == "ok" and serving.json()["label"] == "demo"
    rig.gate.clear()  # the replacement's opener waits: the old model is released, the new one not yet open
    assert rig.client.post("/admin/load", json={"context": 256}, headers=AUTH).status_code == 202
    deadline = time.monotonic() + 30
    while (loading := rig.client.get("/health")).json()["status"] != "loading":
        assert time.monotonic() < deadline, loading.json()
        time.sleep(0.02)
    assert loading.status_code == 503 and loading.json()["model"] is None and loading.json()["reason"]
    rig.gate.set()
    wait_for(rig.client, "loaded")
    assert rig.client.get("/health").status_code == 200
    rig.client.post("/admin/unload", headers=AUTH)
    gone = rig.client.get("/health")
    assert gone.status_code == 503 and gone.json()["status"] == "no_model"


def test_inspect_sends_the_footprint_the_app_plans_with(rig, tmp_path):
    r = rig.client.get("/admin/inspect", headers=AUTH)  # no model: the demo model
    assert r.status_code == 200 and r.json()["demo"] is True and r.json()["path"] == str(ensure_demo_model())
    assert footprint_from_json(r.json()["footprint"]) == footprint_of(load_model(ensure_demo_model()))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 10)
    refused = rig.client.get("/admin/inspect", params={"model": str(bad)}, headers=AUTH)
    assert refused.status_code == 400 and "bad.gguf" in refused.json()["error"]["message"]


def test_a_stop_signal_during_the_startup_load_cancels_it():
    """`rigllm serve`'s preload under `stop_requests`: SIGTERM mid-load cancels it and frees the backend,
    and the process's handlers are back as they were afterwards."""
    gate = threading.Event()
    host = ModelHost(backend="reference", opener=reporting_opener(gate))
    stopping = threading.Event()

    def stop_midway() -> None:
        deadline = time.monotonic() + 30
        while host.status()["done_bytes"] != 100 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)
        stopping.wait(30)  # the handler ran (on the main thread) before the load may go on
        gate.set()

    before = signal.getsignal(signal.SIGTERM)
    threading.Thread(target=stop_midway, daemon=True).start()
    with stop_requests(stopping, host.cancel_load):
        with pytest.raises(RigllmError, match="cancelled"):
            host.load(ensure_demo_model())
    assert stopping.is_set() and host.current is None and host.status()["state"] == "failed"
    assert signal.getsignal(signal.SIGTERM) is before
    host.close()


def test_the_systemd_unit_uses_only_options_rigllm_serve_knows():
    import argparse
    import re
    from pathlib import Path

    from engine.commands import serve

    unit = (Path(__file__).resolve().parents[2] / "packaging" / "systemd" / "rigllm.service").read_text()
    command = re.search(r"^ExecStart=((?:.*\\\n)*.*)$", unit, re.MULTILINE).group(1)
    parser = argparse.ArgumentParser()
    serve.register(parser.add_subparsers())
    known = parser._subparsers._group_actions[0].choices["serve"]._option_string_actions
    used = re.findall(r"(?<!\S)(--[a-z-]+)", command)
    assert {"--api-key-file", "--shutdown-timeout", "--backend"} <= set(used)
    assert [option for option in used if option not in known] == []
