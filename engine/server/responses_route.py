"""The `/v1/responses` route: build the chat job, run it, answer as a Response (whole or streamed),
and keep the conversation for `previous_response_id`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse

from engine.generation.serving.generation_job import AsyncSink, Job
from engine.generation.serving.request_error import APIError
from engine.server.api_errors import submit_or_503
from engine.server.request_jobs import chat_job
from engine.server.responses_api import ResponseBuilder, response_events, sse_event
from engine.server.responses_input import ConversationStore, ResponsesRequest, chat_request

TERMINAL = ("response.completed", "response.incomplete", "response.failed")


def add_responses_routes(app: FastAPI, models: Any,
                         prepare: Callable[..., Awaitable[tuple[Job, AsyncSink]]]) -> None:
    """`models`: the app's `ModelSource`; `prepare`: the app's job maker (bounded pool, stall policy, observers,
    shutdown tracking), as for chat completions."""
    store = ConversationStore()

    async def responses(req: ResponsesRequest):
        service, worker = models.require()
        earlier = store.get(req.previous_response_id) if req.previous_response_id else []
        chat, conversation = chat_request(req, earlier)
        job, sink = await prepare(chat_job, service, chat)
        submit_or_503(worker, job)
        builder = ResponseBuilder(req, service.model_id)

        def keep() -> None:
            if req.store is not False:
                store.put(builder.id, conversation + builder.assistant_messages())

        if req.stream:
            async def stream() -> AsyncIterator[str]:
                async for event in response_events(job, sink, builder):
                    if event["type"] in TERMINAL[:2]:
                        keep()
                    yield sse_event(event)
            return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        last: dict[str, Any] = {}
        async for event in response_events(job, sink, builder):
            last = event
        if last.get("type") == "response.failed":
            raise APIError(500, last["response"]["error"]["message"])
        keep()
        return JSONResponse(last["response"])

    for prefix in ("/v1", ""):
        app.add_api_route(f"{prefix}/responses", responses, methods=["POST"])
