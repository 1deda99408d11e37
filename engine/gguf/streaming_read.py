"""Read a model file's tensors in bounded chunks without filling the page cache (issue 16, host-side loading).

A rig with 8 GB of RAM must load a 28 GB model. Reading through the memory map would leave every
page it touched in the page cache (and in the process's resident set) until the kernel evicts it,
pushing out everything else the host holds. Here the file is read with `preadv` into a small ring of
caller-visible buffers (plain bytearrays, or the uploader's pinned host arrays, so file → pinned
memory is one copy), and right behind each read `posix_fadvise(POSIX_FADV_DONTNEED)` tells the kernel
those pages are not wanted again. Memory use is the ring (`slots × chunk_bytes`) plus the kernel's
readahead window, whatever the file size.

O_DIRECT is not used: it demands 4 KiB-aligned buffers, offsets and lengths while GGUF tensors are
only 32-byte aligned, and it did not read faster (210 MB file on the dev VM's virtio disk, cache
dropped: 16 MiB O_DIRECT reads 1.33 GB/s, this reader 0.5-1.47 GB/s); with DONTNEED right behind the
read the cache stays bounded anyway.

Each yielded `TensorChunk` carries the measured disk rate and an ETA, which the loader combines with
the link rate in `load_eta` (disk and the cards' links work in parallel through the ring).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import ModelFileError
from engine.gguf.header import TensorInfo, map_file, parse_header

DEFAULT_CHUNK_BYTES = 16 << 20
DEFAULT_SLOTS = 2
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_SEQUENTIAL = getattr(os, "POSIX_FADV_SEQUENTIAL", 2)
_DONTNEED = getattr(os, "POSIX_FADV_DONTNEED", 4)


@dataclass(frozen=True)
class ReadProgress:
    """Bytes read so far of `total_bytes`, and the wall time it took."""

    done_bytes: int
    total_bytes: int
    elapsed_s: float

    @property
    def bytes_per_s(self) -> float:
        return self.done_bytes / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the rate measured so far; None before anything was read."""
        rate = self.bytes_per_s
        return (self.total_bytes - self.done_bytes) / rate if rate > 0 else None


@dataclass(frozen=True)
class TensorChunk:
    """`data` holds `tensor`'s bytes `[offset, offset + len(data))`.

    `data` is a view of a ring slot: it stays valid while the consumer holds at most `slots - 1`
    later chunks (copy it, or finish its upload, before asking for that many more).
    """

    tensor: TensorInfo
    offset: int
    data: memoryview
    progress: ReadProgress

    @property
    def last(self) -> bool:
        """True for the tensor's final chunk."""
        return self.offset + len(self.data) == self.tensor.n_bytes


def tensor_table(path: str | Path) -> list[TensorInfo]:
    """The file's tensors in file order, from its bounds-checked header; the map is closed again at once."""
    buf = map_file(Path(path))
    try:
        header = parse_header(buf, Path(path).name)
    finally:
        buf.close()
    return sorted(header.tensors.values(), key=lambda t: t.offset)


def _advise(fd: int, offset: int, length: int, advice: int) -> None:
    """posix_fadvise where the OS has it; it is advice, so a refusal (e.g. on a FUSE mount) is ignored."""
    if hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(fd, offset, length, advice)
        except OSError:
            pass


def drop_cached(path: str | Path, offset: int = 0, length: int = 0) -> None:
    """Ask the kernel to forget the file's clean cached pages (length 0: to the end), e.g. before timing a read."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _advise(fd, offset, length, _DONTNEED)
    finally:
        os.close(fd)


def cached_fraction(path: str | Path) -> float | None:
    """Share of the file's pages now in the page cache (Linux `mincore`); None where that cannot be asked.

    Tells whether a read speed was the disk's or the cache's, and lets tests see that reading left
    the cache empty.
    """
    size = Path(path).stat().st_size
    if size == 0:
        return 0.0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        mmap_fn, mincore, munmap = libc.mmap, libc.mincore, libc.munmap
    except (OSError, AttributeError):
        return None
    mmap_fn.restype = ctypes.c_void_p
    mmap_fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        addr = mmap_fn(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return None
        try:
            pages = -(-size // PAGE_BYTES)
            vec = (ctypes.c_ubyte * pages)()
            if mincore(addr, size, vec) != 0:
                return None
            return sum(b & 1 for b in bytes(vec)) / pages
        finally:
            munmap(addr, size)
    finally:
        os.close(fd)


class StreamingReader:
    """Bounded sequential reads of one GGUF's tensor data.

    `buffers` replaces the default ring of `slots` bytearrays of `chunk_bytes` with the caller's own
    writable buffers (e.g. pinned host arrays); the chunk size is then the smallest buffer's size.
    """

    def __init__(
        self,
        path: str | Path,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        slots: int = DEFAULT_SLOTS,
        buffers: Sequence[Any] | None = None,
        drop_cache: bool = True,
    ):
        self.path = Path(path)
        self.tensors = tensor_table(self.path)
        self.drop_cache = drop_cache
        if buffers is None:
            if chunk_bytes < 1 or slots < 1:
                raise ValueError("chunk_bytes and slots must be at least 1")
            buffers = [bytearray(chunk_bytes) for _ in range(slots)]
        self._ring = [memoryview(b).cast("B") for b in buffers]
        if not self._ring or any(v.readonly for v in self._ring):
            raise ValueError("the ring needs at least one writable buffer")
        self.chunk_bytes = min(len(v) for v in self._ring)
        if self.chunk_bytes < 1:
            raise ValueError("ring buffers must not be empty")

    def total_bytes(self, names: Iterable[str] | None = None) -> int:
        return sum(t.n_bytes for t in self._selected(names))

    def _selected(self, names: Iterable[str] | None) -> list[TensorInfo]:
        if names is None:
            return self.tensors
        wanted = set(names)
        unknown = wanted - {t.name for t in self.tensors}
        if unknown:
            raise ModelFileError(f"{self.path.name}: no tensor named {', '.join(sorted(unknown))}")
        return [t for t in self.tensors if t.name in wanted]

    def chunks(self, names: Iterable[str] | None = None) -> Iterator[TensorChunk]:
        """Every selected tensor (all by default) in file order, in chunks of at most `chunk_bytes`."""
        selected = self._selected(names)
        total = sum(t.n_bytes for t in selected)
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as err:
            raise ModelFileError(f"{self.path.name}: cannot read file ({err.strerror or err})") from None
        try:
            _advise(fd, 0, 0, _SEQUENTIAL)
            start = time.perf_counter()
            done = 0
            slot = 0
            dropped_to = 0  # page-aligned offset below which the cache was released (reads only move forward)
            for tensor in selected:
                pos = 0
                while pos < tensor.n_bytes:
                    n = min(self.chunk_bytes, tensor.n_bytes - pos)
                    view = self._ring[slot][:n]
                    self._read_exactly(fd, view, tensor.offset + pos)
                    end = tensor.offset + pos + n
                    if self.drop_cache:
                        # Only whole pages are released; the partial page at `end` goes with the next chunk.
                        aligned_end = end // PAGE_BYTES * PAGE_BYTES
                        if aligned_end > dropped_to:
                            _advise(fd, dropped_to, aligned_end - dropped_to, _DONTNEED)
                            dropped_to = aligned_end
                    done += n
                    progress = ReadProgress(done, total, time.perf_counter() - start)
                    yield TensorChunk(tensor, pos, view, progress)
                    pos += n
                    slot = (slot + 1) % len(self._ring)
            if self.drop_cache and selected:
                _advise(fd, 0, 0, _DONTNEED)  # the partial pages left at the edges
        finally:
            os.close(fd)

    def _read_exactly(self, fd: int, view: memoryview, offset: int) -> None:
        got = 0
        while got < len(view):
            try:
                n = os.preadv(fd, [view[got:]], offset + got)
            except OSError as err:
                where = f"{self.path.name}: read failed at byte {offset + got}"
                raise ModelFileError(f"{where} ({err.strerror or err})") from None
            if n == 0:
                raise ModelFileError(
                    f"{self.path.name}: file ended at byte {offset + got}; it was truncated while loading")
            got += n


def load_eta(total_bytes: int, card_bytes: Sequence[int], disk_bytes_per_s: float, link_bytes_per_s: float) -> float:
    """Seconds to load: the ring overlaps disk reads with the cards' uploads, so the slower stage sets the pace.

    The disk carries every byte once; each card's link carries only its share, and the cards upload in
    parallel, so the link stage lasts as long as the most loaded card needs.
    """
    if disk_bytes_per_s <= 0 or link_bytes_per_s <= 0:
        raise ValueError("rates must be positive")
    link_s = max(card_bytes, default=0) / link_bytes_per_s
    return max(total_bytes / disk_bytes_per_s, link_s)
