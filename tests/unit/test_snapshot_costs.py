"""What the CUDA backend says a snapshot costs (`snapshot_costs`), on stand-in cards: each part unknown until every card
has timed it (a staged copy in each direction, a long enough prefill chunk), then the slot's bytes at the last timed
rates (the slowest card's) beside every card's prefill share."""

from __future__ import annotations

import pytest

from engine.cuda.backend import CudaBackend
from engine.cuda.prefill_clock import MIN_TIMED_TOKENS, PrefillClock
from engine.fixtures.demo_model import ensure_demo_model
from engine.generation.backend import CardSpec
from engine.generation.slots import SnapshotCosts
from engine.gguf.loader import load_model
from fake_card import FakeCard


@pytest.fixture(scope="module")
def demo():
    return load_model(ensure_demo_model())


class StubEvent:
    def __init__(self, at_ms: float, done: bool = True):
        self.at_ms, self._done = at_ms, done

    def done(self) -> bool:
        return self._done

    def elapsed_ms(self, start: "StubEvent") -> float:
        assert self._done, "read before the card passed it"
        return self.at_ms - start.at_ms


class StubCard:
    """Hands out the events a test scripted, in order: `card.event().record()` is the next one."""

    def __init__(self, events: list[StubEvent]):
        self.events = list(events)

    def event(self) -> "StubCard":
        return self

    def record(self, stream=None) -> StubEvent:
        return self.events.pop(0)


def test_the_clock_reads_only_chunks_the_card_has_finished_and_long_enough():
    card = StubCard([StubEvent(0.0), StubEvent(8.0), StubEvent(10.0), StubEvent(30.0, done=False)])
    clock = PrefillClock(card)  # type: ignore[arg-type]
    with clock.chunk(MIN_TIMED_TOKENS - 1):
        pass  # too short: no events taken
    assert clock.seconds_per_token() is None
    with clock.chunk(64):
        pass
    assert clock.seconds_per_token() == pytest.approx(8e-3 / 64)
    with clock.chunk(100):
        pass  # its end is still ahead of the card: the last finished chunk's figure stands
    assert clock.seconds_per_token() == pytest.approx(8e-3 / 64)
    assert card.events == []


def test_each_part_is_priced_once_every_card_has_timed_it(demo):
    pipe = CudaBackend(demo, [CardSpec(0)] * 2, context=96, slots=2, chunk=64, card_factory=FakeCard)
    try:
        assert pipe.snapshot_costs(40) == SnapshotCosts()
        pipe.prefill_slot(0, list(range(40)))  # one chunk of 40 on each card: the stand-in's events say 1 ms each
        costs = pipe.snapshot_costs(40)
        assert costs.copy_out is None and costs.copy_in is None and costs.prefill == pytest.approx(2e-3)
        first, second = (st.decoder for st in pipe.stages)
        first.staging.seconds_per_byte.update(out=1e-9, **{"in": 2e-9})
        second.staging.seconds_per_byte.update(out=3e-9)  # the second card has not restored yet
        costs = pipe.snapshot_costs(40)
        assert costs.copy_in is None
        bytes_first, bytes_second = first.seqs[0].snapshot_bytes(40), second.seqs[0].snapshot_bytes(40)
        assert costs.copy_out == pytest.approx(max(bytes_first * 1e-9, bytes_second * 3e-9))
        assert bytes_first > first.seqs[0].snapshot_bytes(0) > 0  # KV rows on top of the states
    finally:
        pipe.close()
