"""s17 probe: does prefetching a GEMV's weights into L2 during a latency-bound window shorten the GEMV?"""
import json, sys, time
import numpy as np
from engine.cuda.driver import CudaCard
from engine.cuda.gemv import alloc_q8_activations, gemv_q8
from engine.cuda.bench.synthetic_weights import random_q8_weight
from engine.cuda.bench.microbench import time_graph_ms

card = CudaCard(0)
clock_khz = card.device.get_attribute(card._cuda.device_attribute.CLOCK_RATE)
out = card.alloc(4, "probe.out")
res = {"gpu": card.device_name, "l2_bytes": card.l2_bytes, "clock_khz": clock_khz, "rows": []}
shapes = [("out 4096x4096", 4096, 4096), ("down 4096x12288", 4096, 12288), ("gdn_in 12352x4096", 12352, 4096),
          ("gate_up 24576x4096", 24576, 4096)]
win = card.kernel("l2_window_probe")
reps = 64
for name, rows, k in shapes:
    wbytes = rows * k * 17 // 16
    copies = max(2, min(8, -(-3 * card.l2_bytes // wbytes)))
    ws = [random_q8_weight(card, (rows,), k, 100 + i, f"probe.{i}") for i in range(copies)]
    x = alloc_q8_activations(card, k, 1, "probe.x")
    x.xq.fill_zero(); x.xd.fill_zero()
    y = card.alloc(4 * rows, "probe.y")
    g_ms = time_graph_ms(card, reps, lambda i: gemv_q8(card, ws[i % copies], x, y, 1))
    for window_us in (3.0, 8.0):
        cyc = np.int64(window_us * clock_khz / 1000)
        w_ms = time_graph_ms(card, reps, lambda i: win.launch(card.sm_count, 256, None, np.int64(0), cyc, np.int32(0), out, np.int32(-7)))
        for mode in (0, 1):
            for mb in (0, 4, 8, 16, 32):
                nb = min(mb << 20, rows * k)
                if mb and nb < (mb << 20) and mb > 4 and (mb >> 1) << 20 >= rows * k:
                    continue
                def body(i):
                    w = ws[i % copies]
                    win.launch(card.sm_count, 256, w.qs if nb else None, np.int64(nb), cyc, np.int32(mode), out, np.int32(-7))
                    gemv_q8(card, w, x, y, 1)
                pair = time_graph_ms(card, reps, body)
                def walone(i):
                    w = ws[i % copies]
                    win.launch(card.sm_count, 256, w.qs if nb else None, np.int64(nb), cyc, np.int32(mode), out, np.int32(-7))
                wa = time_graph_ms(card, reps, walone)
                r = dict(shape=name, window_us=window_us, mode=mode, prefetch_mb=nb / 2**20, gemv_alone_us=g_ms * 1e3,
                         window_alone_us=w_ms * 1e3, window_with_prefetch_us=wa * 1e3, pair_us=pair * 1e3,
                         gemv_in_pair_us=(pair - w_ms) * 1e3)
                res["rows"].append(r)
                print(f"{name:20s} win {window_us:4.1f} mode {mode} pf {nb/2**20:5.1f} MB: gemv {g_ms*1e3:6.2f} "
                      f"win {w_ms*1e3:5.2f} win+pf {wa*1e3:5.2f} pair {pair*1e3:6.2f} -> gemv in pair {(pair-w_ms)*1e3:6.2f}", flush=True)
    for w in ws:
        w.qs.free(); w.d.free()
json.dump(res, open(sys.argv[1], "w"), indent=1)

# The kernel it timed, added to cuda_src/microbench.cu for that call only (d079f7d + this kernel):
# extern "C" __global__ void __launch_bounds__(256) l2_window_probe(const char* p, long long bytes, long long cycles,
#                                                                   int mode, int* out, int never) {
#     const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
#     const long long stride = (long long)gridDim.x * blockDim.x * 128;
#     int acc = 0;
#     if (p != nullptr) {
#         for (long long off = tid * 128; off < bytes; off += stride) {
#             if (mode == 0) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off));
#             else acc += __ldcg(reinterpret_cast<const int*>(p + off));
#         }
#     }
#     const long long t0 = clock64();
#     while (clock64() - t0 < cycles) {
#     }
#     if (acc == never) out[0] = acc;
# }
