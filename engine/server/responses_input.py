"""The Responses API's request (`POST /v1/responses`) as a chat completion request.

Input is text or items: messages (roles user/system/developer/assistant, text parts), `function_call`
and `function_call_output` items, `reasoning` items (their text becomes the next assistant turn's
reasoning). `instructions` lead as a system message and, as OpenAI documents, are not carried over by
`previous_response_id`; the earlier turns are, from a bounded in-memory store of past conversations, so
the follow-up's prompt extends the earlier one and the prefix cache restores its state.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

from pydantic import Field

from engine.generation.serving.request_error import APIError
from engine.server.wire import ChatCompletionRequest, RequestBody

KEPT_RESPONSES = 256
# and at most this many bytes of them (their JSON): 256 conversations near a 262K-token context would hold
# hundreds of MB for whoever chains requests, so the oldest go first once the sum passes this
KEPT_BYTES = 64 << 20


class ResponsesRequest(RequestBody):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stream: bool | None = False
    previous_response_id: str | None = None
    store: bool | None = True
    metadata: dict[str, Any] | None = None


class ConversationStore:
    """Past responses' whole conversations (chat messages), newest kept: `limit` of them and `max_bytes` of
    their JSON at most (a conversation larger than that alone is not kept)."""

    def __init__(self, limit: int = KEPT_RESPONSES, max_bytes: int = KEPT_BYTES):
        self._items: OrderedDict[str, tuple[list[dict[str, Any]], int]] = OrderedDict()
        self._limit, self._max_bytes, self._bytes = limit, max_bytes, 0
        self._lock = threading.Lock()

    def get(self, response_id: str) -> list[dict[str, Any]]:
        with self._lock:
            kept = self._items.get(response_id)
        if kept is None:
            raise APIError(404, f"previous_response_id '{response_id}' is not kept by this server (it keeps the "
                           f"last {self._limit} responses, {self._max_bytes >> 20} MiB of them at most, while it "
                           "runs)", param="previous_response_id")
        return list(kept[0])

    def put(self, response_id: str, messages: list[dict[str, Any]]) -> None:
        size = len(json.dumps(messages, default=str))  # ASCII JSON: its length is its size in bytes
        if size > self._max_bytes:
            return
        with self._lock:
            if response_id in self._items:
                self._bytes -= self._items.pop(response_id)[1]
            self._items[response_id] = (messages, size)
            self._bytes += size
            while len(self._items) > self._limit or self._bytes > self._max_bytes:
                self._bytes -= self._items.popitem(last=False)[1][1]


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text"):
                raise APIError(400, f"{where}: only text content parts are supported", param="input")
            parts.append(part.get("text", ""))
        return "".join(parts)
    raise APIError(400, f"{where}: content must be text or a list of text parts", param="input")


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages (the wire's `ChatMessage` fields) for the request's `input`."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise APIError(400, f"input[{i}]: role must be user, system, developer or assistant", param="input")
            message = {"role": role, "content": _text(item.get("content", ""), f"input[{i}]")}
            if role == "assistant" and reasoning:
                message["reasoning_content"] = "".join(reasoning)
                reasoning = []
            messages.append(message)
        elif kind == "function_call":
            call = {"id": item.get("call_id") or item.get("id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls") is not None:
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call],
                                 **({"reasoning_content": "".join(reasoning)} if reasoning else {})})
                reasoning = []
        elif kind == "function_call_output":
            output = item.get("output", "")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                             "content": output if isinstance(output, str) else _text(output, f"input[{i}]")})
        elif kind == "reasoning":
            reasoning += [part.get("text", "") for part in (item.get("content") or item.get("summary") or [])]
        else:
            raise APIError(400, f"input[{i}]: item type '{kind}' is not supported", param="input")
    return messages


def _chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise APIError(400, f"tools[{i}]: only function tools are supported", param="tools")
        fields = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        out.append({"type": "function", "function": fields})
    return out


def _chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format")
    if not fmt or fmt.get("type") != "json_schema":
        return fmt
    return {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}


def chat_request(req: ResponsesRequest, earlier: list[dict[str, Any]]) -> tuple[ChatCompletionRequest,
                                                                                 list[dict[str, Any]]]:
    """The chat request to run, and the conversation (without instructions) to keep for follow-ups."""
    conversation = earlier + input_messages(req.input)
    messages = ([{"role": "system", "content": req.instructions}] if req.instructions else []) + conversation
    effort = (req.reasoning or {}).get("effort")
    body = {"model": req.model, "messages": messages, "tools": _chat_tools(req.tools),
            "tool_choice": _chat_tool_choice(req.tool_choice), "parallel_tool_calls": req.parallel_tool_calls,
            "response_format": _response_format(req.text), "max_tokens": req.max_output_tokens,
            "temperature": req.temperature, "top_p": req.top_p, "seed": req.seed, "reasoning_effort": effort}
    try:
        return ChatCompletionRequest(**{k: v for k, v in body.items() if v is not None}), conversation
    except ValueError as err:
        raise APIError(400, f"input: {err}", param="input") from None
