"""Talking to a headless rig (`rigllm serve` on another machine) over its admin and OpenAI APIs.

A `RigLink` is where the rig is and the key it wants; the key is kept (app.key_store) in the OS
keyring under service "rigllm", user "rig-key:HOST:PORT", or in a private file the user chose, so
each rig has its own and none is written in the settings file. `RigClient` is a thin, blocking httpx client: the Qt objects that use it call it from
their own threads, never from the GUI thread. Every failure becomes a one-line `RigllmError` with the
server's own error text, which the app shows as it shows a local engine's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import Any

import httpx

from engine.errors import RigllmError
from engine.model.model_footprint import Footprint
from engine.server.admin_footprint import footprint_from_json
from engine.telemetry import CardSample, RigSnapshot

from app.key_store import KeyStore

# Short, so a rig that stops answering is reported (and a disconnect waits) seconds, not minutes; calls
# that legitimately take long say so (`SLOW`): an unload waits for running requests, and a chat stream
# sends nothing for minutes while a long prompt is prefilled.
TIMEOUT = httpx.Timeout(5.0)
SLOW = httpx.Timeout(5.0, read=600.0)
_CARD_FIELDS = tuple(f.name for f in fields(CardSample))


@dataclass(frozen=True)
class RigLink:
    host: str
    port: int
    key: str

    @property
    def name(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 address
        return f"http://{host}:{self.port}"

    def client(self) -> "RigClient":
        return RigClient(self)


def auth_headers(key: str) -> dict[str, str]:
    """The Authorization header for `key`; none for an empty key (a keyless `rigllm serve` wants none, and
    "Bearer " with nothing after it is not a legal header value)."""
    return {"Authorization": f"Bearer {key}"} if key else {}


def keyring_user(host: str, port: int) -> str:
    return f"rig-key:{host}:{port}"


def rig_key_store(host: str, port: int) -> KeyStore:
    """Where this rig's key is kept (the keyring's user name, or its private file)."""
    return KeyStore(keyring_user(host, port))


def error_text(response: httpx.Response) -> str:
    """The server's OpenAI-shaped error message, or the HTTP status when the body has none."""
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text.strip()[:200] or response.reason_phrase
    return f"the rig answered {response.status_code}: {message}"


class RigClient:
    """Blocking calls to one rig; one instance per thread that uses it."""

    def __init__(self, link: RigLink):
        self.link = link
        self.http = httpx.Client(base_url=link.base_url, headers=auth_headers(link.key), timeout=TIMEOUT)

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as err:
            raise RigllmError(f"cannot reach the rig at {self.link.name}: {err or type(err).__name__}") from None
        if response.status_code >= 400:
            raise RigllmError(error_text(response))
        return response.json()

    def load_status(self) -> dict[str, Any]:
        return self.request("GET", "/admin/load")

    def inspect(self, model: str | None) -> tuple[str, str, Footprint]:
        """(path on the rig, model name, footprint) of `model` (None: the rig's demo model)."""
        body = self.request("GET", "/admin/inspect", params={} if model is None else {"model": model}, timeout=SLOW)
        return body["path"], body["name"], footprint_from_json(body["footprint"])

    def start_load(self, model: str | None, context: int | None, backend: str) -> dict[str, Any]:
        body: dict[str, Any] = {"backend": backend}
        if model is not None:
            body["model"] = model
        if context is not None:
            body["context"] = context
        return self.request("POST", "/admin/load", json=body)

    def cancel_load(self) -> dict[str, Any]:
        return self.request("POST", "/admin/load/cancel")

    def unload(self) -> dict[str, Any]:
        """Returns once the rig's running requests have finished and its cards are free."""
        return self.request("POST", "/admin/unload", timeout=SLOW)

    def models(self) -> dict[str, Any]:
        """The rig's models folder (`GET /admin/models`)."""
        return self.request("GET", "/admin/models")

    def pull_model(self, repo: str, file: str | None = None, quant: str | None = None) -> dict[str, Any]:
        """Start pulling `repo` from the Hub onto the rig; poll `pull_status` for bytes, MB/s and ETA."""
        body: dict[str, Any] = {"repo": repo}
        if file is not None:
            body["file"] = file
        if quant is not None:
            body["quant"] = quant
        return self.request("POST", "/admin/models/pull", json=body)

    def pull_status(self) -> dict[str, Any]:
        return self.request("GET", "/admin/models/pull")

    def cancel_pull(self) -> dict[str, Any]:
        return self.request("POST", "/admin/models/pull/cancel")

    def snapshot(self) -> RigSnapshot:
        """The rig's cards as the local monitor's snapshots (the time is this machine's clock)."""
        body = self.request("GET", "/admin/cards")
        cards = tuple(CardSample(**{k: c[k] for k in _CARD_FIELDS}) for c in body["cards"])
        return RigSnapshot(cards, time.monotonic(), body["error"], tuple(body["warnings"]))
