"""The speculative-sampling rule on the card (cuda_src/speculative_sampling.cu via
engine.cuda.speculative_sampling) keeps plain sampling's token distribution.

Each case fixes logits rows at the real vocabulary size: K draft rows (the head's) and K+1 target rows (the
verify's), chosen so drafts are often but not always accepted and sometimes land where the target has no
mass. A trial, captured once as a graph and replayed thousands of times, restores the rows and the history's
token counts, draws the drafts, runs the rule, and then draws one plain token from target row 1 (with the
round's tokens counted): the first two tokens of the trial are (emitted[0], emitted[1]) when the round
emitted two, else (emitted[0], the plain draw). Plain token-by-token sampling gives those two tokens with
probability p_0(x1 | H) p_1(x2 | H + x1) (`Sampler.distribution`, the truth; row 1's penalties see x1), so
the pairs must fit that joint (chi-square at α ≈ 1e-6, tests/chi_square.py: ten such checks run here, and
at 1e-3 one seed of the tie case failed by chance; 60,000 trials of it gave 18.1 on 15 degrees of freedom
on the H200), and the first draft's
acceptance rate must match sum_v min(p_0(v), q_0(v)). Penalties, top-k/top-p/min-p, ties at the top-k
boundary and drafts outside the target's support are among the cases; K = 1 and 2.

The data stay clear of filter knife edges (tests/gpu/test_sampling.py explains why) by construction: a few
boosted tokens well apart, and top-p cuts centred in their gap.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest

from engine.cuda.sampling import GpuSampler
from engine.cuda.speculative_sampling import GpuSpeculativeRule
from engine.generation.sampler import Sampler, SamplingParams
from engine.generation.speculative_rule import dense_distribution
from tests.chi_square import Z_1E6, chi_square_fits
from tests.gpu.test_sampling import assert_clear_of_boundaries, centered_top_p

VOCAB = 248320
TRIALS = 6000
PEAK = np.array([17, 40_000, 81_234, 120_001, 160_555, 200_000, 231_007, 248_319])  # spread over the slices


def rows_for(rng: np.random.Generator, k: int, ties: bool) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(draft rows [k], target rows [k+1]): noise plus the boosted PEAK tokens; drafts shift the boosts and
    favour two ids the targets do not boost (mass where p has little or none)."""
    def row(boost: np.ndarray) -> np.ndarray:
        x = (rng.standard_normal(VOCAB) * 0.5).astype(np.float32)
        x[PEAK] = boost
        return x

    targets = []
    for _ in range(k + 1):
        boost = np.array([9.0, 8.4, 8.0, 7.5, 7.0, 6.6, 6.1, 5.5], np.float32) + rng.uniform(-0.2, 0.2, 8).astype(np.float32)
        if ties:  # four ids tie at the top-k boundary, in different slices
            boost[2:6] = 7.5
        targets.append(row(boost))
    drafts = []
    for t in range(k):
        x = targets[t].copy()
        x[PEAK] += rng.normal(0.0, 0.8, PEAK.size).astype(np.float32)
        x[[5000, 150_000]] = 8.8  # tokens the target rows do not boost
        drafts.append(x)
    return drafts, targets


CASES = {
    "top_k8": (SamplingParams(temperature=1.0, top_k=8), False, []),
    "qwen": (SamplingParams(temperature=0.7, top_k=20, top_p=0.8), False, []),
    "min_p": (SamplingParams(temperature=1.2, min_p=0.05), False, []),
    "ties_top_k4": (SamplingParams(temperature=1.0, top_k=4), True, []),
    "penalties": (SamplingParams(temperature=0.9, top_k=8, repetition_penalty=1.3, presence_penalty=1.0,
                                 frequency_penalty=0.2), False, [int(PEAK[0]), int(PEAK[3]), int(PEAK[3]), 5000]),
}


def exact_pairs(targets: list[np.ndarray], history: list[int], params: SamplingParams) -> dict[tuple[int, int], float]:
    sampler = Sampler(params)
    p0 = dense_distribution(sampler, targets[0], history)
    joint = {}
    for a in np.flatnonzero(p0):
        p1 = dense_distribution(sampler, targets[1], history + [int(a)])
        joint.update({(int(a), int(b)): float(p0[a] * p1[b]) for b in np.flatnonzero(p1)})
    return joint


def run_trials(card, drafts: list[np.ndarray], targets: list[np.ndarray], history: list[int],
               params: SamplingParams, seed: int, trials: int = TRIALS) -> tuple[Counter, int, np.ndarray]:
    """(first-two-token pairs, trials whose first draft was accepted, the rows' RowDist records) of `trials`
    replays of one captured trial (see the module docstring)."""
    k = len(drafts)
    sampler = GpuSampler(card, VOCAB, "test.spec.sampler")
    rule = GpuSpeculativeRule(card, VOCAB, sampler.parts, k, "test.spec.rule")
    pristine = [card.upload(x, "test.spec.rows") for x in drafts + targets + [targets[1]]]
    work = [card.alloc(VOCAB * 4, "test.spec.work") for _ in pristine]
    hist = card.upload(np.asarray(history or [-1], np.int32), "test.spec.history")
    sampler.configure(dataclasses.replace(params, seed=seed))

    def trial() -> None:
        for dst, src in zip(work, pristine):
            dst.copy_from(src)
        sampler.reset_counts()
        sampler.count_tokens(hist, max(1, len(history)))
        for i in range(k):
            rule.draft(sampler, i, work[i])
        rule.decide(sampler, work[:k], work[k : 2 * k + 1])
        sampler.sample(work[-1])  # x2 when the round emitted one token: row 1 after H + x1

    trial()
    pairs: Counter = Counter()
    first_accepted = 0
    with card.capture("test.spec.trial") as graph:
        trial()
    dists = rule.dists.download(np.dtype([("total", "<u8"), ("tie_cut", "<i4"), ("ok", "<i4")]), 2 * k + 1)
    try:
        for _ in range(trials):
            card.replay(graph)
            _, emitted = rule.read()
            x2 = emitted[1] if len(emitted) > 1 else sampler.read_token()
            pairs[(emitted[0], x2)] += 1
            first_accepted += len(emitted) > 1
    finally:
        graph.close()
        sampler.free()
    return pairs, first_accepted, dists


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("name", list(CASES))
def test_the_rule_keeps_plain_sampling_s_distribution(card, rng, name, k):
    params, ties, history = CASES[name]
    drafts, targets = rows_for(rng, k, ties)
    if params.top_p < 1.0:
        params = centered_top_p(targets[0], history, params)
    for logits in targets + drafts if not ties else ():  # the tie case crosses the top-k boundary on purpose
        assert_clear_of_boundaries(logits, history, params)
    pairs, first_accepted, dists = run_trials(card, drafts, targets, history, params, seed=7)
    print(f"{name} K={k}: rows (total, tie_cut, ok), drafts then targets: {dists.tolist()}")
    joint = exact_pairs(targets, history, params)
    outside = {pair: n for pair, n in pairs.items() if pair not in joint}
    cells = sorted((pair, n, round(joint[pair] * TRIALS, 1)) for pair, n in pairs.items() if pair in joint)
    assert chi_square_fits(pairs, joint, TRIALS, Z_1E6), f"{name} K={k}: outside the support {outside}; (pair, seen, expected) {cells}"
    reference = Sampler(params)
    p0, q0 = (dense_distribution(reference, row, history) for row in (targets[0], drafts[0]))
    alpha = float(np.minimum(p0, q0).sum())
    rate = first_accepted / TRIALS
    print(f"{name} K={k}: first draft accepted {rate:.3f} (sum min(p, q) = {alpha:.3f})")
    assert 0.05 < alpha < 0.95, "the case must exercise both the accept and the residual branch"
    assert abs(rate - alpha) < 5 * np.sqrt(alpha * (1 - alpha) / TRIALS)
