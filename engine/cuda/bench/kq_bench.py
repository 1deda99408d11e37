"""The K-quant GEMV sweep of `rigllm bench --synthetic SHAPE --weights q4_k_m|q5_k_m|q6_k --gemv-sweep 1`.

Every T = 1 K-quant GEMV variant (kq_weight.KQ_T1_VARIANTS) on every decode matrix of a shape in one K
type: read GB/s per matrix, the step's GEMV time per variant, and the fastest variant for narrow and for
wide matrices (kq_weight.WIDE_ROWS), to choose kq_weight.DEFAULT_KQ_T1. Same method as
microbench.gemv_sweep: random copies rotated past L2, replayed from a CUDA graph.
"""

from __future__ import annotations

import math
from typing import Any

from gguf import GGMLQuantizationType

from engine.cuda.driver import CudaCard
from engine.cuda.gemv import alloc_q8_activations
from engine.cuda.kq_layout import device_bytes
from engine.cuda.kq_weight import DEFAULT_KQ_T1, KQ_T1_VARIANTS, WIDE_ROWS, T1Choice, gemv_kq
from engine.cuda.bench.microbench import decode_gemvs, time_graph_ms
from engine.cuda.bench.synthetic_weights import random_kq_weight
from engine.gguf.shapes import shape_config


def kq_gemv_sweep(card: CudaCard, shape: str, qtype: GGMLQuantizationType, reps: int = 50,
                  l2_multiple: int = 4) -> dict[str, Any]:
    """Every T = 1 variant on every decode matrix of `shape` stored as `qtype` (see the module docstring)."""
    variants = tuple(KQ_T1_VARIANTS)
    per_token_us = dict.fromkeys(variants, 0.0)
    matrices = []
    for s in decode_gemvs(shape_config(shape)):
        nbytes = device_bytes(qtype, s.rows, s.k)
        copies = max(2, min(8, math.ceil(l2_multiple * card.l2_bytes / nbytes)))
        weights = [random_kq_weight(card, qtype, (s.rows,), s.k, 2000 + i, f"bench.{s.name}.{i}") for i in range(copies)]
        x = alloc_q8_activations(card, s.k, 1, "bench.x")  # values do not change the speed
        x.xq.fill_zero()
        x.xd.fill_zero()
        y = card.alloc(4 * s.rows, "bench.y")
        try:
            us = {v: 1e3 * time_graph_ms(card, reps, lambda i, v=v: gemv_kq(card, weights[i % copies], x, y, 1, variant=v))
                  for v in variants}
        finally:
            for w in weights:
                w.data.free()
            for buf in (x.xq, x.xd, y):
                buf.free()
        for v in variants:
            per_token_us[v] += us[v] * s.count
        matrices.append({"name": s.name, "rows": s.rows, "k": s.k, "count_per_token": s.count, "bytes": nbytes,
                         "gb_per_s": {f"t1{v}": round(nbytes / (us[v] * 1e-6) / 1e9, 1) for v in variants}})
    ranking = sorted(variants, key=per_token_us.__getitem__)
    default = DEFAULT_KQ_T1[qtype]
    fastest = fastest_by_width(matrices, variants)
    return {"device": card.device_name, "shape": shape, "type": qtype.name,
            "default": {"narrow": f"t1{default.narrow}", "wide": f"t1{default.wide}",
                        "per_token_us": round(class_time_us(matrices, default), 2)},
            "fastest_by_width": {"narrow": f"t1{fastest.narrow}", "wide": f"t1{fastest.wide}",
                                 "per_token_us": round(class_time_us(matrices, fastest), 2)},
            "matrices": matrices, "per_token_us": {f"t1{v}": round(per_token_us[v], 2) for v in ranking},
            "best": f"t1{ranking[0]}"}


def _matrix_us(m: dict[str, Any], variant: str) -> float:
    """One step's time in matrix `m` (all its launches) with `variant`, from the sweep's measured GB/s."""
    return m["count_per_token"] * m["bytes"] / (m["gb_per_s"][f"t1{variant}"] * 1e3)


def class_time_us(matrices: list[dict[str, Any]], choice: T1Choice) -> float:
    """One step's GEMV time if each matrix ran `choice`'s variant for its width."""
    return sum(_matrix_us(m, choice.for_rows(m["rows"])) for m in matrices)


def fastest_by_width(matrices: list[dict[str, Any]], variants: tuple[str, ...]) -> T1Choice:
    """The variant with the least summed time over the narrow matrices, and over the wide ones (what
    DEFAULT_KQ_T1 should hold for this type, if the sweep's shape is representative)."""
    def fastest(wide: bool) -> str:
        chosen = [m for m in matrices if (m["rows"] >= WIDE_ROWS) == wide]
        return min(variants, key=lambda v: sum(_matrix_us(m, v) for m in chosen))
    return T1Choice(fastest(False), fastest(True))
