"""Sampler: greedy, seeded reproducibility, filters that restrict the support, exact penalties, validation."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import RigllmError
from engine.generation.sampler import Sampler, SamplingParams


def _logits_for(probs: list[float], vocab: int = 0) -> np.ndarray:
    """Logits whose softmax is `probs` (padded with -inf up to `vocab` entries)."""
    out = np.full(max(vocab, len(probs)), -np.inf)
    out[: len(probs)] = np.log(probs)
    return out


def _frequencies(sampler: Sampler, logits: np.ndarray, n: int, history: list[int] = ()) -> np.ndarray:
    counts = np.bincount([sampler.sample(logits, history) for _ in range(n)], minlength=logits.size)
    return counts / n


def test_greedy_is_argmax_first_on_ties() -> None:
    rng = np.random.default_rng(0)
    s = Sampler(SamplingParams(temperature=0.0, top_k=3, top_p=0.1, seed=1))
    for _ in range(20):
        logits = rng.normal(size=500).astype(np.float32)
        assert s.sample(logits) == int(np.argmax(logits))
    assert s.sample(np.array([1.0, 3.0, 3.0, 2.0])) == 1


def test_greedy_sees_the_penalties() -> None:
    s = Sampler(SamplingParams(temperature=0.0, presence_penalty=1.0))
    assert s.sample(np.array([0.0, 2.0, 1.5]), history=[1]) == 2


def test_same_seed_same_tokens_other_seed_other_tokens() -> None:
    logits = np.random.default_rng(3).normal(size=1000)
    params = SamplingParams(temperature=1.2, top_p=0.99, seed=1234)
    first, second = Sampler(params), Sampler(params)
    run1 = [first.sample(logits) for _ in range(200)]
    run2 = [second.sample(logits) for _ in range(200)]
    other = Sampler(SamplingParams(temperature=1.2, top_p=0.99, seed=4321))
    assert run1 == run2
    assert [other.sample(logits) for _ in range(200)] != run1
    assert len(set(run1)) > 50  # it really samples


def test_plain_sampling_follows_softmax() -> None:
    probs = [0.4, 0.3, 0.2, 0.1]
    freq = _frequencies(Sampler(SamplingParams(seed=7)), _logits_for(probs), 20_000)
    np.testing.assert_allclose(freq, probs, atol=0.015)


def test_top_k_restricts_support_to_the_k_best() -> None:
    logits = np.random.default_rng(5).normal(size=64)
    best = set(np.argsort(-logits)[:5].tolist())
    s = Sampler(SamplingParams(top_k=5, seed=11))
    freq = _frequencies(s, logits, 8000)
    assert set(np.flatnonzero(freq).tolist()) == best
    ids, p = s.distribution(logits)
    want = np.exp(logits[ids] - logits[ids].max())
    np.testing.assert_allclose(p, want / want.sum(), rtol=1e-12)
    np.testing.assert_allclose(freq[ids], p, atol=0.02)


def test_top_k_breaks_a_tie_at_the_boundary_by_lowest_id() -> None:
    """Like the GPU sampler (and every other filter here): the support is a prefix of the stable sort."""
    logits = np.array([1.0, 3.0, 2.0, 2.0, 0.5, 2.0, 2.0])
    for k, want in ((2, {1, 2}), (3, {1, 2, 3}), (4, {1, 2, 3, 5})):
        ids, _ = Sampler(SamplingParams(top_k=k)).distribution(logits)
        assert set(ids.tolist()) == want


@pytest.mark.parametrize(("top_p", "kept"), [(0.45, 1), (0.6, 2), (0.8, 3), (0.9, 4), (0.97, 5), (1.0, 5)])
def test_top_p_keeps_smallest_prefix_reaching_the_mass(top_p: float, kept: int) -> None:
    probs = [0.1, 0.5, 0.05, 0.25, 0.1]  # sorted ids 1, 3, 0, 4, 2: cumulative 0.5, 0.75, 0.85, 0.95, 1
    s = Sampler(SamplingParams(top_p=top_p, seed=3))
    ids, p = s.distribution(_logits_for(probs, vocab=8))
    assert ids.tolist() == [1, 3, 0, 4, 2][:kept]
    np.testing.assert_allclose(p, np.array(probs)[ids] / np.array(probs)[ids].sum())
    freq = _frequencies(s, _logits_for(probs, vocab=8), 5000)
    assert set(np.flatnonzero(freq).tolist()) == set(ids.tolist())


@pytest.mark.parametrize(("min_p", "kept"), [(0.0, 5), (0.1, 4), (0.2, 3), (0.5, 2), (0.8, 1)])
def test_min_p_drops_tokens_below_a_fraction_of_the_best(min_p: float, kept: int) -> None:
    probs = [0.45, 0.3, 0.15, 0.06, 0.04]  # keeps p ≥ min_p × 0.45
    s = Sampler(SamplingParams(min_p=min_p, seed=5))
    ids, _ = s.distribution(_logits_for(probs))
    assert ids.tolist() == list(range(kept))
    freq = _frequencies(s, _logits_for(probs), 3000)
    assert set(np.flatnonzero(freq).tolist()) == set(ids.tolist())


def test_temperature_is_applied_before_top_p() -> None:
    """Documented order (HF/vLLM): at T=0.5, p = [.658, .237, .105], so top_p=0.6 keeps one token
    (llama.cpp, which measures top-p at T=1 with p = [.5, .3, .2], would keep two)."""
    s = Sampler(SamplingParams(temperature=0.5, top_p=0.6, seed=0))
    ids, p = s.distribution(_logits_for([0.5, 0.3, 0.2]))
    assert ids.tolist() == [0] and p.tolist() == [1.0]
    ids, p = Sampler(SamplingParams(temperature=0.5, seed=0)).distribution(_logits_for([0.5, 0.3, 0.2]))
    np.testing.assert_allclose(p, np.array([25, 9, 4]) / 38)


def test_penalties_change_exactly_the_expected_logits() -> None:
    logits = np.array([2.0, -1.0, 0.5, 3.0, 0.0, -0.5], dtype=np.float32)
    history = [0, 1, 1, 4, 1]
    s = Sampler(SamplingParams(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25))
    out = s.apply_penalties(logits, history)
    # seen: 0 once (positive: /2), 1 three times (negative: ×2), 4 once (zero: ×2); 2, 3, 5 untouched
    want = np.array([2.0 / 2 - 0.75, -1.0 * 2 - 1.25, 0.5, 3.0, 0.0 - 0.75, -0.5])
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(logits, np.array([2.0, -1.0, 0.5, 3.0, 0.0, -0.5], dtype=np.float32))


def test_negative_penalties_encourage_and_empty_history_changes_nothing() -> None:
    s = Sampler(SamplingParams(presence_penalty=-1.0, frequency_penalty=-0.5))
    np.testing.assert_array_equal(s.apply_penalties(np.zeros(3), [2, 2]), [0.0, 0.0, 2.0])
    np.testing.assert_array_equal(s.apply_penalties(np.ones(3), []), np.ones(3))


def test_broken_logits_are_refused() -> None:
    for bad in (np.nan, np.inf):
        with pytest.raises(ValueError, match="NaN or \\+inf"):
            Sampler(SamplingParams()).sample(np.array([0.0, bad, 1.0]))
    with pytest.raises(ValueError, match="no token has a finite logit"):
        Sampler(SamplingParams()).sample(np.full(4, -np.inf))


def test_masked_tokens_are_never_drawn() -> None:
    logits = np.zeros(10)
    logits[[0, 3, 7]] = -np.inf
    freq = _frequencies(Sampler(SamplingParams(seed=2)), logits, 2000)
    assert freq[[0, 3, 7]].sum() == 0 and np.count_nonzero(freq) == 7


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.1), ("temperature", float("nan")), ("temperature", float("inf")),
        ("top_k", -1), ("top_k", 2.5), ("top_k", True),
        ("top_p", 0.0), ("top_p", 1.01),
        ("min_p", -0.01), ("min_p", 1.5),
        ("repetition_penalty", 0.0), ("repetition_penalty", -1.0), ("repetition_penalty", 2.8e-295),
        ("repetition_penalty", 101.0),
        ("presence_penalty", 2.5), ("frequency_penalty", -3.0),
        ("seed", -1), ("seed", 2**64), ("seed", "42"),
    ],
)
def test_invalid_params_raise_clear_errors(field: str, value: object) -> None:
    with pytest.raises(RigllmError, match=f"^{field} must be"):
        SamplingParams(**{field: value})


def test_edge_values_are_valid() -> None:
    SamplingParams(temperature=0, top_k=0, top_p=1.0, min_p=1.0, presence_penalty=-2, frequency_penalty=2,
                   seed=2**64 - 1, repetition_penalty=0.01)
    SamplingParams(repetition_penalty=100.0)
    assert SamplingParams(temperature=0).greedy and not SamplingParams().greedy


@pytest.mark.parametrize("top_p", [0.3, 0.9, 0.999])
def test_top_p_on_a_large_tied_vocabulary_matches_a_full_sort(top_p: float) -> None:
    """The sampler sorts only a growing head of the vocabulary; it must equal sorting everything."""
    logits = np.round(np.random.default_rng(9).normal(size=20_000) * 2, 1)  # many exact ties
    ids, p = Sampler(SamplingParams(temperature=0.8, top_p=top_p)).distribution(logits)
    w = np.exp(logits / 0.8 - (logits / 0.8).max())
    order = np.argsort(-w, kind="stable")
    cut = int(np.searchsorted(np.cumsum(w[order]), top_p * w.sum())) + 1
    assert ids.tolist() == order[:cut].tolist()
    np.testing.assert_allclose(p, w[order[:cut]] / w[order[:cut]].sum(), rtol=1e-12)
    if top_p > 0.5:
        assert ids.size > 1024  # beyond the first head the sampler sorts
