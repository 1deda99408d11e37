"""Which weight bytes a latency-bound decode kernel prefetches into L2 for the Q8_0 GEMV after it (common.cuh).

A decode step alternates weight-streaming GEMVs with short kernels that barely touch HBM: the RMSNorms, SwiGLU, the
GDN recurrence, attention prep. Each GEMV then starts cold and pays a memory round trip before its data flows. The
short kernels instead prefetch the leading bytes of the next GEMV's weight into L2, so that GEMV's first loads hit.

Measured on the H200 (60 MiB of L2; `…-s17a-prefetch-probe.json`): a 3 us kernel that prefetches, then a cold
Q8_0 GEMV, against the same pair without the prefetch:
- 8 MiB prefetched: the pair 1.25 us faster for 4096x12288 (18.84 → 17.59 us), 1.23 us for 24576x4096, 0.88 us for
  12352x4096, 0.28 us for 4096x4096;
- 16 MiB: 0.1-0.3 us better than 8 for the first two, 0.35 us worse for the last two;
- 32 MiB: slower than none for the three shapes tried (the window kernel itself then runs 2.5-3 us longer).
Hence an eighth of L2 (7.5 MiB on the H200). On a CMP 100-210 (6 MiB of L2) that is 0.75 MiB; not measured there.

In the whole decode step (s17c, `run_h200_session.sh ab`, two runs each against the tree without it): the 9B Q8_0 step
2,837 / 2,835 us against 2,904 / 2,906, the 27B 8,008 / 8,007 against 8,287 / 8,286. The short kernels themselves
run 0.5-1 us longer each; the GEMVs after them gain more. Timed alone (the bench's per-kernel parts) a GEMV shows
none of it: it is the pair that gains. Without the norms' prefetches the 9B step read 2,869 us twice (s17f): the norms
and the other kernels each give about half. s15 had tried a prefix of every row of the next in-projection, gate+up
and LM head only, from extra norm blocks or a forked stream, and gained nothing (README, Benchmarks).
Only Q8_0 matrices are prefetched: before the K-quant GEMVs, which the H200 runs bound by instruction issue rather
than by bytes, it bought nothing (the 9B Q4_K_M step 2,265 / 2,270 us with it, s17d; 2,264 without, s17e).
Only GEMV-sized batches prefetch: a prefill chunk's GEMMs are bound by arithmetic, not by their first loads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.cuda.driver import CudaCard, DeviceBuffer
from engine.cuda.gemv import MAX_GEMV_TOKENS, Q8Weight
from engine.cuda.matmul import MixedWeight, Weight

L2_SHARE = 8  # the prefetch takes at most l2_bytes / L2_SHARE (see the module docstring)


@dataclass(frozen=True)
class L2Prefetch:
    """The last two arguments of a prefetching kernel: a buffer's first `nbytes` bytes, or nothing."""

    buf: DeviceBuffer | None = None
    nbytes: int = 0

    def args(self) -> tuple[DeviceBuffer | None, np.int64]:
        return self.buf, np.int64(self.nbytes)


NO_PREFETCH = L2Prefetch()


def leading_q8_buffer(w: Weight) -> DeviceBuffer | None:
    """The Q8_0 values a GEMV of `w` reads first (its first run's), or None when that run is a K-quant matrix."""
    first = w.runs[0] if isinstance(w, MixedWeight) else w
    return first.qs if isinstance(first, Q8Weight) else None


def before_gemv(card: CudaCard, w: Weight | None, n_tokens: int) -> L2Prefetch:
    """What a kernel prefetches when the next matmul multiplies n_tokens rows by `w` (None: no matmul follows)."""
    buf = leading_q8_buffer(w) if w is not None and n_tokens <= MAX_GEMV_TOKENS else None
    return NO_PREFETCH if buf is None else L2Prefetch(buf, min(buf.nbytes, card.l2_bytes // L2_SHARE))


def grid_with_prefetch_blocks(card: CudaCard, grid: int | tuple[int, int], prefetch: L2Prefetch
                              ) -> int | tuple[int, ...]:
    """The launch grid of a kernel whose own grid is `grid` (1-D, or (x, y)) and which hands its prefetch to blocks of
    their own (common.cuh prefetch_part): z layers of that grid past the first, enough to put a prefetching block on
    about every SM. A decode RMSNorm's own 8 blocks issuing 7.5 MiB took 4.8 us longer (H200, s17b); spread over every
    SM the same lines cost a 3 us kernel 0.4 us (s17a). Without a prefetch the grid is unchanged."""
    if prefetch.buf is None or prefetch.nbytes == 0:
        return grid
    gx, gy = (grid, 1) if isinstance(grid, int) else grid
    return gx, gy, 1 + -(-card.sm_count // (gx * gy))
