"""Session-15 probe: batched decode t/s with the fp16 decode's split stride (new) against one split a block (old),
in one process, the runs alternating; 9B at three depths, 27B at two (throwaway driver, results committed)."""
import json, os, sys, time
import numpy as np
import engine.cuda.attention_kernels as ak
from engine.cuda.driver import CudaCard
from engine.cuda.bench.slot_depth import slots_at_depth
from engine.cuda.bench.speed import slot_decode_speed
from engine.cuda.bench.synthetic_weights import random_model_weights
from engine.cuda.slot_decoder import SlotDecoder
from engine.gguf.shapes import shape_config

out = os.environ["OUT"]
os.makedirs(f"{out}/results", exist_ok=True)
plans = {"9b": ((512, 4096, 32768), (1, 2, 4, 8)), "27b": ((512, 32768), (1, 8))}
new_stride = ak.decode_stride
for shape in sys.argv[1:]:
    depths, widths = plans[shape]
    t0 = time.time()
    with CudaCard(0) as card:
        cfg = shape_config(shape)
        w = random_model_weights(card, cfg)
        decs = {}
        for name, rule in (("one_split_a_block", lambda n_splits, n_tokens: n_splits), ("stride", new_stride)):
            ak.decode_stride = rule
            dec = SlotDecoder(card, cfg, w, max(depths) + 160, max(widths), 256)
            with slots_at_depth(dec, max(widths), depths[0]):
                for n in widths:  # capture every width's graph under this rule
                    slot_decode_speed(dec, n, 1)
            decs[name] = dec
        ak.decode_stride = new_stride
        runs = {name: {d: {n: [] for n in widths} for d in depths} for name in decs}
        for d in depths:
            for _ in range(3):
                for name, dec in decs.items():
                    for n in widths:
                        with slots_at_depth(dec, n, d):
                            runs[name][d][n].append(slot_decode_speed(dec, n, 48))
    r = {"shape": shape, "seconds": time.time() - t0, "tokens_per_s": runs}
    json.dump(r, open(f"{out}/results/stride-probe-{shape}.json", "w"), indent=1)
    for d in depths:
        for n in widths:
            a, b = (float(np.median(runs[k][d][n])) for k in ("one_split_a_block", "stride"))
            print(f"{shape} depth {d:6} x{n}: {a:8.1f} -> {b:8.1f} t/s ({b / a:.3f})", flush=True)
