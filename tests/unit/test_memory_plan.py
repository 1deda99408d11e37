"""The per-card memory planner on released shapes (spec §7.1) and on the tiny test model."""

from __future__ import annotations

import itertools
import random

import pytest

from engine.errors import RigllmError
from engine.model.kv_formats import kv_format
from engine.model.memory_plan import (
    CARD_16GB_BYTES,
    GIB,
    MIB,
    CardProfile,
    _balanced_cuts,
    cards_16gb,
    format_bytes,
    plan,
)
from engine.model.model_footprint import (
    device_bytes,
    footprint_for,
    footprint_of,
    gdn_conv_state_bytes,
    gdn_recurrent_state_bytes,
)
from engine.gguf.loader import load_model
from engine.gguf.shapes import shape_config
from gguf import GGMLQuantizationType as T
from tests.unit.loader_fixtures import write_tiny_model

F16 = kv_format("f16")
K8V3 = kv_format("k8v3")


def test_card_profile():
    card = cards_16gb(1)[0]
    assert card.total_bytes == CARD_16GB_BYTES == 16 * GIB
    assert card.usable_bytes == 16 * GIB - 600 * MIB - int(0.03 * 16 * GIB)
    busy = CardProfile("busy", 16 * GIB, other_used_bytes=2 * GIB)
    assert busy.usable_bytes == card.usable_bytes - 2 * GIB


def test_gdn_state_matches_spec():
    """Spec §7.3: 27B per sequence = conv 5.625 MiB + recurrent 144 MiB over 48 GDN layers."""
    cfg = shape_config("27b")
    assert 48 * gdn_conv_state_bytes(cfg) == 5.625 * MIB
    assert 48 * gdn_recurrent_state_bytes(cfg) == 144 * MIB


def test_device_bytes_rules():
    assert device_bytes("blk.0.ffn_up.weight", (17408, 5120), T.BF16) == (17408 * 5120 // 32 * 34, True)
    assert device_bytes("blk.0.ffn_up.weight", (17408, 5120), T.Q8_0) == (17408 * 5120 // 32 * 34, False)
    assert device_bytes("blk.0.ssm_conv1d.weight", (10240, 4), T.F16) == (10240 * 4 * 4, False)
    assert device_bytes("blk.0.ssm_alpha.weight", (48, 5120), T.F32) == (48 * 5120 * 4, False)
    assert device_bytes("blk.0.ssm_alpha.weight", (48, 5120), T.BF16) == (48 * 5120 // 32 * 34, True)
    assert device_bytes("blk.0.ssm_alpha.weight", (48, 5120), T.Q8_0) == (48 * 5120 // 32 * 34, False)
    assert device_bytes("blk.0.attn_norm.weight", (5120,), T.F32) == (5120 * 4, False)


def test_9b_q8_0_fits_one_card_at_modest_context():
    p = plan(footprint_for(shape_config("9b")), cards_16gb(1), context=32768, kv=F16)
    (card,) = p.cards
    assert card.layers == range(0, 32) and card.embedding and card.head and not card.mtp
    assert 9 * GIB < card.total_bytes < card.profile.usable_bytes
    assert card.kv_bytes == 32768 * 32768  # 32 KiB a token


def test_27b_q8_0_needs_two_cards():
    fp = footprint_for(shape_config("27b"))
    with pytest.raises(RigllmError, match=r"^card 0: the plan needs .* short by .* on 1 card\(s\)"):
        plan(fp, cards_16gb(1), context=32768, kv=F16)
    p = plan(fp, cards_16gb(2), context=32768, kv=F16)
    assert [c.layers for c in p.cards] == [range(0, 32), range(32, 64)]
    assert all(c.free_bytes >= 0 for c in p.cards)


def test_a_chosen_split_is_planned_and_checked():
    """`split` replaces the balanced cut and is held to the same memory check (a user's --split, the app)."""
    fp = footprint_for(shape_config("27b"))
    p = plan(fp, cards_16gb(2), context=8192, kv=F16, split=[30, 34])
    assert [c.layers for c in p.cards] == [range(0, 30), range(30, 64)]
    with pytest.raises(RigllmError, match=r"^card 1: the plan needs .* for layers 8-63 .* short by"):
        plan(fp, cards_16gb(2), context=32768, kv=F16, split=[8, 56])
    with pytest.raises(RigllmError, match="at least one layer and 64 in all, not 30,30"):
        plan(fp, cards_16gb(2), context=32768, kv=F16, split=[30, 30])
    with pytest.raises(RigllmError, match="the split gives 3 cards, 2 were given"):
        plan(fp, cards_16gb(2), context=32768, kv=F16, split=[20, 22, 22])


def test_27b_long_context_with_k8v3_fits_three_cards():
    """contracts.md: 27B at 256K with K8/V3 KV fits on 3 cards with the weights (MTP head on)."""
    cfg = shape_config("27b")
    p = plan(footprint_for(cfg), cards_16gb(3), context=262144, kv=K8V3, with_mtp=True)
    last = p.cards[-1]
    per_layer = 4 * (272 + 100)  # Hkv x (int8 K: 8 blocks of 34 B + 3-bit V: 2 blocks of 50 B)
    attention_here = sum(not cfg.is_gdn(i) for i in last.layers)
    assert last.mtp and last.kv_bytes == 262144 * per_layer * (attention_here + 1)  # + the MTP block's KV
    assert (p.kv_format, p.kv_k, p.kv_v) == ("k8v3", "int8", "wht3")
    assert not any("sizes only" in n for n in p.notes)  # k8v3 has CUDA kernels


def test_absurd_context_is_refused_naming_the_card():
    with pytest.raises(RigllmError) as err:
        plan(footprint_for(shape_config("9b")), cards_16gb(4), context=50_000_000, kv=F16)
    message = str(err.value)
    assert message.startswith("card ") and "short by" in message and "50000000 tokens in f16" in message
    assert "\n" not in message


def test_balanced_cuts_are_optimal():
    rng = random.Random(7)
    for _ in range(30):
        cost = [rng.randint(1, 100) for _ in range(rng.randint(3, 9))]
        n = rng.randint(1, min(4, len(cost)))
        fixed = [rng.randint(0, 150) for _ in range(n)]
        usable = [rng.randint(200, 400) for _ in range(n)]

        def worst(cuts):
            return max((fixed[k] + sum(cost[cuts[k] : cuts[k + 1]])) / usable[k] for k in range(n))

        brute = min(worst([0, *inner, len(cost)]) for inner in itertools.combinations(range(1, len(cost)), n - 1))
        cuts = _balanced_cuts(cost, fixed, usable)
        assert cuts[0] == 0 and cuts[-1] == len(cost) and all(a < b for a, b in zip(cuts, cuts[1:]))
        assert worst(cuts) == pytest.approx(brute)


def test_uneven_cards_get_uneven_layers():
    fp = footprint_for(shape_config("27b"))
    cards = [
        CardProfile("big", 16 * GIB),
        CardProfile("busy", 16 * GIB, other_used_bytes=4 * GIB),
        CardProfile("big2", 16 * GIB),
    ]
    p = plan(fp, cards, context=32768, kv=K8V3)
    assert len(p.cards[1].layers) < len(p.cards[0].layers)


def test_float_weights_are_counted_as_q8_0(tmp_path):
    cfg = shape_config("9b")
    q8, f16 = footprint_for(cfg, "q8_0"), footprint_for(cfg, "f16")
    assert f16.weight_bytes == q8.weight_bytes and f16.file_bytes > 1.8 * q8.file_bytes
    assert (
        f16.requantised == 8 * 7 + 24 * 8 + 8 + 2
    )  # 2-D weights but conv1d: attention 4+3, GDN 5+3, MTP 4+3+1, embd + head
    notes = plan(f16, cards_16gb(1), context=4096, kv=F16).notes
    assert f"{f16.requantised} large F16/BF16/F32 weights are counted as requantised to Q8_0 at load" in notes


def test_tied_embeddings_copy_on_last_card():
    fp = footprint_for(shape_config("0.8b"))
    one = plan(fp, cards_16gb(1), context=4096, kv=F16)
    two = plan(fp, cards_16gb(2), context=4096, kv=F16)
    assert sum(c.weight_bytes for c in two.cards) == one.cards[0].weight_bytes + fp.embedding_bytes
    assert "tied embeddings: the last card keeps its own copy of token_embd as the LM head" in two.notes


def test_plan_from_a_file_and_bad_requests(tmp_path):
    fp = footprint_of(load_model(write_tiny_model(tmp_path / "tiny.gguf")))
    assert fp.file_bytes == fp.weight_bytes  # Q8_0 and F32 only: nothing changes form
    p = plan(fp, cards_16gb(2), context=100, kv=F16, with_mtp=True)
    assert p.cards[1].kv_bytes == 100 * 2 * 128 and p.cards[0].kv_bytes == 0  # layer 3 + MTP on the last card
    with pytest.raises(RigllmError, match="cannot split 4 layers over 5 cards"):
        plan(fp, cards_16gb(5), context=100, kv=F16)
    with pytest.raises(RigllmError, match="dead: no usable memory"):
        plan(fp, [CardProfile("dead", 512 * MIB)], context=100, kv=F16)
    no_mtp = footprint_of(load_model(write_tiny_model(tmp_path / "nomtp.gguf", n_mtp=0)))
    with pytest.raises(RigllmError, match="no MTP block"):
        plan(no_mtp, cards_16gb(1), context=100, kv=F16, with_mtp=True)


def test_format_bytes():
    assert [format_bytes(n) for n in (15 * GIB // 2, 3 * MIB // 2, 2048, 100)] == [
        "7.50 GiB",
        "1.5 MiB",
        "2.0 KiB",
        "100 B",
    ]
