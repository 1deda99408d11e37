"""s22b probe: a prefill chunk's host and card time on the 9B synthetic shape (8 slots, context 768, f16 KV, no MTP,
as serve_streams' server), with the committed Kernel.launch against the launch it replaced (prepared_async_call,
copied here), and where a short chunk's card time goes per kernel (profile.kernel_breakdown: each kernel's launches
replayed from a graph) for chunks of 4, 16, 54 and 128 tokens.
usage: python3 PROBE OUT.json
"""
import json, statistics, sys, time
import numpy as np
from engine.cuda import driver
from engine.cuda.backend import CudaBackend
from engine.cuda.bench.profile import kernel_breakdown
from engine.cuda.bench.synthetic_weights import per_card_weights
from engine.gguf.shapes import shape_config

cfg = shape_config("9b")
be = CudaBackend(None, context=768, slots=8, config=cfg, weights_for=per_card_weights(cfg), speculative=False)
card = be.card
res = {"gpu": card.device_name, "parts": {}, "breakdowns": {}}
ids = np.random.default_rng(1).integers(10, cfg.vocab_size - 10, 128).tolist()
new_launch = driver.Kernel.launch


def old_launch(self, grid, block, *args, shared=0, stream=None):
    """The launch before s22 (c66a782), for the A/B."""
    self.card._check_thread()
    g, b = driver._dims(grid, "grid"), driver._dims(block, "block")
    if g[0] > driver._MAX_GRID_X or g[1] > driver._MAX_GRID_YZ or g[2] > driver._MAX_GRID_YZ:
        raise ValueError("grid")
    if b[0] * b[1] * b[2] > 1024:
        raise ValueError("block")
    packed = [driver._launch_arg(a) for a in args]
    fmt = "".join(code for code, _ in packed)
    if getattr(self, "_old_format", None) is None:
        self._function.prepare(fmt)
        self._old_format = fmt
    elif fmt != self._old_format:
        raise TypeError("format")
    s = (stream or self.card.stream)._stream
    with self.card._errors(f"launch of {self.name}"):
        self._function.prepared_async_call(g, b, s, *(v for _, v in packed), shared_size=shared)


def timed(name, fn, reps=7, setup=None):
    host, total = [], []
    for _ in range(reps):
        if setup:
            setup()
        card.stream.synchronize()
        t = time.perf_counter(); fn(); h = time.perf_counter()
        card.stream.synchronize(); e = time.perf_counter()
        host.append(1e3 * (h - t)); total.append(1e3 * (e - t))
    res["parts"][name] = {"host_ms": statistics.median(host), "total_ms": statistics.median(total),
                          "host_all": host, "total_all": total}
    print(f"{name:<36} host {statistics.median(host):7.2f} ms  total {statistics.median(total):7.2f} ms", flush=True)


reset = lambda: be.reset_slot(0)
for rnd in (1, 2):
    for label, launch in (("old launch", old_launch), ("new launch", new_launch)):
        driver.Kernel.launch = launch
        for n in (4, 16, 54):
            timed(f"prefill {n} [{label}, round {rnd}]", lambda n=n: be.prefill_slot(0, ids[:n]), setup=reset)
driver.Kernel.launch = new_launch

for n in (4, 16, 54, 128):
    reset()
    be.prefill_slot(0, ids[:8])  # a little context, as after a turn start
    card.stream.synchronize()
    d = be.stages[0].decoder
    seq, fwd = d.seqs[0], d.fwd
    fwd.set_batch(np.ones(n, np.int32), seq)  # the chunk's ids and step record, once: the replays re-run the pass
    chunk = lambda n=n: fwd.run(n, seq)
    b = kernel_breakdown(card, chunk)
    res["breakdowns"][n] = b
    print(f"chunk of {n}: whole {b['whole_us']:.0f} us, parts {b['sum_of_parts_us']:.0f} us", flush=True)
    for name, k in list(b["kernels"].items())[:9]:
        print(f"   {name:<30} x{k['launches']:<4} {k['us']:8.0f} us", flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
