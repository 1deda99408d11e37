"""MTP speculation over several cards, host side (no GPU; issue 28 item 6): the head and its embedding copy on
the last card, every card's share of the verify (the tokens on the first, the hidden rows handed on), the
accepted count committed on every card (positions, ring rollback), and the memory plan's embedding copy.

The stand-in card runs no kernel and leaves device buffers as the host wrote them, so a test sets the picks
a round "computed" on the last card and checks what each card does with them; tests/gpu/test_pipeline_
speculation.py checks on the H200 that the cards compute exactly what one card computes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.cuda.backend import CudaBackend
from engine.generation.backend import CardSpec
from engine.generation.sampler import SamplingParams
from engine.generation.slots import SlotRequest
from engine.gguf.loader import load_model
from fake_card import FakeCard

GREEDY = SamplingParams(temperature=0.0)
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "trained" / "fixture-q8_0.gguf"


@pytest.fixture(scope="module")
def fixture():
    return load_model(FIXTURE)


def three_cards(fixture, k: int, **kw) -> CudaBackend:
    return CudaBackend(fixture, [CardSpec(0)] * 3, context=96, slots=2, chunk=16, split=[2, 1, 1], draft_tokens=k,
                       card_factory=FakeCard, **kw)


def test_the_head_goes_on_the_last_card_with_its_own_embedding(fixture):
    gpu = three_cards(fixture, 1)
    try:
        decoders = [st.decoder for st in gpu.stages]
        assert [d.speculator is not None for d in decoders] == [False, False, True]
        assert all(d.verifier is not None for d in decoders)  # every card rolls its own GDN layers back
        assert decoders[-1].speculator.graphs is decoders[-1].verifier.graphs  # one bounded set per card
        head = decoders[-1].speculator.head
        assert decoders[-1].fwd.w.token_embd is None and head.w.embedding is not None
        assert gpu.plan.with_mtp and gpu.rounds is not None
        assert any("own copy of token_embd" in note for note in gpu.plan.notes)
    finally:
        gpu.close()
    plain = three_cards(fixture, 1, speculative=False)
    try:
        assert all(st.decoder.verifier is None for st in plain.stages) and plain.rounds is None
        extra = gpu.plan.cards[-1].weight_bytes - plain.plan.cards[-1].weight_bytes
        block = fixture.file.tensors["token_embd.weight"].n_bytes
        assert extra > block  # the head's block and the embedding copy
    finally:
        plain.close()


@pytest.mark.parametrize("k", [1, 2])
def test_a_round_verifies_on_every_card_and_commits_the_accepted_count_everywhere(fixture, k):
    gpu = three_cards(fixture, k)
    try:
        decoders = [st.decoder for st in gpu.stages]
        spec = decoders[-1].speculator
        gpu.prefill_slot(0, list(range(20)))
        gpu.begin(0, SlotRequest(GREEDY, list(range(20))))
        accept_all = list(range(30, 30 + k)) + list(range(30, 31 + k))
        spec.picks.upload(np.asarray(accept_all, np.int32))
        pick = gpu.step({0: 4})[0]
        assert pick.tokens == tuple(range(30, 31 + k)) and pick.drafted == k
        first_ids = decoders[0].fwd.ids.download(np.int32, k + 1)
        assert first_ids.tolist() == [4, *range(30, 30 + k)]  # the first card embeds x_n and the drafts
        assert [d.seqs[0].next_position for d in decoders] == [20 + k + 1] * 3

        rolled = []
        for d in decoders:  # ring slot 0 marked on every card with GDN layers: a rejection restores it
            for layer, ring in d.verifier.rings[0].items():
                ring.recurrent.upload(np.full(ring.recurrent.nbytes // 4, 7, np.float32))
                rolled.append(d.seqs[0].gdn[layer])
        assert rolled
        spec.picks.upload(np.asarray([50 + i for i in range(k)] + [60 + i for i in range(k + 1)], np.int32))
        pick = gpu.step({0: pick.tokens[-1]})[0]
        assert pick.tokens == (60,)
        assert [d.seqs[0].next_position for d in decoders] == [20 + k + 2] * 3
        assert all((state.recurrent.download(np.float32, 8) == 7).all() for state in rolled)
        assert spec.stats.rounds == 2 and spec.stats.accepted == k
    finally:
        gpu.close()


def test_a_slot_that_does_not_speculate_makes_the_step_plain_and_the_heads_stay_fed(fixture):
    gpu = three_cards(fixture, 1)
    try:
        spec = gpu.stages[-1].decoder.speculator
        for slot in (0, 1):
            gpu.prefill_slot(slot, list(range(10)))
            gpu.begin(slot, SlotRequest(GREEDY, list(range(10)), speculative=slot == 0))
        gpu.step({0: 3, 1: 4})
        assert spec.stats.rounds == 0 and spec.caches[0].owed_rows == 2
        assert [gpu.position(s) for s in (0, 1)] == [11, 11]
    finally:
        gpu.close()


@pytest.mark.parametrize("k", [1, 2])
def test_slots_that_all_speculate_verify_in_one_pass_a_card_and_commit_their_own_counts(fixture, k):
    """Two slots' rounds through three cards: the first card embeds each slot's token and drafts in slot order, each
    later card gets both slots' rows in one hop, and each slot's accepted count moves and rolls back that slot alone on
    every card."""
    gpu = three_cards(fixture, k)
    try:
        decoders = [st.decoder for st in gpu.stages]
        spec = decoders[-1].speculator
        hops: list[int] = []
        plain_hop = gpu.rounds.hop
        gpu.rounds.hop = lambda rows: (hops.append(len(rows)), plain_hop(rows))[1]
        for slot in (0, 1):
            gpu.prefill_slot(slot, list(range(10 + slot)))
            gpu.begin(slot, SlotRequest(GREEDY, list(range(10 + slot))))
        rolled = []
        for d in decoders:  # slot 1's ring slot 0 marked on every card with GDN layers: its rejection restores it
            for layer, ring in d.verifier.rings[1].items():
                ring.recurrent.upload(np.full(ring.recurrent.nbytes // 4, 7, np.float32))
                rolled.append((d.seqs[0].gdn[layer], d.seqs[1].gdn[layer]))
        assert rolled
        spec.picks_of(0).upload(np.asarray(list(range(30, 30 + k)) + list(range(30, 31 + k)), np.int32))
        spec.picks_of(1).upload(np.asarray([50 + i for i in range(k)] + [60 + i for i in range(k + 1)], np.int32))
        picks = gpu.step({0: 4, 1: 5})
        assert picks[0].tokens == tuple(range(30, 31 + k)) and picks[1].tokens == (60,)
        assert picks[0].drafted == picks[1].drafted == k
        first_ids = decoders[0].fwd.ids.download(np.int32, 2 * (k + 1))
        assert first_ids.tolist() == [4, *range(30, 30 + k), 5, *[50 + i for i in range(k)]]
        assert hops == [2 * (k + 1)] * 2  # both slots' rows in one hop per boundary
        assert [d.seqs[0].next_position for d in decoders] == [10 + k + 1] * 3
        assert [d.seqs[1].next_position for d in decoders] == [11 + 1] * 3
        assert all((one.recurrent.download(np.float32, 8) == 7).all() for _, one in rolled)
        assert not any((zero.recurrent.download(np.float32, 8) == 7).all() for zero, _ in rolled)
        assert spec.stats.rounds == 2 and spec.stats.accepted == k
    finally:
        gpu.close()


def test_decoding_over_cards_speculates(fixture):
    gpu = three_cards(fixture, 2)
    try:
        seq = gpu.new_sequence()
        gpu.forward_last([1, 2, 3], seq)
        tokens = list(gpu.decode_on_device(seq, GREEDY, [1, 2, 3], 7))
        assert len(tokens) == 7 and gpu.speculation_stats.rounds == 2  # the first pick, then two rounds of 3
    finally:
        gpu.close()


def test_the_bench_driver_runs_and_projects(monkeypatch):
    import dataclasses
    import functools

    from engine.cuda.bench import pipeline_mtp
    from engine.fixtures.demo_model import DEMO_CONFIG

    monkeypatch.setattr(pipeline_mtp, "CudaBackend", functools.partial(CudaBackend, card_factory=FakeCard))
    monkeypatch.setattr(CudaBackend, "hop_seconds", lambda self, rows, repeats=50: 1e-4)
    cfg = dataclasses.replace(DEMO_CONFIG, n_mtp=1, tied_embeddings=False, is_recurrent=())
    r = pipeline_mtp.run_pipeline_mtp_bench(cfg, "demo", 3, (0,), 32, 0.9, tokens=8)
    assert set(r["draft_tokens"]) == {1, 2}
    for k, d in r["draft_tokens"].items():
        assert d["rounds"] > 0 and d["identical_to_plain"]  # the stand-in card's picks never change
        assert len(d["graphs_per_card"]) == 3 and all(0 < n <= 8 * 3 for n in d["graphs_per_card"])
        assert d["projection"]["tokens_per_round"] == pytest.approx(1 + sum(0.9**i for i in range(1, k + 1)))
    assert "PROJECTED" in pipeline_mtp.render_pipeline_mtp(r)


def test_the_backend_leaves_the_head_off_when_only_it_does_not_fit(fixture):
    """A card that holds the model but not the model and its head loads the model without the head (noted),
    where it used to refuse the load: speculation is worth having, never worth refusing a model for."""
    from engine.model.memory_plan import MTP_LEFT_OFF, CardProfile, plan
    from engine.model.model_footprint import footprint_of

    fp, big = footprint_of(fixture), CardProfile("card", 1 << 40)
    with_head, without = (plan(fp, [big], 96, "f16", n_seqs=2, prefill_chunk=16, with_mtp=on,
                               verify_states=1 if on else 0).cards[0].total_bytes for on in (True, False))
    assert with_head > without
    usable = (with_head + without) // 2  # a card with this much usable memory holds only the model
    capacity = int((usable + big.reserve_bytes) / (1 - big.margin)) + 1
    gpu = CudaBackend(fixture, [CardSpec(0, capacity)], context=96, slots=2, chunk=16, card_factory=FakeCard)
    try:
        assert not gpu.plan.with_mtp and MTP_LEFT_OFF in gpu.plan.notes
        assert gpu.speculation_stats is None and gpu.slots.verifier is None
    finally:
        gpu.close()


def test_the_cmp_projection_adds_the_modelled_hops_to_the_scaled_card_work():
    from engine.cuda.bench.pipeline_bench import cmp_hop_seconds
    from engine.cuda.bench.pipeline_mtp import project_cmp_rounds

    result = {"cards": 3, "draft_tokens": {"1": {"round_over_step": 1.25}, "2": {"round_over_step": 1.5}}}
    p = project_cmp_rounds(result, 5120, 20.0, (1.0, 0.5))
    assert p["1"]["plain_tokens_per_s"] == pytest.approx(1 / (0.05 + 2 * cmp_hop_seconds(1, 5120)))
    round_k2 = 0.05 * 1.5 + 2 * cmp_hop_seconds(3, 5120)
    assert p["2"]["round_ms"] == pytest.approx(1e3 * round_k2)
    assert p["2"]["tokens_per_s"]["1.0"] == pytest.approx(3 / round_k2)  # every draft accepted: K + 1 tokens
    assert p["2"]["tokens_per_s"]["0.5"] == pytest.approx(1.75 / round_k2)  # 1 + 0.5 + 0.25
