"""A per-kernel projection of one decode step onto a CMP 100-210, from the H200's per-kernel breakdown.

Why: the simple projection (`speed.py`) applies the step's fraction of the H200 read ceiling to the CMP's
818 GB/s, which charges every microsecond of the step as if it were spent reading weights. A decode step
also spends ~15% of its time in small kernels whose cost is fixed latency (norms, the GDN recurrence,
attention prep and merge), which a CMP does not pay 5.5x for (issue 30, item 3). This model takes each
kernel of the breakdown (`profile.kernel_breakdown`: launches and microseconds per step) and the bytes it
must move (from the model's shape), and projects it by what bounds it:

* bandwidth-bound (it moved at least BANDWIDTH_BOUND of the H200 read ceiling): the same fraction of the
  CMP's 818 GB/s over the same bytes;
* latency-bound (everything else): its H200 time scaled by the SM clocks (1.98 GHz / 1.38 GHz) in the
  optimistic column, and by the SM clocks times the SM counts (132 / 68) in the pessimistic one (a kernel
  spread over every SM of the H200 has half the SMs on the CMP). Its bytes at 818 GB/s never bind: below
  BANDWIDTH_BOUND of the H200's ceiling they take less than 1.4x its H200 time on the CMP.

The step is the sum of the parts times the measured whole/parts ratio of the H200 step (the whole graph
overlaps kernel tails, or pays between them). Compute-bound work (the prefill GEMM) stays with the simple
method: its DP4A fraction times 17.2 TOPS. Neither is a measurement on a CMP; both are labelled projections.
"""

from __future__ import annotations

from typing import Any

from engine.gguf.config import ModelConfig

CMP_READ_GBPS = 818.0  # anchor-qengine.md §6: measured linear read
CMP_SM_COUNT, CMP_SM_GHZ = 68, 1.38  # anchor-qengine.md §6 (the clock locked for comparisons)
H200_SM_COUNT, H200_SM_GHZ = 132, 1.98  # targets.md: clocks as found under load (nvidia-smi)
BANDWIDTH_BOUND = 0.25  # of the H200 read ceiling: below it a kernel's time is latency, not bytes


def state_bytes(cfg: ModelConfig, depth: int) -> dict[str, int]:
    """Bytes one decode token moves outside the weight matrices, per kernel family: the GDN recurrent state
    (fp32, read and written), the conv state (fp32, read and written) and the fp16 KV cache up to `depth`."""
    c = cfg
    return {
        "gdn_recurrent": len(c.gdn_layers) * 2 * 4 * c.ssm_n_v_heads * c.ssm_d_state * c.ssm_d_head_v,
        "gdn_conv": len(c.gdn_layers) * 2 * 4 * (c.ssm_conv_kernel - 1) * c.ssm_conv_dim,
        "attn_decode": len(c.attention_layers) * 2 * c.n_head_kv * depth * c.head_dim * 2,
    }


def kernel_bytes(name: str, cfg: ModelConfig, depth: int, weight_bytes: int) -> int:
    """The bytes a decode step's launches of kernel `name` must move (0 for kernels that move little: norms,
    elementwise, the sampler, the embedding row); `weight_bytes` is what the GEMV kernel `name` reads (the
    caller shares the step's matrix bytes among several GEMV kernels, `gemv_shares`)."""
    if name.startswith("gemv_"):
        return weight_bytes
    families = state_bytes(cfg, depth)
    if name.startswith("gdn_recurrent_conv"):  # the recurrence with the conv folded in moves both states
        return families["gdn_recurrent"] + families["gdn_conv"]
    for family, nbytes in families.items():
        if name.startswith(family):
            return nbytes
    return 0


def project_kernel(name: str, launches: int, h200_us: float, nbytes: int, read_ceiling_gbps: float) -> dict[str, Any]:
    """One kernel's class and its CMP microseconds (optimistic and pessimistic), see the module docstring."""
    fraction = nbytes / (h200_us * 1e-6) / (read_ceiling_gbps * 1e9) if h200_us > 0 else 0.0
    if fraction >= BANDWIDTH_BOUND:
        optimistic = pessimistic = nbytes / (fraction * CMP_READ_GBPS * 1e9) * 1e6
        bound = "bandwidth"
    else:
        optimistic = h200_us * H200_SM_GHZ / CMP_SM_GHZ
        pessimistic = optimistic * H200_SM_COUNT / CMP_SM_COUNT
        bound = "latency"
    return {"launches": launches, "bytes": nbytes, "h200_us": h200_us, "fraction_of_read_ceiling": fraction,
            "bound": bound, "cmp_us_optimistic": optimistic, "cmp_us_pessimistic": pessimistic}


def gemv_shares(kernels: dict[str, Any], weight_bytes: int) -> dict[str, float]:
    """The step's matrix bytes shared among its GEMV kernels in proportion to their time. A K-quant file runs
    several (one per type and matrix width) and the breakdown does not record which matrices each read, so
    each gets the GEMVs' common fraction of the read ceiling; the CMP time of a bandwidth-bound kernel is its
    H200 time x (ceiling / 818 GB/s) whatever its share, so the step's projection does not depend on it."""
    gemv_us = {name: k["us"] for name, k in kernels.items() if name.startswith("gemv_")}
    total = sum(gemv_us.values())
    return {name: weight_bytes * us / total for name, us in gemv_us.items()} if total > 0 else {}


def project_step(cfg: ModelConfig, breakdown: dict[str, Any], read_ceiling_gbps: float,
                 weight_bytes: int) -> dict[str, Any]:
    """The per-kernel CMP projection of a `decode_kernel_breakdown` (depth, whole_us, sum_of_parts_us, kernels)."""
    depth = int(breakdown["depth"])
    shares = gemv_shares(breakdown["kernels"], weight_bytes)
    kernels = {name: project_kernel(name, k["launches"], k["us"], kernel_bytes(name, cfg, depth, shares.get(name, 0)),
                                    read_ceiling_gbps)
               for name, k in breakdown["kernels"].items()}
    overlap = breakdown["whole_us"] / breakdown["sum_of_parts_us"]
    steps = {which: overlap * sum(k[f"cmp_us_{which}"] for k in kernels.values()) for which in ("optimistic", "pessimistic")}
    latency_us = sum(k["h200_us"] for k in kernels.values() if k["bound"] == "latency")
    return {
        "method": "per-kernel (engine/cuda/bench/cmp_model.py)",
        "depth": depth,
        "whole_over_parts": overlap,
        "latency_bound_share_of_h200_parts": latency_us / breakdown["sum_of_parts_us"],
        "kernels": kernels,
        "cmp_step_us": steps,
        "projected_cmp_tokens_per_s": {which: 1e6 / us for which, us in steps.items()},
    }


def render_projection(p: dict[str, Any]) -> str:
    """The model's table: each kernel's class, bytes, H200 time and CMP time, then the two step totals."""
    lines = [f"per-kernel CMP projection at depth {p['depth']} (latency-bound kernels: "
             f"{100 * p['latency_bound_share_of_h200_parts']:.0f}% of the H200 parts)",
             f"  {'kernel':<26} {'bound':<9} {'MB':>8} {'% read':>7} {'H200 us':>8} {'CMP us (opt-pess)':>19}"]
    for name, k in p["kernels"].items():
        cmp_us = f"{k['cmp_us_optimistic']:.0f}-{k['cmp_us_pessimistic']:.0f}"
        lines.append(f"  {name:<26} {k['bound']:<9} {k['bytes'] / 1e6:>8.1f} {100 * k['fraction_of_read_ceiling']:>6.0f}% "
                     f"{k['h200_us']:>8.0f} {cmp_us:>19}")
    t = p["projected_cmp_tokens_per_s"]
    lines.append(f"  step x{p['whole_over_parts']:.3f} (whole/parts): projected CMP {t['optimistic']:.1f} t/s "
                 f"(latency at clock ratio) to {t['pessimistic']:.1f} t/s (clock and SM-count ratio)")
    return "\n".join(lines)


def projection_of_bench(result: dict[str, Any]) -> dict[str, Any]:
    """The projection of a saved `rigllm bench` JSON (no GPU needed): the weight bytes are the run's own
    (`weight_read_bytes`, or the microbenchmark's whole GEMV step for runs before it was recorded)."""
    from engine.gguf.shapes import shape_config

    weight_bytes = result.get("weight_read_bytes") or result["microbench"]["gemv_step"]["bytes"]
    return project_step(shape_config(result["shape"]), result["decode_kernel_breakdown"],
                        result["ceilings"]["read_gb_per_s"], weight_bytes)


if __name__ == "__main__":
    import json
    import sys
    from pathlib import Path

    if len(sys.argv) < 2:
        sys.exit("usage: python -m engine.cuda.bench.cmp_model BENCH.json ...   (prints each run's projection)")
    for arg in sys.argv[1:]:
        saved = json.loads(Path(arg).read_text())
        print(f"{arg} ({saved['shape']}, commit {saved.get('commit')}; simple method: "
              f"{saved['decode'][str(saved['decode_kernel_breakdown']['depth'])]['projected_cmp_tokens_per_s']:.1f} t/s)")
        print(render_projection(projection_of_bench(saved)))
