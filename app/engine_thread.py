"""The thread that owns the engine, as a QThread: the engine takes a thread factory (contracts.md
"Threads and ownership"), and the app gives it this one so the owner thread is a Qt thread that Qt's
tools see and that the app waits for when it closes a model."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QThread


class EngineThread(QThread):
    def __init__(self, target: Callable[[], None], name: str):
        super().__init__()
        self._target = target
        self.setObjectName(name)

    def run(self) -> None:
        self._target()

    def is_alive(self) -> bool:
        return self.isRunning()

    def join(self) -> None:
        self.wait()
