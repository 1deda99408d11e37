"""`POST /v1/tokenize` and `/v1/detokenize`: let clients count and inspect tokens the way the model sees them.

Front ends use these to check whether a conversation still fits the context before sending it, so
tokenize renders messages through the same chat template and thinking switch as chat completions,
and never refuses a prompt for being longer than the context (that number is what the client wants).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from fastapi import FastAPI
from pydantic import Field

from engine.errors import RigllmError
from engine.generation.thinking_switch import choose_thinking
from engine.generation.serving.model_service import ModelService
from engine.generation.serving.request_error import APIError
from engine.generation.serving.request_limits import LimitExceeded, check_prompt_length, text_length
from engine.server.request_jobs import check_model, template_message
from engine.server.wire import ChatMessage, RequestBody


class TokenizeRequest(RequestBody):
    """Exactly one of `content` (raw text, special tokens parsed) or `messages` (rendered by the template)."""

    model: str | None = None
    content: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    add_generation_prompt: bool = True
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(RequestBody):
    model: str | None = None
    tokens: list[int]


def tokenize(service: ModelService, req: TokenizeRequest) -> dict[str, Any]:
    check_model(service, req.model)
    if (req.content is None) == (req.messages is None):
        raise APIError(400, "give exactly one of 'content' or 'messages'", param="content")
    chars = len(req.content) if req.content is not None else text_length([m.model_dump() for m in req.messages])
    try:
        check_prompt_length(chars, service.context_length, service.max_token_chars, "content")
    except LimitExceeded as err:
        raise APIError(400, str(err), param=err.param, code="context_length_exceeded") from None
    if req.content is not None:
        ids = service.tokenizer.encode(req.content, parse_special=True)
    else:
        enable_thinking = (req.chat_template_kwargs or {}).get("enable_thinking")
        if enable_thinking is not None and not isinstance(enable_thinking, bool):
            raise APIError(400, "chat_template_kwargs.enable_thinking must be true or false",
                           param="chat_template_kwargs")
        messages = [template_message(i, m) for i, m in enumerate(req.messages)]
        choice = choose_thinking(messages, enable_thinking)
        try:
            text = service.template.render(choice.messages, tools=req.tools or None,
                                           add_generation_prompt=req.add_generation_prompt,
                                           enable_thinking=choice.enable_thinking)
        except RigllmError as err:  # the template refused the conversation (e.g. no user message)
            raise APIError(400, str(err), param="messages") from None
        ids = service.tokenizer.encode(text, parse_special=True)
    return {"tokens": ids, "count": len(ids), "max_model_len": service.context_length}


def detokenize(service: ModelService, req: DetokenizeRequest) -> dict[str, Any]:
    check_model(service, req.model)
    size = service.tokenizer.vocab_size
    for i, token in enumerate(req.tokens):
        if not 0 <= token < size:
            raise APIError(400, f"tokens[{i}] = {token} is not a token id (the vocabulary has ids 0..{size - 1})",
                           param=f"tokens.{i}", code="invalid_value")
    return {"content": service.tokenizer.decode(req.tokens)}


def add_tokenize_routes(app: FastAPI, service: Callable[[], ModelService], pool: Executor) -> None:
    """Both routes with and without the `/v1` prefix, like every other route; `service()` is the model
    loaded at the time of the request (it raises the 503 when there is none).

    They run in `pool`, the app's request-preparation threads: a long text must not stall other streams.
    """

    async def tokenize_route(req: TokenizeRequest) -> dict[str, Any]:
        return await asyncio.get_running_loop().run_in_executor(pool, tokenize, service(), req)

    async def detokenize_route(req: DetokenizeRequest) -> dict[str, Any]:
        return await asyncio.get_running_loop().run_in_executor(pool, detokenize, service(), req)

    for prefix in ("/v1", ""):
        app.add_api_route(f"{prefix}/tokenize", tokenize_route, methods=["POST"])
        app.add_api_route(f"{prefix}/detokenize", detokenize_route, methods=["POST"])
