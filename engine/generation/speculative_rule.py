"""Accepting or rejecting drafted tokens so that the output keeps exactly the target's distribution.

Standard speculative sampling (Leviathan et al. 2023, Chen et al. 2023): draft i was drawn from q_i;
accept it with probability min(1, p_i(d)/q_i(d)); at the first rejection draw the replacement from
norm(max(p_i − q_i, 0)) and stop; when every draft is accepted draw a bonus token from p_{K}. The
emitted tokens are then distributed exactly as if each had been sampled from p one at a time.

p and q are the full sampling distributions of `Sampler.distribution` (penalties over the same
history, top-k, temperature, top-p, min-p), made dense over the vocabulary. At temperature 0 both are
point masses, and the same rule reduces to "accept while the draft equals the target's arg-max, then
emit the target's arg-max": no special case, and never an arg-max at temperature > 0 (the anchor's
MTP verify made that mistake, anchor-qengine.md §2.10).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from engine.generation.sampler import Sampler

# (targets p_0..p_K, drafts d_1..d_K, draft distributions q_1..q_K, rng) → the emitted tokens: the
# accepted drafts followed by exactly one more token (the replacement or the bonus).
AcceptRule = Callable[[Sequence[np.ndarray], Sequence[int], Sequence[np.ndarray], np.random.Generator], list[int]]


def dense_distribution(sampler: Sampler, logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
    """The sampler's distribution for `logits` after `history` as a float64 vector over the vocabulary."""
    ids, probs = sampler.distribution(logits, history)
    out = np.zeros(logits.shape[-1], np.float64)
    out[ids] = probs
    return out


def sample_dense(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from a (not necessarily normalised) non-negative vector; one uniform per call."""
    cdf = np.cumsum(probs)
    pick = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return min(pick, probs.shape[0] - 1)


def speculative_sampling(targets: Sequence[np.ndarray], drafts: Sequence[int], draft_probs: Sequence[np.ndarray],
                         rng: np.random.Generator) -> list[int]:
    """The lossless rule: accepted drafts, then one token from the residual (on a rejection) or from p_K."""
    if len(targets) != len(drafts) + 1 or len(draft_probs) != len(drafts):
        raise ValueError("need K+1 target distributions for K drafts and their K draft distributions")
    out: list[int] = []
    for p, d, q in zip(targets, drafts, draft_probs):
        if q[d] <= 0.0:
            raise ValueError(f"draft {d} has probability 0 under its own draft distribution")
        if rng.random() * q[d] < p[d]:  # u < p/q without dividing
            out.append(d)
            continue
        residual = np.maximum(p - q, 0.0)
        out.append(sample_dense(residual if residual.sum() > 0.0 else p, rng))
        return out
    out.append(sample_dense(targets[-1], rng))
    return out
