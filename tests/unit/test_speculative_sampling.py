"""Speculative sampling keeps the target distribution at temperature > 0, and the tests can tell a wrong rule.

Each statistical check is a seeded chi-square goodness-of-fit test at α ≈ 1e-3 (tests/chi_square.py). It is
run against the real rule (must pass) and against deliberately wrong ones written here (must fail): the anchor's greedy verify (accept only the target's
arg-max, greedy replacement and bonus) and "resample from p instead of the residual on a rejection".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest

from engine.generation.sampler import Sampler, SamplingParams
from engine.generation.speculative import MtpSpeculator
from engine.fixtures.speculative_fixture import draft_friendly_model
from engine.generation.speculative_rule import (
    dense_distribution,
    sample_dense,
    speculative_sampling,
)
from engine.reference.speculative_state import MtpTrail
from tests.chi_square import chi_square_fits


def greedy_verify(targets: Sequence[np.ndarray], drafts: Sequence[int], draft_probs, rng) -> list[int]:
    """WRONG at temperature > 0 (the anchor's MTP verify): arg-max acceptance, greedy replacement and bonus."""
    out = []
    for p, d in zip(targets, drafts):
        best = int(np.argmax(p))
        out.append(best)
        if d != best:
            return out
    return out + [int(np.argmax(targets[-1]))]


def resample_from_target(targets, drafts, draft_probs, rng) -> list[int]:
    """WRONG: the right acceptance test, but a rejection draws from p instead of norm(max(p − q, 0))."""
    out = []
    for p, d, q in zip(targets, drafts, draft_probs):
        if rng.random() * q[d] < p[d]:
            out.append(d)
            continue
        return out + [sample_dense(p, rng)]
    return out + [sample_dense(targets[-1], rng)]


# ---- the rule alone, on explicit distributions ----------------------------------------------------------
def first_token_counts(rule, p0: np.ndarray, q: np.ndarray, p1: np.ndarray, n: int) -> Counter:
    rng = np.random.default_rng(0)
    counts: Counter = Counter()
    for _ in range(n):
        d = sample_dense(q, rng)
        counts[rule([p0, p1], [d], [q], rng)[0]] += 1
    return counts


P0 = np.array([0.05, 0.4, 0.3, 0.15, 0.1, 0.0])
Q = np.array([0.3, 0.3, 0.05, 0.05, 0.1, 0.2])  # overlaps p0 partly; puts mass where p0 has none
P1 = np.full(6, 1 / 6)


def test_the_rule_keeps_the_target_distribution():
    n = 20_000
    assert chi_square_fits(first_token_counts(speculative_sampling, P0, Q, P1, n), dict(enumerate(P0)), n)


@pytest.mark.parametrize("wrong", [greedy_verify, resample_from_target])
def test_the_check_catches_wrong_rules(wrong):
    n = 20_000
    assert not chi_square_fits(first_token_counts(wrong, P0, Q, P1, n), dict(enumerate(P0)), n)


def test_greedy_distributions_accept_exactly_the_argmax():
    rng = np.random.default_rng(0)
    onehot = np.eye(6)
    assert speculative_sampling([onehot[2], onehot[4]], [2], [onehot[2]], rng) == [2, 4]  # accepted, bonus
    assert speculative_sampling([onehot[2], onehot[4]], [3], [onehot[3]], rng) == [2]  # rejected: the target's
    assert speculative_sampling([onehot[1], onehot[2], onehot[5]], [1, 2], [onehot[1], onehot[2]], rng) == [1, 2, 5]


# ---- end to end on the tiny model: the first two tokens after a fixed one ----------------------------------
PROMPT = [17, 200, 3, 99, 45, 45, 120, 7, 250, 61]
FED = 88
PARAMS = SamplingParams(temperature=1.0, top_k=3, presence_penalty=0.5, seed=11)


@pytest.fixture(scope="module")
def model():
    return draft_friendly_model(seed=1)


def exact_pairs(model) -> dict[tuple[int, int], float]:
    """P(x_{n+1}, x_{n+2}) of plain token-by-token sampling, by enumerating the (top-3) first token."""
    sampler = Sampler(PARAMS)
    state = model.new_state()
    model.forward_hidden(PROMPT, state)
    p0 = dense_distribution(sampler, model.forward([FED], state)[-1], PROMPT + [FED])
    after_fed = state.snapshot()
    joint = {}
    for a in np.flatnonzero(p0):
        state.restore(after_fed)
        p1 = dense_distribution(sampler, model.forward([int(a)], state)[-1], PROMPT + [FED, int(a)])
        joint.update({(int(a), int(b)): p0[a] * p1[b] for b in np.flatnonzero(p1)})
    return joint


def speculative_pairs(model, k: int, rule, n: int) -> tuple[Counter, MtpSpeculator]:
    """The first two tokens after FED from speculative rounds, n times from the same prefilled state."""
    speculator = MtpSpeculator(model, k, rule)
    state, trail = model.new_state(), speculator.new_trail()
    speculator.feed(state, trail, PROMPT)
    start, owed = state.snapshot(), trail.frozen()
    sampler, rng = Sampler(PARAMS), np.random.default_rng(5)
    counts: Counter = Counter()
    for _ in range(n):
        state.restore(start)
        trail = MtpTrail.thawed(owed)
        history, token, got = PROMPT + [FED], FED, []
        while len(got) < 2:
            run = speculator.round(state, trail, token, sampler, history, rng)
            got += run
            token = run[-1]
            history.append(token)
        counts[(got[0], got[1])] += 1
    return counts, speculator


N_SAMPLES = 600


@pytest.mark.parametrize("k", [1, 2])
def test_speculation_keeps_the_token_distribution(model, k):
    counts, speculator = speculative_pairs(model, k, speculative_sampling, N_SAMPLES)
    assert chi_square_fits(counts, exact_pairs(model), N_SAMPLES)
    stats = speculator.stats
    assert 0.2 < stats.acceptance_rate < 0.95  # both branches of the rule were taken many times


def test_the_end_to_end_check_catches_greedy_verification(model):
    counts, _ = speculative_pairs(model, 1, greedy_verify, N_SAMPLES)
    assert not chi_square_fits(counts, exact_pairs(model), N_SAMPLES)
