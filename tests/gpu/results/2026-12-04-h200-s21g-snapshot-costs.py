"""s21g probe: what the CUDA backend's snapshot pricing (`CudaBackend.snapshot_costs`) reads on the 9B synthetic shape
(8 slots, context 4,608, f16 KV, no MTP) after it has timed its own work: three prefills of 54 tokens, a snapshot at 50
and a restore of it, then a 2,048-token prompt (chunks of 512) and its snapshot and restore; the priced parts for
several prefix lengths with the scheduler's two decisions.
usage: python3 PROBE OUT.json
"""
import json
import sys
import time

import numpy as np

from engine.cuda.backend import CudaBackend
from engine.cuda.bench.synthetic_weights import per_card_weights
from engine.gguf.shapes import shape_config

cfg = shape_config("9b")
be = CudaBackend(None, context=4608, slots=8, config=cfg, weights_for=per_card_weights(cfg), speculative=False)
ids = np.random.default_rng(1).integers(10, cfg.vocab_size - 10, 2048).tolist()
res = {"gpu": be.card.device_name, "walls_ms": {}, "costs": {}}


def wall(name, fn):
    be.card.synchronize()
    t = time.perf_counter()
    out = fn()
    be.card.synchronize()
    res["walls_ms"][name] = 1e3 * (time.perf_counter() - t)
    return out


for i in range(3):
    be.reset_slot(0)
    wall(f"prefill 54 #{i}", lambda: be.prefill_slot(0, ids[:54]))
be.reset_slot(0)
be.prefill_slot(0, ids[:50])
snap = wall("snapshot at 50", lambda: be.snapshot_slot(0))
wall("restore at 50", lambda: be.restore_slot(1, snap))
be.reset_slot(2)
wall("prefill 2048", lambda: be.prefill_slot(2, ids))
snap = wall("snapshot at 2048", lambda: be.snapshot_slot(2))
wall("restore at 2048", lambda: be.restore_slot(3, snap))
for tokens in (50, 200, 500, 1000, 2048, 4096):
    c = be.snapshot_costs(tokens)
    res["costs"][tokens] = {"copy_out_ms": 1e3 * c.copy_out, "copy_in_ms": 1e3 * c.copy_in,
                            "prefill_ms": 1e3 * c.prefill, "keep": c.keep_pays(), "restore": c.restore_pays()}
for k, v in res["walls_ms"].items():
    print(f"{k:<22} {v:8.2f} ms")
print("tokens  copy out ms  copy in ms  prefill ms  keep  restore")
for t, c in res["costs"].items():
    print(f"{t:>6} {c['copy_out_ms']:>12.2f} {c['copy_in_ms']:>11.2f} {c['prefill_ms']:>11.2f}  {c['keep']!s:>5} {c['restore']!s:>7}")
json.dump(res, open(sys.argv[1], "w"), indent=1)
