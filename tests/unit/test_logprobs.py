"""Logprobs math: a log-softmax of the raw logits, the picked token's value and the ordered top-n."""

from __future__ import annotations

import numpy as np
import pytest

from engine.generation.logprobs import log_normaliser, token_logprobs


def reference(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    return x - np.log(np.exp(x - x.max()).sum()) - x.max()


def test_normaliser_matches_float64_and_survives_large_logits() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(scale=5, size=1000).astype(np.float32)
    assert log_normaliser(logits) == pytest.approx(float(logits.max() - reference(logits).max()), abs=1e-5)
    shifted = logits + np.float32(3e4)  # exp would overflow without subtracting the maximum
    assert log_normaliser(shifted) - 3e4 == pytest.approx(log_normaliser(logits), abs=5e-3)
    assert np.exp(logits.astype(np.float64) - log_normaliser(logits)).sum() == pytest.approx(1.0, abs=1e-6)


def test_masked_tokens_have_zero_probability() -> None:
    logits = np.array([0.0, -np.inf, 0.0])
    assert token_logprobs(logits, 1, 0).logprob == -np.inf
    assert token_logprobs(logits, 0, 0).logprob == pytest.approx(np.log(0.5))


def test_picked_token_and_top_n() -> None:
    logits = np.array([1.0, 3.0, 2.0, 3.0, -1.0], dtype=np.float32)
    lp = reference(logits)
    result = token_logprobs(logits, 4, 3)
    assert result.token == 4 and result.logprob == pytest.approx(lp[4])
    assert [t for t, _ in result.top] == [1, 3, 2]  # descending, the tie by id
    assert [v for _, v in result.top] == pytest.approx([lp[1], lp[3], lp[2]])
    assert token_logprobs(logits, 0, 0).top == ()
    assert [t for t, _ in token_logprobs(logits, 0, 5).top] == [1, 3, 2, 0, 4]


@pytest.mark.parametrize("size,top_n", [(248_320, 20), (248_320, 1), (100_000, 5), (3000, 20)])
def test_top_n_agrees_with_a_full_sort(size: int, top_n: int) -> None:
    rng = np.random.default_rng(size + top_n)
    logits = rng.normal(size=size).astype(np.float32)
    logits[-3:] += 10  # the best ones sit past the last whole block of the fast path
    logits[:200] += 5
    result = token_logprobs(logits, 7, top_n)
    order = np.argsort(-logits.astype(np.float64), kind="stable")[:top_n]
    assert [t for t, _ in result.top] == order.tolist()
    np.testing.assert_allclose([v for _, v in result.top], reference(logits)[order], atol=1e-5)
    assert result.logprob == pytest.approx(reference(logits)[7], abs=1e-5)


@pytest.mark.parametrize("top_n", [-1, 6])
def test_top_n_out_of_range_is_refused(top_n: int) -> None:
    with pytest.raises(ValueError):
        token_logprobs(np.zeros(5), 0, top_n)
