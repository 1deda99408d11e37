"""s20 probe: where does a GEMV with the RMSNorm folded in (cuda_src/norm_fold.cuh) lose time against the norm kernel
followed by the plain GEMV? Per 9B consumer shape and width (T = 1, 8), each timed as a graph of 32 calls over weight
copies that do not fit L2 together:
  pair     rmsnorm_q8_1 (decode shape) then the plain GEMV
  plain    the GEMV alone
  fold     the counter's memset then the folded GEMV
  nowait   the folded GEMV with a counter already past the slice count (slice blocks work, nobody waits)
  resident the fold with the grid capped at the blocks one wave holds (each block loops over row groups)
Run once per kernel build (RIGLLM_KERNEL_DIR): the committed one, and one without the weight prefetch before the wait.
Ran on 1284dc1 (engine/cuda/norm_fold.py and cuda_src/norm_fold.cuh exist only there: the fold was reverted in
d9fa914); "no-prefetch" is that tree with the two prefetch_row_heads calls removed from gemv_q8.cu, built alongside.
usage: python3 PROBE OUT.json LABEL
"""
import json
import sys

import numpy as np

from engine.cuda.bench.microbench import time_graph_ms
from engine.cuda.bench.synthetic_weights import random_q8_weight
from engine.cuda.driver import CudaCard
from engine.cuda.gemv import GEMV_VARIANTS, alloc_q8_activations, gemv_q8, gemv_variant
from engine.cuda.norm import norm_shape, rmsnorm_q8_1
from engine.cuda.norm_fold import FoldCounters, FoldedNorm

card = CudaCard(0)
out_path, label = sys.argv[1], sys.argv[2]
shapes = [("gdn_in 12352x4096", 12352), ("qkv 10240x4096", 10240), ("gate_up 24576x4096", 24576),
          ("lm_head 248320x4096", 248320)]
k, reps, eps = 4096, 32, 1e-6
res = {"gpu": card.device_name, "label": label, "rows": []}
rng = np.random.default_rng(5)
for name, rows in shapes:
    wbytes = rows * k * 17 // 16
    copies = max(2, min(8, -(-3 * card.l2_bytes // wbytes)))
    ws = [random_q8_weight(card, (rows,), k, 100 + i, f"probe.{i}") for i in range(copies)]
    for tokens in (1, 8):
        x = card.upload(rng.standard_normal((tokens, k)).astype(np.float32), "probe.x")
        nw = card.upload((1 + 0.1 * rng.standard_normal(k)).astype(np.float32), "probe.nw")
        act = alloc_q8_activations(card, k, tokens, "probe.act")
        y = card.alloc(4 * rows * tokens, "probe.y")
        folds = FoldCounters(card, reps, "probe.folds")
        stale = card.upload(np.full(1, 1 << 20, np.uint32), "probe.stale")
        variant = gemv_variant(tokens, rows, k)
        regs = card.kernel(variant).registers
        per_sm = min(16, 65536 // (128 * (-(-regs // 8) * 8)))
        resident = per_sm * card.sm_count
        grid, threads = norm_shape(tokens)

        def pair(i):
            rmsnorm_q8_1(card, x, k, nw, tokens, k, eps, act.xq, act.xd, k, grid, threads)
            gemv_q8(card, ws[i % copies], act, y, tokens)

        def plain(i):
            gemv_q8(card, ws[i % copies], act, y, tokens)

        def fold(i, max_blocks=None):
            if i == 0:
                folds.begin_pass()
            gemv_q8(card, ws[i % copies], act, y, tokens, max_blocks=max_blocks,
                    norm=FoldedNorm(x, nw, eps, folds.next()))

        def nowait(i):
            gemv_q8(card, ws[i % copies], act, y, tokens, norm=FoldedNorm(x, nw, eps, stale))

        def norm_alone(i):
            rmsnorm_q8_1(card, x, k, nw, tokens, k, eps, act.xq, act.xd, k, grid, threads)

        r = {"shape": name, "tokens": tokens, "variant": variant, "registers": regs, "resident_blocks": resident,
             "grid": -(-rows // (GEMV_VARIANTS[tokens][variant].rows_per_warp * 4))}
        for key, body in (("norm", norm_alone), ("pair", pair), ("plain", plain), ("fold", fold), ("nowait", nowait),
                          ("resident", lambda i: fold(i, resident))):
            folds.begin_pass()  # time_graph_ms runs body(0) eagerly first
            r[key + "_us"] = time_graph_ms(card, reps, body) * 1e3
        res["rows"].append(r)
        print(f"{label} {name:22s} T={tokens} {variant:22s} grid {r['grid']:6d} resident {resident:5d}: "
              + " ".join(f"{key} {r[key + '_us']:7.2f}" for key in ("norm", "pair", "plain", "fold", "nowait",
                                                                    "resident")), flush=True)
        for buf in (x, nw, act.xq, act.xd, y, folds.buf, stale):
            buf.free()
    for w in ws:
        w.qs.free()
        w.d.free()
json.dump(res, open(out_path, "w"), indent=1)
