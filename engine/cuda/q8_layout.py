"""The device layouts of Q8_0 weights and Q8_1 activations, in numpy (load-time repack and test oracles).

GGUF stores Q8_0 as 34-byte blocks (fp16 scale, then 32 int8), whose int8 payload is only 2-byte aligned.
On the device the weights are a structure of arrays instead (anchor-qengine.md §7.6): `qs` int8 [rows][K],
so every row is 16-byte aligned for vector loads, and `d` fp16 [rows][K/32]. Same bytes as GGUF, no padding.
Each qs row is uploaded row-major and permuted on the card into the blocked payload (`block_q8_payload` is its
oracle; cuda_src/q8_blocked.cuh the device side). Activations quantized for the DP4A kernels are `xq` int8 [T][K]
(natural order) and `xd` fp32 [T][K/32], computed exactly as `cuda_src/quantize.cu` does (see `quantize_q8_1`).
"""

from __future__ import annotations

import numpy as np

QK = 32  # values per quantization block
Q8_0_BLOCK_BYTES = 34


def split_q8_0(raw: np.ndarray, rows: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """GGUF Q8_0 bytes of a [rows, k] matrix → (qs int8 [rows, k], d float16 [rows, k/32])."""
    if k % QK:
        raise ValueError(f"Q8_0 rows must hold a multiple of {QK} values, not {k}")
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, k // QK, Q8_0_BLOCK_BYTES)
    d = np.ascontiguousarray(blocks[:, :, :2]).view(np.float16).reshape(rows, k // QK)
    qs = np.ascontiguousarray(blocks[:, :, 2:]).view(np.int8).reshape(rows, k)
    return qs, d


CHUNK_BLOCKS = 32  # blocks per chunk of the blocked payload (1,024 bytes of a row)


def block_q8_payload(qs: np.ndarray) -> np.ndarray:
    """qs int8 [rows, k] → the blocked device payload (same shape, bytes permuted within each row), as the card's
    `q8_block_payload` leaves it.

    A row's k/32 blocks are cut into chunks of 32 blocks (the last holds the m < 32 left over); inside a chunk of
    m blocks, the 16-byte unit j + m * h holds half h of block j. So lane j of a warp finds both halves of block j
    in two coalesced 512-byte loads and folds the whole block at once."""
    rows, k = qs.shape
    halves = np.ascontiguousarray(qs).reshape(rows, k // QK, 2, QK // 2)
    n_blocks = k // QK
    full = n_blocks // CHUNK_BLOCKS * CHUNK_BLOCKS
    parts = [halves[:, :full].reshape(rows, -1, CHUNK_BLOCKS, 2, QK // 2).transpose(0, 1, 3, 2, 4).reshape(rows, -1)]
    if full < n_blocks:
        parts.append(halves[:, full:].transpose(0, 2, 1, 3).reshape(rows, -1))
    return np.ascontiguousarray(np.concatenate(parts, axis=1))


def dequantize_q8_0(qs: np.ndarray, d: np.ndarray) -> np.ndarray:
    """The fp32 matrix a (qs, d) pair stands for: qs[r, k] * d[r, k // 32] (exact in fp32)."""
    rows, k = qs.shape
    scales = d.astype(np.float32).reshape(rows, k // QK, 1)
    return (qs.astype(np.float32).reshape(rows, k // QK, QK) * scales).reshape(rows, k)


def quantize_q8_1(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """fp32 [..., K] → (xq int8 [..., K], xd fp32 [..., K/32]), bit for bit what `quantize_q8_1` stores.

    Per 32-block: d = amax / 127 in fp32, q = round-half-away(x / d) (0 when amax == 0), and the stored
    scale is fp16(d) widened to fp32: q * xd is then exactly `round_q8_1(x)` of the reference.
    """
    x = np.asarray(x, dtype=np.float32)
    k = x.shape[-1]
    if k % QK:
        raise ValueError(f"activation rows must hold a multiple of {QK} values, not {k}")
    blocks = x.reshape(x.shape[:-1] + (k // QK, QK))
    amax = np.max(np.abs(blocks), axis=-1, keepdims=True)
    d = amax / np.float32(127.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = np.where(amax > 0, blocks / d, np.float32(0.0))
    whole = np.trunc(scaled)
    q = whole + np.where(np.abs(scaled - whole) >= 0.5, np.sign(scaled), np.float32(0.0))
    xq = q.astype(np.int8).reshape(x.shape)
    xd = d[..., 0].astype(np.float16).astype(np.float32)
    return xq, xd


def dequantize_q8_1(xq: np.ndarray, xd: np.ndarray) -> np.ndarray:
    """The fp32 activations the kernels multiply: xq * xd per 32-block."""
    k = xq.shape[-1]
    blocks = xq.astype(np.float32).reshape(xq.shape[:-1] + (k // QK, QK))
    return (blocks * xd[..., None]).reshape(xq.shape)
