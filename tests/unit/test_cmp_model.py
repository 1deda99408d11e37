"""The per-kernel CMP projection (engine/cuda/bench/cmp_model.py) on hand-made breakdowns and on the committed
H200 runs of 2026-11-30."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.cuda.bench.cmp_model import (
    CMP_READ_GBPS,
    CMP_SM_COUNT,
    CMP_SM_GHZ,
    H200_SM_COUNT,
    H200_SM_GHZ,
    gemv_shares,
    kernel_bytes,
    project_kernel,
    project_step,
    projection_of_bench,
    render_projection,
    state_bytes,
)
from engine.cuda.bench.speed import decode_bytes
from engine.gguf.shapes import shape_config

RESULTS = Path(__file__).resolve().parents[1] / "gpu" / "results"
CLOCKS = H200_SM_GHZ / CMP_SM_GHZ


def test_state_bytes_are_the_non_matrix_part_of_the_decode_byte_count():
    cfg = shape_config("9b")
    for depth in (0, 512, 18432):
        assert decode_bytes(cfg, depth) - decode_bytes(cfg, 0) == state_bytes(cfg, depth)["attn_decode"]
    assert state_bytes(cfg, 512)["gdn_recurrent"] == 24 * 2 * 4 * 32 * 128 * 128  # 24 GDN layers of 32 heads


def test_kernels_are_given_the_bytes_they_move():
    cfg = shape_config("9b")
    assert kernel_bytes("gemv_q8_t1_r4_u2", cfg, 512, 7) == kernel_bytes("gemv_kq_q4_k_t1", cfg, 512, 7) == 7
    assert kernel_bytes("attn_decode_d256_g4", cfg, 1024, 7) == 2 * kernel_bytes("attn_decode_d256_g4", cfg, 512, 7)
    assert kernel_bytes("rmsnorm_q8_1", cfg, 512, 7) == kernel_bytes("argmax_final", cfg, 512, 7) == 0
    both = kernel_bytes("gdn_recurrent", cfg, 512, 7) + kernel_bytes("gdn_conv_silu", cfg, 512, 7)
    assert kernel_bytes("gdn_recurrent_conv", cfg, 512, 7) == kernel_bytes("gdn_recurrent_conv_wide", cfg, 512, 7) == both


def test_a_bandwidth_bound_kernel_keeps_its_fraction_of_the_read_ceiling():
    k = project_kernel("gemv", 100, 1000.0, 3_000_000_000, 4000.0)  # 3 GB in 1 ms: 75% of 4 TB/s
    assert k["bound"] == "bandwidth" and k["fraction_of_read_ceiling"] == pytest.approx(0.75)
    assert k["cmp_us_optimistic"] == k["cmp_us_pessimistic"] == pytest.approx(3e9 / (0.75 * CMP_READ_GBPS * 1e9) * 1e6)


def test_a_latency_bound_kernel_scales_with_the_clocks():
    small = project_kernel("rmsnorm", 65, 172.0, 0, 4000.0)
    assert small["bound"] == "latency"
    assert small["cmp_us_optimistic"] == pytest.approx(172.0 * CLOCKS)
    assert small["cmp_us_pessimistic"] == pytest.approx(172.0 * CLOCKS * H200_SM_COUNT / CMP_SM_COUNT)
    heavy = project_kernel("gdn_recurrent", 24, 100.0, 90_000_000, 4000.0)  # 22% of the ceiling: still latency
    assert heavy["bound"] == "latency" and heavy["cmp_us_optimistic"] == pytest.approx(100.0 * CLOCKS)
    # its bytes at the CMP's full bandwidth would take less: the clock-scaled time is the binding one
    assert 90e6 / (CMP_READ_GBPS * 1e9) * 1e6 < heavy["cmp_us_optimistic"]


def test_the_step_is_the_parts_times_the_whole_over_parts_ratio():
    cfg = shape_config("9b")
    breakdown = {"depth": 512, "whole_us": 1100.0, "sum_of_parts_us": 1000.0,
                 "kernels": {"gemv_q8_t1_r4_u2": {"launches": 10, "us": 900.0},
                             "rmsnorm_q8_1": {"launches": 10, "us": 100.0}}}
    p = project_step(cfg, breakdown, 4000.0, 3_000_000_000)
    gemv = 3e9 / (CMP_READ_GBPS * 1e9) / (3e9 / 900e-6 / 4000e9) * 1e6
    assert p["cmp_step_us"]["optimistic"] == pytest.approx(1.1 * (gemv + 100.0 * CLOCKS))
    assert p["projected_cmp_tokens_per_s"]["optimistic"] == pytest.approx(1e6 / p["cmp_step_us"]["optimistic"])
    assert p["latency_bound_share_of_h200_parts"] == pytest.approx(0.1)
    assert "rmsnorm_q8_1" in render_projection(p)


@pytest.mark.parametrize("shape, simple, low, high", [("9b", 59.3, 66.0, 70.5), ("27b", 20.5, 22.0, 23.5)])
def test_the_committed_h200_runs_project_above_the_simple_method(shape, simple, low, high):
    """The 2026-11-30 runs (commit 7527e6f): ~15-20% of those steps is latency-bound kernels, which the simple
    method charged at the bandwidth ratio (5.5x) and this model at the clock ratio (1.43x, or 2.78x with SM
    counts), so the per-kernel projection is higher: 9B 66.4-70.1 t/s against 59.3, 27B 22.3-23.2 against 20.5."""
    saved = json.loads((RESULTS / f"2026-11-30-h200-bench-{shape}-synthetic.json").read_text())
    assert saved["decode"]["512"]["projected_cmp_tokens_per_s"] == pytest.approx(simple, abs=0.05)
    t = projection_of_bench(saved)["projected_cmp_tokens_per_s"]
    assert simple < low <= t["pessimistic"] <= t["optimistic"] <= high


def test_several_gemv_kernels_share_the_step_weight_bytes_and_keep_the_projection():
    """A K-quant step runs several GEMV kernels; each once got the whole file's bytes (fractions over 100%)."""
    kernels = {"gemv_q4_k_t1_r4_u1": {"launches": 52, "us": 700.0}, "gemv_q6_k_t1_p2": {"launches": 33, "us": 300.0},
               "rmsnorm_q8_1": {"launches": 65, "us": 170.0}}
    shares = gemv_shares(kernels, 4_000_000_000)
    assert shares == {"gemv_q4_k_t1_r4_u1": 2.8e9, "gemv_q6_k_t1_p2": 1.2e9}
    breakdown = {"depth": 512, "whole_us": 1200.0, "sum_of_parts_us": 1170.0, "kernels": kernels}
    p = project_step(shape_config("9b"), breakdown, 4500.0, 4_000_000_000)
    fractions = {name: k["fraction_of_read_ceiling"] for name, k in p["kernels"].items() if name.startswith("gemv_")}
    assert all(abs(f - 4e9 / 1e-3 / 4.5e12) < 1e-9 for f in fractions.values())
    gemv_cmp_us = sum(p["kernels"][n]["cmp_us_optimistic"] for n in fractions)
    assert abs(gemv_cmp_us - 1000.0 * 4500.0 / 818.0) < 1e-6
