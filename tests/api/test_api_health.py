"""`/health` answers a router can act on (issue 32): 503 while the queue is full and once the generation
thread has died, 200 with the load otherwise. (Loading and unloaded: tests/api/test_admin.py.)"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from engine.fixtures.demo_model import ensure_demo_model
from engine.gguf.loader import load_model
from engine.generation.serving.model_service import ModelService
from api_fixtures import ScriptedBackend, live_server

STEP_SECONDS = 0.01
HELLO = [{"role": "user", "content": "Hello"}]
FATAL_PROMPT = "take the generation thread down"
OFF = {"chat_template_kwargs": {"enable_thinking": False}}


class GenerationThreadKilled(BaseException):
    """Escapes the scheduler's `except Exception` guards, as a fault that kills its thread would."""


@pytest.fixture
def setup():
    loaded = load_model(ensure_demo_model())
    return loaded, ModelService.from_loaded(loaded).tokenizer


def health(server) -> httpx.Response:
    return httpx.get(f"{server.base_url.removesuffix('/v1')}/health", timeout=5)


def wait_health(server, status: str) -> httpx.Response:
    deadline = time.monotonic() + 10
    while (answer := health(server)).json()["status"] != status:
        assert time.monotonic() < deadline, answer.json()
        time.sleep(0.02)
    return answer


def test_a_full_queue_is_503_until_it_drains(setup):
    loaded, tokenizer = setup
    endless = tokenizer.encode("la la la")
    backend = lambda: ScriptedBackend(loaded.config, tokenizer.vocab_size, lambda _: endless, STEP_SECONDS)  # noqa: E731
    with live_server(loaded, backend, max_queue=1, slots=1) as server:
        idle = health(server)
        assert idle.status_code == 200 and idle.json()["queued"] == 0 and idle.json()["queue_limit"] == 1
        client = server.client()
        running = client.chat.completions.create(model=server.model_id, messages=HELLO, max_tokens=2000, stream=True,
                                                 extra_body=OFF)
        next(iter(running))
        with ThreadPoolExecutor(max_workers=1) as pool:
            waiting = pool.submit(client.chat.completions.create, model=server.model_id, messages=HELLO, max_tokens=2,
                                  extra_body=OFF)
            full = wait_health(server, "queue_full")
            assert full.status_code == 503 and full.json()["queued"] == 1 and full.json()["active"] == 1
            running.close()
            assert waiting.result(timeout=10).usage.completion_tokens == 2
        assert wait_health(server, "ok").status_code == 200


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_generation_thread_is_503(setup):
    loaded, tokenizer = setup
    fatal = tokenizer.encode(FATAL_PROMPT)

    def script_for(prompt_ids):
        if any(prompt_ids[i:i + len(fatal)] == fatal for i in range(len(prompt_ids))):
            raise GenerationThreadKilled()
        return tokenizer.encode("fine")

    backend = lambda: ScriptedBackend(loaded.config, tokenizer.vocab_size, script_for)  # noqa: E731
    with live_server(loaded, backend, slots=1) as server:
        assert health(server).status_code == 200
        doomed = server.client().chat.completions.create(
            model=server.model_id, messages=[{"role": "user", "content": FATAL_PROMPT}], max_tokens=2, stream=True,
            extra_body=OFF)
        next(iter(doomed))  # the role chunk: the job is queued; its prefill kills the thread
        dead = wait_health(server, "worker_failed")
        doomed.close()  # nothing will answer it; leaving ends it on the server too
        assert dead.status_code == 503 and dead.json()["model"] == server.model_id and dead.json()["reason"]
