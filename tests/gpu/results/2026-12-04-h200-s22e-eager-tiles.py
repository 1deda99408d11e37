"""s22e probe: eager prefills (what a request's prompt costs: the launches and the card, events around the chunk, as
`rigllm bench`'s prefill, but the median of 9 rounds) of short prompts on the 9B synthetic shape, every GEMM forced to
the 16-, 32- or 64-token tile in turn within each round, Q8_0 and Q4_K_M weights. s22i ran it on the 27B shape with
Q8_0 weights, 5 rounds and fewer lengths (the optional arguments; their defaults are s22e's run).
usage: python3 PROBE OUT.json [SHAPE [WEIGHTS,... [ROUNDS [LENGTHS,...]]]]
"""
import json, statistics, sys
import numpy as np
from engine.cuda import gemm
from engine.cuda.backend import CudaBackend
from engine.cuda.bench.synthetic_weights import per_card_weights
from engine.gguf.shapes import shape_config

args = sys.argv[2:]
cfg = shape_config(args[0] if args else "9b")
weight_types = args[1].split(",") if len(args) > 1 else ["q8_0", "q4_k_m"]
rounds = int(args[2]) if len(args) > 2 else 9
lengths = [int(n) for n in args[3].split(",")] if len(args) > 3 else [12, 16, 24, 32, 40, 48, 54, 64, 80, 96, 112, 128]
rule = gemm.gemm_token_tile
res = {"lengths": {}}
for weights in weight_types:
    be = CudaBackend(None, context=768, slots=2, config=cfg, weights_for=per_card_weights(cfg, weights),
                     speculative=False)
    card = be.card
    res["gpu"] = card.device_name
    out = res["lengths"][weights] = {}
    print(f"{weights}: median ms of {rounds} eager prefills (16 / 32 / 64-token tiles, the rule's pick)", flush=True)
    for n in lengths:
        ids = np.random.default_rng(n).integers(10, cfg.vocab_size - 10, n).tolist()
        times = {t: [] for t in gemm.GEMM_TOKEN_TILES}
        for _ in range(rounds):
            for tile in gemm.GEMM_TOKEN_TILES:
                gemm.gemm_token_tile = lambda _n, tile=tile: tile
                be.reset_slot(0)
                card.synchronize()
                start, end = card.event(), card.event()
                start.record()
                be.prefill_slot(0, ids)
                end.record()
                end.synchronize()
                times[tile].append(end.elapsed_ms(start))
        gemm.gemm_token_tile = rule
        out[n] = {"median_ms": {t: statistics.median(v) for t, v in times.items()}, "all_ms": times, "rule": rule(n)}
        print(f"{n:>5} " + " ".join(f"{statistics.median(v):8.2f}" for v in times.values()) + f"   rule {rule(n)}",
              flush=True)
    be.close()
json.dump(res, open(sys.argv[1], "w"), indent=1)
