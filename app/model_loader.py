"""Loading a model off the GUI thread: validate the file, open the backend, report staged progress.

A `ModelLoader` is a QObject living on its own QThread; `load` hands it a request through a queued
signal. The backend is opened by the `GenerationWorker`'s thread (the one owner of the backend),
and the engine reports each card's stage and bytes through `open_backend(progress=...)`; Cancel makes
that callback raise `LoadCancelled`, which unwinds the load and frees the cards. A failure reaches
the sheet as the engine's own error text.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import PurePath

from PySide6.QtCore import QCoreApplication, QObject, QThread, Signal, Slot

from engine.generation.backend import CardSpec
from engine.backends import open_backend
from engine.model.load_progress import LoadCancelled, LoadProgress
from engine.generation.snapshot_store import SnapshotSettings, default_host_budget
from engine.fixtures.demo_model import ensure_demo_model
from engine.gguf.loader import LoadedModel, load_model
from engine.generation.serving.model_service import ModelService
from engine.generation.serving.multimodal_chat import vision_for_backend
from engine.generation.serving.worker import GenerationWorker

from app.chat_engine import ChatEngine, ModelInfo
from app.engine_thread import EngineThread

DEMO_LABEL = "demo model, random weights: output is gibberish"
@dataclass(frozen=True)
class LoadRequest:
    path: PurePath | None  # None: the generated demo model (the rig's own, for a remote load); a path on the rig there
    backend: str  # auto / reference / cuda
    context: int | None  # None: the model's own
    kv_format: str
    cards: tuple[int, ...]
    split: tuple[int, ...] | None = None  # layers per chosen card; None: the memory plan balances them


class ModelLoader(QObject):
    stage = Signal(str)  # a stage that has no bytes to count ("validating the file")
    progress = Signal(object)  # LoadProgress, from the engine
    loaded = Signal(object)  # ChatEngine
    failed = Signal(str)
    cancelled = Signal()
    _requested = Signal(object)

    def __init__(self) -> None:
        super().__init__()
        self._cancel = threading.Event()
        self._thread = QThread()
        self._thread.setObjectName("rigllm-loader")
        self.moveToThread(self._thread)
        self._requested.connect(self._load)
        self._thread.start()

    def load(self, request: LoadRequest) -> None:
        """Start loading on the loader thread; exactly one of loaded/failed/cancelled follows."""
        self._cancel.clear()
        self._requested.emit(request)

    def cancel(self) -> None:
        self._cancel.set()

    def shutdown(self) -> None:
        self._cancel.set()
        self._thread.quit()
        self._thread.wait()

    def _progress(self, update: LoadProgress) -> None:  # on the generation worker's thread
        if self._cancel.is_set():
            raise LoadCancelled("the user cancelled the load")
        self.progress.emit(update)

    @Slot(object)
    def _load(self, request: LoadRequest) -> None:
        try:
            engine = self._open(request)
        except LoadCancelled:
            self.cancelled.emit()
            return
        except Exception as err:  # any failure is shown with its own text in the sheet
            self.failed.emit(str(err) or type(err).__name__)
            return
        if self._cancel.is_set():  # cancelled after the last progress report: free the cards again
            engine.close()
            self.cancelled.emit()
            return
        engine.moveToThread(QCoreApplication.instance().thread())
        self.loaded.emit(engine)

    def _open(self, request: LoadRequest) -> ChatEngine:
        self.stage.emit("preparing the demo model" if request.path is None else "validating the file")
        path = request.path or ensure_demo_model()
        loaded: LoadedModel = load_model(path)
        if self._cancel.is_set():
            raise LoadCancelled("the user cancelled the load")
        context = request.context or loaded.config.context_length
        service = ModelService.from_loaded(loaded)
        service.context_length = context
        cards = [CardSpec(i) for i in request.cards] if request.cards else None  # PCI bus order = CUDA order
        # turn-boundary states are saved beside the chat database, so switching back to a chat or
        # restarting the app restores a conversation instead of re-prefilling it
        snapshots = SnapshotSettings.for_model(loaded.file, service.template.source)
        mmproj = service.vision.encoder.mmproj if service.vision.encoder is not None else None
        worker = GenerationWorker(lambda: open_backend(request.backend, loaded, context=context, progress=self._progress,
                                                       kv=request.kv_format, cards=cards, split=request.split,
                                                       thread_factory=EngineThread, mmproj=mmproj), service.tokenizer,
                                  prefix_cache_bytes=default_host_budget(), snapshots=snapshots,
                                  thread_factory=EngineThread)
        self.stage.emit("opening the backend")
        worker.start()
        service.vision = vision_for_backend(service.vision, worker)  # a GPU backend encodes images on its card
        label = DEMO_LABEL if request.path is None else ""
        on_cards = (tuple(request.cards) or (0,)) if worker.backend_name == "cuda" else ()
        info = ModelInfo(loaded.path.stem, label, worker.backend_name, context, request.kv_format, on_cards,
                         vision=service.vision.encoder is not None and worker.supports_images,
                         mtp=worker.speculates,
                         chat_template=service.template.origin == "model's",
                         path="" if request.path is None else str(request.path), split=request.split)
        return ChatEngine(loaded, service, worker, info)
