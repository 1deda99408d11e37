"""Choosing the next token from a logits vector: penalties, filters, temperature, seeded sampling.

Order of operations (the Hugging Face / vLLM order, which Qwen's recommended settings were tuned with):

1. penalties on every token that occurs in the history (see `apply_penalties`);
2. if temperature == 0: greedy, the arg-max of the penalised logits (first index on ties); stop;
3. top-k keeps the k largest logits (0 = off);
4. temperature divides the logits, softmax gives probabilities;
5. top-p keeps the smallest most-probable prefix whose mass reaches top_p (1 = off);
6. min-p keeps tokens with probability ≥ min_p × the largest probability (0 = off);
7. renormalise and draw with the request's own `numpy.random.Generator` (seeded when `seed` is set).

llama.cpp's default chain differs in one place: it applies temperature *after* top-p and min-p, so its
top-p mass is measured at temperature 1. Whoever passes `history` decides what the penalties count; the
OpenAI convention (presence/frequency) is the generated tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.errors import RigllmError


MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY = 0.01, 100.0


@dataclass(frozen=True)
class SamplingParams:
    """One request's sampling settings; the defaults change nothing (plain sampling at temperature 1)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        _check_real("temperature", self.temperature, 0.0, math.inf, "≥ 0 (0 means greedy)")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise RigllmError(f"top_k must be an integer ≥ 0 (0 turns it off), got {self.top_k!r}")
        _check_real("top_p", self.top_p, 0.0, 1.0, "in (0, 1] (1 turns it off)", low_open=True)
        _check_real("min_p", self.min_p, 0.0, 1.0, "in [0, 1] (0 turns it off)")
        # Bounded so that a penalised fp32 logit stays finite on the GPU sampler (a divisor of 1e-295
        # overflowed it: found by the API fuzz test on the H200); useful values are near 1 anyway.
        _check_real("repetition_penalty", self.repetition_penalty, MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY,
                    f"in [{MIN_REPETITION_PENALTY}, {MAX_REPETITION_PENALTY:g}] (1 turns it off)")
        _check_real("presence_penalty", self.presence_penalty, -2.0, 2.0, "in [-2, 2]")
        _check_real("frequency_penalty", self.frequency_penalty, -2.0, 2.0, "in [-2, 2]")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < 2**64):
            raise RigllmError(f"seed must be an integer in [0, 2^64), got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def plain_greedy(self) -> bool:
        """Greedy with no penalty: the next token is the arg-max of the raw logits (GPU fast path)."""
        return self.greedy and self.repetition_penalty == 1.0 and self.presence_penalty == 0.0 and self.frequency_penalty == 0.0


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_real(name: str, value: object, low: float, high: float, rule: str, low_open: bool = False) -> None:
    ok = isinstance(value, (int, float, np.number)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and value <= high
    if not ok:
        raise RigllmError(f"{name} must be a finite number {rule}, got {value!r}")


class Sampler:
    """Samples for one request: holds its params and its random generator, so a seed replays exactly."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self._rng = np.random.default_rng(params.seed)

    def apply_penalties(self, logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        """A float64 copy of `logits` with the penalties applied to the tokens in `history`.

        For a token seen `c` times: repetition penalty r divides a positive logit by r and multiplies a
        non-positive one by r (llama.cpp, HF); then `c × frequency_penalty + presence_penalty` is
        subtracted (OpenAI). Tokens not in the history are untouched.
        """
        out = np.array(logits, dtype=np.float64, copy=True)
        p = self.params
        if len(history) == 0 or (
            p.repetition_penalty == 1.0 and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0
        ):
            return out
        ids, counts = np.unique(np.asarray(history, dtype=np.int64), return_counts=True)
        seen = out[ids]
        if p.repetition_penalty != 1.0:
            seen = np.where(seen > 0, seen / p.repetition_penalty, seen * p.repetition_penalty)
        out[ids] = seen - (counts * p.frequency_penalty + p.presence_penalty)
        return out

    def distribution(self, logits: np.ndarray, history: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
        """The token ids that can be drawn and their probabilities (summing to 1), most probable first."""
        scores = self.apply_penalties(logits, history)
        if np.isnan(scores).any() or np.isposinf(scores).any():
            raise ValueError("logits contain NaN or +inf")  # a backend bug, not a user error
        p = self.params
        if p.greedy:
            return np.array([int(np.argmax(scores))]), np.array([1.0])
        ids = np.flatnonzero(np.isfinite(scores))
        if ids.size == 0:
            raise ValueError("no token has a finite logit")
        if 0 < p.top_k < ids.size:
            ids = _top_k(ids, scores[ids], p.top_k)
        scaled = scores[ids] / p.temperature
        weights = np.exp(scaled - scaled.max())  # the best token weighs exactly 1
        total = weights.sum()
        if p.min_p > 0.0:  # p ≥ min_p · p_max  ⇔  weight ≥ min_p; a threshold, so it commutes with top-p
            keep = weights >= p.min_p
            ids, weights = ids[keep], weights[keep]
        mass = p.top_p * total if p.top_p < 1.0 else None
        order = _descending_head(weights, mass)
        ids, weights = ids[order], weights[order]
        if mass is not None:
            cut = int(np.searchsorted(np.cumsum(weights), mass, side="left")) + 1
            ids, weights = ids[:cut], weights[:cut]
        return ids, weights / weights.sum()

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """Draw the next token id; every non-greedy call consumes exactly one uniform from the generator."""
        ids, probs = self.distribution(logits, history)
        if self.params.greedy:
            return int(ids[0])
        cdf = np.cumsum(probs)
        pick = int(np.searchsorted(cdf, self._rng.random() * cdf[-1], side="right"))
        return int(ids[min(pick, ids.size - 1)])


def _top_k(ids: np.ndarray, scores: np.ndarray, k: int) -> np.ndarray:
    """The k best of `ids` (ascending) by score, ties at the boundary to the lowest ids: a prefix of the
    stable descending sort, as every filter here keeps (and the GPU sampler's radix select does)."""
    kth = np.partition(scores, scores.size - k)[scores.size - k]
    above = ids[scores > kth]
    return np.concatenate([above, ids[scores == kth][: k - above.size]])


def _descending_head(weights: np.ndarray, mass: float | None, first: int = 1024) -> np.ndarray:
    """Indices of `weights` sorted descending (ties by index), cut to a head holding at least `mass`.

    Sorting a 248K vocabulary costs tens of milliseconds while top-p rarely needs more than a few
    hundred tokens, so the head grows ×8 until it holds the mass. All tokens tied with the smallest
    one taken are included, so the head is exactly a prefix of the full stable sort.
    """
    n = weights.size
    head = first
    while mass is not None and head < n:
        kth = np.partition(weights, n - head)[n - head]
        candidates = np.flatnonzero(weights >= kth)
        candidates = candidates[np.argsort(-weights[candidates], kind="stable")]
        if weights[candidates].sum() >= mass:
            return candidates
        head *= 8
    return np.argsort(-weights, kind="stable")
