"""A stand-in for `engine.cuda.driver.CudaCard` that runs no kernels, for exercising the CUDA backend's host
code (allocation plans, buffer views, slot bookkeeping, pipeline hand-offs) on machines without a GPU.

Buffers are real host memory, so uploads, downloads and views behave like the card's; kernel launches
are recorded, not run, with their arguments checked to be launchable types. What this cannot catch
(a kernel's arithmetic) the GPU tests cover.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np

LAUNCHABLE = (np.int32, np.int64, np.uint32, np.uint64, np.float32)
CUDA_SRC = Path(__file__).resolve().parents[2] / "cuda_src"


def entry_parameter_count(name: str) -> int:
    """Parameters of kernel `name`'s C entry point (for the GDN kernels: their RIGLLM_GDN_RECURRENT macro's)."""
    text = "".join(p.read_text() for p in sorted(CUDA_SRC.glob("*.cu")))
    entry = re.escape(name)
    if name.startswith("gdn_recurrent"):
        text, entry = text[text.index("#define RIGLLM_GDN_RECURRENT("):], "NAME"
    params = re.search(r"__global__ void (?:__launch_bounds__\([^)]*\)\s*)?" + entry + r"\(([^)]*)\)", text).group(1)
    return len(params.split(","))


class FakeBuffer:
    def __init__(self, data: np.ndarray, label: str, owner: "FakeBuffer | None" = None, card: "FakeCard | None" = None):
        self.data, self.label, self.owner, self.card = data, label, owner, card
        self.nbytes = data.nbytes
        self.ptr = id(data)

    def view(self, offset: int, nbytes: int, label: str | None = None) -> "FakeBuffer":
        if offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
            raise ValueError(f"view [{offset}, {offset + nbytes}) outside buffer '{self.label}' of {self.nbytes} bytes")
        return FakeBuffer(self.data[offset : offset + nbytes], label or self.label, self, self.card)

    def upload(self, array: np.ndarray) -> None:
        raw = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        if raw.nbytes > self.nbytes:
            raise ValueError(f"{raw.nbytes} bytes do not fit buffer '{self.label}' of {self.nbytes}")
        self.data[: raw.nbytes] = raw
        if self.card is not None:
            self.card.h2d_bytes += raw.nbytes

    upload_async = lambda self, array, stream=None: self.upload(array)  # noqa: E731

    def download(self, dtype: Any, shape: Any) -> np.ndarray:
        out = np.empty(shape, dtype=dtype)
        if out.nbytes > self.nbytes:
            raise ValueError(f"{out.nbytes} bytes requested from buffer '{self.label}' of {self.nbytes}")
        out.reshape(-1).view(np.uint8)[:] = self.data[: out.nbytes]
        if self.card is not None:
            self.card.d2h_bytes += out.nbytes
        return out

    def download_async(self, out: np.ndarray, stream: Any = None) -> None:
        if not out.flags.c_contiguous or out.nbytes > self.nbytes:
            raise ValueError(f"download target must be C-contiguous and at most {self.nbytes} bytes")
        out.reshape(-1).view(np.uint8)[:] = self.data[: out.nbytes]
        if self.card is not None:
            self.card.d2h_bytes += out.nbytes

    def fill_zero(self, stream: Any = None) -> None:
        self.data[:] = 0

    def copy_from(self, src: "FakeBuffer", nbytes: int | None = None, stream: Any = None) -> None:
        n = src.nbytes if nbytes is None else nbytes
        self.data[:n] = src.data[:n]

    def free(self) -> None:
        if self.owner is not None:
            raise ValueError(f"'{self.label}' is a view; free the buffer it views")


class FakeKernel:
    def __init__(self, card: "FakeCard", name: str):
        self.card, self.name = card, name

    def set_max_dynamic_shared(self, nbytes: int) -> None:
        if nbytes > 96 * 1024:
            raise ValueError(f"{self.name}: {nbytes} bytes of shared memory exceed Volta's 96 KiB")

    def launch(self, grid: Any, block: Any, *args: Any, shared: int = 0, stream: Any = None) -> None:
        for i, arg in enumerate(args):
            if not (arg is None or isinstance(arg, (FakeBuffer, *LAUNCHABLE))):
                raise TypeError(f"{self.name}: argument {i} is a {type(arg).__name__}, not a buffer or numpy scalar")
        self.card.launches.append((self.name, grid, block, len(args)))
        self.card.launch_args.append((self.name, args))


class _Sync:
    def synchronize(self) -> None:
        """Nothing runs asynchronously here."""

    handle = 0


class FakeStream(_Sync):
    """A stream whose waits are noted in the card's launches as "<wait>" (what tests of stream order read)."""

    def __init__(self, card: "FakeCard"):
        self.card = card

    def wait_for(self, event: "FakeEvent") -> None:
        self.card.launches.append(("<wait>", None, None, 0))


class FakeEvent(_Sync):
    """An event whose every interval is 1 ms (benchmark drivers run; their numbers mean nothing here)."""

    def record(self, stream: Any = None) -> "FakeEvent":
        return self

    def done(self) -> bool:
        return True

    def elapsed_ms(self, start: "FakeEvent") -> float:
        return 1.0


class FakeGraph:
    def __init__(self, label: str = "graph"):
        self.label, self.closed = label, False

    def close(self) -> None:
        self.closed = True


class FakeCard:
    def __init__(self, index: int = 0, capacity_bytes: int | None = None, name: str | None = None):
        self.index, self.capacity_bytes = index, capacity_bytes
        self.name = name or f"fake:{index}"
        self.device_name = "fake GPU"
        self.sm_count, self.arch, self.total_bytes = 132, 90, 80 << 30
        self.l2_bytes = 60 << 20  # the H200's
        self.stream = FakeStream(self)
        self.launches: list[tuple[str, Any, Any, int]] = []
        self.graphs: list[FakeGraph] = []
        self.launch_args: list[tuple[str, tuple[Any, ...]]] = []  # (kernel, its arguments) per launch
        self.allocated_bytes = 0
        self.h2d_bytes = self.d2h_bytes = 0  # as CudaCard's: bytes through buffer uploads and downloads

    def alloc(self, nbytes: int, label: str) -> FakeBuffer:
        if nbytes <= 0:
            raise ValueError(f"{label}: cannot allocate {nbytes} bytes")
        self.allocated_bytes += nbytes
        return FakeBuffer(np.zeros(nbytes, np.uint8), label, card=self)

    def upload(self, array: np.ndarray, label: str) -> FakeBuffer:
        buf = self.alloc(max(1, np.asarray(array).nbytes), label)
        buf.upload(array)
        return buf

    def pinned(self, shape: Any, dtype: Any, portable: bool = False) -> np.ndarray:
        return np.zeros(shape, dtype)

    def free_bytes(self) -> int:
        return (self.capacity_bytes or self.total_bytes) - self.allocated_bytes

    def kernel(self, name: str) -> FakeKernel:
        return FakeKernel(self, name)

    @contextmanager
    def capture(self, label: str, stream: Any = None) -> Iterator[FakeGraph]:
        graph = FakeGraph(label)
        yield graph
        self.graphs.append(graph)  # as CudaCard: kept until released or the card closes

    def release_graph(self, graph: FakeGraph) -> None:
        graph.close()
        self.graphs.remove(graph)

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    def replay(self, graph: FakeGraph, stream: Any = None) -> None:
        self.launches.append(("<replay>", None, None, 0))

    def synchronize(self) -> None:
        """Nothing runs asynchronously here."""

    def event(self) -> FakeEvent:
        return FakeEvent()

    def new_stream(self) -> FakeStream:
        return FakeStream(self)

    def close(self) -> None:
        """Nothing to release."""

    def __enter__(self) -> "FakeCard":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def address(buf: FakeBuffer) -> int:
    """Where a buffer's (or view's) bytes start in host memory."""
    return buf.data.__array_interface__["data"][0]


def owners_touched(owned: dict[int, list[FakeBuffer]], args: tuple[Any, ...]) -> set[int]:
    """The keys of `owned` (e.g. slots → their state buffers) whose buffers a launch's arguments point into."""
    def span(buf: FakeBuffer) -> tuple[int, int]:
        return address(buf), address(buf) + buf.nbytes

    touched = set()
    for key, buffers in owned.items():
        spans = [span(b) for b in buffers]
        for arg in args:
            if isinstance(arg, FakeBuffer):
                a, b = span(arg)
                if any(a < end and start < b for start, end in spans):
                    touched.add(key)
    return touched
