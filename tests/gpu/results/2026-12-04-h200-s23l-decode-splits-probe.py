"""s23l probe: is the flash decode at short depths bound by each split's serial walk over its keys? At depth 512 the
9B's 99 splits a KV head (sized for the card) are cut at 64-key boundaries, so 8 of them hold keys and each warp of
those walks 8 rounds of dependent K/V loads. attn_decode_d256_g4 is taken from 2026-12-04-h200-s23-split-variants.py's
builds (splits aligned to 64 = the committed cut, 32, 16 or 8 keys; sm_90 fatbins) in a recorded slot-indexed step of
the 9B synthetic shape (Q8_0, fp16 KV), 1 and 8 rows at depths 512, 4,096 and 16,384; timed as graphs: the step's
attention decode + merge launches alone and the whole step, the variants alternating, three rounds.
usage: python3 PROBE VARIANTS_DIR OUT.json
"""
import json
import sys
from pathlib import Path

from engine.cuda.bench.microbench import time_graph_ms
from engine.cuda.bench.slot_depth import recorded_step
from engine.cuda.bench.synthetic_weights import random_model_weights
from engine.cuda.driver import CudaCard, Kernel
from engine.cuda.slot_decoder import SlotDecoder
from engine.gguf.shapes import shape_config

variants_dir, out_path = Path(sys.argv[1]), sys.argv[2]
ALIGNS = ("a64", "a32", "a16", "a8")
NAME = "attn_decode_d256_g4"
cfg = shape_config("9b")
card = CudaCard(0)
dec = SlotDecoder(card, cfg, random_model_weights(card, cfg), 16400, 8, 256)
kernels = {}
for a in ALIGNS:
    (image,) = (variants_dir / a).glob("attention-*.fatbin")
    kernels[a] = Kernel(card, NAME, card._cuda.module_from_buffer(image.read_bytes()).get_function(NAME))


def replay(launches, variant: str) -> None:
    for kernel, args, kwargs in launches:
        (kernels[variant] if kernel.name == NAME and variant != "base" else kernel).launch(*args, **kwargs)


res = {"gpu": card.device_name, "rows": []}
for depth in (512, 4096, 16384):
    for width in (1, 8):
        with recorded_step(dec, width, depth) as launches:
            attention = [l for l in launches if l[0].name in (NAME, "attn_merge_gate")]
            for rnd in range(3):
                for variant in ("base", *ALIGNS):
                    att_us = time_graph_ms(card, 20, lambda _: replay(attention, variant)) * 1e3
                    step_us = time_graph_ms(card, 10, lambda _: replay(launches, variant)) * 1e3
                    res["rows"].append({"depth": depth, "width": width, "round": rnd, "variant": variant,
                                        "attention_us": att_us, "step_us": step_us})
                    print(f"depth {depth:5d} width {width} round {rnd} {variant:4s} decode+merge x8 {att_us:7.1f} us  "
                          f"step {step_us:8.1f} us", flush=True)
json.dump(res, open(out_path, "w"), indent=1)
