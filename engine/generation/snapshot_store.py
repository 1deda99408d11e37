"""The disk tier of the prefix cache: turn-boundary states saved next to the chat database.

Re-prefilling a long chat costs minutes on a rig, and a Gated DeltaNet state cannot be rebuilt from
a shorter one, so the state at each chat turn boundary is saved to
`<root>/<model id>/<hash of its tokens>.snap` (root: `user_data_dir()/snapshots`). Switching back to a
chat or restarting finds the longest saved prefix of the new prompt through an index of token-prefix
hashes (the file names) and loads it only then.

Safety: a save goes to a temporary file that is fsynced and renamed over the target, so a killed
writer leaves the previous snapshot (and the chat database, which is never touched) intact; leftover
temporary files are removed at a later start. A file whose model, KV format or template differs
from the running one is ignored and deleted; files of other models live in their own folders and are
kept (switching models back finds them), but all share one disk budget, evicted least recently used
first (a load touches the file's mtime).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.generation.slots import SlotSnapshot
from engine.generation.snapshot_store_format import (
    SnapshotFormatError,
    SnapshotIdentity,
    read_header,
    read_snapshot,
    write_snapshot,
)
from engine.gguf.config import ModelConfig
from engine.gguf.model_file import ModelFile
from engine.paths import user_data_dir

log = logging.getLogger(__name__)

SUFFIX = ".snap"
_TMP_PREFIX = ".partial-"
# A temporary file untouched this long is a killed save's leftover, not another process's save in progress
# (an app and a server may share the data folder).
STALE_PARTIAL_SECONDS = 600
GiB = 1 << 30


def default_root() -> Path:
    return user_data_dir() / "snapshots"


def default_host_budget() -> int:
    """Host RAM for kept states: a quarter of the machine's memory, at most 2 GiB (rigs often have 8 GB)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 8 * GiB
    return min(2 * GiB, total // 4)


def default_disk_budget(root: Path) -> int:
    """Disk for saved states: a quarter of the free space where they go, at most 16 GiB."""
    probe = root
    while not probe.exists():
        probe = probe.parent
    return min(16 * GiB, shutil.disk_usage(probe).free // 4)


def model_identity(file: ModelFile) -> str:
    """A hash of the GGUF's header and tensor table (every byte before the first tensor's data): it
    changes with any metadata, shape or type change, without reading gigabytes of weights."""
    end = min((t.offset for t in file.tensors.values()), default=file.path.stat().st_size)
    with open(file.path, "rb") as f:
        return hashlib.sha256(f.read(end)).hexdigest()[:24]


def template_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:24]


def tokens_key(tokens: Sequence[int]) -> str:
    return _key(np.asarray(tokens, dtype="<i4").tobytes())


def _key(token_bytes: bytes | memoryview) -> str:
    return hashlib.sha256(token_bytes).hexdigest()[:32]


@dataclass
class _Entry:
    path: Path
    n_tokens: int
    size: int  # bytes on disk


class SnapshotStore:
    """Saved states of one model (identity) under `root`, within `disk_budget` bytes for all models."""

    def __init__(self, root: Path, identity: SnapshotIdentity, config: ModelConfig, disk_budget: int):
        self.root = root
        self.identity = identity
        self.config = config
        self.disk_budget = disk_budget
        self.folder = root / identity.model_id
        self.folder.mkdir(parents=True, exist_ok=True)
        self._index: dict[str, _Entry] = {}
        self._lock = threading.Lock()  # the index only: a save writes its file outside it (a writer thread saves)
        self._scan()

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, tokens: Sequence[int]) -> bool:
        with self._lock:
            return tokens_key(tokens) in self._index

    def _scan(self) -> None:
        """Index this model's valid files; delete leftovers of interrupted saves and stale snapshots."""
        now = time.time()
        for path in self.folder.iterdir():
            if path.name.startswith(_TMP_PREFIX):
                with contextlib.suppress(FileNotFoundError):
                    if now - path.stat().st_mtime > STALE_PARTIAL_SECONDS:
                        path.unlink()
                continue
            if path.suffix != SUFFIX:
                continue
            try:
                header = read_header(path)
            except (SnapshotFormatError, OSError) as err:
                log.warning("dropping unreadable snapshot %s: %s", path.name, err)
                path.unlink(missing_ok=True)
                continue
            if header.identity != self.identity:
                log.info("dropping snapshot %s of another model, KV format or template", path.name)
                path.unlink(missing_ok=True)
                continue
            self._index[path.stem] = _Entry(path, header.n_tokens, path.stat().st_size)

    def save(self, tokens: Sequence[int], snapshot: SlotSnapshot) -> bool:
        """Save atomically (temp file, fsync, rename); False when it alone exceeds the disk budget."""
        key = tokens_key(tokens)
        target = self.folder / (key + SUFFIX)
        fd, tmp_name = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=self.folder)
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as f:
                write_snapshot(f, self.identity, tokens, snapshot)
                f.flush()
                os.fsync(f.fileno())
            size = tmp.stat().st_size
            if size > self.disk_budget:
                tmp.unlink()
                return False
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(self.folder)
        with self._lock:
            self._index[key] = _Entry(target, len(tokens), size)
            self._evict(keep=target)
        return True

    def longest_prefix(self, prompt: Sequence[int], longer_than: int = 0) -> tuple[int, SlotSnapshot | None]:
        """Load the saved state covering the most tokens (> `longer_than`) that is a proper prefix of
        `prompt`; (0, None) when none is. A file that fails to load is deleted and the next one tried."""
        with self._lock:
            index = dict(self._index)
        lengths = sorted({e.n_tokens for e in index.values() if longer_than < e.n_tokens < len(prompt)}, reverse=True)
        if not lengths:
            return 0, None
        data = memoryview(np.asarray(prompt, dtype="<i4").tobytes())
        for n in lengths:
            entry = index.get(_key(data[: 4 * n]))
            if entry is None:
                continue
            try:
                _, tokens, snapshot = read_snapshot(entry.path, self.config)
            except (SnapshotFormatError, OSError, ValueError) as err:
                log.warning("dropping snapshot %s: %s", entry.path.name, err)
                self._forget(entry)
                continue
            if tokens != tuple(prompt[:n]):  # a hash collision: not this prompt's state
                continue
            try:
                os.utime(entry.path)
            except FileNotFoundError:  # evicted by a save meanwhile: the state read is still whole
                pass
            return n, snapshot
        return 0, None

    def _forget(self, entry: _Entry) -> None:
        entry.path.unlink(missing_ok=True)
        with self._lock:
            self._index.pop(entry.path.stem, None)

    def _evict(self, keep: Path) -> None:
        """(Under the lock.) Delete the least recently used files under the root (any model) until all fit the budget."""
        files = []
        for path in self.root.glob(f"*/*{SUFFIX}"):
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            files.append((st.st_mtime_ns, st.st_size, path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.disk_budget:
                break
            if path == keep:
                continue
            path.unlink(missing_ok=True)
            if path.parent == self.folder:
                self._index.pop(path.stem, None)
            total -= size

    @property
    def disk_bytes(self) -> int:
        """Bytes of this model's saved states."""
        with self._lock:
            return sum(e.size for e in self._index.values())


def _fsync_dir(folder: Path) -> None:
    """Make the rename itself durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class SnapshotSettings:
    """Where and for which model to save states; the KV format comes from the backend once it is open."""

    root: Path
    model_id: str
    template_hash: str
    disk_budget: int | None = None  # None: `default_disk_budget(root)`

    @classmethod
    def for_model(cls, file: ModelFile, template_source: str, root: Path | None = None,
                  disk_budget: int | None = None) -> SnapshotSettings:
        return cls(root or default_root(), model_identity(file), template_hash(template_source), disk_budget)

    def open(self, kv_format: str, config: ModelConfig) -> SnapshotStore:
        budget = self.disk_budget if self.disk_budget is not None else default_disk_budget(self.root)
        return SnapshotStore(self.root, SnapshotIdentity(self.model_id, kv_format, self.template_hash), config, budget)
