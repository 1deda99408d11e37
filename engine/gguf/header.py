"""Parse a GGUF header defensively: nothing read from the file is trusted before it is bounded.

`gguf.GGUFReader` believes the counts it reads: a flipped byte in an array length makes it loop for
hours building empty numpy views, and a bad string length silently yields a short string. Model files
are user input, so this parser checks every count, string length and tensor extent against the bytes
that are actually left in the file *before* allocating or looping, and turns every way a header can be
broken into one `ModelFileError` line that names the file. It also decodes the 250k-entry token and
merge arrays several times faster than `GGUFReader`, which matters for every tokenizer load.

Layout (GGUF v2/v3, little-endian): magic `GGUF`, u32 version, u64 tensor count, u64 key/value count,
the key/values, the tensor infos (name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset), padding
to `general.alignment` (default 32), then the tensor data; each offset is relative to that data start.
"""

from __future__ import annotations

import math
import mmap
import reprlib
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from engine.errors import ModelFileError

SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME_BYTES = 1 << 16  # generous: real keys and tensor names are < 100 bytes

# Smallest encodings, used to bound declared counts by the bytes left: a key/value is at least a
# length (8) + a type (4) + a one-byte value; a tensor info at least name length + n_dims + type + offset.
_MIN_KV_BYTES = 13
_MIN_TENSOR_INFO_BYTES = 24

_SCALAR_FORMATS: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<B",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}


class HeaderPrefixShort(ModelFileError):
    """The header runs past the bytes given so far of a longer file (a partial read of a remote file):
    read more of the file and parse again."""


@dataclass(frozen=True)
class TensorInfo:
    """A tensor's name, GGUF `ne` shape (fastest dimension first), ggml type, byte size and absolute offset."""

    name: str
    ne: tuple[int, ...]
    ggml_type: GGMLQuantizationType
    n_bytes: int
    offset: int  # absolute byte offset of the data in the file

    @property
    def numpy_shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.ne))

    @property
    def n_elements(self) -> int:
        return math.prod(self.ne)


@dataclass(frozen=True)
class GGUFHeader:
    """Everything before the tensor data, decoded and bounds-checked."""

    version: int
    fields: dict[str, Any]  # key -> str | int | float | bool | list of those
    tensors: dict[str, TensorInfo]  # in file order


_SHOW = reprlib.Repr()  # keyword arguments need Python 3.12
_SHOW.maxstring = _SHOW.maxother = 80
_SHOW.maxlist = 6


def show(value: Any) -> str:
    """A file-provided value made safe for a one-line message: a repr (strings quoted and escaped), shortened."""
    return _SHOW.repr(value)


def map_file(path: Path) -> mmap.mmap:
    """Memory-map `path` read-only after the checks that need no parsing (exists, a file, not empty, magic)."""
    if not path.exists():
        raise ModelFileError(f"{path}: no such file")
    if path.is_dir():
        raise ModelFileError(f"{path}: is a folder, not a GGUF file")
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
            if magic != b"GGUF":
                raise ModelFileError(f"{path.name}: not a GGUF file (bad magic {magic!r})")
            return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as err:
        raise ModelFileError(f"{path.name}: cannot read file ({err.strerror or err})") from None


class _Cursor:
    """A read position in the mapped file; every read checks the bytes left first."""

    def __init__(self, buf: mmap.mmap | bytes, label: str, file_size: int | None = None):
        self.buf = buf
        self.size = len(buf)  # the bytes at hand
        self.file_size = self.size if file_size is None else file_size  # the whole file's, when buf is a prefix
        self.pos = 0
        self.label = label

    def fail(self, problem: str) -> ModelFileError:
        return ModelFileError(f"{self.label}: {problem}")

    def left(self) -> int:
        return self.file_size - self.pos

    def need(self, n: int, what: str) -> None:
        if n > self.left():
            raise self.fail(
                f"truncated or corrupt GGUF: {what} needs {n} bytes at offset {self.pos}, file has {self.left()} left"
            )
        self._more_or_fail(self.pos + n)

    def _more_or_fail(self, end: int) -> None:
        """Raise HeaderPrefixShort when `end` lies past the bytes at hand but inside the file."""
        if self.size < end <= self.file_size:
            raise HeaderPrefixShort(f"{self.label}: the header goes on past the first {self.size} bytes")

    def unpack(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return value

    def string(self, what: str, limit: int | None = None) -> str:
        n = self.unpack("<Q", what)
        if limit is not None and n > limit:
            raise self.fail(f"corrupt GGUF: {what} is {n} bytes long (limit {limit})")
        self.need(n, what)
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"corrupt GGUF: {what} at offset {self.pos - n} is not UTF-8") from None

    def value_type(self, what: str) -> GGUFValueType:
        raw = self.unpack("<I", what)
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise self.fail(f"corrupt GGUF: {what} has unknown value type {raw}") from None

    def value(self, vtype: GGUFValueType, key: str) -> Any:
        if vtype == GGUFValueType.STRING:
            return self.string(f"value of key {show(key)}")
        if vtype == GGUFValueType.ARRAY:
            return self.array(key)
        value = self.unpack(_SCALAR_FORMATS[vtype], f"value of key {show(key)}")
        return bool(value) if vtype == GGUFValueType.BOOL else value

    def array(self, key: str) -> list[Any]:
        what = f"array {show(key)}"
        itype = self.value_type(f"{what} item type")
        count = self.unpack("<Q", f"{what} length")
        if itype == GGUFValueType.ARRAY:
            raise self.fail(f"unsupported GGUF: {what} is an array of arrays")
        if itype == GGUFValueType.STRING:
            self.need(8 * count, f"{what} of {count} strings")  # each string has at least its length
            return self._strings(count, what)
        dtype = np.dtype(_SCALAR_FORMATS[itype])
        self.need(dtype.itemsize * count, f"{what} of {count} items")
        values = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos)
        self.pos += dtype.itemsize * count
        return (values != 0).tolist() if itype == GGUFValueType.BOOL else values.tolist()

    def _strings(self, count: int, what: str) -> list[str]:
        # Hot loop for vocabularies (~500k strings): locals instead of method calls.
        buf, pos, size, unpack_from = self.buf, self.pos, self.size, struct.unpack_from
        out: list[str] = []
        append = out.append
        try:
            for _ in range(count):
                if pos + 8 > size:
                    self._more_or_fail(pos + 8)
                    raise self.fail(f"truncated or corrupt GGUF: {what} runs past the end of the file")
                (n,) = unpack_from("<Q", buf, pos)
                end = pos + 8 + n
                if end > size:
                    self._more_or_fail(end)
                    raise self.fail(
                        f"truncated or corrupt GGUF: {what} has a string of {n} bytes at offset {pos}, past the end of the file"
                    )
                append(buf[pos + 8 : end].decode("utf-8"))
                pos = end
        except UnicodeDecodeError:
            raise self.fail(f"corrupt GGUF: {what} has a string at offset {pos} that is not UTF-8") from None
        self.pos = pos
        return out


def parse_header(buf: mmap.mmap | bytes, label: str, file_size: int | None = None) -> GGUFHeader:
    """Decode and bounds-check the header of a mapped GGUF; `label` (the file name) prefixes every error.

    `buf` may be only the first bytes of a `file_size`-byte file (a ranged read of a remote file): tensor
    extents are then checked against `file_size`, and a header longer than `buf` raises HeaderPrefixShort.
    """
    cur = _Cursor(buf, label, file_size)
    cur.need(24, "the GGUF header")
    cur.pos = 4  # magic checked by map_file
    version = cur.unpack("<I", "version")
    if version & 0xFFFF == 0 and version != 0:
        raise cur.fail("big-endian GGUF files are not supported")
    if version not in SUPPORTED_VERSIONS:
        raise cur.fail(f"unsupported GGUF version {version} (supported: 2, 3)")
    n_tensors = cur.unpack("<Q", "tensor count")
    n_kv = cur.unpack("<Q", "key/value count")
    if n_kv * _MIN_KV_BYTES > cur.left():
        raise cur.fail(f"corrupt or truncated GGUF: header declares {n_kv} keys, more than the file can hold")
    if n_tensors * _MIN_TENSOR_INFO_BYTES > cur.left():
        raise cur.fail(f"corrupt or truncated GGUF: header declares {n_tensors} tensors, more than the file can hold")

    fields: dict[str, Any] = {}
    for index in range(n_kv):
        key = cur.string(f"key #{index}", MAX_NAME_BYTES)
        if key in fields:
            raise cur.fail(f"corrupt GGUF: duplicate key {show(key)}")
        fields[key] = cur.value(cur.value_type(f"type of key {show(key)}"), key)

    infos = [_tensor_info(cur, index) for index in range(n_tensors)]
    alignment = fields.get("general.alignment", DEFAULT_ALIGNMENT)
    if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
        raise cur.fail(f"corrupt GGUF: general.alignment {alignment!r} is not a power of two")
    data_offset = -(-cur.pos // alignment) * alignment

    tensors: dict[str, TensorInfo] = {}
    for name, ne, ggml_type, rel_offset in infos:
        if name in tensors:
            raise cur.fail(f"corrupt GGUF: duplicate tensor {show(name)}")
        tensors[name] = _place(cur, name, ne, ggml_type, rel_offset, data_offset, alignment)
    return GGUFHeader(version, fields, tensors)


def _tensor_info(cur: _Cursor, index: int) -> tuple[str, tuple[int, ...], GGMLQuantizationType, int]:
    name = cur.string(f"name of tensor #{index}", MAX_NAME_BYTES)
    n_dims = cur.unpack("<I", f"dimension count of tensor {show(name)}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise cur.fail(f"corrupt GGUF: tensor {show(name)} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
    cur.need(8 * n_dims, f"shape of tensor {show(name)}")
    ne = struct.unpack_from(f"<{n_dims}Q", cur.buf, cur.pos)
    cur.pos += 8 * n_dims
    raw_type = cur.unpack("<I", f"type of tensor {show(name)}")
    try:
        ggml_type = GGMLQuantizationType(raw_type)
    except ValueError:
        raise cur.fail(f"corrupt GGUF: tensor {show(name)} has unknown ggml type id {raw_type}") from None
    if ggml_type not in GGML_QUANT_SIZES:
        raise cur.fail(f"corrupt GGUF: tensor {show(name)} has unknown ggml type {ggml_type.name}")
    offset = cur.unpack("<Q", f"offset of tensor {show(name)}")
    return name, tuple(int(d) for d in ne), ggml_type, offset


def _place(
    cur: _Cursor,
    name: str,
    ne: tuple[int, ...],
    ggml_type: GGMLQuantizationType,
    rel_offset: int,
    data_offset: int,
    alignment: int,
) -> TensorInfo:
    """Size a tensor from its shape and type and check that it lies inside the file."""
    if min(ne) < 1:
        raise cur.fail(f"corrupt GGUF: tensor {show(name)} has shape {list(ne)} with an empty dimension")
    block, type_size = GGML_QUANT_SIZES[ggml_type]
    if ne[0] % block:
        raise cur.fail(
            f"corrupt GGUF: tensor {show(name)} has ne[0] = {ne[0]}, not a multiple of the {ggml_type.name} block size {block}"
        )
    n_bytes = math.prod(ne) // block * type_size
    if rel_offset % alignment:
        raise cur.fail(
            f"corrupt GGUF: tensor {show(name)} has offset {rel_offset}, not a multiple of the alignment {alignment}"
        )
    start = data_offset + rel_offset
    if start + n_bytes > cur.file_size:
        raise cur.fail(
            f"truncated or corrupt GGUF: tensor {show(name)} needs bytes {start}..{start + n_bytes}, "
            f"the file has {cur.file_size}"
        )
    return TensorInfo(name, ne, ggml_type, n_bytes, start)
