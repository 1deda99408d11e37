"""Host side of the RMSNorm + Q8_1 kernel (`cuda_src/norm_rope.cu` rmsnorm_q8_1): its launch shapes.

A GEMV-sized batch (a decode token, a slot batch, a verify: up to MAX_GEMV_TOKENS rows) splits each row over
NORM_SLICES_DECODE blocks of NORM_THREADS_DECODE threads: every block sums the whole row in the same order and
writes its share, so the split never changes a bit, while the thread count sets the order of the sum. Batched
rows equal lone ones only because every GEMV-sized caller launches the same shape. Longer batches (prefill
chunks) take one NORM_THREADS_BATCH block per row. `rigllm bench` times the decode shape among its alternatives
(engine/cuda/bench/norm_shapes.py).
"""

from __future__ import annotations

import numpy as np

from engine.cuda.driver import CudaCard, DeviceBuffer, Stream
from engine.cuda.gemv import MAX_GEMV_TOKENS
from engine.cuda.l2_prefetch import NO_PREFETCH, L2Prefetch, grid_with_prefetch_blocks

# Measured on the H200: one RMSNorm of 4096 values took 3.9 us with one block and 2.6 us with 8 (7527e6f); one
# 256-thread block per row cost the 9B verify 10 us per norm against 2.6 (…-bench-9b-mtp-breakdown).
NORM_THREADS_DECODE, NORM_THREADS_BATCH = 1024, 256
NORM_SLICES_DECODE = 8


def rmsnorm_q8_1(card: CudaCard, x: DeviceBuffer, in_stride: int, weight: DeviceBuffer, n: int, d: int, eps: float,
                 xq: DeviceBuffer | None, xd: DeviceBuffer | None, out_stride: int, grid: tuple[int, int],
                 threads: int, y: DeviceBuffer | None = None, stream: Stream | None = None,
                 prefetch: L2Prefetch = NO_PREFETCH) -> None:
    """RMSNorm of the n rows of width d of `x` (row stride in_stride), as Q8_1 (xq, xd; row stride out_stride)
    and/or fp32 `y`, launched as `grid` blocks of `threads` (see the module docstring for the shapes); `prefetch`:
    the next GEMV's leading weight bytes (engine.cuda.l2_prefetch)."""
    if grid[0] != n:
        raise ValueError(f"the norm's grid has a row of blocks per row: {grid} for {n} rows")
    card.kernel("rmsnorm_q8_1").launch(grid_with_prefetch_blocks(card, grid, prefetch), threads, x, np.int32(in_stride),
                                       weight, np.int32(d), np.float32(eps), y, xq, xd, np.int32(out_stride),
                                       *prefetch.args(), stream=stream)


def norm_shape(n: int) -> tuple[tuple[int, int], int]:
    """(grid, threads) of n rows: a GEMV-sized batch split per row, else a block per row."""
    return ((n, NORM_SLICES_DECODE), NORM_THREADS_DECODE) if n <= MAX_GEMV_TOKENS else ((n, 1), NORM_THREADS_BATCH)
