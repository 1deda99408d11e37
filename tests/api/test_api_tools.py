"""A tool-call round trip through the real server, template, tokenizer and parser.

Random weights never write a tool call, so the backend here is scripted: its logits force token
sequences (in the demo model's own tokenizer) that spell reasoning + a `<tool_call>` block, or,
once the prompt holds a tool result, a final answer. Everything above the backend is product code.
"""

import json

import pytest

from engine.fixtures.demo_model import ensure_demo_model
from engine.gguf.loader import load_model
from engine.generation.serving.model_service import ModelService
from api_fixtures import ScriptedBackend, live_server

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]
CALL_TEXT = ("Let me check.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
             "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call><|im_end|>")
ANSWER_TEXT = "Done.\n</think>\n\nIt is sunny in Paris.<|im_end|>"
# What the model writes after a forced `<tool_call>\n<function=` ("required") or `...get_weather>\n` (named).
NAME_AND_ARGS = "get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call><|im_end|>"
ARGS_ONLY = "<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call><|im_end|>"
ASK = [{"role": "user", "content": "Weather in Paris?"}]
THINK = {"chat_template_kwargs": {"enable_thinking": True}}


@pytest.fixture(scope="module")
def server():
    loaded = load_model(ensure_demo_model())
    tokenizer = ModelService.from_loaded(loaded).tokenizer
    call_ids, answer_ids = tokenizer.encode(CALL_TEXT), tokenizer.encode(ANSWER_TEXT)

    def script_for(prompt_ids):
        prompt = tokenizer.decode(prompt_ids)
        if prompt.endswith("<function="):
            return tokenizer.encode(NAME_AND_ARGS)
        if prompt.endswith("<function=get_weather>\n"):
            return tokenizer.encode(ARGS_ONLY)
        return answer_ids if "<tool_response>" in prompt else call_ids

    backend = lambda: ScriptedBackend(loaded.config, tokenizer.vocab_size, script_for)  # noqa: E731
    with live_server(loaded, backend) as live:
        yield live


def test_tool_call_non_stream(server):
    r = server.client().chat.completions.create(model=server.model_id, messages=ASK, tools=TOOLS, extra_body=THINK)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.reasoning_content == "Let me check."
    assert not choice.message.content
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}


def test_tool_call_stream_deltas_follow_openai(server):
    chunks = list(server.client().chat.completions.create(
        model=server.model_id, messages=ASK, tools=TOOLS, stream=True, extra_body=THINK))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    call_deltas = [tc for d in deltas for tc in (d.tool_calls or [])]
    first, rest = call_deltas[0], call_deltas[1:]
    assert first.index == 0 and first.id.startswith("call_") and first.type == "function"
    assert first.function.name == "get_weather"
    assert rest and all(tc.index == 0 and tc.id is None and not tc.function.name for tc in rest)
    arguments = first.function.arguments + "".join(tc.function.arguments for tc in rest)
    assert json.loads(arguments) == {"city": "Paris", "days": 3}
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == "Let me check."
    assert not "".join(d.content or "" for d in deltas)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_streamed_arguments_arrive_one_parameter_at_a_time(server):
    """The two-parameter call streams its head, then one argument delta per finished parameter."""
    chunks = list(server.client().chat.completions.create(
        model=server.model_id, messages=ASK, tools=TOOLS, stream=True, extra_body=THINK))
    call_deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert call_deltas[0].function.name == "get_weather" and call_deltas[0].function.arguments == ""
    assert [tc.function.arguments for tc in call_deltas[1:]] == ['{"city": "Paris"', ', "days": 3', "}"]


def test_without_tools_the_markup_stays_content(server):
    r = server.client().chat.completions.create(model=server.model_id, messages=ASK, extra_body=THINK)
    assert r.choices[0].finish_reason == "stop" and "<tool_call>" in r.choices[0].message.content
    assert not r.choices[0].message.tool_calls


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_round_trip_with_tool_result(server, stream):
    client = server.client()
    first = client.chat.completions.create(model=server.model_id, messages=ASK, tools=TOOLS, extra_body=THINK)
    call = first.choices[0].message.tool_calls[0]
    messages = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"sky": "sunny"})},
    ]
    args = dict(model=server.model_id, messages=messages, tools=TOOLS, extra_body=THINK)
    if stream:
        chunks = [c for c in client.chat.completions.create(stream=True, **args) if c.choices]
        content = "".join(c.choices[0].delta.content or "" for c in chunks)
        finish = chunks[-1].choices[0].finish_reason
    else:
        final = client.chat.completions.create(**args).choices[0]
        content, finish = final.message.content, final.finish_reason
    assert content == "It is sunny in Paris." and finish == "stop"


@pytest.mark.parametrize("choice, city", [("required", "Oslo"),
                                          ({"type": "function", "function": {"name": "get_weather"}}, "Rome")],
                         ids=["required", "named"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_tool_choice_forces_a_call(server, choice, city, stream):
    """The reply starts inside the call's markup, so it is a call (after an empty reasoning block)."""
    args = dict(model=server.model_id, messages=ASK, tools=TOOLS, tool_choice=choice, extra_body=THINK)
    if stream:
        chunks = [c for c in server.client().chat.completions.create(stream=True, **args) if c.choices]
        calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
        name, arguments = calls[0].function.name, "".join(tc.function.arguments or "" for tc in calls)
        reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks)
        finish = chunks[-1].choices[0].finish_reason
    else:
        choice0 = server.client().chat.completions.create(**args).choices[0]
        (call,) = choice0.message.tool_calls
        name, arguments, finish = call.function.name, call.function.arguments, choice0.finish_reason
        reasoning = choice0.message.reasoning_content or ""
    assert name == "get_weather" and json.loads(arguments) == {"city": city}
    assert finish == "tool_calls" and reasoning == ""


@pytest.mark.parametrize("choice, message", [
    ("required", "needs tools"),
    ({"type": "function", "function": {"name": "launch_rocket"}}, "not among the tools"),
    ({"type": "function"}, "tool_choice must be"),
    ("sometimes", "tool_choice must be"),
])
def test_bad_tool_choice_is_400(server, choice, message):
    import openai

    tools = None if choice == "required" else TOOLS
    with pytest.raises(openai.BadRequestError) as info:
        server.client().chat.completions.create(model=server.model_id, messages=ASK, tools=tools, tool_choice=choice)
    assert message in info.value.body["message"]
