"""Logprobs on the card (cuda_src/logprobs.cu via engine.cuda.logprobs) against engine.generation.logprobs.

- the picked token's logprob and the 20 best alternatives equal `token_logprobs` on the same row: the same
  ids in the same order, values within LOGPROB_ATOL (the card sums fp32 exponentials per slice in fp32 and
  combines the slices in float64; the host sums the same fp32 exponentials in float64: a relative error of
  about 1e-7 per slice sum, so the log-normaliser moves by ~1e-7; 2e-5 leaves room and still fails a wrong
  normaliser, which moves every value by at least the log of a missed entry's weight);
- ties go to the lower id (-0.0 and +0.0 tie), NaN is never listed, -inf adds nothing to the normaliser, and a
  vocabulary smaller than 20 pads with id -1 (read back as fewer alternatives);
- a slot that asked for nothing leaves its record untouched (the kernels return at once);
- the number of slices does not change the ids, and moves the normaliser within the tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.cuda.logprobs import LOGPROB_DTYPE, LOGPROB_TOP, GpuLogprobs, token_logprob_of
from engine.generation.logprobs import token_logprobs

LOGPROB_ATOL = 2e-5


def device_record(card, logits: np.ndarray, token: int, parts: int | None = None, want: bool = True) -> np.void:
    size = LOGPROB_DTYPE.itemsize
    out = card.upload(np.full(size, 0xAB, np.uint8), "test.logprob.out")  # a sentinel the kernels overwrite
    lp = GpuLogprobs(card, logits.size, out, "test.logprobs", parts)
    lp.want(want)
    row = card.upload(np.ascontiguousarray(logits, np.float32), "test.logprob.row")
    picked = card.upload(np.array([token], np.int32), "test.logprob.token")
    lp.compute(row, picked)
    card.synchronize()
    return out.download(np.uint8, size).view(LOGPROB_DTYPE)[0]


def assert_same_logprobs(got, want) -> None:
    assert got.token == want.token
    assert got.logprob == pytest.approx(want.logprob, abs=LOGPROB_ATOL)
    assert [i for i, _ in got.top] == [i for i, _ in want.top], "alternatives differ"
    np.testing.assert_allclose([v for _, v in got.top], [v for _, v in want.top], rtol=0, atol=LOGPROB_ATOL)


@pytest.mark.parametrize("vocab", [248320, 151936, 1000, 257, 37])
def test_random_rows_match_the_host(card, rng, vocab):
    logits = (rng.standard_normal(vocab) * 4).astype(np.float32)
    token = int(rng.integers(vocab))
    rec = device_record(card, logits, token)
    n = min(LOGPROB_TOP, vocab)
    assert_same_logprobs(token_logprob_of(rec, n), token_logprobs(logits, token, n))


def test_a_peaked_row_like_a_trained_model(card, rng):
    """One token far ahead (logprob near 0), the rest spread 20-40 below: the normaliser's sum is dominated
    by one term, where an error in the small terms hides."""
    logits = (rng.standard_normal(248320) * 3 - 30).astype(np.float32)
    logits[12345] = 8.0
    rec = device_record(card, logits, 12345)
    assert_same_logprobs(token_logprob_of(rec, 20), token_logprobs(logits, 12345, 20))


def test_ties_go_to_the_lower_id_and_nan_is_never_listed(card):
    logits = np.full(5000, -3.0, np.float32)
    logits[[4000, 17, 2500, 900]] = 2.0  # four equal best, out of id order
    logits[[10, 11]] = np.nan
    logits[[3, 4999]] = -np.inf
    rec = device_record(card, logits, 2500)
    got = token_logprob_of(rec, 20)
    assert [i for i, _ in got.top][:4] == [17, 900, 2500, 4000]
    assert [i for i, _ in got.top][4:] == [i for i in range(20) if i not in (3, 10, 11, 17)][:16]  # the -3.0s by id
    finite = logits[np.isfinite(logits)].astype(np.float64)
    lse = float(np.log(np.sum(np.exp(finite - 2.0))) + 2.0)
    assert float(rec["lse"]) == pytest.approx(lse, abs=LOGPROB_ATOL)
    assert got.logprob == pytest.approx(2.0 - lse, abs=LOGPROB_ATOL)


def test_signed_zeros_tie_and_go_to_the_lower_id(card):
    """-0.0 and +0.0 compare equal, so they are one logit to the order (the kernels' keys map -0.0 to +0.0)."""
    logits = np.full(3000, -5.0, np.float32)
    logits[[2900, 40, 7]] = [0.0, -0.0, 0.0]
    logits[1500] = 1.0
    got = token_logprob_of(device_record(card, logits, 40), 20)
    assert [i for i, _ in got.top][:4] == [1500, 7, 40, 2900]
    assert got.top[1][1] == got.top[2][1] == got.top[3][1] == got.logprob


def test_a_vocabulary_below_twenty_pads_the_alternatives(card, rng):
    logits = rng.standard_normal(7).astype(np.float32)
    rec = device_record(card, logits, 0)
    assert list(rec["top_id"][7:]) == [-1] * (LOGPROB_TOP - 7)
    assert_same_logprobs(token_logprob_of(rec, 20), token_logprobs(logits, 0, 7))


def test_a_slot_that_asked_for_nothing_keeps_its_record(card, rng):
    rec = device_record(card, rng.standard_normal(1000).astype(np.float32), 3, want=False)
    assert bytes(rec.tobytes()) == b"\xab" * LOGPROB_DTYPE.itemsize


@pytest.mark.parametrize("parts", [1, 7, 256])  # 256: LOGPROB_MAX_PARTS, a full final launch
def test_the_number_of_slices_changes_nothing_but_rounding(card, rng, parts):
    logits = (rng.standard_normal(248320) * 4).astype(np.float32)
    rec = device_record(card, logits, 5, parts=parts)
    assert_same_logprobs(token_logprob_of(rec, 20), token_logprobs(logits, 5, 20))
