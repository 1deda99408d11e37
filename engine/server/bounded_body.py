"""Request bodies read with a size limit and parsed off the event loop.

FastAPI reads a JSON body with `await request.body()` and parses it with `json.loads` on the event
loop, so a few large bodies stall every stream and `/health`. Routes of `BoundedBodyRoute` hand
FastAPI a request whose body stops at the server's limit (413; also for chunked bodies with no
Content-Length, which `http_policy` cannot check up front) and whose JSON is parsed in the app's
request-preparation pool.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int):
        super().__init__(413, f"the body is larger than the {limit} bytes this server takes")


class _BoundedRequest(Request):
    """A request whose `body()` refuses more than `limit` bytes and whose `json()` runs in `pool`."""

    def __init__(self, request: Request, limit: int, pool: Executor):
        super().__init__(request.scope, request.receive)
        self._limit = limit
        self._pool = pool

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
            self._json = await asyncio.get_running_loop().run_in_executor(self._pool, json.loads, body)
        return self._json


class BoundedBodyRoute(APIRoute):
    """An APIRoute whose request body is bounded and parsed off the loop; the limit and pool are read
    from `app.state.body_limit` and `app.state.prepare_pool` (create_app sets both)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def bounded(request: Request) -> Response:
            state = request.app.state
            return await handler(_BoundedRequest(request, state.body_limit, state.prepare_pool))

        return bounded
