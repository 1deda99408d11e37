"""Aggregate decode t/s of 1/2/4/8 streams at depths 512 / 4,096 / 32,768 on the synthetic shapes named as arguments,
each depth's widths alternating three times (s15d; s15e ran it on a base tree and a new one in turn, with the
one-off driver of commit 03e69de). JSON goes to $OUT/results/depth-streams-<shape>.json, the medians to stdout.

    OUT=... RIGLLM_COMMIT=... python3 tests/gpu/depth_streams.py 9b 27b     (on a GPU, with RIGLLM_KERNEL_DIR set)
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from engine.cuda.bench.slot_depth import slots_at_depth
from engine.cuda.bench.speed import slot_decode_speed
from engine.cuda.bench.synthetic_weights import random_model_weights
from engine.cuda.driver import CudaCard
from engine.cuda.slot_decoder import SlotDecoder
from engine.gguf.shapes import shape_config

DEPTHS, WIDTHS, REPEATS, STEPS = (512, 4096, 32768), (1, 2, 4, 8), 3, 48


def measure(shape: str) -> dict[int, dict[int, list[float]]]:
    """depth → width → tokens/s of each run."""
    with CudaCard(0) as card:
        cfg = shape_config(shape)
        dec = SlotDecoder(card, cfg, random_model_weights(card, cfg), max(DEPTHS) + 160, max(WIDTHS), 256)
        runs: dict[int, dict[int, list[float]]] = {d: {n: [] for n in WIDTHS} for d in DEPTHS}
        for d in DEPTHS:
            for _ in range(REPEATS):
                for n in WIDTHS:
                    with slots_at_depth(dec, n, d):
                        runs[d][n].append(slot_decode_speed(dec, n, STEPS))
    return runs


def main(shapes: list[str]) -> None:
    out = os.path.join(os.environ["OUT"], "results")
    os.makedirs(out, exist_ok=True)
    for shape in shapes:
        t0 = time.time()
        runs = measure(shape)
        with open(os.path.join(out, f"depth-streams-{shape}.json"), "w") as f:
            json.dump({"shape": shape, "commit": os.environ.get("RIGLLM_COMMIT"), "seconds": time.time() - t0,
                       "steps": STEPS, "tokens_per_s": runs}, f, indent=1)
        for d in DEPTHS:
            med = {n: float(np.median(runs[d][n])) for n in WIDTHS}
            print(f"{shape} depth {d:6}: " + "  ".join(f"x{n} {med[n]:7.1f} ({med[n] / med[1]:.2f}x)" for n in WIDTHS),
                  flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
