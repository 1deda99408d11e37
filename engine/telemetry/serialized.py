"""A telemetry source shared by several threads: reads take turns.

`NvmlSource` is polled from one thread at a time; a server reads it from `/admin/cards` and from
`/metrics` scrapes, each on FastAPI's thread pool, so both go through one `SerializedSource`.
"""

from __future__ import annotations

import threading

from engine.telemetry.samples import RigSnapshot, TelemetrySource


class SerializedSource:
    """`source`, read by one thread at a time."""

    def __init__(self, source: TelemetrySource):
        self._source = source
        self._lock = threading.Lock()

    def read(self) -> RigSnapshot:
        with self._lock:
            return self._source.read()

    def close(self) -> None:
        with self._lock:
            self._source.close()
