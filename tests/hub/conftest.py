"""The loopback Hub the tests of engine.hub talk to, with the trained fixture and the tiny vision model."""

from __future__ import annotations

import pytest

from hub_server import FakeHub, fixture_repos, serve, tiny_vision_files

from engine.hub.library import Library
from engine.hub.session import HubAccess


@pytest.fixture(scope="session")
def vision_files(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    return tiny_vision_files(tmp_path_factory.mktemp("hub-vision"))


@pytest.fixture
def hub(vision_files, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no login token of this machine's
    monkeypatch.delenv("HF_TOKEN", raising=False)
    for var in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    with serve(fixture_repos(vision_files)) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        yield server


@pytest.fixture
def access(hub: FakeHub) -> HubAccess:
    return HubAccess(hub.endpoint)


@pytest.fixture
def library(tmp_path) -> Library:
    return Library(tmp_path / "models")
