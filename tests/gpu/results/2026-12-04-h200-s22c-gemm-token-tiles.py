"""s22c probe: the Q8_0 GEMM's 16-, 32- and 64-token tiles inside real 9B prefill chunks (synthetic weights, 8 slots,
context 768, f16 KV, as serve_streams' server): for each chunk length and tile, the chunk's pass replayed from a graph
and its GEMMs' share (profile.kernel_breakdown), every GEMM of the pass forced to that tile.
usage: python3 PROBE OUT.json
"""
import json, sys
import numpy as np
from engine.cuda import gemm
from engine.cuda.backend import CudaBackend
from engine.cuda.bench.profile import kernel_breakdown
from engine.cuda.bench.synthetic_weights import per_card_weights
from engine.gguf.shapes import shape_config

cfg = shape_config("9b")
be = CudaBackend(None, context=768, slots=8, config=cfg, weights_for=per_card_weights(cfg), speculative=False)
card = be.card
d = be.stages[0].decoder
seq, fwd = d.seqs[0], d.fwd
res = {"gpu": card.device_name, "chunks": {}}
chosen = gemm.gemm_token_tile
print(f"{'tokens':>6} " + " ".join(f"{'whole t' + str(t):>11} {'gemm t' + str(t):>10}" for t in gemm.GEMM_TOKEN_TILES))
for n in (9, 12, 16, 20, 24, 32, 40, 48, 54, 64, 80, 96, 112, 128, 160, 192, 256):
    be.reset_slot(0)
    be.prefill_slot(0, list(range(100, 108)))
    card.stream.synchronize()
    fwd.set_batch(np.ones(n, np.int32), seq)
    row = {}
    for tile in gemm.GEMM_TOKEN_TILES:
        gemm.gemm_token_tile = lambda _n, tile=tile: tile
        b = kernel_breakdown(card, lambda: fwd.run(n, seq))
        g = sum(k["us"] for name, k in b["kernels"].items() if name.startswith("gemm_"))
        row[tile] = {"whole_us": b["whole_us"], "gemm_us": g, "kernels": b["kernels"]}
    gemm.gemm_token_tile = chosen
    res["chunks"][n] = row
    print(f"{n:>6} " + " ".join(f"{row[t]['whole_us']:>11.0f} {row[t]['gemm_us']:>10.0f}" for t in row), flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
