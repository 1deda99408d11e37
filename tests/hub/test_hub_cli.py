"""`rigllm models search|files|list|rm` and `rigllm pull` against the loopback Hub, and the admin API's
pull onto a rig (the app's RigClient calls), all on loopback."""

from __future__ import annotations

import time

import pytest

from hub_server import TRAINED

from engine.cli import main
from engine.hub.library import Library

REPO = "rigtest/Qwen3.5-Fixture-GGUF"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_search_files_pull_list_and_rm(hub, capsys, tmp_path):
    code, out, _ = run(capsys, "models", "search", "Qwen3.5")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("runs  rigtest/Qwen3.5-Fixture-GGUF") and "MoE" in lines[-1] and lines[-1].startswith("no ")

    code, out, _ = run(capsys, "models", "files", REPO, "--cards", "3", "--context", "32768")
    assert code == 0 and "priced on 3 × 16 GB (--cards)" in out
    assert any("Qwen3.5-Fixture-Q8_0.gguf" in line and "fits 1 card at 32K" in line for line in out.splitlines())
    assert any("Q4_K_M" in line and "not runnable" in line for line in out.splitlines())

    models = tmp_path / "models"
    code, out, err = run(capsys, "pull", REPO, "--quant", "f32", "--models-dir", str(models))
    assert code == 0 and "sha256 verified" in err
    pulled = models / REPO / "Qwen3.5-Fixture-F32.gguf"
    assert out.strip() == str(pulled) and pulled.read_bytes() == (TRAINED / "fixture-f32.gguf").read_bytes()

    code, out, _ = run(capsys, "models", "list", "--models-dir", str(models))
    assert code == 0 and f"{REPO}/Qwen3.5-Fixture-F32.gguf" in out and "F32" in out and "never" in out
    code, out, _ = run(capsys, "models", "rm", "Qwen3.5-Fixture-F32.gguf", "--models-dir", str(models))
    assert code == 0 and f"deleted {pulled}" in out and not pulled.exists()
    code, out, _ = run(capsys, "models", "list", "--models-dir", str(models))
    assert "no models in" in out


def test_cli_errors_are_one_line(hub, capsys, tmp_path, monkeypatch):
    code, _, err = run(capsys, "pull", REPO, "--file", "nope.gguf", "--models-dir", str(tmp_path))
    assert code == 2 and err.startswith("rigllm: error: rigtest/Qwen3.5-Fixture-GGUF has no file nope.gguf")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nobody answers on loopback
    code, _, err = run(capsys, "models", "search", "Qwen3.5")
    assert code == 2 and "Hub is unreachable" in err and len(err.splitlines()) == 1
    code, out, _ = run(capsys, "models", "list", "--models-dir", str(tmp_path))  # the library needs no network
    assert code == 0


def test_the_admin_api_pulls_onto_the_rig(hub, tmp_path):
    """What the app's "Connect to rig" calls (app.rig_client.RigClient), against the router `rigllm serve` mounts."""
    fastapi = pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from app.rig_client import RigClient, RigLink
    from engine.server.admin_models import models_router

    app = fastapi.FastAPI()
    app.include_router(models_router(Library(tmp_path / "rig-models")))
    rig = RigClient(RigLink("127.0.0.1", 8000, "key"))
    rig.http = TestClient(app)  # an httpx.Client that calls the app in-process

    def wait() -> dict:
        deadline = time.monotonic() + 60
        while (state := rig.pull_status())["state"] == "pulling":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        return state

    assert rig.pull_model(REPO, quant="Q8_0")["state"] == "pulling"
    state = wait()
    assert state["state"] == "done" and state["done_bytes"] == state["total_bytes"] > 0
    assert rig.models()["models"][0]["name"] == f"{REPO}/Qwen3.5-Fixture-Q8_0.gguf"
    rig.pull_model(REPO, quant="Q2_K")
    state = wait()
    assert state["state"] == "failed" and "no single-file Q2_K" in state["error"]
