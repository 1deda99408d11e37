"""The scheduler launching step t+1 before step t's text work (issue 28 item 4), on a scripted backend with the
`StepLauncher` capability: the replies equal those of the same backend stepped plainly, every slot's tokens
are what its state consumed (a job that ends while its next step runs counts that step's token), and steps
are launched early only when every pick decides its job's next feed by itself."""

from __future__ import annotations

import queue
from collections.abc import Mapping, Sequence

import pytest

from engine.fixtures.demo_model import ensure_demo_model
from engine.generation.output_parser import ContentDelta
from engine.generation.sampler import SamplingParams
from engine.generation.serving.early_launch import UNSURE, next_feed
from engine.generation.serving.generation_job import Finished, Job, JobOutput, Piece
from engine.generation.serving.model_service import ModelService
from engine.generation.serving.scheduler import Scheduler
from engine.generation.slots import Pick, SlotRequest
from engine.gguf.loader import load_model


class ScriptSlots:
    """Slots that pick the next token of their own script whatever they are fed, and record what they consume."""

    name = "script"
    prefill_chunk = 1 << 30
    can_snapshot = False
    config = None

    def __init__(self, scripts: Sequence[Sequence[int]]):
        self.scripts = [list(s) for s in scripts]
        self.slot_count = len(scripts)
        self.pos = [0] * self.slot_count
        self.consumed: list[list[int]] = [[] for _ in scripts]
        self.log: list[str] = []
        self._pending: dict[int, Pick] | None = None

    def reset_slot(self, slot: int) -> None:
        self.consumed[slot] = []

    def prefill_slot(self, slot: int, token_ids: Sequence[int]) -> None:
        self.consumed[slot] += token_ids

    def begin(self, slot: int, request: SlotRequest, mask=None) -> Pick:
        self.pos[slot] = 1
        return Pick(self.scripts[slot][0])

    def step(self, feeds: Mapping[int, int], masks=None) -> dict[int, Pick]:
        assert self._pending is None, "a step while another is in flight"
        self.log.append(f"step {sorted(feeds)}")
        return self._run(feeds)

    def _run(self, feeds: Mapping[int, int]) -> dict[int, Pick]:
        picks = {}
        for slot, token in feeds.items():
            self.consumed[slot].append(token)
            picks[slot] = Pick(self.scripts[slot][self.pos[slot]])
            self.pos[slot] += 1
        return picks

    def snapshot_slot(self, slot: int) -> None:
        return None

    def restore_slot(self, slot: int, snapshot) -> None:
        raise AssertionError("no snapshots")

    def close(self) -> None:
        """Nothing to release."""


class LaunchingSlots(ScriptSlots):
    """The same, with `launch`/`collect`."""

    def launch(self, feeds: Mapping[int, int], masks=None) -> bool:
        assert self._pending is None, "a launch while another step is in flight"
        self.log.append(f"launch {sorted(feeds)}")
        self._pending = self._run(feeds)
        return True

    def collect(self) -> dict[int, Pick]:
        picks, self._pending = self._pending, None
        assert picks is not None, "collect without a launch"
        return picks


@pytest.fixture(scope="module")
def service() -> ModelService:
    return ModelService.from_loaded(load_model(ensure_demo_model()))


def run(service: ModelService, slots: ScriptSlots, jobs_args: list[dict], on_piece=None) -> tuple[list[str], list, Scheduler]:
    scheduler = Scheduler(slots, service.tokenizer)  # type: ignore[arg-type]
    events: list[list] = [[] for _ in jobs_args]
    jobs: queue.Queue = queue.Queue()
    made = []
    for i, args in enumerate(jobs_args):
        def sink(e, i=i):
            events[i].append(e)
            if on_piece is not None and isinstance(e, Piece):
                on_piece(made[i], len(events[i]))
        job = Job(service.tokenizer.encode(f"prompt {i}"), SamplingParams(), args.get("max_tokens", 30), False, None,
                  args.get("stop", []), sink)
        made.append(job)
        jobs.put(job)
    jobs.put(None)
    scheduler.run(jobs)
    texts = ["".join(e.text for p in evs if isinstance(p, Piece) for e in p.events if isinstance(e, ContentDelta))
             for evs in events]
    return texts, [evs[-1] for evs in events], scheduler


def scripts(service: ModelService) -> list[list[int]]:
    tok = service.tokenizer
    eos = next(iter(tok.eos_ids))
    words = tok.encode(" one two three four five six seven eight nine ten eleven twelve")
    return [words * 3, words[:5] + [eos] + words, words[3:] * 3]


def test_launched_steps_give_the_same_replies_and_states(service):
    jobs = [{"max_tokens": 30}, {"max_tokens": 30}, {"max_tokens": 7}]
    plain_texts, plain_done, _ = run(service, ScriptSlots(scripts(service)), jobs)
    slots = LaunchingSlots(scripts(service))
    texts, done, scheduler = run(service, slots, jobs)
    assert texts == plain_texts and [d.finish_reason for d in done] == [d.finish_reason for d in plain_done]
    assert [d.completion_tokens for d in done] == [d.completion_tokens for d in plain_done]
    assert sum(entry.startswith("launch") for entry in slots.log) > 20
    for s in scheduler.slots:  # no job ran past its end: an end token and max_tokens are known before the text
        assert s.tokens == slots.consumed[s.index]


def test_a_job_cancelled_while_its_next_step_runs_counts_that_token(service):
    slots = LaunchingSlots(scripts(service)[:1])

    def cancel(job, n):
        if n == 5:
            job.cancelled.set()

    texts, done, scheduler = run(service, slots, [{"max_tokens": 30}], on_piece=cancel)
    assert isinstance(done[0], Finished) and done[0].completion_tokens < 30
    assert scheduler.slots[0].tokens == slots.consumed[0]  # the launched step's token is in the state


def test_stop_strings_keep_steps_plain(service):
    slots = LaunchingSlots(scripts(service)[:1])
    texts, done, _ = run(service, slots, [{"max_tokens": 30, "stop": ["nine"]}])
    assert "nine" not in texts[0] and done[0].finish_reason == "stop"
    assert not any(entry.startswith("launch") for entry in slots.log)


def test_next_feed_is_sure_only_when_the_pick_decides(service):
    tok = service.tokenizer
    eos = next(iter(tok.eos_ids))
    job = Job([1, 2], SamplingParams(), 3, False, None, [], lambda e: None)
    out = JobOutput(job, tok)
    assert next_feed(job, out, Pick(5), tok.eos_ids) == 5
    assert next_feed(job, out, Pick(eos), tok.eos_ids) is None and next_feed(job, out, Pick(-1), tok.eos_ids) is None
    assert next_feed(job, out, Pick(5, None, (6,)), tok.eos_ids) is UNSURE  # a speculative run
    out.generated = 2
    assert next_feed(job, out, Pick(5), tok.eos_ids) is None  # the last token max_tokens allows
    stops = Job([1, 2], SamplingParams(), 3, False, None, ["x"], lambda e: None)
    assert next_feed(stops, JobOutput(stops, tok), Pick(5), tok.eos_ids) is UNSURE
