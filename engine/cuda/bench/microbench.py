"""Device ceilings and GEMV speed, measured on the card in the same run (`rigllm bench`, targets.md).

- copy bandwidth: a large device-to-device copy, counted as read + write (as targets.md's 4281 GB/s);
- DP4A peak: `dp4a_peak`, 8 independent chains per thread, 16 blocks of 256 threads per SM;
- DP4A under a Q8 fold: `dp4a_fold_peak_d8` / `_d4`, the same with three fp32 instructions per 8 or 4 DP4As, as the
  Q8_0 x Q8_1 GEMM tile and GEMV fold their integer sums per 32-value block (and as the GEMV folded per half block
  on the row-major payload before 2026-12-03's blocked one) (`dp4a_fold_ceilings`);
- graph node: `graph_node_us`, back-to-back empty launches in one graph (a kernel's cost before any work);
- GEMV bandwidth: `gemv_q8_t1` on every weight matrix of one decode step of a model shape (stacked as
  the runner stacks them), each rotated over enough random copies that L2 (tens of MiB) cannot serve
  repeats, replayed from a CUDA graph and timed with CUDA events; plus the whole step's GEMV bytes
  over its summed GEMV time;
- GEMV sweep (`gemv_sweep`, `rigllm bench --synthetic 9b --gemv-sweep 1|2|3`): the same measurement for every
  T=1 or T=2 kernel variant (gemv.GEMV_VARIANTS), to choose gemv.DEFAULT_GEMV.
Projected numbers for other cards (e.g. the CMP 100-210) are fractions of these measured ceilings.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.cuda.driver import CudaCard, DeviceBuffer
from engine.cuda.gemv import DEFAULT_GEMV, GEMV_VARIANTS, Q8Activations, alloc_q8_activations, gemv_q8
from engine.cuda.bench.synthetic_weights import random_q8_weight
from engine.cuda.q8_layout import QK
from engine.gguf.config import ModelConfig
from engine.gguf.shapes import shape_config

DP4A_CHAINS = 8  # RIGLLM_DP4A_CHAINS in microbench.cu
OPS_PER_DP4A = 8  # 4 int8 multiply-adds, 2 ops each
FOLD_DOTS = (8, 4)  # the dp4a_fold_peak_d* kernels: DP4As per fp32 fold


def time_graph_ms(card: CudaCard, reps: int, body: Any) -> float:
    """Mean device milliseconds per call of `body(i)`, i < reps, replayed as one CUDA graph.

    A graph keeps Python launch overhead (several µs per call) out of the measurement, as it is kept
    out of a real decode step; the eager first call loads the kernels and warms the caches.
    """
    body(0)
    with card.capture("microbench") as graph:
        for i in range(reps):
            body(i)
    try:
        card.replay(graph)
        start, end = card.event(), card.event()
        start.record()
        card.replay(graph)
        end.record()
        return end.elapsed_ms(start) / reps
    finally:
        graph.close()


def copy_bandwidth(card: CudaCard, nbytes: int = 1 << 30, reps: int = 10) -> dict[str, float]:
    """Device-to-device copy speed, read + write bytes per second."""
    src = card.alloc(nbytes, "bench.copy.src")
    dst = card.alloc(nbytes, "bench.copy.dst")
    try:
        src.fill_zero()
        ms = time_graph_ms(card, reps, lambda _: dst.copy_from(src))
    finally:
        src.free()
        dst.free()
    return {"bytes": nbytes, "ms": ms, "gb_per_s": 2 * nbytes / (ms * 1e-3) / 1e9}


def dp4a_peak(card: CudaCard, iters: int = 4096, reps: int = 5, kernel_name: str = "dp4a_peak",
              dots_per_round: int = 1) -> dict[str, float]:
    """DP4A throughput in int8 TOPS (2 ops per multiply-add) of `kernel_name`, whose threads run DP4A_CHAINS chains
    of `dots_per_round` DP4As a round (dp4a_peak: one, nothing else; dp4a_fold_peak_d*: a Q8 fold per round)."""
    blocks, threads = card.sm_count * 16, 256
    out = card.alloc(4, "bench.dp4a.out")
    kernel = card.kernel(kernel_name)
    try:
        ms = time_graph_ms(
            card, reps, lambda _: kernel.launch(blocks, threads, out, np.int32(iters), np.int32(-0x7FFFFFFF))
        )
    finally:
        out.free()
    ops = blocks * threads * iters * DP4A_CHAINS * dots_per_round * OPS_PER_DP4A
    return {"ms": ms, "tops": ops / (ms * 1e-3) / 1e12}


def dp4a_fold_ceilings(card: CudaCard, peak_tops: float) -> dict[str, dict[str, float]]:
    """The DP4A rate of a Q8 dot product's instruction mix (microbench.cu dp4a_fold_peak_d*): 8 DP4As per fold
    (the prefill GEMM's tile and the GEMV, per output and 32-value block) and 4 (per half block, the row-major GEMV's
    mix before the blocked payload), each in TOPS and as a fraction of the bare DP4A peak: the ceiling any kernel of
    that mix can reach, beside the peak it is measured against."""
    out = {}
    for dots in FOLD_DOTS:
        r = dp4a_peak(card, iters=4096 // dots, kernel_name=f"dp4a_fold_peak_d{dots}", dots_per_round=dots)
        out[str(dots)] = {"tops": r["tops"], "fraction_of_dp4a_peak": r["tops"] / peak_tops}
    return out


def graph_node_us(card: CudaCard, launches: int = 256, reps: int = 5) -> float:
    """Microseconds per node of a graph of back-to-back one-block launches that do nothing (`graph_node_probe`):
    what every kernel of a decode step pays before any work, the floor a latency-bound kernel cannot go under."""
    out = card.alloc(4, "bench.node.out")
    kernel = card.kernel("graph_node_probe")

    def empty_launches(_: int) -> None:
        for _ in range(launches):
            kernel.launch(1, 32, out, np.int32(-1))

    try:
        ms = time_graph_ms(card, reps, empty_launches)
    finally:
        out.free()
    return 1e3 * ms / launches


@dataclass(frozen=True)
class GemvShape:
    """One GEMV of a decode step: `count` launches per token of a rows x k matrix."""

    name: str
    rows: int
    k: int
    count: int

    @property
    def weight_bytes(self) -> int:
        return self.rows * self.k + 2 * self.rows * (self.k // QK)


def decode_gemvs(cfg: ModelConfig) -> list[GemvShape]:
    """The GEMVs of one decode token of a model (trunk only), stacked as the runner launches them."""
    n_gdn, n_attn = len(cfg.gdn_layers), len(cfg.attention_layers)
    d, hv = cfg.d_model, cfg.ssm_n_v_heads
    return [
        GemvShape("gdn_in (qkv+z+b+a)", cfg.ssm_conv_dim + cfg.ssm_d_inner + 2 * hv, d, n_gdn),
        GemvShape("gdn_out", d, cfg.ssm_d_inner, n_gdn),
        GemvShape("attn_in (q+gate, k, v)", 2 * cfg.q_dim + 2 * cfg.kv_dim, d, n_attn),
        GemvShape("attn_out", d, cfg.q_dim, n_attn),
        GemvShape("ffn_gate_up", 2 * cfg.d_ff, d, cfg.n_layers),
        GemvShape("ffn_down", d, cfg.d_ff, cfg.n_layers),
        GemvShape("lm_head", cfg.vocab_size, d, 1),
    ]


def _random_activations(card: CudaCard, k: int, seed: int, n_tokens: int = 1) -> Q8Activations:
    act = alloc_q8_activations(card, k, n_tokens, "bench.x")
    rng = np.random.default_rng(seed)
    act.xq.upload(rng.integers(-127, 128, size=n_tokens * k, dtype=np.int8))
    act.xd.upload(rng.uniform(0.01, 0.02, size=n_tokens * k // QK).astype(np.float16).astype(np.float32))
    return act


def gemv_bandwidths(
    card: CudaCard, shape: GemvShape, variants: Sequence[str], reps: int = 20, l2_multiple: int = 4, n_tokens: int = 1
) -> list[dict[str, Any]]:
    """Achieved read bandwidth of each `n_tokens`-token GEMV kernel in `variants` on `shape`, one record each.

    Every variant runs on the same weights: copies totalling >= l2_multiple x L2, rotated so that no
    launch finds its matrix in L2, as a decode step (which reads each matrix once) never does.
    """
    copies = max(2, min(8, math.ceil(l2_multiple * card.l2_bytes / shape.weight_bytes)))
    weights = [random_q8_weight(card, (shape.rows,), shape.k, 1000 + i, f"bench.{shape.name}.{i}") for i in range(copies)]
    x = _random_activations(card, shape.k, 7, n_tokens)
    y: DeviceBuffer = card.alloc(4 * n_tokens * shape.rows, "bench.y")
    try:
        ms = {
            v: time_graph_ms(card, reps, lambda i, v=v: gemv_q8(card, weights[i % copies], x, y, n_tokens, variant=v))
            for v in variants
        }
    finally:
        for w in weights:
            w.qs.free()
            w.d.free()
        for buf in (x.xq, x.xd, y):
            buf.free()
    read = shape.weight_bytes + n_tokens * (shape.k + 4 * (shape.k // QK))
    return [
        {
            "name": shape.name,
            "kernel": v,
            "rows": shape.rows,
            "k": shape.k,
            "count_per_token": shape.count,
            "copies": copies,
            "bytes": read,
            "us": ms[v] * 1e3,
            "gb_per_s": read / (ms[v] * 1e-3) / 1e9,
        }
        for v in variants
    ]


def gemv_bandwidth(card: CudaCard, shape: GemvShape, reps: int = 20, l2_multiple: int = 4) -> dict[str, Any]:
    """Achieved read bandwidth of the decode GEMV (gemv.DEFAULT_GEMV[1]) on `shape`."""
    [record] = gemv_bandwidths(card, shape, (DEFAULT_GEMV[1],), reps, l2_multiple)
    return record


def gemv_sweep(card: CudaCard, shape: str = "9b", reps: int = 50, n_tokens: int = 1) -> dict[str, Any]:
    """Every `n_tokens`-token GEMV variant on every decode matrix of `shape`: GB/s per matrix, GEMV µs per
    step, the best.

    `per_token_us[v]` is one step's GEMV time (n_tokens rows through every matrix) if every GEMV ran
    variant v (each matrix's time times its launches per step); `best_per_matrix_us` is the time if each
    matrix ran its own best. JSON-ready; pick the variant with the lowest per_token_us for
    gemv.DEFAULT_GEMV[n_tokens].
    """
    variants = tuple(GEMV_VARIANTS[n_tokens])
    default = DEFAULT_GEMV[n_tokens]
    matrices = []
    per_token_us = dict.fromkeys(variants, 0.0)
    best_per_matrix_us = 0.0
    for s in decode_gemvs(shape_config(shape)):
        records = gemv_bandwidths(card, s, variants, reps, n_tokens=n_tokens)
        us = {r["kernel"]: r["us"] for r in records}
        best = min(us, key=us.__getitem__)
        for v in variants:
            per_token_us[v] += us[v] * s.count
        best_per_matrix_us += us[best] * s.count
        matrices.append({
            "name": s.name,
            "rows": s.rows,
            "k": s.k,
            "count_per_token": s.count,
            "gb_per_s": {r["kernel"]: round(r["gb_per_s"], 1) for r in records},
            "best": best,
            "best_vs_default": round(us[default] / us[best], 3),
        })
    ranking = sorted(variants, key=per_token_us.__getitem__)
    return {
        "device": card.device_name,
        "shape": shape,
        "tokens": n_tokens,
        "default": default,
        "matrices": matrices,
        "per_token_us": {v: round(per_token_us[v], 2) for v in ranking},
        "best": ranking[0],
        "best_per_matrix_us": round(best_per_matrix_us, 2),
    }


def run_microbench(card: CudaCard, shape: str = "9b") -> dict[str, Any]:
    """Ceilings and GEMV speeds for `card`, as one JSON-ready dict."""
    copy = copy_bandwidth(card)
    dp4a = dp4a_peak(card)
    folds = dp4a_fold_ceilings(card, dp4a["tops"])
    node_us = graph_node_us(card)
    gemvs = [gemv_bandwidth(card, s) for s in decode_gemvs(shape_config(shape))]
    step_bytes = sum(g["bytes"] * g["count_per_token"] for g in gemvs)
    step_us = sum(g["us"] * g["count_per_token"] for g in gemvs)
    step_gbps = step_bytes / (step_us * 1e-6) / 1e9
    return {
        "device": card.device_name,
        "arch": f"sm_{card.arch}",
        "sm_count": card.sm_count,
        "copy_gb_per_s": copy["gb_per_s"],
        "dp4a_tops": dp4a["tops"],
        "dp4a_fold_ceilings": folds,
        "graph_node_us": node_us,
        "gemv": gemvs,
        "gemv_step": {
            "shape": shape,
            "bytes": step_bytes,
            "us": step_us,
            "gb_per_s": step_gbps,
            "fraction_of_copy": step_gbps / copy["gb_per_s"],
        },
    }
