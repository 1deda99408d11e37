"""A live `rigllm serve` app in-process: uvicorn in a thread on a free loopback port, one worker.

The backend factory is a parameter so tool-call tests can drive the real server with a scripted
backend; everything else (template, tokenizer, parser, wire format) is the product code.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import openai
import uvicorn

from engine.backends import open_backend

from engine.generation.backend import Backend
from engine.gguf.loader import LoadedModel
from engine.server.admin_host import ModelHost
from engine.server.app import create_app
from engine.generation.serving.model_service import ModelService
from engine.generation.serving.request_limits import RequestLimits
from engine.generation.serving.worker import DEFAULT_SLOTS
from engine.server.http_policy import HttpPolicy
from engine.telemetry import TelemetrySource


@dataclass(frozen=True)
class LiveServer:
    base_url: str  # ends in /v1
    model_id: str
    service: ModelService
    host: ModelHost | None = None  # the model host the app serves from (its worker: `host.require()[1]`)

    @property
    def root(self) -> str:
        """The server's address without `/v1`."""
        return self.base_url.removesuffix("/v1")

    def client(self, api_key: str = "noop") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key=api_key, max_retries=0, timeout=60)


TEST_BACKEND = os.environ.get("RIGLLM_TEST_BACKEND", "reference")


def model_backend(loaded: LoadedModel, context: int | None = None) -> Callable[[], Backend]:
    """The backend the API tests run on: the reference (CI), or the GPU with RIGLLM_TEST_BACKEND=cuda."""
    return lambda: open_backend(TEST_BACKEND, loaded, context=context, slots=DEFAULT_SLOTS)


@contextmanager
def live_server(loaded: LoadedModel, open_backend: Callable[[], Backend],
                api_key: str | None = None, max_queue: int = 16,
                cors_origins: Sequence[str] = (), context_length: int | None = None,
                slots: int = DEFAULT_SLOTS, policy: HttpPolicy | None = None,
                limits: RequestLimits = RequestLimits(), telemetry: TelemetrySource | None = None,
                public_metrics: bool = False, reasoning_format: str = "deepseek") -> Iterator[LiveServer]:
    """`context_length` below the model's keeps fuzzed requests short (generation stops at the context).

    The app serves from a `ModelHost`, as `rigllm serve` does; `open_backend` replaces its backend opener;
    `policy` and `limits` replace the HTTP policy and the request limits.
    """
    host = ModelHost(max_queue=max_queue, opener=lambda _name, _loaded, _context, _slots, _progress, _mmproj: open_backend(),
                     slots=slots, limits=limits)
    host.load(loaded.path, context=context_length)
    service, _ = host.require()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(host, api_key, cors_origins=cors_origins, policy=policy,
                                                      telemetry=telemetry, public_metrics=public_metrics,
                                                      reasoning_format=reasoning_format),
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield LiveServer(f"http://127.0.0.1:{port}/v1", service.model_id, service, host)
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        sock.close()
        host.close()


class ScriptedBackend:
    """Logits that force a scripted continuation; `script_for(prompt_ids)` picks it per request.

    The script's last token repeats once it runs out; `delay` seconds per call make a slow model.
    """

    name = "scripted"
    prefill_chunk = 1 << 30  # a prompt arrives in one call, so the script starts right after it

    def __init__(self, config, vocab_size: int, script_for: Callable[[Sequence[int]], list[int]],
                 delay: float = 0.0):
        self.config = config
        self._vocab_size = vocab_size
        self._script_for = script_for
        self._delay = delay

    def new_sequence(self) -> dict:
        return {"script": None, "step": 0}

    def forward_last(self, token_ids: Sequence[int], sequence: dict) -> np.ndarray:
        if sequence["script"] is None:
            sequence["script"] = self._script_for(token_ids)
        script = sequence["script"]
        time.sleep(self._delay)
        logits = np.full(self._vocab_size, -1e9, dtype=np.float32)
        logits[script[min(sequence["step"], len(script) - 1)]] = 0.0
        sequence["step"] += 1
        return logits

    def close(self) -> None:
        """Nothing to release."""
