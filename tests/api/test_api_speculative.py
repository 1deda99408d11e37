"""Speculative decoding through the API: on by default for a model with an MTP head, off with the request
field `"speculative": false`, and the answer is the same either way (greedy), including where a stop
string, max_tokens or an end token cuts a multi-token step; streaming gives the same text.

The model is the demo's vocabulary and template on `write_draft_friendly_model` weights (an untied
8-layer D=256 trunk with a head that is accepted part of the time), served on the reference backend.
"""

from __future__ import annotations

import openai
import pytest

from api_fixtures import live_server
from engine.backends import open_backend
from engine.generation.slots import HostSlots
from engine.gguf.loader import load_model
from engine.generation.serving.worker import DEFAULT_SLOTS
from tests.draft_friendly import write_demo_draft_friendly

OFF = {"speculative": False}
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    return load_model(write_demo_draft_friendly(tmp_path_factory.mktemp("mtp") / "mtp-demo.gguf"))


@pytest.fixture(scope="module")
def slots(loaded):
    return HostSlots(open_backend("reference", loaded), DEFAULT_SLOTS)


@pytest.fixture(scope="module")
def server(loaded, slots):
    with live_server(loaded, lambda: slots) as live:  # the worker drives these slots as they are
        yield live


def chat(server, extra: dict, temperature: float = 0.0, **kwargs):
    return server.client().chat.completions.create(
        model=server.model_id, messages=[{"role": "user", "content": "Tell me about the rig."}],
        temperature=temperature, extra_body={**NO_THINK, **extra}, **kwargs)


def test_speculation_is_on_by_default_and_changes_no_greedy_answer(server, slots):
    stats = slots.speculation_stats
    before = (stats.rounds, stats.drafted, stats.accepted)
    on = chat(server, {}, max_tokens=40)
    during = (stats.rounds, stats.drafted, stats.accepted)
    off = chat(server, OFF, max_tokens=40)
    assert during[0] > before[0] and stats.rounds == during[0]  # off: no verify rounds
    assert stats.accepted > 0
    details = on.usage.completion_tokens_details  # the request's own drafts, in OpenAI's predicted-token fields
    assert details.accepted_prediction_tokens == during[2] - before[2] > 0
    assert details.rejected_prediction_tokens == (during[1] - before[1]) - (during[2] - before[2])
    off_details = off.usage.completion_tokens_details
    assert off_details.accepted_prediction_tokens == off_details.rejected_prediction_tokens == 0
    assert on.choices[0].message.content == off.choices[0].message.content
    assert on.usage.completion_tokens == off.usage.completion_tokens == 40
    assert on.choices[0].finish_reason == off.choices[0].finish_reason == "length"


@pytest.mark.parametrize("max_tokens", [3, 7, 12])
def test_max_tokens_inside_a_step(server, max_tokens):
    on, off = chat(server, {}, max_tokens=max_tokens), chat(server, OFF, max_tokens=max_tokens)
    assert on.usage.completion_tokens == off.usage.completion_tokens == max_tokens
    assert on.choices[0].message.content == off.choices[0].message.content


def test_stop_strings_inside_a_step(server):
    full = chat(server, OFF, max_tokens=30).choices[0].message.content
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    on, off = chat(server, {}, max_tokens=30, stop=[stop]), chat(server, OFF, max_tokens=30, stop=[stop])
    assert on.choices[0].message.content == off.choices[0].message.content
    assert stop not in on.choices[0].message.content and on.choices[0].finish_reason == "stop"


def test_streaming_gives_the_same_text(server):
    stream = chat(server, {}, max_tokens=25, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == chat(server, OFF, max_tokens=25).choices[0].message.content


def test_sampled_requests_with_a_seed_replay(server):
    a, b, c = (chat(server, {}, 0.8, max_tokens=20, seed=seed).choices[0].message.content for seed in (5, 5, 6))
    assert a == b != c


def test_a_bad_speculative_value_is_a_400(server):
    with pytest.raises(openai.BadRequestError, match="speculative"):
        chat(server, {"speculative": {"k": 2}}, max_tokens=2)
