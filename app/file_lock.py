"""An exclusive lock on a file beside the chat database, held while the app has it open: a second app
(or a stray copy) gets a clear error instead of two writers racing on one database. The OS drops the
lock when the process dies, so a crash never leaves the database locked."""

from __future__ import annotations

import os
from pathlib import Path


class LockHeld(Exception):
    """Another process holds the lock."""


class FileLock:
    def __init__(self, path: Path):
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            _lock(self._fd)
        except OSError:
            os.close(self._fd)
            raise LockHeld(f"{path} is locked by another process") from None

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the descriptor releases the lock
            self._fd = -1


def _lock(fd: int) -> None:
    if os.name == "nt":
        import msvcrt

        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    else:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
