"""Read an XML tool call (spec §11.3) piece by piece while it is being written, for streamed arguments.

`OutputParser` uses these steps so that a call's name can go out as soon as it is certain and each
argument as soon as its `<parameter=…>` element ends, instead of after the whole block. Every step
looks only at text already received and answers WAIT when more text could still change the answer,
so the result never depends on how the reply was cut into deltas. The grammar is the one
engine.generation.tool_call_syntax accepts for whole blocks (same tags, the same tolerance of a
missing `</parameter>`, the same schema conversion of values), so a well-formed call streams exactly
the arguments the whole-block parser gives.

A head counts as certain only when `<function=NAME>` is followed (after whitespace) by `<parameter=`
or `</function>`: prose that merely mentions a `<function=x>` tag is not taken for a call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.generation.tool_args import convert_arguments
from engine.generation.tool_call_syntax import FUNCTION_CLOSE, FUNCTION_OPEN
from engine.generation.tool_call_syntax import _PARAMETER_CLOSE as PARAMETER_CLOSE
from engine.generation.tool_call_syntax import _PARAMETER_OPEN as PARAMETER_OPEN
from engine.generation.tool_call_syntax import _raw_value

WAIT = "wait"  # the text so far cannot decide; feed more
_NAME = re.compile(r"([^<>\n]*)>")
_VALUE_ENDS = (PARAMETER_CLOSE, PARAMETER_OPEN, FUNCTION_CLOSE)


@dataclass(frozen=True)
class Head:
    """A certain `<function=NAME>`: `end` is where the text after the tag starts."""

    name: str
    end: int


@dataclass(frozen=True)
class Parameter:
    """One finished `<parameter=NAME>` element: its raw value and where the text after it starts."""

    name: str
    raw: str
    end: int


def _could_become(text: str, tags: Sequence[str]) -> bool:
    """Is `text` (non-empty) a proper prefix of one of `tags`?"""
    return any(len(text) < len(tag) and tag.startswith(text) for tag in tags)


def _tag_name(text: str, opener: str, final: bool) -> tuple[str, int] | str | None:
    """The stripped name of an `opener…>` tag at the start of `text` and the end of the tag; WAIT when
    the tag is still being written; None when it is not such a tag (or its name is empty)."""
    match = _NAME.match(text, len(opener))
    if match is None:
        rest = text[len(opener):]
        return WAIT if not final and not any(c in rest for c in "<>\n") else None
    name = match.group(1).strip()
    return (name, match.end()) if name else None


def read_head(text: str, final: bool) -> Head | str | None:
    """`text` starts with `<function=`: the call's head once certain, WAIT, or None (not a streamable call)."""
    tag = _tag_name(text, FUNCTION_OPEN, final)
    if not isinstance(tag, tuple):
        return tag
    name, end = tag
    after = text[end:].lstrip()
    if after.startswith(PARAMETER_OPEN) or after.startswith(FUNCTION_CLOSE):
        return Head(name, end)
    if not final and (not after or _could_become(after, (PARAMETER_OPEN, FUNCTION_CLOSE))):
        return WAIT
    return None


def read_parameter(text: str, final: bool) -> Parameter | str | None:
    """`text` starts with `<parameter=`: the element once it has ended, WAIT, or None (malformed).

    A value ends at `</parameter>`, or (close tag missing) at the next `<parameter=` or `</function>`;
    when the reply ends inside it, the value is what was written, less a partial closing tag.
    """
    tag = _tag_name(text, PARAMETER_OPEN, final)
    if not isinstance(tag, tuple):
        return tag
    name, start = tag
    ends = [(i, t) for i, t in ((text.find(t, start), t) for t in _VALUE_ENDS) if i >= 0]
    if ends:
        at, closer = min(ends)
        return Parameter(name, _raw_value(text[start:at]), at + len(closer) if closer == PARAMETER_CLOSE else at)
    if not final:
        return WAIT
    value = text[start:]
    cut = value.rfind("<")
    if cut >= 0 and _could_become(value[cut:], _VALUE_ENDS):
        value = value[:cut]
    return Parameter(name, _raw_value(value), len(text))


@dataclass
class OpenCall:
    """A call whose head went out: the argument JSON is built one parameter at a time.

    The fragments, joined, are `json.dumps(arguments)` of the parameters so far plus the closing
    brace (a parameter named twice streams twice; JSON readers keep the last value, as `arguments` does).
    """

    index: int
    id: str
    name: str
    in_block: bool  # inside `<tool_call>` (else a bare `<function=…>`, pitfall 17)
    tools: Sequence[Mapping[str, Any]] | None
    arguments: dict[str, Any] = field(default_factory=dict)
    _streamed: int = 0

    def add(self, parameter: Parameter) -> str:
        """Convert the parameter by its schema; the argument fragment that adds it."""
        value = convert_arguments(self.name, {parameter.name: parameter.raw}, self.tools)[parameter.name]
        self.arguments[parameter.name] = value
        self._streamed += 1
        item = json.dumps({parameter.name: value}, ensure_ascii=False)[1:-1]
        return ("{" if self._streamed == 1 else ", ") + item

    def close(self) -> str:
        """The last fragment: the closing brace (the whole `{}` for a call without arguments)."""
        return "}" if self._streamed else "{}"
