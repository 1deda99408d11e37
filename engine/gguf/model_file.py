"""Open a GGUF memory-mapped and give typed access to its metadata and tensors.

The file is never read whole: it is mapped, its header is parsed defensively (`engine.gguf.header`)
and tensors are sliced out of the map on demand. `ModelFile.tensor()` returns float32 numpy arrays in
numpy (torch) order, i.e. the GGUF `ne` order reversed: a matmul weight comes back as
`[out_features, in_features]`.
"""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quant_shape_to_byte_shape

from engine.errors import ModelFileError
from engine.gguf.header import TensorInfo, map_file, parse_header, show
from engine.gguf.streaming_read import drop_cached

__all__ = ["SUPPORTED_ADVICE", "SUPPORTED_TEXT", "SUPPORTED_TYPES", "ModelFile", "TensorInfo"]

SUPPORTED_TYPES = {
    GGMLQuantizationType.F32,
    GGMLQuantizationType.F16,
    GGMLQuantizationType.BF16,
    GGMLQuantizationType.Q8_0,
    GGMLQuantizationType.Q4_K,
    GGMLQuantizationType.Q5_K,
    GGMLQuantizationType.Q6_K,
}
SUPPORTED_TEXT = "Q8_0, Q6_K, Q5_K, Q4_K, F16, BF16, F32"
# What to tell the owner of a file with another type: the types the GPU kernels run, by their usual file names.
SUPPORTED_ADVICE = "use a Q8_0, Q6_K, Q5_K_M or Q4_K_M GGUF of this model"

# Types `raw()` returns as typed arrays; every other type comes back as bytes, rows of ne[0]'s blocks.
_PLAIN_DTYPES = {
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


class ModelFile:
    """A memory-mapped GGUF: `fields` (decoded key/values), `tensors` (TensorInfo by name), tensor data."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._map = map_file(self.path)
        header = parse_header(self._map, self.path.name)
        self.version = header.version
        self.fields: dict[str, Any] = header.fields
        self.tensors: dict[str, TensorInfo] = header.tensors

    @property
    def architecture(self) -> str | None:
        return self.fields.get("general.architecture")

    def has(self, name: str) -> bool:
        return name in self.tensors

    def raw(self, name: str) -> np.ndarray:
        """The tensor's stored values as a read-only view of the map (no copy, no dequantization).

        F32/F16 (and integer/F64) tensors come back typed in numpy order; quantized and BF16 tensors as
        uint8 rows of their blocks (the layout `gguf.quants.dequantize` takes).
        """
        info = self._info(name)
        dtype = _PLAIN_DTYPES.get(info.ggml_type)
        if dtype is None:
            flat = np.frombuffer(self._map, dtype=np.uint8, count=info.n_bytes, offset=info.offset)
            return flat.reshape(quant_shape_to_byte_shape(info.numpy_shape, info.ggml_type))
        return np.frombuffer(self._map, dtype=dtype, count=info.n_elements, offset=info.offset).reshape(
            info.numpy_shape
        )

    def tensor(self, name: str) -> np.ndarray:
        """The tensor dequantized to float32, numpy order (`ne` reversed)."""
        info = self._info(name)
        if info.ggml_type not in SUPPORTED_TYPES:
            raise ModelFileError(
                f"{self.path.name}: tensor {show(name)} has type {info.ggml_type.name}, which rigllm does not support "
                f"(supported: {SUPPORTED_TEXT}); {SUPPORTED_ADVICE}"
            )
        values = dequantize(self.raw(name), info.ggml_type)
        return np.ascontiguousarray(values.reshape(info.numpy_shape), dtype=np.float32)

    def release(self, name: str) -> None:
        """Drop the tensor's pages from this process and from the page cache once it has been copied
        elsewhere (to a card): loading a model bigger than host RAM must not fill the cache (rigs often
        have 8 GB). The kernel keeps the pages a neighbouring tensor shares (at most two per tensor)."""
        info = self._info(name)
        start = info.offset - info.offset % mmap.PAGESIZE
        length = info.offset + info.n_bytes - start
        if hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED, start, min(length, len(self._map) - start))
        drop_cached(self.path, start, length)

    def _info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise ModelFileError(f"{self.path.name}: missing tensor {show(name)}") from None
