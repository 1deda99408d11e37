"""CORS allow-list (off by default) and the API key read from the OS keyring by `rigllm serve --use-keyring`."""

import argparse

import httpx
import keyring
import pytest
from keyring.backend import KeyringBackend

from engine.cli import main
from engine.commands.serve import api_key, register
from engine.errors import RigllmError
from engine.fixtures.demo_model import ensure_demo_model
from engine.gguf.loader import load_model
from engine.server.access import check_cors_origins
from api_fixtures import live_server, model_backend

ALLOWED = "http://localhost:3000"
KEY = "sk-cors-key"


@pytest.fixture(scope="module")
def loaded():
    return load_model(ensure_demo_model())


@pytest.fixture(scope="module")
def cors_server(loaded):
    with live_server(loaded, model_backend(loaded), api_key=KEY, cors_origins=[ALLOWED]) as live:
        yield live


@pytest.fixture(scope="module")
def plain_server(loaded):
    with live_server(loaded, model_backend(loaded)) as live:
        yield live


def preflight(server, origin):
    return httpx.options(f"{server.base_url}/chat/completions", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})


def test_allowed_origin_gets_cors_headers_even_before_auth(cors_server):
    r = preflight(cors_server, ALLOWED)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ALLOWED
    assert "authorization" in r.headers["access-control-allow-headers"].lower()
    denied = httpx.get(f"{cors_server.base_url}/models", headers={"Origin": ALLOWED})
    assert denied.status_code == 401 and denied.headers["access-control-allow-origin"] == ALLOWED
    ok = httpx.get(f"{cors_server.base_url}/models", headers={"Origin": ALLOWED, "Authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == ALLOWED


def test_other_origins_get_no_cors_headers(cors_server):
    assert "access-control-allow-origin" not in preflight(cors_server, "http://evil.example").headers
    r = httpx.get(f"{cors_server.base_url}/models", headers={"Origin": "http://evil.example",
                                                            "Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_no_cors_headers_without_an_allow_list(plain_server):
    r = httpx.get(f"{plain_server.base_url}/models", headers={"Origin": ALLOWED})
    assert r.status_code == 200 and not any(h.startswith("access-control-") for h in r.headers)
    assert not any(h.startswith("access-control-") for h in preflight(plain_server, ALLOWED).headers)


@pytest.mark.parametrize("origin", ["http://localhost:3000/", "localhost:3000", "http://a.b/path"])
def test_origins_with_paths_are_refused(origin):
    with pytest.raises(RigllmError, match="not an origin"):
        check_cors_origins([origin])
    assert check_cors_origins(["*", "https://x.example:8443", "tauri://localhost"])


class MemoryKeyring(KeyringBackend):
    """A keyring that lives in this process, so tests never touch the machine's real one."""

    priority = 1

    def __init__(self):
        super().__init__()
        self.store = {}

    def get_password(self, service, username):
        return self.store.get((service, username))

    def set_password(self, service, username, password):
        self.store[(service, username)] = password

    def delete_password(self, service, username):
        self.store.pop((service, username), None)


@pytest.fixture
def memory_keyring():
    previous = keyring.get_keyring()
    backend = MemoryKeyring()
    keyring.set_keyring(backend)
    yield backend
    keyring.set_keyring(previous)


def serve_args(*argv):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_key_comes_from_the_keyring(memory_keyring):
    memory_keyring.set_password("rigllm", "api-key", "sk-from-keyring")
    assert api_key(serve_args("--use-keyring", "--host", "0.0.0.0")) == "sk-from-keyring"
    assert api_key(serve_args("--api-key", "sk-given")) == "sk-given"
    assert api_key(serve_args()) is None  # loopback may run keyless; the keyring is read only when asked


def test_missing_keyring_entry_is_a_one_line_error(memory_keyring, capsys):
    memory_keyring.set_password("other", "api-key", "not-ours")
    assert main(["serve", "--use-keyring"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no API key in the keyring" in err and "keyring set rigllm api-key" in err


def test_api_key_and_keyring_are_exclusive():
    with pytest.raises(SystemExit):
        serve_args("--api-key", "k", "--use-keyring")
