"""Request bodies read with a size limit and parsed off the event loop.

FastAPI reads a JSON body with `await request.body()`, parses it with `json.loads` and validates it
on the event loop, so a few large bodies stall every stream and `/health` (an 8 MB body of 100,000
messages takes 1.5 s to validate). Routes of `BoundedBodyRoute` hand FastAPI a request whose body
stops at the server's limit (413; also for chunked bodies with no Content-Length, which
`http_policy` cannot check up front) and whose JSON is parsed and validated into the route's body
model in the app's request-preparation pool; FastAPI then gets the finished model, which it passes
through without validating again.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException

from engine.server.api_errors import validation_message


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int):
        super().__init__(413, f"the body is larger than the {limit} bytes this server takes")
        self.code = "body_too_large"


class BodyInvalid(HTTPException):
    """The body does not fit the route's model: the same 400 as FastAPI's own validation error."""

    def __init__(self, err: ValidationError):
        message, self.param = validation_message(err.errors(include_url=False))
        super().__init__(400, message)
        self.code = "invalid_value"


class _BoundedRequest(Request):
    """A request whose `body()` refuses more than `limit` bytes and whose `json()` parses (and validates
    into `model`, when the route has one) in `pool`."""

    def __init__(self, request: Request, limit: int, pool: Executor, model: type[BaseModel] | None):
        super().__init__(request.scope, request.receive)
        self._limit = limit
        self._pool = pool
        self._model = model

    async def body(self) -> bytes:
        if not hasattr(self, "_body"):
            chunks, size = [], 0
            async for chunk in self.stream():
                size += len(chunk)
                if size > self._limit:
                    raise BodyTooLarge(self._limit)
                chunks.append(chunk)
            self._body = b"".join(chunks)
        return self._body

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            self._json = await asyncio.get_running_loop().run_in_executor(self._pool, self._parse, body)
        return self._json

    def _parse(self, body: bytes) -> Any:
        data = json.loads(body)
        if self._model is None:
            return data
        try:
            return self._model.model_validate(data)
        except ValidationError as err:
            raise BodyInvalid(err) from None


class BoundedBodyRoute(APIRoute):
    """An APIRoute whose request body is bounded and parsed off the loop; the limit and pool are read
    from `app.state.body_limit` and `app.state.prepare_pool` (create_app sets both)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        annotation = self.body_field.field_info.annotation if self.body_field is not None else None
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None

        async def bounded(request: Request) -> Response:
            state = request.app.state
            return await handler(_BoundedRequest(request, state.body_limit, state.prepare_pool, model))

        return bounded
