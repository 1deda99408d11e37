"""Continuous batching on the card: a batched step over several slots computes what each slot computes
alone, snapshots restore exactly, and the scheduler serves many requests through the CUDA slots."""

from __future__ import annotations

import queue

import numpy as np
import pytest

from engine.cuda.backend import CudaBackend
from engine.generation.prefix_cache import PrefixCache
from engine.generation.sampler import SamplingParams
from engine.generation.slots import SlotRequest
from engine.fixtures.demo_model import ensure_demo_model
from engine.gguf.loader import load_model
from engine.generation.serving.generation_job import Finished, Job, Piece
from engine.generation.serving.model_service import ModelService
from engine.generation.serving.scheduler import Scheduler

GREEDY = SamplingParams(temperature=0.0)
# Batched and single steps run different GEMV variants (rows per launch), whose fp32 sums may be ordered
# differently; that is the only difference allowed.
BATCH_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def demo():
    return load_model(ensure_demo_model())


def rel_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def prompts(vocab: int, count: int) -> list[list[int]]:
    rng = np.random.default_rng(41)
    return [rng.integers(0, vocab, int(rng.integers(3, 90))).tolist() for _ in range(count)]


def test_batched_step_equals_each_slot_alone(demo):
    """Teacher-forced: the same tokens fed to 5 slots together and to one slot at a time give the same logits."""
    gpu = CudaBackend(demo, context=256, chunk=64, slots=5)
    asks = prompts(demo.config.vocab_size, 5)
    want_logits = SlotRequest(GREEDY, (), host_logits=True)
    try:
        alone: list[list[np.ndarray]] = []
        forced: list[list[int]] = []
        for p in asks:
            gpu.reset_slot(0)
            gpu.prefill_slot(0, p)
            pick = gpu.begin(0, want_logits)
            rows, tokens = [pick.logits], []
            for _ in range(12):
                tokens.append(int(np.argmax(rows[-1])))
                rows.append(gpu.step({0: tokens[-1]})[0].logits)
            alone.append(rows)
            forced.append(tokens)
        together: list[list[np.ndarray]] = [[] for _ in asks]
        for slot, p in enumerate(asks):
            gpu.reset_slot(slot)
            gpu.prefill_slot(slot, p)
            together[slot].append(gpu.begin(slot, want_logits).logits)
        for i in range(12):
            picks = gpu.step({slot: forced[slot][i] for slot in range(len(asks))})
            for slot in range(len(asks)):
                together[slot].append(picks[slot].logits)
    finally:
        gpu.close()
    worst = max(rel_error(t, a) for ts, as_ in zip(together, alone) for t, a in zip(ts, as_))
    print(f"batched vs alone: max rel error {worst:.2e} over {len(asks)} slots x 13 positions")
    assert worst < BATCH_TOLERANCE


def test_subsets_of_slots_and_sampling_modes_mix(demo):
    """Greedy and sampled slots in one step, graphs for different slot sets: the greedy slot's logits equal
    its logits alone bit for bit (tests/gpu/test_teeth_batches.py says why the kernels promise that), its
    pick is their arg-max, and seeded draws replay exactly."""
    gpu = CudaBackend(demo, context=128, chunk=64, slots=3)
    p = prompts(demo.config.vocab_size, 3)
    greedy = SlotRequest(GREEDY, p[0], host_logits=True)

    def run(seed: int, neighbours: bool = True) -> tuple[dict[int, list[int]], list[np.ndarray]]:
        out: dict[int, list[int]] = {}
        reqs = [greedy, SlotRequest(SamplingParams(temperature=1.0, top_k=8, seed=seed), p[1]),
                SlotRequest(SamplingParams(temperature=0.7, seed=seed + 1, repetition_penalty=1.3), p[2])]
        rows = []
        for slot, req in enumerate(reqs if neighbours else reqs[:1]):
            gpu.reset_slot(slot)
            gpu.prefill_slot(slot, p[slot])
            pick = gpu.begin(slot, req)
            out[slot] = [pick.token]
            if slot == 0:
                rows.append(pick.logits)
        for i in range(20):
            active = [s for s in out if not (s == 2 and i % 3 == 0)]  # slot 2 skips some steps
            picks = gpu.step({s: out[s][-1] for s in active})
            for s in active:
                out[s].append(picks[s].token)
            rows.append(picks[0].logits)
        return out, rows

    try:
        (first, rows), (again, _) = run(7), run(7)
        alone, alone_rows = run(7, neighbours=False)
    finally:
        gpu.close()
    assert first == again  # seeded draws replay exactly
    assert first[0] == [int(np.argmax(r)) for r in rows]  # the greedy pick is the arg-max of its logits
    assert first[0] == alone[0]
    for i, (a, b) in enumerate(zip(alone_rows, rows)):
        assert np.array_equal(a, b), f"step {i}: greedy slot's logits differ next to sampled slots, max {np.abs(a - b).max():.3e}"


def test_snapshot_restore_continues_exactly(demo):
    gpu = CudaBackend(demo, context=256, chunk=64, slots=2)
    tokens = prompts(demo.config.vocab_size, 1)[0] + [5, 6, 7, 8]
    want_logits = SlotRequest(GREEDY, (), host_logits=True)
    try:
        gpu.reset_slot(0)
        gpu.prefill_slot(0, tokens[:-4])
        snap = gpu.snapshot_slot(0)
        gpu.prefill_slot(0, tokens[-4:])
        straight = gpu.begin(0, want_logits).logits
        gpu.restore_slot(1, snap)
        gpu.prefill_slot(1, tokens[-4:])
        restored = gpu.begin(1, want_logits).logits
    finally:
        gpu.close()
    assert np.array_equal(straight, restored)


def test_scheduler_serves_more_requests_than_slots_with_prefix_reuse(demo):
    service = ModelService.from_loaded(demo)
    gpu = CudaBackend(demo, context=512, chunk=64, slots=4)
    events: dict[int, list] = {i: [] for i in range(10)}
    jobs: queue.Queue = queue.Queue()
    asks = prompts(demo.config.vocab_size, 10)
    for i, p in enumerate(asks):
        jobs.put(Job(p, GREEDY if i % 2 else SamplingParams(temperature=0.8, seed=i), 16, False, None, [],
                     events[i].append, turn_start=len(p) // 2))
    follow_up = asks[0][: len(asks[0]) // 2] + [9, 10, 11]
    jobs.put(Job(follow_up, GREEDY, 4, False, None, [], events.setdefault(10, []).append))
    jobs.put(None)
    try:
        Scheduler(gpu, service.tokenizer, PrefixCache(1 << 28)).run(jobs)
    finally:
        gpu.close()
    for i, evs in events.items():
        done = evs[-1]
        assert isinstance(done, Finished), evs[-1]
        assert all(isinstance(e, Piece) for e in evs[:-1])
    assert events[10][-1].cached_tokens == len(asks[0]) // 2


def test_logprobs_from_the_card_equal_the_host_on_the_same_rows(demo):
    """Slot 0 asks for logprobs (computed on the card), slot 1 for its logits rows (host); the same prompt,
    greedy, batched together: the same tokens, and slot 0's logprobs equal `token_logprobs` on slot 1's rows
    within the kernel test's tolerance (tests/gpu/test_logprobs_gpu.py)."""
    from engine.generation.logprobs import token_logprobs
    from tests.gpu.test_logprobs_gpu import assert_same_logprobs

    gpu = CudaBackend(demo, context=128, chunk=64, slots=2)
    prompt = prompts(demo.config.vocab_size, 1)[0]
    try:
        for slot in (0, 1):
            gpu.prefill_slot(slot, prompt)
        card = gpu.begin(0, SlotRequest(GREEDY, (), logprobs=5))
        host = gpu.begin(1, SlotRequest(GREEDY, (), host_logits=True))
        for _ in range(12):
            assert card.token == host.token and card.logits is None and host.logprobs is None
            assert_same_logprobs(card.logprobs, token_logprobs(host.logits, host.token, 5))
            picks = gpu.step({0: card.token, 1: host.token})
            card, host = picks[0], picks[1]
    finally:
        gpu.close()


def test_masked_and_biased_slots_pick_on_the_card_as_the_host_would(demo):
    """Slot 0 greedy under a logit_bias and a mask that changes every step (three masks in turn), slot 1
    sampled under the same masks, slot 2 plain, stepped together and alone: slot 0 picks the arg-max of its
    raw row with the bias and mask applied (`constrain_row`), slot 1 only allowed tokens, slot 2 the plain
    arg-max (no other slot's constraint leaks into its row). The three masks are uploaded once each."""
    from engine.generation.token_mask import constrain_row, mask_of

    vocab = demo.config.vocab_size
    rng = np.random.default_rng(5)
    allowed = [rng.random(vocab) < share for share in (0.5, 0.05, 0.002)]
    masks = [mask_of(a) for a in allowed]
    gpu = CudaBackend(demo, context=128, chunk=64, slots=3)
    prompt = prompts(vocab, 1)[0]
    try:
        for slot in range(3):
            gpu.prefill_slot(slot, prompt)
        first = gpu.begin(0, SlotRequest(GREEDY, (), host_logits=True, masked=True, logit_bias={7: 50.0, 9: -100.0}),
                          masks[0])
        bias = {7: 50.0, 9: -100.0}
        assert first.token == int(np.argmax(constrain_row(first.logits, bias, masks[0])))
        sampled = gpu.begin(1, SlotRequest(SamplingParams(seed=3), (), masked=True), masks[0])
        plain = gpu.begin(2, SlotRequest(GREEDY, (), host_logits=True))
        assert allowed[0][sampled.token] and plain.token == int(np.argmax(plain.logits))
        feeds = {0: first.token, 1: sampled.token, 2: plain.token}
        for step in range(1, 13):
            k = step % 3
            alone = step % 4 == 0
            picks = gpu.step({0: feeds[0]} if alone else feeds, {0: masks[k]} if alone else {0: masks[k], 1: masks[k]})
            p0 = picks[0]
            assert p0.token == int(np.argmax(constrain_row(p0.logits, bias, masks[k]))), f"step {step}"
            feeds[0] = p0.token
            if not alone:
                assert allowed[k][picks[1].token], f"step {step}: slot 1 picked a masked token"
                assert picks[2].token == int(np.argmax(picks[2].logits)), f"step {step}: slot 2 saw a constraint"
                feeds[1], feeds[2] = picks[1].token, picks[2].token
        assert gpu.slots.sampling.masks.uploads == 3
    finally:
        gpu.close()


def test_a_masked_step_launched_in_parts_picks_what_the_whole_step_picks(demo):
    """`launch_forward`, then `launch_picks` after the host's text work (the scheduler's way for masked requests:
    the grammars' masks come after they take the previous picks) picks what `step` picks under the same masks:
    slots 0 and 1 hold the same prompt and greedy masked requests, slot 0 stepped whole, slot 1 in parts, a new
    mask every step, each pick among its mask's tokens. Plain steps between masked ones replay the width's whole-step
    graph again (their picks the arg-max of the logits), and no graph is captured twice (one whole-step and one
    forward-only graph for the width)."""
    from engine.generation.token_mask import allowed_tokens, mask_of

    vocab = demo.config.vocab_size
    rng = np.random.default_rng(9)
    masks = [mask_of(rng.random(vocab) < 0.1) for _ in range(13)]
    gpu = CudaBackend(demo, context=128, chunk=64, slots=2, speculative=False)  # a lone plain step stays a step
    prompt = prompts(vocab, 1)[0]
    try:
        tokens = []
        for slot in range(2):
            gpu.prefill_slot(slot, prompt)
            tokens.append(gpu.begin(slot, SlotRequest(GREEDY, (), masked=True), masks[0]).token)
        assert tokens[0] == tokens[1]
        for step in range(1, 13):
            whole = gpu.step({0: tokens[0]}, {0: masks[step]})[0].token
            assert gpu.launch_forward({1: tokens[1]})
            gpu.launch_picks(lambda step=step: {1: masks[step]})
            parts = gpu.collect()[1].token
            assert whole == parts and allowed_tokens(masks[step], vocab)[whole], f"step {step}"
            tokens = [whole, parts]
            if step % 4 == 0:  # plain steps between masked ones: the whole-step graph's picks, the logits' arg-max
                plain = [gpu.step({slot: tokens[slot]})[slot].token for slot in range(2)]
                assert plain[0] == plain[1] == int(np.argmax(gpu._last_logits())), f"step {step}"
                tokens = plain
        card = gpu.slots.card
        assert card.graph_count == len({g.label for g in card._graphs}), [g.label for g in card._graphs]
    finally:
        gpu.close()


class _PlainSteps:
    """A CUDA backend seen without its `StepLauncher` capability: every step is taken whole."""

    def __init__(self, backend: CudaBackend):
        self._backend = backend

    def __getattr__(self, name: str):
        if name in ("launch", "collect", "launch_forward", "launch_picks"):
            raise AttributeError(name)
        return getattr(self._backend, name)


@pytest.mark.parametrize("speculative, json_mode", [(False, False), (True, False), (False, True)],
                         ids=["plain", "with_mtp_upkeep", "json_mode"])
def test_launched_steps_serve_what_plain_steps_serve(demo, speculative, json_mode):
    """Six greedy requests (prompts of many lengths, prefix reuse between them) over 3 slots, through the scheduler
    with steps launched before the text work and with every step taken whole: the same replies, token for
    token, and the card measured its idle gaps between launched steps. With the MTP head loaded (when the demo
    file has one) the heads' upkeep is queued behind each launched step. In JSON mode every other request has
    a json_object grammar: its steps' forward passes are launched before the text work, their picks after it
    (`launch_forward`, `launch_picks`), against masked steps taken whole."""
    from engine.server.response_format import json_constraint_for

    service = ModelService.from_loaded(demo)
    asks = prompts(demo.config.vocab_size, 6)

    def serve(wrap) -> tuple[list[list], CudaBackend]:
        gpu = CudaBackend(demo, context=512, chunk=64, slots=3, speculative=speculative)
        events: list[list] = [[] for _ in asks]
        jobs: queue.Queue = queue.Queue()
        for i, p in enumerate(asks):
            json_job = json_mode and i % 2 == 1
            constraint = json_constraint_for({"type": "json_object"}, service.tokenizer) if json_job else None
            jobs.put(Job(p, GREEDY, 24, False, None, [], events[i].append, turn_start=len(p) // 2,
                         constraint=constraint))
        jobs.put(None)
        try:
            Scheduler(wrap(gpu), service.tokenizer, PrefixCache(1 << 28)).run(jobs)
        finally:
            gpu.close()
        return events, gpu

    launched, gpu = serve(lambda g: g)
    plain, _ = serve(_PlainSteps)
    for a, b in zip(launched, plain):
        assert isinstance(a[-1], Finished) and isinstance(b[-1], Finished)
        assert a[-1].completion_tokens == b[-1].completion_tokens
        assert [e for p in a[:-1] for e in p.events] == [e for p in b[:-1] for e in p.events]
    assert gpu.step_gaps.steps > 0
