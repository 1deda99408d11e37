"""Speculative decoding with the MTP head on the reference model: greedy output unchanged, exact rollback,
the head's cache in step with the trunk, snapshots that carry the head's owed rows, and acceptance stats.

The model is `draft_friendly_model` (a random head is never accepted, so only its drafts exercise the
accept paths); the statistical tests are in test_speculative_sampling.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.reference.backend import ReferenceBackend
from engine.generation.sampler import SamplingParams
from engine.generation.slots import HostSlots, SlotRequest, decode_tokens
from engine.generation.speculative import MtpSpeculator
from engine.fixtures.speculative_fixture import draft_friendly_model
from engine.reference.speculative_state import Checkpoint
from engine.reference.model import ReferenceModel

GREEDY = SamplingParams(temperature=0.0)
GREEDY_PENALISED = SamplingParams(temperature=0.0, repetition_penalty=1.3, frequency_penalty=0.4)


@pytest.fixture(scope="module")
def model() -> ReferenceModel:
    return draft_friendly_model(seed=0)


def prompt(seed: int, n: int = 12) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 256, n)]


def generate(slots: HostSlots, ids: list[int], params: SamplingParams, n: int) -> list[int]:
    slots.reset_slot(0)
    slots.prefill_slot(0, ids)
    return list(decode_tokens(slots, 0, params, ids, n, (), lambda: False))


@pytest.mark.parametrize("params", [GREEDY, GREEDY_PENALISED], ids=["greedy", "penalised"])
@pytest.mark.parametrize("k", [1, 2])
def test_greedy_output_is_identical_with_and_without_speculation(model, k, params):
    spec = HostSlots(ReferenceBackend.from_model(model), 1, draft_tokens=k)
    plain = HostSlots(ReferenceBackend.from_model(model), 1, speculative=False)
    assert plain.speculation_stats is None
    for seed in range(3):
        ids = prompt(seed)
        assert generate(spec, ids, params, 40) == generate(plain, ids, params, 40), f"prompt {seed}"
    stats = spec.speculation_stats
    assert 0 < stats.accepted < stats.drafted  # both the accept and the rollback paths ran
    assert stats.drafted == k * stats.rounds and stats.emitted == stats.accepted + stats.rounds
    assert 1.0 < stats.tokens_per_verify <= k + 1 and 0.0 < stats.acceptance_rate < 1.0
    assert "acceptance" in stats.summary()


def test_checkpoint_restores_the_exact_state(model):
    state = model.new_state()
    model.forward_hidden(prompt(5), state)
    model.mtp[0].forward(np.ones((3, model.cfg.d_model), np.float32), [1, 2, 3], state)
    before = state.snapshot()
    mark = Checkpoint.of(state)
    model.forward_hidden([4, 5, 6], state)
    model.mtp[0].forward(np.ones((2, model.cfg.d_model), np.float32), [7, 8], state)
    mark.restore_trunk(state)
    mark.restore_mtp(state)
    after = state.snapshot()
    assert (after.n_tokens, after.next_position) == (before.n_tokens, before.next_position)
    mtp_pairs = [(a[0], b[0]) for a, b in zip(after.mtp, before.mtp)]
    for got, want in [(after.kv, before.kv), (after.gdn, before.gdn)] + mtp_pairs:
        for g, w in zip(got, want):
            for x, y in zip(g, w):
                np.testing.assert_array_equal(x, y)
    assert [m[1] for m in after.mtp] == [m[1] for m in before.mtp]


@pytest.mark.parametrize("k", [1, 2])
def test_state_after_speculation_equals_a_plain_run(model, k):
    """After rounds with rejections, trunk and head caches hold what token-by-token decoding gives them."""
    ids = prompt(7)
    spec = HostSlots(ReferenceBackend.from_model(model), 1, draft_tokens=k)
    upkeep_only = HostSlots(ReferenceBackend.from_model(model), 1, draft_tokens=k)  # head kept in step, no drafts
    tokens = generate(spec, ids, SamplingParams(temperature=0.8, seed=3), 30)
    assert spec.speculation_stats.accepted < spec.speculation_stats.drafted
    consumed = ids + tokens[:-1]
    spec_state = spec._slots[0].sequence
    assert spec_state.n_tokens == len(consumed)
    upkeep_only.reset_slot(0)
    upkeep_only.prefill_slot(0, ids)
    upkeep_only.begin(0, SlotRequest(GREEDY, ids, speculative=False))
    for t in tokens[:-1]:
        upkeep_only.step({0: t})
    assert upkeep_only.speculation_stats.rounds == 0
    plain_state = upkeep_only._slots[0].sequence
    # feeding the pending token settles the head rows a round leaves owed (they wait for the next draft)
    want = upkeep_only.speculator.feed(plain_state, upkeep_only._slots[0].trail, [tokens[-1]])
    got = spec.speculator.feed(spec_state, spec._slots[0].trail, [tokens[-1]])
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 1e-4
    for a, b in zip(spec_state.mtp, plain_state.mtp):
        assert (a.kv.length, a.next_position) == (b.kv.length, b.next_position) == (len(consumed), len(consumed))
        np.testing.assert_allclose(a.kv.values, b.kv.values, atol=1e-4)


def test_requests_without_speculation_and_logprob_requests_take_plain_steps(model):
    slots = HostSlots(ReferenceBackend.from_model(model), 1)
    ids = prompt(1)
    for request in (SlotRequest(GREEDY, ids, speculative=False), SlotRequest(GREEDY, ids, host_logits=True)):
        slots.reset_slot(0)
        slots.prefill_slot(0, ids)
        token = slots.begin(0, request).token
        for _ in range(5):
            pick = slots.step({0: token})[0]
            assert pick.extra == ()
            token = pick.token
    assert slots.speculation_stats.rounds == 0


def test_snapshot_carries_the_heads_owed_rows(model):
    ids = prompt(9)
    slots = HostSlots(ReferenceBackend.from_model(model), 2, draft_tokens=2)
    slots.prefill_slot(0, ids[:-1])
    snap = slots.snapshot_slot(0)  # owes the head row of the last prompt token but one
    slots.prefill_slot(0, ids[-1:])
    first = list(decode_tokens(slots, 0, GREEDY, ids, 20, (), lambda: False))
    slots.restore_slot(1, snap)
    slots.prefill_slot(1, ids[-1:])
    again = list(decode_tokens(slots, 1, GREEDY, ids, 20, (), lambda: False))
    assert again == first
    np.testing.assert_array_equal(slots._slots[0].sequence.mtp[0].kv.keys, slots._slots[1].sequence.mtp[0].kv.keys)


def test_decode_tokens_honours_max_tokens_and_stop_ids_inside_a_run(model):
    ids = prompt(2)
    slots = HostSlots(ReferenceBackend.from_model(model), 1, draft_tokens=2)
    full = generate(slots, ids, GREEDY, 30)
    runs_of_several = slots.speculation_stats.emitted > slots.speculation_stats.rounds
    assert runs_of_several
    for n in range(1, 8):
        assert generate(slots, ids, GREEDY, n) == full[:n]
    stop = full[5]
    assert generate(slots, ids, GREEDY, 30) == full
    assert generate_until(slots, ids, stop) == full[: full.index(stop)]


def generate_until(slots: HostSlots, ids: list[int], stop: int) -> list[int]:
    slots.reset_slot(0)
    slots.prefill_slot(0, ids)
    return list(decode_tokens(slots, 0, GREEDY, ids, 30, {stop}, lambda: False))


def test_speculator_refuses_models_without_a_head_and_other_k(model):
    with pytest.raises(ValueError, match="draft_tokens"):
        MtpSpeculator(model, 3)
    trunk_only = ReferenceModel.__new__(ReferenceModel)
    trunk_only.mtp = []
    with pytest.raises(ValueError, match="no MTP head"):
        MtpSpeculator(trunk_only)
