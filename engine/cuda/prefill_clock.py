"""A card's recent prefill speed, read from events around its prefill chunks without waiting for them.

Why: whether a prefix cache snapshot pays depends on the rig. Restoring one moves the slot's GDN states and KV rows
over the host link (50 MB for a 9B slot: about 0.2 s each way over a CMP's PCIe Gen1 x1, 5-40 ms on the H200), while
re-prefilling its tokens costs what this card's prefill costs (`CudaBackend.snapshot_costs`). The card times its
own chunks: an event before and after each one's forward pass; a chunk's time is read once its end event has passed,
so asking never stalls the card. Chunks shorter than MIN_TIMED_TOKENS are not timed: their fixed costs would make a
prefill of many tokens look dearer than it is.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

from engine.cuda.driver import CudaCard, Event

MIN_TIMED_TOKENS = 32
PENDING = 8  # chunks whose end has not been read yet (older ones are dropped unread)


class PrefillClock:
    """The last timed prefill chunk's seconds a token on one card (call on the card's thread)."""

    def __init__(self, card: CudaCard):
        self.card = card
        self._pending: deque[tuple[Event, Event, int]] = deque(maxlen=PENDING)
        self._seconds_per_token: float | None = None

    @contextmanager
    def chunk(self, tokens: int) -> Iterator[None]:
        """Time the card work queued inside the block, a prefill chunk of `tokens` tokens."""
        if tokens < MIN_TIMED_TOKENS:
            yield
            return
        start = self.card.event().record()
        yield
        self._pending.append((start, self.card.event().record(), tokens))

    def seconds_per_token(self) -> float | None:
        """The newest finished chunk's device seconds a token (None before one has finished)."""
        while self._pending and self._pending[0][1].done():
            start, end, tokens = self._pending.popleft()
            self._seconds_per_token = end.elapsed_ms(start) * 1e-3 / tokens
        return self._seconds_per_token
