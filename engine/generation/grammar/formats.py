"""The grammars rigllm constrains replies with, as llguidance grammar text.

JSON replies use llguidance's JSON-schema compiler (compact: no free whitespace, so a reply spends no
tokens on layout). A forced tool call is a Lark grammar over the model's own XML call syntax (spec
§11.3): each listed function's element with its parameters in schema order (required ones present,
optional ones optional), each value in the form the server's parser converts back (text as is; numbers,
booleans and JSON values as JSON valid against the parameter's schema), so the call always parses,
always names a listed function and its arguments always validate.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from llguidance import LLMatcher

_JSON_OPTIONS = {"whitespace_flexible": False}


def json_schema_grammar(schema: Mapping[str, Any]) -> str:
    """One JSON value valid against `schema`."""
    return LLMatcher.grammar_from_json_schema(dict(schema), defaults=_JSON_OPTIONS)


def json_object_grammar() -> str:
    """Any one JSON object (`response_format: json_object`)."""
    return json_schema_grammar({"type": "object"})


def _lark_string(text: str) -> str:
    return json.dumps(text)


def _value_rule(rule: str, schema: Mapping[str, Any]) -> list[str]:
    """Rule(s) for one parameter's value followed by the parameter's close tag. Values the parser keeps
    as text (strings, string enums, untyped parameters: spec §11.3's convert) are written raw; the
    rest as JSON valid against the parameter's schema."""
    close = _lark_string("\n</parameter>\n")
    options = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if options and all(isinstance(o, str) for o in options):
        return [f"{rule}: (" + " | ".join(_lark_string(o) for o in options) + f") {close}"]
    if schema.get("type") in (None, "string") and not options:
        # Free text up to the first close tag: a lazy lexeme ends at the first place the tag matches.
        limit = schema.get("maxLength")
        repeat = f"{{0,{int(limit)}}}" if isinstance(limit, int) and limit >= 0 else "*"
        return [f"{rule}[lazy]: /(.|\\n){repeat}\\n<\\/parameter>\\n/"]
    return [f"{rule}: %json{json.dumps(dict(schema))} {close}"]


def _function_rules(index: int, function: Mapping[str, Any]) -> list[str]:
    """`body<index>`: one function element after `<function=NAME>\\n`; `call<index>`: after `<function=`."""
    name = function["name"]
    parameters = function.get("parameters") or {}
    properties: Mapping[str, Any] = parameters.get("properties") or {}
    required = set(parameters.get("required") or [])
    rules = [f"call{index}: {_lark_string(name + '>' + chr(10))} body{index}"]
    parts: list[str] = []
    for j, (param, schema) in enumerate(properties.items()):
        rule = f"fn{index}_p{j}"
        rules.append(f"{rule}: {_lark_string(f'<parameter={param}>' + chr(10))} {rule}_v")
        rules.extend(_value_rule(f"{rule}_v", schema if isinstance(schema, Mapping) else {}))
        parts.append(rule if param in required else f"{rule}?")
    parts.append(_lark_string("</function>\n</tool_call>"))
    return [f"body{index}: " + " ".join(parts)] + rules


def tool_call_grammar(functions: Sequence[Mapping[str, Any]], named: bool, parallel: bool) -> str:
    """Calls to `functions` (OpenAI `function` objects), continuing a reply forced to start with
    `<tool_call>\\n<function=` (or, when `named`, with `<tool_call>\\n<function=NAME>\\n`, and then
    `functions` is that one function). `parallel`: more whole calls (to any of them) may follow."""
    rules: list[str] = []
    for i, function in enumerate(functions):
        rules.extend(_function_rules(i, function))
    any_call = "(" + " | ".join(f"call{i}" for i in range(len(functions))) + ")"
    first = "body0" if named else any_call
    lines = [f"start: {first}" + (" more_calls*" if parallel else "")]
    if parallel:
        lines.append(f"more_calls: {_lark_string(chr(10) + '<tool_call>' + chr(10) + '<function=')} {any_call}")
    return LLMatcher.grammar_from_lark("\n".join(lines + rules))
