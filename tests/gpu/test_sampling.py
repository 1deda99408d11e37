"""GPU sampling (cuda_src/sampling.cu via engine.cuda.sampling) against engine.generation.sampler.

- greedy arg-max: exact, ties to the lowest id (numpy.argmax), -1 for NaN/+inf logits;
- penalties: the penalised scores equal the reference's float64 `apply_penalties` rounded to fp32, bit
  for bit, and the token counts the kernels keep match the history;
- support: the set of ids the GPU can draw (read back from its selection state) equals the ids of
  `Sampler.distribution` for top-k / top-p / min-p / temperature combinations, with ties and masks;
- draws: 20000 draws of a captured sampling graph follow `Sampler.distribution` (chi-square test with
  bins of expected count >= 5, the rest pooled, at p = 1e-6 so a correct kernel never fails) and never
  leave the support;
- replays: the same (seed, counter) draws the same token, eager or replayed from a graph;
- constraints (a logit_bias record and a token mask from the pool: engine.cuda.token_masks): the scores equal
  the reference's penalties over `constrain_row` (bias added in fp32, then the mask) bit for bit, and the
  support is the reference's over that row.

The test data must not sit on a filter's knife edge (a top-p cumulative mass or min-p weight within
1e-6 relative of the boundary): the GPU computes weights in fp32 and the reference in float64, so
such a case could differ by one token legitimately. Cases move top_p to the middle of the gap its
cut falls in (`centered_top_p`), and `assert_clear_of_boundaries` checks the rest first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pytest

from engine.cuda.sampling import GpuSampler
from engine.cuda.token_masks import Constraints, MaskPool, pack_bias
from engine.generation.sampler import Sampler, SamplingParams
from engine.generation.token_mask import constrain_row, mask_of
from tests.chi_square import Z_1E6, critical_value
from tests.gpu.gpu_fixtures import assert_equal

VOCAB = 248320
KEY_NEG_INF = 0x007FFFFF  # order_key(-inf) in sampling.cu
KEY_POS_INF = 0xFF800000  # order_key(+inf)
DRAWS = 20000


@pytest.fixture
def sampler(card) -> Iterator[GpuSampler]:
    s = GpuSampler(card, VOCAB, "test.sampler")
    yield s
    s.free()


def order_key(x: np.ndarray) -> np.ndarray:
    """sampling.cu's order-preserving uint32 key of fp32 scores (-0 and +0 share one key)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).copy()
    u[(u & 0x7FFFFFFF) == 0] = 0
    return np.where(u & 0x80000000, ~u, u | 0x80000000).astype(np.uint32)


def gpu_support(scores: np.ndarray, state: np.void) -> np.ndarray:
    """The ids the GPU may draw: finite keys above final_key, plus the first final_ntie ids at it."""
    keys = order_key(scores)
    finite = (keys > KEY_NEG_INF) & (keys < KEY_POS_INF)
    above = np.flatnonzero(finite & (keys > state["final_key"]))
    tied = np.flatnonzero(finite & (keys == state["final_key"]))[: max(int(state["final_ntie"]), 0)]
    return np.union1d(above, tied)


def filtered_weights(
    logits: np.ndarray, history: Sequence[int], params: SamplingParams
) -> tuple[np.ndarray, np.ndarray, float]:
    """The reference's weights (best = 1) after top-k, the same after min-p, and the top-k set's total."""
    scores = Sampler(params).apply_penalties(logits, history)
    ids = np.flatnonzero(np.isfinite(scores))
    if 0 < params.top_k < ids.size:
        top = np.sort(scores[ids])[::-1]
        assert top[params.top_k - 1] > top[params.top_k], "test data: a tie across the top-k boundary"
        ids = ids[np.argpartition(-scores[ids], params.top_k - 1)[: params.top_k]]
    scaled = scores[ids] / params.temperature
    weights = np.exp(scaled - scaled.max())
    kept = weights[weights >= params.min_p] if params.min_p > 0 else weights
    return weights, kept, float(weights.sum())


def top_p_gap(kept: np.ndarray, total: float, top_p: float) -> tuple[float, float] | None:
    """The cumulative masses (below, at) the reference's top-p cut lies between, or None if nothing is cut."""
    cum = np.cumsum(np.sort(kept)[::-1])
    cut = int(np.searchsorted(cum, top_p * total, side="left"))
    if top_p >= 1 or cut >= cum.size:
        return None
    return (float(cum[cut - 1]) if cut > 0 else 0.0), float(cum[cut])


def centered_top_p(logits: np.ndarray, history: Sequence[int], params: SamplingParams) -> SamplingParams:
    """`params` with top_p moved to the middle of the gap its cut falls in: the same support, no knife edge.

    With thousands of ids in the support each weighs ~1e-5 of the total, so any top_p lies within a few
    1e-6 of a boundary; centring keeps the GPU's fp32 weights (relative error ~1e-7) on the same side.
    """
    _, kept, total = filtered_weights(logits, history, params)
    gap = top_p_gap(kept, total, params.top_p)
    if gap is None:
        return params
    return dataclasses.replace(params, top_p=(gap[0] + gap[1]) / 2 / total)


def assert_clear_of_boundaries(logits: np.ndarray, history: Sequence[int], params: SamplingParams) -> None:
    """Precondition: no top-k tie across the boundary, no min-p weight or top-p cut within 1e-6 of its edge."""
    weights, kept, total = filtered_weights(logits, history, params)
    if params.min_p > 0:
        rel = np.abs(weights / params.min_p - 1.0)
        assert rel.min() > 1e-6, f"test data: a weight within {rel.min():.1e} of min_p"
    gap = top_p_gap(kept, total, params.top_p)
    if gap is not None:
        mass = params.top_p * total
        margin = min(mass - gap[0], gap[1] - mass) / total
        assert margin > 1e-6, f"test data: the top-p cut is within {margin:.1e} of the boundary"


def normal_logits(rng: np.random.Generator) -> np.ndarray:
    return (rng.standard_normal(VOCAB) * 3).astype(np.float32)


def tied_logits(rng: np.random.Generator) -> np.ndarray:
    """Multiples of 0.5: tie groups of thousands of ids, so cuts fall inside them (lowest ids first)."""
    return (np.round(rng.standard_normal(VOCAB) * 2) / 2).astype(np.float32)


def masked_logits(rng: np.random.Generator) -> np.ndarray:
    """About 250 finite logits, the rest -inf (a grammar mask)."""
    x = normal_logits(rng)
    x[rng.random(VOCAB) < 0.999] = -np.inf
    return x


def history_of(rng: np.random.Generator, logits: np.ndarray) -> list[int]:
    """300 tokens: random ones with repeats, plus the 5 best logits several times (so penalties matter)."""
    best = np.argsort(-logits)[:5]
    return rng.integers(0, VOCAB, size=280).tolist() + np.repeat(best, 4).tolist()


CASES = {
    "top_k20_t07": (normal_logits, False, SamplingParams(temperature=0.7, top_k=20)),
    "top_k1": (normal_logits, False, SamplingParams(temperature=1.0, top_k=1)),
    "top_p09": (normal_logits, False, SamplingParams(temperature=1.0, top_p=0.9)),
    "qwen_defaults": (normal_logits, False, SamplingParams(temperature=0.6, top_k=20, top_p=0.95)),
    "min_p005_t15": (normal_logits, False, SamplingParams(temperature=1.5, min_p=0.05)),
    "k_p_min_p": (normal_logits, False, SamplingParams(temperature=1.0, top_k=200, top_p=0.8, min_p=0.02)),
    "no_filter": (normal_logits, False, SamplingParams(temperature=1.0)),
    "top_k_100000_t2": (normal_logits, False, SamplingParams(temperature=2.0, top_k=100000)),
    "tiny_temperature": (normal_logits, False, SamplingParams(temperature=1e-3, top_p=0.99)),
    "tied_top_p07": (tied_logits, False, SamplingParams(temperature=1.0, top_p=0.7)),
    "tied_top_p005": (tied_logits, False, SamplingParams(temperature=1.0, top_p=0.05)),
    "tied_min_p03": (tied_logits, False, SamplingParams(temperature=0.8, min_p=0.3)),
    "masked_top_k50": (masked_logits, False, SamplingParams(temperature=1.0, top_k=50)),
    "masked_top_k_beyond": (masked_logits, False, SamplingParams(temperature=1.0, top_k=1000)),
    "masked_top_p08": (masked_logits, False, SamplingParams(temperature=0.9, top_p=0.8)),
    "penalties_k_p": (
        normal_logits,
        True,
        SamplingParams(
            temperature=0.8, top_k=40, top_p=0.9, repetition_penalty=1.2, presence_penalty=0.5, frequency_penalty=0.3
        ),
    ),
}
DRAW_CASES = ["top_k20_t07", "qwen_defaults", "min_p005_t15", "no_filter", "tied_top_p07", "masked_top_p08", "penalties_k_p"]


def make_case(rng: np.random.Generator, name: str) -> tuple[np.ndarray, list[int], SamplingParams]:
    make_logits, with_history, params = CASES[name]
    logits = make_logits(rng)
    history = history_of(rng, logits) if with_history else []
    return logits, history, params


def load_history(card, sampler: GpuSampler, history: Sequence[int]) -> Callable[[], None]:
    """Upload the history once; returns the (capturable) launches that rebuild the counts from it."""
    ids = card.upload(np.asarray(history, np.int32), "test.history") if history else None

    def rebuild() -> None:
        sampler.reset_counts()
        if ids is not None:
            sampler.count_tokens(ids, len(history))

    return rebuild


# ---------------------------------------------------------------------------------------------------
# greedy


@pytest.mark.parametrize("parts", [1, 7, 128, 1000])
def test_argmax_is_numpy_argmax_with_ties_to_lowest_id(card, rng, parts):
    sampler = GpuSampler(card, VOCAB, "test.sampler", parts=parts)
    try:
        logits = normal_logits(rng)
        logits[rng.random(VOCAB) < 0.3] = -np.inf
        tied = np.sort(rng.choice(VOCAB, size=3, replace=False))
        logits[tied] = logits[np.isfinite(logits)].max() + 1.0
        buf = card.upload(logits, "test.logits")
        sampler.argmax(buf)
        assert sampler.read_token() == int(tied[0]) == int(np.argmax(logits)), f"ties at {tied.tolist()}"
        sampler.configure(SamplingParams(temperature=0.0))
        sampler.sample(buf)
        assert sampler.read_token() == int(tied[0]), "the full sampler's greedy path"
    finally:
        sampler.free()


@pytest.mark.parametrize("bad", ["nan", "+inf"])
def test_nan_or_inf_logits_give_minus_one(card, rng, sampler, bad):
    logits = normal_logits(rng)
    logits[rng.integers(VOCAB)] = np.nan if bad == "nan" else np.inf
    buf = card.upload(logits, "test.logits")
    sampler.argmax(buf)
    assert sampler.read_token() == -1, "argmax"
    for params in (SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, top_p=0.9)):
        sampler.configure(params)
        sampler.sample(buf)
        assert sampler.read_token() == -1, f"sample with {params}"


def test_all_masked_logits(card, sampler):
    """Greedy over all -inf gives id 0 (numpy.argmax); sampling has nothing to draw and reports -1."""
    buf = card.upload(np.full(VOCAB, -np.inf, np.float32), "test.logits")
    sampler.argmax(buf)
    assert sampler.read_token() == 0
    sampler.configure(SamplingParams(temperature=1.0))
    sampler.sample(buf)
    assert sampler.read_token() == -1


# ---------------------------------------------------------------------------------------------------
# penalties and counts


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0, repetition_penalty=1.3),
        SamplingParams(temperature=0.0, presence_penalty=0.7, frequency_penalty=0.4),
        SamplingParams(temperature=0.0, repetition_penalty=0.8, presence_penalty=-1.5, frequency_penalty=-0.25),
        SamplingParams(temperature=0.0, repetition_penalty=1.1, presence_penalty=2.0, frequency_penalty=2.0),
    ],
    ids=["repetition", "presence_frequency", "negative", "all"],
)
def test_penalties_are_exact(card, rng, sampler, params):
    logits = normal_logits(rng)
    history = history_of(rng, logits)
    logits[history[:3]] = [0.0, -0.0, 1e-30]  # signs at zero and a tiny positive
    load_history(card, sampler, history)()
    sampler.configure(params)
    sampler.sample(card.upload(logits, "test.logits"))
    reference = Sampler(params)
    expected = reference.apply_penalties(logits, history).astype(np.float32)
    assert_equal(sampler.scores.download(np.float32, VOCAB), expected, "penalised scores")
    token = sampler.read_token()
    assert token == reference.sample(logits, history), "greedy token after penalties"
    counts = np.bincount(np.asarray(history), minlength=VOCAB)
    counts[token] += 1
    assert_equal(sampler.counts.download(np.int32, VOCAB), counts.astype(np.int32), "counts after the step")


def test_count_tokens_ignores_ids_outside_the_vocabulary(card, rng, sampler):
    ids = np.concatenate([rng.integers(0, VOCAB, size=5000), [0, VOCAB - 1, VOCAB - 1, -1, VOCAB, 2**31 - 1]])
    sampler.count_tokens(card.upload(ids.astype(np.int32), "test.ids"), ids.size)
    valid = ids[(ids >= 0) & (ids < VOCAB)]
    expected = np.bincount(valid, minlength=VOCAB).astype(np.int32)
    assert_equal(sampler.counts.download(np.int32, VOCAB), expected, "token counts")


# ---------------------------------------------------------------------------------------------------
# support and draws


@pytest.mark.parametrize("name", sorted(CASES))
def test_support_matches_reference(card, rng, sampler, name):
    logits, history, params = make_case(rng, name)
    params = centered_top_p(logits, history, params)
    assert_clear_of_boundaries(logits, history, params)
    load_history(card, sampler, history)()
    sampler.configure(dataclasses.replace(params, seed=7))
    sampler.sample(card.upload(logits, "test.logits"))
    state = sampler.read_state()
    assert state["done"] == 0, f"not greedy, yet sample_prepare finished: {state}"
    got = gpu_support(sampler.scores.download(np.float32, VOCAB), state)
    expected = np.sort(Sampler(params).distribution(logits, history)[0])
    if not np.array_equal(got, expected):
        extra, missing = np.setdiff1d(got, expected), np.setdiff1d(expected, got)
        raise AssertionError(
            f"{name}: GPU support has {got.size} ids, reference {expected.size}; extra {extra[:8].tolist()}, "
            f"missing {missing[:8].tolist()}; state {state}"
        )
    token = sampler.read_token()
    assert token in set(expected.tolist()), f"drawn token {token} outside the support"


def chi_square(observed: dict[int, int], ids: np.ndarray, probs: np.ndarray, n: int) -> tuple[float, int]:
    """Statistic and degrees of freedom; ids expected fewer than 5 times are pooled into one bin."""
    expected = n * probs
    keep = expected >= 5.0
    obs = np.array([observed.get(int(i), 0) for i in ids], dtype=np.float64)
    exp_bins, obs_bins = list(expected[keep]), list(obs[keep])
    if (~keep).any():
        pooled_exp, pooled_obs = expected[~keep].sum(), obs[~keep].sum()
        if pooled_exp >= 5.0 or not exp_bins:
            exp_bins.append(pooled_exp)
            obs_bins.append(pooled_obs)
        else:  # too small to stand alone: merge into the smallest kept bin
            j = int(np.argmin(exp_bins))
            exp_bins[j] += pooled_exp
            obs_bins[j] += pooled_obs
    e, o = np.array(exp_bins), np.array(obs_bins)
    return float(((o - e) ** 2 / e).sum()), len(e) - 1


@pytest.mark.parametrize("name", DRAW_CASES)
def test_draws_follow_the_reference_distribution(card, rng, sampler, name):
    logits, history, params = make_case(rng, name)
    params = centered_top_p(logits, history, params)
    assert_clear_of_boundaries(logits, history, params)
    rebuild_counts = load_history(card, sampler, history)
    buf = card.upload(logits, "test.logits")
    sampler.configure(dataclasses.replace(params, seed=20240601))
    with card.capture("test.sample") as graph:  # counts rebuilt every replay: the same distribution each draw
        rebuild_counts()
        sampler.sample(buf)
    try:
        observed: dict[int, int] = {}
        for _ in range(DRAWS):
            card.replay(graph)
            token = sampler.read_token()
            observed[token] = observed.get(token, 0) + 1
    finally:
        graph.close()
    assert int(sampler.read_params()["counter"]) == DRAWS, "each draw advances the counter once"
    ids, probs = Sampler(params).distribution(logits, history)
    outside = sorted(set(observed) - set(ids.tolist()))
    assert not outside, f"{name}: drew ids outside the support: {outside[:8]}"
    stat, df = chi_square(observed, ids, probs, DRAWS)
    if df == 0:  # a single bin: every draw is the one token (checked above)
        return
    limit = critical_value(df, Z_1E6)
    top = sorted(observed.items(), key=lambda kv: -kv[1])[:5]
    expect = {int(i): round(DRAWS * p, 1) for i, p in zip(ids[:5], probs[:5])}
    assert stat <= limit, f"{name}: chi-square {stat:.1f} > {limit:.1f} (df {df}); top drawn {top}, expected {expect}"


# ---------------------------------------------------------------------------------------------------
# reproducibility and graphs


def test_same_counter_draws_the_same_token(card, rng, sampler):
    logits = normal_logits(rng)
    buf = card.upload(logits, "test.logits")
    params = SamplingParams(temperature=1.5, top_k=1000, seed=99)
    tokens = []
    for counter in range(40):
        sampler.configure(params, counter=counter)
        sampler.sample(buf)
        tokens.append(sampler.read_token())
        assert int(sampler.read_params()["counter"]) == counter + 1
    assert len(set(tokens)) > 5, f"40 counters gave only {sorted(set(tokens))}: the counter does not reach the RNG"
    for counter in (0, 17, 39):
        sampler.configure(params, counter=counter)
        sampler.sample(buf)
        assert sampler.read_token() == tokens[counter], f"counter {counter} replayed differently"
    sampler.configure(SamplingParams(temperature=1.5, top_k=1000, seed=100), counter=0)
    sampler.sample(buf)
    other_seed = [sampler.read_token()]
    for counter in range(1, 40):
        sampler.sample(buf)  # the device advanced the counter itself
        other_seed.append(sampler.read_token())
    assert other_seed != tokens, "a different seed drew the same 40 tokens"


def test_graph_replays_match_eager_runs(card, rng, sampler):
    """One captured graph serves requests with different parameters written to the device buffer."""
    logits = normal_logits(rng)
    buf = card.upload(logits, "test.logits")
    with card.capture("test.sample") as graph:
        sampler.sample(buf)
    try:
        for i, params in enumerate(
            [
                SamplingParams(temperature=0.0),
                SamplingParams(temperature=0.7, top_k=20, seed=1),
                SamplingParams(temperature=1.0, top_p=0.9, seed=2),
                SamplingParams(temperature=1.2, min_p=0.1, seed=3, repetition_penalty=1.3),
            ]
        ):
            sampler.reset_counts()
            sampler.configure(params, counter=i)
            sampler.sample(buf)
            eager = (sampler.read_token(), sampler.read_state(), sampler.counts.download(np.int32, VOCAB))
            sampler.reset_counts()
            sampler.configure(params, counter=i)
            card.replay(graph)
            replayed = (sampler.read_token(), sampler.read_state(), sampler.counts.download(np.int32, VOCAB))
            assert eager[0] == replayed[0], f"{params}: eager drew {eager[0]}, the graph {replayed[0]}"
            assert eager[1].tobytes() == replayed[1].tobytes(), f"{params}: states differ {eager[1]} vs {replayed[1]}"
            assert_equal(replayed[2], eager[2], f"{params}: counts")
    finally:
        graph.close()


# ---------------------------------------------------------------------------------------------------
# constraints


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0, repetition_penalty=1.3, presence_penalty=0.5),
                                    SamplingParams(temperature=0.8, top_k=40, frequency_penalty=0.3)],
                         ids=["greedy_penalties", "sampled_top_k"])
def test_constraints_match_the_reference_row(card, rng, params):
    """A slot's bias and mask: biased ids inside and outside the mask, on penalised tokens, a ban (-100) on
    the best allowed token and a +100 that the mask refuses; everything else plain."""
    logits = normal_logits(rng)
    history = history_of(rng, logits)
    allowed = rng.random(VOCAB) < 0.3
    best = np.argsort(-np.where(allowed, logits, -np.inf))[:3]
    refused = int(np.flatnonzero(~allowed)[0])
    bias = {int(best[0]): -100.0, int(best[1]): 2.5, refused: 100.0, int(history[-1]): 1.25}
    bias.update({int(i): float(v) for i, v in zip(rng.choice(VOCAB, 200, replace=False), rng.normal(0, 3, 200))})
    mask = mask_of(allowed)
    pool = MaskPool(card, VOCAB, entries=4, label="test.masks")
    entry = card.upload(np.array([pool.entry(mask)], np.int32), "test.mask_entry")
    constraints = Constraints(entry, pool.buffer, pool.words, card.upload(pack_bias(bias, VOCAB), "test.bias"))
    sampler = GpuSampler(card, VOCAB, "test.constrained", constraints=constraints)
    try:
        load_history(card, sampler, history)()
        sampler.configure(dataclasses.replace(params, seed=3))
        sampler.sample(card.upload(logits, "test.logits"))
        row = constrain_row(logits, bias, mask)
        reference = Sampler(params)
        expected = reference.apply_penalties(row, history).astype(np.float32)
        assert_equal(sampler.scores.download(np.float32, VOCAB), expected, "constrained scores")
        token = sampler.read_token()
        assert allowed[token] and token != best[0]
        if params.greedy:
            assert token == reference.sample(row, history)
        else:
            support = np.sort(reference.distribution(row, history)[0])
            assert np.array_equal(gpu_support(expected, sampler.read_state()), support)
            assert token in set(support.tolist())
    finally:
        sampler.free()
