"""s21b probe: prefill GEMM tiles in the committed tile's loop order (gemm_q8.cu's gemm_probe_t<RI><TJ>k<BK>s<STAGES>:
4x4 outputs a thread with 128- or 256-value stages, 8x4 with 128; dynamic shared memory) against the committed
64 x 64 tile (gemm_q8_0_q8_1 and _db). Each variant: bit-compared to _db on random inputs (tails in rows, tokens
and K included), then timed as a graph of 10 calls on prefill shapes, with the DP4A peak and fold ceiling of the same
run. usage: python3 PROBE OUT.json
"""
import json
import re
import sys

import numpy as np

from engine.cuda.bench.microbench import dp4a_fold_ceilings, dp4a_peak, time_graph_ms
from engine.cuda.bench.synthetic_weights import random_q8_weight
from engine.cuda.driver import CudaCard
from engine.cuda.gemm import gemm_q8
from engine.cuda.gemv import alloc_q8_activations, matmul_args

card = CudaCard(0)
out_path = sys.argv[1]
PROBES = ["gemm_probe_t44k128s2", "gemm_probe_t44k256s1", "gemm_probe_t44k256s2", "gemm_probe_t84k128s1"]


def tile_of(name):
    """(rows, tokens, dynamic shared bytes) of a probe tile."""
    m = re.match(r"gemm_probe_t(\d)(\d)k(\d+)s(\d)", name)
    ri, tj, bk, stages = (int(g) for g in m.groups())
    br, bt = 16 * ri, 16 * tj
    smem = stages * ((br + bt) * (bk + 16) + (bk // 32) * 16 * (ri + tj) * 4)
    return br, bt, smem


def run(name, w, act, y, tokens, residual=None):
    if name in ("", "_db"):
        gemm_q8(card, w, act, y, tokens, residual=residual, staging=name)
        return
    br, bt, smem = tile_of(name)
    ends = matmul_args(w, act, y, tokens, residual)
    kernel = card.kernel(name)
    if smem > 48 * 1024:
        kernel.set_max_dynamic_shared(smem)
    kernel.launch(((tokens + bt - 1) // bt, (w.rows + br - 1) // br), 256, w.qs, w.d, act.xq, act.xd, y,
                             residual, np.int32(w.rows), np.int32(w.k), *ends, np.int32(tokens), shared=smem)


def random_acts(rng, tokens, k):
    act = alloc_q8_activations(card, k, tokens, "probe.act")
    act.xq.upload(rng.integers(-127, 128, tokens * k, dtype=np.int8))
    act.xd.upload(rng.uniform(0.001, 0.02, tokens * (k // 32)).astype(np.float32))
    return act


res = {"gpu": card.device_name, "sm_count": card.sm_count, "bits": [], "timing": []}
peak = dp4a_peak(card)["tops"]
res["dp4a_peak_tops"] = peak
res["fold_ceilings"] = dp4a_fold_ceilings(card, peak)
res["registers"] = {n: card.kernel(n).registers for n in ["gemm_q8_0_q8_1_db", *PROBES]}
rng = np.random.default_rng(21)
for rows, k, tokens in [(4128, 4192, 300), (200, 32, 7), (12352, 4096, 256), (100, 1056, 129), (24576, 4096, 512)]:
    w = random_q8_weight(card, (rows // 2, rows - rows // 2), k, 5, "probe.bits.w")
    act = random_acts(rng, tokens, k)
    resid = card.upload(rng.standard_normal(rows * tokens).astype(np.float32), "probe.resid")
    outs = {}
    for name in ["_db", "", *PROBES]:
        y = card.alloc(4 * rows * tokens, "probe.y")
        y.upload(np.full(rows * tokens, np.nan, np.float32))
        run(name, w, act, y, tokens, residual=resid)
        outs[name] = y.download(np.float32, rows * tokens)
        y.free()
    for name in ["", *PROBES]:
        same = bool(np.array_equal(outs[name], outs["_db"]))
        res["bits"].append({"kernel": name or "single", "rows": rows, "k": k, "tokens": tokens, "same": same})
        print("bits", name or "single", rows, k, tokens, same, flush=True)
    for b in (w.qs, w.d, act.xq, act.xd, resid):
        b.free()

shapes = [("9b gate_up", 24576, 4096), ("9b down", 4096, 12288), ("27b gate_up", 34816, 5120)]
for label, rows, k in shapes:
    w = random_q8_weight(card, (rows,), k, 7, "probe.w")
    for tokens in (256, 512):
        act = random_acts(rng, tokens, k)
        y = card.alloc(4 * rows * tokens, "probe.y")
        ops = 2 * rows * k * tokens
        row = {"shape": label, "rows": rows, "k": k, "tokens": tokens, "tops": {}}
        for name in ["_db", *PROBES]:
            ms = min(time_graph_ms(card, 10, lambda _, n=name: run(n, w, act, y, tokens)) for _ in range(3))
            row["tops"][name or "single"] = ops / (ms * 1e-3) / 1e12
        res["timing"].append(row)
        print(label, tokens, " ".join(f"{n}={t:.1f}({t / peak:.0%})" for n, t in row["tops"].items()), flush=True)
        for b in (act.xq, act.xd, y):
            b.free()
    w.qs.free()
    w.d.free()
json.dump(res, open(out_path, "w"), indent=1)
print("peak", peak, res["fold_ceilings"], res["registers"])
