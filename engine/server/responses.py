"""Turn a job's events into OpenAI chat/text completion objects, streamed (SSE chunks) or whole.

Tool calls stream as OpenAI does: a first delta with index, id, type and the function name (arguments
""), then the argument JSON in pieces, one per parameter as the model finishes it (the parser's
`ToolCallStart` / `ToolCallArguments`); the finish chunk carries "tool_calls". Whole responses use the
complete `ToolCall`s. With `stream_options.include_usage` a last chunk with empty `choices` carries
the usage.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from engine.generation.output_parser import ContentDelta, ReasoningDelta, ToolCall, ToolCallArguments, ToolCallStart
from engine.server.api_errors import error_body
from engine.generation.serving.generation_job import AsyncSink, Failed, Finished, Job, Piece
from engine.server.logprob_format import logprobs_payload


def sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


def usage(done: Finished) -> dict[str, Any]:
    return {
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
        "completion_tokens_details": {
            "reasoning_tokens": done.reasoning_tokens,
            # OpenAI's names for predicted tokens the model kept or threw away: here the MTP head's drafts
            "accepted_prediction_tokens": done.accepted_draft_tokens,
            "rejected_prediction_tokens": done.draft_tokens - done.accepted_draft_tokens,
        },
        "prompt_tokens_details": {"cached_tokens": done.cached_tokens, "image_tokens": done.image_tokens},
    }


async def job_results(job: Job, sink: AsyncSink) -> AsyncIterator[Piece | Finished | Failed]:
    """The job's events until its end; if the consumer stops early, the worker is told to stop."""
    try:
        while True:
            item = await sink.get()
            yield item
            if not isinstance(item, Piece):
                return
    finally:
        job.cancelled.set()


class CompletionShape:
    """Ids and headers shared by every chunk of one response."""

    def __init__(self, model: str, chat: bool):
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.model = model
        self.object = "chat.completion" if chat else "text_completion"

    def envelope(self, choices: list[dict[str, Any]], chunk: bool) -> dict[str, Any]:
        obj = self.object + (".chunk" if chunk and self.chat else "")
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices}


def _delta_events(events: list) -> list[dict[str, Any]]:
    deltas: list[dict[str, Any]] = []
    for event in events:
        if isinstance(event, ReasoningDelta):
            deltas.append({"reasoning_content": event.text})
        elif isinstance(event, ContentDelta):
            deltas.append({"content": event.text})
        elif isinstance(event, ToolCallStart):
            head = {"index": event.index, "id": event.id, "type": "function",
                    "function": {"name": event.name, "arguments": ""}}
            deltas.append({"tool_calls": [head]})
        elif isinstance(event, ToolCallArguments):
            deltas.append({"tool_calls": [{"index": event.index, "function": {"arguments": event.text}}]})
    return deltas  # a complete ToolCall adds nothing: its head and arguments have streamed


async def stream_chunks(job: Job, sink: AsyncSink, shape: CompletionShape, include_usage: bool, index: int = 0,
                        finals: dict[int, Finished] | None = None) -> AsyncIterator[str]:
    """The job's SSE chunks as choice `index`; with `finals` (one stream of several choices: `choices`),
    the job's `Finished` goes there and neither the usage chunk nor `[DONE]` is sent."""
    if shape.chat:
        yield sse(shape.envelope([{"index": index, "delta": {"role": "assistant", "content": ""},
                                    "logprobs": None, "finish_reason": None}], chunk=True))
    async for item in job_results(job, sink):
        if isinstance(item, Piece):
            deltas = (_delta_events(item.events) if shape.chat else
                      [{"text": e.text} for e in item.events if isinstance(e, ContentDelta)])
            logprobs = logprobs_payload(item.logprobs, shape.chat) if item.logprobs else None
            if logprobs is not None and not deltas:  # the tokens' text is still held by the reply parser
                deltas = [{} if shape.chat else {"text": ""}]
            for k, delta in enumerate(deltas):
                choice = {"index": index, "delta": delta} if shape.chat else {"index": index, **delta}
                lp = logprobs if k == len(deltas) - 1 else None  # the piece's tokens ride on its last chunk
                yield sse(shape.envelope([{**choice, "logprobs": lp, "finish_reason": None}], chunk=True))
        elif isinstance(item, Failed):
            yield sse(error_body(500, item.message))
        else:
            last = {"index": index, "delta": {}} if shape.chat else {"index": index, "text": ""}
            yield sse(shape.envelope([{**last, "logprobs": None, "finish_reason": item.finish_reason}], chunk=True))
            if finals is not None:
                finals[index] = item
            elif include_usage:
                yield sse({**shape.envelope([], chunk=True), "usage": usage(item)})
    if finals is None:
        yield sse("[DONE]")


async def collect(job: Job, sink: AsyncSink, shape: CompletionShape, index: int = 0) -> dict[str, Any] | Failed:
    """The whole response object (its one choice numbered `index`), or the failure that ended the job."""
    reasoning, content, calls, entries = [], [], [], []
    async for item in job_results(job, sink):
        if isinstance(item, Failed):
            return item
        if isinstance(item, Piece):
            entries += item.logprobs
            for e in item.events:
                if isinstance(e, ReasoningDelta):
                    reasoning.append(e.text)
                elif isinstance(e, ContentDelta):
                    content.append(e.text)
                elif isinstance(e, ToolCall):
                    calls.append(e.as_openai())
            continue
        if shape.chat:
            message: dict[str, Any] = {"role": "assistant", "content": "".join(content) if content or not calls else None,
                                       "reasoning_content": "".join(reasoning) if reasoning else None}
            if calls:
                message["tool_calls"] = calls
            choice = {"index": index, "message": message}
        else:
            choice = {"index": index, "text": "".join(content)}
        logprobs = logprobs_payload(entries, shape.chat) if job.top_logprobs is not None else None
        body = shape.envelope([{**choice, "logprobs": logprobs, "finish_reason": item.finish_reason}], chunk=False)
        return {**body, "usage": usage(item)}
    return Failed("generation ended without a result")
