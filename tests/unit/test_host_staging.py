"""engine.cuda.host_staging on a card whose copies run at either end of what stream order allows: at once when queued
("eager"), or only when an event recorded after them is waited for ("late"). A staged copy that reused a pinned half
before the card was done with it, or read a half before its bytes landed, moves the wrong bytes in one of the two."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from engine.cuda.host_staging import HostStaging


class DeferredCard:
    """Stream order without a GPU: copies queue up and run in order, at once (`eager`) or when an event after them is
    synchronized."""

    def __init__(self, eager: bool = False) -> None:
        self.queue: list[Callable[[], None]] = []
        self.done = 0
        self.pinned_allocations = 0
        self.eager = eager

    def enqueue(self, copy: Callable[[], None]) -> None:
        self.queue.append(copy)
        if self.eager:
            self.run_until(len(self.queue))

    def pinned(self, shape, dtype) -> np.ndarray:
        self.pinned_allocations += 1
        return np.full(shape, 0xEE, dtype)  # garbage until a copy lands

    def event(self) -> "DeferredEvent":
        return DeferredEvent(self)

    @property
    def stream(self) -> "DeferredCard":
        return self  # the card's one stream: synchronizing it runs every queued copy

    def synchronize(self) -> None:
        self.run_until(len(self.queue))

    def run_until(self, mark: int) -> None:
        while self.done < mark:
            self.queue[self.done]()
            self.done += 1


class DeferredEvent:
    def __init__(self, card: DeferredCard):
        self.card, self.mark = card, 0

    def record(self, stream=None) -> "DeferredEvent":
        self.mark = len(self.card.queue)
        return self

    def synchronize(self) -> None:
        self.card.run_until(self.mark)


class DeferredBuffer:
    def __init__(self, card: DeferredCard, data: np.ndarray, label: str = "buf"):
        self.card, self.data, self.label, self.nbytes = card, data, label, data.nbytes

    def view(self, offset: int, nbytes: int) -> "DeferredBuffer":
        assert 0 <= offset and offset + nbytes <= self.nbytes
        return DeferredBuffer(self.card, self.data[offset : offset + nbytes], self.label)

    def download_async(self, out: np.ndarray, stream=None) -> None:
        assert out.flags.c_contiguous and out.nbytes <= self.nbytes
        self.card.enqueue(lambda: out.__setitem__(slice(None), self.data[: out.nbytes]))

    def upload_async(self, array: np.ndarray, stream=None) -> None:
        # the copy reads the host bytes when it runs, not when it is queued, as a DMA from pinned memory does
        self.card.enqueue(lambda: self.data.__setitem__(slice(0, array.nbytes), array.view(np.uint8)))


SIZES = [0, 1, 63, 64, 65, 200, 7, 128, 3]  # around a 64-byte half: empty, small, exact, chunked, packed


def pieces_of(card: DeferredCard, rng: np.random.Generator) -> list[DeferredBuffer]:
    return [DeferredBuffer(card, rng.integers(0, 256, n, dtype=np.uint8), f"piece{i}") for i, n in enumerate(SIZES)]


@pytest.mark.parametrize("eager", [False, True], ids=["late", "eager"])
def test_downloads_land_in_each_array_through_two_small_halves(eager):
    card, rng = DeferredCard(eager), np.random.default_rng(0)
    device = pieces_of(card, rng)
    hosts = [np.zeros(n, np.uint8) for n in SIZES]
    staging = HostStaging(card, half_bytes=64)
    staging.download(list(zip(device, hosts)))
    for buf, host in zip(device, hosts):
        np.testing.assert_array_equal(host, buf.data, err_msg=buf.label)
    assert card.done == len(card.queue) and card.pinned_allocations == 1


@pytest.mark.parametrize("eager", [False, True], ids=["late", "eager"])
def test_uploads_reach_each_piece_although_the_halves_are_refilled(eager):
    card, rng = DeferredCard(eager), np.random.default_rng(1)
    device = [DeferredBuffer(card, np.zeros(n, np.uint8), f"piece{i}") for i, n in enumerate(SIZES)]
    hosts = [rng.integers(0, 256, n, dtype=np.uint8) for n in SIZES]
    staging = HostStaging(card, half_bytes=64)
    staging.upload(list(zip(hosts, device)))
    for buf, host in zip(device, hosts):
        np.testing.assert_array_equal(buf.data, host, err_msg=buf.label)
    staging.upload(list(zip(hosts[::-1], device[::-1])))  # a second call reuses the same pinned halves
    assert card.pinned_allocations == 1


@pytest.mark.parametrize("eager", [False, True], ids=["late", "eager"])
def test_typed_arrays_round_trip_bit_for_bit(eager):
    """Snapshots hold fp32 GDN states and uint8 KV rows: both go as their bytes."""
    card, rng = DeferredCard(eager), np.random.default_rng(2)
    state = rng.standard_normal(100).astype(np.float32)
    device = DeferredBuffer(card, np.zeros(state.nbytes, np.uint8), "state")
    staging = HostStaging(card, half_bytes=48)
    staging.upload([(state, device)])
    back = np.empty(100, np.float32)
    staging.download([(device, back)])
    assert back.tobytes() == state.tobytes()


def test_mismatched_or_strided_arrays_are_refused_before_any_copy():
    card = DeferredCard()
    device = DeferredBuffer(card, np.zeros(16, np.uint8), "piece")
    staging = HostStaging(card, half_bytes=64)
    with pytest.raises(ValueError, match="8 bytes for 'piece' of 16"):
        staging.download([(device, np.zeros(8, np.uint8))])
    with pytest.raises(ValueError, match="C-contiguous"):
        staging.upload([(np.zeros(32, np.uint8)[::2], device)])
    good = DeferredBuffer(card, np.zeros(200, np.uint8), "good")  # a batch of its own, ahead of the bad piece
    with pytest.raises(ValueError, match="8 bytes for 'piece' of 16"):
        staging.upload([(np.ones(200, np.uint8), good), (np.zeros(8, np.uint8), device)])
    assert card.queue == [] and not good.data.any()
