"""The JSON object automaton: what it accepts agrees with `json.loads`, and its closing costs are exact."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.generation.json_constraint import (
    DONE,
    MAX_WHITESPACE,
    START_STATE,
    accepts,
    closing_cost,
    run,
    step,
)

VALID = [
    "{}",
    ' \n{ "a" : 1 }',
    '{"a": [1, -0.5e+3, 0, 10E-2, true, false, null, {"b": "x\\n\\"\\\\\\/\\b\\f\\r\\t\\u00e9 é 😀 日本"}]}',
    '{"": {}, "k": [], "n": [[[]]], "x": {"y": {"z": "w"}}}',
    '{"a":-0.0}',
    '{"\\ud83d\\ude00": "del \x7f"}',
]
INVALID = [
    "", "[]", '"x"', "1", "null", "{", '{"a"}', '{"a":}', '{"a":01}', '{"a":1,}', "{,}", '{"a":1}}', '{} {}',
    '{"a":"\x01"}', '{"a":"\\x"}', '{"a":"\\u12"}', '{"a": tru}', '{"a": True}', '{"a":1.}', '{"a":-}', '{"a":.5}',
    '{"a":1e}', '{"a":+1}', "{'a': 1}", '{"a" 1}', '{"a":[1 2]}', '{"a":[1,]}', '{"a":{]}', '{"a":[}',
    '{"a":"line\nbreak"}', "{}x",
]


@pytest.mark.parametrize("text", VALID)
def test_valid_objects_are_accepted(text: str) -> None:
    assert isinstance(json.loads(text), dict)
    assert accepts(text)


@pytest.mark.parametrize("text", INVALID)
def test_invalid_texts_are_rejected(text: str) -> None:
    assert not accepts(text)


@pytest.mark.parametrize("data", [
    b'{"a":"\xff"}', b'{"a":"\xc3"}', b'{"a":"\xc3x"}', b'{"a":"\x80"}', b'{"a":"\xe6\x97"}', b'{"a":"\xc0\xaf"}',
    b'{"a":"\xe0\x80\xaf"}', b'{"a":"\xed\xa0\x80"}', b'{"a":"\xf0\x80\x80\xaf"}', b'{"a":"\xf4\x90\x80\x80"}',
])
def test_malformed_utf8_in_strings_is_rejected(data: bytes) -> None:
    with pytest.raises(UnicodeDecodeError):
        data.decode("utf-8")
    assert not accepts(data)


@pytest.mark.parametrize("char", ["\x80", "\u07ff", "\u0800", "\ud7ff", "\ue000", "\uffff", "\U00010000", "\U0010ffff"])
def test_utf8_edges_are_accepted(char: str) -> None:
    assert accepts(f'{{"{char}": "{char}"}}'.encode())


def test_whitespace_runs_are_limited() -> None:
    assert accepts("{" + " " * MAX_WHITESPACE + "}")
    assert not accepts("{" + " " * (MAX_WHITESPACE + 1) + "}")
    assert accepts('{"a": "' + " " * 100 + '"}')  # inside a string spaces are text


def test_nothing_follows_the_closed_object() -> None:
    end = run(START_STATE, b"{}")
    assert end is not None and end[1] == DONE
    assert all(step(end, b) is None for b in range(256))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=8,
)


@given(value=st.dictionaries(st.text(max_size=6), json_values, max_size=5), ascii_only=st.booleans(),
       indent=st.sampled_from([None, 2]))
@settings(max_examples=50, deadline=None, database=None, derandomize=True)
def test_every_serialised_object_is_accepted(value: dict, ascii_only: bool, indent: int | None) -> None:
    assert accepts(json.dumps(value, ensure_ascii=ascii_only, indent=indent))


@given(text=st.text(alphabet='{}[]":,.-+0123456789eEtrufalsn \\ux', max_size=24))
@settings(max_examples=800, deadline=None, database=None, derandomize=True)
def test_agrees_with_json_loads(text: str) -> None:
    """Random near-JSON (shorter than a refused whitespace run): the automaton and json.loads agree."""
    try:
        is_object = isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        is_object = False
    assert accepts(text) == is_object


@given(prefix_of=st.dictionaries(st.text(max_size=4), json_values, max_size=4), cut=st.floats(0, 1))
@settings(max_examples=80, deadline=None, database=None, derandomize=True)
def test_closing_cost_is_exact_and_always_reachable(prefix_of: dict, cut: float) -> None:
    """From any prefix of a valid object, cost bytes (each lowering the cost by one) complete it."""
    data = json.dumps(prefix_of).encode()
    state = run(START_STATE, data[: int(cut * len(data))])
    assert state is not None
    completion = b""
    for _ in range(closing_cost(state)):
        options = [b for b in range(256) if (n := step(state, b)) is not None and closing_cost(n) == closing_cost(state) - 1]
        assert options
        completion += bytes([options[0]])
        state = step(state, options[0])
    assert state[1] == DONE
    assert isinstance(json.loads(data[: int(cut * len(data))] + completion), dict)
