"""Bounded inputs are refused before any work, within a couple of seconds, and the server keeps serving
(issue 24, findings 2 and "Also"). The backend is scripted (endless text, a slow step) so that what
is measured is the server's refusal, not the model."""

import json
import time

import httpx
import pytest

from engine.fixtures.demo_model import ensure_demo_model
from engine.gguf.loader import load_model
from engine.server.http_policy import HttpPolicy
from engine.generation.serving.model_service import ModelService
from engine.generation.serving.request_limits import MAX_STOP_CHARS, RequestLimits
from api_fixtures import ScriptedBackend, live_server

STEP_SECONDS = 0.02
DEFAULT_MAX_TOKENS = 5
BODY_LIMIT = 1 << 20
REFUSED_WITHIN = 2.0  # seconds: "every abuse case is refused within a couple of seconds"
HELLO = [{"role": "user", "content": "Hello"}]
OFF = {"enable_thinking": False}


@pytest.fixture(scope="module")
def server():
    loaded = load_model(ensure_demo_model())
    tokenizer = ModelService.from_loaded(loaded).tokenizer
    endless = tokenizer.encode("la la la")
    backend = lambda: ScriptedBackend(loaded.config, tokenizer.vocab_size, lambda _: endless, STEP_SECONDS)  # noqa: E731
    with live_server(loaded, backend, policy=HttpPolicy(max_body_bytes=BODY_LIMIT),
                     limits=RequestLimits(default_max_tokens=DEFAULT_MAX_TOKENS)) as live:
        yield live


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.root, timeout=30) as client:  # one keep-alive connection throughout
        yield client


def refused(http: httpx.Client, status: int, path: str = "/v1/chat/completions", **kwargs) -> dict:
    started = time.monotonic()
    r = http.post(path, **kwargs)
    assert r.status_code == status, r.text[:300]
    assert time.monotonic() - started < REFUSED_WITHIN
    return r.json()["error"]


def still_serving(http: httpx.Client) -> None:
    r = http.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 2, "chat_template_kwargs": OFF})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def test_a_megabyte_stop_string_is_refused_and_long_ones_work(http):
    error = refused(http, 400, json={"messages": HELLO, "stop": ["x" * 1_000_000], "chat_template_kwargs": OFF})
    assert error["param"] == "stop" and str(MAX_STOP_CHARS) in error["message"]
    assert refused(http, 400, json={"messages": HELLO, "stop": list("abcde")})["param"] == "stop"
    r = http.post("/v1/chat/completions", json={"messages": HELLO, "stop": ["z" * MAX_STOP_CHARS, "la"],
                                                "chat_template_kwargs": OFF})
    assert r.json()["choices"][0]["finish_reason"] == "stop" and r.json()["choices"][0]["message"]["content"] == ""
    still_serving(http)


def test_a_body_over_the_limit_is_413_before_it_is_read(http):
    big = json.dumps({"messages": [{"role": "user", "content": "a" * (20 << 20)}]})
    error = refused(http, 413, content=big, headers={"content-type": "application/json"})
    assert error["code"] == "body_too_large"

    def chunks():  # no Content-Length: the limit is enforced while reading
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(40):
            yield b"a" * 65536
        yield b'"}]}'

    refused(http, 413, content=chunks(), headers={"content-type": "application/json"})
    still_serving(http)


def test_more_messages_than_can_be_validated_cheaply_are_refused(http):
    many = [{"role": "user", "content": "x"}] * 20_000  # 0.6 MB; each costs microseconds of validation
    error = refused(http, 400, json={"messages": many})
    assert "at most 16384 messages" in error["message"]
    still_serving(http)


def test_text_that_cannot_fit_is_refused_before_tokenizing(server, http):
    chars = BODY_LIMIT - 1000
    assert chars > server.service.context_length * server.service.max_token_chars  # the bound applies
    text = "word " * (chars // 5)
    error = refused(http, 400, json={"messages": [{"role": "user", "content": text}]})
    assert error["code"] == "context_length_exceeded"
    assert refused(http, 400, path="/v1/completions", json={"prompt": text})["code"] == "context_length_exceeded"
    assert refused(http, 400, path="/v1/tokenize", json={"content": text})["code"] == "context_length_exceeded"
    still_serving(http)


def test_the_default_max_tokens_is_bounded_and_a_deadline_ends_the_reply(http):
    r = http.post("/v1/chat/completions", json={"messages": HELLO, "chat_template_kwargs": OFF}).json()
    assert r["usage"]["completion_tokens"] == DEFAULT_MAX_TOKENS and r["choices"][0]["finish_reason"] == "length"
    started = time.monotonic()
    r = http.post("/v1/chat/completions", json={"messages": HELLO, "chat_template_kwargs": OFF, "max_tokens": 1000,
                                                "deadline_seconds": 0.3}).json()
    assert r["choices"][0]["finish_reason"] == "length" and r["usage"]["completion_tokens"] < 1000
    assert time.monotonic() - started < REFUSED_WITHIN  # 1000 steps would take 20 s
    assert refused(http, 400, json={"messages": HELLO, "deadline_seconds": 0})["param"] == "deadline_seconds"


def test_the_inputs_that_were_500s_are_400s(http):
    string_function = [{"type": "function", "function": "get_weather"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert refused(http, 400, json={"messages": HELLO, "tools": string_function, "tool_choice": named})["param"] == \
        "tools.0.function"
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    assert refused(http, 400, json={"messages": HELLO, "tools": tools,
                                    "tool_choice": {"type": "function", "function": "get_weather"}})["param"] == \
        "tool_choice"
    deep: dict = {"type": "object"}
    for _ in range(400):
        deep = {"type": "object", "properties": {"x": deep}}
    deep_tools = [{"type": "function", "function": {"name": "f", "parameters": deep}}]
    assert "nests deeper" in refused(http, 400, json={"messages": HELLO, "tools": deep_tools})["message"]
    still_serving(http)


def test_a_wrong_method_is_405_with_allow(http):
    r = http.get("/v1/chat/completions")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert r.json()["error"]["type"] == "invalid_request_error"
    still_serving(http)
