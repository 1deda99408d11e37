"""Request bodies of the OpenAI API as pydantic models; unknown fields are ignored, as OpenAI's are not.

One field is rigllm's own: `"speculative": false` turns speculative decoding with the model's MTP head
off for the request (it is on by default when the model has a head; the output's distribution is the
same either way, only the speed differs).

Only types are checked here; value ranges (temperature ≥ 0, top_p in (0, 1], …) are checked by
SamplingParams so the API and the CLI refuse the same values with the same words.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

MAX_MESSAGES = 16384  # messages and content parts per request: validating each costs microseconds holding the GIL


def unpaired_surrogate_at(data: Any) -> str | None:
    """The dotted path of a string (value or key) in parsed JSON that is not valid Unicode, or None.

    JSON's `\\ud800` escapes decode to lone surrogates, which nothing downstream can encode (the
    tokenizer, the error response itself), so they are refused here with a 400.
    """
    pending: list[tuple[str, Any]] = [("", data)]
    while pending:
        path, value = pending.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return path or "body"
        elif isinstance(value, dict):
            for key, item in value.items():
                safe_key = str(key).encode("utf-8", "backslashreplace").decode("utf-8")
                where = f"{path}.{safe_key}" if path else safe_key
                pending.extend([(where, key), (where, item)])
        elif isinstance(value, list):
            pending.extend((f"{path}.{i}" if path else str(i), item) for i, item in enumerate(value))
    return None


def too_many_messages(data: Any) -> str | None:
    """Why a body's `messages` are too many to validate (more messages or content parts than
    MAX_MESSAGES), or None. Checked before anything else, so an 8 MB body of 500,000 tiny messages
    costs a length check instead of seconds of validation that stall every other request."""
    messages = data.get("messages") if isinstance(data, dict) else None
    if not isinstance(messages, list):
        return None
    parts = len(messages) + sum(len(m["content"]) for m in messages
                                if isinstance(m, dict) and isinstance(m.get("content"), list))
    if parts > MAX_MESSAGES:
        return f"messages: at most {MAX_MESSAGES} messages and content parts are allowed (got {parts})"
    return None


class RequestBody(BaseModel):
    """A whole request body: refuses text that is not valid Unicode (and more messages than
    MAX_MESSAGES) before any field is used."""

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        too_many = too_many_messages(data)
        if too_many is not None:
            raise ValueError(too_many)
        where = unpaired_surrogate_at(data)
        if where is not None:
            raise ValueError(f"{where}: the text is not valid Unicode (it contains an unpaired surrogate)")
        return data


class ImageURL(BaseModel):
    url: str
    detail: str | None = None  # OpenAI's low/high/auto; ignored: the image's size decides its tokens


class ContentPart(BaseModel):
    """A text part, or an `image_url` part (a data URL; `image_url` may also be the bare URL string)."""

    type: str
    text: str | None = None
    image_url: ImageURL | str | None = None


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(RequestBody):
    """Fields shared by chat and text completions."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = 1  # 1-8 choices (request_fields.MAX_CHOICES)
    logit_bias: dict[str, float] | None = None  # token id (as a string) to a bias in [-100, 100]
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    speculative: bool | None = None  # None: the server's default (on when the model has an MTP head)
    deadline_seconds: float | None = None  # rigllm's own: stop generating this long after arrival ("length")


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None  # False: a forced call is exactly one call
    functions: list[dict[str, Any]] | None = None  # legacy: mapped to tools (request_fields.legacy_tools)
    function_call: str | dict[str, Any] | None = None  # legacy: mapped to tool_choice
    reasoning_effort: str | None = None  # caps the thinking tokens (structured_reply.EFFORT_BUDGETS)
    max_thinking_tokens: int | None = Field(default=None, ge=0)  # rigllm's own cap on thinking tokens
    logprobs: bool | None = None
    top_logprobs: int | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]  # text or token ids, one prompt or a batch
    echo: bool | None = False
    logprobs: int | None = None  # the legacy form: how many alternatives per token (0-5)
