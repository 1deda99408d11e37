"""The OpenAI-compatible API inside the desktop app: `rigllm serve`'s FastAPI app on uvicorn in a
background thread, serving the app's loaded model (`FixedModel`: the app's generation worker stays
the one owner of the backend for both).

The API key comes from app.api_key (the OS keyring under the service/user `rigllm serve
--use-keyring` reads, a private file the user chose, or the session). Clients are counted by a thin
ASGI wrapper around the app: the engine's app stays unchanged.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from engine.errors import RigllmError

from app.chat_engine import ChatEngine

CLIENT_WINDOW = 60.0  # a client counts as connected for this long after its last request


class _ClientCounter:
    """ASGI middleware: records each HTTP client's address and time, and requests in flight."""

    def __init__(self, app: Any):
        self.app = app
        self.seen: dict[str, float] = {}
        self.in_flight = 0
        self._lock = threading.Lock()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        host = (scope.get("client") or ("?", 0))[0]
        with self._lock:
            self.seen[host] = time.monotonic()
            self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            with self._lock:
                self.in_flight -= 1
                self.seen[host] = time.monotonic()

    def recent(self) -> list[str]:
        now = time.monotonic()
        with self._lock:
            return sorted(h for h, t in self.seen.items() if now - t < CLIENT_WINDOW)


class ApiServer:
    def __init__(self, engine: ChatEngine, api_key: str, host: str = "127.0.0.1", port: int = 8765):
        # FastAPI and uvicorn load when the API is switched on, not with the window
        import uvicorn

        from engine.server.app import FixedModel, create_app
        from engine.server.http_policy import HttpPolicy

        self.host, self.port = host, port
        # The OpenAI routes only (no admin API: the app itself is the model's owner), always with a key.
        app = create_app(FixedModel(engine.service, engine.worker, engine.info.label),
                         policy=HttpPolicy(api_key=api_key, bind_host=host))
        self.clients = _ClientCounter(app)
        self._server = uvicorn.Server(uvicorn.Config(self.clients, host=host, port=port, log_level="warning"))
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://{'127.0.0.1' if self.host == '0.0.0.0' else self.host}:{self.port}/v1"

    def start(self, timeout: float = 20) -> None:
        """Bind now (so a port in use is reported here, not in a log) and serve on a thread."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as err:
            sock.close()
            raise RigllmError(f"cannot listen on {self.host}:{self.port}: {err.strerror}") from None
        self.port = sock.getsockname()[1]
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name="rigllm-api", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RigllmError("the API server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
