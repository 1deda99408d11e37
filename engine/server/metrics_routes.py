"""`GET /metrics` (Prometheus text format) and the middleware that counts every request by route and status.

Installed by `create_app` after its other middleware, so it wraps them and also counts the
requests they answer themselves (401 for a missing key). Routes are labelled by their template
without the `/v1` prefix (both spellings are one route); paths that match no route share the label
"unmatched", so a scan of random URLs cannot grow the metric without bound.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request, Response
from starlette.routing import BaseRoute, Match

from engine.server.metrics import ServerMetrics
from engine.server.metrics_collector import ServingCollector
from engine.telemetry import TelemetrySource

if TYPE_CHECKING:
    from engine.server.app import ModelSource

METRICS_PATH = "/metrics"
UNMATCHED = "unmatched"


def endpoint_label(routes: list[BaseRoute], scope: dict[str, Any]) -> str:
    """The template of the route `scope` was (or would have been) routed to, without `/v1`."""
    for route in routes:
        match, _ = route.matches(scope)
        if match != Match.NONE:
            path = getattr(route, "path", UNMATCHED)
            return path.removeprefix("/v1") if path.startswith("/v1/") else path
    return UNMATCHED


def install_metrics(app: FastAPI, models: ModelSource, telemetry: TelemetrySource | None) -> ServerMetrics:
    """Add `/metrics` and the request counter to `app`; the returned metrics also take each job's sink
    (`ServerMetrics.observe`)."""
    metrics = ServerMetrics()
    metrics.registry.register(ServingCollector(models, telemetry))

    @app.middleware("http")
    async def _count_requests(request: Request, call_next: Any):
        try:
            response = await call_next(request)
        except Exception:
            metrics.count_request(endpoint_label(app.router.routes, request.scope), 500)
            raise
        metrics.count_request(endpoint_label(app.router.routes, request.scope), response.status_code)
        return response

    def scrape() -> Response:  # plain def: FastAPI runs it in its thread pool, NVML reads block
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    app.add_api_route(METRICS_PATH, scrape, methods=["GET"], include_in_schema=False)
    return metrics
