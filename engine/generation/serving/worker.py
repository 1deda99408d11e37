"""The one thread that owns the backend: it opens it, runs the scheduler over its slots, and closes it.

Backends are single-owner (contracts.md, "Threads and ownership"), so requests never touch the
backend themselves; they put a `Job` on a queue and read its events through the job's sink.
Admission is counted: exactly slots + `max_queue` jobs may be held at once (running or waiting),
and one more is refused at once (503) rather than letting requests pile up. If the generation thread
ever dies, `failure` says why and every later job is refused at once instead of waiting forever. Work that must run on this thread but is not a job (a GPU backend's vision tower
encoding a request's images) goes through `call_on_owner`.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import numpy as np

from engine.errors import RigllmError
from engine.generation.backend import Backend
from engine.generation.prefix_cache import PrefixCache, TieredPrefixCache
from engine.generation.slots import slot_backend
from engine.generation.snapshot_store import SnapshotSettings
from engine.generation.tokenizer import Tokenizer
from engine.generation.serving.request_error import APIError
from engine.generation.serving.generation_job import Job
from engine.generation.serving.multimodal_chat import IMAGES_UNSUPPORTED
from engine.generation.serving.owner_tasks import WAKE, Wake
from engine.generation.serving.scheduler import Scheduler
from engine.vision.preprocess import PreparedImage

DEFAULT_SLOTS = 4
DEFAULT_PREFIX_CACHE_BYTES = 1 << 30

log = logging.getLogger(__name__)
T = TypeVar("T")

class OwnerThread(Protocol):
    """What the worker needs of its thread: start it, ask whether it runs, wait for its end."""

    def start(self) -> None: ...

    def is_alive(self) -> bool: ...

    def join(self) -> None: ...


ThreadFactory = Callable[[Callable[[], None], str], OwnerThread] | None


def _plain_thread(target: Callable[[], None], name: str) -> OwnerThread:
    return threading.Thread(target=target, name=name, daemon=True)


class Unavailable(RigllmError):
    """The worker takes no job now (a 503 in the API, a message in the app): `code` says why, `retry_after`
    when to ask again (seconds)."""

    code = "unavailable"
    retry_after = 1


class QueueFull(Unavailable):
    """Every slot is busy and as many requests wait as the queue holds."""

    code = "queue_full"


class WorkerFailed(Unavailable):
    """The generation thread is not serving (it died, or the model is being unloaded)."""

    code = "worker_failed"
    retry_after = 5


class ImagesUnsupported(APIError, RigllmError):
    """A job with images for a backend that cannot prefill them: a 400 in the API, a message in the app."""


class GenerationWorker:
    def __init__(self, open_backend: Callable[[], Backend], tokenizer: Tokenizer, max_queue: int = 16,
                 slots: int = DEFAULT_SLOTS, prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES,
                 snapshots: SnapshotSettings | None = None, speculative: bool = True,
                 thread_factory: ThreadFactory = None):
        """`slots`: requests decoded together (a backend with its own slot count keeps that one);
        `prefix_cache_bytes`: host memory for kept turn-boundary states (0 disables the cache);
        `snapshots`: also save those states to disk and load them back (restarts, switching chats).
        `thread_factory(target, name)` makes the thread that owns the backend (contracts.md "Threads and
        ownership"): a plain daemon thread by default; the desktop app passes a QThread-backed one."""
        self._speculative = speculative
        self._open_backend = open_backend
        self._tokenizer = tokenizer
        self._slots = slots
        self._prefix_cache_bytes = prefix_cache_bytes
        self._snapshots = snapshots
        self._jobs: queue.Queue[Job | Wake | None] = queue.Queue()  # bounded by the admission count
        self._max_queue = max_queue
        self._held = 0  # jobs admitted and not yet left the scheduler
        self._held_lock = threading.Lock()
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._failure: str | None = None
        self._scheduler: Scheduler | None = None
        self.backend_name = ""
        self._thread = (thread_factory or _plain_thread)(self._run, "rigllm-generation")

    def start(self) -> None:
        """Start the thread and wait until it has opened the backend (re-raising its failure here)."""
        self._thread.start()
        self._ready.wait()
        if self._startup_error is not None:
            raise self._startup_error

    @property
    def waiting(self) -> int:
        """Admitted requests that hold no slot yet."""
        return max(self._held - self.active, 0)

    @property
    def failure(self) -> str | None:
        """None while the generation thread is alive and serving; else why it is not."""
        if self._failure is not None:
            return self._failure
        if not self._ready.is_set():
            return "the model is still being opened"
        if not self._thread.is_alive():
            return "the generation thread is not running"
        return None

    @property
    def capacity(self) -> int:
        """Requests admitted at once: one per slot plus the queue."""
        return self.slot_count + self._max_queue

    @property
    def queue_limit(self) -> int:
        """How many requests may wait for a slot (a router sees it in /health)."""
        return self._max_queue

    @property
    def full(self) -> bool:
        """True while `submit` would refuse a job with QueueFull: every slot and queue place is held."""
        return self._held >= self.capacity

    @property
    def scheduler(self) -> Scheduler | None:
        """The running scheduler (None until the backend is open): read by metrics scrapes, driven only here."""
        return self._scheduler

    @property
    def active(self) -> int:
        """Requests holding a slot now (prefilling or decoding)."""
        return self._scheduler.active if self._scheduler else 0

    @property
    def slot_count(self) -> int:
        return len(self._scheduler.slots) if self._scheduler else 0

    @property
    def busy(self) -> bool:
        return self.active > 0

    @property
    def supports_images(self) -> bool:
        """Whether the backend prefills image embeddings (the reference does; CUDA when loaded with an mmproj)."""
        return self._scheduler is not None and self._scheduler.supports_images

    @property
    def speculates(self) -> bool:
        """Whether the backend drafts with the model's MTP head: the model has one and the backend runs it (the
        CUDA backend leaves it off when only the head does not fit its cards)."""
        return self._scheduler is not None and getattr(self._scheduler.backend, "speculation_stats", None) is not None

    @property
    def encodes_images(self) -> bool:
        """Whether the backend holds its own vision tower (on its card): images are then encoded there."""
        return self.supports_images and hasattr(self._scheduler.backend, "encode_image")  # type: ignore[union-attr]

    def encode_image(self, image: PreparedImage) -> np.ndarray:
        """The backend's tower output for `image` (see `encodes_images`), computed on this worker's thread."""
        if not self.encodes_images:
            raise RigllmError(IMAGES_UNSUPPORTED)
        return self.call_on_owner(self._scheduler.backend.encode_image, image)  # type: ignore[union-attr]

    def call_on_owner(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` on the thread that owns the backend, between two scheduler turns, and wait for it."""
        if self._scheduler is None:
            raise RigllmError("the model is not loaded yet")
        future = self._scheduler.tasks.submit(lambda: fn(*args))
        self._jobs.put(WAKE)  # rouse a scheduler that waits for jobs (the queue is unbounded)
        return future.result()

    def submit(self, job: Job) -> None:
        """Queue `job`; refuses a job with images the backend cannot run (before it waits in the queue)."""
        if job.multimodal is not None and not self.supports_images:
            raise ImagesUnsupported(400, f"{IMAGES_UNSUPPORTED} (this server runs the {self.backend_name} backend)",
                                    param="messages", code="images_unsupported")
        failure = self.failure
        if failure is not None:
            raise WorkerFailed(f"the server cannot generate now: {failure}")
        with self._held_lock:
            if self._held >= self.capacity:
                raise QueueFull(f"all {self.slot_count} slots are busy and {self._max_queue} requests are already "
                                "waiting; try again shortly")
            self._held += 1
        self._jobs.put(job)

    def _left(self, _job: Job) -> None:
        """The scheduler let go of a job (finished, failed, cancelled or refused): its admission frees."""
        with self._held_lock:
            self._held -= 1

    def stop(self) -> None:
        """Finish the running jobs, answer the queued ones with an error, drop the backend, end the thread."""
        if self._failure is None:
            self._failure = "the model is being unloaded"
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()

    def _run(self) -> None:
        try:
            opened = self._open_backend()
            backend = slot_backend(opened, self._slots, self._speculative)
        except BaseException as err:  # reported to start(), which re-raises in the caller's thread
            self._startup_error = err
            self._ready.set()
            return
        self.backend_name = backend.name
        cache = self._make_cache(opened)
        self._scheduler = Scheduler(backend, self._tokenizer, cache, on_leave=self._left)
        self._ready.set()
        try:
            self._scheduler.run(self._jobs)
        except BaseException as err:  # the loop's guards failed: say so, and answer every job it held
            self._failure = f"the generation thread died: {type(err).__name__}: {err}"
            log.critical("%s", self._failure, exc_info=err)
            self._scheduler.fail_all(self._jobs, self._failure)
        finally:
            if isinstance(cache, TieredPrefixCache):
                cache.close()
            backend.close()

    def _make_cache(self, backend: Backend) -> PrefixCache | None:
        """The RAM cache, with the disk tier when asked for and the backend names its KV format."""
        if self._prefix_cache_bytes <= 0:
            return None
        kv = getattr(backend, "kv", None)
        if self._snapshots is None or kv is None:
            return PrefixCache(self._prefix_cache_bytes)
        try:
            store = self._snapshots.open(kv.name, backend.config)
        except OSError as err:  # an unwritable data folder costs the disk tier, not the model
            log.warning("saved conversation states are off: %s", err)
            return PrefixCache(self._prefix_cache_bytes)
        return TieredPrefixCache(self._prefix_cache_bytes, store)
