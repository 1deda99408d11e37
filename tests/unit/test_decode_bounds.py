"""The decode floor (engine/cuda/bench/decode_bounds.py): the GEMV line recovers a known fixed cost and rate, and the
floor adds GEMVs on that line to the other launches at one empty node each."""

from __future__ import annotations

import pytest

from engine.cuda.bench.decode_bounds import decode_bounds, gemv_line, render_bounds


def _gemv(nbytes: float, count: int, fixed_us: float = 2.5, gbps: float = 4000.0) -> dict:
    return {"bytes": nbytes, "count_per_token": count, "us": fixed_us + nbytes / (gbps * 1e3)}


GEMVS = [_gemv(17.8e6, 24), _gemv(53.5e6, 32), _gemv(107e6, 32), _gemv(1.08e9, 1)]


def test_the_line_through_exact_points_is_their_fixed_cost_and_rate():
    fixed, gbps = gemv_line(GEMVS)
    assert fixed == pytest.approx(2.5) and gbps == pytest.approx(4000.0)


def test_the_floor_prices_gemvs_on_the_line_and_other_launches_at_one_node():
    micro = {"gemv": GEMVS, "graph_node_us": 1.25}
    breakdown = {"whole_us": 3000.0, "kernels": {
        "gemv_q8_t1_r4_u1_p": {"launches": 80, "us": 1.0}, "gemv_q8_t1_r4_u2": {"launches": 9, "us": 1.0},
        "rmsnorm_q8_1": {"launches": 65, "us": 1.0}, "swiglu_q8_1": {"launches": 32, "us": 1.0}}}
    weight_bytes = 17.8e6 * 24 + 53.5e6 * 32 + 107e6 * 32 + 1.08e9
    b = decode_bounds(breakdown, micro, read_ceiling_gbps=5000.0, bytes_per_token=int(weight_bytes))
    assert b["gemv_launches"] == 89 and b["other_launches"] == 97
    assert b["gemv_floor_us"] == pytest.approx(89 * 2.5 + weight_bytes / 4e6)
    assert b["other_floor_us"] == pytest.approx(97 * 1.25)
    ceiling_us = weight_bytes / 5e6
    assert b["floor_fraction_of_read_ceiling"] == pytest.approx(ceiling_us / b["floor_us"])
    assert b["whole_fraction_of_read_ceiling"] == pytest.approx(ceiling_us / 3000.0)
    assert b["target_us"] == pytest.approx(ceiling_us / 0.8)
    assert "97 other launches" in render_bounds(b)
