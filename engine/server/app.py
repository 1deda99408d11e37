"""The FastAPI application: routes (with and without `/v1`), API-key check, OpenAI-shaped errors.

Requests are validated and turned into jobs on the event loop (prompt rendering in a thread), then
handed to the single generation worker; responses are read from the job's event queue. The routes
ask a `ModelSource` for the model on every request: `rigllm serve`'s `ModelHost` loads, replaces and
unloads models while serving (503 while none is loaded), the desktop app's toggle serves the one
model it has open (`FixedModel`).
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, StreamingResponse

from engine.generation.serving.generation_job import AsyncSink, Failed, Job
from engine.generation.serving.model_service import ModelService
from engine.generation.serving.request_error import APIError
from engine.generation.serving.worker import GenerationWorker, QueueFull
from engine.server.api_errors import error_response, install_error_handlers
from engine.server.health import health_answer
from engine.server.metrics_routes import METRICS_PATH, install_metrics
from engine.server.choices import collect_choices, stream_choices
from engine.server.reasoning_format import REASONING_FORMATS, inline_reasoning
from engine.server.request_jobs import chat_job, check_model, choice_total, completion_job
from engine.server.responses import CompletionShape, collect, stream_chunks
from engine.server.responses_route import add_responses_routes
from engine.server.tokenize_api import add_tokenize_routes
from engine.server.wire import ChatCompletionRequest, CompletionRequest
from engine.telemetry import TelemetrySource

OPEN_PATHS = ("/health", "/v1/health", "/docs", "/openapi.json")


def _presented_key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key")


class ModelSource(Protocol):
    """Where the routes find the model to serve; its `label` (e.g. that the model is the random-weight
    demo) is shown by /health."""

    @property
    def current(self) -> tuple[ModelService, GenerationWorker] | None:
        """The loaded model's service and worker, None while none is loaded."""

    @property
    def label(self) -> str: ...

    def require(self) -> tuple[ModelService, GenerationWorker]:
        """`current`, or an APIError (503) that says why there is none."""


@dataclass(frozen=True)
class FixedModel:
    """One model that stays loaded for the app's lifetime (its owner stops the worker)."""

    service: ModelService
    worker: GenerationWorker
    label: str = ""

    @property
    def current(self) -> tuple[ModelService, GenerationWorker]:
        return self.service, self.worker

    def require(self) -> tuple[ModelService, GenerationWorker]:
        return self.current


def create_app(models: ModelSource, api_key: str | None = None, cors_origins: Sequence[str] = (),
               telemetry: TelemetrySource | None = None, public_metrics: bool = False,
               reasoning_format: str = "deepseek") -> FastAPI:
    """Routes serve whatever model `models` holds at the time of each request.

    `cors_origins` lets browser front ends on those origins call the API; without it no CORS headers
    are sent, so a web page the user happens to visit cannot use their local model.
    `/metrics` (Prometheus) includes `telemetry`'s cards when given; it needs the API key like every
    route unless `public_metrics` (a scraper without the key). `reasoning_format`: `reasoning_format.py`.
    """
    if reasoning_format not in REASONING_FORMATS:
        raise ValueError(f"reasoning_format must be one of {', '.join(REASONING_FORMATS)}")
    open_paths = OPEN_PATHS + ((METRICS_PATH,) if public_metrics else ())
    app = FastAPI(title="rigllm", description="OpenAI-compatible API for Qwen3.5/3.6 models")
    install_error_handlers(app)

    @app.middleware("http")
    async def _normalise_and_authorise(request: Request, call_next: Any):
        path = request.scope["path"]
        while "//" in path:  # some clients join base URL and route into `//v1/...`
            path = path.replace("//", "/")
        request.scope["path"] = path
        if api_key and path not in open_paths:
            presented = _presented_key(request)
            if presented is None or not hmac.compare_digest(presented.encode(), api_key.encode()):
                return error_response(401, "Incorrect or missing API key (send 'Authorization: Bearer KEY')",
                                      code="invalid_api_key")
        return await call_next(request)

    if cors_origins:  # added after the key check, so it wraps it: preflights (no key) pass, 401s carry CORS
        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["*"],
                           allow_headers=["*"])
    metrics = install_metrics(app, models, telemetry)

    def observed(sink: AsyncSink):
        """The job's sink: metrics taken, reasoning inlined when the server is asked to."""
        watched = metrics.observe(sink)
        return inline_reasoning(watched) if reasoning_format == "none" else watched

    def model_card(service: ModelService) -> dict[str, Any]:
        return {"id": service.model_id, "object": "model", "created": service.created, "owned_by": "rigllm"}

    async def list_models() -> dict[str, Any]:
        now = models.current
        return {"object": "list", "data": [model_card(now[0])] if now else []}

    async def one_model(model_id: str) -> dict[str, Any]:
        service, _ = models.require()
        check_model(service, model_id)
        return model_card(service)

    async def health() -> JSONResponse:
        status_code, body = health_answer(models)
        return JSONResponse(body, status_code=status_code)

    async def run(worker: GenerationWorker, job: Job, sink: AsyncSink, shape: CompletionShape, stream: bool,
                  include_usage: bool):
        try:
            worker.submit(job)
        except QueueFull as err:
            raise APIError(503, str(err), code="queue_full") from None
        if stream:
            return StreamingResponse(stream_chunks(job, sink, shape, include_usage), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        result = await collect(job, sink, shape)
        if isinstance(result, Failed):
            return error_response(500, result.message)
        return JSONResponse(result)

    async def answer(req: ChatCompletionRequest | CompletionRequest, chat: bool):
        service, worker = models.require()
        make_job = chat_job if chat else completion_job
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        total, per_prompt = await asyncio.to_thread(choice_total, service, req)
        if total > 1:
            return await run_choices(service, worker, req, make_job, chat, total, per_prompt, include_usage)
        sink = AsyncSink(asyncio.get_running_loop())
        job = await asyncio.to_thread(make_job, service, req, observed(sink))
        return await run(worker, job, sink, CompletionShape(service.model_id, chat=chat), bool(req.stream),
                         include_usage)

    async def run_choices(service: ModelService, worker: GenerationWorker, req: Any, make_job: Any, chat: bool,
                          total: int, per_prompt: int, include_usage: bool):
        """`n` > 1 or several prompts: one job per choice, all queued before any runs (`choices`)."""
        jobs = []
        for index in range(total):
            sink = AsyncSink(asyncio.get_running_loop())
            jobs.append((await asyncio.to_thread(make_job, service, req, observed(sink), index=index), sink))
        for job, _ in jobs:
            try:
                worker.submit(job)
            except QueueFull as err:
                for queued, _ in jobs:
                    queued.cancelled.set()
                raise APIError(503, str(err), code="queue_full") from None
        shape = CompletionShape(service.model_id, chat=chat)
        if req.stream:
            return StreamingResponse(stream_choices(jobs, shape, include_usage, per_prompt),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        result = await collect_choices(jobs, shape, per_prompt)
        if isinstance(result, Failed):
            return error_response(500, result.message)
        return JSONResponse(result)

    async def chat_completions(req: ChatCompletionRequest):
        return await answer(req, chat=True)

    async def completions(req: CompletionRequest):
        return await answer(req, chat=False)

    for prefix in ("/v1", ""):
        app.add_api_route(f"{prefix}/models", list_models, methods=["GET"])
        app.add_api_route(f"{prefix}/models/{{model_id}}", one_model, methods=["GET"])
        app.add_api_route(f"{prefix}/chat/completions", chat_completions, methods=["POST"])
        app.add_api_route(f"{prefix}/completions", completions, methods=["POST"])
        app.add_api_route(f"{prefix}/health", health, methods=["GET"])
    add_tokenize_routes(app, lambda: models.require()[0])
    add_responses_routes(app, models, observed)
    return app
