"""Which Q8_0 GEMV variant each width and matrix shape launches, from a `rigllm bench --gemv-sweep T` JSON.

One rule for the tables in engine.cuda.gemv (DEFAULT_GEMV, SHAPE_GEMV), the unit test that holds them to the
committed sweeps, and tests/gpu/bench_q8_choice.py, which times whole steps with a fresh sweep's choices in the
same device call before the tables are edited: the width's default is the variant with the least GEMV time
over a whole step of the sweep's matrices; a shape gets its own entry where its fastest variant beats that
default there by at least `gain` (a sweep times each matrix alone, so smaller gains are within its noise).
"""

from __future__ import annotations

from typing import Any

from gguf import GGMLQuantizationType

from engine.gguf.tensor_types import tensor_nbytes


def shape_times(sweep: dict[str, Any]) -> dict[tuple[int, int], dict[str, float]]:
    """(rows, k) -> variant -> µs of that shape's launches per step (bytes / GB/s x launches); matrices of one
    shape (gdn_out and attn_out) add up, since one table entry serves them all."""
    times: dict[tuple[int, int], dict[str, float]] = {}
    for m in sweep["matrices"]:
        nbytes = tensor_nbytes((m["rows"], m["k"]), GGMLQuantizationType.Q8_0)
        per_shape = times.setdefault((m["rows"], m["k"]), {})
        for variant, gbps in m["gb_per_s"].items():
            per_shape[variant] = per_shape.get(variant, 0.0) + m["count_per_token"] * nbytes / gbps / 1e3
    return times


def choose(sweep: dict[str, Any], gain: float) -> tuple[str, dict[tuple[int, int, int], str]]:
    """(the width's default, {(tokens, rows, k): variant} for the shapes that beat it by `gain`)."""
    tokens = int(sweep["tokens"])
    times = shape_times(sweep)
    variants = set.intersection(*(set(t) for t in times.values()))
    default = min(sorted(variants), key=lambda v: sum(t[v] for t in times.values()))
    entries = {}
    for (rows, k), t in times.items():
        best = min(sorted(t), key=t.__getitem__)
        if t[default] / t[best] >= gain:
            entries[(tokens, rows, k)] = best
    return default, entries
