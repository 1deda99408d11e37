"""Open a GGUF memory-mapped and give typed access to its metadata and tensors.

The file is never read whole: `gguf.GGUFReader` maps it and tensors are sliced out of the map on
demand. `ModelFile.tensor()` returns float32 numpy arrays in numpy (torch) order, i.e. the GGUF
`ne` order reversed: a matmul weight comes back as `[out_features, in_features]`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from engine.errors import ModelFileError

SUPPORTED_TYPES = {
    GGMLQuantizationType.F32,
    GGMLQuantizationType.F16,
    GGMLQuantizationType.BF16,
    GGMLQuantizationType.Q8_0,
}


@dataclass(frozen=True)
class TensorInfo:
    """A tensor's name, GGUF `ne` shape (fastest dimension first), ggml type and byte size."""

    name: str
    ne: tuple[int, ...]
    ggml_type: GGMLQuantizationType
    n_bytes: int

    @property
    def numpy_shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.ne))

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.ne, dtype=np.int64))


class ModelFile:
    """A memory-mapped GGUF: `fields` (decoded key/values), `tensors` (TensorInfo by name), tensor data."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._reader = open_reader(self.path)
        self.fields: dict[str, Any] = decode_fields(self._reader)
        self._tensors = {t.name: t for t in self._reader.tensors}
        self.tensors: dict[str, TensorInfo] = {
            t.name: TensorInfo(t.name, tuple(int(x) for x in t.shape), GGMLQuantizationType(t.tensor_type), int(t.n_bytes))
            for t in self._reader.tensors
        }

    @property
    def architecture(self) -> str | None:
        return self.fields.get("general.architecture")

    def has(self, name: str) -> bool:
        return name in self._tensors

    def raw(self, name: str) -> np.ndarray:
        """The tensor's stored bytes/values as the memory map gives them (no copy, no dequantization)."""
        return self._reader_tensor(name).data

    def tensor(self, name: str) -> np.ndarray:
        """The tensor dequantized to float32, numpy order (`ne` reversed)."""
        info = self.tensors.get(name)
        if info is None:
            raise ModelFileError(f"{self.path.name}: missing tensor '{name}'")
        if info.ggml_type not in SUPPORTED_TYPES:
            raise ModelFileError(
                f"{self.path.name}: tensor '{name}' has type {info.ggml_type.name}, which rigllm does not support "
                "(supported: Q8_0, F16, BF16, F32); use a Q8_0 GGUF"
            )
        data = self._reader_tensor(name).data
        try:
            values = dequantize(np.asarray(data), info.ggml_type)
        except (ValueError, TypeError) as err:
            raise ModelFileError(f"{self.path.name}: tensor '{name}' cannot be decoded: {err}") from None
        return np.ascontiguousarray(values.reshape(info.numpy_shape), dtype=np.float32)

    def _reader_tensor(self, name: str):
        try:
            return self._tensors[name]
        except KeyError:
            raise ModelFileError(f"{self.path.name}: missing tensor '{name}'") from None


def open_reader(path: Path) -> GGUFReader:
    """Open with `GGUFReader`, turning every way a file can be broken into one clear ModelFileError."""
    if not path.exists():
        raise ModelFileError(f"{path}: no such file")
    if path.is_dir():
        raise ModelFileError(f"{path}: is a folder, not a GGUF file")
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise ModelFileError(f"{path.name}: not a GGUF file (bad magic {magic!r})")
    try:
        return GGUFReader(path, "r")
    except Exception as err:  # the gguf package raises many types on corrupt input
        raise ModelFileError(f"{path.name}: corrupt or truncated GGUF ({type(err).__name__}: {err})") from None


def decode_fields(reader: GGUFReader) -> dict[str, Any]:
    """All key/values as plain Python values (str, int, float, bool, lists of those)."""
    out: dict[str, Any] = {}
    for name, fld in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        try:
            out[name] = fld.contents()
        except Exception as err:
            raise ModelFileError(f"corrupt GGUF key '{name}' ({type(err).__name__})") from None
    return out
