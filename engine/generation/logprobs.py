"""Log-probabilities of a picked token and of the most likely alternatives, from one logits row.

They are taken from the raw model logits (a plain log-softmax, before penalties, temperature or any
constraint mask), which is what OpenAI and vLLM report by default: the numbers describe the model,
not the sampling settings of the request, so they are comparable between requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MAX_TOP_LOGPROBS = 20  # OpenAI's limit for chat `top_logprobs` (contracts.md: top-k only, k ≤ 20)


@dataclass(frozen=True)
class TokenLogprob:
    """The picked token's log-probability and the `top_n` most likely tokens, most likely first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # (token id, logprob); ties ordered by id


def log_normaliser(logits: np.ndarray) -> float:
    """log Σ exp(logits): a token's logprob is its logit minus this. The exponentials are taken in the
    row's own precision (fp32 for a model row: a 248K row costs about a millisecond, not ten) and
    summed in float64."""
    top = float(np.max(logits))
    return top + math.log(float(np.sum(np.exp(logits - logits.dtype.type(top)), dtype=np.float64)))


def token_logprobs(logits: np.ndarray, token: int, top_n: int) -> TokenLogprob:
    """Logprob of `token` and the `top_n` best tokens (0 ≤ top_n ≤ vocabulary size) under `logits`."""
    size = logits.size
    if not 0 <= top_n <= size:
        raise ValueError(f"top_n must be in [0, {size}], got {top_n}")
    norm = log_normaliser(logits)
    top: tuple[tuple[int, float], ...] = ()
    if top_n:
        head = _top_ids(logits, top_n)
        head = head[np.lexsort((head, -logits[head]))]  # by logit descending, then by id
        top = tuple((int(i), float(logits[i]) - norm) for i in head)
    return TokenLogprob(int(token), float(logits[token]) - norm, top)


_BLOCK = 256


def _top_ids(logits: np.ndarray, n: int) -> np.ndarray:
    """Ids of the `n` largest logits, in no order (among equal values at the boundary, any).

    A full arg-partition of a 248K row takes milliseconds; the n best values lie in the n blocks of
    256 with the largest maxima (a block holding one of them has at most n - 1 larger values above
    its maximum), so only those blocks are searched.
    """
    size = logits.size
    whole = size - size % _BLOCK
    if n * _BLOCK * 4 > whole:
        return np.argpartition(logits, size - n)[size - n:]
    blocks = logits[:whole].reshape(-1, _BLOCK).max(axis=1)
    best = np.argpartition(blocks, blocks.size - n)[blocks.size - n:]
    candidates = np.concatenate([(best[:, None] * _BLOCK + np.arange(_BLOCK)).ravel(), np.arange(whole, size)])
    return candidates[np.argpartition(logits[candidates], candidates.size - n)[candidates.size - n:]]
