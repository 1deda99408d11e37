"""s23c probe: does folding SwiGLU (and its Q8_1 quantize) into the gate+up GEMV pay? Issue 30 lists "SwiGLU in the
down projection's prologue"; there every one of the down GEMV's 4,096 warps would recompute all 12,288 values from
96 KB of gate and up rows (about 400 MB of L2 reads a layer), so this folds it into the gate+up GEMV's epilogue
instead: after storing its rows, a warp counts itself into its 32-value block of h (a ticket per block, 64 / R warps
each: gate rows 32b.. and up rows d_ff + 32b..), and the warp that completes a block reads its 32 gate and up values
back (L2), applies SiLU(gate) * up and quantizes them with swiglu_q8_1's arithmetic. The kernels come from
2026-12-04-h200-s23-swiglu-variants.py beside this file (gemv_q8.cu + that epilogue; gemv_q8_t1_swiglu and
gemv_q8_t8_r4_u1_m3_swiglu, the gate+up GEMV's kernels at 1 and 8 rows; sm_90 fatbin), loaded beside the committed
kernels.
On the 9B synthetic shape (Q8_0, depth 512) one slot-indexed step of 1 and 8 rows is recorded; every gate+up GEMV
followed by swiglu_q8_1 is replaced by the fused launch. Timed as graphs, three rounds alternating:
  base       the recorded step
  base_nopf  the step with swiglu_q8_1's L2 prefetch of the down projection removed
  fused      the fused GEMV (its extra z layer of blocks issues that prefetch) and no SwiGLU launch
  fused_nopf the fused GEMV without the prefetch
and the 32 layers' pairs alone (GEMV + SwiGLU against the fused GEMV). First, per width, the fused launch's Q8_1
output is compared byte for byte with the pair's.
s23d ran the same probe on the second form (`block` in the variants file): a ticket per block of threads instead of per warp (every
thread fences its stores, the block meets at a barrier, thread 0 counts the block in; 64 / (R * 4) blocks a ticket),
the completing block's warps quantizing the block of h for the T tokens in turn.
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
weights = random_model_weights(card, cfg)
dec = SlotDecoder(card, cfg, weights, 768, 8, 256)
(image,) = fatbin_dir.glob("gemv_q8-*.fatbin")
module = card._cuda.module_from_buffer(image.read_bytes())
counters = card.alloc(4 * (cfg.d_ff // 32), "probe.counters")
counters.fill_zero()
fused_kernels: dict[str, Kernel] = {}


def fused_of(name: str) -> Kernel:
    if name not in fused_kernels:
        fused_kernels[name] = Kernel(card, name + "_swiglu", module.get_function(name + "_swiglu"))
    return fused_kernels[name]


def variant_launches(launches, variant: str):
    out, i = [], 0
    while i < len(launches):
        kernel, args, kwargs = launches[i]
        nxt = launches[i + 1] if i + 1 < len(launches) else None
        if nxt is not None and nxt[0].name == "swiglu_q8_1" and kernel.name.startswith("gemv_q8"):
            sw = nxt[1]
            if variant.startswith("fused"):
                prefetch = variant == "fused"
                grid = (args[0], 1, 2) if prefetch else args[0]
                out.append((fused_of(kernel.name), (grid, *args[1:], np.int32(cfg.d_ff), counters, sw[8], sw[9],
                                                    sw[10] if prefetch else None,
                                                    sw[11] if prefetch else np.int64(0)), kwargs))
                i += 2
                continue
            out.append(launches[i])
            if variant == "base_nopf":
                grid = sw[0] if isinstance(sw[0], int) else sw[0][0]
                out.append((nxt[0], (grid, *sw[1:10], None, np.int64(0)), nxt[2]))
            else:
                out.append(nxt)
            i += 2
            continue
        out.append(launches[i])
        i += 1
    return out


res = {"gpu": card.device_name, "rows": [], "same_bytes": {}}
for width in (1, 8):
    with recorded_step(dec, width, 512) as launches:
        pairs = [(launches[i], launches[i + 1]) for i in range(len(launches) - 1)
                 if launches[i + 1][0].name == "swiglu_q8_1"]
        gemv, sw = pairs[0]
        xq, xd = sw[1][8], sw[1][9]
        replay([gemv, sw])
        card.synchronize()
        want = (xq.download(np.int8, width * cfg.d_ff), xd.download(np.float32, width * cfg.d_ff // 32))
        xq.fill_zero()
        xd.fill_zero()
        replay(variant_launches([gemv, sw], "fused"))
        card.synchronize()
        got = (xq.download(np.int8, width * cfg.d_ff), xd.download(np.float32, width * cfg.d_ff // 32))
        same = bool(np.array_equal(want[0], got[0]) and np.array_equal(want[1].view(np.uint32), got[1].view(np.uint32)))
        res["same_bytes"][width] = same
        print(f"width {width}: gate+up kernel {gemv[0].name}, fused output same bytes: {same}", flush=True)
        flat_pairs = [l for p in pairs for l in p]
        for rnd in range(3):
            for variant in ("base", "base_nopf", "fused", "fused_nopf"):
                step_us = time_graph_ms(card, 10, lambda _: replay(variant_launches(launches, variant))) * 1e3
                pair_us = time_graph_ms(card, 10, lambda _: replay(variant_launches(flat_pairs, variant))) * 1e3
                res["rows"].append({"width": width, "round": rnd, "variant": variant, "step_us": step_us,
                                    "pairs_us": pair_us, "pairs": len(pairs)})
                print(f"width {width} round {rnd} {variant:10s} step {step_us:8.1f} us  32 gate+up(+swiglu) "
                      f"{pair_us:7.1f} us", flush=True)
json.dump(res, open(out_path, "w"), indent=1)
