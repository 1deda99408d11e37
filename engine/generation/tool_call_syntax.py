"""Read the calls out of one complete tool-call block the model wrote (spec §11.3).

Two syntaxes are accepted: the XML form Qwen3.5 is trained on (`<function=NAME>` holding
`<parameter=P>` elements), and the JSON fallback (contracts.md), a block whose body is one JSON object
with `name` and `arguments`. Anything else is malformed and yields None, so that the caller can show the
text as ordinary content instead of inventing a call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.generation.tool_args import convert_arguments

FUNCTION_OPEN = "<function="
FUNCTION_CLOSE = "</function>"
_PARAMETER_CLOSE = "</parameter>"
_PARAMETER_OPEN = "<parameter="
_NAME = r"([^<>\n]+)>"
_FUNCTION_HEAD = re.compile(re.escape(FUNCTION_OPEN) + _NAME)
_PARAMETER_HEAD = re.compile(re.escape(_PARAMETER_OPEN) + _NAME)
_SPACE = re.compile(r"\s*")


@dataclass(frozen=True)
class ParsedCall:
    """One call: the tool's name and its arguments as JSON values."""

    name: str
    arguments: dict[str, Any]


def _raw_value(text: str) -> str:
    """A parameter's text without the one newline the format puts after the open and before the close tag."""
    if text.startswith("\n"):
        text = text[1:]
    return text[:-1] if text.endswith("\n") else text


def _parameters(inner: str) -> dict[str, str] | None:
    """The raw `<parameter=…>` values inside a function element; None if other text sits between them.

    A missing `</parameter>` is tolerated (the value then runs to the next `<parameter=` or the end), as
    vLLM's and llama.cpp's parsers for this format do.
    """
    values: dict[str, str] = {}
    pos = _SPACE.match(inner).end()
    while pos < len(inner):
        head = _PARAMETER_HEAD.match(inner, pos)
        if head is None or not head.group(1).strip():
            return None
        start = head.end()
        close = inner.find(_PARAMETER_CLOSE, start)
        following = inner.find(_PARAMETER_OPEN, start)
        if close < 0 or 0 <= following < close:
            end = following if following >= 0 else len(inner)
            pos = end
        else:
            end = close
            pos = close + len(_PARAMETER_CLOSE)
        values[head.group(1).strip()] = _raw_value(inner[start:end])
        pos = _SPACE.match(inner, pos).end()
    return values


def parse_function_elements(text: str, tools: Sequence[Mapping[str, Any]] | None) -> list[ParsedCall] | None:
    """Calls from one or more `<function=NAME>…</function>` elements separated only by whitespace."""
    calls: list[ParsedCall] = []
    pos = _SPACE.match(text).end()
    while pos < len(text):
        head = _FUNCTION_HEAD.match(text, pos)
        if head is None or not head.group(1).strip():
            return None
        close = text.find(FUNCTION_CLOSE, head.end())
        if close < 0:
            return None
        raw_arguments = _parameters(text[head.end():close])
        if raw_arguments is None:
            return None
        name = head.group(1).strip()
        calls.append(ParsedCall(name, convert_arguments(name, raw_arguments, tools)))
        pos = _SPACE.match(text, close + len(FUNCTION_CLOSE)).end()
    return calls or None


def parse_json_call(text: str) -> ParsedCall | None:
    """The JSON fallback: `{"name": …, "arguments": {…}}`; arguments may be a JSON string of an object.

    A missing or null `arguments` means a call without arguments.
    """
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"].strip():
        return None
    arguments = obj.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(obj["name"].strip(), arguments)


def parse_tool_call_body(body: str, tools: Sequence[Mapping[str, Any]] | None) -> list[ParsedCall] | None:
    """The calls in the text between `<tool_call>` and `</tool_call>`, or None when it is malformed."""
    stripped = body.strip()
    if stripped.startswith("{"):
        call = parse_json_call(stripped)
        return [call] if call is not None else None
    return parse_function_elements(stripped, tools)
