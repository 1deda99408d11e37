"""The scheduler's shared prefill passes (issue 28: `PrefillBatcher`): prompts waiting together share one pass, oldest
first, each with exactly the part a pass of its own would take (a chunk, or up to a due snapshot), where the backend
lets them share (here as on CUDA: at most a chunk in all, every part more than 8 tokens); a pass that fails fails
its own jobs only; a backend without the capability prefills one job per pass as before."""

from __future__ import annotations

import queue
from collections.abc import Mapping, Sequence

import pytest

from engine.fixtures.demo_model import ensure_demo_model
from engine.generation.prefix_cache import PrefixCache
from engine.generation.sampler import SamplingParams
from engine.generation.serving.generation_job import Failed, Finished, Job
from engine.generation.serving.model_service import ModelService
from engine.generation.serving.scheduler import Scheduler
from engine.generation.slots import Pick, SlotRequest, SlotSnapshot
from engine.gguf.loader import load_model

TOKEN = 7  # every pick (a plain token of the demo vocabulary)


class LoggedSlots:
    """Slots whose state is the tokens they took; logs every prefill pass and first pick. `prefill_slots` raises while
    `fail_shared` is set."""

    name = "logged"
    can_snapshot = True
    config = None

    def __init__(self, slot_count: int = 4, chunk: int = 100):
        self.slot_count, self.prefill_chunk = slot_count, chunk
        self.state: dict[int, list[int]] = {i: [] for i in range(slot_count)}
        self.log: list[tuple] = []
        self.fail_shared = False

    def reset_slot(self, slot: int) -> None:
        self.state[slot] = []

    def prefill_slot(self, slot: int, token_ids: Sequence[int]) -> None:
        self.log.append(("one", slot, len(token_ids)))
        self.state[slot] += token_ids

    def shares_prefill(self, counts: Sequence[int]) -> bool:
        return sum(counts) <= self.prefill_chunk and (len(counts) == 1 or min(counts) > 8)

    def prefill_slots(self, parts: Mapping[int, Sequence[int]]) -> None:
        if self.fail_shared:
            raise RuntimeError("the card failed")
        assert self.shares_prefill([len(p) for p in parts.values()])
        self.log.append(("shared", {slot: len(ids) for slot, ids in parts.items()}))
        for slot, ids in parts.items():
            self.state[slot] += ids

    def begin(self, slot: int, request: SlotRequest, mask=None) -> Pick:
        assert list(request.history) == self.state[slot], "a first pick before the slot took its whole prompt"
        self.log.append(("begin", slot))
        return Pick(TOKEN)

    def step(self, feeds: Mapping[int, int], masks=None) -> dict[int, Pick]:
        for slot, token in feeds.items():
            self.state[slot].append(token)
        return {slot: Pick(TOKEN) for slot in feeds}

    def snapshot_slot(self, slot: int) -> SlotSnapshot:
        self.log.append(("snapshot", slot, len(self.state[slot])))
        return SlotSnapshot(list(self.state[slot]), 4 * len(self.state[slot]))

    def restore_slot(self, slot: int, snapshot: SlotSnapshot) -> None:
        self.state[slot] = list(snapshot.state)

    def close(self) -> None:
        """Nothing to release."""


class OneAtATime(LoggedSlots):
    """The same slots without the capability."""

    prefill_slots = shares_prefill = None  # type: ignore[assignment]


@pytest.fixture(scope="module")
def service() -> ModelService:
    return ModelService.from_loaded(load_model(ensure_demo_model()))


def serve(service: ModelService, slots: LoggedSlots, prompts: list[list[int]], cache: PrefixCache | None = None,
          turn_starts: Sequence[int] = ()) -> list[list]:
    """Every prompt queued at once (3 tokens each, greedy); each job's events."""
    events: list[list] = [[] for _ in prompts]
    jobs: queue.Queue = queue.Queue()
    for i, prompt in enumerate(prompts):
        job = Job(prompt, SamplingParams(temperature=0.0), 3, False, None, [], events[i].append)
        job.turn_start = turn_starts[i] if turn_starts else 0
        jobs.put(job)
    jobs.put(None)
    Scheduler(slots, service.tokenizer, cache).run(jobs)  # type: ignore[arg-type]
    return events


def prompt(n: int, start: int = 100) -> list[int]:
    return list(range(start, start + n))


def test_prompts_waiting_together_share_passes_oldest_first_none_cut_to_fit(service):
    slots = LoggedSlots()
    events = serve(service, slots, [prompt(30), prompt(50, 200), prompt(60, 300), prompt(20, 400)])
    passes = [entry for entry in slots.log if entry[0] != "begin"]
    assert passes == [("shared", {0: 30, 1: 50, 3: 20}), ("one", 2, 60)]  # 60 would not fit beside 30 + 50
    assert slots.log[1:4] == [("begin", 0), ("begin", 1), ("begin", 3)]  # each begins after the shared pass
    assert all(isinstance(e[-1], Finished) and e[-1].completion_tokens == 3 for e in events)


def test_a_short_part_takes_its_pass_alone(service):
    """A part of 8 tokens or fewer would take other kernels alone (the GEMV) than in a shared pass: it never shares."""
    slots = LoggedSlots()
    serve(service, slots, [prompt(5), prompt(30, 200), prompt(40, 300)])
    assert [entry for entry in slots.log if entry[0] != "begin"] == [("one", 0, 5), ("shared", {1: 30, 2: 40})]


def test_a_due_snapshot_cuts_a_prompts_part_of_a_shared_pass(service):
    """The first prompt's state is kept at its turn start (20): its part stops there, the others fill the pass."""
    slots, cache = LoggedSlots(), PrefixCache(1 << 20)
    serve(service, slots, [prompt(30), prompt(40, 200)], cache, turn_starts=[20, 0])
    assert slots.log[:2] == [("shared", {0: 20, 1: 40}), ("snapshot", 0, 20)]
    assert ("one", 0, 10) in slots.log


def test_a_failed_pass_fails_its_own_jobs_only(service):
    """Two jobs share the pass that fails; a job queued after them is served."""
    slots = LoggedSlots(slot_count=2)
    slots.fail_shared = True
    events = serve(service, slots, [prompt(10), prompt(12, 200), prompt(9, 300)])
    assert [type(e[-1]) for e in events] == [Failed, Failed, Finished]
    assert "the card failed" in events[0][-1].message
    assert ("one", 0, 9) in slots.log or ("one", 1, 9) in slots.log


def test_a_backend_without_the_capability_prefills_one_job_per_pass(service):
    slots = OneAtATime()
    serve(service, slots, [prompt(30), prompt(40, 200)])
    assert [entry for entry in slots.log if entry[0] != "begin"] == [("one", 0, 30), ("one", 1, 40)]
