"""The device layouts of K-quant weights (cuda_src/kquant.cuh), in numpy: load-time repack and test oracles.

Q4_K and Q5_K keep ggml's own blocks: 144 and 176 bytes are multiples of 16, so with a 16-byte aligned
buffer every 16-byte load of a block is aligned, and the bytes on the card are the file's bytes. Q6_K's
210-byte block is not, so its rows are repacked into four arrays in one buffer: q4 [rows][K/2] (low 4
bits), qh [rows][K/4] (high 2 bits), sc int8 [rows][K/16], d fp16 [rows][K/256]; per 64-value unit u of
a row, q4 byte 32u + b holds the low bits of values 64u + b (low nibble) and 64u + 32 + b (high nibble),
qh byte 16u + b holds the high bits of values 64u + 16s + b in bits 2s..2s+1. Same byte count as the file.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from engine.gguf.kquant_blocks import BLOCK_BYTES, KQUANT_TYPES, QK_K

Q = GGMLQuantizationType


ROW_CHUNK_BLOCKS = 1 << 16  # Q6_K blocks repacked at a time (13.8 MB of input): host memory stays small


def device_layout(raw: np.ndarray, qtype: Q, rows: int, k: int) -> np.ndarray:
    """GGUF `qtype` bytes of a [rows, k] matrix → the flat uint8 buffer the kernels read."""
    if qtype not in KQUANT_TYPES:
        raise ValueError(f"not a K-quant type: {qtype.name}")
    if k % QK_K:
        raise ValueError(f"{qtype.name} rows must hold a multiple of {QK_K} values, not {k}")
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows * (k // QK_K), BLOCK_BYTES[qtype])
    if qtype != Q.Q6_K:
        return blocks.reshape(-1)
    n = blocks.shape[0]  # super-blocks, in row-major order: the four arrays are row-major too
    out = np.empty(n * BLOCK_BYTES[qtype], np.uint8)
    q4, qh4 = out[: 128 * n].reshape(n, 128), out[128 * n : 192 * n].reshape(n, 64)
    sc, d = out[192 * n : 208 * n].reshape(n, 16), out[208 * n :].reshape(n, 2)
    for first in range(0, n, ROW_CHUNK_BLOCKS):
        part = slice(first, min(n, first + ROW_CHUNK_BLOCKS))
        q4[part], qh4[part] = _q6_k_payload(blocks[part])
        sc[part], d[part] = blocks[part, 192:208], blocks[part, 208:210]
    return out


def _q6_k_payload(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(q4 [n][128], qh [n][64]) of n ggml Q6_K blocks in the device order (module docstring)."""
    n = b.shape[0]
    # value 128 h + 32 g + l of ggml's block has low bits in ql[64 h + 32 (g % 2) + l] >> 4 (g // 2) and
    # high bits in qh[32 h + l] >> 2 g
    qlh, qhh = b[:, :128].reshape(n, 2, 2, 32), b[:, 128:192].reshape(n, 2, 32)
    low = np.empty((n, 2, 4, 32), np.uint8)
    high = np.empty((n, 2, 4, 32), np.uint8)
    for g in range(4):
        low[:, :, g] = (qlh[:, :, g % 2] >> (4 * (g // 2))) & 15
        high[:, :, g] = (qhh >> (2 * g)) & 3
    low, high = low.reshape(n, 4, 64), high.reshape(n, 4, 64)  # [unit][64 values]
    q4 = low[:, :, :32] | (low[:, :, 32:] << 4)  # byte b: value b (low nibble), value 32 + b (high)
    hb = high.reshape(n, 4, 4, 16)  # [unit][s][b]: value 16 s + b
    qh4 = hb[:, :, 0] | (hb[:, :, 1] << 2) | (hb[:, :, 2] << 4) | (hb[:, :, 3] << 6)
    return q4.reshape(n, 128), qh4.reshape(n, 64)


def device_bytes(qtype: Q, rows: int, k: int) -> int:
    """Bytes of the device buffer of a [rows, k] `qtype` matrix (the file's bytes: no padding)."""
    return rows * (k // QK_K) * BLOCK_BYTES[qtype]


def dequantize_device(buf: np.ndarray, qtype: Q, rows: int, k: int) -> np.ndarray:
    """fp32 [rows, k] from a device buffer, computed as gguf-py's dequantize does (fp32, same operation
    order), so equal to `gguf.quants.dequantize` of the file bytes bit for bit; test oracle of the layout."""
    if qtype != Q.Q6_K:
        from gguf.quants import dequantize

        return dequantize(buf.reshape(rows, -1), qtype).reshape(rows, k)
    n = rows * k
    q4, qh4 = buf[: n // 2].reshape(-1, 32), buf[n // 2 : n // 2 + n // 4].reshape(-1, 16)
    sc = buf[n // 2 + n // 4 : n // 2 + n // 4 + n // 16].view(np.int8).astype(np.float32).reshape(-1, 4, 1)
    d = buf[n // 2 + n // 4 + n // 16 :].view(np.float16).astype(np.float32).reshape(-1, 1)
    low = np.concatenate([q4 & 15, q4 >> 4], axis=1)  # [unit][64]
    high = np.concatenate([(qh4 >> (2 * s)) & 3 for s in range(4)], axis=1)  # value 16 s + b at 16 s + b
    q = (low | (high << 4)).astype(np.int8) - np.int8(32)
    dsc = np.repeat(d, QK_K // 64, axis=0).reshape(-1, 1, 1) * sc  # the block's d for each of its 4 units
    return (dsc * q.reshape(-1, 4, 16).astype(np.float32)).reshape(rows, k)
