"""s21d probe: what a request arriving at a busy `rigllm serve` costs the card's other streams, part by part, on the 9B
synthetic shape (weights made on the card; 8 slots, context 768, f16 KV, no MTP, as serve_streams' server):
prefill of a 54-token prompt whole and split at its turn start (50), the prefix cache's snapshot (the slot's KV rows
and GDN states downloaded) and restore (uploaded), a decode step of 1 / 4 rows; and the copy rates of one 50 MB
buffer to and from pageable and pinned host memory. Each part synchronized, the median of 5.
usage: python3 PROBE OUT.json
"""
import json
import statistics
import sys
import time

import numpy as np

from engine.cuda.backend import CudaBackend
from engine.cuda.bench.synthetic_weights import per_card_weights
from engine.generation.sampler import SamplingParams
from engine.generation.slots import SlotRequest
from engine.gguf.shapes import shape_config

cfg = shape_config("9b")
be = CudaBackend(None, context=768, slots=8, config=cfg, weights_for=per_card_weights(cfg), speculative=False)
card = be.card
rng = np.random.default_rng(1)
ids = rng.integers(10, cfg.vocab_size - 10, 54).tolist()
TURN = 50
res = {"gpu": card.device_name, "parts_ms": {}}


def timed(name, fn, reps=5, setup=None):
    out = []
    for _ in range(reps):
        if setup:
            setup()
        card.stream.synchronize()
        t = time.perf_counter()
        fn()
        card.stream.synchronize()
        out.append(1e3 * (time.perf_counter() - t))
    res["parts_ms"][name] = {"median": statistics.median(out), "all": out}
    print(f"{name:<36} {statistics.median(out):8.2f} ms   {' '.join(f'{x:.2f}' for x in out)}", flush=True)


timed("prefill 54 tokens", lambda: be.prefill_slot(0, ids), setup=lambda: be.reset_slot(0))
timed("prefill 50 tokens", lambda: be.prefill_slot(0, ids[:TURN]), setup=lambda: be.reset_slot(0))
be.reset_slot(0)
be.prefill_slot(0, ids[:TURN])
snaps = []
timed("snapshot at 50", lambda: snaps.append(be.snapshot_slot(0)))
res["snapshot_bytes"] = snaps[0].nbytes
timed("restore at 50", lambda: be.restore_slot(1, snaps[0]), setup=lambda: be.reset_slot(1))
timed("prefill 4 tokens at 50", lambda: be.prefill_slot(1, ids[TURN:]), setup=lambda: be.restore_slot(1, snaps[0]))
greedy = SlotRequest(SamplingParams(temperature=0.0), ids)
for s in range(4):
    be.reset_slot(s)
    be.prefill_slot(s, ids)
    be.begin(s, greedy)
timed("decode step, 1 row", lambda: be.step({0: 11}))
timed("decode step, 4 rows", lambda: be.step({s: 11 for s in range(4)}))

buf = card.alloc(50 << 20, "probe.copy")
page = np.empty(50 << 20, np.uint8)
pin = card.pinned(50 << 20, np.uint8)
timed("50 MB down, pageable", lambda: buf.download(np.uint8, 50 << 20))
timed("50 MB up, pageable", lambda: buf.upload(page))
timed("50 MB down, pinned async", lambda: buf.download_async(pin))
timed("50 MB up, pinned async", lambda: buf.upload_async(pin))
json.dump(res, open(sys.argv[1], "w"), indent=1)
