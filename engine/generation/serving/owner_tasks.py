"""Calls that must run on the thread that owns the backend, asked for by other threads.

A CUDA backend's card belongs to the generation worker's thread (contracts.md "Threads and
ownership"), and so does the vision tower loaded on it: a request thread that needs an image encoded
submits the call here and waits; the scheduler runs pending calls between two of its turns (one
prefill chunk and one decode step apart), and a `WAKE` put on the job queue rouses it when idle.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from engine.errors import RigllmError


class Wake:
    """Queued next to jobs: run the pending owner tasks now (it carries nothing)."""


WAKE = Wake()


class OwnerTasks:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[tuple[Callable[[], Any], Future]] = []
        self._closed = False

    def submit(self, fn: Callable[[], Any]) -> Future:
        """Queue `fn` for the owner thread; its result (or exception) arrives through the future."""
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise RigllmError("the model is being unloaded; try again shortly")
            self._pending.append((fn, future))
        return future

    def run_pending(self) -> None:
        """Run every queued call, in order (on the owner thread)."""
        with self._lock:
            tasks, self._pending = self._pending, []
        for fn, future in tasks:
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as err:  # delivered to the thread that waits on the future
                future.set_exception(err)

    def close(self) -> None:
        """Refuse further calls and fail the queued ones (the backend is going away)."""
        with self._lock:
            self._closed = True
            tasks, self._pending = self._pending, []
        for _, future in tasks:
            future.set_exception(RigllmError("the model was unloaded before this request's images were encoded"))
