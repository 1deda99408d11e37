"""JSON mode (`response_format: {"type": "json_object"}`) with the official openai client on the demo model.

The demo model has random weights, so whatever it says under the constraint must still be JSON: the
grammar's bitset keeps every token valid, so a reply that stops is one JSON object and one cut by
`max_tokens` (finish "length") is a valid start of one.
"""

import json
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from engine.generation.grammar.constraint import GrammarConstraint
from engine.generation.grammar.formats import json_object_grammar
from engine.generation.grammar.vocabulary import grammar_vocabulary
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
def test_output_is_json(client, server, temperature, seed, max_tokens):
    r = chat(client, server, temperature=temperature, seed=seed, max_tokens=max_tokens)
    choice = r.choices[0]
    assert r.usage.completion_tokens <= max_tokens
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content), dict)
    else:
        assert choice.finish_reason == "length" and r.usage.completion_tokens == max_tokens
        assert_json_start(server, choice.message.content)


def assert_json_start(server, text):
    """`text` is a start of a JSON object: a fresh matcher takes every one of its tokens."""
    tokenizer = server.service.tokenizer
    matcher = GrammarConstraint(grammar_vocabulary(tokenizer), json_object_grammar(), tokenizer.vocab_size)
    assert text.startswith("{")
    for token in tokenizer.encode(text, parse_special=False):
        matcher.accept(token)


def test_stream_equals_whole_response(client, server):
    first = chat(client, server).choices[0]
    whole = first.message.content
    streamed, finish = "", None
    for chunk in chat(client, server, stream=True):
        for c in chunk.choices:
            streamed += c.delta.content or ""
            finish = c.finish_reason or finish
    assert streamed == whole and finish == first.finish_reason


def test_budget_too_small_for_any_object_is_length(client, server):
    r = chat(client, server, max_tokens=1)  # the demo vocabulary has no "{}" token
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 1
    assert_json_start(server, r.choices[0].message.content)


def test_json_mode_with_logprobs(client, server):
    r = chat(client, server, logprobs=True, top_logprobs=2)
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens
    text = b"".join(bytes(e.bytes) for e in entries).decode(errors="replace")
    assert text == r.choices[0].message.content


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
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "needs json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "minProperties": "a"}}},
     "cannot be used"),
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
    block, then says something that is not JSON, which the grammar's bitset overrides."""
    reply = Tokenizer.from_model_file(loaded.file).encode("I think so.</think>\n\nnot json at all")
    backend = lambda: ScriptedBackend(loaded.config, loaded.config.vocab_size, lambda prompt_ids: reply)  # noqa: E731
    with live_server(loaded, backend) as live:
        r = live.client().chat.completions.create(
            model=live.model_id, messages=HELLO, max_tokens=30, temperature=0, response_format=JSON,
            extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    message = r.choices[0].message
    assert message.reasoning_content == "I think so."
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(message.content), dict)
    else:
        assert_json_start(live, message.content)


def test_json_schema_on_the_demo_model(client, server):
    """Random weights, a schema of one short enum: every reply that stops is valid against it."""
    schema = {"type": "object", "properties": {"pet": {"enum": ["cat", "dog"]}}, "required": ["pet"],
              "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "pet", "schema": schema, "strict": True}}
    r = chat(client, server, response_format=fmt, max_tokens=20)
    assert r.choices[0].finish_reason == "stop"
    assert json.loads(r.choices[0].message.content) in ({"pet": "cat"}, {"pet": "dog"})
