"""CUDA graphs through ctypes on libcuda.so.1, driven by the facade in `engine.cuda.driver` only.

pycuda 2026.1 has no stream-capture API, but capture works on any stream handle: begin capture on the
stream pycuda launches into, launch as usual, end capture, instantiate, replay with `cuGraphLaunch`
(toolchain.md §6: 0.84 µs per replayed kernel against 6.2 µs per pycuda launch). Capture runs in
thread-local mode, so another card's thread making ordinary driver calls meanwhile is not disturbed.
Every driver call here is checked; failures name the call and the driver's error.
"""

from __future__ import annotations

import ctypes

from engine.errors import RigllmError

CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1


class GraphApi:
    """The handful of driver entry points needed for capture and replay."""

    def __init__(self) -> None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as err:
            raise RigllmError(f"cannot load the CUDA driver library libcuda.so.1: {err}") from err
        vp, pvp, psize = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)
        signatures = {
            "cuStreamBeginCapture_v2": (vp, ctypes.c_int),
            "cuStreamEndCapture": (vp, pvp),
            "cuStreamGetCaptureInfo_v2": (vp, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_ulonglong), pvp,
                                          ctypes.POINTER(pvp), psize),
            "cuGraphNodeGetDependentNodes": (vp, pvp, psize),
            "cuGraphNodeSetEnabled": (vp, vp, ctypes.c_uint),
            "cuGraphInstantiateWithFlags": (pvp, vp, ctypes.c_ulonglong),
            "cuGraphLaunch": (vp, vp),
            "cuGraphExecDestroy": (vp,),
            "cuGraphDestroy": (vp,),
            "cuGetErrorName": (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)),
        }
        for name, argtypes in signatures.items():
            fn = getattr(lib, name)
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int
        self._lib = lib

    def check(self, code: int, what: str) -> None:
        if code != 0:
            name = ctypes.c_char_p()
            self._lib.cuGetErrorName(code, ctypes.byref(name))
            label = name.value.decode() if name.value else "unknown error"
            raise RigllmError(f"CUDA driver call {what} failed: {label} ({code})")

    def begin_capture(self, stream: int) -> None:
        self.check(self._lib.cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture")

    def end_capture(self, stream: int) -> int:
        graph = ctypes.c_void_p()
        self.check(self._lib.cuStreamEndCapture(stream, ctypes.byref(graph)), "cuStreamEndCapture")
        return graph.value or 0

    def capture_tip(self, stream: int) -> int:
        """The node the capture on `stream` ends in so far (the one its next launch will follow)."""
        status, ident, graph = ctypes.c_int(), ctypes.c_ulonglong(), ctypes.c_void_p()
        deps, count = ctypes.POINTER(ctypes.c_void_p)(), ctypes.c_size_t()
        self.check(self._lib.cuStreamGetCaptureInfo_v2(stream, ctypes.byref(status), ctypes.byref(ident),
                                                      ctypes.byref(graph), ctypes.byref(deps), ctypes.byref(count)),
                   "cuStreamGetCaptureInfo")
        if count.value != 1:
            raise RigllmError(f"the capture ends in {count.value} nodes, not one")
        return deps[0] or 0

    def dependents(self, node: int) -> list[int]:
        count = ctypes.c_size_t()
        self.check(self._lib.cuGraphNodeGetDependentNodes(node, None, ctypes.byref(count)), "cuGraphNodeGetDependentNodes")
        if count.value == 0:  # asked again with an empty array, the driver answers CUDA_ERROR_INVALID_VALUE (s20g)
            return []
        nodes = (ctypes.c_void_p * count.value)()
        self.check(self._lib.cuGraphNodeGetDependentNodes(node, nodes, ctypes.byref(count)), "cuGraphNodeGetDependentNodes")
        return [nodes[i] or 0 for i in range(count.value)]

    def set_enabled(self, exec_: int, node: int, enabled: bool) -> None:
        self.check(self._lib.cuGraphNodeSetEnabled(exec_, node, int(enabled)), "cuGraphNodeSetEnabled")

    def instantiate(self, graph: int) -> int:
        exec_ = ctypes.c_void_p()
        self.check(self._lib.cuGraphInstantiateWithFlags(ctypes.byref(exec_), graph, 0), "cuGraphInstantiateWithFlags")
        return exec_.value or 0

    def launch(self, exec_: int, stream: int) -> None:
        self.check(self._lib.cuGraphLaunch(exec_, stream), "cuGraphLaunch")

    def destroy(self, exec_: int, graph: int) -> None:
        if exec_:
            self.check(self._lib.cuGraphExecDestroy(exec_), "cuGraphExecDestroy")
        if graph:
            self.check(self._lib.cuGraphDestroy(graph), "cuGraphDestroy")


class CapturedGraph:
    """A captured, instantiated sequence of launches; replay it with `launch` on the card's thread.

    A graph may have a tail (`mark_tail` during capture: the launches after it), which `set_tail` switches off
    and on between replays: a disabled node runs as an empty one (cuGraphNodeSetEnabled), and the change holds
    for later launches only. A decode step's picks are its graph's tail, so a masked step replays the one
    step graph without them and launches its own (engine.cuda.slot_decoder)."""

    def __init__(self, api: GraphApi, label: str):
        self._api = api
        self.label = label
        self._graph = 0
        self._exec = 0
        self.captured = False
        self._stream = 0
        self._tail_after = 0  # the node the tail follows (mark_tail); 0: no tail
        self._tail: list[int] = []
        self._tail_on = True

    def start_capture(self, stream: int) -> None:
        self._api.begin_capture(stream)
        self._stream = stream

    def mark_tail(self) -> None:
        """During capture: the launches from here on are the graph's tail (see the class docstring)."""
        self._tail_after = self._api.capture_tip(self._stream)

    def finish_capture(self, stream: int) -> None:
        """Finish capture and instantiate; on failure nothing is left allocated."""
        self._graph = self._api.end_capture(stream)
        try:
            self._exec = self._api.instantiate(self._graph)
            self._tail = self._chain_after(self._tail_after) if self._tail_after else []
        except RigllmError:
            self._api.destroy(self._exec, self._graph)
            self._graph = self._exec = 0
            raise
        self.captured = True

    def _chain_after(self, node: int) -> list[int]:
        """The nodes after `node` in a captured chain (one stream: each node has at most one dependent)."""
        chain = []
        while dependents := self._api.dependents(node):
            if len(dependents) != 1:
                raise RigllmError(f"graph '{self.label}': node with {len(dependents)} dependents in its tail")
            node = dependents[0]
            chain.append(node)
        return chain

    def set_tail(self, enabled: bool) -> None:
        """Run the tail's launches in the next replays (True, as captured) or not."""
        if enabled != self._tail_on:
            for node in self._tail:
                self._api.set_enabled(self._exec, node, enabled)
            self._tail_on = enabled

    def abort_capture(self, stream: int) -> None:
        """End a capture that failed midway, dropping whatever was recorded."""
        try:
            graph = self._api.end_capture(stream)
        except RigllmError:
            return  # the capture was already invalidated; the original error is the one to report
        self._api.destroy(0, graph)

    def launch(self, stream: int) -> None:
        if not self.captured:
            raise RigllmError(f"graph '{self.label}' is not captured (used inside its capture block, or closed)")
        self._api.launch(self._exec, stream)

    def close(self) -> None:
        exec_, graph = self._exec, self._graph
        self._exec = self._graph = 0
        self.captured = False
        self._api.destroy(exec_, graph)
