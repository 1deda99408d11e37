"""Several slots' MTP speculative rounds in one step (issue 28 item 6: `CudaSpeculator.rounds`) give every slot
exactly the round it takes alone: the same target logits, drafts, acceptances and tokens, greedy and sampled.

Why the bound is bit-for-bit equality: the heads draft in one pass per draft over every slot's rows (each slot's
owed rows padded to K+1, `MtpHead.draft_pass`), and the shared verify runs every slot's K+1 rows; both go through
the Q8_0 GEMV, whose rows sum in the same order at any row count (gemv_q8.cu: a lane's blocks in chunk order, then one
shuffle tree; what tests/gpu/test_teeth_batches.py holds batched decode to), and the decode-shaped RMSNorm, which
splits a row the same way at any count up to MAX_GEMV_TOKENS; each slot's head attention, GDN (with its ring) and
trunk attention launch on its own rows as its own round launches them; its last real head row is copied by its own
step record; its rule runs on its own rows with its own sampler. So nothing in a slot's round depends on the slots
beside it, nor on their padding rows.
"""

from __future__ import annotations

import dataclasses
import queue

import numpy as np
import pytest

from engine.cuda.backend import CudaBackend
from engine.generation.backend import CardSpec
from engine.generation.sampler import SamplingParams
from engine.generation.serving.generation_job import Job
from engine.generation.serving.model_service import ModelService
from engine.generation.serving.scheduler import Scheduler
from engine.generation.slots import SlotRequest
from engine.gguf.loader import load_model
from tests.draft_friendly import write_demo_draft_friendly

GREEDY = SamplingParams(temperature=0.0)
SAMPLED = SamplingParams(temperature=0.8, top_k=5, presence_penalty=0.3)
ROUNDS = 12


@pytest.fixture(scope="module")
def friendly(tmp_path_factory):
    """A demo-shaped model whose head drafts well but not always: accepted and rejected drafts both occur."""
    return load_model(write_demo_draft_friendly(tmp_path_factory.mktemp("rounds") / "friendly.gguf"))


def requests_of(loaded, slots: int) -> dict[int, SlotRequest]:
    """Greedy and seeded sampled requests, alternating, each with its own prompt."""
    rng = np.random.default_rng(11)
    out = {}
    for slot in range(slots):
        prompt = rng.integers(0, loaded.config.vocab_size, 30 + 3 * slot).tolist()
        params = GREEDY if slot % 2 == 0 else dataclasses.replace(SAMPLED, seed=slot)
        out[slot] = SlotRequest(params, prompt)
    return out


def rounds_of(gpu: CudaBackend, requests: dict[int, SlotRequest], together: bool):
    """ROUNDS speculative rounds per slot, all slots stepped together or each alone: per slot its rounds' tokens and
    its verify's logits rows [ROUNDS][K+1][V] (read from the last card's pass after each step)."""
    spec = gpu.stages[-1].decoder.speculator
    spec.slots_together = len(requests)  # every slot in one round, beyond the default SLOTS_TOGETHER
    k, v = spec.k, gpu.config.vocab_size
    tokens, runs, rows = {}, {s: [] for s in requests}, {s: [] for s in requests}
    for slot, request in requests.items():
        gpu.reset_slot(slot)
        gpu.prefill_slot(slot, request.history)
        tokens[slot] = [gpu.begin(slot, request).token]
    order = sorted(requests)
    groups = [order] * ROUNDS if together else [[slot] for slot in order for _ in range(ROUNDS)]
    for group in groups:
        picks = gpu.step({slot: tokens[slot][-1] for slot in group})
        logits = gpu._on_last(lambda dec: dec.fwd.logits.download(np.float32, (len(group) * (k + 1), v)))
        for j, slot in enumerate(group):
            assert picks[slot].drafted == k, f"slot {slot} took a plain step"
            runs[slot].append(picks[slot].tokens)
            rows[slot].append(logits[j * (k + 1) : (j + 1) * (k + 1)])
            tokens[slot] += picks[slot].tokens
    stats = gpu.speculation_stats
    return runs, {s: np.stack(r) for s, r in rows.items()}, (stats.rounds, stats.drafted, stats.accepted)


@pytest.mark.parametrize("k, slots, kv, n_cards", [(1, 4, "f16", 1), (2, 2, "f16", 1), (1, 3, "k8v3", 1),
                                                   (1, 4, "f16", 3), (2, 2, "f16", 3)])
def test_slots_speculating_together_round_exactly_as_each_alone(friendly, k, slots, kv, n_cards):
    """On one card, and over three logical cards (each card's layers of every slot's verify in one pass)."""
    requests = requests_of(friendly, slots)
    cards = [CardSpec(0, 1 << 30)] * n_cards
    results = {}
    for together in (False, True):
        gpu = CudaBackend(friendly, cards, context=256, chunk=32, slots=slots, draft_tokens=k, kv=kv)
        try:
            results[together] = rounds_of(gpu, requests, together)
        finally:
            gpu.close()
    (runs_alone, rows_alone, stats_alone), (runs_together, rows_together, stats_together) = results[False], results[True]
    print(f"K={k}, {slots} slots, {kv}, {n_cards} card(s): (rounds, drafted, accepted) alone {stats_alone}, together {stats_together}")
    assert 0 < stats_alone[2] < stats_alone[1], "accepted and rejected drafts must both occur"
    for slot in requests:
        np.testing.assert_array_equal(rows_together[slot], rows_alone[slot], err_msg=f"slot {slot}'s verify logits")
        assert runs_together[slot] == runs_alone[slot], f"slot {slot}"
    assert stats_together == stats_alone


def test_jobs_speculating_together_are_served_as_each_alone(friendly):
    """Through the real `Scheduler`: four jobs queued at once (greedy and seeded sampling, K=1: one round of four slots
    a step) receive exactly the events each receives when served alone, and they did speculate together."""
    service = ModelService.from_loaded(friendly)
    requests = requests_of(friendly, 4)

    def serve(indices: list[int], gpu: CudaBackend) -> dict[int, list]:
        events: dict[int, list] = {i: [] for i in indices}
        jobs: queue.Queue = queue.Queue()
        for i in indices:
            r = requests[i]
            jobs.put(Job(list(r.history), r.params, 20, False, None, [], events[i].append))
        jobs.put(None)
        Scheduler(gpu, service.tokenizer).run(jobs)
        return events

    gpu = CudaBackend(friendly, context=256, chunk=64, slots=4, draft_tokens=1)
    try:
        spec = gpu.slots.speculator
        spec.slots_together = 4  # beyond the default SLOTS_TOGETHER: the rounds of four slots are what this tests
        widths: list[int] = []
        own_rounds = spec.rounds
        spec.rounds = lambda feeds: (widths.append(len(feeds)), own_rounds(feeds))[1]  # type: ignore[method-assign]
        alone = {}
        for i in requests:
            alone.update(serve([i], gpu))
        widths.clear()
        together = serve(list(requests), gpu)
    finally:
        gpu.close()
    print(f"rounds by slot count together: {sorted(widths)[-1]} at most, {widths.count(4)} of all four")
    assert widths.count(4) > 0
    for i in requests:
        final_together, final_alone = together[i][-1], alone[i][-1]
        assert [repr(e) for e in together[i][:-1]] == [repr(e) for e in alone[i][:-1]], f"job {i}"
        assert (final_together.finish_reason, final_together.completion_tokens) == (
            final_alone.finish_reason, final_alone.completion_tokens), f"job {i}"
