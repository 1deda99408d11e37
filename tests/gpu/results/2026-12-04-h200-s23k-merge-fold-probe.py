"""s23k probe: does folding the attention merge + gate into the flash decode pay (issue 30: "attention
prep+decode+merge in fewer launches")? The kernel, attn_decode_d256_g4_merged, comes from
2026-12-04-h200-s23-merge-variants.py beside this file (sm_90 fatbin, loaded beside the committed kernels): the
committed decode, then a ticket per (token, KV head) whose last block merges the G query heads. On the 9B synthetic
shape (Q8_0, fp16 KV, depth 512) one slot-indexed step of 1 and 8 rows is recorded; each attn_merge_gate launch and
the attn_decode_d256_g4 launch before it are replaced by the merged launch. First, per width, the first layer's Q8_1
output of the pair and of the merged launch are compared byte for byte; then the step and the 8 layers' pairs alone
are timed as graphs, base and merged alternating, three rounds.
usage: python3 PROBE FATBIN_DIR OUT.json
"""
import json
import sys
from pathlib import Path

import numpy as np

from engine.cuda.bench.microbench import time_graph_ms
from engine.cuda.bench.profile import replay
from engine.cuda.bench.slot_depth import recorded_step
from engine.cuda.bench.synthetic_weights import random_model_weights
from engine.cuda.driver import CudaCard, Kernel
from engine.cuda.slot_decoder import SlotDecoder
from engine.gguf.shapes import shape_config

fatbin_dir, out_path = Path(sys.argv[1]), sys.argv[2]
cfg = shape_config("9b")
card = CudaCard(0)
dec = SlotDecoder(card, cfg, random_model_weights(card, cfg), 768, 8, 256)
(image,) = fatbin_dir.glob("attention-*.fatbin")
merged = Kernel(card, "attn_decode_d256_g4_merged",
                card._cuda.module_from_buffer(image.read_bytes()).get_function("attn_decode_d256_g4_merged"))
counters = card.alloc(4 * 8 * cfg.n_head_kv, "probe.counters")
counters.fill_zero()


def variant(launches, fold: bool):
    """The launches with each (decode, ..., merge) pair folded into one merged decode launch."""
    if not fold:
        return launches
    out = list(launches)
    for i, (kernel, args, kwargs) in enumerate(launches):
        if kernel.name != "attn_merge_gate":
            continue
        j = max(k for k in range(i) if launches[k][0].name == "attn_decode_d256_g4")
        d = launches[j][1]
        m = args  # (grid, block, part_m, part_l, part_o, n_splits, gate, row stride, head stride, n_head, y, yq, yd)
        out[j] = (merged, (*d, counters, *m[6:]), launches[j][2])
        out[i] = None
    return [l for l in out if l is not None]


res = {"gpu": card.device_name, "rows": [], "same_bytes": {}}
for width in (1, 8):
    with recorded_step(dec, width, 512) as launches:
        first = next(i for i, l in enumerate(launches) if l[0].name == "attn_merge_gate")
        start = max(k for k in range(first) if launches[k][0].name == "attn_decode_d256_g4")
        pair = launches[start:first + 1]
        yq, yd = launches[first][1][11], launches[first][1][12]
        size = width * cfg.n_head * cfg.head_dim
        replay(pair)
        card.synchronize()
        want = (yq.download(np.int8, size), yd.download(np.float32, size // 32))
        yq.fill_zero()
        yd.fill_zero()
        replay(variant(pair, True))
        card.synchronize()
        got = (yq.download(np.int8, size), yd.download(np.float32, size // 32))
        same = bool(np.array_equal(want[0], got[0]) and np.array_equal(want[1].view(np.uint32), got[1].view(np.uint32)))
        res["same_bytes"][width] = same
        print(f"width {width}: merged output same bytes: {same}", flush=True)
        pairs = [l for i, l in enumerate(launches) if l[0].name in ("attn_decode_d256_g4", "attn_merge_gate")]
        for rnd in range(3):
            for fold in (False, True):
                step_us = time_graph_ms(card, 10, lambda _: replay(variant(launches, fold))) * 1e3
                pairs_us = time_graph_ms(card, 20, lambda _: replay(variant(pairs, fold))) * 1e3
                name = "merged" if fold else "base"
                res["rows"].append({"width": width, "round": rnd, "variant": name, "step_us": step_us,
                                    "pairs_us": pairs_us, "layers": len(pairs) // 2})
                print(f"width {width} round {rnd} {name:7s} step {step_us:8.1f} us  8 decode(+merge) {pairs_us:6.1f} us",
                      flush=True)
json.dump(res, open(out_path, "w"), indent=1)
