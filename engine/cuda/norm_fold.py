"""The RMSNorm a decode GEMV computes in its own launch (`cuda_src/norm_fold.cuh`; issue 30).

A decode step normalises the residual rows before each in-projection, gate+up and the LM head: 65 norms in a 9B
step, each a launch of about 2.5 us plus its boundary. Folded, the GEMV's first blocks to start normalise the rows
into its own Q8_1 input while every block already asks L2 for its weights, and the norm's launch goes. The folded
norm sums in the decode norm's order (`engine.cuda.norm`, NORM_THREADS_DECODE threads a row), so its output, and
the GEMV's, are the same bits as the two launches give.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.cuda.driver import CudaCard, DeviceBuffer

FOLD_COUNTERS = 3  # tickets, slices done, blocks past the wait (uint32 each)


@dataclass(frozen=True)
class FoldedNorm:
    """RMSNorm of the GEMV's input rows: `x` fp32 [T][k] (row stride k), `weight` fp32 [k], `eps`, and the
    launch's `counters` (from `alloc_fold_counters`; launches sharing them must not run concurrently)."""

    x: DeviceBuffer
    weight: DeviceBuffer
    eps: float
    counters: DeviceBuffer


def fold_args(norm: FoldedNorm | None, k: int, n_tokens: int) -> tuple:
    """The GEMV kernels' last four arguments (norm_x, norm_w, norm_eps, norm_counters): nulls for no fold."""
    if norm is None:
        return None, None, np.float32(0.0), None
    if norm.x.nbytes < 4 * k * n_tokens or norm.weight.nbytes < 4 * k:
        raise ValueError(f"a folded norm of {n_tokens} rows of {k} needs {4 * k * n_tokens} bytes of rows and "
                         f"{4 * k} of weight, got {norm.x.nbytes} and {norm.weight.nbytes}")
    if norm.counters.nbytes < 4 * FOLD_COUNTERS:
        raise ValueError(f"a folded norm needs {FOLD_COUNTERS} counters, got {norm.counters.nbytes} bytes")
    return norm.x, norm.weight, np.float32(norm.eps), norm.counters


def alloc_fold_counters(card: CudaCard, label: str) -> DeviceBuffer:
    """Zeroed counters for the folded norms of one stream of launches (every launch leaves them zero)."""
    counters = card.alloc(4 * FOLD_COUNTERS, label)
    counters.upload(np.zeros(FOLD_COUNTERS, np.uint32))
    return counters
