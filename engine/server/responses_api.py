"""`POST /v1/responses`: the Responses API on top of the chat pipeline, whole or streamed.

The reply's parse events become output items (a `reasoning` item, a `message` with one `output_text`
part, one `function_call` item per call) and, when streaming, the official events in order:
response.created, response.in_progress, response.output_item.added, response.content_part.added,
response.output_text.delta / response.reasoning_text.delta / response.function_call_arguments.delta,
their .done events, response.output_item.done, and last response.completed (or response.incomplete
when `max_output_tokens` ran out, response.failed on an error).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from engine.generation.output_parser import ContentDelta, ReasoningDelta, ToolCall, ToolCallArguments, ToolCallStart
from engine.generation.serving.generation_job import AsyncSink, Failed, Finished, Job, Piece
from engine.server.responses import job_results
from engine.server.responses_input import ResponsesRequest


class ResponseBuilder:
    """One response's output items, built from the job's events; each step returns the stream events."""

    def __init__(self, req: ResponsesRequest, model: str):
        self.id = "resp_" + uuid.uuid4().hex
        self.created = int(time.time())
        self.req = req
        self.model = model
        self.output: list[dict[str, Any]] = []
        self._open: dict[str, int] = {}  # "reasoning" / "message" / "call<i>" -> output index
        self._seq = 0

    def response(self, status: str, done: Finished | None = None, error: str | None = None) -> dict[str, Any]:
        req = self.req
        body: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.created, "status": status, "model": self.model,
            "output": self.output, "instructions": req.instructions, "tools": req.tools or [],
            "tool_choice": req.tool_choice or "auto", "parallel_tool_calls": req.parallel_tool_calls is not False,
            "text": req.text or {"format": {"type": "text"}}, "max_output_tokens": req.max_output_tokens,
            "temperature": req.temperature, "top_p": req.top_p, "previous_response_id": req.previous_response_id,
            "reasoning": req.reasoning or {}, "metadata": req.metadata or {}, "store": req.store is not False,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "error": {"code": "server_error", "message": error} if error else None, "usage": None,
        }
        if done is not None:
            body["usage"] = {"input_tokens": done.prompt_tokens, "output_tokens": done.completion_tokens,
                             "total_tokens": done.prompt_tokens + done.completion_tokens,
                             "input_tokens_details": {"cached_tokens": done.cached_tokens},
                             "output_tokens_details": {"reasoning_tokens": done.reasoning_tokens}}
        return body

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self._seq += 1
        return {"type": kind, "sequence_number": self._seq - 1, **fields}

    def start(self) -> list[dict[str, Any]]:
        return [self.event("response.created", response=self.response("in_progress")),
                self.event("response.in_progress", response=self.response("in_progress"))]

    def _add(self, key: str, item: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._close_others(key)
        self._open[key] = len(self.output)
        self.output.append(item)
        events.append(self.event("response.output_item.added", output_index=self._open[key], item=item))
        return events

    def _close_others(self, keep: str) -> list[dict[str, Any]]:
        events = []
        for key in [k for k in self._open if k != keep and not k.startswith("call")]:
            events += self._close(key)
        return events

    def _close(self, key: str) -> list[dict[str, Any]]:
        index = self._open.pop(key)
        item = self.output[index]
        item["status"] = "completed"
        events = []
        if item["type"] == "message":
            part = item["content"][0]
            events += [self.event("response.output_text.done", item_id=item["id"], output_index=index,
                                  content_index=0, text=part["text"]),
                       self.event("response.content_part.done", item_id=item["id"], output_index=index,
                                  content_index=0, part=part)]
        elif item["type"] == "reasoning":
            text = item["content"][0]["text"]
            events.append(self.event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                                     content_index=0, text=text))
        elif item["type"] == "function_call":
            events.append(self.event("response.function_call_arguments.done", item_id=item["id"],
                                     output_index=index, arguments=item["arguments"]))
        return events + [self.event("response.output_item.done", output_index=index, item=item)]

    def feed(self, piece: Piece) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for e in piece.events:
            if isinstance(e, ReasoningDelta):
                if "reasoning" not in self._open:
                    events += self._add("reasoning", {"type": "reasoning", "id": "rs_" + uuid.uuid4().hex,
                                                      "summary": [], "status": "in_progress",
                                                      "content": [{"type": "reasoning_text", "text": ""}]})
                item = self.output[self._open["reasoning"]]
                item["content"][0]["text"] += e.text
                events.append(self.event("response.reasoning_text.delta", item_id=item["id"],
                                         output_index=self._open["reasoning"], content_index=0, delta=e.text))
            elif isinstance(e, ContentDelta):
                if "message" not in self._open:
                    part = {"type": "output_text", "text": "", "annotations": []}
                    events += self._add("message", {"type": "message", "id": "msg_" + uuid.uuid4().hex,
                                                    "status": "in_progress", "role": "assistant", "content": [part]})
                    events.append(self.event("response.content_part.added", item_id=self.output[-1]["id"],
                                             output_index=self._open["message"], content_index=0,
                                             part=dict(part)))
                item = self.output[self._open["message"]]
                item["content"][0]["text"] += e.text
                events.append(self.event("response.output_text.delta", item_id=item["id"],
                                         output_index=self._open["message"], content_index=0, delta=e.text))
            elif isinstance(e, ToolCallStart):
                events += self._add(f"call{e.index}", {"type": "function_call", "id": "fc_" + uuid.uuid4().hex,
                                                       "call_id": e.id, "name": e.name, "arguments": "",
                                                       "status": "in_progress"})
            elif isinstance(e, ToolCallArguments):
                index = self._open[f"call{e.index}"]
                self.output[index]["arguments"] += e.text
                events.append(self.event("response.function_call_arguments.delta", item_id=self.output[index]["id"],
                                         output_index=index, delta=e.text))
            elif isinstance(e, ToolCall):
                key = f"call{e.index}"
                if key not in self._open:  # a call that did not stream its head
                    events += self._add(key, {"type": "function_call", "id": "fc_" + uuid.uuid4().hex,
                                              "call_id": e.id, "name": e.name, "arguments": "",
                                              "status": "in_progress"})
                self.output[self._open[key]]["arguments"] = e.arguments
                events += self._close(key)
        return events

    def finish(self, item: Finished | Failed) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for key in list(self._open):
            events += self._close(key)
        if isinstance(item, Failed):
            return events + [self.event("response.failed", response=self.response("failed", error=item.message))]
        status = "incomplete" if item.finish_reason == "length" else "completed"
        return events + [self.event(f"response.{status}", response=self.response(status, item))]

    def assistant_messages(self) -> list[dict[str, Any]]:
        """The output as chat messages, for a follow-up's `previous_response_id`."""
        text = "".join(i["content"][0]["text"] for i in self.output if i["type"] == "message")
        reasoning = "".join(i["content"][0]["text"] for i in self.output if i["type"] == "reasoning")
        calls = [{"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
                 for i in self.output if i["type"] == "function_call"]
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if reasoning:
            message["reasoning_content"] = reasoning
        if calls:
            message["tool_calls"] = calls
        return [message]


async def response_events(job: Job, sink: AsyncSink, builder: ResponseBuilder) -> AsyncIterator[dict[str, Any]]:
    """Every stream event of the job's response, the last one response.completed/incomplete/failed."""
    for event in builder.start():
        yield event
    async for item in job_results(job, sink):
        for event in builder.feed(item) if isinstance(item, Piece) else builder.finish(item):
            yield event


def sse_event(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
