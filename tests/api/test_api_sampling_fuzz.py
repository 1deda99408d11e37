"""Valid conversations with fuzzed sampling fields: a 400 or a clean completion, never a 5xx or a failed stream.

schemathesis (test_api_schema_fuzz.py) rarely gets past the chat template with random messages, and
cannot see a generation failure inside a stream that already answered 200; this test aims at both.
"""

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.fixtures.demo_model import ensure_demo_model
from engine.gguf.loader import load_model
from api_fixtures import live_server, model_backend

numbers = st.one_of(st.none(), st.floats(0, 1), st.floats(0, 1), st.floats(), st.floats(-3, 3), st.integers(-5, 5))
integers = st.one_of(st.none(), st.integers(-3, 200), st.integers(-2**70, 2**70))
sampling = st.fixed_dictionaries({}, optional={
    "temperature": numbers, "top_p": numbers, "min_p": numbers, "top_k": integers, "seed": integers,
    "presence_penalty": numbers, "frequency_penalty": numbers, "repetition_penalty": numbers,
    "max_tokens": st.one_of(st.integers(-1, 6), st.integers(10**6, 2**70)),
    "stop": st.one_of(st.text(max_size=3), st.lists(st.text(max_size=3), max_size=5)),
    "stream": st.booleans(), "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "n": st.sampled_from([1, 1, 1, 0, 2]), "logprobs": st.sampled_from([None, False, False, True]),
})
requests = st.one_of(
    st.tuples(st.just("/chat/completions"), sampling.map(lambda s: {
        "messages": [{"role": "user", "content": "Hello"}], **s})),
    st.tuples(st.just("/completions"), sampling.map(lambda s: {"prompt": "Once upon", **s})),
)


@pytest.fixture(scope="module")
def server():
    loaded = load_model(ensure_demo_model())
    with live_server(loaded, model_backend(loaded, 48), context_length=48) as live:
        yield live


def sse_events(text: str) -> list:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]


@given(call=requests)
@settings(max_examples=60, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_sampling_fields_never_break_generation(server, call):
    route, body = call
    r = httpx.post(server.base_url + route, content=json.dumps(body), timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code in (200, 400), r.text
    if r.status_code == 400:
        assert r.json()["error"]["type"] == "invalid_request_error"
        return
    if body.get("stream"):
        events = sse_events(r.text)
        assert not [e for e in events if "error" in e], r.text
        assert r.text.rstrip().endswith("data: [DONE]")
        finish = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
    else:
        finish = [c["finish_reason"] for c in r.json()["choices"]]
    assert len(finish) == body.get("n", 1) and set(finish) <= {"stop", "length"}, r.text
