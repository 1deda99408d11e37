"""The Responses API (`POST /v1/responses`) with the official openai client, on the trained fixture."""

import json

import jsonschema
import openai
import pytest

from test_api_structured_trained import TIME, loaded  # noqa: F401 (the trained fixture for conftest's server)

RESPONSE_TIME = {"type": "function", **TIME["function"]}


def create(client, server, **kwargs):
    return client.responses.create(**{"model": server.model_id, "input": "the weather in paris",
                                      "max_output_tokens": 60, "temperature": 0,
                                      "reasoning": {"effort": "none"}, **kwargs})


def test_text_reply(client, server):
    r = create(client, server, instructions="Answer briefly.")
    assert r.status in ("completed", "incomplete") and r.output_text
    assert r.usage.input_tokens > 0 and r.usage.output_tokens <= 60


def test_stream_ends_with_completed_and_equals_the_whole(client, server):
    whole = create(client, server, max_output_tokens=20)
    events = list(create(client, server, max_output_tokens=20, stream=True))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] in ("response.completed", "response.incomplete") and types[-1] == "response." + whole.status
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text == events[-1].response.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_completed_stream_for_a_short_reply(client, server):
    events = list(create(client, server, max_output_tokens=200, stream=True,
                         text={"format": {"type": "json_schema", "name": "t", "strict": True, "schema": {
                             "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                             "additionalProperties": False}}}))
    assert events[-1].type == "response.completed"
    assert isinstance(json.loads(events[-1].response.output_text)["ok"], bool)


def test_forced_function_call_and_its_output_as_a_follow_up(client, server):
    r = create(client, server, tools=[RESPONSE_TIME], tool_choice={"type": "function", "name": "get_time"},
               max_output_tokens=100)
    (call,) = [item for item in r.output if item.type == "function_call"]
    assert call.name == "get_time"
    jsonschema.validate(json.loads(call.arguments), TIME["function"]["parameters"])
    follow = create(client, server, previous_response_id=r.id, tools=[RESPONSE_TIME],
                    input=[{"type": "function_call_output", "call_id": call.call_id, "output": "noon"}])
    assert follow.status in ("completed", "incomplete")
    assert follow.usage.input_tokens_details.cached_tokens > 0  # the first turn's state was kept


def test_streamed_function_call_arguments(client, server):
    events = list(create(client, server, tools=[RESPONSE_TIME], tool_choice="required", max_output_tokens=100,
                         parallel_tool_calls=False,
                         stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert json.loads(deltas) == json.loads(done.arguments) and events[-1].type == "response.completed"


def test_input_items_and_unknown_previous_id(client, server):
    items = [{"role": "developer", "content": "Be brief."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]
    assert create(client, server, input=items).output_text is not None
    with pytest.raises(openai.NotFoundError):
        create(client, server, previous_response_id="resp_missing")
