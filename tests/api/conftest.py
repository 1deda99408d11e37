"""The fixtures most API test modules share: the demo model and a live server on it, one per module
(a module that needs another server, e.g. a scripted backend, defines its own `server`)."""

import pytest

from engine.fixtures.demo_model import ensure_demo_model
from engine.gguf.loader import load_model
from api_fixtures import live_server, model_backend


@pytest.fixture(scope="module")
def loaded():
    return load_model(ensure_demo_model())


@pytest.fixture(scope="module")
def server(loaded):
    with live_server(loaded, model_backend(loaded)) as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return server.client()
