"""The sheet's budget model (no Qt): over-full bars, verdicts, and fixes that really fit."""

from __future__ import annotations

import pytest

from engine.errors import RigllmError
from engine.model.memory_plan import MTP_LEFT_OFF, CardProfile, plan
from engine.model.kv_formats import kv_format
from engine.model.model_footprint import footprint_for
from engine.gguf.shapes import shape_config
from engine.telemetry import cmp_100_210

from app.budget import TIGHT_BYTES, budget, max_context, profile_of, smaller_kv_formats

FP_27B = footprint_for(shape_config("27b"))
CARDS = [cmp_100_210(i) for i in range(4)]


def test_a_plan_that_fits_uses_the_engine_planner_numbers():
    result = budget(FP_27B, CARDS, [0, 1, 2], 32768, "k8v8")
    assert result.fits and result.plan is not None
    # the backend's plan: the 27B's MTP head, its verify rings and (over several cards) its embedding copy
    made = plan(FP_27B, [profile_of(c) for c in CARDS[:3]], 32768, kv_format("k8v8"), with_mtp=True, verify_states=1)
    assert result.plan.with_mtp
    assert [(b.weights, b.kv, b.layers) for b in result.cards] == [(p.weight_bytes, p.kv_bytes, p.layers)
                                                                   for p in made.cards]
    for bar, card in zip(result.cards, made.cards):
        assert bar.free == card.free_bytes  # the bar's free space is the planner's
        assert bar.total == 16 << 30 and bar.other == CARDS[0].memory_used


def test_over_full_cards_are_drawn_with_their_shortfall_and_named_in_the_summary():
    result = budget(FP_27B, CARDS, [0, 1, 2], 262144, "f16")
    assert not result.fits and result.plan is None
    worst = min(result.cards, key=lambda b: b.free)
    assert worst.free < 0 and "won't fit" in worst.verdict
    assert result.summary.startswith(f"{worst.name} is ") and "short" in result.summary
    assert sum(len(b.layers) for b in result.cards) == 64


@pytest.mark.parametrize("chosen,context,kv", [([0, 1, 2], 262144, "f16"), ([0, 1], 65536, "k8v8"),
                                               ([0, 1], 131072, "k8v3")])
def test_every_offered_fix_fits(chosen, context, kv):
    result = budget(FP_27B, CARDS, chosen, context, kv)
    assert not result.fits and result.fixes
    for fix in result.fixes:
        cards = chosen + ([fix.add_card] if fix.add_card is not None else [])
        assert budget(FP_27B, CARDS, cards, fix.context or context, fix.kv or kv).fits, fix.label


def test_a_chosen_split_is_drawn_checked_and_refused_when_it_names_no_layout():
    fits = budget(FP_27B, CARDS, [0, 1, 2], 32768, "k8v8", split=(20, 22, 22))
    assert fits.fits and [b.layers for b in fits.cards] == [range(0, 20), range(20, 42), range(42, 64)]
    lopsided = budget(FP_27B, CARDS, [0, 1], 65536, "k8v8", split=(8, 56))
    assert not lopsided.fits and [len(b.layers) for b in lopsided.cards] == [8, 56]
    assert lopsided.cards[1].free < 0 < lopsided.cards[0].free
    assert all(f.add_card is None for f in lopsided.fixes)  # a user's split names its cards
    for fix in lopsided.fixes:
        assert budget(FP_27B, CARDS, [0, 1], fix.context or 65536, fix.kv or "k8v8", split=(8, 56)).fits, fix.label
    wrong = budget(FP_27B, CARDS, [0, 1, 2], 32768, "k8v8", split=(30, 34))
    assert not wrong.fits and not wrong.cards and wrong.summary == "the split names 2 cards and 3 are chosen"
    short = budget(FP_27B, CARDS, [0, 1], 32768, "k8v8", split=(30, 30))
    assert not short.fits and "64 in all" in short.summary


def test_adding_a_card_is_offered_when_one_is_free():
    result = budget(FP_27B, CARDS, [0, 1], 131072, "f16")
    assert any(f.add_card is not None for f in result.fixes)


def test_tight_verdict_and_cpu_only_budget():
    result = budget(FP_27B, CARDS, [0, 1, 2], 65536, "f16")
    tight = [b for b in result.cards if 0 <= b.free < TIGHT_BYTES]
    assert all("tight" in b.verdict for b in tight)
    cpu = budget(FP_27B, CARDS, [], 4096, "f16")
    assert cpu.fits and cpu.cards == () and "CPU" in cpu.summary


def test_max_context_is_the_boundary():
    profiles = [profile_of(c) for c in CARDS[:3]]
    longest = max_context(FP_27B, profiles, "f16", 262144)
    assert budget(FP_27B, CARDS, [0, 1, 2], longest, "f16").fits
    assert not budget(FP_27B, CARDS, [0, 1, 2], longest + 1024, "f16").fits
    tiny = [CardProfile("tiny", 1 << 30)]
    assert max_context(FP_27B, tiny, "f16", 262144) == 0


def test_smaller_kv_formats_are_strictly_smaller_most_precise_first():
    cfg = FP_27B.config
    names = smaller_kv_formats(FP_27B, "k8v8")
    sizes = [kv_format(n).bytes_per_token(cfg) for n in names]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] < kv_format("k8v8").bytes_per_token(cfg)
    assert "k3v3" in names and "f16" not in names


def test_the_mtp_head_is_left_off_when_only_it_does_not_fit():
    """Two CMP cards hold the 27B at 4K context without the head but not with it: the sheet calls it a fit
    without the head (as the backend then loads it), and says so."""
    profiles = [profile_of(c) for c in CARDS[:2]]
    with pytest.raises(RigllmError):
        plan(FP_27B, profiles, 4096, kv_format("k8v8"), with_mtp=True, verify_states=1)
    result = budget(FP_27B, CARDS, [0, 1], 4096, "k8v8")
    assert result.fits and not result.plan.with_mtp and MTP_LEFT_OFF in result.plan.notes
