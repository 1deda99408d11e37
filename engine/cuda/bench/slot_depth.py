"""Slots that read their caches to a depth without a prefill: what every decode benchmark steps."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from engine.cuda.slot_decoder import SlotDecoder


@contextmanager
def slots_at_depth(dec: SlotDecoder, streams: int, depth: int) -> Iterator[None]:
    """Slots 0..streams-1 read their caches to `depth` inside the block (without filling them: the values do
    not change the speed) and are empty after it."""
    for slot in range(streams):
        dec.seqs[slot].next_position = depth
    try:
        yield
    finally:
        for slot in range(streams):
            dec.seqs[slot].reset()
