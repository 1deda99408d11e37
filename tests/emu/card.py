"""The emulated card: `engine.cuda.driver.CudaCard`'s surface over host memory, running cuda_src/'s kernels on the
CPU (tests/emu/README.md). tests/gpu/conftest.py puts it in CudaCard's place when RIGLLM_EMULATED_CARD=1.

Everything runs when it is issued, on the calling thread, so streams and events only keep order trivially. While
a graph is being captured, what a real capture would record (launches, stream-ordered copies and memsets) is
recorded instead of run, and `replay` runs it again in order, reading host arrays at replay time as a real
graph's copy nodes do. Synchronous copies inside a capture are refused, as CUDA refuses them.
"""

from __future__ import annotations

import ctypes
import os
import threading
import weakref
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from engine.cuda.driver import CudaCard, CudaError, _dims, _launch_arg

# ctypes of the driver's struct codes (engine.cuda.driver._launch_arg): P a pointer, then the numpy scalars
_CTYPES: dict[str, type] = {"P": ctypes.c_uint64, "i": ctypes.c_int32, "I": ctypes.c_uint32, "q": ctypes.c_int64,
                            "Q": ctypes.c_uint64, "f": ctypes.c_float}


class _Entry(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("run", ctypes.c_void_p)]


class _Library:
    """One built `.cu` file: its kernels by name and its launcher."""

    def __init__(self, path: os.PathLike[str]):
        self.lib = ctypes.CDLL(os.fspath(path))
        self.lib.emu_kernels.restype = ctypes.POINTER(_Entry)
        self.lib.emu_kernels.argtypes = [ctypes.POINTER(ctypes.c_int)]
        self.lib.emu_run.restype = ctypes.c_int
        self.lib.emu_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_uint] * 6 + [ctypes.c_ulonglong]
        self.lib.emu_failure.restype = ctypes.c_char_p
        count = ctypes.c_int()
        table = self.lib.emu_kernels(ctypes.byref(count))
        self.kernels = {table[i].name.decode(): table[i].run for i in range(count.value)}


_libraries: list[_Library] | None = None
# One launch at a time in the process: a library's fiber scheduler is one set of globals, and each card has its
# own thread (ctypes lets the others run while a launch does).
_LAUNCH_LOCK = threading.Lock()


_LOAD_LOCK = threading.Lock()  # several card threads may ask for their first kernel at once


def _kernel_libraries() -> list[_Library]:
    global _libraries
    with _LOAD_LOCK:
        if _libraries is None:
            from tests.emu.build import build

            _libraries = [_Library(p) for p in build()]
    return _libraries


class EmuBuffer:
    """Host bytes standing for device memory; `ptr` is their real address, so pointer tables work. As a
    DeviceBuffer, an owner dropped by its last reference is freed (and leaves the ledger)."""

    def __init__(self, card: EmuCard, data: np.ndarray, label: str, owner: EmuBuffer | None = None):
        self.card, self.data, self.label, self._owner = card, data, label, owner
        self.nbytes = data.nbytes
        self._ptr = data.ctypes.data
        self._freed = False
        if owner is None:
            self._finalizer = weakref.finalize(self, card._release, label, self.nbytes)

    @property
    def ptr(self) -> int:
        if (self._owner or self)._freed:
            raise CudaError(f"{self.card.name}: buffer '{self.label}' was freed")
        return self._ptr

    def view(self, offset: int, nbytes: int, label: str | None = None) -> EmuBuffer:
        if offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
            raise ValueError(f"view [{offset}, {offset + nbytes}) outside buffer '{self.label}' of {self.nbytes} bytes")
        return EmuBuffer(self.card, self.data[offset : offset + nbytes], label or self.label, self._owner or self)

    def _bytes_of(self, array: np.ndarray) -> np.ndarray:
        raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        if raw.nbytes > self.nbytes:
            raise ValueError(f"{raw.nbytes} bytes do not fit buffer '{self.label}' of {self.nbytes} bytes")
        return raw

    def upload(self, array: np.ndarray) -> None:
        self.card._refuse_in_capture(f"synchronous upload to '{self.label}'")
        raw = self._bytes_of(array)
        self.data[: raw.nbytes] = raw
        self.card.h2d_bytes += raw.nbytes

    def upload_async(self, array: np.ndarray, stream: Any = None) -> None:
        raw = self._bytes_of(array)  # a view of the caller's array: a replayed copy node reads it then

        def copy() -> None:
            self.data[: raw.nbytes] = raw

        self.card._issue(copy)
        self.card.h2d_bytes += raw.nbytes

    def download(self, dtype: Any, shape: int | Sequence[int]) -> np.ndarray:
        self.card._refuse_in_capture(f"synchronous download from '{self.label}'")
        out = np.empty(shape, dtype=dtype)
        if out.nbytes > self.nbytes:
            raise ValueError(f"{out.nbytes} bytes requested from buffer '{self.label}' of {self.nbytes} bytes")
        out.reshape(-1).view(np.uint8)[:] = self.data[: out.nbytes]
        self.card.d2h_bytes += out.nbytes
        return out

    def download_async(self, out: np.ndarray, stream: Any = None) -> None:
        if not out.flags.c_contiguous or out.nbytes > self.nbytes:
            raise ValueError(f"download target must be C-contiguous and at most {self.nbytes} bytes")
        target = out.reshape(-1).view(np.uint8)

        def copy() -> None:
            target[:] = self.data[: target.nbytes]

        self.card._issue(copy)
        self.card.d2h_bytes += out.nbytes

    def fill_zero(self, stream: Any = None) -> None:
        self.card._issue(lambda: self.data.fill(0))

    def copy_from(self, src: EmuBuffer, nbytes: int | None = None, stream: Any = None) -> None:
        n = src.nbytes if nbytes is None else nbytes
        if n > self.nbytes or n > src.nbytes:
            raise ValueError(f"copy of {n} bytes between buffers of {src.nbytes} and {self.nbytes} bytes")

        def copy() -> None:
            self.data[:n] = src.data[:n]

        self.card._issue(copy)

    def free(self) -> None:
        self.card._check_thread()
        if self._owner is not None:
            raise CudaError(f"{self.card.name}: '{self.label}' is a view; free the buffer it views")
        if not self._freed:
            self._freed = True
            self._finalizer()


class EmuKernel:
    def __init__(self, card: EmuCard, name: str, library: _Library, run: int):
        self.card, self.name, self._library, self._run = card, name, library, run
        self.registers, self.max_threads_per_block = 64, 1024
        self._shared_limit = 48 * 1024

    def set_max_dynamic_shared(self, nbytes: int) -> None:
        if nbytes > 96 * 1024:
            raise CudaError(f"{self.name}: {nbytes} bytes of shared memory exceed Volta's 96 KiB")
        self._shared_limit = nbytes

    def launch(self, grid: int | Sequence[int], block: int | Sequence[int], *args: Any, shared: int = 0,
               stream: Any = None) -> None:
        g, b = _dims(grid, "grid"), _dims(block, "block")
        if b[0] * b[1] * b[2] > 1024:
            raise ValueError(f"{self.name}: block {b} has more than 1024 threads")
        if shared > self._shared_limit:
            raise CudaError(f"{self.name}: {shared} bytes of dynamic shared memory over the {self._shared_limit} allowed")
        values = [_argument(a) for a in args]
        pointers = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
        name, lib, run = self.name, self._library.lib, self._run

        def execute() -> None:
            with _LAUNCH_LOCK:
                failed = lib.emu_run(run, pointers, *g, *b, shared) != 0
            if failed:
                raise CudaError(f"emulated card: {name} failed: {lib.emu_failure().decode()}")
            _ = values  # the argument values live as long as the (possibly recorded) launch

        self.card._issue(execute)


def _argument(arg: Any) -> ctypes._SimpleCData:
    """One kernel argument as the ctypes value its parameter is read from; the driver's refusals for the rest."""
    if isinstance(arg, EmuBuffer):
        return ctypes.c_uint64(arg.ptr)
    code, value = _launch_arg(arg)
    return _CTYPES[code](value.item() if isinstance(value, np.generic) else value)


class _Ordered:
    """Streams and events: work runs when issued, so order holds and every wait is already over."""

    def __init__(self, card: EmuCard):
        self.card = card

    handle = 0

    def synchronize(self) -> None:
        self.card._refuse_in_capture("a synchronization")

    def wait_for(self, event: Any) -> None:
        """Nothing to wait for."""

    def record(self, stream: Any = None) -> _Ordered:
        return self

    def done(self) -> bool:
        return True

    def elapsed_ms(self, start: Any) -> float:
        return 1.0  # benchmarks drive here; their times mean nothing


class EmuGraph:
    def __init__(self, label: str):
        self.label, self.work, self.closed = label, [], False

    def close(self) -> None:
        self.closed = True


class EmuCard(CudaCard):
    """A card of RIGLLM_EMU_CARD_GIB (default 6) GiB of host memory that runs kernels on the CPU (module docstring).

    It keeps CudaCard's ledger, refusals, thread rule and graph list, and replaces what talks to the driver."""

    device_name = "emulated sm_70 (CPU)"
    arch, sm_count, l2_bytes = 70, 80, 6 << 20

    def __init__(self, index: int = 0, capacity_bytes: int | None = None, name: str | None = None):
        self.index, self.capacity_bytes = index, capacity_bytes
        self.name = name or f"emu:{index}"
        self.total_bytes = int(os.environ.get("RIGLLM_EMU_CARD_GIB", "6")) << 30
        self.h2d_bytes = self.d2h_bytes = 0
        self._ledger: dict[str, int] = {}
        self._buffers: weakref.WeakSet[EmuBuffer] = weakref.WeakSet()  # type: ignore[assignment]
        self._graphs: list[EmuGraph] = []  # type: ignore[assignment]
        self._recording: list[Callable[[], None]] | None = None
        self._kernels: dict[str, EmuKernel] = {}  # type: ignore[assignment]
        self._context: object | None = self  # CudaCard._check_thread: None once closed
        self._thread = threading.get_ident()
        self.stream = _Ordered(self)  # type: ignore[assignment]

    # ---- order -------------------------------------------------------------------------------------------
    def _issue(self, work: Callable[[], None]) -> None:
        self._check_thread()
        if self._recording is not None:
            self._recording.append(work)
        else:
            work()

    def _refuse_in_capture(self, what: str) -> None:
        self._check_thread()
        if self._recording is not None:
            raise CudaError(f"{self.name}: {what} inside a graph capture (CUDA refuses it)")

    # ---- memory -----------------------------------------------------------------------------------------
    def free_bytes(self) -> int:
        free = self.total_bytes - self.allocated_bytes
        if self.capacity_bytes is not None:
            free = min(free, self.capacity_bytes - self.allocated_bytes)
        return max(0, free)

    def alloc(self, nbytes: int, label: str) -> EmuBuffer:  # type: ignore[override]
        self._check_thread()
        if nbytes <= 0:
            raise ValueError(f"allocation '{label}' of {nbytes} bytes: sizes must be positive")
        if nbytes > self.free_bytes():
            raise self._refusal(nbytes, label, "over the emulated card's memory or the capacity")
        # never-written device memory is undefined: RIGLLM_EMU_POISON fills it with NaN bytes, to show reads of it
        fill = 0xFF if os.environ.get("RIGLLM_EMU_POISON") else 0
        buf = EmuBuffer(self, np.full(nbytes + 64, fill, np.uint8)[:nbytes], label)
        self._ledger[label] = self._ledger.get(label, 0) + nbytes
        self._buffers.add(buf)
        return buf

    def pinned(self, shape: int | Sequence[int], dtype: Any, portable: bool = False) -> np.ndarray:
        return np.zeros(shape, dtype)

    # ---- execution --------------------------------------------------------------------------------------
    def kernel(self, name: str) -> EmuKernel:  # type: ignore[override]
        self._check_thread()
        if name not in self._kernels:
            for library in _kernel_libraries():
                if name in library.kernels:
                    self._kernels[name] = EmuKernel(self, name, library, library.kernels[name])
                    break
            else:
                raise CudaError(f"{self.name}: no kernel named '{name}' in any module of cuda_src/")
        return self._kernels[name]

    def event(self) -> _Ordered:  # type: ignore[override]
        self._check_thread()
        return _Ordered(self)

    def new_stream(self) -> _Ordered:  # type: ignore[override]
        self._check_thread()
        return _Ordered(self)

    def synchronize(self) -> None:
        self._refuse_in_capture("a synchronization")

    @contextmanager
    def capture(self, label: str, stream: Any = None) -> Iterator[EmuGraph]:  # type: ignore[override]
        self._check_thread()
        if self._recording is not None:
            raise CudaError(f"{self.name}: capture of '{label}' inside another capture")
        graph = EmuGraph(label)
        self._recording = graph.work
        try:
            yield graph
        finally:
            self._recording = None
        self._graphs.append(graph)

    def replay(self, graph: EmuGraph, stream: Any = None) -> None:  # type: ignore[override]
        self._refuse_in_capture(f"replay of '{graph.label}'")
        if graph.closed:
            raise CudaError(f"{self.name}: replay of released graph '{graph.label}'")
        for work in graph.work:
            work()

    def close(self) -> None:
        if self._context is None:
            return
        self._check_thread()
        self._graphs.clear()
        for buf in list(self._buffers):
            buf.free()
        self._kernels.clear()
        self._context = None


def requested() -> bool:
    """RIGLLM_EMULATED_CARD=1: the GPU tests run on this card (tests/gpu/conftest.py installs it)."""
    return os.environ.get("RIGLLM_EMULATED_CARD") == "1"


def install() -> None:
    """Put EmuCard where engine code and the GPU tests find CudaCard, and report the GPU as available.

    Modules that imported the names already get them replaced too, but a default argument bound to CudaCard
    (CudaBackend's `card_factory`) keeps it: call this before engine.cuda's modules load, as tests/gpu/conftest.py
    does."""
    import sys

    import engine.cuda.driver as driver

    real_card, real_reason = driver.CudaCard, driver.gpu_unavailable_reason
    for module in list(sys.modules.values()):
        if getattr(module, "CudaCard", None) is real_card:
            module.CudaCard = EmuCard  # type: ignore[attr-defined]
        if getattr(module, "gpu_unavailable_reason", None) is real_reason:
            module.gpu_unavailable_reason = lambda: None  # type: ignore[attr-defined]
