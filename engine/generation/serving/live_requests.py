"""The requests a server is answering, so that its shutdown deadline can end every one of them cleanly.

At the deadline each is told why (`AsyncSink.abort`): a stream then ends with an error event and
`[DONE]`, a whole response with a 503, and their jobs are cancelled, instead of the connection being
cut with no final chunk when the server's tasks are killed.
"""

from __future__ import annotations

import threading
import weakref

from engine.generation.serving.generation_job import AsyncSink

SHUTDOWN_MESSAGE = "the server is shutting down; the reply was cut short"


class LiveRequests:
    def __init__(self) -> None:
        self._sinks: weakref.WeakSet[AsyncSink] = weakref.WeakSet()
        self._lock = threading.Lock()

    def add(self, sink: AsyncSink) -> None:
        with self._lock:
            self._sinks.add(sink)

    def abort_all(self, message: str = SHUTDOWN_MESSAGE) -> int:
        """End every request still being answered; how many were."""
        with self._lock:
            sinks = [s for s in self._sinks if not s.ended]
        for sink in sinks:
            sink.abort(message)
        return len(sinks)
