"""Token masks and logit_bias (issue 28 item 3): the host-side mask helpers, the card's mask pool and bias
records on a stand-in card, the slot decoder's step buffer, and the scheduler handing grammar and forced
token masks to the backend instead of re-picking on the host. The kernels' arithmetic is checked on the
H200 (tests/gpu/test_sampling.py, tests/gpu/test_slots.py)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from engine.cuda.slot_decoder import SlotDecoder
from engine.cuda.token_masks import BIAS_DTYPE, NO_MASK, MaskPool, pack_bias
from engine.cuda.weights import upload_weights
from engine.errors import RigllmError
from engine.fixtures.demo_model import ensure_demo_model
from engine.generation.sampler import SamplingParams
from engine.generation.slots import SlotRequest
from engine.generation.token_mask import MAX_LOGIT_BIAS, allowed_tokens, constrain_row, mask_of, only_token
from engine.gguf.loader import load_model
from engine.paths import CUDA_SRC_DIR
from fake_card import FakeCard

VOCAB = 1000


def test_mask_round_trips_and_pads_with_refusals():
    rng = np.random.default_rng(0)
    allowed = rng.random(VOCAB) < 0.4
    mask = mask_of(allowed)
    assert mask.dtype == np.uint32 and mask.size == -(-VOCAB // 32)
    assert np.array_equal(allowed_tokens(mask, VOCAB), allowed)
    wider = allowed_tokens(mask, VOCAB + 100)  # a model's padding rows past the tokenizer's vocabulary
    assert np.array_equal(wider[:VOCAB], allowed) and not wider[VOCAB:].any()
    assert np.flatnonzero(allowed_tokens(only_token(677, VOCAB), VOCAB)).tolist() == [677]


def test_constrain_row_adds_the_bias_then_masks():
    logits = np.linspace(-1, 1, VOCAB, dtype=np.float32)
    allowed = np.zeros(VOCAB, bool)
    allowed[[3, 5, 8]] = True
    row = constrain_row(logits, {3: 10.0, 4: 100.0}, mask_of(allowed))
    assert row[3] == np.float32(logits[3]) + np.float32(10.0) and row[5] == logits[5]
    assert np.isneginf(row[4]) and np.isneginf(row[~allowed]).all()
    assert constrain_row(logits, None, None) is logits


def test_bias_records_hold_openais_limit_and_refuse_more():
    rec = pack_bias({9: -100.0, 2: 1.5}, VOCAB)
    assert rec["n"][0] == 2 and rec["ids"][0, :2].tolist() == [2, 9] and rec["values"][0, :2].tolist() == [1.5, -100.0]
    assert pack_bias(None, VOCAB)["n"][0] == 0
    with pytest.raises(RigllmError, match="at most 300"):
        pack_bias({i: 1.0 for i in range(MAX_LOGIT_BIAS + 1)}, VOCAB)
    with pytest.raises(RigllmError, match="outside the vocabulary"):
        pack_bias({VOCAB: 1.0}, VOCAB)


def test_bias_layout_mirrors_sampling_cuh():
    source = (CUDA_SRC_DIR / "sampling.cuh").read_text()
    assert int(re.search(r"#define RIGLLM_MAX_LOGIT_BIAS (\d+)", source).group(1)) == MAX_LOGIT_BIAS
    assert re.search(r"struct LogitBias \{\s*int n;\s*int ids\[RIGLLM_MAX_LOGIT_BIAS\];\s*"
                     r"float values\[RIGLLM_MAX_LOGIT_BIAS\];\s*\}", source)
    assert BIAS_DTYPE.itemsize == 4 + 8 * MAX_LOGIT_BIAS


def test_mask_pool_uploads_a_mask_once_and_evicts_the_least_recent():
    card = FakeCard()
    pool = MaskPool(card, VOCAB, entries=2)
    a, b, c = (mask_of(np.random.default_rng(s).random(VOCAB) < 0.5) for s in range(3))
    ea = pool.entry(a)
    assert pool.entry(a.view(np.int32)) == ea and pool.uploads == 1  # llguidance's int32 words are the same mask
    eb = pool.entry(b)
    assert eb != ea and pool.uploads == 2
    pool.entry(a)  # a is now the most recent: c takes b's entry
    assert pool.entry(c) == eb and pool.uploads == 3
    stored = pool.buffer.download(np.uint32, (2, pool.words))
    assert np.array_equal(stored[ea], a) and np.array_equal(stored[eb], c)
    short = only_token(3, 64)  # fewer words than the pool's: the rest of the entry is cleared
    e = pool.entry(short)
    assert pool.buffer.download(np.uint32, (2, pool.words))[e, 2:].sum() == 0


def test_an_upload_moves_only_the_span_where_the_entry_changes():
    """A mask replacing an evicted one sends the words from the first to the last that differ (and a first
    upload, over zeros, from its first to its last set word); the entry always ends up holding the mask."""
    card = FakeCard()
    pool = MaskPool(card, VOCAB, entries=1)
    structural = mask_of(np.isin(np.arange(VOCAB), [40, 41, 90]))  # a few low ids: words 1 and 2
    pool.entry(structural)
    assert pool.uploaded_bytes == 4 * 2
    other = mask_of(np.isin(np.arange(VOCAB), [41, 150]))  # evicts it; differs in words 1, 2 and 4
    pool.entry(other)
    assert pool.uploaded_bytes == 4 * 2 + 4 * 4
    assert np.array_equal(pool.buffer.download(np.uint32, pool.words), other)
    short = only_token(3, 64)  # clears words 1 and 4 past its own two: the span reaches word 4
    before = pool.uploaded_bytes
    pool.entry(short)
    assert pool.uploaded_bytes - before == 4 * 5
    held = pool.buffer.download(np.uint32, pool.words)
    assert held[:2].tolist() == short.tolist() and not held[2:].any()


def test_the_pool_holds_every_mask_it_names_through_many_evictions():
    card = FakeCard()
    pool = MaskPool(card, VOCAB, entries=3)
    rng = np.random.default_rng(7)
    masks = [mask_of((rng.random(VOCAB) < 0.5) & (np.arange(VOCAB) >= rng.integers(0, VOCAB))) for _ in range(6)]
    full = pool.uploaded_bytes
    for i in rng.integers(0, len(masks), 60):
        e = pool.entry(masks[i])
        assert np.array_equal(pool.buffer.download(np.uint32, (3, pool.words))[e], masks[i])
    assert pool.uploaded_bytes - full < pool.uploads * 4 * pool.words  # spans, not whole rows


def test_masks_whose_fingerprints_collide_still_get_their_own_bits():
    """The fingerprint only finds a candidate entry; the staging row decides. With every fingerprint forced
    equal, alternating masks share one entry and each lookup re-uploads, but the entry always holds the mask
    just asked for."""
    card = FakeCard()
    pool = MaskPool(card, VOCAB, entries=4)
    pool._multipliers[:] = 0
    a, b = (mask_of(np.random.default_rng(s).random(VOCAB) < 0.5) for s in (11, 12))
    for mask in (a, b, a, b):
        e = pool.entry(mask)
        assert np.array_equal(pool.buffer.download(np.uint32, (4, pool.words))[e], mask)
    assert pool.uploads == 4 and pool.entry(b) == e and pool.uploads == 4


@pytest.fixture(scope="module")
def demo():
    return load_model(ensure_demo_model())


def test_a_masked_step_writes_its_slots_entries_and_no_others(demo):
    """The step buffer carries every slot's mask entry (NO_MASK for unmasked ones), begin writes the slot's
    entry and bias record, and the step's sampler launch is given the constraints."""
    card = FakeCard()
    cfg = demo.config
    dec = SlotDecoder(card, cfg, upload_weights(card, demo.file, cfg), context=64, slots=3, chunk=16)
    vocab = cfg.vocab_size
    entries = dec.sampling.constraints.mask_entry
    mask = mask_of(np.arange(vocab) % 3 == 0)
    for slot in range(3):
        dec.prefill_slot(slot, [4, 5, 6])
    dec.begin(0, SlotRequest(SamplingParams(temperature=0.0), (), masked=True, logit_bias={11: 2.0}), mask)
    dec.begin(1, SlotRequest(SamplingParams(temperature=0.0), ()))
    assert entries.download(np.int32, 3)[0] != NO_MASK and entries.download(np.int32, 3)[1] == NO_MASK
    bias = dec.sampling.constraints.bias.download(BIAS_DTYPE, 3)
    assert bias["n"].tolist()[:2] == [1, 0] and bias["ids"][0, 0] == 11
    card.launches.clear()
    dec.step({0: 1, 1: 2, 2: 3}, {2: mask})
    got = entries.download(np.int32, 3).tolist()
    assert got[0] == NO_MASK and got[1] == NO_MASK and got[2] == dec.sampling.masks.entry(mask)
    assert dec.sampling.masks.uploads == 1
    # logits, counts, params, scores, partials, V, row_slot, then mask_entry, pool, words, bias
    assert [n for name, _, _, n in card.launches if name == "sample_scores"] == [11]


def test_the_constrained_step_bench_counts_what_crosses_pcie(demo):
    """The bench's host path on a stand-in card: a repeating mask is uploaded once per distinct mask, a fresh
    one every step and row, logprobs come down as records and a plain step moves only ids and the step record."""
    from engine.cuda.bench.constrained_steps import constrained_step_costs, render_constrained

    card = FakeCard()
    cfg = demo.config
    dec = SlotDecoder(card, cfg, upload_weights(card, demo.file, cfg), context=64, slots=4, chunk=16)
    r = constrained_step_costs(dec, (1, 4), depth=8, steps=12)  # 4 rounds of 3 timed steps per kind
    wide = r["widths"]["4"]
    words = 4 * -(-cfg.vocab_size // 32)
    assert r["steps"] == 12 and r["rounds"] == 4
    assert wide["mask_fresh"]["mask_uploads"] == 48 and wide["mask_repeating"]["mask_uploads"] == 0
    assert wide["split_no_mask"]["mask_uploads"] == 0 and wide["split_no_mask"]["h2d_bytes_per_token"] < 200
    assert wide["mask_fresh"]["h2d_bytes_per_token"] >= words
    assert wide["plain"]["h2d_bytes_per_token"] < 200 and wide["plain"]["d2h_bytes_per_token"] == 4
    assert wide["logprobs_top20"]["d2h_bytes_per_token"] > wide["plain"]["d2h_bytes_per_token"]
    assert wide["plain"]["card_idle_us_per_step"] == 1000.0  # the stand-in's events: 1 ms between any two
    assert len(render_constrained(r)) == 1 + 2 * 6
