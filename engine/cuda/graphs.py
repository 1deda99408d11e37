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
        vp, pvp = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)
        signatures = {
            "cuStreamBeginCapture_v2": (vp, ctypes.c_int),
            "cuStreamEndCapture": (vp, pvp),
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
    """A captured, instantiated sequence of launches; replay it with `launch` on the card's thread."""

    def __init__(self, api: GraphApi, label: str):
        self._api = api
        self.label = label
        self._graph = 0
        self._exec = 0
        self.captured = False

    def start_capture(self, stream: int) -> None:
        self._api.begin_capture(stream)

    def finish_capture(self, stream: int) -> None:
        """Finish capture and instantiate; on failure nothing is left allocated."""
        self._graph = self._api.end_capture(stream)
        try:
            self._exec = self._api.instantiate(self._graph)
        except RigllmError:
            self._api.destroy(0, self._graph)
            self._graph = 0
            raise
        self.captured = True

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
