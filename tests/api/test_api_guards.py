"""A request can fail only itself (issue 24, findings 1, 9 and 10), on a scripted backend that forces tool-call text.

Random weights never write a tool call, so the backend's logits spell one (api_fixtures.ScriptedBackend);
everything above the backend is product code. Before the fix, a tool schema that is not JSON Schema
raised a TypeError in the scheduler's decode loop the moment the model wrote that parameter, the
generation thread died, every later request queued forever and /health still said "ok".
"""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from engine.fixtures.demo_model import ensure_demo_model
from engine.gguf.loader import load_model
from engine.generation.serving.generation_job import Failed, Finished
from engine.generation.serving.model_service import ModelService
from engine.server.request_jobs import chat_job
from engine.server.wire import ChatCompletionRequest
from api_fixtures import ScriptedBackend, live_server

CALL_TEXT = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
             "</tool_call><|im_end|>")
GOOD_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
OFF = {"enable_thinking": False}
GATE_SECONDS = 20


def chat(root: str, timeout: float = 10, **body) -> httpx.Response:
    body = {"messages": ASK, "chat_template_kwargs": OFF, **body}
    return httpx.post(f"{root}/v1/chat/completions", json=body, timeout=timeout)


class GatedScript(ScriptedBackend):
    """The tool-call script; a prompt containing "die" kills the generation thread (an error no guard
    may catch), and while `gate` is clear every forward waits for it."""

    def __init__(self, *args, gate: threading.Event, decode, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate = gate
        self._decode = decode

    def forward_last(self, token_ids, sequence):
        if not self.gate.wait(GATE_SECONDS):
            raise AssertionError("the test never opened the gate")
        if sequence["script"] is None and "die" in self._decode(token_ids):
            raise Fatal("the card fell off the bus")
        return super().forward_last(token_ids, sequence)


class Fatal(BaseException):
    """Not an Exception: the scheduler's per-request guards let it through, so the thread dies."""


@pytest.fixture(scope="module")
def gate():
    opened = threading.Event()
    opened.set()
    return opened


@pytest.fixture(scope="module")
def server(gate):
    loaded = load_model(ensure_demo_model())
    tokenizer = ModelService.from_loaded(loaded).tokenizer
    call = tokenizer.encode(CALL_TEXT)

    def backend():
        return GatedScript(loaded.config, tokenizer.vocab_size, lambda _ids: call, gate=gate, decode=tokenizer.decode)

    with live_server(loaded, backend, slots=4, max_queue=16) as live:
        yield live


def test_a_schema_that_is_not_json_schema_is_a_400_naming_its_path(server):
    for bad, path in ((5, "tools[0].function.parameters.properties.city.type"), (None, "tools[0].function.parameters.anyOf")):
        parameters = ({"type": "object", "properties": {"city": {"type": bad}}} if bad is not None
                      else {"type": "object", "anyOf": 5})
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": parameters}}]
        started = time.monotonic()
        r = chat(server.root, tools=tools)
        assert r.status_code == 400 and path in r.json()["error"]["message"], r.text
        assert time.monotonic() - started < 2
    r = chat(server.root, tools=GOOD_TOOLS)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == \
        '{"city": "Paris"}'


def test_a_request_that_fails_inside_the_loop_fails_alone(server):
    """A job whose tool schema breaks typed arguments (refused at the API, so handed to the worker
    directly) ends with its own error while the model writes the call; the next request is served."""
    service, worker = server.host.require()
    events = []
    done = threading.Event()

    def sink(item):
        events.append(item)
        if not hasattr(item, "events"):
            done.set()

    req = ChatCompletionRequest(messages=ASK, tools=GOOD_TOOLS, chat_template_kwargs=OFF)
    job = chat_job(service, req, sink)
    job.tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": 5}}}}}]  # what the TypeError of finding 1 needs
    worker.submit(job)
    assert done.wait(10)
    assert isinstance(events[-1], Failed) and "TypeError" in events[-1].message
    assert worker.failure is None
    assert httpx.get(f"{server.root}/health").json()["status"] == "ok"
    r = chat(server.root, tools=GOOD_TOOLS)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "tool_calls"


def test_a_tool_call_cut_by_max_tokens_is_length_and_no_call(server):
    service = server.service
    cut = len(service.tokenizer.encode("<tool_call>\n<function=get_weather>\n<parameter=city>\nPar"))
    r = chat(server.root, tools=GOOD_TOOLS, max_tokens=cut)
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"].get("tool_calls") is None
    assert "<" not in (choice["message"]["content"] or ""), choice  # no raw call markup as text
    with httpx.stream("POST", f"{server.root}/v1/chat/completions", timeout=10, json={
            "messages": ASK, "chat_template_kwargs": OFF, "tools": GOOD_TOOLS, "max_tokens": cut, "stream": True}) as s:
        lines = [line for line in s.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    assert '"finish_reason": "length"' in lines[-2]
    assert not any("<parameter" in line or "<tool_call" in line for line in lines)


def test_admission_takes_exactly_slots_plus_queue_and_503_says_when_to_retry(server, gate):
    """4 slots + 16 queued: 20 simultaneous clients are all served (the backend is held at a gate so
    all are in at once); the 21st is refused at once with Retry-After."""
    _, worker = server.host.require()
    gate.clear()
    try:
        with ThreadPoolExecutor(max_workers=20) as pool:
            answers = [pool.submit(chat, server.root, 30, max_tokens=2) for _ in range(20)]
            deadline = time.monotonic() + 10
            while worker.active + worker.waiting < 20:
                assert time.monotonic() < deadline, (worker.active, worker.waiting)
                time.sleep(0.02)
            started = time.monotonic()
            refused = chat(server.root, max_tokens=2)
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "queue_full"
            assert int(refused.headers["retry-after"]) >= 1 and time.monotonic() - started < 2
            gate.set()
            assert [a.result(timeout=30).status_code for a in answers] == [200] * 20
    finally:
        gate.set()


def test_a_dead_generation_thread_is_reported_and_new_requests_get_503_at_once(gate):
    """Own server: this kills its worker."""
    loaded = load_model(ensure_demo_model())
    tokenizer = ModelService.from_loaded(loaded).tokenizer

    def backend():
        return GatedScript(loaded.config, tokenizer.vocab_size, lambda _ids: tokenizer.encode("ok<|im_end|>"),
                           gate=gate, decode=tokenizer.decode)

    with live_server(loaded, backend) as live:
        assert chat(live.root).status_code == 200
        dying = chat(live.root, messages=[{"role": "user", "content": "die"}])
        assert dying.status_code == 503 and "the generation thread died" in dying.json()["error"]["message"]
        health = httpx.get(f"{live.root}/health")
        assert health.status_code == 503 and health.json()["status"] == "worker_failed" and "Fatal" in health.json()["reason"]
        started = time.monotonic()
        after = chat(live.root)
        assert after.status_code == 503 and after.json()["error"]["code"] == "worker_failed"
        assert "retry-after" in after.headers and time.monotonic() - started < 2
        assert live.host.require()[1].failure.startswith("the generation thread died")


def test_the_finished_event_is_still_posted_for_normal_replies(server):
    """The guards change nothing for a request that does not fail: one Finished, after its pieces."""
    service, worker = server.host.require()
    events, done = [], threading.Event()
    job = chat_job(service, ChatCompletionRequest(messages=ASK, chat_template_kwargs=OFF, max_tokens=3),
                           lambda item: (events.append(item), done.set() if not hasattr(item, "events") else None))
    worker.submit(job)
    assert done.wait(10) and isinstance(events[-1], Finished) and events[-1].completion_tokens <= 3
