"""The OpenAPI document as the server really answers: its error statuses and bodies, and its streams.

FastAPI documents 200 and its own 422 for every operation; this server answers validation errors
with 400 (OpenAI's status), refuses requests with 401/403/413/415/421 before routing them
(engine.server.http_policy), answers 404 for an unknown model and 503 while no model is loaded or
the queue is full, and streams completions as `text/event-stream`. Documenting exactly that lets a
client (and schemathesis' conformance checks) trust the document.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}},
    }},
}
_REASONS = {
    400: "The request is invalid (a field, a limit, or the context)",
    401: "The API key (or for /admin the admin key) is missing or wrong",
    403: "A foreign Origin, or the admin API without its own key",
    404: "No such model or route",
    409: "A model load or unload is already under way",
    413: "The body is larger than the server takes",
    415: "The body is not JSON",
    421: "A keyless server does not answer for this Host",
    500: "Generation failed for this request",
    503: "No model is loaded, the queue is full, or the server is stopping (see Retry-After)",
}
_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "string"}}}
_GENERATING = ("/chat/completions", "/completions")


def _statuses(path: str, method: str) -> list[int]:
    statuses = [400, 404, 421, 503]
    if path not in ("/health", "/v1/health", "/openapi.json", "/docs"):
        statuses += [401, 403]
    if method != "get":
        statuses += [403, 413, 415]
    if path.startswith("/admin"):
        statuses.append(409)
    if path.endswith(_GENERATING):
        statuses.append(500)
    return sorted(set(statuses))


def _error_response(status: int) -> dict[str, Any]:
    response: dict[str, Any] = {"description": _REASONS[status],
                                "content": {"application/json": {"schema": ERROR_SCHEMA}}}
    if status == 503:
        response["headers"] = _RETRY_AFTER
    return response


def document(schema: dict[str, Any]) -> dict[str, Any]:
    """Rewrite FastAPI's document in place: our error responses instead of its 422, SSE for completions."""
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            for status in _statuses(path, method):
                responses.setdefault(str(status), _error_response(status))
            ok = responses.get("200") or responses.get("202")
            if ok is not None and path.endswith(_GENERATING):
                ok.setdefault("content", {})["text/event-stream"] = {
                    "schema": {"type": "string", "description": "with \"stream\": true: server-sent events, "
                               "ending in `data: [DONE]`"}}
    schema.get("components", {}).get("schemas", {}).pop("HTTPValidationError", None)
    schema.get("components", {}).get("schemas", {}).pop("ValidationError", None)
    return schema


def documented_errors(app: FastAPI) -> None:
    """Serve `document`'s version of the app's OpenAPI document (built once, on first request)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document(get_openapi(title=app.title, version=app.version,
                                                      description=app.description, routes=app.routes))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
