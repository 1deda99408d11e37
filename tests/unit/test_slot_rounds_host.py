"""Several slots' MTP speculative rounds in one step (issue 28 item 6: `CudaSpeculator.rounds`,
`ForwardPass.run_verifies`), on a stand-in card (no GPU): the trunk's matmuls launch once for every slot's verify rows
while each slot's mixers, drafts and rule launch on its own buffers; each slot's outcome, rollback and head
bookkeeping are its own; a step whose slots cannot all take a round now is plain for all of them. The stand-in runs
no kernel, so a test writes what a round "computed" into each slot's picks or rule and checks what the host does
with it. What the kernels compute together against alone is tests/gpu/test_slot_rounds.py's."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from engine.cuda.forward import SequenceRows
from engine.cuda.graph_runs import MAX_GRAPHS
from engine.cuda.slot_decoder import SlotDecoder
from engine.cuda.speculative import SLOTS_TOGETHER
from engine.cuda.weights import upload_mtp_weights, upload_weights
from engine.generation.sampler import SamplingParams
from engine.generation.slots import SlotRequest
from engine.gguf.loader import load_model
from engine.model.kv_formats import kv_format
from fake_card import FakeBuffer, FakeCard, address, owners_touched

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "trained" / "fixture-q8_0.gguf"
GREEDY = SamplingParams(temperature=0.0)
SAMPLED = SamplingParams(temperature=0.7, top_p=0.9, seed=3)
PROMPTS = {0: [1, 2, 3], 1: [4, 5, 6, 7], 2: [8, 9], 3: [3, 1, 4, 1, 5]}


@pytest.fixture(scope="module")
def fixture():
    return load_model(FIXTURE)


def decoder(fixture, k: int, slots: int = 4, kv: str = "f16", context: int = 96,
            every_slot: bool = True) -> tuple[FakeCard, SlotDecoder]:
    """`every_slot`: one round may take every slot, so that these tests reach the rounds of 3 and 4 slots that
    SLOTS_TOGETHER leaves out by default (else the default stays)."""
    card = FakeCard()
    weights = upload_weights(card, fixture.file, fixture.config)
    mtp = upload_mtp_weights(card, fixture.file, fixture.config, weights)
    dec = SlotDecoder(card, fixture.config, weights, context=context, slots=slots, chunk=16, mtp=mtp,
                      draft_tokens=k, kv=kv_format(kv))
    assert dec.speculator is not None
    if every_slot:
        dec.speculator.slots_together = slots
    return card, dec


def started(dec: SlotDecoder, modes: dict[int, SamplingParams]) -> None:
    for slot, params in modes.items():
        dec.prefill_slot(slot, PROMPTS[slot])
        dec.begin(slot, SlotRequest(params, PROMPTS[slot]))


def accept_all(k: int) -> list[int]:
    """A greedy round's picks whose drafts all equal their targets (30, 31, ...), then the bonus token."""
    return list(range(30, 30 + k)) + list(range(30, 31 + k))


def reject_first(k: int) -> list[int]:
    return [50 + i for i in range(k)] + [60 + i for i in range(k + 1)]


def gemv_widths(card: FakeCard) -> Counter:
    """Launches per GEMV token count."""
    return Counter(int(m.group(1)) for name, *_ in card.launches if (m := re.match(r"gemv_q8_t(\d)", name)))


def owned(dec: SlotDecoder) -> dict[int, list]:
    """Each slot's trunk state, verify rings, head cache, picks and rule buffers."""
    spec = dec.speculator
    out = {}
    for slot, seq in enumerate(dec.seqs):
        rings = [b for ring in spec.rings[slot].values() for b in (ring.conv, ring.recurrent)]
        rule = spec.rules[slot]
        out[slot] = [*seq.buffers(), *rings, *spec.caches[slot].cache.buffers(), spec.picks_of(slot), rule.out,
                     rule.dists, *[b for row in (*rule.draft_rows, *rule.target_rows) for b in row.buffers()]]
    return out


def mixers_per_slot(dec: SlotDecoder, card: FakeCard, kv: str) -> Counter:
    """(slot, kernel) → launches of the state-carrying kernels since `launch_args` was cleared, each of which must
    touch one slot's buffers only."""
    mixers = ("gdn_recurrent", "gdn_conv", "attn_prep" if kv == "f16" else "kv_encode", "attn_decode", "kv_decode")
    per_slot: Counter = Counter()
    for name, args in card.launch_args:
        if name.startswith(mixers):
            touched = owners_touched(owned(dec), args)
            assert len(touched) == 1, f"{name} touches slots {touched}"
            per_slot[touched.pop(), name] += 1
    return per_slot


@pytest.mark.parametrize("kv", ["f16", "k8v3"])
def test_slots_that_all_speculate_share_one_verify_and_keep_their_own_state(fixture, kv):
    k = 1
    card, dec = decoder(fixture, k, kv=kv)
    started(dec, {0: GREEDY, 1: GREEDY})
    spec = dec.speculator
    alone, alone_mixers = Counter(), Counter()
    for slot in (0, 1):  # each slot's own round first (its draft rejected: the head owes one row again)
        spec.picks_of(slot).upload(np.asarray(reject_first(k), np.int32))
        card.launches.clear()
        card.launch_args.clear()
        dec.step({slot: 4})
        alone += gemv_widths(card)
        alone_mixers += mixers_per_slot(dec, card, kv)
    assert set(alone) == {1, 2}  # the head's call over its one owed row, then the 2-row verify
    card.launches.clear()
    card.launch_args.clear()
    spec.picks_of(0).upload(np.asarray(accept_all(k), np.int32))
    spec.picks_of(1).upload(np.asarray(reject_first(k), np.int32))
    layer = next(iter(dec.seqs[1].gdn))
    ring = spec.rings[1][layer]
    ring.recurrent.upload(np.full(ring.recurrent.nbytes // 4, 7, np.float32))
    picks = dec.step({0: 60, 1: 60})
    together = gemv_widths(card)
    # one head pass over both slots' owed rows, each padded to K+1 = 2 (eh_proj and the block's four GEMVs at 4 rows,
    # the LM head at each slot's last real row: 2 rows), where alone each slot ran all six at 1 row; then the trunk's
    # verify once over both slots' 4 rows
    head_gemvs = alone[1] // 2
    assert together == {4: alone[2] // 2 + head_gemvs - 1, 2: 1}
    gathers = [args for name, args in card.launch_args if name == "copy_last_step_row"]
    assert [address(args[3]) for args in gathers] == [address(spec.caches[s].steps.view(0, 8)) for s in (0, 1)]
    assert picks[0].tokens == (30, 31) and picks[0].drafted == k
    assert picks[1].tokens == (60,) and picks[1].drafted == k
    assert [dec.seqs[s].next_position for s in (0, 1)] == [3 + 1 + (k + 1), 4 + 1 + 1]
    assert (dec.seqs[1].gdn[layer].recurrent.download(np.float32, 8) == 7).all()  # slot 1 rolled back
    assert not (dec.seqs[0].gdn[layer].recurrent.download(np.float32, 8) == 7).all()
    c0, c1 = spec.caches[0], spec.caches[1]
    assert (c0.position, c0.owed_rows, c0.owed_tokens) == (2 + 2, k + 1, [30])
    assert (c1.position, c1.owed_rows, c1.owed_tokens) == (3 + 2, 1, [])
    assert all(c.position + c.owed_rows == dec.seqs[s].next_position for s, c in ((0, c0), (1, c1)))
    assert alone_mixers and mixers_per_slot(dec, card, kv) == alone_mixers  # each slot's drafts and verify mixers, as alone
    assert spec.stats.rounds == 4 and spec.stats.accepted == k  # slot 0's in the shared round


def test_a_round_of_greedy_and_sampled_slots_reads_each_slots_own_rows(fixture):
    """K=2: two slots of 3 verify rows each. The sampled slot's rule reads its own draft logits rows and the verify's
    rows of that slot; the greedy slot's arg-maxes write its own picks; each outcome comes from its own buffers."""
    k = 2
    card, dec = decoder(fixture, k)
    started(dec, {1: SAMPLED, 3: GREEDY})
    spec, head, fwd = dec.speculator, dec.speculator.head, dec.fwd
    drafts = [30, 31]
    spec.rules[1].out.upload(np.asarray(drafts + [30, 31, 40] + [3, k, k + 1, 0], np.int32))  # all accepted + bonus
    spec.picks_of(3).upload(np.asarray(reject_first(k), np.int32))
    card.launch_args.clear()
    picks = dec.step({1: 9, 3: 9})
    assert picks[1].tokens == (30, 31, 40) and picks[3].tokens == (60,)
    accepts = [args for name, args in card.launch_args if name == "spec_accept"]
    assert len(accepts) == k
    for i, args in enumerate(accepts):  # (target scores, state, dist), (draft scores, state, dist), drafts, ...
        assert address(args[0]) == address(fwd.logits_row(i))  # slot 1 is the step's first slot: rows 0..K
        assert address(args[3]) == address(head.logits_row(head.draft_row(0, i)))  # place 0 of the round
        assert address(args[6]) == address(spec.rules[1].drafts)
    target = address(spec.picks_of(3).view(4 * k, 4))
    assert any(name.startswith("argmax") and any(isinstance(a, FakeBuffer) and address(a) == target for a in args)
               for name, args in card.launch_args)  # slot 3's first target lands in its own picks
    assert spec.caches[1].owed_tokens == drafts and spec.caches[3].owed_rows == 1


@pytest.mark.parametrize("case", ["one does not speculate", "masked", "too many rows", "more than a round takes",
                                  "no room"])
def test_a_step_whose_slots_cannot_all_take_a_round_is_plain_and_keeps_the_heads_fed(fixture, case):
    k = 2 if case == "too many rows" else 1
    _, dec = decoder(fixture, k, context=96, every_slot=case != "more than a round takes")
    if case == "more than a round takes":  # the default: three slots that all speculate are one too many
        assert dec.speculator.slots_together == SLOTS_TOGETHER == 2
    modes = {0: GREEDY, 1: GREEDY, 2: SAMPLED}
    started(dec, modes)
    if case == "one does not speculate":
        dec.begin(2, SlotRequest(SAMPLED, PROMPTS[2], speculative=False))
    elif case == "no room":  # slot 2 as if decoded up to where its verify rows no longer fit
        dec.seqs[2].next_position, dec.speculator.caches[2].position = 96 - k, 96 - k - 1
    spec = dec.speculator
    feeds = {slot: 5 for slot in modes}
    masks = (lambda: {}) if case == "masked" else None  # a callable counts as masks, whatever it returns
    before = [seq.next_position for seq in dec.seqs[:3]]
    owed = [spec.caches[s].owed_rows for s in modes]
    would_round = case == "no room"  # every slot speculates; only the round finds one without room
    assert dec.speculates_together(feeds, masks) == would_round
    if would_round:
        assert dec.launch(feeds, masks) is False  # taken whole, with nothing queued
        picks = dec.step(feeds, masks)
    else:
        assert dec.launch(feeds, masks)
        picks = dec.collect()
    assert all(p.extra == () and p.drafted == 0 for p in picks.values())
    assert [seq.next_position for seq in dec.seqs[:3]] == [p + 1 for p in before]
    assert spec.stats.rounds == 0
    for slot, r in zip(modes, owed):
        if spec.speculating(slot):
            assert spec.caches[slot].owed_rows == r + 1  # fed the plain step's row


def test_slots_owing_more_rows_than_a_round_pads_to_run_the_rest_first(fixture):
    """After plain steps (a third slot that does not speculate) the heads owe 4 rows each; a round of the two pads each
    slot's head rows to K+1 = 2, so each first runs its 2 oldest rows through its head without drafting, moves the
    last 2 to the front of its owed rows, and drafts from those. The head's position and owed rows stay in step with
    the trunk throughout."""
    k = 1
    card, dec = decoder(fixture, k)
    started(dec, {0: GREEDY, 1: GREEDY})
    dec.prefill_slot(2, PROMPTS[2])
    dec.begin(2, SlotRequest(GREEDY, PROMPTS[2], speculative=False))
    spec = dec.speculator
    for t in range(3):
        dec.step({0: 10 + t, 1: 20 + t, 2: 5})
    caches = [spec.caches[s] for s in (0, 1)]
    assert [c.owed_rows for c in caches] == [4, 4] and caches[0].owed_tokens == [10, 11, 12]
    before = [c.position for c in caches]
    for slot in (0, 1):
        spec.picks_of(slot).upload(np.asarray(reject_first(k), np.int32))
    card.launches.clear()
    picks = dec.step({0: 13, 1: 23})
    assert picks[0].drafted == k and picks[1].drafted == k
    widths = gemv_widths(card)
    # each slot's 2 extra rows (eh_proj and the block's four GEMVs, no LM head), then the drafts' LM head
    assert widths[2] == 2 * 5 + 1
    assert [c.position for c in caches] == [p + 4 for p in before]  # 2 run first, 2 in the round
    assert all(c.position + c.owed_rows == dec.seqs[s].next_position for s, c in ((0, caches[0]), (1, caches[1])))
    assert [c.owed_rows for c in caches] == [1, 1]


def test_a_round_of_several_slots_pads_each_slots_head_rows_with_its_token(fixture):
    """Slot 0 owes 2 rows (an accepted draft), slot 1 one: the round's head pass runs 2 rows of each; slot 1's second
    row embeds its own token (a valid id; the row is computed and never read) and its step record counts 1."""
    k = 1
    _, dec = decoder(fixture, k)
    started(dec, {0: GREEDY, 1: GREEDY})
    spec, head = dec.speculator, dec.speculator.head
    spec.picks_of(0).upload(np.asarray(accept_all(k), np.int32))
    spec.picks_of(1).upload(np.asarray(reject_first(k), np.int32))
    dec.step({0: 7, 1: 8})
    assert [spec.caches[s].owed_rows for s in (0, 1)] == [2, 1]
    for slot in (0, 1):
        spec.picks_of(slot).upload(np.asarray(reject_first(k), np.int32))
    dec.step({0: 40, 1: 41})
    assert list(head.round_ids(0, 2).download(np.int32, 2)) == [30, 40]  # its accepted draft's row, then its token's
    assert list(head.round_ids(1, 2).download(np.int32, 2)) == [41, 41]
    assert list(spec.caches[1].steps.download(np.int32, 2))[1] == 1


def test_a_head_pass_over_several_slots_refuses_what_it_cannot_run(fixture):
    from engine.cuda.mtp import HeadCall

    _, dec = decoder(fixture, 1)
    spec, head = dec.speculator, dec.speculator.head
    calls = [HeadCall(spec.caches[s].rows(0), spec.caches[s].owed, head.round_ids(s, 3)) for s in range(4)]
    for each, n in ((2, 0), (3, 3), (1, 5)):  # no slot, 9 rows, more slots than the head's places
        with pytest.raises(ValueError):
            head.draft_pass((calls * 2)[:n], each, 0)


def test_round_graphs_are_captured_once_and_stay_bounded(fixture):
    """A round of several slots replays one draft graph and one verify graph per set of slots and modes, and each
    slot's commit graph (per accepted count): the second such round captures them, the third replays. The owed rows
    are data: slots owing other counts (after an accepted draft, or after plain steps, whose extra rows run first)
    replay the same draft graph. Pairs of eight slots taking rounds in turn would leave a draft and a verify graph
    per pair and 8 commits; the card keeps MAX_GRAPHS of them."""
    k = 1
    card, dec = decoder(fixture, k, slots=8)
    started(dec, {slot: GREEDY for slot in range(4)})
    for slot in range(4, 8):
        dec.prefill_slot(slot, PROMPTS[slot - 4])
        dec.begin(slot, SlotRequest(GREEDY, PROMPTS[slot - 4]))
    spec = dec.speculator

    def rounds(pair: tuple[int, int], count: int, picks=reject_first) -> None:
        for _ in range(count):
            for slot in pair:
                spec.picks_of(slot).upload(np.asarray(picks(k), np.int32))
            dec.step({slot: 5 for slot in pair})

    rounds((0, 1), 2)
    assert [key[0] for key in spec.graphs._graphs] == ["drafts", "verify", "commit", "commit"]
    assert [key for key in spec.graphs._graphs if key[0] == "verify"] == [("verify", (0, 1), (True, True))]
    card.launches.clear()
    rounds((0, 1), 1)
    assert [name for name, *_ in card.launches].count("<replay>") == 1 + 1 + 2  # drafts, verify, commits
    spec.picks_of(0).upload(np.asarray(accept_all(k), np.int32))
    spec.picks_of(1).upload(np.asarray(reject_first(k), np.int32))
    dec.step({0: 5, 1: 5})  # slot 0 accepts its draft: it owes the head 2 rows, slot 1 one
    assert [spec.caches[s].owed_rows for s in (0, 1)] == [2, 1]
    captured = len(card.graphs)
    card.launches.clear()
    rounds((0, 1), 1)
    assert len(card.graphs) == captured  # other owed rows, the same draft graph
    assert [name for name, *_ in card.launches].count("<replay>") == 1 + 1 + 2
    for pair in ((2, 3), (4, 5), (6, 7), (0, 2), (1, 3), (5, 7)):
        rounds(pair, 2)
    assert len(spec.graphs) == MAX_GRAPHS  # 7 draft and 7 verify graphs and 8 commits captured, the oldest released
    assert len(card.graphs) <= 8 * 3


def test_a_verify_over_several_slots_refuses_what_it_cannot_run(fixture):
    _, dec = decoder(fixture, 1)
    spec, fwd, seqs = dec.speculator, dec.fwd, dec.seqs
    hidden = [spec.caches[s].owed for s in range(3)]

    def rows(*counts: int, rings: bool = True) -> list[SequenceRows]:
        first = [sum(counts[:j]) for j in range(len(counts))]
        return [SequenceRows(seqs[j], f, n, spec.rings[j] if rings else None) for j, (f, n) in enumerate(zip(first, counts))]

    for runs, out in ((rows(2), hidden[:1]), (rows(3, 3, 3), hidden), (rows(2, 1), hidden[:2]),
                      (rows(2, 2, rings=False), hidden[:2]), (rows(2, 2), hidden[:1])):
        with pytest.raises(ValueError):
            fwd.run_verifies(runs, out)


def test_the_plan_counts_each_slots_draft_logits(fixture):
    from engine.model.memory_plan import CardProfile, plan
    from engine.model.model_footprint import footprint_of

    card, fp = CardProfile("card", 1 << 30), footprint_of(fixture)
    one, two = (plan(fp, [card], 256, n_seqs=4, with_mtp=True, verify_states=k) for k in (1, 2))
    assert two.cards[0].scratch_bytes - one.cards[0].scratch_bytes == 4 * fixture.config.vocab_size * 4
