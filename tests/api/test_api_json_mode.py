"""JSON mode (`response_format: {"type": "json_object"}`) with the official openai client on the demo model.

The demo model has random weights, so whatever it says under the constraint must still be one JSON
object: the mask keeps every token valid and, near the end of `max_tokens`, only lets through tokens
after which the object can still be closed in time.
"""

import json
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from engine.generation.json_constraint import START_STATE, run
from engine.generation.tokenizer import Tokenizer
from api_fixtures import ScriptedBackend, live_server

HELLO = [{"role": "user", "content": "Describe a cat as JSON"}]
OFF = {"chat_template_kwargs": {"enable_thinking": False}}
JSON = {"type": "json_object"}


def chat(client, server, **kwargs):
    args = dict(model=server.model_id, messages=HELLO, max_tokens=40, temperature=0, response_format=JSON,
                extra_body=OFF)
    return client.chat.completions.create(**{**args, **kwargs})


@pytest.mark.parametrize("temperature,seed,max_tokens", [(0, None, 40), (0.7, 1, 40), (1.0, 2, 25), (1.5, 3, 60)])
def test_output_is_one_json_object(client, server, temperature, seed, max_tokens):
    r = chat(client, server, temperature=temperature, seed=seed, max_tokens=max_tokens)
    choice = r.choices[0]
    assert isinstance(json.loads(choice.message.content), dict)
    assert choice.finish_reason == "stop" and r.usage.completion_tokens <= max_tokens


def test_stream_equals_whole_response(client, server):
    whole = chat(client, server).choices[0].message.content
    streamed, finish = "", None
    for chunk in chat(client, server, stream=True):
        for c in chunk.choices:
            streamed += c.delta.content or ""
            finish = c.finish_reason or finish
    assert streamed == whole and finish == "stop"


def test_budget_too_small_for_any_object_is_length(client, server):
    r = chat(client, server, max_tokens=1)  # the demo vocabulary has no "{}" token
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 1
    assert run(START_STATE, r.choices[0].message.content.encode()) is not None  # a valid start, unfinished
    r = chat(client, server, max_tokens=2)
    assert r.choices[0].finish_reason == "stop" and json.loads(r.choices[0].message.content) == {}


def test_json_mode_with_logprobs(client, server):
    r = chat(client, server, logprobs=True, top_logprobs=2)
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens
    text = b"".join(bytes(e.bytes) for e in entries).decode()
    assert json.loads(text) == json.loads(r.choices[0].message.content)


def test_constrained_and_free_requests_run_together(client, server):
    """JSON-mode jobs pick on the host beside ordinary ones; neither changes the other's output."""
    free = dict(model=server.model_id, messages=[{"role": "user", "content": "Count"}], max_tokens=10,
                temperature=0, extra_body=OFF)
    alone_free = client.chat.completions.create(**free).choices[0].message.content
    alone_json = chat(client, server).choices[0].message.content
    calls = [lambda: client.chat.completions.create(**free).choices[0].message.content,
             lambda: chat(client, server).choices[0].message.content] * 2
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda call: call(), calls))
    assert results == [alone_free, alone_json] * 2


@pytest.mark.parametrize("fmt,words", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}, "not supported yet"),
    ({"type": "yaml"}, "not one of"),
])
def test_other_formats_are_clear_400s(client, server, fmt, words):
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, server, response_format=fmt)
    assert words in str(err.value)


def test_json_mode_with_a_forced_tool_call_is_400(client, server):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    with pytest.raises(openai.BadRequestError):
        chat(client, server, tools=tools, tool_choice="required")


def test_reasoning_stays_free_and_the_answer_after_it_is_constrained(loaded):
    """With thinking on, only the text after `</think>` is JSON: a scripted model reasons, closes the
    block, then says something that is not JSON, which the mask overrides."""
    reply = Tokenizer.from_model_file(loaded.file).encode("I think so.</think>\n\nnot json at all")
    backend = lambda: ScriptedBackend(loaded.config, loaded.config.vocab_size, lambda prompt_ids: reply)  # noqa: E731
    with live_server(loaded, backend) as live:
        r = live.client().chat.completions.create(
            model=live.model_id, messages=HELLO, max_tokens=30, temperature=0, response_format=JSON,
            extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    message = r.choices[0].message
    assert message.reasoning_content == "I think so."
    assert isinstance(json.loads(message.content), dict) and r.choices[0].finish_reason == "stop"
