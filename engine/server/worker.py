"""The one thread that owns the backend: it opens it, runs queued jobs one at a time, and closes it.

Backends are single-owner (contracts.md, "Threads and ownership"), so requests never touch the
backend themselves; they put a `Job` on a bounded queue and read its events. A full queue is
refused at once (503) rather than letting requests pile up. This is the simple form of the
scheduler: one slot, no batching, no prefix cache.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from engine.generation.backend import Backend
from engine.generation.tokenizer import Tokenizer
from engine.server.generation_job import Failed, Job, run_job

log = logging.getLogger("rigllm.server")


class QueueFull(Exception):
    """More requests are waiting than the queue holds."""


class GenerationWorker:
    def __init__(self, open_backend: Callable[[], Backend], tokenizer: Tokenizer, max_queue: int = 16):
        self._open_backend = open_backend
        self._tokenizer = tokenizer
        self._jobs: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self.backend_name = ""
        self.busy = False
        self._thread = threading.Thread(target=self._run, name="rigllm-generation", daemon=True)

    def start(self) -> None:
        """Start the thread and wait until it has opened the backend (re-raising its failure here)."""
        self._thread.start()
        self._ready.wait()
        if self._startup_error is not None:
            raise self._startup_error

    @property
    def waiting(self) -> int:
        return self._jobs.qsize()

    def submit(self, job: Job) -> None:
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            raise QueueFull(f"{self._jobs.maxsize} requests are already waiting; try again shortly") from None

    def stop(self) -> None:
        """Finish the current job, drop the thread's backend, and end the thread."""
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()

    def _run(self) -> None:
        try:
            backend = self._open_backend()
        except BaseException as err:  # reported to start(), which re-raises in the caller's thread
            self._startup_error = err
            self._ready.set()
            return
        self.backend_name = backend.name
        self._ready.set()
        try:
            while (job := self._jobs.get()) is not None:
                if job.cancelled.is_set():
                    continue
                self.busy = True
                try:
                    job.post(run_job(backend, self._tokenizer, job))
                except Exception as err:  # a bug in generation must not kill the server's only worker
                    log.exception("generation failed")
                    job.post(Failed(f"generation failed: {type(err).__name__}: {err}"))
                finally:
                    self.busy = False
        finally:
            backend.close()
