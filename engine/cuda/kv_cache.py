"""A layer's KV cache on a card in any KV format: the device planes, their sizes, and host copies of them.

Each side (K, V) of a layer is two planes of [n_head_kv][capacity] rows (cuda_src/kv_cache.cuh):
`codes` (row_bytes per row: fp16 values for the fp16 codec, int8 codes, packed 4-/3-bit codes) and
`side` (fp16 scales or block norms; absent for fp16). Their sizes add up to exactly
`KVCodec.vector_bytes(head_dim)` per row, so the memory planner's numbers are the allocations.
The bytes are the reference codecs' (`engine.reference.kv_quant.Encoded`), which is how tests fill a
cache from numpy and read one back.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.cuda.driver import CudaCard, DeviceBuffer
from engine.model.kv_formats import FP16, KVCodec, KVFormat
from engine.reference.kv_quant import Encoded, device_tables

F16_BYTES = 2


def side_blocks(codec: KVCodec, head_dim: int) -> int:
    """Side values (fp16) per row: one per block; 0 for fp16."""
    return 0 if codec.side_bytes == 0 else -(-head_dim // codec.block)


def code_row_bytes(codec: KVCodec, head_dim: int) -> int:
    """Bytes of one row's codes plane (the row's total minus its side data)."""
    return codec.vector_bytes(head_dim) - side_blocks(codec, head_dim) * codec.side_bytes


def domain_width(codec: KVCodec, head_dim: int) -> int:
    """Width of the attention domain: whole 128-blocks for rotated codecs, else the head width."""
    return -(-head_dim // codec.block) * codec.block if codec.rotated else head_dim


@dataclass
class KVSide:
    """One side's planes: codes [Hkv][capacity][row_bytes], side fp16 [Hkv][capacity][blocks] (None for fp16)."""

    codec: KVCodec
    codes: DeviceBuffer
    side: DeviceBuffer | None


@dataclass
class KVLayerCache:
    """Both sides of one attention layer's cache for `capacity` tokens."""

    format: KVFormat
    n_head_kv: int
    head_dim: int
    capacity: int
    k: KVSide
    v: KVSide

    def buffers(self) -> list[DeviceBuffer]:
        return [b for s in (self.k, self.v) for b in (s.codes, s.side) if b is not None]

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers())


def alloc_kv_layer(
    card: CudaCard, fmt: KVFormat, n_head_kv: int, head_dim: int, capacity: int, label: str
) -> KVLayerCache:
    """Allocate (not clear) both sides of one layer's cache."""

    def side(codec: KVCodec, name: str) -> KVSide:
        rows = n_head_kv * capacity
        codes = card.alloc(rows * code_row_bytes(codec, head_dim), f"{label}.{name}")
        blocks = side_blocks(codec, head_dim)
        return KVSide(codec, codes, card.alloc(rows * blocks * F16_BYTES, f"{label}.{name}_side") if blocks else None)

    return KVLayerCache(fmt, n_head_kv, head_dim, capacity, side(fmt.k, "k"), side(fmt.v, "v"))


def upload_kv_tables(card: CudaCard) -> DeviceBuffer:
    """The rotation signs and codebooks every quantised-KV kernel reads (once per card)."""
    return card.upload(device_tables(), "kv.tables")


def _code_dtype(codec: KVCodec) -> np.dtype:
    return np.dtype(np.float16) if codec == FP16 else np.dtype(np.int8) if codec.bits == 8 else np.dtype(np.uint8)


def upload_side_rows(side: KVSide, head_dim: int, capacity: int, enc: Encoded) -> None:
    """Write rows [0, S) of every head from reference-encoded rows (codes [S, Hkv, ...], side [S, Hkv, blocks])."""
    s, n_head_kv = enc.codes.shape[:2]
    codes = np.zeros((n_head_kv, capacity, code_row_bytes(side.codec, head_dim)), np.uint8)
    codes[:, :s] = np.ascontiguousarray(enc.codes.transpose(1, 0, 2)).astype(_code_dtype(side.codec)).view(np.uint8)
    side.codes.upload(codes)
    if side.side is not None:
        blocks = np.zeros((n_head_kv, capacity, side_blocks(side.codec, head_dim)), np.float16)
        blocks[:, :s] = enc.side.transpose(1, 0, 2)
        side.side.upload(blocks)


def download_side_rows(side: KVSide, n_head_kv: int, head_dim: int, capacity: int, rows: int) -> Encoded:
    """Rows [0, rows) of every head as reference `Encoded` arrays ([rows, Hkv, ...])."""
    row_bytes = code_row_bytes(side.codec, head_dim)
    raw = side.codes.download(np.uint8, (n_head_kv, capacity, row_bytes))[:, :rows]
    codes = np.ascontiguousarray(raw).view(_code_dtype(side.codec)).transpose(1, 0, 2)
    if side.side is None:
        return Encoded(codes.astype(np.float32), np.zeros((rows, n_head_kv, 0), np.float16))
    blocks = side.side.download(np.float16, (n_head_kv, capacity, side_blocks(side.codec, head_dim)))[:, :rows]
    return Encoded(codes, blocks.transpose(1, 0, 2))
