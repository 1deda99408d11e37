"""`response_format`: plain text, or JSON (any object, or one valid against a schema) by constrained decoding."""

from __future__ import annotations

from typing import Any

from engine.generation.grammar.constraint import GrammarConstraint, GrammarError
from engine.generation.grammar.formats import json_object_grammar, json_schema_grammar
from engine.generation.grammar.json_closing import JsonCloser
from engine.generation.grammar.vocabulary import grammar_vocabulary
from engine.generation.serving.request_error import APIError
from engine.generation.tokenizer import Tokenizer


def json_constraint_for(response_format: dict[str, Any] | None, tokenizer: Tokenizer) -> GrammarConstraint | None:
    """The job's grammar for `json_object` / `json_schema` (strict or not: both are enforced), None for
    text; 400 for anything else. The first use builds llguidance's view of the vocabulary (about a
    second for 248K tokens), on the request's thread, not the generation worker's."""
    kind = (response_format or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return grammar_constraint(json_object_grammar(), tokenizer, "response_format", JsonCloser(tokenizer))
    if kind == "json_schema":
        spec = response_format.get("json_schema") if response_format else None
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise APIError(400, "response_format json_schema needs json_schema.schema, a JSON Schema object",
                           param="response_format")
        return grammar_constraint(json_schema_grammar(schema), tokenizer, "response_format", JsonCloser(tokenizer))
    raise APIError(400, f"response_format type {kind!r} is not one of 'text', 'json_object', 'json_schema'",
                   param="response_format")


def grammar_constraint(grammar: str, tokenizer: Tokenizer, param: str,
                       closer: JsonCloser | None = None) -> GrammarConstraint:
    """A fresh matcher for `grammar`; a 400 naming `param` when it does not compile."""
    try:
        return GrammarConstraint(grammar_vocabulary(tokenizer), grammar, tokenizer.vocab_size, closer)
    except (GrammarError, ValueError) as err:
        raise APIError(400, f"{param}: the schema cannot be used for constrained decoding: {err}",
                       param=param) from None
