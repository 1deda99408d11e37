"""uvicorn's server with a shutdown that ends every request cleanly at its deadline.

uvicorn's own graceful shutdown waits for running requests and, at its timeout, cancels their tasks:
a stream is then cut with no final chunk, no error and no `[DONE]`. Here, `deadline` seconds after
the stop signal, every request still being answered is ended through its sink (LiveRequests): a
stream sends an error event and `[DONE]`, a whole response a 503, and their jobs are cancelled. uvicorn's
timeout, a little later, stays as the backstop. The app's lifespan then stops the generation worker
while the event loop is still running.
"""

from __future__ import annotations

import asyncio
import logging

import uvicorn

from engine.generation.serving.live_requests import LiveRequests

BACKSTOP_SECONDS = 5.0  # after the deadline, how long the ended requests get to send their last bytes

log = logging.getLogger("rigllm.server")


class DeadlineServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, live: LiveRequests, deadline: float):
        config.timeout_graceful_shutdown = deadline + BACKSTOP_SECONDS
        super().__init__(config)
        self._live = live
        self._deadline = deadline

    async def shutdown(self, sockets: list | None = None) -> None:
        handle = asyncio.get_running_loop().call_later(self._deadline, self._end_requests)
        try:
            await super().shutdown(sockets)
        finally:
            handle.cancel()

    def _end_requests(self) -> None:
        ended = self._live.abort_all()
        if ended:
            log.warning("shutdown deadline: ended %d request(s) still running", ended)
