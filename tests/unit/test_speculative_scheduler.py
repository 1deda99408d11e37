"""The scheduler with steps that return several tokens (speculative decoding): every token passes the stop
rules in order (stop strings, max_tokens, end tokens mid-run), and the slot records what its state consumed."""

from __future__ import annotations

import queue
from collections.abc import Mapping, Sequence

import pytest

from engine.generation.output_parser import ContentDelta
from engine.generation.sampler import SamplingParams
from engine.generation.slots import Pick, SlotRequest
from engine.fixtures.demo_model import ensure_demo_model
from engine.gguf.loader import load_model
from engine.generation.serving.generation_job import Finished, Job, Piece
from engine.generation.serving.model_service import ModelService
from engine.generation.serving.scheduler import Scheduler


class RunSlots:
    """One slot whose steps return `width` tokens of a script at a time, as a speculating backend's do."""

    name = "runs"
    slot_count = 1
    prefill_chunk = 1 << 30
    can_snapshot = False

    def __init__(self, config, script: Sequence[int], width: int):
        self.config, self.script, self.width = config, list(script), width
        self.pos = 0
        self.fed: list[int] = []
        self.requests: list[SlotRequest] = []

    def reset_slot(self, slot: int) -> None:
        self.pos = 0

    def prefill_slot(self, slot: int, token_ids: Sequence[int]) -> None:
        """The script does not depend on the prompt."""

    def begin(self, slot: int, request: SlotRequest, mask=None) -> Pick:
        self.requests.append(request)
        self.pos = 1
        return Pick(self.script[0])

    def step(self, feeds: Mapping[int, int], masks=None) -> dict[int, Pick]:
        self.fed.append(feeds[0])
        run = self.script[self.pos : self.pos + self.width]
        self.pos += self.width
        return {0: Pick(run[0], None, tuple(run[1:]))}

    def snapshot_slot(self, slot: int) -> None:
        return None

    def restore_slot(self, slot: int, snapshot) -> None:
        raise AssertionError("nothing to restore without snapshots")

    def close(self) -> None:
        """Nothing to release."""


@pytest.fixture(scope="module")
def service() -> ModelService:
    return ModelService.from_loaded(load_model(ensure_demo_model()))


def serve(service: ModelService, script: list[int], width: int, max_tokens: int = 50, stop: list[str] | None = None,
          speculative: bool = True) -> tuple[str, Finished, RunSlots, Scheduler]:
    slots = RunSlots(None, script, width)
    scheduler = Scheduler(slots, service.tokenizer)  # type: ignore[arg-type]
    events: list = []
    job = Job(service.tokenizer.encode("a prompt"), SamplingParams(), max_tokens, False, None, stop or [],
              events.append, speculative=speculative)
    jobs: queue.Queue = queue.Queue()
    jobs.put(job)
    jobs.put(None)
    scheduler.run(jobs)
    text = "".join(e.text for p in events if isinstance(p, Piece) for e in p.events if isinstance(e, ContentDelta))
    finished = [e for e in events if isinstance(e, Finished)]
    assert len(finished) == 1, events
    return text, finished[0], slots, scheduler


def consumed(slots: RunSlots) -> list[int]:
    """What the scripted state has consumed: every token of every step but the last one picked."""
    return slots.script[: min(slots.pos, len(slots.script)) - 1]


def test_a_stop_string_inside_a_run_ends_the_reply_there(service):
    script = service.tokenizer.encode("one two three STOP four five six seven eight nine ten")
    text, done, slots, scheduler = serve(service, script, width=3, stop=["STOP"])
    assert text.rstrip() == "one two three" and done.finish_reason == "stop"  # the parser trims the end
    assert slots.pos < len(script)  # it stopped inside the script, not at its end
    assert scheduler.slots[0].tokens == service.tokenizer.encode("a prompt") + consumed(slots)


@pytest.mark.parametrize("max_tokens", [1, 2, 4, 5])
def test_max_tokens_inside_a_run(service, max_tokens):
    script = service.tokenizer.encode(" alpha beta gamma delta epsilon zeta eta theta")
    _, done, slots, scheduler = serve(service, script, width=3, max_tokens=max_tokens)
    assert done.completion_tokens == max_tokens and done.finish_reason == "length"
    assert scheduler.slots[0].tokens[len(service.tokenizer.encode("a prompt")):] == consumed(slots)


def test_an_end_token_inside_a_run_stops_before_it(service):
    words = service.tokenizer.encode(" red green blue")
    eos = next(iter(service.tokenizer.eos_ids))
    script = words[:2] + [eos] + words[2:] + words
    text, done, _, _ = serve(service, script, width=3)
    assert text == service.tokenizer.decode(words[:2]) and done.finish_reason == "stop"
    assert done.completion_tokens == 2


def test_every_token_of_a_run_reaches_the_output_in_order(service):
    script = service.tokenizer.encode(" the quick brown fox jumps over the lazy dog")
    for width in (1, 2, 3):
        text, done, slots, _ = serve(service, script + [next(iter(service.tokenizer.eos_ids))] * 3, width)
        assert text == service.tokenizer.decode(script) and done.completion_tokens == len(script)
        assert slots.fed == slots.script[: len(slots.fed) * width : width]  # each step feeds its run's last token


def test_the_request_flag_reaches_the_slot(service):
    script = service.tokenizer.encode(" x y z")
    for flag in (True, False):
        _, _, slots, _ = serve(service, script, 1, max_tokens=2, speculative=flag)
        assert slots.requests[0].speculative is flag
