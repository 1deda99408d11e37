"""The CUDA driver facade: the ONLY module that imports pycuda (contracts.md "The CUDA driver layer").

Everything the engine does with a GPU goes through a `CudaCard`: its context, checked allocations with a
per-label byte ledger, copies, kernel modules and launches, streams, events and CUDA graphs (the ctypes
shim in `engine.cuda.graphs`). Keeping pycuda behind this one file keeps tests simple and leaves room to
swap bindings.

Threads: a `CudaCard` creates its own context on the thread that constructs it and leaves it current
there; every later call must come from that same thread (architecture.md rule 4: one card, one
thread, one context). Calls from another thread raise instead of silently using the wrong context.
Several cards may share one GPU ("logical cards", each its own context); `capacity_bytes` then caps
what each may allocate, so a 16 GiB card can be emulated on a larger GPU.

Ordering: launches and async copies default to the card's stream, an ordinary (blocking) stream, so
the synchronous `upload`/`download` calls, which run on the legacy default stream, wait for earlier
work and are safe to mix with launches. Per-step values for graph replays go through `upload_async`
on the replay's stream. pycuda is imported lazily: `import engine.cuda.driver` works without it, and
using a card then raises a clear `CudaError`.
"""

from __future__ import annotations

import os
import struct
import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from engine.errors import RigllmError
from engine.cuda.graphs import CapturedGraph, GraphApi

_COPY_CHUNK = 1 << 30  # pycuda's memset/dtod take 32-bit sizes in some builds: split large ones
_MAX_GRID_YZ = 65535
_MAX_GRID_X = 2**31 - 1
NO_DRIVER = "no NVIDIA driver"  # how a pycuda that cannot load libcuda.so.1 is reported (the doctor matches it)


class CudaError(RigllmError):
    """A CUDA failure or misuse, with the card named: no pycuda, no GPU, out of memory, a kernel fault."""


def _cuda() -> Any:
    """pycuda.driver, initialised; a `CudaError` that says what to install when it is missing.

    CUDA numbers GPUs fastest first by default; PCI bus order makes card i the card NVML, nvidia-smi,
    `rigllm doctor` and the app's rig monitor call card i.
    """
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    try:
        import pycuda.driver as cuda
    except ImportError as err:
        raise CudaError(_pycuda_import_failure(err)) from err
    try:
        cuda.init()
    except cuda.Error as err:
        raise CudaError(f"no usable CUDA driver or device: {err}") from err
    return cuda


def _pycuda_import_failure(err: ImportError) -> str:
    """Why `import pycuda.driver` failed: pycuda missing, the NVIDIA driver missing (pycuda's extension
    links the driver's libcuda.so.1, so without a driver pycuda installs but does not load), or else."""
    if isinstance(err, ModuleNotFoundError) and err.name == "pycuda":
        return "pycuda is not installed: the CUDA backend needs `pip install 'rigllm[gpu]'` and an NVIDIA driver"
    if "libcuda.so" in str(err):
        return f"{NO_DRIVER}: pycuda is installed but the driver's libcuda.so.1 cannot be loaded ({err})"
    return f"pycuda is installed but does not load: {err}"


def gpu_unavailable_reason() -> str | None:
    """None when pycuda works and sees at least one GPU; otherwise why not (for skips and `--backend auto`)."""
    try:
        cuda = _cuda()
        if cuda.Device.count() < 1:
            return "the CUDA driver reports no GPU"
    except CudaError as err:
        return str(err)
    return None


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


class Stream:
    """A CUDA stream of one card (blocking, so the legacy default stream orders with it)."""

    def __init__(self, card: CudaCard):
        self.card = card
        self._stream = card._cuda.Stream()

    @property
    def handle(self) -> int:
        return int(self._stream.handle)

    def synchronize(self) -> None:
        self.card._check_thread()
        with self.card._errors("stream synchronize"):
            self._stream.synchronize()

    def wait_for(self, event: Event) -> None:
        """Work queued on this stream from now on starts after the work `event` last recorded has run."""
        self.card._check_thread()
        with self.card._errors("stream wait for event"):
            self._stream.wait_for_event(event._event)


class Event:
    """A CUDA event for timing and ordering."""

    def __init__(self, card: CudaCard):
        self.card = card
        self._event = card._cuda.Event()

    def record(self, stream: Stream | None = None) -> Event:
        self.card._check_thread()
        self._event.record((stream or self.card.stream)._stream)
        return self

    def synchronize(self) -> None:
        self.card._check_thread()
        with self.card._errors("event synchronize"):
            self._event.synchronize()

    def done(self) -> bool:
        """Whether the card has passed this event's last record (never waits)."""
        self.card._check_thread()
        with self.card._errors("event query"):
            return bool(self._event.query())

    def elapsed_ms(self, start: Event) -> float:
        """Milliseconds from `start` to this event (both recorded; this one is waited for)."""
        self.synchronize()
        return float(start._event.time_till(self._event))


class DeviceBuffer:
    """Device memory of one card: an allocation (counted in the ledger) or a view into one (not counted)."""

    def __init__(
        self, card: CudaCard, ptr: int, nbytes: int, label: str, alloc: Any = None, owner: DeviceBuffer | None = None
    ):
        self.card = card
        self.nbytes = nbytes
        self.label = label
        self._ptr = ptr
        self._alloc = alloc  # pycuda DeviceAllocation for owners
        self._owner: DeviceBuffer | None = owner  # the allocation a view points into; None for owners
        self._finalizer: weakref.finalize | None = None

    @property
    def _root(self) -> DeviceBuffer:
        # Owners do not reference themselves: a self-cycle would keep freed-by-drop buffers alive until the
        # cyclic GC ran, and the ledger with them.
        return self._owner if self._owner is not None else self

    @property
    def ptr(self) -> int:
        if self._root._alloc is None:
            raise CudaError(f"{self.card.name}: buffer '{self.label}' was freed")
        return self._ptr

    def view(self, offset: int, nbytes: int, label: str | None = None) -> DeviceBuffer:
        """`nbytes` starting `offset` bytes in (no new memory; keeps the allocation alive)."""
        if offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
            raise ValueError(f"view [{offset}, {offset + nbytes}) outside buffer '{self.label}' of {self.nbytes} bytes")
        return DeviceBuffer(self.card, self.ptr + offset, nbytes, label or self.label, owner=self._root)

    def _host(self, array: np.ndarray) -> np.ndarray:
        host = np.ascontiguousarray(array)
        if host.nbytes > self.nbytes:
            raise ValueError(f"{host.nbytes} bytes do not fit buffer '{self.label}' of {self.nbytes} bytes")
        return host

    def upload(self, array: np.ndarray) -> None:
        """Copy `array` (C order) to the start of this buffer, synchronously."""
        self.card._check_thread()
        host = self._host(array)
        with self.card._errors(f"upload to '{self.label}'"):
            self.card._cuda.memcpy_htod(self.ptr, host)
        self.card.h2d_bytes += host.nbytes

    def upload_async(self, array: np.ndarray, stream: Stream | None = None) -> None:
        """Stream-ordered copy of `array` to this buffer (pinned `array` makes it truly asynchronous)."""
        self.card._check_thread()
        host = self._host(array)
        with self.card._errors(f"upload to '{self.label}'"):
            self.card._cuda.memcpy_htod_async(self.ptr, host, (stream or self.card.stream)._stream)
        self.card.h2d_bytes += host.nbytes

    def download(self, dtype: Any, shape: int | Sequence[int]) -> np.ndarray:
        """The first prod(shape) elements as a new host array, synchronously."""
        self.card._check_thread()
        out = np.empty(shape, dtype=dtype)
        if out.nbytes > self.nbytes:
            raise ValueError(f"{out.nbytes} bytes requested from buffer '{self.label}' of {self.nbytes} bytes")
        with self.card._errors(f"download from '{self.label}'"):
            self.card._cuda.memcpy_dtoh(out, self.ptr)
        self.card.d2h_bytes += out.nbytes
        return out

    def download_async(self, out: np.ndarray, stream: Stream | None = None) -> None:
        """Stream-ordered copy into `out` (pinned, C-contiguous); valid after the stream is synchronized."""
        self.card._check_thread()
        if not out.flags.c_contiguous or out.nbytes > self.nbytes:
            raise ValueError(f"download target must be C-contiguous and at most {self.nbytes} bytes")
        with self.card._errors(f"download from '{self.label}'"):
            self.card._cuda.memcpy_dtoh_async(out, self.ptr, (stream or self.card.stream)._stream)
        self.card.d2h_bytes += out.nbytes

    def fill_zero(self, stream: Stream | None = None) -> None:
        self.card._check_thread()
        s = (stream or self.card.stream)._stream
        with self.card._errors(f"memset of '{self.label}'"):
            for start in range(0, self.nbytes, _COPY_CHUNK):
                self.card._cuda.memset_d8_async(self.ptr + start, 0, min(_COPY_CHUNK, self.nbytes - start), s)

    def copy_from(self, src: DeviceBuffer, nbytes: int | None = None, stream: Stream | None = None) -> None:
        """Device-to-device copy of the first `nbytes` (default: all of `src`) into this buffer."""
        self.card._check_thread()
        n = src.nbytes if nbytes is None else nbytes
        if n > self.nbytes or n > src.nbytes:
            raise ValueError(f"copy of {n} bytes between buffers of {src.nbytes} and {self.nbytes} bytes")
        s = (stream or self.card.stream)._stream
        with self.card._errors(f"copy '{src.label}' -> '{self.label}'"):
            for start in range(0, n, _COPY_CHUNK):
                self.card._cuda.memcpy_dtod_async(self.ptr + start, src.ptr + start, min(_COPY_CHUNK, n - start), s)

    def free(self) -> None:
        """Release the memory now (owners only); the ledger drops its bytes."""
        if self._owner is not None:
            raise CudaError(f"{self.card.name}: '{self.label}' is a view; free the buffer it views")
        if self._alloc is None:
            return
        self.card._check_thread()
        alloc, self._alloc = self._alloc, None
        with self.card._errors(f"free of '{self.label}'"):
            alloc.free()
        if self._finalizer is not None:
            self._finalizer()


# struct codes of the numpy scalars a kernel takes: by exact type, one dict lookup an argument on the launch path;
# by dtype for the rest (`_launch_arg`)
_SCALAR_CODES: dict[type, str] = {np.int32: "i", np.uint32: "I", np.int64: "q", np.uint64: "Q", np.float32: "f"}
_DTYPE_CODES = {np.dtype(t): code for t, code in _SCALAR_CODES.items()}


def _launch_arg(arg: Any) -> tuple[str, Any]:
    """(struct code, value) for one kernel argument; rejects Python numbers, whose C type is ambiguous."""
    if isinstance(arg, DeviceBuffer):
        return "P", arg.ptr
    if arg is None:
        return "P", 0
    if isinstance(arg, np.generic):
        code = _DTYPE_CODES.get(arg.dtype)  # by dtype: np.longlong is np.int64's layout under another type
        if code is not None:
            return code, arg
    raise TypeError(
        f"kernel argument {arg!r}: pass a DeviceBuffer, None (null pointer) or np.int32/np.uint32/np.int64/"
        "np.uint64/np.float32"
    )


_LAUNCH_CODES: dict[type, str] = {DeviceBuffer: "P", type(None): "P", **_SCALAR_CODES}


def _dims(value: int | Sequence[int], what: str) -> tuple[int, int, int]:
    if type(value) is int and value > 0:  # the common case, on every launch: no tuple building
        return value, 1, 1
    dims = (int(value),) if isinstance(value, (int, np.integer)) else tuple(int(v) for v in value)
    if not 1 <= len(dims) <= 3 or any(d < 1 for d in dims):
        raise ValueError(f"{what} {value!r}: 1 to 3 positive dimensions")
    return dims + (1,) * (3 - len(dims))  # type: ignore[return-value]


class Kernel:
    """A launcher for one `extern "C"` kernel; its argument types are fixed by the first launch."""

    def __init__(self, card: CudaCard, name: str, function: Any):
        self.card = card
        self.name = name
        self._function = function
        self._packer: struct.Struct | None = None  # the argument layout, fixed by the first launch

    @property
    def registers(self) -> int:
        return int(self._function.num_regs)

    @property
    def max_threads_per_block(self) -> int:
        return int(self._function.max_threads_per_block)

    def set_max_dynamic_shared(self, nbytes: int) -> None:
        """Allow more than 48 KiB of dynamic shared memory (up to the device's opt-in limit)."""
        self.card._check_thread()
        cuda = self.card._cuda
        if not hasattr(self._function, "set_attribute"):
            raise CudaError("this pycuda has no Function.set_attribute; dynamic shared memory is limited to 48 KiB")
        with self.card._errors(f"{self.name}: set dynamic shared memory to {nbytes} bytes"):
            self._function.set_attribute(cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes)

    def launch(
        self,
        grid: int | Sequence[int],
        block: int | Sequence[int],
        *args: Any,
        shared: int = 0,
        stream: Stream | None = None,
    ) -> None:
        """Queue the kernel on `stream` (default: the card's stream); errors show at the next synchronization.

        Eager passes (a prefill chunk: about 300 launches on the 9B) are bound by this call's host time, so it
        does the least per launch: one type lookup per argument, the arguments packed by a struct compiled at
        the first launch, and pycuda's `_launch_kernel` (what its `prepared_async_call` ends in, without that
        wrapper's per-call block-shape driver call). On the H200's host, a 4-token 9B prefill's 299 launches
        replayed took 7.8 µs each this way against 18-31 µs through `prepared_async_call` and the checks as they
        were (s22a), and the prefill 8.5-8.6 ms against 12.3-12.7 ms (s22b)."""
        card = self.card
        card._check_thread()
        g, b = _dims(grid, "grid"), _dims(block, "block")
        if g[0] > _MAX_GRID_X or g[1] > _MAX_GRID_YZ or g[2] > _MAX_GRID_YZ:
            raise ValueError(f"{self.name}: grid {g} exceeds CUDA's limits (x < 2^31, y and z <= 65535)")
        if b[0] * b[1] * b[2] > 1024:
            raise ValueError(f"{self.name}: block {b} has more than 1024 threads")
        codes, values = [], []
        for arg in args:
            code = _LAUNCH_CODES.get(type(arg))
            if code is None:  # a subclass, or a refused type (which raises)
                code, arg = _launch_arg(arg)
            elif code == "P":
                arg = 0 if arg is None else arg.ptr
            codes.append(code)
            values.append(arg)
        fmt = "".join(codes)
        if self._packer is None:
            self._packer = struct.Struct(fmt)  # native alignment: the C layout of the kernel's parameters
        elif fmt != self._packer.format:
            raise TypeError(
                f"{self.name}: argument types {fmt!r} differ from the first launch's {self._packer.format!r}")
        try:
            self._function._launch_kernel(g, b, self._packer.pack(*values), shared, (stream or card.stream)._stream)
        except card._cuda.Error as err:  # inline, not `card._errors`: a context manager costs a launch 1-2 µs
            raise card._failure(f"launch of {self.name}", err) from err


class CudaCard:
    """One CUDA context on one GPU (see the module docstring for the threading and capacity rules)."""

    def __init__(self, index: int = 0, capacity_bytes: int | None = None, name: str | None = None):
        cuda = _cuda()
        count = cuda.Device.count()
        if not 0 <= index < count:
            raise CudaError(f"no GPU {index}: the driver reports {count}")
        self._cuda = cuda
        self.index = index
        self.name = name or f"cuda:{index}"
        self.device = cuda.Device(index)
        self.device_name = str(self.device.name())
        major, minor = self.device.compute_capability()
        self.arch = major * 10 + minor
        self.total_bytes = int(self.device.total_memory())
        attr = cuda.device_attribute
        self.sm_count = int(self.device.get_attribute(attr.MULTIPROCESSOR_COUNT))
        self.l2_bytes = int(self.device.get_attribute(attr.L2_CACHE_SIZE))
        self.capacity_bytes = capacity_bytes
        self._ledger: dict[str, int] = {}
        # bytes copied host → card and card → host through DeviceBuffer, for benchmarks of what crosses PCIe
        self.h2d_bytes = self.d2h_bytes = 0
        self._buffers: weakref.WeakSet[DeviceBuffer] = weakref.WeakSet()
        self._graphs: list[CapturedGraph] = []
        self._graph_api: GraphApi | None = None
        self._modules: list[Any] | None = None
        self._kernels: dict[str, Kernel] = {}
        with self._errors("context creation"):
            self._context = self.device.make_context()  # pushed: current on this thread from here on
        self._thread = threading.get_ident()
        try:
            with self._errors("stream creation"):
                self.stream = Stream(self)
        except BaseException:
            self._context.pop()
            self._context.detach()
            raise

    # ---- plumbing ------------------------------------------------------------------------------
    def _check_thread(self) -> None:
        if self._context is None:
            raise CudaError(f"{self.name} is closed")
        if threading.get_ident() != self._thread:
            raise CudaError(f"{self.name} was used from a thread that does not own its CUDA context")

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """Turn pycuda's exceptions into `CudaError`s that name the card and the operation."""
        try:
            yield
        except self._cuda.Error as err:
            raise self._failure(what, err) from err

    def _failure(self, what: str, err: Exception) -> CudaError:
        return CudaError(f"{self.name} ({self.device_name}): {what} failed: {err}")

    def __enter__(self) -> CudaCard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- memory --------------------------------------------------------------------------------
    def ledger(self) -> dict[str, int]:
        """Live allocated bytes per label."""
        return {k: v for k, v in self._ledger.items() if v}

    @property
    def allocated_bytes(self) -> int:
        return sum(self._ledger.values())

    def free_bytes(self) -> int:
        """Bytes this card may still allocate: the driver's free memory, within the capacity if one is set."""
        self._check_thread()
        with self._errors("memory query"):
            free, _ = self._cuda.mem_get_info()
        if self.capacity_bytes is not None:
            free = min(free, self.capacity_bytes - self.allocated_bytes)
        return max(0, int(free))

    def _refusal(self, nbytes: int, label: str, why: str) -> CudaError:
        top = sorted(self.ledger().items(), key=lambda kv: -kv[1])[:4]
        held = ", ".join(f"{k} {_mib(v)}" for k, v in top) or "nothing"
        return CudaError(
            f"{self.name} ({self.device_name}): cannot allocate {_mib(nbytes)} for '{label}': {why} "
            f"(allocated {_mib(self.allocated_bytes)}: {held})"
        )

    def _release(self, label: str, nbytes: int) -> None:
        self._ledger[label] = self._ledger.get(label, 0) - nbytes

    def alloc(self, nbytes: int, label: str) -> DeviceBuffer:
        """`nbytes` of device memory counted under `label`; refused beyond the capacity or the device's memory."""
        self._check_thread()
        if nbytes <= 0:
            raise ValueError(f"allocation '{label}' of {nbytes} bytes: sizes must be positive")
        if self.capacity_bytes is not None and self.allocated_bytes + nbytes > self.capacity_bytes:
            raise self._refusal(nbytes, label, f"over the capacity of {_mib(self.capacity_bytes)}")
        try:
            alloc = self._cuda.mem_alloc(nbytes)
        except self._cuda.MemoryError as err:
            raise self._refusal(nbytes, label, f"out of device memory ({err})") from err
        except self._cuda.Error as err:
            raise CudaError(f"{self.name}: allocation of {_mib(nbytes)} for '{label}' failed: {err}") from err
        buf = DeviceBuffer(self, int(alloc), nbytes, label, alloc=alloc)
        self._ledger[label] = self._ledger.get(label, 0) + nbytes
        buf._finalizer = weakref.finalize(buf, self._release, label, nbytes)
        self._buffers.add(buf)
        return buf

    def upload(self, array: np.ndarray, label: str) -> DeviceBuffer:
        """A new buffer holding `array` (C order)."""
        host = np.ascontiguousarray(array)
        buf = self.alloc(host.nbytes, label)
        buf.upload(host)
        return buf

    def download(self, buf: DeviceBuffer, dtype: Any, shape: int | Sequence[int]) -> np.ndarray:
        return buf.download(dtype, shape)

    def pinned(self, shape: int | Sequence[int], dtype: Any, portable: bool = False) -> np.ndarray:
        """Page-locked host memory, for truly asynchronous copies; `portable` makes it page-locked for every
        context (the bridge between cards: one card copies into it, the next copies out of it)."""
        self._check_thread()
        flags = self._cuda.host_alloc_flags.PORTABLE if portable else 0
        with self._errors("pinned host allocation"):
            return self._cuda.pagelocked_empty(shape, dtype, mem_flags=flags)

    # ---- execution -----------------------------------------------------------------------------
    def event(self) -> Event:
        self._check_thread()
        return Event(self)

    def new_stream(self) -> Stream:
        """Another stream of this card, for copies that may overlap the card's stream (order them with events)."""
        self._check_thread()
        with self._errors("stream creation"):
            return Stream(self)

    def synchronize(self) -> None:
        """Wait for all work of this context; kernel faults surface here as `CudaError`."""
        self._check_thread()
        with self._errors("synchronize"):
            self._context.synchronize()

    def _load_modules(self) -> list[Any]:
        from engine.cuda.kernel_build import module_images

        modules = []
        for image in module_images(self.arch):
            with self._errors(f"loading kernel module {image.module} from {image.origin}"):
                modules.append(self._cuda.module_from_buffer(image.image))
        return modules

    def kernel(self, name: str) -> Kernel:
        """The launcher for kernel `name`; the first call loads every kernel module for this card."""
        self._check_thread()
        if name in self._kernels:
            return self._kernels[name]
        if self._modules is None:
            self._modules = self._load_modules()
        for module in self._modules:
            try:
                function = module.get_function(name)
            except self._cuda.Error:
                continue
            self._kernels[name] = Kernel(self, name, function)
            return self._kernels[name]
        raise CudaError(f"{self.name}: no kernel named '{name}' in any module of cuda_src/")

    @contextmanager
    def capture(self, label: str, stream: Stream | None = None) -> Iterator[CapturedGraph]:
        """Record the launches made inside the block on `stream` (default: the card's) as a CUDA graph.

        The graph is usable after the block: `card.replay(graph)`. Run the sequence once eagerly first
        (that loads the kernels and fixes their argument types); inside the block launch only on the
        capturing stream and make no synchronous copies or allocations. Values that change between
        replays belong in device buffers written before each replay. The card keeps every graph it
        captured and destroys them in `close` (or `release_graph` one earlier).
        """
        self._check_thread()
        if self._graph_api is None:
            self._graph_api = GraphApi()
        s = stream or self.stream
        graph = CapturedGraph(self._graph_api, label)
        graph.start_capture(s.handle)
        try:
            yield graph
        except BaseException:
            graph.abort_capture(s.handle)
            raise
        graph.finish_capture(s.handle)
        self._graphs.append(graph)

    def release_graph(self, graph: CapturedGraph) -> None:
        """Destroy one graph now and drop it from the card's list (an evicted decode graph): the list holds
        only graphs still in use, instead of growing with every capture until `close`."""
        self._check_thread()
        graph.close()
        self._graphs.remove(graph)

    @property
    def graph_count(self) -> int:
        """Graphs the card holds now (issue 28 bounds them: at most 8 batch widths x 3 verify widths)."""
        return len(self._graphs)

    def replay(self, graph: CapturedGraph, stream: Stream | None = None) -> None:
        self._check_thread()
        graph.launch((stream or self.stream).handle)

    # ---- teardown ------------------------------------------------------------------------------
    def close(self) -> None:
        """Destroy graphs, free every buffer and the context (on the owning thread)."""
        if self._context is None:
            return
        self._check_thread()
        for graph in self._graphs:
            graph.close()
        self._graphs.clear()
        for buf in list(self._buffers):
            buf.free()
        self._modules = None
        self._kernels.clear()
        context, self._context = self._context, None
        context.pop()
        context.detach()
