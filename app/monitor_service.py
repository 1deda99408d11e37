"""Polls a telemetry source once a second on its own QThread and emits each snapshot.

NVML calls can stall (a card falling off the bus), so they never run on the GUI thread; snapshots
are immutable and travel through a queued signal.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, QThread, QTimer, Signal, Slot

from engine.telemetry import TelemetrySource

POLL_MS = 1000


class MonitorService(QObject):
    snapshot = Signal(object)  # RigSnapshot
    _start = Signal()
    _stop = Signal()

    def __init__(self, source: TelemetrySource, interval_ms: int = POLL_MS):
        super().__init__()
        self.source = source
        self._interval = interval_ms
        self._timer: QTimer | None = None
        self._thread = QThread()
        self._thread.setObjectName("rigllm-monitor")
        self.moveToThread(self._thread)
        self._start.connect(self._begin)
        self._stop.connect(self._end)
        self._thread.start()
        self._start.emit()

    @Slot()
    def _begin(self) -> None:
        self._timer = QTimer()
        self._timer.setInterval(self._interval)
        self._timer.timeout.connect(self.poll)
        self._timer.start()
        self.poll()

    @Slot()
    def poll(self) -> None:
        self.snapshot.emit(self.source.read())

    @Slot()
    def _end(self) -> None:
        if self._timer is not None:
            self._timer.stop()
        self.source.close()
        self._thread.quit()

    def shutdown(self) -> None:
        """Stop polling, close the source (on its own thread) and end the thread."""
        if self._thread.isRunning():
            self._stop.emit()
            self._thread.wait()
