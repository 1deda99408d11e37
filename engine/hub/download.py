"""Fetch one file of a Hub repository into the models folder: resumable, cancellable, checked.

Why not `hf_hub_download`: in huggingface_hub 2.x it writes to a process-unique temporary file and deletes
it when the download fails, so an interrupted 16 GB download starts again from zero after a restart. Here
the bytes go to `<name>.part` beside the destination, with a `<name>.part.json` naming the blob it belongs
to, and every start resumes from what is there (a ranged GET through huggingface_hub's `http_get`, which
itself retries a dropped connection from the byte it got to). The digest is computed while the bytes
arrive (the part already on disk is hashed first) and compared with the Hub's record: the LFS sha256 from
`get_paths_info`, or git's blob sha1 for a small file kept in git. A mismatch deletes the part and
refuses the file. A free-disk check runs before any byte is fetched.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from huggingface_hub import constants
from huggingface_hub.file_download import get_hf_file_metadata, hf_hub_url, http_get
from huggingface_hub.hf_api import RepoFile
from huggingface_hub.utils import build_hf_headers

from engine.errors import RigllmError
from engine.hub.session import HubAccess, hub_errors
from engine.model.memory_plan import format_bytes

PART_SUFFIX = ".part"
FREE_DISK_MARGIN = 256 << 20  # left free beyond the file: the OS and the index need room too
REPORT_EVERY_S = 0.2
# http_get hands over (and resumes from) whole chunks of this size; huggingface_hub's 10 MB would make a
# slow link's progress and Cancel lag by 10 MB and lose up to 10 MB to every dropped connection.
CHUNK_BYTES = 1 << 20
_HASH_READ = 8 << 20


class DownloadCancelled(RigllmError):
    """The user stopped the download; the part stays on disk and the next pull resumes it."""


class ChecksumMismatch(RigllmError):
    pass


@dataclass(frozen=True)
class Progress:
    file: str
    done_bytes: int
    total_bytes: int
    bytes_per_s: float  # over this run's bytes (a resumed prefix is not counted as speed)
    stage: str  # "downloading", "verified"

    @property
    def eta_s(self) -> float | None:
        return (self.total_bytes - self.done_bytes) / self.bytes_per_s if self.bytes_per_s > 0 else None

    def line(self) -> str:
        """'412.0/1024.0 MB · 38.2 MB/s · ETA 16 s'."""
        text = f"{self.done_bytes / 1e6:.1f}/{self.total_bytes / 1e6:.1f} MB"
        if self.bytes_per_s > 0:
            text += f" · {self.bytes_per_s / 1e6:.1f} MB/s"
        if self.eta_s is not None and self.done_bytes < self.total_bytes:
            text += f" · ETA {self.eta_s:.0f} s"
        return text


ProgressFn = Callable[[Progress], None]


@dataclass(frozen=True)
class Expected:
    """What the Hub recorded for the file: its size and the digest that checks it."""

    size: int
    sha256: str | None
    blob_id: str | None

    def hasher(self) -> Any:
        if self.sha256:
            return hashlib.sha256()
        h = hashlib.sha1()
        h.update(b"blob %d\0" % self.size)  # git's blob id hashes this header, then the content
        return h

    @property
    def digest(self) -> str | None:
        return self.sha256 or self.blob_id

    def as_json(self) -> dict[str, Any]:
        return {"size": self.size, "sha256": self.sha256, "blob_id": self.blob_id}


def free_bytes(folder: Path) -> int:
    return shutil.disk_usage(folder).free


def check_free_disk(folder: Path, needed: int, what: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    free = free_bytes(folder)
    if free < needed + FREE_DISK_MARGIN:
        raise RigllmError(f"not enough free disk for {what}: it needs {format_bytes(needed)} more "
                          f"(+{format_bytes(FREE_DISK_MARGIN)} spare), {folder} has {format_bytes(free)} free")


class _Sink:
    """The file object `http_get` writes to: hashes, reports progress and honours a cancel on every chunk."""

    def __init__(self, raw: BinaryIO, path: Path, expected: Expected, name: str, progress: ProgressFn | None,
                 cancel: threading.Event | None):
        self.raw, self.path, self.expected, self.name = raw, path, expected, name
        self.progress, self.cancel = progress, cancel
        self.hasher = hash_file(path, expected, raw.tell())
        self.done = raw.tell()
        self.started_at, self.started_bytes, self.reported_at = time.monotonic(), self.done, 0.0

    def write(self, data: bytes) -> int:
        if self.cancel is not None and self.cancel.is_set():
            raise DownloadCancelled(f"{self.name}: download cancelled at {format_bytes(self.done)}; pull again to resume")
        written = self.raw.write(data)
        self.hasher.update(data)
        self.done += len(data)
        now = time.monotonic()
        if self.progress is not None and now - self.reported_at >= REPORT_EVERY_S:
            self.reported_at = now
            self.progress(self.snapshot("downloading"))
        return written

    def snapshot(self, stage: str) -> Progress:
        elapsed = time.monotonic() - self.started_at
        rate = (self.done - self.started_bytes) / elapsed if elapsed > 0 else 0.0
        return Progress(self.name, self.done, self.expected.size, rate, stage)

    # http_get rewinds and truncates when a server ignores the Range header and sends the whole file again
    def tell(self) -> int:
        return self.raw.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.raw.seek(offset, whence)

    def truncate(self, size: int | None = None) -> int:
        self.raw.flush()
        end = self.raw.truncate(size)
        self.hasher, self.done = hash_file(self.path, self.expected, end), end
        self.started_bytes = end
        return end


class _NoBar:
    """A progress bar that draws nothing (progress goes to the caller's callback instead of tqdm)."""

    def __init__(self, **_kwargs: Any):
        pass

    def __enter__(self) -> "_NoBar":
        return self

    def __exit__(self, *_exc: Any) -> None:
        return None

    def update(self, _n: int) -> None:
        pass


def expected_of(repo: str, filename: str, revision: str, access: HubAccess) -> Expected:
    """Size and digest the Hub records for `repo/filename` at `revision` (`get_paths_info`)."""
    with hub_errors(access, repo, filename):
        infos = access.api().get_paths_info(repo, [filename], revision=revision)
    info = next((i for i in infos if isinstance(i, RepoFile) and i.path == filename), None)
    if info is None:
        raise RigllmError(f"{repo} has no file {filename} at {revision}")
    return Expected(int(info.size), info.lfs.sha256 if info.lfs else None, info.blob_id)


def hash_file(path: Path, expected: Expected, length: int | None = None) -> Any:
    """`expected`'s hasher fed with the first `length` bytes of `path` (all of it for None)."""
    hasher = expected.hasher()
    left = path.stat().st_size if length is None else length
    with open(path, "rb") as fh:
        while left > 0 and (block := fh.read(min(_HASH_READ, left))):
            hasher.update(block)
            left -= len(block)
    return hasher


def _part_matches(marker: Path, expected: Expected) -> bool:
    try:
        return json.loads(marker.read_text(encoding="utf-8")) == expected.as_json()
    except (OSError, ValueError):
        return False


def fetch_file(repo: str, filename: str, dest_dir: Path, access: HubAccess, revision: str = "main",
               progress: ProgressFn | None = None, cancel: threading.Event | None = None) -> Path:
    """Download `repo/filename` to `dest_dir/<its base name>`, resuming a part left by an earlier try."""
    expected = expected_of(repo, filename, revision, access)
    dest = dest_dir / filename.rsplit("/", 1)[-1]
    if dest.exists() and dest.stat().st_size == expected.size and hash_file(dest, expected).hexdigest() == expected.digest:
        return dest  # already here and intact (an mmproj another quant of the repository brought)
    part = dest.with_name(dest.name + PART_SUFFIX)
    marker = part.with_name(part.name + ".json")
    if part.exists() and (not _part_matches(marker, expected) or part.stat().st_size > expected.size):
        part.unlink()  # a part of another version of the file, or longer than the file: useless
    have = part.stat().st_size if part.exists() else 0
    check_free_disk(dest_dir, expected.size - have, filename)
    marker.write_text(json.dumps(expected.as_json()), encoding="utf-8")
    url = hf_hub_url(repo, filename, revision=revision, endpoint=access.url)
    constants.DOWNLOAD_CHUNK_SIZE = min(constants.DOWNLOAD_CHUNK_SIZE, CHUNK_BYTES)
    with hub_errors(access, repo, filename):
        meta = get_hf_file_metadata(url, token=access.bearer)
        if meta.size is not None and meta.size != expected.size:
            raise RigllmError(f"{filename}: the Hub lists {expected.size} bytes but serves {meta.size}")
        with open(part, "ab") as raw:
            sink = _Sink(raw, part, expected, filename, progress, cancel)
            http_get(meta.location, sink, resume_size=have, expected_size=expected.size,  # type: ignore[arg-type]
                     headers=build_hf_headers(token=access.bearer), tqdm_class=_NoBar)  # type: ignore[arg-type]
    got = sink.hasher.hexdigest()
    if got != expected.digest:
        part.unlink(missing_ok=True)
        marker.unlink(missing_ok=True)
        kind = "sha256" if expected.sha256 else "git blob id"
        raise ChecksumMismatch(f"{filename}: checksum mismatch ({kind} {got}, the Hub records {expected.digest}); "
                               "the download was deleted: pull it again")
    os.replace(part, dest)
    marker.unlink(missing_ok=True)
    if progress is not None:
        progress(sink.snapshot("verified"))
    return dest
