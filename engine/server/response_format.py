"""`response_format`: plain text, or JSON mode (constrained decoding to one JSON object)."""

from __future__ import annotations

from typing import Any

from engine.generation.json_constraint import JsonConstraint, json_vocab
from engine.generation.tokenizer import Tokenizer
from engine.generation.serving.request_error import APIError


def json_constraint_for(response_format: dict[str, Any] | None, tokenizer: Tokenizer) -> JsonConstraint | None:
    """The job's JSON automaton for `{"type": "json_object"}`, None for text; 400 for anything else.

    Building the vocabulary's JSON tables the first time takes about a second for a 248K vocabulary;
    this runs on the request's thread, not the generation worker's.
    """
    kind = (response_format or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return JsonConstraint(json_vocab(tokenizer))
    if kind == "json_schema":
        raise APIError(400, "response_format 'json_schema' is not supported yet; use {\"type\": \"json_object\"} "
                       "(any JSON object) and describe the schema in the prompt", param="response_format")
    raise APIError(400, f"response_format type {kind!r} is not one of 'text', 'json_object'", param="response_format")
