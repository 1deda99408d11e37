"""A masked step's host work overlaps its forward pass (issue 28: with a fresh mask in each of 4 rows the card
sat idle 214-220 µs a step while the host looked the masks up and uploaded them). The scheduler hands the
backend a callable instead of the masks; the CUDA slot decoder queues the forward pass's graph, calls it, queues
the masks' uploads on its mask stream (which waits only for earlier work) and then the picks, after those
uploads. Checked on a scripted backend and on the stand-in card, which records launches and stream waits."""

from __future__ import annotations

import queue
from collections.abc import Mapping

import numpy as np
import pytest

from engine.cuda.slot_decoder import SlotDecoder
from engine.cuda.token_masks import NO_MASK
from engine.cuda.weights import upload_weights
from engine.fixtures.demo_model import ensure_demo_model
from engine.generation.output_parser import ContentDelta
from engine.generation.sampler import SamplingParams
from engine.generation.serving.generation_job import Failed, Finished, Job, Piece
from engine.generation.serving.model_service import ModelService
from engine.generation.serving.scheduler import Scheduler
from engine.generation.slots import SlotRequest
from engine.generation.token_mask import mask_of, masks_now
from engine.gguf.loader import load_model
from fake_card import FakeCard
from test_early_launch import LaunchingSlots, ScriptSlots

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def demo():
    return load_model(ensure_demo_model())


@pytest.fixture(scope="module")
def service(demo) -> ModelService:
    return ModelService.from_loaded(demo)


class AnyToken:
    """A grammar that allows every token; it fails when asked for its mask after `fail_after` picks, and its
    document is complete after `complete_after`. `asked` notes how many picks it had taken at each mask."""

    def __init__(self, vocab: int, fail_after: int | None = None, complete_after: int | None = None):
        self.vocab, self.fail_after, self.complete_after = vocab, fail_after, complete_after
        self.accepted = 0
        self.asked: list[int] = []

    @property
    def complete(self) -> bool:
        return self.complete_after is not None and self.accepted >= self.complete_after

    def mask(self, remaining: int) -> np.ndarray:
        self.asked.append(self.accepted)
        if self.fail_after is not None and self.accepted >= self.fail_after:
            raise ValueError("the grammar broke")
        return mask_of(np.ones(self.vocab, bool))

    def accept(self, token: int) -> None:
        self.accepted += 1


class MaskRecordingSlots(ScriptSlots):
    """Script slots that note whether each step's masks came as a callable and which slots they masked."""

    def __init__(self, scripts):
        super().__init__(scripts)
        self.mask_calls: list[tuple[bool, list[int]]] = []

    def step(self, feeds: Mapping[int, int], masks=None):
        lazy = callable(masks)
        picks = super().step(feeds)  # the "forward pass" runs before the masks are asked for
        self.mask_calls.append((lazy, sorted(masks_now(masks))))
        return picks


def run_jobs(service: ModelService, slots: ScriptSlots, constraints: list) -> tuple[list, list[str], Scheduler]:
    scheduler = Scheduler(slots, service.tokenizer)  # type: ignore[arg-type]
    events: list[list] = [[] for _ in constraints]
    jobs: queue.Queue = queue.Queue()
    for i, constraint in enumerate(constraints):
        jobs.put(Job(service.tokenizer.encode(f"prompt {i}"), GREEDY, 12, False, None, [],
                     events[i].append, constraint=constraint))
    jobs.put(None)
    scheduler.run(jobs)
    texts = ["".join(e.text for p in evs if isinstance(p, Piece) for e in p.events if isinstance(e, ContentDelta))
             for evs in events]
    return [evs[-1] for evs in events], texts, scheduler


def test_the_scheduler_hands_masks_as_a_callable_and_a_broken_grammar_fails_only_its_job(service):
    """The masked job's grammar breaks after its third pick, inside the step that fed it: that job alone fails
    with the grammar's error, its slot's state (which took the fed token) is reset, and the plain job beside it
    gets the same reply as when it runs alone. Steps with no masked slot get no masks at all."""
    tok = service.tokenizer
    words = tok.encode(" one two three four five six seven eight nine ten eleven twelve")
    vocab = tok.vocab_size
    _, alone_texts, _ = run_jobs(service, MaskRecordingSlots([words]), [None])
    slots = MaskRecordingSlots([words, words[2:] + words])
    done, texts, scheduler = run_jobs(service, slots, [None, AnyToken(vocab, fail_after=3)])
    assert isinstance(done[1], Failed) and "the grammar broke" in done[1].message
    assert isinstance(done[0], Finished) and texts[0] == alone_texts[0]
    assert scheduler.slots[1].tokens == [] and slots.consumed[1] == []  # reset after the step that fed it
    assert scheduler.slots[0].tokens == slots.consumed[0]
    lazy = [i for i, (called, _) in enumerate(slots.mask_calls) if called]
    assert [slots.mask_calls[i][1] for i in lazy] == [[1], [1], []]  # the third step's grammar broke
    assert lazy == list(range(lazy[0], lazy[0] + 3))
    assert all(not called and masked == [] for called, masked in slots.mask_calls[lazy[-1] + 1 :])


class MaskedLaunchingSlots(LaunchingSlots):
    """Launching script slots with `launch_forward` / `launch_picks`: the "forward pass" consumes the feeds at
    once, the picks are made when the masks come; the log notes both and which slots were masked."""

    def __init__(self, scripts):
        super().__init__(scripts)
        self._forward: Mapping[int, int] | None = None

    def launch_forward(self, feeds: Mapping[int, int]) -> bool:
        assert self._pending is None and self._forward is None, "a launch while another step is in flight"
        self.log.append(f"forward {sorted(feeds)}")
        self._forward = feeds
        return True

    def step(self, feeds: Mapping[int, int], masks=None):
        masks_now(masks)  # as a backend does, callable or not
        return super().step(feeds)

    def launch_picks(self, masks) -> None:
        assert self._forward is not None, "picks without a forward pass"
        self.log.append(f"picks {sorted(masks_now(masks))}")
        feeds, self._forward = self._forward, None
        self._pending = self._run(feeds)

    def prefill_slot(self, slot, token_ids) -> None:
        assert self._forward is None, "a prefill between a forward pass and its picks"
        super().prefill_slot(slot, token_ids)


def test_masked_steps_launch_their_forward_pass_before_the_text_work_and_their_picks_after(service):
    """With the masked-step capability the scheduler launches a masked step's forward pass as soon as the picks
    decide the feeds, and its picks after the text work, so each mask is made after its grammar took the previous
    pick (as when stepping plainly): the replies equal the plain backend's, every slot's tokens are what its state
    consumed, and a job whose document completes while its next step runs counts that step's token."""
    tok = service.tokenizer
    words = tok.encode(" one two three four five six seven eight nine ten eleven twelve")
    vocab = tok.vocab_size

    def grammars():
        return [AnyToken(vocab), None, AnyToken(vocab, complete_after=5)]

    scripts = [words, words[1:] + words, words[2:] + words]
    plain_done, plain_texts, _ = run_jobs(service, ScriptSlots(scripts), grammars())
    slots = MaskedLaunchingSlots(scripts)
    used = grammars()
    done, texts, scheduler = run_jobs(service, slots, used)
    assert texts == plain_texts
    assert [d.completion_tokens for d in done] == [d.completion_tokens for d in plain_done] == [12, 12, 5]
    assert sum(entry.startswith("forward") for entry in slots.log) > 5
    assert all(asked == i for i, asked in enumerate(used[0].asked))  # mask i made after its grammar took i picks
    for s in scheduler.slots:
        assert s.tokens == slots.consumed[s.index]
    assert len(scheduler.slots[2].tokens) == len(tok.encode("prompt 2")) + 5  # its 5 picks, the last fed once


def test_a_grammar_that_breaks_under_a_launched_step_ends_only_its_job(service):
    """The masked job's grammar fails when asked for the mask of a step whose forward pass is already launched:
    that job fails, its slot is reset after the step's picks are queued, and the other job is untouched."""
    tok = service.tokenizer
    words = tok.encode(" one two three four five six seven eight nine ten eleven twelve")
    _, alone_texts, _ = run_jobs(service, ScriptSlots([words]), [None])
    slots = MaskedLaunchingSlots([words, words[2:] + words])
    done, texts, scheduler = run_jobs(service, slots, [None, AnyToken(tok.vocab_size, fail_after=3)])
    assert isinstance(done[1], Failed) and "the grammar broke" in done[1].message
    assert isinstance(done[0], Finished) and texts[0] == alone_texts[0]
    assert scheduler.slots[1].tokens == [] and slots.consumed[1] == []
    assert scheduler.slots[0].tokens == slots.consumed[0]
    assert any(entry.startswith("forward") for entry in slots.log)


def masked_decoder(demo, slots: int = 3) -> tuple[FakeCard, SlotDecoder]:
    card = FakeCard()
    dec = SlotDecoder(card, demo.config, upload_weights(card, demo.file, demo.config), context=64, slots=slots,
                      chunk=16)
    for slot in range(slots):
        dec.prefill_slot(slot, [4, 5, 6])
        dec.begin(slot, SlotRequest(GREEDY, (), masked=slot == 2))
    return card, dec


def names(card: FakeCard) -> list[str]:
    return [name for name, *_ in card.launches]


def test_a_masked_step_queues_its_forward_pass_before_it_asks_for_the_masks(demo):
    """The order on the card: the forward pass's graph (no sampler in it), the mask stream's wait, then (after
    the callable ran) the card's stream waits for the uploads and the picks are launched directly. The graph is
    captured once per width; a plain step of that width still replays its one whole-step graph."""
    card, dec = masked_decoder(demo)
    mask = mask_of(np.arange(demo.config.vocab_size) % 5 == 0)
    seen: list[list[str]] = []

    def masks() -> dict[int, np.ndarray]:
        seen.append(names(card))
        return {2: mask}

    graphs = len(card.graphs)
    card.launches.clear()
    dec.step({0: 1, 1: 2, 2: 3}, {2: mask})  # the first masked step of a width captures its forward pass
    assert [g.label for g in card.graphs[graphs:]] == ["forward x3"]
    assert "sample_scores" not in names(card)[:names(card).index("<replay>")]  # none in the capture
    card.launches.clear()
    seen.clear()
    dec.step({0: 1, 1: 2, 2: 3}, masks)
    assert seen == [["<replay>", "<wait>"]]  # the forward pass was queued, then the masks were asked for
    order = names(card)
    assert order[:3] == ["<replay>", "<wait>", "<wait>"] and order[3] == "sample_scores"
    assert "logprob_partial" in order[3:] and len(card.graphs) == graphs + 1
    entries = dec.sampling.constraints.mask_entry.download(np.int32, 3).tolist()
    assert entries[:2] == [NO_MASK, NO_MASK] and entries[2] == dec.sampling.masks.entry(mask)
    dec.step({0: 1, 1: 2, 2: 3})  # a plain step captures the width's whole-step graph
    card.launches.clear()
    dec.step({0: 1, 1: 2, 2: 3})
    assert names(card) == ["<replay>"] and [g.label for g in card.graphs[graphs:]] == ["forward x3", "decode x3"]


def test_masks_that_fail_still_end_the_step_and_the_error_goes_on(demo):
    """The forward pass is on the card when the callable fails: the step's picks are still queued (unmasked)
    and waited for before the error goes on, and the decoder steps on afterwards."""
    card, dec = masked_decoder(demo)

    def broken() -> dict[int, np.ndarray]:
        raise ValueError("the grammar broke")

    position = dec.seqs[0].next_position
    card.launches.clear()
    with pytest.raises(ValueError, match="the grammar broke"):
        dec.step({0: 1, 1: 2}, broken)
    assert "sample_scores" in names(card) and dec.seqs[0].next_position == position + 1
    picks = dec.step({0: 1, 1: 2}, lambda: {})
    assert sorted(picks) == [0, 1]


def test_a_forward_pass_launched_alone_takes_its_picks_later_and_nothing_in_between(demo):
    """`launch_forward` queues the forward pass's graph only; until `launch_picks` the decoder refuses a prefill,
    a first pick or another step (they would overwrite the logits rows the picks read); then the picks come
    under the masks given, and `collect` returns them."""
    from engine.errors import RigllmError

    card, dec = masked_decoder(demo)
    mask = mask_of(np.arange(demo.config.vocab_size) % 7 == 0)
    dec.step({0: 1, 2: 3}, {2: mask})  # captures the forward pass of width 2
    card.launches.clear()
    assert dec.launch_forward({0: 1, 2: 3})
    assert names(card) == ["<replay>"]
    with pytest.raises(RigllmError, match="launch_picks comes first"):
        dec.prefill_slot(1, [4])
    with pytest.raises(RigllmError, match="launch_picks comes first"):
        dec.step({1: 2})
    with pytest.raises(RigllmError, match="launch_picks comes first"):
        dec.begin(1, SlotRequest(GREEDY, ()))
    dec.launch_picks({2: mask})
    assert names(card)[:3] == ["<replay>", "<wait>", "<wait>"] and "sample_scores" in names(card)
    assert sorted(dec.collect()) == [0, 2]
    with pytest.raises(RigllmError, match="without a forward pass"):
        dec.launch_picks({})
    dec.prefill_slot(1, [4])  # free again
