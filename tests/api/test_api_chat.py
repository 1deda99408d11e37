"""Chat and text completions with the official openai client against a live server on the demo model.

The demo model has random weights, so the tests assert structure and consistency (stream == whole
response under greedy decoding, counts, finish reasons), never particular words.
"""

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest


HELLO = [{"role": "user", "content": "Hello there"}]
OFF = {"chat_template_kwargs": {"enable_thinking": False}}
ON = {"chat_template_kwargs": {"enable_thinking": True}}


def streamed_chat(client, **kwargs):
    """Merge a chat stream: (reasoning, content, finish_reason, usage, chunks)."""
    reasoning, content, finish, usage, chunks = "", "", None, None, []
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs):
        chunks.append(chunk)
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            reasoning += getattr(choice.delta, "reasoning_content", None) or ""
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
    return reasoning, content, finish, usage, chunks


def test_models_list_has_openai_fields(server, client):
    models = client.models.list().data
    assert [m.id for m in models] == [server.model_id]
    assert models[0].object == "model" and isinstance(models[0].created, int) and models[0].owned_by
    assert client.models.retrieve(server.model_id).id == server.model_id


def test_routes_work_without_v1_and_with_double_slash(server):
    root = server.base_url.removesuffix("/v1")
    assert httpx.get(f"{root}/models").json()["data"][0]["id"] == server.model_id
    assert httpx.get(f"{root}//v1/models").status_code == 200
    health = httpx.get(f"{root}/health").json()
    assert health["status"] == "ok" and health["context_length"] == server.service.context_length


def test_chat_non_stream_structure_and_usage(client, server):
    r = client.chat.completions.create(model=server.model_id, messages=HELLO, max_tokens=6, temperature=0,
                                       extra_body=OFF)
    choice = r.choices[0]
    assert r.object == "chat.completion" and choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length") and isinstance(choice.message.content, str)
    assert not getattr(choice.message, "reasoning_content", None)
    assert r.usage.prompt_tokens > 0 and 1 <= r.usage.completion_tokens <= 6
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.completion_tokens_details.reasoning_tokens == 0


@pytest.mark.parametrize("thinking", [ON, OFF], ids=["thinking", "no-thinking"])
def test_stream_equals_non_stream_under_greedy(client, server, thinking):
    args = dict(model=server.model_id, messages=HELLO, max_tokens=10, temperature=0, extra_body=thinking)
    whole = client.chat.completions.create(**args)
    reasoning, content, finish, usage, chunks = streamed_chat(client, **args)
    message = whole.choices[0].message
    assert reasoning == (getattr(message, "reasoning_content", None) or "")
    assert content == (message.content or "")
    assert finish == whole.choices[0].finish_reason
    assert usage.model_dump() == whole.usage.model_dump()
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].choices == []
    if thinking is ON:  # random weights never close `</think>` this soon: everything is reasoning
        assert reasoning and usage.completion_tokens_details.reasoning_tokens > 0
    else:
        assert not reasoning and usage.completion_tokens_details.reasoning_tokens == 0


def test_seeded_sampling_is_reproducible(client, server):
    args = dict(model=server.model_id, messages=HELLO, max_tokens=8, temperature=1.0, seed=7,
                extra_body={"top_k": 40, **OFF})
    first = client.chat.completions.create(**args).choices[0].message.content
    assert client.chat.completions.create(**args).choices[0].message.content == first


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_gives_length(client, server, field):
    r = client.chat.completions.create(model=server.model_id, messages=HELLO, temperature=0, extra_body=OFF, **{field: 5})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5


def test_all_sampling_fields_are_accepted(client, server):
    r = client.chat.completions.create(
        model=server.model_id, messages=HELLO, max_tokens=3, temperature=0.7, top_p=0.9, presence_penalty=0.5, frequency_penalty=0.2,
        seed=1, extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, **OFF})
    assert r.usage.completion_tokens <= 3


def test_completions_stream_equals_non_stream(client, server):
    args = dict(model=server.model_id, prompt="Once upon a time", max_tokens=8, temperature=0)
    whole = client.completions.create(**args)
    assert whole.object == "text_completion" and whole.usage.completion_tokens == 8
    pieces = list(client.completions.create(stream=True, **args))
    assert "".join(c.choices[0].text for c in pieces if c.choices) == whole.choices[0].text
    assert pieces[-1].choices[0].finish_reason == whole.choices[0].finish_reason == "length"


def test_completion_stop_string_cuts_before_it(client, server):
    args = dict(model=server.model_id, prompt="Once upon a time", max_tokens=12, temperature=0)
    text = client.completions.create(**args).choices[0].text
    stop = text[4:6]
    assert len(stop) == 2
    cut = client.completions.create(stop=[stop], **args)
    assert cut.choices[0].text == text[: text.find(stop)] and cut.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, stop=stop, **args) if c.choices)
    assert streamed == cut.choices[0].text


def test_chat_stop_string(client, server):
    args = dict(model=server.model_id, messages=HELLO, max_tokens=12, temperature=0, extra_body=OFF)
    text = client.chat.completions.create(**args).choices[0].message.content
    stop = text[4:6]
    r = client.chat.completions.create(stop=stop, **args)
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == text[: text.find(stop)].rstrip()



def test_concurrent_streams_queue_and_keep_their_own_parameters(client, server):
    """Ten clients at once (more than the server's slots), each with its own seed and settings, get what
    each gets alone."""
    requests = [dict(model=server.model_id, messages=[{"role": "user", "content": f"Count to {i}"}], max_tokens=6,
                     temperature=0.3 * i, seed=i, extra_body=OFF) for i in range(10)]

    def streamed(args):
        return streamed_chat(client, **args)[1]

    alone = [client.chat.completions.create(**args).choices[0].message.content for args in requests]
    with ThreadPoolExecutor(max_workers=10) as pool:
        together = list(pool.map(streamed, requests))
    assert together == alone
