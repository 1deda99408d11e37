"""The rig monitor's source for a remote rig: its NVML telemetry read through `GET /admin/cards`.

It is a `TelemetrySource` like the local NVML reader, so the same `MonitorService` polls it on its
own thread and the same tiles show it. An unreachable rig reads as a snapshot with no cards and the
reason in `error`, never an exception, as a machine without a GPU does.
"""

from __future__ import annotations

import time

from engine.errors import RigllmError
from engine.telemetry import RigSnapshot

from app.rig_client import RigLink


class RemoteTelemetry:
    def __init__(self, link: RigLink):
        self.link = link
        self._client = link.client()

    def read(self) -> RigSnapshot:
        try:
            return self._client.snapshot()
        except RigllmError as err:
            return RigSnapshot((), time.monotonic(), f"rig {self.link.name}: {err}")

    def close(self) -> None:
        self._client.close()
