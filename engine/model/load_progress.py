"""Loading progress reports, and cancelling a load from the callback that receives them.

Loading a 27B model onto CMP cards over PCIe Gen1 x1 takes minutes, so front ends show per-card
stage, bytes and speed (anchor-desktop-apps.md: opaque loading is a top complaint). A callback that
raises `LoadCancelled` stops the load; the backend then frees what it had allocated before the
exception leaves `open_backend`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.errors import RigllmError


@dataclass(frozen=True)
class LoadProgress:
    card: int  # card index (0 for the CPU reference backend)
    stage: str  # e.g. "reading weights", "uploading weights", "capturing decode graphs", "ready"
    done_bytes: int
    total_bytes: int
    elapsed_seconds: float

    @property
    def bytes_per_second(self) -> float:
        return self.done_bytes / self.elapsed_seconds if self.elapsed_seconds > 0 else 0.0

    @property
    def eta_seconds(self) -> float | None:
        """Seconds left at the speed so far (None before any byte moved)."""
        speed = self.bytes_per_second
        return (self.total_bytes - self.done_bytes) / speed if speed > 0 else None


class LoadCancelled(RigllmError):
    """Raised by a progress callback to stop loading."""


ProgressCallback = Callable[[LoadProgress], None]


class ProgressCounter:
    """Counts bytes of one card's load against a total and reports each change to the callback."""

    def __init__(self, callback: ProgressCallback | None, card: int, total_bytes: int, stage: str):
        self._callback = callback
        self.card = card
        self.total_bytes = total_bytes
        self.done_bytes = 0
        self.stage = stage
        self._start = time.perf_counter()

    def add(self, nbytes: int) -> None:
        self.done_bytes += nbytes
        self.report()

    def enter(self, stage: str) -> None:
        self.stage = stage
        self.report()

    def report(self) -> None:
        if self._callback is not None:
            self._callback(LoadProgress(self.card, self.stage, min(self.done_bytes, self.total_bytes), self.total_bytes,
                                        time.perf_counter() - self._start))
