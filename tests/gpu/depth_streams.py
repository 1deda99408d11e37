"""Aggregate decode t/s of 1/2/4/8 streams at depths 512 / 4,096 / 32,768 (synthetic shapes given as arguments), the
runs of each depth alternating widths three times; JSON to $OUT/results (s15d, and tests/gpu/ab_depth.sh's A/B)."""
import json, os, sys, time
import numpy as np
from engine.cuda.driver import CudaCard
from engine.cuda.bench.slot_depth import slots_at_depth
from engine.cuda.bench.speed import slot_decode_speed
from engine.cuda.bench.synthetic_weights import random_model_weights
from engine.cuda.slot_decoder import SlotDecoder
from engine.gguf.shapes import shape_config

out = os.environ["OUT"]
os.makedirs(f"{out}/results", exist_ok=True)
depths, widths = (512, 4096, 32768), (1, 2, 4, 8)
for shape in sys.argv[1:]:
    t0 = time.time()
    with CudaCard(0) as card:
        cfg = shape_config(shape)
        dec = SlotDecoder(card, cfg, random_model_weights(card, cfg), max(depths) + 160, max(widths), 256)
        runs = {d: {n: [] for n in widths} for d in depths}
        for d in depths:
            for _ in range(3):
                for n in widths:
                    with slots_at_depth(dec, n, d):
                        runs[d][n].append(slot_decode_speed(dec, n, 48))
    json.dump({"shape": shape, "commit": os.environ.get("RIGLLM_COMMIT"), "seconds": time.time() - t0,
               "steps": 48, "tokens_per_s": runs}, open(f"{out}/results/depth-streams-{shape}.json", "w"), indent=1)
    for d in depths:
        med = {n: float(np.median(runs[d][n])) for n in widths}
        print(f"{shape} depth {d:6}: " + "  ".join(f"x{n} {med[n]:7.1f} ({med[n] / med[1]:.2f}x)" for n in widths),
              flush=True)
