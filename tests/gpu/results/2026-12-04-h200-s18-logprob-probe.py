"""s18 probe: what a top-20 logprob step costs on the card, per kernel, at 1 and 4 rows; the record read-back;
and the host's conversion of the records."""
import json, sys, time, timeit
import numpy as np
from engine.cuda.driver import CudaCard
from engine.cuda.logprobs import LOGPROB_DTYPE, alloc_logprob_scratch, token_logprobs_of
from engine.cuda.sampling import default_parts
from engine.cuda.bench.microbench import time_graph_ms

card = CudaCard(0)
V = 248320
try:  # cac9ea1 on: at most 256 slices, one key buffer; 41f7204 (s18a): the sampler's slices, logit and id buffers
    from engine.cuda.logprobs import logprob_parts
    parts = logprob_parts(card, V)
except ImportError:
    parts = default_parts(card, V)
res = {"gpu": card.device_name, "parts": parts, "rows": {}}
rng = np.random.default_rng(3)
def scratch_args(sc):
    return (sc.candidates,) if hasattr(sc, "candidates") else (sc.cand_logit, sc.cand_id)


for rows in (1, 4):
    logits = card.upload((rng.standard_normal(V * rows) * 3).astype(np.float32), "p.logits")
    wanted = card.upload(np.ones(8, np.int32), "p.wanted")
    row_slot = card.upload(np.arange(8, dtype=np.int32), "p.rows")
    tok = card.upload(np.zeros(8, np.int32), "p.tok")
    out = card.alloc(LOGPROB_DTYPE.itemsize * rows, "p.out")
    sc = alloc_logprob_scratch(card, parts, rows, "p")
    v = np.int32(V)
    part = lambda i: card.kernel("logprob_partial").launch((parts, rows), 256, logits, v, wanted, sc.partials, *scratch_args(sc), row_slot)
    fin = lambda i: card.kernel("logprob_final").launch((1, rows), 256, logits, v, wanted, sc.partials, *scratch_args(sc), np.int32(parts), tok, out, row_slot)
    r = {"partial_us": 1e3 * time_graph_ms(card, 50, part), "final_us": 1e3 * time_graph_ms(card, 50, fin)}
    host = card.pinned(LOGPROB_DTYPE.itemsize * rows, np.uint8)
    s, e = card.event(), card.event()
    ts = []
    for _ in range(50):
        card.synchronize(); s.record(); out.download_async(host); e.record(); e.synchronize(); ts.append(1e3 * e.elapsed_ms(s))
    r["d2h_us_median"] = float(np.median(ts))
    recs = host.view(LOGPROB_DTYPE)
    n = 2000
    r["host_convert_us"] = min(timeit.repeat(lambda: token_logprobs_of(recs[list(range(rows))], [20] * rows), number=n, repeat=5)) / n * 1e6
    res["rows"][rows] = r
    print(rows, r, flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
card.close()
