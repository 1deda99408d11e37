"""The scheduler's prefix-cache snapshots weighed by the backend's measured costs (`SnapshotPricing`, `SnapshotCosts`): a
snapshot is kept only where one restore repays both copies against prefilling its tokens again, and restored only where
copying it in is quicker than that prefill; a backend that measures nothing (or has no such capability) keeps and
restores every one, as before."""

from __future__ import annotations

import queue
from collections.abc import Mapping, Sequence

import pytest

from engine.fixtures.demo_model import ensure_demo_model
from engine.generation.prefix_cache import PrefixCache
from engine.generation.sampler import SamplingParams
from engine.generation.serving.generation_job import Job
from engine.generation.serving.model_service import ModelService
from engine.generation.serving.scheduler import Scheduler
from engine.generation.slots import Pick, SlotRequest, SlotSnapshot, SnapshotCosts
from engine.gguf.loader import load_model

PROMPT = list(range(100, 140))
TURN_START = 36


class PricedSlots:
    """One slot that picks token 7 forever, keeps its state as the tokens it consumed, and prices a restore as told."""

    name = "priced"
    prefill_chunk = 1 << 30
    can_snapshot = True
    config = None
    slot_count = 1

    def __init__(self, costs: SnapshotCosts):
        self.costs = costs
        self.state: list[int] = []
        self.log: list[str] = []

    def snapshot_costs(self, tokens: int) -> SnapshotCosts:
        self.log.append(f"priced {tokens}")
        return self.costs

    def reset_slot(self, slot: int) -> None:
        self.state = []

    def prefill_slot(self, slot: int, token_ids: Sequence[int]) -> None:
        self.log.append(f"prefill {len(token_ids)}")
        self.state += token_ids

    def begin(self, slot: int, request: SlotRequest, mask=None) -> Pick:
        return Pick(7)

    def step(self, feeds: Mapping[int, int], masks=None) -> dict[int, Pick]:
        self.state += feeds.values()
        return {slot: Pick(7) for slot in feeds}

    def snapshot_slot(self, slot: int) -> SlotSnapshot:
        self.log.append(f"snapshot {len(self.state)}")
        return SlotSnapshot(list(self.state), 4 * len(self.state))

    def restore_slot(self, slot: int, snapshot: SlotSnapshot) -> None:
        self.log.append(f"restore {len(snapshot.state)}")
        self.state = list(snapshot.state)

    def close(self) -> None:
        """Nothing to release."""


@pytest.fixture(scope="module")
def service() -> ModelService:
    return ModelService.from_loaded(load_model(ensure_demo_model()))


def serve_twice(service: ModelService, slots: PricedSlots, cache: PrefixCache) -> None:
    """The same prompt twice, one after the other, on the one slot (so the second cannot reuse the live state)."""
    for _ in range(2):
        jobs: queue.Queue = queue.Queue()
        job = Job(PROMPT, SamplingParams(), 3, False, None, [], lambda e: None)
        job.turn_start = TURN_START
        jobs.put(job)
        jobs.put(None)
        Scheduler(slots, service.tokenizer, cache).run(jobs)  # type: ignore[arg-type]


@pytest.mark.parametrize("costs", [SnapshotCosts(), SnapshotCosts(1.0, None, 3.0), SnapshotCosts(2.0, 0.5, 3.0)],
                         ids=["unmeasured", "the copy in estimated as the copy out", "a restore repays both copies"])
def test_a_snapshot_that_pays_is_kept_and_restored(service, costs):
    slots, cache = PricedSlots(costs), PrefixCache(1 << 20)
    serve_twice(service, slots, cache)
    assert f"snapshot {TURN_START}" in slots.log and f"restore {TURN_START}" in slots.log
    assert slots.log.count(f"prefill {len(PROMPT) - TURN_START}") == 2  # each job prefills only past the turn start


def test_no_snapshot_where_two_copies_cost_more_than_the_prefill(service):
    """The copy in not timed yet: it is taken to cost what the copy out did."""
    slots, cache = PricedSlots(SnapshotCosts(2.0, None, 3.0)), PrefixCache(1 << 20)
    serve_twice(service, slots, cache)
    assert not any(line.startswith(("snapshot", "restore")) for line in slots.log) and len(cache) == 0
    assert slots.log.count(f"prefill {len(PROMPT)}") == 2  # whole prompts, not split at the turn start


def test_a_kept_snapshot_is_not_restored_where_the_prefill_is_quicker(service):
    """A snapshot kept earlier (say, before the link was timed) is passed over once a restore is priced dearer."""
    slots, cache = PricedSlots(SnapshotCosts(None, 4.0, 3.0)), PrefixCache(1 << 20)
    cache.put(PROMPT[:TURN_START], SlotSnapshot(PROMPT[:TURN_START], 4 * TURN_START))
    serve_twice(service, slots, cache)
    assert f"priced {TURN_START}" in slots.log
    assert not any(line.startswith("restore") for line in slots.log)
    assert slots.log.count(f"prefill {len(PROMPT)}") == 2
