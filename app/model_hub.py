"""The model browser's and library's work off the GUI thread: Hub search, repository listing and header
reads, pricing, and pulls with progress and Cancel. Each call runs on a short-lived thread and answers with
a signal, which Qt delivers on the GUI thread (the pattern of the load sheet's inspector)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, Signal

from engine.errors import RigllmError
from engine.hub.catalog import list_repo, search
from engine.hub.download import DownloadCancelled
from engine.hub.fit import read_repo_model
from engine.hub.library import Library
from engine.hub.pull import pull
from engine.hub.session import HubAccess, HubUnreachable


class HubTasks(QObject):
    searched = Signal(object)  # list[RepoHit]
    read = Signal(object)  # RepoModel: listing + one header, priced on the GUI thread as the knobs change
    progress = Signal(object)  # engine.hub.download.Progress
    pulled = Signal(object)  # engine.hub.pull.Pulled
    cancelled = Signal(str)
    failed = Signal(str, str)  # (what: search | repo | pull, the one-line message)
    unreachable = Signal(str)  # the Hub could not be reached at all: the page says so plainly

    def __init__(self, access: HubAccess | None = None):
        super().__init__()
        self.access = access or HubAccess()
        self._cancel = threading.Event()
        self.pulling = False

    def _run(self, what: str, job: Callable[[], Any], done: Signal) -> None:
        def work() -> None:
            try:
                result = job()
            except Exception as err:  # answered below, once the pull flag is down
                result, failure = None, err
            else:
                failure = None
            if what == "pull":
                self.pulling = False  # before the answer, so the page's buttons see the pull as over
            if failure is None:
                done.emit(result)
            elif isinstance(failure, HubUnreachable):
                self.unreachable.emit(str(failure))
            elif isinstance(failure, DownloadCancelled):
                self.cancelled.emit(str(failure))
            elif isinstance(failure, RigllmError):
                self.failed.emit(what, str(failure))
            else:
                self.failed.emit(what, f"{type(failure).__name__}: {failure}")

        threading.Thread(target=work, name=f"rigllm-hub-{what}", daemon=True).start()

    def search(self, query: str) -> None:
        self._run("search", lambda: search(query, self.access), self.searched)

    def open_repo(self, repo: str) -> None:
        self._run("repo", lambda: read_repo_model(list_repo(repo, self.access), self.access), self.read)

    def pull(self, library: Library, repo: str, file: str, listing: Any = None) -> None:
        self._cancel.clear()
        self.pulling = True
        self._run("pull", lambda: pull(repo, library, self.access, file=file, progress=self.progress.emit,
                                       cancel=self._cancel, listing=listing), self.pulled)

    def cancel(self) -> None:
        self._cancel.set()
