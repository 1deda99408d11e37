"""Write a GGUF whose tensors are produced one at a time, each in row chunks, so RAM stays small.

`GGUFWriter.add_tensor` keeps every tensor in memory until the end; for a 9 GB synthetic model or a
27B conversion that is not an option. Here all tensor infos (name, shape, type) are declared first,
the header, KV data and tensor infos are written with GGUFWriter, and the data section is then
filled tensor by tensor, in declaration order, from any number of chunks per tensor. The byte
layout (32-byte aligned data, zero padding) is GGUFWriter's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

from engine.gguf.tensor_types import tensor_nbytes


@dataclass(frozen=True)
class PlannedTensor:
    """A tensor to be written: GGUF name, numpy-order logical shape, stored ggml type."""

    name: str
    shape: tuple[int, ...]
    qtype: GGMLQuantizationType

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.shape, self.qtype)

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


class TensorStream:
    """Declare tensors, write the metadata, then stream each tensor's bytes in order."""

    def __init__(self, writer: GGUFWriter, planned: list[PlannedTensor]):
        self._writer = writer
        self._planned = list(planned)
        self._next = 0
        for t in self._planned:
            writer.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=t.qtype)

    def write_metadata(self) -> None:
        """Header, key/values and tensor infos; call after every key has been added to the writer."""
        self._writer.write_header_to_file()
        self._writer.write_kv_data_to_file()
        self._writer.write_ti_data_to_file()

    def write_tensor(self, name: str, chunks: Iterable[np.ndarray]) -> None:
        """Write the next declared tensor from its encoded chunks (rows in order, already in stored form)."""
        if self._next >= len(self._planned):
            raise ValueError(f"tensor '{name}' was not declared")
        planned = self._planned[self._next]
        if planned.name != name:
            raise ValueError(f"expected tensor '{planned.name}' next, got '{name}'")
        fout = self._writer.fout[0]  # type: ignore[index]
        self._writer.write_padding(fout, fout.tell())
        written = 0
        for chunk in chunks:
            data = np.ascontiguousarray(chunk)
            data.tofile(fout)
            written += data.nbytes
        if written != planned.nbytes:
            raise ValueError(f"tensor '{name}': wrote {written} bytes, expected {planned.nbytes}")
        self._writer.write_padding(fout, written)
        self._next += 1

    def close(self) -> None:
        """Flush and close; every declared tensor must have been written."""
        if self._next != len(self._planned):
            missing = self._planned[self._next].name
            raise ValueError(f"{len(self._planned) - self._next} tensors not written (next: '{missing}')")
        self._writer.close()
