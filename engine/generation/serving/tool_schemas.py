"""A request's `tools` checked on arrival: OpenAI's shape, and every parameter schema valid JSON Schema.

The typed-argument conversion (engine.generation.tool_args) reads these schemas while the model
writes a call, on the generation thread; a schema that is not JSON Schema (`"type": 5`, `"anyOf": 5`)
must be refused here with a 400 naming its path, not discovered there. Nesting is bounded before the
validator runs, since the validator (like the template's `tojson`) recurses once per level.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jsonschema import SchemaError
from jsonschema.validators import validator_for

from engine.generation.serving.request_limits import LimitExceeded

MAX_SCHEMA_DEPTH = 32
MAX_TOOLS = 128


def nesting_depth(value: Any, limit: int) -> int:
    """How deeply `value`'s lists and objects nest (a scalar is 0), counting no further than `limit` + 1."""
    deepest = 0
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        children = item.values() if isinstance(item, Mapping) else item if isinstance(item, list) else ()
        pending.extend((child, depth + 1) for child in children)
    return deepest


def _function_of(index: int, tool: Any) -> Mapping[str, Any]:
    where = f"tools[{index}]"
    if not isinstance(tool, Mapping):
        raise LimitExceeded(f"{where} must be an object", "tools")
    if tool.get("type", "function") != "function":
        raise LimitExceeded(f"{where}.type must be \"function\"", f"tools.{index}.type")
    function = tool.get("function")
    if not isinstance(function, Mapping):
        raise LimitExceeded(f"{where}.function must be an object with a name (and optional parameters)",
                            f"tools.{index}.function")
    if not isinstance(function.get("name"), str) or not function["name"]:
        raise LimitExceeded(f"{where}.function.name must be a non-empty string", f"tools.{index}.function.name")
    return function


def check_tools(tools: Sequence[Any] | None) -> None:
    """Refuse (LimitExceeded, a 400) tools that are not OpenAI function tools with JSON Schema parameters."""
    if not tools:
        return
    if len(tools) > MAX_TOOLS:
        raise LimitExceeded(f"at most {MAX_TOOLS} tools are allowed", "tools")
    for index, tool in enumerate(tools):
        function = _function_of(index, tool)
        where = f"tools[{index}].function.parameters"
        parameters = function.get("parameters")
        if parameters is None:
            continue
        if not isinstance(parameters, Mapping):
            raise LimitExceeded(f"{where} must be a JSON Schema object", f"tools.{index}.function.parameters")
        if nesting_depth(parameters, MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH:
            raise LimitExceeded(f"{where} nests deeper than {MAX_SCHEMA_DEPTH} levels",
                                f"tools.{index}.function.parameters")
        try:
            validator_for(parameters).check_schema(parameters)
        except SchemaError as err:
            path = where + err.json_path.removeprefix("$")
            raise LimitExceeded(f"{path} is not valid JSON Schema: {err.message}",
                                f"tools.{index}.function.parameters") from None


def tool_names(tools: Sequence[Any]) -> set[str]:
    """The names of `tools`, once `check_tools` has passed them."""
    return {tool["function"]["name"] for tool in tools}
