"""Slots that read their caches to a depth without a prefill: what every decode benchmark steps."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from engine.cuda.bench.profile import recorded_launches
from engine.cuda.driver import Kernel
from engine.cuda.slot_decoder import SlotDecoder, step_launches


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


@contextmanager
def recorded_step(dec: SlotDecoder, width: int, depth: int) -> Iterator[list[tuple[Kernel, tuple, dict]]]:
    """The launches of one slot-indexed decode step of `width` rows at `depth` (what the width's step graph holds),
    recorded while they run once; inside the block the slots stay at that depth, so the launches can be replayed
    (`profile.replay`), whole or in part, against the same state."""
    with slots_at_depth(dec, width, depth):
        dec.prepare_step(list(range(width)))
        with recorded_launches() as launches:
            step_launches(dec.fwd, dec.batch, dec.sampling, width)
        dec.card.synchronize()
        yield launches
