"""What bounds a decode step's fraction of the read ceiling (issue 30), from measurements of the same run.

The step is its weight reads plus a fixed cost per launch. Two numbers of the run price that cost:

* a GEMV's fixed cost: the microbenchmark times each matrix shape of the step alone (`microbench.gemv_bandwidth`),
  and a least-squares line through (bytes, µs) gives microseconds per launch (ramp-up, tail, node) and the rate
  at which the bytes then stream;
* an empty graph node (`microbench.graph_node_us`): what any other kernel pays before it does any work.

The step's floor under this launch structure is every GEMV at that line plus every other launch at one empty node.
Set against the 80% target (issue 30), it says whether the target is within reach of faster kernels, or needs
fewer launch boundaries (kernels that span what are now several launches).
"""

from __future__ import annotations

from typing import Any

import numpy as np

TARGET_FRACTION = 0.8  # issue 30: batch-1 decode at 80% of the read ceiling


def gemv_line(gemvs: list[dict[str, Any]]) -> tuple[float, float]:
    """(µs per launch, GB/s) of the least-squares line us = fixed + bytes / rate through the microbenchmark's
    GEMV shapes (each a dict with "bytes" and "us")."""
    nbytes = np.array([g["bytes"] for g in gemvs], float)
    us = np.array([g["us"] for g in gemvs], float)
    slope, fixed = np.polyfit(nbytes, us, 1)
    return float(fixed), float(1e-3 / slope)


def decode_bounds(breakdown: dict[str, Any], micro: dict[str, Any], read_ceiling_gbps: float,
                  bytes_per_token: int) -> dict[str, Any]:
    """The floor of a `decode_kernel_breakdown` step (see the module docstring) beside the measured step and the
    target; `bytes_per_token` is what the step's fraction of the read ceiling counts."""
    fixed_us, stream_gbps = gemv_line(micro["gemv"])
    node_us = micro["graph_node_us"]
    kernels = breakdown["kernels"]
    gemv_launches = sum(k["launches"] for name, k in kernels.items() if name.startswith("gemv_"))
    other_launches = sum(k["launches"] for name, k in kernels.items() if not name.startswith("gemv_"))
    weight_bytes = sum(g["bytes"] * g["count_per_token"] for g in micro["gemv"])
    gemv_floor = gemv_launches * fixed_us + weight_bytes / (stream_gbps * 1e3)
    other_floor = other_launches * node_us
    floor = gemv_floor + other_floor
    ceiling_us = bytes_per_token / (read_ceiling_gbps * 1e3)  # the step at the read ceiling
    return {
        "graph_node_us": node_us,
        "gemv_fixed_us": fixed_us,
        "gemv_stream_gb_per_s": stream_gbps,
        "gemv_launches": gemv_launches,
        "other_launches": other_launches,
        "gemv_floor_us": gemv_floor,
        "other_floor_us": other_floor,
        "floor_us": floor,
        "floor_fraction_of_read_ceiling": ceiling_us / floor,
        "whole_us": breakdown["whole_us"],
        "whole_fraction_of_read_ceiling": ceiling_us / breakdown["whole_us"],
        "target_fraction": TARGET_FRACTION,
        "target_us": ceiling_us / TARGET_FRACTION,
    }


def render_bounds(b: dict[str, Any]) -> str:
    """Two lines for the bench's table."""
    return (f"decode floor of this launch structure: {b['gemv_launches']} GEMVs at {b['gemv_fixed_us']:.2f} us + bytes "
            f"at {b['gemv_stream_gb_per_s']:.0f} GB/s = {b['gemv_floor_us']:.0f} us, {b['other_launches']} other launches "
            f"at {b['graph_node_us']:.2f} us (empty node) = {b['other_floor_us']:.0f} us\n"
            f"  floor {b['floor_us']:.0f} us = {100 * b['floor_fraction_of_read_ceiling']:.0f}% of the read ceiling; "
            f"measured {b['whole_us']:.0f} us = {100 * b['whole_fraction_of_read_ceiling']:.0f}%; "
            f"{100 * b['target_fraction']:.0f}% needs {b['target_us']:.0f} us")
