"""Copies of many device pieces to and from host arrays through one card's pinned staging buffer.

Why: the prefix cache's snapshot of a slot (engine.cuda.sequence) is many pieces (every KV plane's used rows per head,
both states of every GDN layer: 112 pieces, about 50 MB, for a 9B slot), and a synchronous copy to pageable memory
waits for the driver to bounce it through its own small staging buffer. On the H200 (s21d probe,
tests/gpu/results/2026-12-04-h200-s21d-serve-parts.json) such a snapshot took 46 ms, 50 MB in one pageable download
14 ms, the same 50 MB into pinned memory 0.96 ms; a restore took 7.3 ms. The card's other streams wait behind a
snapshot: `rigllm serve` takes one whenever a conversation reaches a new turn boundary.

Here the pieces are packed into two pinned halves in turn: the card copies one batch into (or out of) one half while
the host moves the other half's bytes between the pinned buffer and the pieces' own arrays, so the link and the host's
memcpy overlap, and the host waits once per half instead of once per piece. A piece larger than a half goes in chunks.
The copies are stream-ordered on the card's stream (after the work queued before them), and each call returns when
its last byte has landed. Each call of at least TIMED_BYTES also notes what its copies took a byte, per direction (wall
time, from the moment the work queued before it had drained), so the backend can weigh a snapshot against
re-prefilling its tokens (`SlotDecoder.snapshot_costs`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator, Sequence

import numpy as np

from engine.cuda.driver import CudaCard, DeviceBuffer, Event

STAGING_HALF_BYTES = 8 << 20  # 16 MiB of pinned host memory a card, allocated at its first staged copy
TIMED_BYTES = 1 << 20  # smaller calls are mostly fixed costs: their time a byte says little about a big one

# one copy of a batch: (the device bytes, the host array's bytes, their place in the pinned half)
Chunk = tuple[DeviceBuffer, np.ndarray, np.ndarray]


class HostStaging:
    """A card's pinned staging halves and the two staged copy directions (call on the card's thread)."""

    def __init__(self, card: CudaCard, half_bytes: int = STAGING_HALF_BYTES):
        if half_bytes <= 0:
            raise ValueError(f"staging halves need a positive size, not {half_bytes}")
        self.card, self.half_bytes = card, half_bytes
        self._halves: np.ndarray | None = None
        # the last timed call's, per direction: "out" (downloads, a snapshot) and "in" (uploads, a restore)
        self.seconds_per_byte: dict[str, float] = {}

    def _timed(self, pieces: Sequence[tuple[DeviceBuffer, np.ndarray]]) -> tuple[int, float]:
        """(bytes the call moves, its start): every piece checked first, so a bad one stops the call before any copy
        (the batches are copied as they are cut), then the start once the work queued before it has drained."""
        for device, host in pieces:
            if not host.flags.c_contiguous:
                raise ValueError(f"staged copies need C-contiguous host arrays ('{device.label}')")
            if host.nbytes != device.nbytes:
                raise ValueError(f"a host array of {host.nbytes} bytes for '{device.label}' of {device.nbytes}")
        self.card.stream.synchronize()
        return sum(host.nbytes for _, host in pieces), time.perf_counter()

    def _note(self, direction: str, nbytes: int, start: float) -> None:
        if nbytes >= TIMED_BYTES:
            self.seconds_per_byte[direction] = (time.perf_counter() - start) / nbytes

    def download(self, pieces: Sequence[tuple[DeviceBuffer, np.ndarray]]) -> None:
        """Fill each host array (C-contiguous, as many bytes as its device piece) with its device piece."""
        nbytes, start = self._timed(pieces)
        in_flight: deque[tuple[Event, list[Chunk]]] = deque()
        for batch in self._batches(pieces):
            if len(in_flight) == 2:  # the half this batch fills holds the batch before last: empty it first
                _land(*in_flight.popleft())
            for device, _, staged in batch:
                device.download_async(staged)
            in_flight.append((self.card.event().record(), batch))
        while in_flight:
            _land(*in_flight.popleft())
        self._note("out", nbytes, start)

    def upload(self, pieces: Sequence[tuple[np.ndarray, DeviceBuffer]]) -> None:
        """Copy each host array (C-contiguous, as many bytes as its device piece) into its device piece."""
        swapped = [(device, host) for host, device in pieces]
        nbytes, start = self._timed(swapped)
        in_flight: deque[Event] = deque()
        for batch in self._batches(swapped):
            if len(in_flight) == 2:  # the half this batch fills still feeds the batch before last
                in_flight.popleft().synchronize()
            for device, host, staged in batch:
                staged[:] = host
                device.upload_async(staged)
            in_flight.append(self.card.event().record())
        while in_flight:
            in_flight.popleft().synchronize()
        self._note("in", nbytes, start)

    def _batches(self, pieces: Sequence[tuple[DeviceBuffer, np.ndarray]]) -> Iterator[list[Chunk]]:
        """The pieces (checked by `_timed`) cut into batches that each fill at most one half, the halves taken in turn.
        Only places are computed here: the caller makes a half free before it copies the batch that uses it."""
        halves = self._staging()
        batch: list[Chunk] = []
        used, index = 0, 0
        for device, host in pieces:
            raw = host.reshape(-1).view(np.uint8)
            for offset in range(0, raw.nbytes, self.half_bytes):
                n = min(self.half_bytes, raw.nbytes - offset)
                if used + n > self.half_bytes:
                    yield batch
                    batch, used, index = [], 0, index + 1
                batch.append((device.view(offset, n), raw[offset : offset + n], halves[index % 2, used : used + n]))
                used += n
        if batch:
            yield batch

    def _staging(self) -> np.ndarray:
        if self._halves is None:
            self._halves = self.card.pinned((2, self.half_bytes), np.uint8)
        return self._halves


def _land(event: Event, batch: list[Chunk]) -> None:
    """Wait for a downloaded batch and move its bytes out of the pinned half into the pieces' arrays."""
    event.synchronize()
    for _, host, staged in batch:
        host[:] = staged
