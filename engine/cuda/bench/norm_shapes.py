"""The decode RMSNorm's launch shape among its alternatives (`rigllm bench`'s `rmsnorm_shapes`).

engine/cuda/norm.py launches a GEMV-sized batch's norm as NORM_SLICES_DECODE blocks of NORM_THREADS_DECODE
threads per row. Here every (threads, slices) pair of SHAPES normalises 1 and 8 rows of the model's width, 65
launches back to back in one graph as in a 9B decode step, so the per-launch time includes a graph node's cost
as the step pays it. The thread count changes the sum's order (bits), the slices never do: a change of shape
is a change of numerics for every decode path at once, never between them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.cuda.bench.microbench import time_graph_ms
from engine.cuda.driver import CudaCard
from engine.cuda.gemv import alloc_q8_activations
from engine.cuda.norm import NORM_SLICES_DECODE, NORM_THREADS_DECODE, rmsnorm_q8_1

SHAPES = tuple((threads, slices) for threads in (256, 512, 1024) for slices in (2, 4, 8, 16))
ROWS = (1, 8)
LAUNCHES = 65  # a 9B decode step's norms


def shape_name(threads: int, slices: int) -> str:
    return f"{threads}x{slices}"


def norm_shapes(card: CudaCard, d_model: int, eps: float, reps: int = 5) -> dict[str, Any]:
    """Microseconds per launch of each shape for each row count, the fastest, and the shape in use."""
    rng = np.random.default_rng(5)
    x = card.upload(rng.standard_normal(max(ROWS) * d_model).astype(np.float32), "bench.norm.x")
    w = card.upload(rng.uniform(0.5, 1.5, d_model).astype(np.float32), "bench.norm.w")
    out = alloc_q8_activations(card, d_model, max(ROWS), "bench.norm.out")
    us: dict[int, dict[str, float]] = {}
    try:
        for rows in ROWS:
            us[rows] = {}
            for threads, slices in SHAPES:
                def norms(_: int, threads: int = threads, slices: int = slices) -> None:
                    for _ in range(LAUNCHES):
                        rmsnorm_q8_1(card, x, d_model, w, rows, d_model, eps, out.xq, out.xd, d_model, (rows, slices),
                                     threads)

                us[rows][shape_name(threads, slices)] = 1e3 * time_graph_ms(card, reps, norms) / LAUNCHES
    finally:
        for buf in (x, w, out.xq, out.xd):
            buf.free()
    return {"d_model": d_model, "launches_per_graph": LAUNCHES,
            "in_use": shape_name(NORM_THREADS_DECODE, NORM_SLICES_DECODE),
            "us_per_launch": {str(r): v for r, v in us.items()},
            "fastest": {str(r): min(v, key=v.__getitem__) for r, v in us.items()}}


def render_norm_shapes(r: dict[str, Any]) -> str:
    """One line per row count: the shape in use and the fastest, in µs per launch."""
    lines = []
    for rows, us in r["us_per_launch"].items():
        best = r["fastest"][rows]
        lines.append(f"RMSNorm of {rows} row(s) x {r['d_model']}: {r['in_use']} (in use) {us[r['in_use']]:.2f} us, "
                     f"fastest {best} {us[best]:.2f} us a launch")
    return "\n".join(lines)
