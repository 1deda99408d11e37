"""The driver facade: the allocation ledger and capacity, copies and views, launches, events, CUDA graphs."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import RigllmError
from engine.cuda.driver import CudaCard, CudaError
from engine.cuda.gemv import alloc_q8_activations, gemv_q8, quantize_q8_1, upload_q8_weight
from tests.emu.card import requested as emulated_card_requested
from tests.gpu.gpu_fixtures import assert_equal, random_activations, random_q8_weight, run_on_thread

MIB = 1 << 20
pytestmark = pytest.mark.skipif(emulated_card_requested(),
                                reason="tests pycuda's facade itself, which the emulated card replaces")


def test_ledger_counts_live_bytes_per_label(card):
    a = card.alloc(3 * MIB, "ledger.a")
    b = card.alloc(MIB, "ledger.a")
    c = card.alloc(2 * MIB, "ledger.b")
    assert card.ledger()["ledger.a"] == 4 * MIB and card.ledger()["ledger.b"] == 2 * MIB
    a.free()
    del b  # dropping the last reference releases the memory and its ledger entry
    assert card.ledger().get("ledger.a", 0) == 0 and card.ledger()["ledger.b"] == 2 * MIB
    c.free()
    c.free()  # freeing twice is harmless
    assert "ledger.a" not in card.ledger() and "ledger.b" not in card.ledger()
    with pytest.raises(CudaError, match="freed"):
        _ = c.ptr


def test_logical_card_refuses_allocations_beyond_its_capacity():
    """A second context on the same GPU capped at 64 MiB, owned by its own thread as the engine does."""

    def on_worker() -> tuple[int, str, int, dict[str, int]]:
        with CudaCard(0, capacity_bytes=64 * MIB, name="logical-1") as small:
            weights = small.alloc(40 * MIB, "weights")  # kept alive: a dropped buffer frees itself
            free = small.free_bytes()
            with pytest.raises(CudaError) as refused:
                small.alloc(30 * MIB, "kv")
            assert weights.nbytes == 40 * MIB
            return free, str(refused.value), small.allocated_bytes, small.ledger()

    free, message, allocated, ledger = run_on_thread(on_worker)
    assert free <= 24 * MIB
    assert "logical-1" in message and "'kv'" in message and "capacity" in message and "weights" in message
    assert allocated == 40 * MIB and ledger == {"weights": 40 * MIB}


def test_card_refuses_use_from_another_thread(card):
    with pytest.raises(CudaError, match="thread"):
        run_on_thread(lambda: card.alloc(MIB, "wrong.thread"))


def test_upload_download_views_copies_and_zero_fill(card, rng):
    data = rng.standard_normal(1000).astype(np.float32)
    buf = card.upload(data, "copy.src")
    assert_equal(buf.download(np.float32, 1000), data, "round trip")
    assert_equal(buf.view(400, 800).download(np.float32, 200), data[100:300], "view")
    dst = card.alloc(buf.nbytes, "copy.dst")
    dst.copy_from(buf)
    dst.view(0, 400).fill_zero()
    expected = data.copy()
    expected[:100] = 0
    assert_equal(dst.download(np.float32, 1000), expected, "copy then zero-fill of a view")
    with pytest.raises(ValueError):
        buf.view(3996, 8)
    host = card.pinned(1000, np.float32)
    dst.download_async(host)
    card.stream.synchronize()
    assert_equal(host, expected, "async download into pinned memory")


def test_launch_checks_arguments_and_geometry(card):
    kernel = card.kernel("dp4a_peak")
    out = card.alloc(4, "launch.out")
    with pytest.raises(TypeError, match="np.int32"):
        kernel.launch(1, 32, out, 8, np.int32(0))  # a Python int has no C type
    with pytest.raises(ValueError, match="65535"):
        kernel.launch((1, 70000), 32, out, np.int32(8), np.int32(0))
    with pytest.raises(ValueError, match="1024"):
        kernel.launch(1, (64, 32), out, np.int32(8), np.int32(0))
    kernel.launch(1, 32, out, np.int32(8), np.int32(0))
    with pytest.raises(TypeError, match="differ"):
        kernel.launch(1, 32, out, np.float32(8), np.int32(0))
    card.synchronize()
    with pytest.raises(CudaError, match="no kernel named"):
        card.kernel("no_such_kernel")


def test_events_time_a_kernel(card):
    kernel = card.kernel("dp4a_peak")
    out = card.alloc(4, "timing.out")
    start, end = card.event(), card.event()
    start.record()
    kernel.launch(card.sm_count * 4, 256, out, np.int32(2048), np.int32(-0x7FFFFFFF))
    end.record()
    ms = end.elapsed_ms(start)
    assert 0.0 < ms < 10_000.0


def test_graph_replay_equals_eager_execution(card, rng):
    """quantize -> GEMV -> GEMV with in-place residual, captured once and replayed on new inputs."""
    k, rows = 256, 256
    w1 = upload_q8_weight(card, [random_q8_weight(rng, rows, k)[:2]], "graph.w1")
    w2 = upload_q8_weight(card, [random_q8_weight(rng, rows, rows)[:2]], "graph.w2")
    x = card.alloc(4 * k, "graph.x")
    act1 = alloc_q8_activations(card, k, 1, "graph.a1")
    act2 = alloc_q8_activations(card, rows, 1, "graph.a2")
    h = card.alloc(4 * rows, "graph.h")

    def step() -> None:
        quantize_q8_1(card, x, act1, 1)
        gemv_q8(card, w1, act1, h, 1)
        quantize_q8_1(card, h, act2, 1)
        gemv_q8(card, w2, act2, h, 1, residual=h)

    inputs = [random_activations(rng, 1, k)[0] for _ in range(3)]
    eager = []
    for value in inputs:
        x.upload(value)
        step()
        eager.append(h.download(np.float32, rows))

    with card.capture("test-step") as graph:
        step()
    try:
        for value, expected in zip(inputs, eager):
            x.upload(value)
            card.replay(graph)
            assert_equal(h.download(np.float32, rows), expected, "graph replay vs eager")
    finally:
        card.release_graph(graph)
    assert graph not in card._graphs  # destroyed now, not kept listed until the card closes
    with pytest.raises(RigllmError, match="not captured"):
        card.replay(graph)
