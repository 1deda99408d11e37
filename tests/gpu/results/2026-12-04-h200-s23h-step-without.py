"""s23h probe: what each kernel costs inside a decode step, as the step's time without it. The 9B synthetic shape
(Q8_0, depth 512, 8 slots): one slot-indexed step of 1 and 8 rows is recorded (the launches a step graph holds); then,
for each kernel name, the step is replayed from a graph with that kernel's launches left out, beside the whole step,
three rounds. The outputs of a step missing a kernel are wrong; only the time is read. A kernel's in-step cost (whole
minus without) includes its launch boundary and whatever of its neighbours' tails it overlapped; the bench's
per-kernel parts (`profile.kernel_breakdown`) time each kernel's launches back to back instead.
usage: python3 PROBE OUT.json
"""
import json
import statistics
import sys

from engine.cuda.bench.microbench import time_graph_ms
from engine.cuda.bench.profile import replay
from engine.cuda.bench.slot_depth import recorded_step
from engine.cuda.bench.synthetic_weights import random_model_weights
from engine.cuda.driver import CudaCard
from engine.cuda.slot_decoder import SlotDecoder
from engine.gguf.shapes import shape_config

out_path = sys.argv[1]
cfg = shape_config("9b")
card = CudaCard(0)
dec = SlotDecoder(card, cfg, random_model_weights(card, cfg), 768, 8, 256)


res = {"gpu": card.device_name, "widths": {}}
for width in (1, 8):
    with recorded_step(dec, width, 512) as launches:
        names = sorted({k.name for k, _, _ in launches})
        whole, without = [], {n: [] for n in names}
        for _ in range(3):
            for name in names:
                whole.append(time_graph_ms(card, 10, lambda _: replay(launches)) * 1e3)
                kept = [l for l in launches if l[0].name != name]
                without[name].append(time_graph_ms(card, 10, lambda _: replay(kept)) * 1e3)
        w = statistics.median(whole)
        rows = {}
        for name in names:
            count = sum(1 for k, _, _ in launches if k.name == name)
            cost = w - statistics.median(without[name])
            rows[name] = {"launches": count, "in_step_us": cost, "us_per_launch": cost / count,
                          "without_us": without[name]}
        res["widths"][width] = {"whole_us": w, "whole_all": whole, "kernels": rows}
        print(f"width {width}: whole step {w:.1f} us (spread {min(whole):.1f}-{max(whole):.1f})", flush=True)
        for name, r in sorted(rows.items(), key=lambda kv: -kv[1]["in_step_us"]):
            print(f"  {name:32s} x{r['launches']:3d}  {r['in_step_us']:8.1f} us  {r['us_per_launch']:6.2f} us a launch",
                  flush=True)
json.dump(res, open(out_path, "w"), indent=1)
