"""Turn the raw text of a tool-call parameter into the JSON value its schema asks for (spec §11.3).

In the XML call format every value is plain text, so the model cannot say whether `007` or `true` is a
string or a number/boolean. The request's tool definition can: values are converted by the declared
JSON-schema type, never by guessing (pitfall 17: `json.loads` on everything turns the string `007`
into an error and the string `true` into a boolean). Whenever a conversion does not fit, the raw
string is kept, so no text the model wrote is lost.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

_INTEGER = re.compile(r"[+-]?\d+")
_DECIMAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_STRING_TYPES = {"string", "str", "text", "enum"}


def tool_parameters(tools: Sequence[Mapping[str, Any]] | None, name: str) -> Mapping[str, Any] | None:
    """The `properties` schema of the tool called `name` (OpenAI `{"type":"function","function":…}` or bare)."""
    for tool in tools or ():
        function = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping) and function.get("name") == name:
            parameters = function.get("parameters")
            properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
            return properties if isinstance(properties, Mapping) else None
    return None


def schema_types(schema: Mapping[str, Any]) -> list[str]:
    """The JSON types a parameter schema allows, in its order (`type` lists and `anyOf`/`oneOf` included)."""
    declared = schema.get("type")
    types = [declared] if isinstance(declared, str) else [t for t in declared or () if isinstance(t, str)]
    for key in ("anyOf", "oneOf"):
        for option in schema.get(key) or ():
            if isinstance(option, Mapping):
                types.extend(schema_types(option))
    if not types and isinstance(schema.get("enum"), list):
        types = ["string"] if all(isinstance(v, str) for v in schema["enum"]) else ["json"]
    if not types and "properties" in schema:
        types = ["object"]
    if not types and "items" in schema:
        types = ["array"]
    return types


def _as_type(raw: str, json_type: str) -> tuple[bool, Any]:
    """(True, value) when `raw` is a valid value of `json_type`, else (False, None)."""
    text = raw.strip()
    if json_type == "integer":
        return (True, int(text)) if _INTEGER.fullmatch(text) else (False, None)
    if json_type == "number":
        if _INTEGER.fullmatch(text):
            return True, int(text)
        if _DECIMAL.fullmatch(text) and math.isfinite(value := float(text)):
            return True, value
        return False, None
    if json_type == "boolean":
        lowered = text.lower()
        return (True, lowered == "true") if lowered in ("true", "false") else (False, None)
    try:
        value = json.loads(text)
    except ValueError:
        return False, None
    if json_type == "object":
        return isinstance(value, dict), value
    if json_type == "array":
        return isinstance(value, list), value
    return True, value


def convert_value(raw: str, schema: Mapping[str, Any] | None) -> Any:
    """`raw` as the value `schema` declares; `null` is None; strings, unknown parameters and misfits stay raw."""
    if raw.strip().lower() == "null":
        return None
    if not isinstance(schema, Mapping):
        return raw
    types = schema_types(schema)
    if not types or any(t in _STRING_TYPES for t in types):
        return raw
    for json_type in types:
        if json_type == "null":
            continue
        fits, value = _as_type(raw, json_type)
        if fits:
            return value
    return raw


def convert_arguments(name: str, raw_arguments: Mapping[str, str],
                      tools: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
    """All parameters of one call to tool `name`, each converted by its schema in the request's tools."""
    properties = tool_parameters(tools, name) or {}
    return {key: convert_value(raw, properties.get(key)) for key, raw in raw_arguments.items()}
