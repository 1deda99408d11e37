"""Logprobs in the API: which the request asks for, and the OpenAI shapes they are returned in.

Chat (`logprobs: true`, `top_logprobs: 0-20`): `{"content": [{token, logprob, bytes, top_logprobs:
[{token, logprob, bytes}]}]}`. Text completions (`logprobs: 0-5`, OpenAI's legacy form): parallel
lists `tokens`, `token_logprobs`, `top_logprobs` (one dict per token: the best `logprobs` tokens and
the sampled one, so up to logprobs + 1 entries, as OpenAI documents) and `text_offset`. Every
generated token gets an entry, reasoning tokens included; end tokens get none. A token's text is
its bytes decoded as UTF-8 (a token that ends inside a character shows U+FFFD; `bytes` is exact).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.generation.logprobs import MAX_TOP_LOGPROBS
from engine.generation.serving.request_error import APIError
from engine.generation.serving.generation_job import LogprobEntry
from engine.server.wire import ChatCompletionRequest, SamplingFields

MAX_COMPLETION_LOGPROBS = 5  # OpenAI's limit for the legacy `logprobs` integer


def requested_top_logprobs(req: SamplingFields) -> int | None:
    """None when the request wants no logprobs, else how many alternatives per token; 400 when invalid."""
    if isinstance(req, ChatCompletionRequest):
        top = req.top_logprobs
        if top is not None and not req.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
            raise APIError(400, f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {top}", param="top_logprobs")
        return (top or 0) if req.logprobs else None
    count = getattr(req, "logprobs", None)
    if count is not None and not 0 <= count <= MAX_COMPLETION_LOGPROBS:
        raise APIError(400, f"logprobs must be in [0, {MAX_COMPLETION_LOGPROBS}], got {count}", param="logprobs")
    return count


def _text(token: bytes) -> str:
    return token.decode("utf-8", errors="replace")


def chat_logprobs(entries: Sequence[LogprobEntry]) -> dict[str, Any]:
    return {"content": [
        {"token": _text(e.token), "logprob": e.logprob, "bytes": list(e.token),
         "top_logprobs": [{"token": _text(t), "logprob": lp, "bytes": list(t)} for t, lp in e.top]}
        for e in entries]}


def completion_logprobs(entries: Sequence[LogprobEntry]) -> dict[str, Any]:
    return {
        "tokens": [_text(e.token) for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{**{_text(t): lp for t, lp in e.top}, _text(e.token): e.logprob} for e in entries],
        "text_offset": [e.text_offset for e in entries],
    }


def logprobs_payload(entries: Sequence[LogprobEntry], chat: bool) -> dict[str, Any]:
    return chat_logprobs(entries) if chat else completion_logprobs(entries)
