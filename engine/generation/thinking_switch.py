"""Decide whether the model thinks for this request: the `enable_thinking` flag, else `/think` / `/no_think`.

Qwen3.5 templates do not implement the soft switches (spec §11.4), so rigllm offers them as a
convenience (contracts.md, "Chat template and thinking switches"): a directive counts only when it
stands alone at the very end of a user or system message (`Explain X /no_think`, not `a/no_think` or
`/no_think mid-sentence`). It is stripped there, in every message, so the prompt never contains it
and a conversation renders the same way on every turn (prefix caches stay valid). The last directive
in the conversation wins.

Precedence: an explicit per-request `enable_thinking` (API `chat_template_kwargs`, the app's toggle)
wins over directives. The flag is what the caller deliberately set for this request; directives exist
for clients that cannot set it, and an old directive deep in the history must not override a fresh
toggle. With neither, `enable_thinking` stays None and the template's own default applies.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

_DIRECTIVE = re.compile(r"(?:^|(?<=\s))/(no_think|think)\s*\Z")
_SWITCH_ROLES = ("user", "system")


@dataclass(frozen=True)
class ThinkingChoice:
    """The messages to render (directives removed) and the `enable_thinking` value to pass."""

    messages: list[dict[str, Any]]
    enable_thinking: bool | None
    source: Literal["request", "directive", "template default"]


def strip_directive(text: str) -> tuple[str, bool | None]:
    """`text` without a trailing standalone directive, and what it asked for (None: there was none)."""
    match = _DIRECTIVE.search(text)
    if match is None:
        return text, None
    return text[: match.start()].rstrip(), match.group(1) == "think"


def _strip_content(content: Any) -> tuple[Any, bool | None]:
    """Strip the directive from a string content, or from the last part when that part is text."""
    if isinstance(content, str):
        return strip_directive(content)
    if isinstance(content, list) and content:
        last = content[-1]
        if isinstance(last, Mapping) and last.get("type", "text") == "text" and isinstance(last.get("text"), str):
            text, wanted = strip_directive(last["text"])
            if wanted is not None:
                return [*content[:-1], {**last, "text": text}], wanted
    return content, None


def choose_thinking(messages: Sequence[Mapping[str, Any]], enable_thinking: bool | None = None) -> ThinkingChoice:
    """Apply the rules in the module docstring; the caller's messages are not modified."""
    stripped: list[dict[str, Any]] = []
    last_directive: bool | None = None
    for message in messages:
        msg = dict(message)
        if msg.get("role") in _SWITCH_ROLES:
            content, wanted = _strip_content(msg.get("content"))
            if wanted is not None:
                msg["content"] = content
                last_directive = wanted
        stripped.append(msg)
    if enable_thinking is not None:
        return ThinkingChoice(stripped, bool(enable_thinking), "request")
    if last_directive is not None:
        return ThinkingChoice(stripped, last_directive, "directive")
    return ThinkingChoice(stripped, None, "template default")
