"""A client that leaves mid-stream stops its generation at the next token, freeing its slot (one slot here)."""

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from engine.fixtures.demo_model import ensure_demo_model
from engine.gguf.loader import load_model
from engine.generation.serving.model_service import ModelService
from api_fixtures import ScriptedBackend, live_server

STEP_SECONDS = 0.01  # 2000 tokens would take 20 s if the stream were not stopped
HELLO = [{"role": "user", "content": "Hello"}]
OFF = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def server():
    loaded = load_model(ensure_demo_model())
    tokenizer = ModelService.from_loaded(loaded).tokenizer
    endless = tokenizer.encode("la la la")  # the last token repeats: never an end token
    backend = lambda: ScriptedBackend(loaded.config, tokenizer.vocab_size, lambda _: endless, STEP_SECONDS)  # noqa: E731
    with live_server(loaded, backend, max_queue=2, slots=1) as live:
        yield live


def test_client_disconnect_frees_the_worker(server):
    client = server.client()
    root = server.base_url.removesuffix("/v1")
    stream = client.chat.completions.create(model=server.model_id, messages=HELLO, max_tokens=2000, stream=True,
                                            extra_body=OFF)
    for _, _chunk in zip(range(5), stream):
        pass
    assert httpx.get(f"{root}/health").json()["busy"]
    stream.close()
    deadline = time.monotonic() + 3
    while httpx.get(f"{root}/health").json()["busy"]:
        assert time.monotonic() < deadline, "the worker kept generating for a client that left"
        time.sleep(0.02)
    r = client.chat.completions.create(model=server.model_id, messages=HELLO, max_tokens=3, extra_body=OFF)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3


def test_full_queue_is_503_and_leaves_the_running_stream_alone(server):
    """The fixture's queue holds 2: one running stream + two waiting requests fill it; the next gets 503."""
    client = server.client()
    running = client.chat.completions.create(model=server.model_id, messages=HELLO, max_tokens=2000, stream=True,
                                             extra_body=OFF)
    next(iter(running))
    with ThreadPoolExecutor(max_workers=2) as pool:
        waiting = [pool.submit(client.chat.completions.create, model=server.model_id, messages=HELLO, max_tokens=2,
                               extra_body=OFF) for _ in range(2)]
        root = server.base_url.removesuffix("/v1")
        deadline = time.monotonic() + 5
        while httpx.get(f"{root}/health").json()["queued"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(model=server.model_id, messages=HELLO, max_tokens=2, extra_body=OFF)
        assert info.value.status_code == 503 and info.value.body["code"] == "queue_full"
        running.close()
        assert [f.result(timeout=10).usage.completion_tokens for f in waiting] == [2, 2]
