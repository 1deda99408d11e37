"""The llguidance grammars on the demo vocabulary: forced tool calls and JSON closing before the budget."""

import json

import numpy as np
import pytest

from engine.fixtures.demo_model import ensure_demo_model
from engine.generation.grammar.constraint import GrammarConstraint, GrammarError
from engine.generation.grammar.formats import json_object_grammar, tool_call_grammar
from engine.generation.grammar.json_closing import STEPS_PER_LEVEL, JsonCloser
from engine.generation.grammar.vocabulary import grammar_vocabulary
from engine.generation.tokenizer import Tokenizer
from engine.gguf.loader import load_model

WEATHER = {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}
TIME = {"name": "get_time", "parameters": {"type": "object", "properties": {}}}


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_model_file(load_model(ensure_demo_model()).file)


def feed(tokenizer, grammar, text, closer=None) -> GrammarConstraint:
    constraint = GrammarConstraint(grammar_vocabulary(tokenizer), grammar, tokenizer.vocab_size, closer)
    for token in tokenizer.encode(text):
        assert constraint.allowed(10_000)[token], f"{tokenizer.decode([token])!r} refused in {text!r}"
        constraint.accept(token)
    return constraint


@pytest.mark.parametrize("text", [
    "get_weather>\n<parameter=city>\nSão <b>Paulo</b>\n</parameter>\n</function>\n</tool_call>",
    "get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
    "<parameter=unit>\nc\n</parameter>\n</function>\n</tool_call>",
    "get_time>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>",
])
def test_required_grammar_takes_valid_calls_and_may_end_after_them(tokenizer, text):
    done = feed(tokenizer, tool_call_grammar([WEATHER, TIME], named=False, parallel=True), text)
    assert set(np.flatnonzero(done.allowed(10))) & tokenizer.eos_ids


@pytest.mark.parametrize("text", [
    "get_wether>",  # not a listed function
    "get_weather>\n</function>",  # the required city is missing
    "get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\nthree",  # not an integer
    "get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=unit>\nk",  # not in the enum
])
def test_required_grammar_refuses_invalid_calls(tokenizer, text):
    with pytest.raises(AssertionError, match="refused"):
        feed(tokenizer, tool_call_grammar([WEATHER, TIME], named=False, parallel=True), text)


def test_single_call_grammar_ends_after_one_call(tokenizer):
    text = "get_time>\n</function>\n</tool_call>"
    done = feed(tokenizer, tool_call_grammar([WEATHER, TIME], named=False, parallel=False), text)
    assert done.complete and set(np.flatnonzero(done.allowed(10))) <= tokenizer.eos_ids


def test_bad_schema_is_a_grammar_error(tokenizer):
    with pytest.raises(GrammarError):
        GrammarConstraint(grammar_vocabulary(tokenizer), tool_call_grammar(
            [{"name": "f", "parameters": {"properties": {"x": {"type": "integer", "minimum": "a"}}}}],
            named=True, parallel=False), tokenizer.vocab_size)


@pytest.mark.parametrize("start", ['{"a":"long text', '{"a":[{"b":"x', '{"k', '{"a":1,"b":[', '{'])
def test_closer_finishes_the_object_within_its_reserve(tokenizer, start):
    """From any start, picking the highest-logit allowed token of random logits once the reserve is
    reached closes the object before the budget ends."""
    rng = np.random.default_rng(0)
    closer = JsonCloser(tokenizer)
    constraint = feed(tokenizer, json_object_grammar(), start, closer)
    budget = STEPS_PER_LEVEL * 4 + 1  # the reserve at depth 3, the deepest start here
    text = start
    for remaining in range(budget, 0, -1):
        allowed = constraint.allowed(remaining)
        token = int(np.argmax(np.where(allowed, rng.normal(size=allowed.size), -np.inf)))
        if token in tokenizer.eos_ids:
            break
        constraint.accept(token)
        text += tokenizer.decode([token])
    assert isinstance(json.loads(text), dict)
