"""Errors in OpenAI's JSON shape, so clients show our message instead of a parse failure.

The refusals themselves (`APIError`) are raised below HTTP, by the serving machinery too
(engine.generation.serving.request_error); this module maps them and FastAPI's own errors to responses.

Every failure a client can cause maps to a 4xx here; only our own bugs reach the 500 handler.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.generation.serving.generation_job import Job
from engine.generation.serving.request_error import APIError
from engine.generation.serving.worker import GenerationWorker, Unavailable

log = logging.getLogger("rigllm.server")

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 409: "conflict_error",
          413: "invalid_request_error", 415: "invalid_request_error", 421: "permission_error",
          503: "server_busy"}


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error"), "param": param, "code": code}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


def validation_message(errors: Sequence[Mapping[str, Any]]) -> tuple[str, str | None]:
    """The first problem pydantic found, phrased as `field: reason`, and the field's dotted name."""
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON", None
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(loc) or None
    reason = first.get("msg", "invalid request")
    return (f"{param}: {reason}" if param else reason), param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param, exc.code, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(exc.errors())
        return error_response(400, message, param, "invalid_value")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), getattr(exc, "param", None), getattr(exc, "code", None),
                              getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _bug(_: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error")
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")


def submit_or_503(worker: GenerationWorker, job: Job) -> None:
    """Queue `job`, or raise the 503 a client can act on: why (a full queue, a dead worker) and, when the
    worker knows it, how long to wait (Retry-After)."""
    try:
        worker.submit(job)
    except Unavailable as err:
        headers = {"Retry-After": str(err.retry_after)} if err.retry_after else None
        raise APIError(503, str(err), code=err.code, headers=headers) from None
