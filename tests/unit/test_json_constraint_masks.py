"""JSON masks over a real (small, trained) vocabulary: equal to running every token, and generation
under them always yields one JSON object when the budget allows one."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.generation.json_constraint import START_STATE, JsonConstraint, JsonVocab, closing_cost, run, step
from engine.generation.sampler import SamplingParams
from engine.generation.serving.host_pick import HostPicker
from tokenizer_fixtures import trained_tokenizer

REJECTED = np.iinfo(np.int16).max


@pytest.fixture(scope="module")
def vocab() -> JsonVocab:
    return JsonVocab.from_tokenizer(trained_tokenizer())


def states_along(text: bytes) -> list:
    state, states = START_STATE, [START_STATE]
    for b in text:
        state = step(state, b)
        assert state is not None
        states.append(state)
    return states


# Deeper than any token can close, strings with escapes and split UTF-8, numbers and literals.
PATH = '{"a": [1, {"b": "x\\u00e9 é😀\\n", "c": [[[[[[{"d": -12.5e+3, "e": [true, nul'.encode()


def test_costs_equal_running_every_token(vocab: JsonVocab) -> None:
    tokenizer = trained_tokenizer()
    banned = tokenizer.special_ids | tokenizer.eos_ids
    assert len(PATH) > vocab.max_closers + 10
    for state in states_along(PATH):
        costs = vocab.costs(state)
        for tid, data in enumerate(vocab.token_bytes):
            end = run(state, data) if data and tid not in banned else None
            expected = REJECTED if end is None else closing_cost(end) - len(state[0])
            assert costs[tid] == expected, (state, data)


def test_end_and_control_tokens_are_never_allowed(vocab: JsonVocab) -> None:
    tokenizer = trained_tokenizer()
    inside_string = states_along(b'{"a": "x')[-1]
    mask = vocab.mask(inside_string, 100)
    assert mask.sum() > 500  # nearly every token continues a string
    assert not mask[sorted(tokenizer.special_ids | tokenizer.eos_ids)].any()


def test_a_small_budget_only_allows_tokens_that_can_still_close(vocab: JsonVocab) -> None:
    state = states_along(b'{"a": [')[-1]  # cheapest completion: "]}" (2 bytes)
    tight = vocab.mask(state, 3)
    assert tight.any() and tight.sum() < vocab.mask(state, 100).sum()
    for tid in np.flatnonzero(tight):
        assert closing_cost(run(state, vocab.token_bytes[tid])) <= 2
    assert vocab.mask(state, 1).any()  # too late to close: fall back to tokens that keep the text valid


@pytest.mark.parametrize("budget", [2, 3, 8, 40])
def test_random_logits_always_give_one_object_within_budget(vocab: JsonVocab, budget: int) -> None:
    rng = np.random.default_rng(budget)
    for seed in range(15):
        picker = HostPicker(JsonConstraint(vocab), SamplingParams(temperature=1.0, seed=seed), [1, 2, 3])
        tokens = []
        while not picker.constraint.complete:
            assert len(tokens) < budget
            logits = rng.normal(scale=3, size=vocab.size).astype(np.float32)
            tokens.append(picker.choose(logits, picked=0, remaining=budget - len(tokens), constrained=True))
        text = b"".join(vocab.token_bytes[t] for t in tokens).decode("utf-8")
        assert isinstance(json.loads(text), dict)


def test_one_token_is_not_enough_for_this_vocabulary(vocab: JsonVocab) -> None:
    constraint = JsonConstraint(vocab)
    best = int(np.argmax(np.where(constraint.mask(1), np.arange(vocab.size), -1)))
    constraint.accept(best)
    assert not constraint.complete  # the trained vocabulary has no "{}" token
    with pytest.raises(ValueError):
        constraint.accept(trained_tokenizer().token_to_id("a") or 0)


def test_reasoning_tokens_pass_through_unconstrained(vocab: JsonVocab) -> None:
    picker = HostPicker(JsonConstraint(vocab), SamplingParams(temperature=0.0), [1])
    assert picker.choose(None, picked=65, remaining=10, constrained=False) == 65
    assert picker.constraint.state == START_STATE
