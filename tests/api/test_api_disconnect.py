"""Clients that leave (issue 24, finding 4): one that leaves mid-stream, times out on a whole response or
stops reading a stream stops its generation at once, freeing its slot (one slot here)."""

import asyncio
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from engine.fixtures.demo_model import ensure_demo_model
from engine.gguf.loader import load_model
from engine.generation.serving.model_service import ModelService
from engine.server.admin_host import ModelHost
from engine.server.app import create_app
from engine.server.http_policy import HttpPolicy
from engine.server.request_jobs import chat_job
from engine.server.wire import ChatCompletionRequest
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


def test_abandoned_whole_responses_stop_generating_at_once(server):
    """Clients that time out on non-streamed requests (finding 4: before, each kept its slot to max_tokens,
    20 s here): their jobs are cancelled on disconnect, so the next request is answered promptly."""
    body = {"messages": HELLO, "max_tokens": 2000, **OFF}
    for _ in range(3):  # fills the slot and the queue
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{server.root}/v1/chat/completions", json=body, timeout=0.5)
    started = time.monotonic()
    r = httpx.post(f"{server.root}/v1/chat/completions", json={**body, "max_tokens": 2}, timeout=10)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    assert time.monotonic() - started < 2


STALLED_BODIES = {  # every streaming route: /v1/responses once made its sink without the stall policy
    "/v1/chat/completions": {"messages": HELLO, "stream": True, "max_tokens": 2000, **OFF},
    "/v1/responses": {"input": "Hello", "stream": True, "max_output_tokens": 2000, "reasoning": {"effort": "none"}},
}


@pytest.mark.parametrize("path", list(STALLED_BODIES))
def test_a_stream_reader_that_stalls_is_dropped_and_its_slot_freed(path):
    """A client that asks for a stream and stops reading: once the server's sends block (its socket
    buffers are full; here the ASGI `send` blocks after two chunks, which is what that looks like
    to the app) and the reply's oldest unread event has waited `stall_seconds`, the request is
    dropped, its job cancelled and the slot free again."""
    loaded = load_model(ensure_demo_model())
    tokenizer = ModelService.from_loaded(loaded).tokenizer
    endless = tokenizer.encode("la la la")
    host = ModelHost(slots=1, opener=lambda *_: ScriptedBackend(loaded.config, tokenizer.vocab_size,
                                                                lambda _: endless, STEP_SECONDS))
    host.load(loaded.path)
    worker = host.require()[1]
    app = create_app(host, policy=HttpPolicy(stall_seconds=0.5))
    body = json.dumps(STALLED_BODIES[path]).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000),
             "headers": [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())]}

    async def stalled_client() -> float:
        sent, never = [], asyncio.Event()

        async def receive():
            if not sent:
                sent.append("body")
                return {"type": "http.request", "body": body, "more_body": False}
            await never.wait()

        async def send(message):
            if message["type"] == "http.response.body" and len(sent) >= 3:
                await never.wait()  # the reader stopped reading: the send never completes
            sent.append(message)

        call = asyncio.ensure_future(app(scope, receive, send))
        started = time.monotonic()
        while not worker.busy:
            assert time.monotonic() - started < 5
            await asyncio.sleep(0.01)
        while worker.busy:  # 2000 tokens would take 20 s
            assert time.monotonic() - started < 5, "the stalled stream kept its slot"
            await asyncio.sleep(0.02)
        call.cancel()
        return time.monotonic() - started

    try:
        assert asyncio.run(stalled_client()) < 5
        events, done = [], threading.Event()
        job = chat_job(host.require()[0], ChatCompletionRequest(messages=HELLO, max_tokens=2, **OFF),
                       lambda e: (events.append(e), done.set() if not hasattr(e, "events") else None))
        worker.submit(job)
        assert done.wait(5) and events[-1].completion_tokens == 2  # the slot serves the next request
    finally:
        host.close()
