"""The FastAPI application: routes (with and without `/v1`), access checks, OpenAI-shaped errors.

Requests are checked before any of their body is read (engine.server.http_policy: Host, Origin,
content type, size, keys), parsed off the event loop and turned into jobs in a dedicated, bounded
pool of preparation threads (rendering, tokenizing, decoding images), then handed to the single
generation worker; responses are read from the job's event queue. A client that disconnects from a
whole (non-streamed) response has its job cancelled at once. The routes ask a `ModelSource` for the
model on every request: `rigllm serve`'s `ModelHost` loads, replaces and unloads models while
serving (503 while none is loaded), the desktop app's toggle serves the one model it has open
(`FixedModel`).
"""

from __future__ import annotations

import asyncio
import functools
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse

from engine.generation.serving.generation_job import AsyncSink, Failed, Job
from engine.generation.serving.live_requests import LiveRequests
from engine.generation.serving.model_service import ModelService
from engine.generation.serving.request_error import APIError
from engine.generation.serving.worker import GenerationWorker
from engine.server.api_errors import error_response, install_error_handlers, submit_or_503
from engine.server.bounded_body import BoundedBodyRoute
from engine.server.choices import collect_choices, stream_choices
from engine.server.health import health_answer
from engine.server.http_policy import HttpPolicy, guard
from engine.server.metrics_routes import METRICS_PATH, install_metrics
from engine.server.openapi_errors import documented_errors
from engine.server.reasoning_format import REASONING_FORMATS, inline_reasoning
from engine.server.request_jobs import chat_job, check_model, choice_total, completion_job
from engine.server.responses import CompletionShape, collect, stream_chunks
from engine.server.responses_route import add_responses_routes
from engine.server.tokenize_api import add_tokenize_routes
from engine.server.wire import ChatCompletionRequest, CompletionRequest
from engine.telemetry import TelemetrySource


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


async def _until_disconnected(request: Request) -> None:
    """Return when the client has gone (the body is read by then, so only the disconnect is left)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def create_app(models: ModelSource, api_key: str | None = None, cors_origins: Sequence[str] = (),
               policy: HttpPolicy | None = None, live: LiveRequests | None = None,
               on_shutdown: Callable[[], None] | None = None, telemetry: TelemetrySource | None = None,
               public_metrics: bool = False, reasoning_format: str = "deepseek") -> FastAPI:
    """Routes serve whatever model `models` holds at the time of each request.

    `policy` says who may call what (engine.server.http_policy); `api_key` and `cors_origins` are its
    two most common fields, for callers that need no more. Without CORS origins no CORS headers are
    sent, so a web page the user happens to visit cannot use their local model. `live` collects the
    requests being answered (the shutdown deadline ends them); `on_shutdown` runs when the app stops,
    before its event loop closes (`rigllm serve` stops the generation worker there). `/metrics`
    (Prometheus) includes `telemetry`'s cards when given; it needs a key like every route unless
    `public_metrics` (a scraper without the key). `reasoning_format`: engine.server.reasoning_format.
    """
    if reasoning_format not in REASONING_FORMATS:
        raise ValueError(f"reasoning_format must be one of {', '.join(REASONING_FORMATS)}")
    policy = policy or HttpPolicy()
    if api_key is not None or cors_origins:
        policy = replace(policy, api_key=api_key or policy.api_key,
                         cors_origins=tuple(cors_origins) or policy.cors_origins)
    if public_metrics:
        policy = replace(policy, open_paths=policy.open_paths + (METRICS_PATH,))
    live = live or LiveRequests()
    pool = ThreadPoolExecutor(max_workers=policy.prepare_threads, thread_name_prefix="rigllm-prepare")

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if on_shutdown is not None:
                await asyncio.to_thread(on_shutdown)
            pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="rigllm", description="OpenAI-compatible API for Qwen3.5/3.6 models", lifespan=lifespan)
    app.router.route_class = BoundedBodyRoute
    app.state.body_limit = policy.max_body_bytes
    app.state.prepare_pool = pool
    install_error_handlers(app)

    @app.middleware("http")
    async def _check_access(request: Request, call_next: Any) -> Response:
        return await guard(policy, request, call_next)

    if policy.cors_origins:  # added after the access check, so it wraps it: preflights pass, 401s carry CORS
        app.add_middleware(CORSMiddleware, allow_origins=list(policy.cors_origins), allow_methods=["*"],
                           allow_headers=["*"])
    metrics = install_metrics(app, models, telemetry)

    def observed(sink: AsyncSink):
        """The job's sink: metrics taken, reasoning inlined when the server is asked to."""
        watched = metrics.observe(sink)
        return inline_reasoning(watched) if reasoning_format == "none" else watched

    async def prepare(make: Callable[..., Job], *args: Any, **kwargs: Any) -> tuple[Job, AsyncSink]:
        """A job made by `make(*args, sink_observer, **kwargs)` in the bounded pool, with its sink: the stall
        policy (a reader that stops reading is dropped), the observers, and tracked for the shutdown deadline.
        Every generating route takes its jobs from here, so none can leave one of those out."""
        loop = asyncio.get_running_loop()
        sink = AsyncSink(loop, stall_seconds=policy.stall_seconds)
        job = await loop.run_in_executor(pool, functools.partial(make, *args, observed(sink), **kwargs))
        sink.bind(job)
        live.add(sink)
        return job, sink

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

    async def run(request: Request, worker: GenerationWorker, job: Job, sink: AsyncSink, shape: CompletionShape,
                  stream: bool, include_usage: bool) -> Response:
        submit_or_503(worker, job)
        if stream:
            return StreamingResponse(stream_chunks(job, sink, shape, include_usage), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        answered = asyncio.ensure_future(collect(job, sink, shape))
        gone = asyncio.ensure_future(_until_disconnected(request))
        await asyncio.wait((answered, gone), return_when=asyncio.FIRST_COMPLETED)
        if not answered.done():  # the client left: stop generating for it now, not at max_tokens
            job.cancelled.set()
            answered.cancel()
            return Response(status_code=499)
        gone.cancel()
        result = answered.result()
        if isinstance(result, Failed):
            return error_response(result.status, result.message)
        return JSONResponse(result)

    async def answer(request: Request, req: ChatCompletionRequest | CompletionRequest, chat: bool) -> Response:
        service, worker = models.require()
        loop = asyncio.get_running_loop()
        make_job = chat_job if chat else completion_job
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        total, per_prompt = await loop.run_in_executor(pool, choice_total, service, req)
        if total > 1:
            return await run_choices(service, worker, req, make_job, chat, total, per_prompt, include_usage)
        job, sink = await prepare(make_job, service, req)
        return await run(request, worker, job, sink, CompletionShape(service.model_id, chat=chat), bool(req.stream),
                         include_usage)

    async def run_choices(service: ModelService, worker: GenerationWorker, req: Any, make_job: Any, chat: bool,
                          total: int, per_prompt: int, include_usage: bool) -> Response:
        """`n` > 1 or several prompts: one job per choice, all queued before any runs (`choices`)."""
        jobs = [await prepare(make_job, service, req, index=index) for index in range(total)]
        try:
            for job, _ in jobs:
                submit_or_503(worker, job)
        except APIError:
            for queued, _ in jobs:
                queued.cancelled.set()
            raise
        shape = CompletionShape(service.model_id, chat=chat)
        if req.stream:
            return StreamingResponse(stream_choices(jobs, shape, include_usage, per_prompt),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        result = await collect_choices(jobs, shape, per_prompt)
        if isinstance(result, Failed):
            return error_response(result.status, result.message)
        return JSONResponse(result)

    async def chat_completions(request: Request, req: ChatCompletionRequest) -> Response:
        return await answer(request, req, chat=True)

    async def completions(request: Request, req: CompletionRequest) -> Response:
        return await answer(request, req, chat=False)

    for prefix in ("/v1", ""):
        app.add_api_route(f"{prefix}/models", list_models, methods=["GET"])
        app.add_api_route(f"{prefix}/models/{{model_id}}", one_model, methods=["GET"])
        app.add_api_route(f"{prefix}/chat/completions", chat_completions, methods=["POST"])
        app.add_api_route(f"{prefix}/completions", completions, methods=["POST"])
        app.add_api_route(f"{prefix}/health", health, methods=["GET"])
    add_tokenize_routes(app, lambda: models.require()[0], pool)
    add_responses_routes(app, models, prepare)
    documented_errors(app)
    return app
