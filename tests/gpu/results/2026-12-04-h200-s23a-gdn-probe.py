"""s23a probe: what bounds the GDN recurrence of a decode step (about 8 us a 9B layer on the H200, 202 us of a
~3,000 us step, against 4 MB of state a layer)? The 9B synthetic shape (Q8_0, 8 slots, depth 512): the launches of
one slot-indexed step of 1 and 8 rows are recorded, and the 24 GDN recurrence launches replayed from a graph, then
the whole step, with the recurrence kernel taken from builds of cuda_src/gdn.cu edited as follows (sm_90 fatbins
built by 2026-12-04-h200-s23-gdn-variants.py beside this file, which holds each edit):
  base       unchanged
  empty      returns at once (the launch of the same grid)
  notail     returns after storing its state (no fence, counters, last-block conv advance or gated norm)
  nostore    computes everything but does not store its state
  noprefetch does not issue its share of the out projection's L2 prefetch
  acqrel     the three __threadfence() as fence.acq_rel.gpu
  tailfast   the last block's gated norm keeps its o value from the sum's read and loads z and w beside it
  both       tailfast + acqrel
second call (s23b):
  nonorm     the last block of a head skips the gated norm
  nokey      the last block of a key head skips the q/k conv state's advance
  storelate  the state is stored after the head and key counters, so the fence before them waits for o alone
  earlykey   the key counter is taken once the block's q and k channels are read, and the last block of the key
             head advances their conv state in the middle of the kernel instead of after the head counter
  combo      tailfast + storelate + earlykey
third call (s23e):
  staterw    loads its state and stores it back (times 1.0001), nothing else
  inputs     also loads the token's inputs (the conv of q, k, v, and b, alpha) and meets at the first block-wide
             sum, then stores its state and returns
  noconv     the fused conv skipped (the raw in-projection value taken as the convolved one, no conv state read or
             advanced)
s23f: `new`, a reorder of the conv state's advance (the variants file says which), measured no faster. s23g:
  mb2, mb3   the one-token narrow kernel (gdn_recurrent_conv) with __launch_bounds__ minimum blocks 2 and 3 instead of
             4 (registers free up to 128 and 80 a thread)
usage: python3 PROBE VARIANTS_DIR OUT.json [VARIANT,...]
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
NAMES = tuple(sys.argv[3].split(",")) if len(sys.argv) > 3 else ("base", "empty", "notail", "nostore", "noprefetch",
                                                               "acqrel", "tailfast", "both")
cfg = shape_config("9b")
card = CudaCard(0)
weights = random_model_weights(card, cfg)
dec = SlotDecoder(card, cfg, weights, 768, 8, 256)
modules = {}
for name in NAMES:
    (image,) = (variants_dir / name).glob("gdn-*.fatbin")
    modules[name] = card._cuda.module_from_buffer(image.read_bytes())
kernels: dict[tuple[str, str], Kernel] = {}


def kernel_of(variant: str, base: Kernel) -> Kernel:
    key = (variant, base.name)
    if key not in kernels:
        kernels[key] = Kernel(card, base.name, modules[variant].get_function(base.name))
    return kernels[key]


def replay(launches, variant: str) -> None:
    for kernel, args, kwargs in launches:
        k = kernel_of(variant, kernel) if kernel.name.startswith("gdn_recurrent") else kernel
        k.launch(*args, **kwargs)


res = {"gpu": card.device_name, "rows": []}
for width in (1, 8):
    with recorded_step(dec, width, 512) as launches:
        gdn = [l for l in launches if l[0].name.startswith("gdn_recurrent")]
        names = sorted({l[0].name for l in gdn})
        for rnd in range(3):
            for variant in NAMES:
                g_us = time_graph_ms(card, 20, lambda _: replay(gdn, variant)) * 1e3 / len(gdn)
                s_us = time_graph_ms(card, 10, lambda _: replay(launches, variant)) * 1e3
                res["rows"].append({"width": width, "round": rnd, "variant": variant, "kernels": names,
                                    "gdn_us_per_launch": g_us, "step_us": s_us, "launches": len(launches)})
                print(f"width {width} round {rnd} {variant:10s} gdn {g_us:6.2f} us/launch  step {s_us:8.1f} us",
                      flush=True)
res["registers"] = {f"{v} {name}": k.registers for (v, name), k in sorted(kernels.items())}
print(res["registers"], flush=True)
json.dump(res, open(out_path, "w"), indent=1)
