"""Block-sparse causal attention in numpy: per-head patterns as a block index (issue 10, MInference).

The sequence is cut into blocks of `block` cache rows (by cache order, like the causal mask). A
pattern decides, for every query block i, which key blocks j ≤ i it reads; the token mask is that
block index AND the causal mask, applied exactly (masked rows get −inf, so they contribute nothing).
Every pattern keeps the diagonal block, so no query row is left without keys. A pattern whose budget
covers every causal block gives the causal mask itself, and attention is then bit-identical to dense.

Patterns (anchor-qengine.md §2.6):
* dense           every causal block;
* a_shape         `sink` first blocks + a `window` of blocks ending at the diagonal (the winner there);
* vertical_slash  `vertical` key blocks with the most attention mass, plus `slash` block diagonals
                  (offsets i − j ≥ 1) with the most mass, both measured from the chunk's last query
                  block against all keys (the MInference estimate);
* block_topk      per query block, the `topk` earlier key blocks with the largest pooled score
                  mean(q_block)·mean(k_block), plus the diagonal.
Ties in any top-k go to the lowest index (what the GPU radix select reproduces).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

KINDS = ("dense", "a_shape", "vertical_slash", "block_topk")


@dataclass(frozen=True)
class Pattern:
    """One head's pattern; counts are in blocks (the unused ones stay 0)."""

    kind: str = "dense"
    sink: int = 0
    window: int = 0
    vertical: int = 0
    slash: int = 0
    topk: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown sparse pattern kind '{self.kind}' (known: {', '.join(KINDS)})")
        if min(self.sink, self.window, self.vertical, self.slash, self.topk) < 0:
            raise ValueError("pattern counts must be non-negative")
        if self.kind == "a_shape" and self.window < 1:
            raise ValueError("an A-shape window must hold at least the diagonal block")

    @property
    def label(self) -> str:
        """Short name for tables: dense, a_shape(s1,w4), vertical_slash(v2,d2), block_topk(k4)."""
        if self.kind == "a_shape":
            return f"a_shape(s{self.sink},w{self.window})"
        if self.kind == "vertical_slash":
            return f"vertical_slash(v{self.vertical},d{self.slash})"
        if self.kind == "block_topk":
            return f"block_topk(k{self.topk})"
        return "dense"

    def to_json(self) -> dict[str, int | str]:
        return {k: v for k, v in asdict(self).items() if k == "kind" or v}

    @classmethod
    def from_json(cls, data: dict) -> Pattern:
        return cls(**data)


DENSE = Pattern()


def query_blocks(n_past: int, t_new: int, block: int) -> np.ndarray:
    """Absolute block numbers of the chunk's query rows n_past .. n_past+t_new−1, ascending, unique."""
    return np.arange(n_past // block, (n_past + t_new - 1) // block + 1)


def _top_indices(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries of a 1-D array (−inf never chosen); ties to the lowest index."""
    order = np.lexsort((np.arange(scores.shape[0]), -scores))
    order = order[np.isfinite(scores[order])]
    return order[:k]


def block_index(
    pattern: Pattern, q: np.ndarray, keys: np.ndarray, n_past: int, block: int
) -> np.ndarray:
    """Which key blocks each query block reads: bool [n_query_blocks, n_key_blocks], causal (j ≤ i).

    q [T, W]: the chunk's queries of one head (rows n_past.. of the cache); keys [S, W]: that head's
    KV head's keys, S = n_past + T. Block top-k ranks unscaled pooled dots (the scale cannot change a
    ranking); the vertical-slash softmax scales by 1/√W as attention does.
    """
    t_new, s_len = q.shape[0], keys.shape[0]
    qb = query_blocks(n_past, t_new, block)
    n_kb = (s_len - 1) // block + 1
    kb = np.arange(n_kb)
    causal = kb[None, :] <= qb[:, None]
    offset = qb[:, None] - kb[None, :]
    if pattern.kind == "dense":
        return causal
    if pattern.kind == "a_shape":
        return causal & ((kb[None, :] < pattern.sink) | (offset < pattern.window))
    if pattern.kind == "vertical_slash":
        return causal & _vertical_slash(pattern, q, keys, n_past, block, qb, n_kb, offset)
    return causal & _block_topk(pattern.topk, q, keys, n_past, block, qb, n_kb, offset)


def _vertical_slash(
    pattern: Pattern, q: np.ndarray, keys: np.ndarray, n_past: int, block: int,
    qb: np.ndarray, n_kb: int, offset: np.ndarray,
) -> np.ndarray:
    """Top `vertical` key blocks and top `slash` block offsets by the last query block's softmax mass."""
    t_new, width = q.shape
    last = np.arange(max(0, t_new - block), t_new)  # the chunk's last `block` queries
    rows = n_past + last
    s = (q[last] @ keys.T) * np.float32(width**-0.5)
    s = np.where(np.arange(keys.shape[0])[None, :] <= rows[:, None], s, -np.inf)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    key_block = np.arange(keys.shape[0]) // block
    column_mass = np.bincount(key_block, weights=p.sum(axis=0), minlength=n_kb)
    off = (rows // block)[:, None] - key_block[None, :]  # block offset of each (query, key) pair
    slash_mass = np.bincount(off[off >= 0], weights=p[off >= 0], minlength=n_kb)
    slash_mass[0] = -np.inf  # the diagonal is always kept, not chosen
    verticals = np.zeros(n_kb, bool)
    verticals[_top_indices(column_mass, pattern.vertical)] = True
    offsets = np.zeros(n_kb, bool)
    offsets[_top_indices(slash_mass, pattern.slash)] = True
    offsets[0] = True
    return verticals[None, :] | offsets[np.clip(offset, 0, n_kb - 1)]


def _block_topk(
    k: int, q: np.ndarray, keys: np.ndarray, n_past: int, block: int,
    qb: np.ndarray, n_kb: int, offset: np.ndarray,
) -> np.ndarray:
    """Per query block the k earlier key blocks with the largest mean(q)·mean(k), plus the diagonal."""
    rows = n_past + np.arange(q.shape[0])
    q_pooled = np.stack([q[rows // block == b].mean(axis=0) for b in qb])
    k_pooled = np.stack([keys[j * block:(j + 1) * block].mean(axis=0) for j in range(n_kb)])
    scores = q_pooled @ k_pooled.T  # [n_qb, n_kb]
    chosen = offset == 0
    for i in range(qb.shape[0]):
        row = np.where(offset[i] >= 1, scores[i], -np.inf)
        chosen[i, _top_indices(row, k)] = True
    return chosen


def token_mask(index: np.ndarray, n_past: int, t_new: int, s_len: int, block: int) -> np.ndarray:
    """Expand a block index [n_qb, n_kb] to rows: bool [t_new, s_len] (causality is added by attention)."""
    q_rows = (n_past + np.arange(t_new)) // block - n_past // block
    return index[q_rows][:, np.arange(s_len) // block]


def head_indices(
    patterns: list[Pattern], q: np.ndarray, keys: np.ndarray, n_past: int, block: int
) -> list[np.ndarray]:
    """Block indices per query head for q [T, H, W] over keys [S, Hkv, W] (GQA: head h reads h // G)."""
    group = q.shape[1] // keys.shape[1]
    return [block_index(p, q[:, h], keys[:, h // group], n_past, block) for h, p in enumerate(patterns)]


def head_masks(indices: list[np.ndarray], n_past: int, t_new: int, s_len: int, block: int) -> np.ndarray:
    """Token masks bool [H, T, S] from per-head block indices."""
    return np.stack([token_mask(idx, n_past, t_new, s_len, block) for idx in indices])


def density(index: np.ndarray) -> float:
    """Fraction of the causal blocks a block index reads (1.0 for dense): the pattern's cost."""
    n_kb = index.shape[1]
    causal = np.arange(n_kb)[None, :] <= np.arange(n_kb - index.shape[0], n_kb)[:, None]
    return float(index.sum() / causal.sum())
