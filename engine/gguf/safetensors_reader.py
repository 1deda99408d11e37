"""Read an HF checkpoint's `*.safetensors` memory-mapped with plain numpy (no torch, no safetensors package).

The format is an 8-byte little-endian header length, a JSON header (`name → {dtype, shape,
data_offsets}` plus an optional `__metadata__`), then the raw little-endian data. Tensors are
sliced out of one read-only map per file, optionally a row range at a time, and each range is
released from the process's resident set once copied, so converting a 27B checkpoint never holds
more than one tensor (or one row chunk) in RAM. BF16 becomes float32 exactly (the 16 bits are the
top half of a float32); F16 and F32 are returned as stored, as llama.cpp's converter keeps them.

Order matters because the converter writes tensors in the order it reads them: part files sorted
by name (from the index's weight map when there is one), and tensor names sorted within each file,
as llama.cpp's converter does.
"""

from __future__ import annotations

import json
import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from engine.errors import ModelFileError

INDEX_FILE = "model.safetensors.index.json"
_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}
_MAX_HEADER = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lives: file, absolute byte offset, dtype name and shape."""

    name: str
    file: Path
    offset: int
    dtype: str
    shape: tuple[int, ...]

    @property
    def n_rows(self) -> int:
        return self.shape[0] if self.shape else 1


class SafetensorsCheckpoint:
    """All tensors of an HF folder, in llama.cpp's reading order; use as a context manager to unmap."""

    def __init__(self, hf_dir: str | Path):
        self.hf_dir = Path(hf_dir)
        self.entries: dict[str, TensorEntry] = {}
        for part in part_files(self.hf_dir):
            for entry in read_header(part):
                self.entries.setdefault(entry.name, entry)
        self._maps: dict[Path, mmap.mmap] = {}

    def __enter__(self) -> "SafetensorsCheckpoint":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for m in self._maps.values():
            m.close()
        self._maps.clear()

    def names(self) -> list[str]:
        return list(self.entries)

    def read(self, name: str, row_start: int = 0, row_stop: int | None = None) -> np.ndarray:
        """Rows `[row_start, row_stop)` of a tensor (all of it by default): F32/F16 as stored, BF16 as float32."""
        entry = self.entries[name]
        stop = entry.n_rows if row_stop is None else row_stop
        row_shape = entry.shape[1:]
        row_elems = int(np.prod(row_shape, dtype=np.int64))
        raw_dtype = _DTYPES[entry.dtype]
        start_byte = entry.offset + row_start * row_elems * raw_dtype.itemsize
        count = (stop - row_start) * row_elems
        buf = self._map(entry.file)
        raw = np.frombuffer(buf, dtype=raw_dtype, count=count, offset=start_byte)
        shape = ((stop - row_start),) + row_shape if entry.shape else ()
        if entry.dtype == "BF16":
            values = (raw.astype(np.uint32) << 16).view(np.float32).reshape(shape)
        else:
            values = raw.reshape(shape).copy()
        del raw
        release_pages(buf, start_byte, count * raw_dtype.itemsize)
        return values

    def iter_tensors(self) -> Iterator[tuple[str, np.ndarray]]:
        """(name, array) for every tensor, one at a time, in reading order."""
        for name in self.entries:
            yield name, self.read(name)

    def _map(self, file: Path) -> mmap.mmap:
        if file not in self._maps:
            with open(file, "rb") as fh:
                self._maps[file] = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        return self._maps[file]


def release_pages(buf: mmap.mmap, start: int, length: int) -> None:
    """Drop a range we have copied out of the map from this process's resident set.

    Mapped file pages count as resident until unmapped, so without this a 27B conversion would
    "use" the whole checkpoint's size in RSS by the end; the pages stay in the OS file cache.
    """
    if length <= 0 or not hasattr(mmap, "MADV_DONTNEED"):
        return
    first = start - start % mmap.PAGESIZE
    buf.madvise(mmap.MADV_DONTNEED, first, start + length - first)


def part_files(hf_dir: Path) -> list[Path]:
    """The checkpoint's safetensors files, sorted by name (the index's weight map decides when present)."""
    if not hf_dir.is_dir():
        raise ModelFileError(f"{hf_dir}: not a folder")
    index = hf_dir / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (ValueError, KeyError, TypeError) as err:
            raise ModelFileError(f"{index}: unreadable weight map ({err})") from None
        names = sorted(set(weight_map.values()))
    else:
        names = sorted(p.name for p in hf_dir.iterdir() if p.name.startswith("model") and p.name.endswith(".safetensors"))
    if not names:
        raise ModelFileError(f"{hf_dir}: no model*.safetensors files")
    files = [hf_dir / n for n in names]
    for f in files:
        if not f.is_file():
            raise ModelFileError(f"{hf_dir}: missing checkpoint part {f.name}")
    return files


def read_header(file: Path) -> list[TensorEntry]:
    """The tensors of one safetensors file, sorted by name, each checked to lie inside the file."""
    size = file.stat().st_size
    with open(file, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise ModelFileError(f"{file.name}: not a safetensors file (too short)")
        header_len = int.from_bytes(head, "little")
        if header_len > min(size - 8, _MAX_HEADER):
            raise ModelFileError(f"{file.name}: corrupt safetensors header length {header_len}")
        try:
            header = json.loads(fh.read(header_len))
        except ValueError as err:
            raise ModelFileError(f"{file.name}: corrupt safetensors header ({err})") from None
    data_start = 8 + header_len
    entries = []
    for name, meta in sorted(header.items()):
        if name == "__metadata__":
            continue
        dtype, shape = meta.get("dtype"), tuple(int(d) for d in meta.get("shape", ()))
        if dtype not in _DTYPES:
            raise ModelFileError(f"{file.name}: tensor '{name}' has dtype {dtype}; only F32, F16 and BF16 are supported")
        begin, end = (int(x) for x in meta["data_offsets"])
        expected = int(np.prod(shape, dtype=np.int64)) * _DTYPES[dtype].itemsize
        if end - begin != expected or data_start + end > size or begin < 0:
            raise ModelFileError(f"{file.name}: tensor '{name}' extends outside the file or has the wrong size")
        entries.append(TensorEntry(name, file, data_start + begin, dtype, shape))
    return entries
