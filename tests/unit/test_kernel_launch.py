"""`Kernel.launch` without a GPU: the bytes it hands pycuda's `_launch_kernel` are the kernel's C parameter layout
(pointers of buffers and views, null for None, each numpy scalar at its natural alignment), and it refuses what
the card would misread. tests/gpu runs every kernel through the same path against numpy."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from engine.cuda.driver import CudaCard, CudaError, DeviceBuffer, Kernel


class DriverError(Exception):
    """pycuda's `Error` here."""


class RecordingFunction:
    """A pycuda Function that records its launches (or fails them, when `fail` is set)."""

    def __init__(self) -> None:
        self.launches: list[tuple[Any, ...]] = []
        self.fail = False

    def _launch_kernel(self, grid: Any, block: Any, params: bytes, shared: int, stream: Any) -> None:
        if self.fail:
            raise DriverError("CUDA_ERROR_INVALID_VALUE")
        self.launches.append((grid, block, params, shared, stream))


def stand_in_card() -> CudaCard:
    """A CudaCard whose context belongs to this thread, with no driver behind it."""
    card = CudaCard.__new__(CudaCard)
    card.name, card.device_name = "cuda:0", "stand-in"
    card._context, card._thread = object(), threading.get_ident()
    card._cuda = SimpleNamespace(Error=DriverError)
    card.stream = SimpleNamespace(_stream="card stream")
    return card


@pytest.fixture
def launcher() -> tuple[CudaCard, Kernel, RecordingFunction]:
    card = stand_in_card()
    function = RecordingFunction()
    return card, Kernel(card, "k", function), function


def c_layout(*fields: tuple[int, int, bool]) -> bytes:
    """(value, size, signed) fields laid out as a C struct: each at a multiple of its size, little-endian."""
    out = bytearray()
    for value, size, signed in fields:
        out += bytes(-len(out) % size)
        out += value.to_bytes(size, "little", signed=signed)
    return bytes(out)


def test_arguments_are_packed_in_the_kernels_c_layout(launcher):
    card, kernel, function = launcher
    buf = DeviceBuffer(card, 0x7F00_0000_1000, 256, "buf", alloc=object())
    kernel.launch((3, 2), 128, buf.view(16, 64), None, np.int32(-3), np.float32(1.5), np.int64(1 << 40),
                  np.uint32(7), np.longlong(-2), shared=512)
    grid, block, params, shared, stream = function.launches[0]
    assert (grid, block, shared, stream) == ((3, 2, 1), (128, 1, 1), 512, "card stream")
    as_int = int(np.float32(1.5).view(np.int32))
    assert params == c_layout((0x7F00_0000_1010, 8, False), (0, 8, False), (-3, 4, True), (as_int, 4, True),
                              (1 << 40, 8, True), (7, 4, False), (-2, 8, True))


def test_a_launch_goes_on_the_stream_it_is_given(launcher):
    _, kernel, function = launcher
    kernel.launch(1, 32, np.int32(0), stream=SimpleNamespace(_stream="side stream"))
    assert function.launches[0][4] == "side stream"


def test_what_the_card_would_misread_is_refused_before_launching(launcher):
    _, kernel, function = launcher
    with pytest.raises(TypeError, match="np.int32"):
        kernel.launch(1, 32, 8)  # a Python int has no C type
    with pytest.raises(ValueError, match="limits"):
        kernel.launch((1, 70000), 32, np.int32(0))
    with pytest.raises(ValueError, match="1024"):
        kernel.launch(1, (64, 32), np.int32(0))
    with pytest.raises(ValueError, match="positive"):
        kernel.launch(0, 32, np.int32(0))
    kernel.launch(1, 32, np.int32(0))
    with pytest.raises(TypeError, match="differ"):
        kernel.launch(1, 32, np.float32(0))  # the first launch fixed the types
    assert len(function.launches) == 1


def test_a_driver_failure_names_the_card_and_kernel(launcher):
    _, kernel, function = launcher
    function.fail = True
    with pytest.raises(CudaError, match=r"cuda:0 \(stand-in\): launch of k failed: CUDA_ERROR_INVALID_VALUE"):
        kernel.launch(1, 32, np.int32(0))


def test_a_launch_from_another_thread_is_refused(launcher):
    _, kernel, function = launcher
    errors: list[Exception] = []

    def other() -> None:
        try:
            kernel.launch(1, 32, np.int32(0))
        except CudaError as err:
            errors.append(err)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert len(errors) == 1 and "thread" in str(errors[0]) and not function.launches
