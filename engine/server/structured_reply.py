"""The grammar a chat reply is held to and the thinking budget that leaves it room.

A required or named `tool_choice` becomes a grammar over the model's own call syntax (after the
forced `<tool_call>\\n<function=` start `request_jobs` puts in the prompt), so the reply is always a
call to a listed function with arguments valid against its schema. Reasoning comes before any
grammar; when a reply is constrained, its thinking is capped at half of `max_tokens` unless the
request asks for less, so the structured part always has the other half.
"""

from __future__ import annotations

from typing import Any

from engine.generation.grammar.constraint import GrammarConstraint
from engine.generation.grammar.formats import tool_call_grammar
from engine.generation.serving.request_error import APIError
from engine.generation.tokenizer import Tokenizer
from engine.server.response_format import grammar_constraint

# Thinking tokens per `reasoning_effort` (OpenAI's levels; rigllm's own numbers, none is unlimited).
EFFORT_BUDGETS: dict[str, int | None] = {"none": 0, "minimal": 128, "low": 512, "medium": 2048, "high": 8192,
                                         "xhigh": None}


def tool_choice_constraint(tools: list[dict[str, Any]], named: str | None, parallel: bool,
                           tokenizer: Tokenizer) -> GrammarConstraint:
    """The grammar for a forced call: to `named`, or (for "required") to any of `tools`."""
    functions = [t["function"] for t in tools if t.get("type", "function") == "function" and "function" in t]
    if named is not None:
        functions = [f for f in functions if f.get("name") == named]
    if not functions or any(not isinstance(f.get("name"), str) for f in functions):
        raise APIError(400, "every tool needs a function with a name", param="tools")
    return grammar_constraint(tool_call_grammar(functions, named=named is not None, parallel=parallel),
                              tokenizer, "tools")


def thinking_budget(effort: str | None, max_thinking_tokens: int | None, max_tokens: int,
                    constrained: bool) -> int | None:
    """Reasoning tokens before `</think>` is forced; None when nothing limits them."""
    if effort is not None and effort not in EFFORT_BUDGETS:
        raise APIError(400, f"reasoning_effort must be one of {', '.join(EFFORT_BUDGETS)}", param="reasoning_effort")
    asked = [b for b in (max_thinking_tokens, EFFORT_BUDGETS.get(effort) if effort else None) if b is not None]
    if constrained:
        asked.append(max_tokens // 2)
    return min(asked) if asked else None
