"""Schema-driven conversion of XML tool-call parameter text (spec §11.3, pitfall 17)."""

from __future__ import annotations

from typing import Any

import pytest

from engine.generation.tool_args import convert_arguments, convert_value, schema_types, tool_parameters


@pytest.mark.parametrize(
    "raw, schema, expected",
    [
        ("007", {"type": "string"}, "007"),
        ("true", {"type": "string"}, "true"),
        (" padded \n", {"type": "string"}, " padded \n"),
        ('{"a": 1}', {"type": "string"}, '{"a": 1}'),
        ("null", {"type": "string"}, None),
        ("NULL", {"type": "integer"}, None),
        ("42", {"type": "integer"}, 42),
        (" -7 ", {"type": "integer"}, -7),
        ("007", {"type": "integer"}, 7),
        ("4.2", {"type": "integer"}, "4.2"),
        ("1_000", {"type": "integer"}, "1_000"),
        ("3.5", {"type": "number"}, 3.5),
        ("2", {"type": "number"}, 2),
        ("1e3", {"type": "number"}, 1000.0),
        ("nan", {"type": "number"}, "nan"),
        ("1e999", {"type": "number"}, "1e999"),
        ("True", {"type": "boolean"}, True),
        ("false", {"type": "boolean"}, False),
        ("yes", {"type": "boolean"}, "yes"),
        ('{"a": [1, "x"]}', {"type": "object"}, {"a": [1, "x"]}),
        ("[1]", {"type": "object"}, "[1]"),
        ("[1, 2]", {"type": "array", "items": {"type": "integer"}}, [1, 2]),
        ("not json", {"type": "array"}, "not json"),
        ("5", {"type": ["integer", "null"]}, 5),
        ("5", {"type": ["string", "integer"]}, "5"),
        ("true", {"anyOf": [{"type": "integer"}, {"type": "boolean"}]}, True),
        ("metric", {"enum": ["metric", "imperial"]}, "metric"),
        ("3", {"enum": [1, 2, 3]}, 3),
        ('{"k": 1}', {"properties": {"k": {"type": "integer"}}}, {"k": 1}),
        ("12", {}, "12"),
        ("12", {"description": "no type"}, "12"),
        ("12", None, "12"),
    ],
)
def test_convert_value(raw: str, schema: dict[str, Any] | None, expected: Any) -> None:
    value = convert_value(raw, schema)
    assert value == expected and type(value) is type(expected)


def test_schema_types_collects_unions() -> None:
    assert schema_types({"type": ["number", "null"], "anyOf": [{"type": "boolean"}], "oneOf": [{"type": "array"}]}) == [
        "number", "null", "boolean", "array"]


def test_convert_arguments_uses_the_named_tool_schema() -> None:
    tools = [
        {"type": "function",
         "function": {"name": "a", "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}}},
        {"name": "b", "parameters": {"type": "object", "properties": {"n": {"type": "string"}}}},
    ]
    assert convert_arguments("a", {"n": "1", "other": "2"}, tools) == {"n": 1, "other": "2"}
    assert convert_arguments("b", {"n": "1"}, tools) == {"n": "1"}
    assert convert_arguments("missing", {"n": "1"}, tools) == {"n": "1"}
    assert convert_arguments("a", {"n": "1"}, None) == {"n": "1"}
    assert tool_parameters(tools, "b") == {"n": {"type": "string"}}
