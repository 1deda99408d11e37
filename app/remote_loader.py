"""Loading a model on a remote rig through its admin API, with the same signals as the local `ModelLoader`.

The loading sheet and the main window drive either loader alike: `load(LoadRequest)` then exactly one
of loaded/failed/cancelled, with stage and per-card `LoadProgress` reports between. Here the rig does
the loading (`POST /admin/load`) and this object, on its own QThread, polls `GET /admin/load` and
turns the rig's per-card progress into the same reports; Cancel asks the rig to cancel, which frees
its cards. `loaded` carries a `RemoteChatEngine` for the model now on the rig.

`check()` (on connecting) only asks whether the rig answers with this key (`reachable` or
`unreachable`), so the app swaps its local model out only for a rig that is there; `attach()` then
adopts a model the rig already has, and follows a load already running.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from PySide6.QtCore import QCoreApplication, QObject, QThread, Signal, Slot

from engine.errors import RigllmError
from engine.model.load_progress import LoadProgress
from engine.server.admin_host import LOADED, LOADING, UNLOADING

from app.chat_engine import ModelInfo
from app.model_loader import LoadRequest
from app.remote_engine import RemoteChatEngine
from app.rig_client import RigClient, RigLink

POLL_SECONDS = 0.2


def remote_info(link: RigLink, status: dict[str, Any]) -> ModelInfo:
    """The status line's facts for the rig's loaded model; its label says which rig it runs on."""
    label = f"on rig {link.name}" + (f" · {status['label']}" if status["label"] else "")
    backend = status["backend"]
    # The rig's KV format and cards are set by its `rigllm serve` options, which /admin/load does not report
    # yet; the status line shows the defaults (fp16, card 0) until it does.
    return ModelInfo(status["model"], label, backend, status["context"], status.get("kv", "f16"),
                     tuple(status.get("cards", (0,))) if backend == "cuda" else ())


def progress_of(card: dict[str, Any]) -> LoadProgress:
    """The rig's per-card report as the engine's own (its elapsed time recovered from bytes and speed)."""
    speed = card["bytes_per_s"]
    elapsed = card["done_bytes"] / speed if speed > 0 else 0.0
    return LoadProgress(card["card"], card["stage"], card["done_bytes"], card["total_bytes"], elapsed)


class RemoteModelLoader(QObject):
    stage = Signal(str)
    progress = Signal(object)  # LoadProgress
    loaded = Signal(object)  # RemoteChatEngine
    failed = Signal(str)
    cancelled = Signal()
    notice = Signal(str)  # connected, unloaded: one line for the status bar
    unreachable = Signal(str)  # check() or attach() could not talk to the rig (wrong address or key)
    reachable = Signal()  # check() reached the rig with this key
    _requested = Signal(object)
    _check = Signal()
    _attach = Signal()
    _unload = Signal()

    def __init__(self, link: RigLink):
        super().__init__()
        self.link = link
        self._cancel = threading.Event()
        self._closing = threading.Event()  # disconnecting: stop following, leave the rig's load alone
        self._rig: RigClient | None = None  # made and used on the loader thread only
        self._thread = QThread()
        self._thread.setObjectName("rigllm-remote-loader")
        self.moveToThread(self._thread)
        self._requested.connect(self._load)
        self._check.connect(self._do_check)
        self._attach.connect(self._adopt)
        self._unload.connect(self._do_unload)
        self._thread.start()

    # ---- called on the GUI thread ------------------------------------------------------------------
    def load(self, request: LoadRequest) -> None:
        """Ask the rig to load; exactly one of loaded/failed/cancelled follows."""
        self._cancel.clear()
        self._requested.emit(request)

    def check(self) -> None:
        """Ask the rig for its status once: `reachable` or `unreachable` follows."""
        self._check.emit()

    def attach(self) -> None:
        """Check the address and key, and adopt the rig's model (`loaded`) if it has one."""
        self._attach.emit()

    def unload(self) -> None:
        """Unload the rig's model, freeing its cards (it finishes the requests it is running first)."""
        self._unload.emit()

    def cancel(self) -> None:
        self._cancel.set()

    def shutdown(self) -> None:
        """Stop following the rig (a load running there goes on) and end the thread."""
        self._closing.set()
        self._thread.quit()
        self._thread.wait()
        if self._rig is not None:
            self._rig.close()

    # ---- on the loader thread ------------------------------------------------------------------------
    def _client(self) -> RigClient:
        if self._rig is None:
            self._rig = self.link.client()
        return self._rig

    @Slot()
    def _do_check(self) -> None:
        try:
            self._client().load_status()
        except RigllmError as err:
            self.unreachable.emit(str(err))
            return
        self.reachable.emit()

    @Slot()
    def _adopt(self) -> None:
        try:
            status = self._client().load_status()
        except RigllmError as err:
            self.unreachable.emit(str(err))
            return
        if status["state"] in (LOADING, UNLOADING):
            self.notice.emit(f"connected to rig {self.link.name}: it is {status['state']} a model")
            self._settle()
        elif status["model"] is not None:
            self.notice.emit(f"connected to rig {self.link.name}")
            self._emit_loaded(status)
        else:
            self.notice.emit(f"connected to rig {self.link.name}: no model loaded (Model > Load model...)")

    @Slot(object)
    def _load(self, request: LoadRequest) -> None:
        self.stage.emit(f"asking rig {self.link.name} to load the model")
        try:
            self._client().start_load(None if request.path is None else str(request.path), request.context,
                                      request.backend)
        except RigllmError as err:
            self.failed.emit(str(err))
            return
        self._settle()

    def _settle(self) -> None:
        """Follow the rig's load to its end, reporting progress; a lost rig reports as a failure."""
        try:
            self._follow()
        except RigllmError as err:
            self.failed.emit(str(err))

    def _follow(self) -> None:
        rig = self._client()
        asked_to_cancel = False
        last_stage, last_cards = None, None
        while True:
            if self._closing.is_set():
                return
            if self._cancel.is_set() and not asked_to_cancel:
                rig.cancel_load()
                asked_to_cancel = True
            status = rig.load_status()
            if status["stage"] and status["stage"] != last_stage:
                last_stage = status["stage"]
                self.stage.emit(f"rig {self.link.name}: {last_stage}")
            if status["cards"] != last_cards:
                last_cards = status["cards"]
                for card in last_cards:
                    self.progress.emit(progress_of(card))
            if status["state"] not in (LOADING, UNLOADING):
                break
            time.sleep(POLL_SECONDS)
        if status["state"] == LOADED and status["error"] is None:
            if self._cancel.is_set():  # finished before the cancel reached it: free the cards again
                rig.unload()
                self.cancelled.emit()
            else:
                self._emit_loaded(status)
        elif asked_to_cancel:
            self.cancelled.emit()
        else:
            self.failed.emit(status["error"] or f"the rig has no model loaded (state: {status['state']})")

    def _emit_loaded(self, status: dict[str, Any]) -> None:
        engine = RemoteChatEngine(self.link, status["model"], remote_info(self.link, status))
        engine.moveToThread(QCoreApplication.instance().thread())
        self.loaded.emit(engine)

    @Slot()
    def _do_unload(self) -> None:
        try:
            self._client().unload()
        except RigllmError as err:
            self.notice.emit(str(err))
            return
        self.notice.emit(f"unloaded the model on rig {self.link.name}; its cards are free")
