"""MTP speculation on the CUDA backend, host side (no GPU): the greedy accept rule, the GDN rings' rollback
copies, the speculator's bookkeeping (head positions, owed rows, rollback, leaving and rejoining
speculation) through a `SlotDecoder` on the stand-in card, and the benchmark driver.

No kernel runs here: the stand-in card leaves every device buffer as the host wrote it, so a test sets the
picks a round "computed" and checks what the host does with them. tests/gpu/test_mtp_gpu.py checks the
numbers on the H200."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.cuda.attention_kernels import MAX_PREFILL_SPLITS, decode_splits
from engine.cuda.gdn import GdnDims, GdnInputs, Rows, alloc_gdn_ring, gdn_mixer
from engine.cuda.bench.mtp_bench import break_even_acceptance, render_mtp, run_mtp_bench, tokens_per_round
from engine.cuda.sequence import GdnState
from engine.cuda.slot_decoder import SlotDecoder
from engine.cuda.speculative import greedy_accept
from engine.cuda.speculative_sampling import GpuSpeculativeRule
from engine.cuda.weights import has_mtp, upload_mtp_weights, upload_weights
from engine.generation.sampler import SamplingParams
from engine.generation.slots import SlotRequest
from engine.gguf.loader import load_model
from fake_card import FakeCard

GREEDY = SamplingParams(temperature=0.0)
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "trained" / "fixture-q8_0.gguf"


@pytest.fixture(scope="module")
def fixture():
    return load_model(FIXTURE)


def decoder(fixture, k: int, slots: int = 2) -> tuple[FakeCard, SlotDecoder]:
    card = FakeCard()
    weights = upload_weights(card, fixture.file, fixture.config)
    mtp = upload_mtp_weights(card, fixture.file, fixture.config, weights)
    return card, SlotDecoder(card, fixture.config, weights, context=96, slots=slots, chunk=16, mtp=mtp, draft_tokens=k)


@pytest.mark.parametrize("drafts, targets, emitted", [
    ([5], [5, 9], [5, 9]),  # accepted, then the bonus
    ([5], [4, 9], [4]),  # rejected: the target's token
    ([5, 6], [5, 7, 8], [5, 7]),
    ([5, 6], [5, 6, 8], [5, 6, 8]),
    ([-1], [-1, 3], [-1]),  # a failed draft never matches; the failed target is reported
])
def test_greedy_accept_keeps_drafts_up_to_the_first_mismatch(drafts, targets, emitted):
    assert greedy_accept(drafts, targets) == emitted


def test_greedy_accept_needs_one_target_more_than_drafts():
    with pytest.raises(ValueError):
        greedy_accept([1, 2], [1, 2])


def test_a_ring_commit_makes_that_token_state_current():
    card = FakeCard()
    state = GdnState(card.alloc(3 * 8 * 4, "conv"), card.alloc(2 * 4 * 4 * 4, "rec"))
    ring = alloc_gdn_ring(card, state, 2, "ring")
    ring.conv.upload(np.repeat(np.float32([1, 2]), 3 * 8))
    ring.recurrent.upload(np.repeat(np.float32([10, 20]), 2 * 4 * 4))
    ring.commit(state, 1)
    assert (state.conv.download(np.float32, 24) == 2).all() and (state.recurrent.download(np.float32, 32) == 20).all()
    with pytest.raises(ValueError):
        ring.commit(state, 2)
    ring.check(state, 3)
    with pytest.raises(ValueError, match="at most 3 tokens"):
        ring.check(state, 4)


def test_a_ring_needs_the_recurrent_form():
    card = FakeCard()
    dims = GdnDims(2, 4, 32, 32)
    state = GdnState(card.alloc(3 * dims.cc * 4, "conv"), card.alloc(4 * 32 * 32 * 4, "rec"))
    ring = alloc_gdn_ring(card, state, 1, "ring")
    big = card.alloc(4 * 2 * dims.cc, "big")
    rows = Rows(big, dims.cc)
    inputs = GdnInputs(rows, rows, rows, rows)
    weights = type("W", (), {"conv_w": big, "ssm_a": big, "dt_bias": big, "ssm_norm": big})()
    with pytest.raises(ValueError, match="recurrent form"):
        gdn_mixer(card, dims, weights, state, inputs, big, big, big, 2, 1e-6, recurrent=False, ring=ring)
    gdn_mixer(card, dims, weights, state, inputs, big, big, big, 2, 1e-6, ring=ring)
    assert [name for name, *_ in card.launches] == ["gdn_conv_silu", "gdn_recurrent"]


def test_the_fixture_carries_a_head(fixture):
    assert has_mtp(fixture.file, fixture.config)


@pytest.mark.parametrize("k", [1, 2])
def test_prefill_feeds_the_head_every_complete_row(fixture, k):
    _, dec = decoder(fixture, k)
    spec = dec.speculator
    dec.prefill_slot(0, list(range(40)))  # three chunks of 16
    cache = spec.caches[0]
    assert (cache.position, cache.owed_rows, cache.owed_tokens) == (39, 1, [])
    dec.prefill_slot(0, [7, 8])  # a follow-up extends the same slot
    assert (cache.position, cache.owed_rows, dec.seqs[0].next_position) == (41, 1, 42)


@pytest.mark.parametrize("k", [1, 2])
def test_greedy_rounds_accept_and_roll_back(fixture, k):
    card, dec = decoder(fixture, k)
    spec, seq = dec.speculator, dec.seqs[0]
    cache, layer = spec.caches[0], next(iter(seq.gdn))
    dec.prefill_slot(0, list(range(20)))
    dec.begin(0, SlotRequest(GREEDY, list(range(20))))
    accept_all = list(range(30, 30 + k)) + list(range(30, 31 + k))  # drafts equal the targets
    spec.picks.upload(np.asarray(accept_all, np.int32))
    pick = dec.step({0: 4})[0]
    assert pick.tokens == tuple(range(30, 31 + k)) and pick.drafted == k  # all k drafts accepted
    assert (seq.next_position, cache.position, cache.owed_rows, cache.owed_tokens) == (
        20 + k + 1, 20, k + 1, list(range(30, 30 + k)))

    spec.rings[0][layer].recurrent.upload(np.full(spec.rings[0][layer].recurrent.nbytes // 4, 7, np.float32))
    reject_first = [50 + i for i in range(k)] + [60 + i for i in range(k + 1)]
    spec.picks.upload(np.asarray(reject_first, np.int32))
    pick = dec.step({0: pick.tokens[-1]})[0]
    assert pick.tokens == (60,) and pick.drafted == k  # none accepted
    assert (seq.next_position, cache.position, cache.owed_rows, cache.owed_tokens) == (20 + k + 2, 20 + k + 1, 1, [])
    assert (seq.gdn[layer].recurrent.download(np.float32, 8) == 7).all()  # ring slot 0 became the state
    assert spec.stats.rounds == 2 and spec.stats.accepted == k and spec.stats.emitted == k + 2
    dec.step({0: 60})  # the same owed-row count as the first round: its graph is captured, then replayed
    dec.step({0: 60})
    assert ("<replay>", None, None, 0) in card.launches


def test_a_verify_attends_with_the_decode_kernel_one_grid_column_per_token(fixture):
    """Each verify token gets a one-token decode's launch at its position (same kernel, same split count,
    as many as the partials hold), not the prefill kernel's mostly empty 64-row tiles."""
    card, dec = decoder(fixture, 2)
    cfg = fixture.config
    dec.prefill_slot(0, list(range(20)))
    dec.begin(0, SlotRequest(GREEDY, list(range(20))))
    card.launches.clear()
    dec.step({0: 4})
    grids = [grid for name, grid, *_ in card.launches if name.startswith("attn_")]
    names = {name for name, *_ in card.launches}
    one_token = decode_splits(card.sm_count, cfg.n_head_kv)
    splits = min(one_token, max(one_token, MAX_PREFILL_SPLITS * 16) // 3)  # the partials, sized for chunk 16
    assert not any(n.startswith("attn_prefill") for n in names)
    # the 3-token verify, and the head's first draft call (its owed row padded to K+1 = 3 rows)
    assert grids.count((3, cfg.n_head_kv * splits)) == len(cfg.attention_layers) + 1
    assert grids.count(3 * cfg.n_head) == len(cfg.attention_layers) + 1  # their merges, one row per (token, head)


@pytest.mark.parametrize("k", [1, 2])
def test_sampled_rounds_run_the_rule_on_the_card(fixture, k):
    """A sampled round draws, verifies and decides on the card; the host reads the drafts, the emitted tokens
    and their count (set here as the kernels would have written them) and keeps the books as for greedy."""
    card, dec = decoder(fixture, k)
    spec, seq = dec.speculator, dec.seqs[1]
    dec.prefill_slot(1, [3, 4, 5])
    dec.begin(1, SlotRequest(SamplingParams(temperature=0.7, top_p=0.9, presence_penalty=0.5, seed=3), [3, 4, 5]))
    assert spec.speculating(1)
    drafts = list(range(30, 30 + k))
    card.launches.clear()
    spec.rules[1].out.upload(np.asarray(drafts + drafts + [40] + [3, k, k + 1, 0], np.int32))  # all accepted + bonus
    pick = dec.step({1: 9})[1]
    assert pick.tokens == (*drafts, 40) and pick.drafted == k
    names = [name for name, *_ in card.launches]
    assert names.count("spec_row_dist") == 2 * k + 1 and names.count("spec_accept") == k
    assert names.count("spec_final") == k + 1 and names.count("sample_draw") == k  # the drafts' draws only
    assert names.count("token_counts_add") == 2 * (k - 1) + 2 * k + 1  # drafts before later rows, the emitted
    assert not any(name.startswith("argmax") for name in names)
    assert seq.next_position == 3 + k + 1
    spec.rules[1].out.upload(np.asarray(drafts + [50] + [-1] * k + [3, 0, 1, 0], np.int32))  # d_1 rejected: residual
    pick = dec.step({1: 40})[1]
    assert pick.tokens == (50,) and pick.drafted == k
    assert seq.next_position == 3 + k + 2 and spec.stats.accepted == k and spec.stats.rounds == 2


def test_plain_steps_keep_the_heads_fed_and_snapshots_leave_speculation(fixture):
    _, dec = decoder(fixture, 1)
    spec = dec.speculator
    for slot in (0, 1):  # slot 1's request does not speculate, so steps over both are plain
        dec.prefill_slot(slot, [1, 2, 3])
        dec.begin(slot, SlotRequest(GREEDY, [1, 2, 3], speculative=slot == 0))
    cache = spec.caches[0]
    for _ in range(10):  # plain batched steps: each owes the head a row, the 8th flushes 8 rows
        assert all(p.extra == () for p in dec.step({0: 5, 1: 6}).values())
    assert (cache.position, cache.owed_rows, cache.owed_tokens) == (10, 3, [5, 5])
    assert cache.position + cache.owed_rows == dec.seqs[0].next_position == 13
    assert spec.speculating(0) and len(dec.step({0: 5})[0].tokens) == 2  # alone again: a round over 3 owed rows
    assert cache.position == 13
    dec.restore_slot(0, dec.snapshot_slot(1))  # the snapshot holds no head cache
    assert not cache.in_step and dec.step({0: 5})[0].extra == ()
    dec.reset_slot(0)
    dec.prefill_slot(0, [1, 2, 3])
    dec.begin(0, SlotRequest(GREEDY, [1, 2, 3], speculative=False))
    assert not spec.speculating(0) and dec.step({0: 5})[0].extra == ()
    assert cache.in_step and cache.position + cache.owed_rows == dec.seqs[0].next_position


def test_requests_speculate_unless_they_opt_out_or_are_a_penalised_argmax(fixture):
    _, dec = decoder(fixture, 1)
    dec.prefill_slot(0, [1, 2, 3])
    dec.begin(0, SlotRequest(SamplingParams(temperature=0.7, seed=1), [1, 2, 3]))
    assert dec.speculator.speculating(0)
    dec.begin(0, SlotRequest(GREEDY, [1, 2, 3], speculative=False))
    assert not dec.speculator.speculating(0) and dec.step({0: 4})[0].extra == ()
    dec.begin(0, SlotRequest(SamplingParams(temperature=0.0, repetition_penalty=1.1), [1, 2, 3]))
    assert not dec.speculator.speculating(0)  # a penalised arg-max: plain steps


def test_no_round_past_the_context(fixture):
    _, dec = decoder(fixture, 2)
    dec.prefill_slot(0, list(range(94)))  # context 96: a verify of 3 rows no longer fits
    dec.begin(0, SlotRequest(GREEDY, []))
    assert dec.step({0: 5})[0].extra == () and dec.seqs[0].next_position == 95


def test_bench_driver_runs_and_projects(fixture, monkeypatch):
    assert tokens_per_round(0.5, 1) == 1.5 and tokens_per_round(0.5, 2) == 1.75
    assert break_even_acceptance(1.32, 1) == pytest.approx(0.32) and break_even_acceptance(1.75, 2) == pytest.approx(0.5)
    assert break_even_acceptance(0.9, 1) == 0.0 and break_even_acceptance(2.01, 1) is None
    # the stand-in runs no kernels: its sampled rounds report a rejected first draft
    monkeypatch.setattr(GpuSpeculativeRule, "result", lambda self: ([7] * self.k, [9]))
    card = FakeCard()
    weights = upload_weights(card, fixture.file, fixture.config)
    mtp = upload_mtp_weights(card, fixture.file, fixture.config, weights)
    r = run_mtp_bench(card, fixture.config, weights, mtp, "fixture", 64, 0.8, steps=4, chunk=16)
    assert set(r["draft_tokens"]) == {1, 2}
    for k, d in r["draft_tokens"].items():
        assert d["projection"]["tokens_per_round"] == pytest.approx(tokens_per_round(0.8, k))
        assert "PROJECTION" in d["projection"]["label"] and d["measured"]["tokens_per_s"] > 0
        together = d["slots_together"]  # every slot count whose verify rows fit one GEMV, beyond SLOTS_TOGETHER too
        assert sorted(together) == ([2, 3, 4] if k == 1 else [2])
        assert all(t["rounds"]["step_ms"] > 0 and t["plain"]["tokens_per_step"] == width for width, t in together.items())
        assert all(t["rounds"]["tokens_per_round"] > 0 == t["plain"]["tokens_per_round"] for t in together.values())
        for t in together.values():  # the acceptance where a round emits what its cost in plain steps would
            even = t["break_even_acceptance"]
            assert even is None or tokens_per_round(even, k) == pytest.approx(max(1.0, t["round_over_step"]))
        assert all(t["drafts_together_ms"] >= 0 and t["drafts_each_alone_ms"] >= 0 for t in together.values())
    assert "slots together" in render_mtp(r)


def test_the_plan_counts_the_verify_rings(fixture):
    from engine.model.memory_plan import CardProfile, plan
    from engine.model.model_footprint import footprint_of

    card = CardProfile("card", 1 << 30)
    fp = footprint_of(fixture)
    plain, rings = (plan(fp, [card], 256, n_seqs=2, with_mtp=True, verify_states=k) for k in (0, 2))
    assert rings.cards[0].state_bytes == 3 * plain.cards[0].state_bytes > 0


def test_the_backend_loads_the_head_unless_told_not_to(fixture):
    from engine.cuda.backend import CudaBackend

    gpu = CudaBackend(fixture, context=64, chunk=16, draft_tokens=2, card_factory=FakeCard)
    assert gpu.plan.with_mtp and gpu.speculation_stats is not None
    seq = gpu.new_sequence()
    gpu.forward_last([1, 2, 3], seq)
    tokens = list(gpu.decode_on_device(seq, GREEDY, [1, 2, 3], 7))
    assert len(tokens) == 7 and gpu.speculation_stats.rounds == 2  # 1 + 3 + 3 tokens: the first pick, two rounds
    plain = CudaBackend(fixture, context=64, chunk=16, speculative=False, card_factory=FakeCard)
    assert not plain.plan.with_mtp and plain.speculation_stats is None


def test_a_card_keeps_at_most_widths_times_verify_widths_graphs(fixture):
    """Issue 28: the graphs of speculation pieces are keyed by slot, so without a bound every slot that ever
    speculated would leave its own on the card; eight slots speculating in turn, greedy and sampled, leave at
    most MAX_GRAPHS of them beside the decode graphs (one per batch width): 8 widths x 3 verify widths."""
    from engine.cuda.graph_runs import MAX_GRAPHS

    k = 2
    card, dec = decoder(fixture, k, slots=8)
    spec = dec.speculator
    sampled = SamplingParams(temperature=0.7, top_p=0.9, seed=1)
    drafts = list(range(30, 30 + k))
    outcomes = {  # what each kind of round "computed" (the stand-in card runs no kernel): all accepted, none
        True: [drafts + drafts + [40], [50] * k + [60] * (k + 1)],
        False: [drafts + drafts + [40] + [3, k, k + 1, 0], drafts + [50] + [-1] * k + [3, 0, 1, 0]],
    }
    for slot in range(8):
        greedy = slot % 2 == 1
        dec.prefill_slot(slot, [1, 2, 3])
        dec.begin(slot, SlotRequest(GREEDY if greedy else sampled, [1, 2, 3]))
        assert spec.speculating(slot)
        for round_ in range(6):  # each owed-row count eager, captured, replayed
            buffer = spec.picks_of(slot) if greedy else spec.rules[slot].out
            buffer.upload(np.asarray(outcomes[greedy][round_ % 2], np.int32))
            dec.step({slot: 5})
        dec.reset_slot(slot)
    assert spec.stats.rounds == 48
    assert len(dec.verifier.graphs) == MAX_GRAPHS  # slots that stopped speculating were evicted
    assert len(card.graphs) <= 8 * 3


def test_a_lone_slots_rounds_replay_one_graph_whatever_it_owes(fixture):
    """The head's first draft call pads the owed rows to K+1 (engine.cuda.mtp: the real count is data), so a lone slot
    owing one row after a rejection and K+1 after full acceptance replays one round graph for both."""
    k = 2
    card, dec = decoder(fixture, k)
    spec = dec.speculator
    dec.prefill_slot(0, [1, 2, 3])
    dec.begin(0, SlotRequest(GREEDY, [1, 2, 3]))
    drafts = list(range(30, 30 + k))
    outcomes = [drafts + drafts + [40], [50] * k + [60] * (k + 1)]  # all accepted (K+1 rows owed next), none (one)
    owed = []
    for round_ in range(8):
        if round_ == 6:
            captured = len(card.graphs)
        spec.picks_of(0).upload(np.asarray(outcomes[round_ % 2], np.int32))
        owed.append(spec.caches[0].owed_rows)
        dec.step({0: 5})
    assert owed == [1, k + 1] * 4 and spec.stats.rounds == 8
    assert [key for key in spec.graphs._graphs if key[0] == "round"] == [("round", True, 0)]
    assert len(card.graphs) == captured
