"""Prefetch of the next GEMV's weights into L2 beside a latency-bound kernel (cuda_src/l2_prefetch.cu).

A decode step alternates GEMVs, which stream weights at most of the HBM's bandwidth, with short kernels that
barely touch memory (norms, SwiGLU, the GDN and attention mixers). `L2PrefetchLane.start(w)` forks a second
stream off the card's stream, pulls a prefix of every row of `w` into L2 there, and `join()` makes the card's
stream wait for it right before the GEMV of `w`: the bus works during the short kernel, and the GEMV's warps start
on L2 hits. Inside a CUDA graph the fork and the join are edges, so the prefetch branch replays with the step.

The policy is a byte budget per prefetch, shared out over the rows (every GEMV warp starts at its row's first
byte, so a prefix of each row helps all of them where a prefix of the matrix would help a few), capped at half
the card's L2 so one prefetch never evicts another's bytes before its GEMV reads them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from engine.cuda.driver import DeviceBuffer
from engine.cuda.gemv import Q8Weight
from engine.cuda.kq_weight import KQWeight
from engine.cuda.matmul import MixedWeight, SingleWeight, Weight

PREFETCH_THREADS = 256
PREFETCH_ENV = "RIGLLM_L2_PREFETCH"  # "<MiB>[:<step bytes>[:touch]]", e.g. "8:128"; "0" turns it off


@dataclass(frozen=True)
class L2Policy:
    """`budget`: bytes pulled in per prefetch; `step`: bytes between touched addresses (32: every sector, 128:
    every line); `touch`: load a word per address (the branch ends when the bytes are in) instead of
    `prefetch.global.L2` (it ends once the requests are issued)."""

    budget: int
    step: int = 128
    touch: bool = False

    @classmethod
    def parse(cls, text: str) -> L2Policy:
        parts = text.split(":")
        mib = float(parts[0])
        step = int(parts[1]) if len(parts) > 1 and parts[1] else 128
        if step not in (32, 64, 128):
            raise ValueError(f"{PREFETCH_ENV}: the step is 32, 64 or 128 bytes, not {step}")
        return cls(int(mib * 2**20), step, len(parts) > 2 and parts[2] == "touch")


def policy_from_env() -> L2Policy | None:
    text = os.environ.get(PREFETCH_ENV, "").strip()
    policy = L2Policy.parse(text) if text else None
    return policy if policy is not None and policy.budget > 0 else None


@dataclass(frozen=True)
class RowRegion:
    """`rows` rows of `row_stride` bytes at `buf`, of which the first `lines` × step bytes are fetched."""

    buf: DeviceBuffer
    row_stride: int
    rows: int
    lines: int


def _buffers(w: SingleWeight) -> list[tuple[DeviceBuffer, int]]:
    """(buffer, bytes per row) of each array a GEMV of `w` streams, in the order it reads them."""
    if isinstance(w, Q8Weight):
        return [(w.qs, w.k), (w.d, w.k // 16)]
    if isinstance(w, KQWeight):
        return [(w.data, w.data.nbytes // w.rows)]
    raise TypeError(f"no prefetch plan for {type(w).__name__}")


def plan_regions(w: Weight, budget: int, step: int) -> list[RowRegion]:
    """The regions of `w` that `budget` bytes cover: each array gets its share of the budget by size, spread as an
    equal prefix over its rows (at least one `step` a row; when even that exceeds the share, the first rows)."""
    runs = w.runs if isinstance(w, MixedWeight) else (w,)
    arrays = [a for run in runs for a in _buffers(run)]
    total = sum(buf.nbytes for buf, _ in arrays)
    regions = []
    for buf, stride in arrays:
        share = budget * buf.nbytes // total
        rows = buf.nbytes // stride
        lines = min(-(-stride // step), share // (rows * step))
        if lines == 0:
            lines, rows = 1, min(rows, share // step)
        if rows > 0:
            regions.append(RowRegion(buf, stride, rows, lines))
    return regions


PREFETCH_PER_THREAD = 4  # prefetch requests per thread of the norm kernel's extra blocks


def prefetch_blocks(regions: list[RowRegion], threads: int) -> int:
    """Extra blocks of `threads` that issue the regions' requests, PREFETCH_PER_THREAD each (1..64)."""
    lines = sum(r.rows * r.lines for r in regions)
    return max(1, min(64, -(-lines // (threads * PREFETCH_PER_THREAD))))


def region_args(regions: list[RowRegion]) -> tuple:
    """The kernel arguments of two regions (a missing one is empty)."""
    args: list = []
    for r in (regions + [None, None])[:2]:
        args += ([None, np.int64(0), np.int32(0), np.int32(0)] if r is None else
                 [r.buf, np.int64(r.row_stride), np.int32(r.rows), np.int32(r.lines)])
    return tuple(args)
