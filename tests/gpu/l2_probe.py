"""Session-15 probe: decode t/s per L2 prefetch policy on the synthetic shapes (throwaway driver)."""
import json, os, sys, time
from engine.cuda.driver import CudaCard
from engine.cuda.bench.l2_sweep import l2_sweep, render_l2_sweep
from engine.cuda.bench.synthetic_weights import random_model_weights
from engine.gguf.shapes import shape_config

out = os.environ["OUT"]
os.makedirs(f"{out}/results", exist_ok=True)
plans = {"9b": ["0", "0.5", "2", "4", "8", "16", "24", "8:32"], "27b": ["0", "2", "8", "16"]}
for shape in sys.argv[1:]:
    t0 = time.time()
    with CudaCard(0) as card:
        cfg = shape_config(shape)
        w = random_model_weights(card, cfg)
        r = l2_sweep(card, cfg, w, plans[shape])
    r["shape"], r["seconds"] = shape, time.time() - t0
    json.dump(r, open(f"{out}/results/l2-sweep-{shape}.json", "w"), indent=1)
    print(render_l2_sweep(r), f"({r['seconds']:.0f} s)", flush=True)
