"""s20h probe: which driver calls find a captured chain's nodes on this driver (5588f27's cuGraphNodeGetDependentNodes
returned CUDA_ERROR_INVALID_VALUE on the H200's 580 driver). Captures four launches of a small kernel, noting the
capture's tip after each (cuStreamGetCaptureInfo_v2 and _v3), then asks the finished graph for its nodes and the
first tip's dependents through each entry point that exists, and prints what each returned."""
import ctypes

import numpy as np

from engine.cuda.driver import CudaCard
from engine.cuda.graphs import GraphApi

card = CudaCard(0)
api = GraphApi()
lib = api._lib
vp, pvp, psize = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)
buf = card.alloc(4096, "probe")
kernel = card.kernel("fill_random_q8_0")
d = card.alloc(4096, "probe.d")


def launch() -> None:
    kernel.launch(1, 256, buf, d, np.int64(1024), np.uint32(1), np.float32(1.0))


def tip_v2(stream: int):
    status, ident, graph = ctypes.c_int(), ctypes.c_ulonglong(), ctypes.c_void_p()
    deps, count = ctypes.POINTER(ctypes.c_void_p)(), ctypes.c_size_t()
    fn = lib.cuStreamGetCaptureInfo_v2
    fn.argtypes = (vp, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_ulonglong), pvp, ctypes.POINTER(pvp), psize)
    code = fn(stream, ctypes.byref(status), ctypes.byref(ident), ctypes.byref(graph), ctypes.byref(deps), ctypes.byref(count))
    return code, status.value, graph.value, count.value, (deps[0] if count.value else None)


def tip_v3(stream: int):
    if not hasattr(lib, "cuStreamGetCaptureInfo_v3"):
        return "absent"
    status, ident, graph = ctypes.c_int(), ctypes.c_ulonglong(), ctypes.c_void_p()
    deps, edges, count = ctypes.POINTER(ctypes.c_void_p)(), ctypes.c_void_p(), ctypes.c_size_t()
    fn = lib.cuStreamGetCaptureInfo_v3
    fn.argtypes = (vp, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_ulonglong), pvp, ctypes.POINTER(pvp),
                   pvp, psize)
    code = fn(stream, ctypes.byref(status), ctypes.byref(ident), ctypes.byref(graph), ctypes.byref(deps),
              ctypes.byref(edges), ctypes.byref(count))
    return code, status.value, graph.value, count.value, (deps[0] if count.value else None)


launch()
stream = card.stream.handle
api.begin_capture(stream)
tips = []
for i in range(4):
    launch()
    tips.append((tip_v2(stream), tip_v3(stream)))
graph = api.end_capture(stream)
for i, t in enumerate(tips):
    print("after launch", i, "v2", t[0], "v3", t[1])
print("graph", graph)
count = ctypes.c_size_t()
fn = lib.cuGraphGetNodes
fn.argtypes = (vp, pvp, psize)
print("cuGraphGetNodes count", fn(graph, None, ctypes.byref(count)), count.value)
nodes = (ctypes.c_void_p * count.value)()
print("cuGraphGetNodes", fn(graph, nodes, ctypes.byref(count)), [nodes[i] for i in range(count.value)])
first = tips[0][0][4]
for name, args in (("cuGraphNodeGetDependentNodes", 3), ("cuGraphNodeGetDependentNodes_v2", 4)):
    if not hasattr(lib, name):
        print(name, "absent")
        continue
    f = getattr(lib, name)
    n = ctypes.c_size_t()
    if args == 3:
        f.argtypes = (vp, pvp, psize)
        code = f(first, None, ctypes.byref(n))
    else:
        f.argtypes = (vp, pvp, vp, psize)
        code = f(first, None, None, ctypes.byref(n))
    print(name, "code", code, "count", n.value)
    if code == 0 and n.value:
        out = (ctypes.c_void_p * n.value)()
        code = f(first, out, ctypes.byref(n)) if args == 3 else f(first, out, None, ctypes.byref(n))
        print(name, "code", code, [out[i] for i in range(n.value)])
for name in ("cuGraphNodeSetEnabled", "cuGraphNodeGetEnabled"):
    print(name, hasattr(lib, name))
version = ctypes.c_int()
lib.cuDriverGetVersion(ctypes.byref(version))
print("driver version", version.value)
