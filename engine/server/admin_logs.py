"""Recent log records kept in memory for `GET /admin/logs`, so a headless rig's owner can read them remotely.

The journal keeps everything (the service logs to stderr); this ring holds only the last records,
bounded, so a long-running server cannot grow with its logs.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any

DEFAULT_CAPACITY = 2000
CAPTURED_LOGGERS = ("rigllm", "uvicorn.error")


class LogRing(logging.Handler):
    """A logging handler that keeps the newest `capacity` records as JSON-able dicts."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY, level: int = logging.INFO):
        super().__init__(level)
        self._records: deque[dict[str, Any]] = deque(maxlen=capacity)
        self._lock_records = threading.Lock()
        self._seq = 0

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info:
                message += "\n" + logging.Formatter().formatException(record.exc_info)
            with self._lock_records:
                self._seq += 1
                self._records.append({"seq": self._seq, "time": record.created, "level": record.levelname,
                                      "logger": record.name, "message": message})
        except Exception:  # logging must never take the server down
            self.handleError(record)

    def recent(self, n: int, min_level: int = logging.NOTSET) -> list[dict[str, Any]]:
        """The newest `n` records at or above `min_level`, oldest first."""
        with self._lock_records:
            records = [r for r in self._records if logging.getLevelName(r["level"]) >= min_level]
        return records[-n:] if n > 0 else []


def install_log_ring(capacity: int = DEFAULT_CAPACITY, loggers: tuple[str, ...] = CAPTURED_LOGGERS) -> LogRing:
    """Attach a new ring to rigllm's and uvicorn's loggers; rigllm's logger is raised to INFO so loads show."""
    ring = LogRing(capacity)
    for name in loggers:
        logger = logging.getLogger(name)
        logger.addHandler(ring)
        if logger.level == logging.NOTSET or logger.level > logging.INFO:
            logger.setLevel(logging.INFO)
    return ring


def remove_log_ring(ring: LogRing, loggers: tuple[str, ...] = CAPTURED_LOGGERS) -> None:
    for name in loggers:
        logging.getLogger(name).removeHandler(ring)
