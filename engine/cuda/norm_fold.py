"""The RMSNorm a decode GEMV computes in its own launch (`cuda_src/norm_fold.cuh`; issue 30).

A decode step normalises the residual rows before each in-projection, gate+up and the LM head: 65 norms in a 9B
step, each a launch of 2.5-3.7 us plus its boundary (H200). Folded, the GEMV's first blocks normalise the rows into
its own Q8_1 input while every block already asks L2 for its weights, and the norm's launch goes. The folded norm
sums in the decode norm's order (`engine.cuda.norm`, NORM_THREADS_DECODE threads a row), so its output, and
the GEMV's, are the same bits as the two launches give.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.cuda.driver import CudaCard, DeviceBuffer


@dataclass(frozen=True)
class FoldedNorm:
    """RMSNorm of the GEMV's input rows: `x` fp32 [T][k] (row stride k), `weight` fp32 [k], `eps`, and the launch's
    own counter `done` (4 bytes, zero when the launch starts: `FoldCounters.next`)."""

    x: DeviceBuffer
    weight: DeviceBuffer
    eps: float
    done: DeviceBuffer


def fold_args(norm: FoldedNorm | None, k: int, n_tokens: int) -> tuple:
    """The GEMV kernels' last four arguments (norm_x, norm_w, norm_eps, norm_done): nulls for no fold."""
    if norm is None:
        return None, None, np.float32(0.0), None
    if norm.x.nbytes < 4 * k * n_tokens or norm.weight.nbytes < 4 * k:
        raise ValueError(f"a folded norm of {n_tokens} rows of {k} needs {4 * k * n_tokens} bytes of rows and "
                         f"{4 * k} of weight, got {norm.x.nbytes} and {norm.weight.nbytes}")
    if norm.done.nbytes < 4:
        raise ValueError(f"a folded norm needs a 4-byte counter, got {norm.done.nbytes} bytes")
    return norm.x, norm.weight, np.float32(norm.eps), norm.done


class FoldCounters:
    """One counter for each folded launch of a pass, all zeroed by one memset when the pass begins (a captured pass
    keeps the memset as its graph's node): the kernel never has to reset its own, which cost two atomics a block."""

    def __init__(self, card: CudaCard, launches: int, label: str):
        self.buf = card.alloc(4 * launches, label)
        self.launches, self._used = launches, 0

    def begin_pass(self) -> None:
        self.buf.fill_zero()
        self._used = 0

    def next(self) -> DeviceBuffer:
        """The next folded launch's counter in this pass."""
        if self._used == self.launches:
            raise ValueError(f"a pass folds at most {self.launches} norms")
        self._used += 1
        return self.buf.view(4 * (self._used - 1), 4)
