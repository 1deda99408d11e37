"""Logprobs with the official openai client on the demo model: chat (`logprobs`/`top_logprobs`) and
text completions (the legacy `logprobs` integer), whole and streamed.

Random weights, so the tests check shapes and consistency: greedy picks the top token, the streamed
entries equal the whole response's, the tokens spell the text, probabilities stay within 1.
"""

import math

import openai
import pytest


HELLO = [{"role": "user", "content": "Hello there"}]
OFF = {"chat_template_kwargs": {"enable_thinking": False}}


def chat(client, server, **kwargs):
    args = dict(model=server.model_id, messages=HELLO, max_tokens=8, temperature=0, extra_body=OFF)
    return client.chat.completions.create(**{**args, **kwargs})


def spelled(entries) -> str:
    return b"".join(bytes(e.bytes) for e in entries).decode("utf-8", errors="replace")


def test_chat_logprobs_shape_and_greedy_top(client, server):
    r = chat(client, server, logprobs=True, top_logprobs=5)
    choice = r.choices[0]
    entries = choice.logprobs.content
    assert len(entries) == r.usage.completion_tokens == 8 and choice.finish_reason == "length"
    for e in entries:
        assert len(e.top_logprobs) == 5 and e.logprob <= 0
        values = [t.logprob for t in e.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert sum(math.exp(v) for v in values) <= 1 + 1e-9
        assert e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == e.logprob  # greedy = argmax
        assert e.token == bytes(e.bytes).decode("utf-8", errors="replace")
    assert spelled(entries).strip() == choice.message.content.strip()


def test_chat_logprobs_without_alternatives_and_off_by_default(client, server):
    r = chat(client, server, logprobs=True)
    assert all(e.top_logprobs == [] for e in r.choices[0].logprobs.content)
    assert chat(client, server).choices[0].logprobs is None


def test_chat_stream_carries_the_same_entries(client, server):
    whole = chat(client, server, logprobs=True, top_logprobs=3, max_tokens=12)
    streamed, content = [], ""
    for chunk in chat(client, server, logprobs=True, top_logprobs=3, max_tokens=12, stream=True):
        for c in chunk.choices:
            content += c.delta.content or ""
            if c.logprobs is not None:
                streamed += c.logprobs.content
    assert content == whole.choices[0].message.content
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in whole.choices[0].logprobs.content]


def test_tokens_cut_by_a_stop_string_get_no_entry(client, server):
    full = chat(client, server, logprobs=True, max_tokens=12)
    text, entries = full.choices[0].message.content, full.choices[0].logprobs.content
    stop = text[4:6]
    cut = chat(client, server, logprobs=True, max_tokens=12, stop=stop)
    kept = cut.choices[0].logprobs.content
    assert cut.choices[0].finish_reason == "stop" and 0 < len(kept) < len(entries)
    assert [e.model_dump() for e in kept] == [e.model_dump() for e in entries[: len(kept)]]
    assert spelled(kept).lstrip("\n").startswith(cut.choices[0].message.content)
    assert len(spelled(kept)) < len(text[: text.find(stop)]) + len(stop) + max(len(e.token) for e in kept)


@pytest.mark.parametrize("fields", [{"logprobs": True, "top_logprobs": 21}, {"logprobs": True, "top_logprobs": -1},
                                    {"top_logprobs": 2}, {"logprobs": False, "top_logprobs": 2}])
def test_bad_chat_logprob_requests_are_400(client, server, fields):
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, server, **fields)
    assert "top_logprobs" in str(err.value)


def test_completion_logprobs_legacy_shape(client, server):
    r = client.completions.create(model=server.model_id, prompt="Once upon a time", max_tokens=8, temperature=0,
                                  logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 8
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert top[token] == value and 1 <= len(top) <= 4  # the best 3 and the sampled token
        assert value == max(top.values())  # greedy
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    streamed = {"tokens": [], "token_logprobs": [], "text_offset": []}
    for chunk in client.completions.create(model=server.model_id, prompt="Once upon a time", max_tokens=8,
                                           temperature=0, logprobs=3, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            for key in streamed:
                streamed[key] += getattr(chunk.choices[0].logprobs, key)
    assert streamed == {"tokens": lp.tokens, "token_logprobs": lp.token_logprobs, "text_offset": lp.text_offset}


@pytest.mark.parametrize("count", [6, -1])
def test_bad_completion_logprobs_are_400(client, server, count):
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=server.model_id, prompt="Once", max_tokens=2, logprobs=count)
