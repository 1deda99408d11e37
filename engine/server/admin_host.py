"""`ModelHost`: which model the server has loaded, and loading, replacing and unloading it while serving.

The admin API (and `rigllm serve` at startup) ask the host to load a file; the host validates it,
builds the `ModelService` and a `GenerationWorker` whose thread opens the backend (that thread then
owns the cards), and records progress that `GET /admin/load` reports. Loading runs on its own thread
so the request that started it returns at once. Unloading stops the worker, which finishes the
requests it is running and closes the backend, freeing the cards, before anything else loads:
two models never hold the cards at the same time. The host is the `ModelSource` that `create_app`'s
routes serve from.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from engine.errors import RigllmError
from engine.backends import open_backend
from engine.generation.backend import Backend
from engine.model.load_progress import LoadCancelled, LoadProgress, ProgressCallback
from engine.generation.snapshot_store import SnapshotSettings
from engine.gguf.loader import LoadedModel, load_model
from engine.generation.serving.model_service import ModelService
from engine.generation.serving.multimodal_chat import vision_for_backend
from engine.generation.serving.request_error import APIError
from engine.generation.serving.request_limits import RequestLimits
from engine.generation.serving.worker import DEFAULT_PREFIX_CACHE_BYTES, DEFAULT_SLOTS, GenerationWorker
from engine.vision.mmproj import LoadedMmproj

log = logging.getLogger("rigllm.admin")

EMPTY, LOADING, LOADED, UNLOADING, FAILED = "empty", "loading", "loaded", "unloading", "failed"
DEMO_LABEL = "demo model (random weights, its output is gibberish)"

# (backend name, model, context, slots, progress callback, the model's mmproj or None) -> the opened backend
BackendOpener = Callable[[str, LoadedModel, int, int, ProgressCallback, LoadedMmproj | None], Backend]


def open_with_progress(name: str, loaded: LoadedModel, context: int, slots: int, progress: ProgressCallback,
                       mmproj: LoadedMmproj | None = None, **placement: Any) -> Backend:
    """`placement`: the cards, layer split, KV format and MTP switch (`open_backend`'s kv, cards, split,
    speculative)."""
    return open_backend(name, loaded, context=context, progress=progress, slots=slots, mmproj=mmproj, **placement)


@dataclass
class _Loaded:
    service: ModelService
    worker: GenerationWorker
    context: int
    label: str


class ModelHost:
    """Owner of the loaded model. Thread-safe; `service`/`worker` may change between two calls."""

    def __init__(self, backend: str = "auto", max_queue: int = 16, opener: BackendOpener = open_with_progress,
                 slots: int = DEFAULT_SLOTS, prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES,
                 snapshot_root: Path | None = None, speculative: bool = True, limits: RequestLimits = RequestLimits()):
        """`slots` and `prefix_cache_bytes` apply to every model loaded (see `GenerationWorker`);
        `snapshot_root` keeps chat-turn states on disk there too, so they survive a restart; `limits`
        bound every request to every model (engine.generation.serving.request_limits)."""
        self.limits = limits
        self.snapshot_root = snapshot_root
        self.speculative = speculative  # draft with a model's MTP head when the backend can
        self.backend = backend
        self.max_queue = max_queue
        self.slots = slots
        self.prefix_cache_bytes = prefix_cache_bytes
        self._opener = opener
        self._lock = threading.Lock()
        self._current: _Loaded | None = None
        self._state = EMPTY
        self._path: Path | None = None
        self._stage = ""
        self._error: str | None = None
        self._cards: dict[int, LoadProgress] = {}
        self._cancel = threading.Event()
        self._started = 0.0
        self._finished = 0.0
        self._thread: threading.Thread | None = None

    # ---- what the routes use ---------------------------------------------------------------------
    @property
    def current(self) -> tuple[ModelService, GenerationWorker] | None:
        with self._lock:
            return (self._current.service, self._current.worker) if self._current else None

    def require(self) -> tuple[ModelService, GenerationWorker]:
        """The loaded model's service and worker, or a 503 that says why there is none."""
        now = self.current
        if now is None:
            raise APIError(503, f"no model is loaded (state: {self.status()['state']}); load one with POST /admin/load",
                           code="model_not_loaded")
        return now

    @property
    def label(self) -> str:
        with self._lock:
            return self._current.label if self._current else ""

    def status(self) -> dict[str, Any]:
        with self._lock:
            cur = self._current
            end = self._finished or time.monotonic()
            cards = [{"card": p.card, "stage": p.stage, "done_bytes": p.done_bytes, "total_bytes": p.total_bytes,
                      "bytes_per_s": round(p.bytes_per_second), "eta_s": p.eta_seconds}
                     for _, p in sorted(self._cards.items())]
            return {
                "state": self._state,
                "path": str(self._path) if self._path else None,
                "model": cur.service.model_id if cur else None,
                "label": cur.label if cur else "",
                "backend": cur.worker.backend_name if cur else None,
                "context": cur.context if cur else None,
                "stage": self._stage,
                "error": self._error,
                "elapsed_s": round(end - self._started, 3) if self._started else None,
                "cards": cards,
                "done_bytes": sum(c["done_bytes"] for c in cards),
                "total_bytes": sum(c["total_bytes"] for c in cards),
            }

    # ---- load / unload ---------------------------------------------------------------------------
    def start_load(self, path: str | Path, context: int | None = None, backend: str | None = None,
                   label: str = "") -> None:
        """Begin loading on a background thread (replacing any loaded model); poll `status()`."""
        if not Path(path).is_file():
            raise APIError(400, f"{path}: no such file on the server", param="model")
        with self._lock:
            if self._state in (LOADING, UNLOADING):
                raise APIError(409, f"a model is already {self._state}; wait for it to finish", code="busy")
            self._begin(LOADING, Path(path), "queued")
            self._thread = threading.Thread(target=self._load_guarded, args=(Path(path), context, backend, label),
                                            name="rigllm-model-load", daemon=True)
            self._thread.start()

    def load(self, path: str | Path, context: int | None = None, backend: str | None = None, label: str = "") -> None:
        """Load in the calling thread (startup preload); raises the load's error after recording it."""
        self.start_load(path, context, backend, label)
        self.wait()
        with self._lock:
            error = self._error
        if error is not None:
            raise RigllmError(error)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a background load to end; False on timeout."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    def unload(self) -> bool:
        """Finish running requests, close the backend (freeing the cards); False when nothing was loaded."""
        with self._lock:
            if self._state in (LOADING, UNLOADING):
                raise APIError(409, f"a model is {self._state}; wait for it to finish", code="busy")
            if self._current is None:
                return False
            self._begin(UNLOADING, self._path, "finishing running requests")
        self._release()
        with self._lock:
            self._state, self._stage, self._finished = EMPTY, "", time.monotonic()
        return True

    def cancel_load(self) -> bool:
        """Stop a load in flight at the backend's next progress report (it frees what it allocated)."""
        with self._lock:
            if self._state != LOADING:
                return False
            self._cancel.set()
            self._stage = "cancelling"
        return True

    def close(self) -> None:
        """Shutdown: cancel a load in flight (its backend frees what it took), then unload."""
        self.cancel_load()
        self.wait()
        with self._lock:
            loaded = self._current is not None
        if loaded:
            self._release()
            with self._lock:
                self._state = EMPTY

    def _begin(self, state: str, path: Path | None, stage: str) -> None:
        self._state, self._path, self._stage, self._error = state, path, stage, None
        self._cards, self._started, self._finished = {}, time.monotonic(), 0.0
        self._cancel.clear()

    def _set_stage(self, stage: str) -> None:
        with self._lock:
            self._stage = stage
        log.info("load: %s", stage)

    def _on_progress(self, p: LoadProgress) -> None:
        """Called on the worker thread as the backend loads; raising LoadCancelled stops the load."""
        with self._lock:
            self._cards[p.card] = p
        if self._cancel.is_set():
            raise LoadCancelled("the load was cancelled")

    def _release(self) -> None:
        with self._lock:
            old, self._current = self._current, None
        if old is not None:
            log.info("unloading %s", old.service.model_id)
            old.worker.stop()

    def _load_guarded(self, path: Path, context: int | None, backend: str | None, label: str) -> None:
        try:
            self._load(path, context, backend or self.backend, label)
        except Exception as err:  # recorded for GET /admin/load; the server keeps running without a model
            message = str(err) if isinstance(err, RigllmError) else f"{type(err).__name__}: {err}"
            log.error("loading %s failed: %s", path, message)
            with self._lock:  # a model that was not yet replaced keeps serving
                self._state = LOADED if self._current else FAILED
                self._error, self._finished = message, time.monotonic()

    def _load(self, path: Path, context: int | None, backend: str, label: str) -> None:
        self._set_stage(f"validating {path.name}")
        loaded = load_model(path)
        if self._cancel.is_set():  # cancelled while validating: nothing is allocated yet
            raise LoadCancelled("the load was cancelled")
        native = loaded.config.context_length
        ctx = min(context or native, native)
        if ctx < 2:
            raise RigllmError("the context must be at least 2 tokens")
        service = replace(ModelService.from_loaded(loaded), context_length=ctx, limits=self.limits)
        if self.current is not None:
            self._set_stage("unloading the previous model")
            self._release()
        self._set_stage(f"opening the {backend} backend")
        mmproj = service.vision.encoder.mmproj if service.vision.encoder is not None else None
        worker = GenerationWorker(lambda: self._opener(backend, loaded, ctx, self.slots, self._on_progress, mmproj),
                                  service.tokenizer, self.max_queue, slots=self.slots,
                                  prefix_cache_bytes=self.prefix_cache_bytes,
                                  snapshots=(SnapshotSettings.for_model(loaded.file, service.template.source,
                                                                        root=self.snapshot_root)
                                             if self.snapshot_root is not None else None),
                                  speculative=self.speculative)
        worker.start()
        service.vision = vision_for_backend(service.vision, worker)  # a GPU backend encodes on its card
        with self._lock:
            self._current = _Loaded(service, worker, ctx, label)
            self._state, self._stage, self._finished = LOADED, "ready", time.monotonic()
        log.info("loaded %s on the %s backend (context %d)", service.model_id, worker.backend_name, ctx)
