"""Structured replies on the trained fixture (a real, if tiny, language model) with the openai client:
JSON against a schema, JSON mode with the template's default thinking, and forced tool calls."""

import json
from pathlib import Path

import jsonschema
import pytest

from engine.gguf.loader import load_model
from api_fixtures import live_server, model_backend

TRAINED = Path(__file__).parents[1] / "fixtures" / "trained" / "fixture-q8_0.gguf"
ASK = [{"role": "user", "content": "the weather in paris, as json"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 24}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
                                     "unit": {"enum": ["c", "f"]}},
    "required": ["city", "days"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "maxLength": 24}}, "required": ["zone"]}}}


@pytest.fixture(scope="module")
def loaded():
    """The trained fixture instead of the demo model: conftest's `server` and `client` serve it."""
    return load_model(TRAINED)


def chat(client, server, **kwargs):
    return client.chat.completions.create(**{"model": server.model_id, "messages": ASK, "max_tokens": 120,
                                             "temperature": 0, **kwargs})


@pytest.mark.parametrize("strict", [True, False])
def test_json_schema_reply_is_valid_against_the_schema(client, server, strict):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                               "hot": {"type": "boolean"}},
              "required": ["city", "hot"], "additionalProperties": False}
    r = chat(client, server, response_format={"type": "json_schema", "json_schema": {
        "name": "weather", "schema": schema, "strict": strict}})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)


def test_json_object_with_default_thinking_is_an_object(client, server):
    """The template thinks by default; the budget closes the reasoning at half of max_tokens."""
    r = chat(client, server, response_format={"type": "json_object"}, max_tokens=200)
    assert r.choices[0].finish_reason == "stop", r.choices[0].message
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    assert r.usage.completion_tokens_details.reasoning_tokens <= 100 + 1  # the budget and its `</think>`


def test_length_inside_thinking_is_length_with_empty_content(client, server):
    r = chat(client, server, max_tokens=5)
    assert r.choices[0].finish_reason == "length" and not r.choices[0].message.content


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_time"}},
                                         {"type": "function", "function": {"name": "get_weather"}}])
@pytest.mark.parametrize("parallel", [True, False])
def test_forced_tool_calls_name_listed_functions_with_valid_arguments(client, server, tool_choice, parallel):
    r = chat(client, server, tools=[WEATHER, TIME], tool_choice=tool_choice, parallel_tool_calls=parallel,
             max_tokens=200)
    choice = r.choices[0]
    # several calls may go on until the budget: the one it cuts is dropped (finish "length"), the rest stand
    assert choice.finish_reason == "tool_calls" or (parallel and choice.finish_reason == "length"), choice.message
    calls = choice.message.tool_calls
    assert calls and (parallel and not isinstance(tool_choice, dict) or len(calls) == 1)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    for call in calls:
        if isinstance(tool_choice, dict):
            assert call.function.name == tool_choice["function"]["name"]
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])


def test_reasoning_format_none_inlines_the_reasoning(loaded):
    with live_server(loaded, model_backend(loaded), reasoning_format="none") as live:
        r = live.client().chat.completions.create(model=live.model_id, messages=ASK, max_tokens=30, temperature=0,
                                                  extra_body={"max_thinking_tokens": 10})
        streamed = "".join(c.choices[0].delta.content or "" for c in live.client().chat.completions.create(
            model=live.model_id, messages=ASK, max_tokens=30, temperature=0, stream=True,
            extra_body={"max_thinking_tokens": 10}) if c.choices)
    message = r.choices[0].message
    assert message.content.startswith("<think>") and "</think>" in message.content
    assert not getattr(message, "reasoning_content", None) and streamed == message.content
    assert r.usage.completion_tokens_details.reasoning_tokens == 11  # the budget and its `</think>`
