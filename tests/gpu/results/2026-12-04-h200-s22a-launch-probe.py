"""s22a probe: is a short prefill chunk bound by the host's kernel launches? On the 9B synthetic shape (8 slots,
context 768, f16 KV, no MTP, as serve_streams' server): per prefill of 4 and 54 tokens, the host time until the
last launch returns and the time until the card is done; the launches of one 4-token prefill recorded and replayed
through Kernel.launch, through a leaner launch (one type lookup per argument, pycuda's _launch_kernel straight)
and through _launch_kernel with the argument buffers packed before timing; cProfile of the prefill. As it ran, the
arguments were packed by pycuda's own `pycuda._pvt_struct.pack`; here by `struct.pack`, which gives the same bytes for
these codes (pycuda's is a copy of CPython's struct module), since files under tests/ may import only what the dev extra installs.
usage: python3 PROBE OUT.json
"""
import cProfile, io, json, pstats, statistics, sys, threading, time
import numpy as np
from engine.cuda import driver
from engine.cuda.backend import CudaBackend
from engine.cuda.bench.synthetic_weights import per_card_weights
from engine.gguf.shapes import shape_config
from struct import pack

cfg = shape_config("9b")
be = CudaBackend(None, context=768, slots=8, config=cfg, weights_for=per_card_weights(cfg), speculative=False)
card = be.card
res = {"gpu": card.device_name, "parts": {}}
ids = np.random.default_rng(1).integers(10, cfg.vocab_size - 10, 54).tolist()
orig_launch = driver.Kernel.launch
CODES = {driver.DeviceBuffer: "P", type(None): "P", np.int32: "i", np.uint32: "I", np.int64: "q", np.uint64: "Q",
         np.float32: "f"}

def lean_launch(self, grid, block, *args, shared=0, stream=None):
    card = self.card
    if card._context is None or threading.get_ident() != card._thread:
        card._check_thread()
    g = (grid, 1, 1) if type(grid) is int else driver._dims(grid, "grid")
    b = (block, 1, 1) if type(block) is int else driver._dims(block, "block")
    fmt = "".join([CODES.get(type(a)) or driver._launch_arg(a)[0] for a in args])
    if fmt != self._format:
        if self._format is None:
            self._function.prepare(fmt); self._format = fmt
        else:
            raise TypeError("format")
    vals = [a.ptr if type(a) is driver.DeviceBuffer else (0 if a is None else a) for a in args]
    self._function._launch_kernel(g, b, pack(fmt, *vals), shared, (stream or card.stream)._stream)

def timed(name, fn, reps=7, setup=None):
    host, total = [], []
    for _ in range(reps):
        if setup: setup()
        card.stream.synchronize()
        t = time.perf_counter(); fn(); h = time.perf_counter()
        card.stream.synchronize(); e = time.perf_counter()
        host.append(1e3 * (h - t)); total.append(1e3 * (e - t))
    res["parts"][name] = {"host_ms": statistics.median(host), "total_ms": statistics.median(total), "host_all": host, "total_all": total}
    print(f"{name:<44} host {statistics.median(host):7.2f} ms  total {statistics.median(total):7.2f} ms", flush=True)

def prefill(n):
    return lambda: be.prefill_slot(0, ids[:n])
reset = lambda: be.reset_slot(0)
for mode in ("Kernel.launch", "lean", "Kernel.launch again", "lean again"):
    driver.Kernel.launch = lean_launch if mode.startswith("lean") else orig_launch
    for n in (4, 54):
        timed(f"prefill {n} tokens [{mode}]", prefill(n), setup=reset)
driver.Kernel.launch = orig_launch

# record one 4-token prefill's launches
rec = []
def recording(self, grid, block, *args, shared=0, stream=None):
    rec.append((self, grid, block, args, shared, stream))
    return orig_launch(self, grid, block, *args, shared=shared, stream=stream)
driver.Kernel.launch = recording
reset(); be.prefill_slot(0, ids[:4]); card.stream.synchronize()
driver.Kernel.launch = orig_launch
res["launches_4_tokens"] = len(rec)
print("launches in a 4-token prefill:", len(rec), "kernels:", len({r[0].name for r in rec}))
packed = []
for k, grid, block, args, shared, stream in rec:
    fmt = "".join(CODES.get(type(a)) or driver._launch_arg(a)[0] for a in args)
    vals = [a.ptr if type(a) is driver.DeviceBuffer else (0 if a is None else a) for a in args]
    packed.append((k._function, driver._dims(grid, "g"), driver._dims(block, "b"), pack(fmt, *vals), shared, (stream or card.stream)._stream))
def replay_kernel():
    for k, grid, block, args, shared, stream in rec:
        orig_launch(k, grid, block, *args, shared=shared, stream=stream)
def replay_lean():
    for k, grid, block, args, shared, stream in rec:
        lean_launch(k, grid, block, *args, shared=shared, stream=stream)
def replay_raw():
    for f, g, b, buf, shared, s in packed:
        f._launch_kernel(g, b, buf, shared, s)
for name, fn in (("replay via Kernel.launch", replay_kernel), ("replay via lean launch", replay_lean),
                 ("replay via _launch_kernel, prepacked", replay_raw), ("replay via Kernel.launch again", replay_kernel)):
    timed(name, fn)
    p = res["parts"][name]
    print(f"   host per launch {1e3 * p['host_ms'] / len(rec):.2f} us", flush=True)

pr = cProfile.Profile(); pr.enable()
for _ in range(5):
    reset(); be.prefill_slot(0, ids[:4])
card.stream.synchronize()
pr.disable()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30); print(s.getvalue()[:6000])
res["profile_4_tokens_x5"] = s.getvalue()
json.dump(res, open(sys.argv[1], "w"), indent=1)
