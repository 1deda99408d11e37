"""Block-sparse reference attention (engine/reference/sparse_attention.py + the mask in attention.py).

* Each pattern's block index is checked on small hand-made cases (A-shape, vertical-slash from a
  planted heavy column and a planted diagonal, block top-k from planted pooled scores, tie order).
* Masked blocks contribute nothing: the sparse output equals float64 softmax attention over only the
  selected keys, and changing masked-out keys/values leaves it unchanged.
* A 100% budget (every pattern sized to cover all causal blocks) is bit-identical to dense, also
  for a chunk continuing a cache (n_past > 0) and with GQA.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.reference.attention import attend_stored
from engine.reference.sparse_attention import (
    DENSE,
    Pattern,
    block_index,
    density,
    head_indices,
    head_masks,
    token_mask,
)
from engine.reference.state import KVCache

RNG = np.random.default_rng(7)


def causal_blocks(n_qb: int, n_kb: int) -> np.ndarray:
    return np.arange(n_kb)[None, :] <= np.arange(n_kb - n_qb, n_kb)[:, None]


def filled_cache(keys: np.ndarray, values: np.ndarray) -> KVCache:
    cache = KVCache(keys.shape[1], keys.shape[2])
    cache.append(keys, values)
    return cache


def test_dense_and_a_shape_block_indices():
    q, k = RNG.normal(size=(20, 8)).astype(np.float32), RNG.normal(size=(20, 8)).astype(np.float32)
    assert np.array_equal(block_index(DENSE, q, k, 0, 4), causal_blocks(5, 5))
    got = block_index(Pattern("a_shape", sink=1, window=2), q, k, 0, 4)
    expected = np.array([
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 0, 1, 1, 0],
        [1, 0, 0, 1, 1],
    ], bool)
    assert np.array_equal(got, expected)
    # a chunk continuing a cache: queries are rows 8..19 (blocks 2..4), the index has their rows only
    assert np.array_equal(block_index(Pattern("a_shape", sink=1, window=2), q[8:], k, 8, 4), expected[2:])
    assert density(expected) == pytest.approx(12 / 15)


def test_block_topk_picks_the_largest_pooled_scores_plus_the_diagonal():
    block, width = 2, 4
    keys = np.zeros((12, width), np.float32)
    # pooled key of block j points along axis 0 with strength strength[j]
    strength = [1.0, 5.0, 3.0, 3.0, 0.5, 2.0]
    for j, s in enumerate(strength):
        keys[2 * j:2 * j + 2, 0] = s
    q = np.zeros((12, width), np.float32)
    q[:, 0] = 1.0
    got = block_index(Pattern("block_topk", topk=2), q, keys, 0, block)
    expected = np.zeros((6, 6), bool)
    expected[np.arange(6), np.arange(6)] = True  # diagonal always
    expected[1, 0] = True                        # only one earlier block
    expected[2, [0, 1]] = True
    expected[3, [1, 2]] = True                   # 5 then 3
    expected[4, [1, 2]] = True                   # ties 3 = 3: the lower index
    expected[5, [1, 2]] = True
    assert np.array_equal(got, expected)


def test_vertical_slash_finds_a_heavy_column_block_and_a_heavy_diagonal():
    block, width, n = 4, 32, 32
    qb, kb = np.arange(8)[:, None], np.arange(8)[None, :]
    causal = kb <= qb

    q = np.zeros((n, width), np.float32)
    keys = np.zeros((n, width), np.float32)
    q[:, 0] = 4.0
    keys[9, 0] = 8.0  # a heavy key in block 2: every late query attends there (a vertical line)
    got = block_index(Pattern("vertical_slash", vertical=1, slash=0), q, keys, 0, block)
    assert np.array_equal(got, causal & ((kb == 2) | (qb == kb)))

    q = np.zeros((n, width), np.float32)
    keys = np.zeros((n, width), np.float32)
    for t in range(8, n):  # a heavy diagonal 8 tokens (2 blocks) back: query t matches key t-8 only
        q[t, t % 24] = 6.0
        keys[t - 8, t % 24] = 6.0
    got = block_index(Pattern("vertical_slash", vertical=0, slash=1), q, keys, 0, block)
    assert np.array_equal(got, causal & ((qb - kb == 2) | (qb == kb)))


def test_full_budget_patterns_equal_the_causal_index():
    q, k = RNG.normal(size=(40, 8)).astype(np.float32), RNG.normal(size=(40, 8)).astype(np.float32)
    for pattern in (Pattern("a_shape", sink=0, window=10), Pattern("block_topk", topk=10),
                    Pattern("vertical_slash", vertical=10, slash=0), Pattern("vertical_slash", vertical=0, slash=10)):
        assert np.array_equal(block_index(pattern, q, k, 0, 4), causal_blocks(10, 10)), pattern.label


def test_token_mask_expands_blocks_to_rows():
    index = np.array([[1, 0, 0], [0, 1, 0]], bool)  # query blocks 1, 2 of a chunk starting at row 3
    mask = token_mask(index, n_past=3, t_new=4, s_len=7, block=3)
    # rows 3..5 are block 1 → key rows 0..2; row 6 is block 2 → key rows 3..5
    expected = np.zeros((4, 7), bool)
    expected[:3, :3] = True
    expected[3, 3:6] = True
    assert np.array_equal(mask, expected)


def attention_over(q: np.ndarray, keys: np.ndarray, values: np.ndarray, n_past: int, allowed: np.ndarray) -> np.ndarray:
    """float64 softmax over the allowed and causal keys only, per head (GQA h // G)."""
    t, h, dh = q.shape
    group = h // keys.shape[1]
    out = np.zeros((t, h, dh))
    for head in range(h):
        for i in range(t):
            sel = allowed[head, i] & (np.arange(keys.shape[0]) <= n_past + i)
            s = keys[sel, head // group].astype(np.float64) @ q[i, head].astype(np.float64) / np.sqrt(dh)
            p = np.exp(s - s.max())
            out[i, head] = (p / p.sum()) @ values[sel, head // group]
    return out


@pytest.mark.parametrize("n_past", [0, 13])
def test_masked_blocks_contribute_nothing_and_selected_ones_are_exact(n_past):
    t, s, h, hkv, dh, block = 24, 24 + n_past, 4, 2, 16, 4
    keys = RNG.normal(size=(s, hkv, dh)).astype(np.float32)
    values = RNG.normal(size=(s, hkv, dh)).astype(np.float32)
    q = RNG.normal(size=(t, h, dh)).astype(np.float32)
    patterns = [Pattern("a_shape", sink=1, window=2), DENSE, Pattern("block_topk", topk=1),
                Pattern("vertical_slash", vertical=1, slash=1)]
    allowed = head_masks(head_indices(patterns, q, keys, n_past, block), n_past, t, s, block)
    o = attend_stored(q, filled_cache(keys, values), n_past, dh, allowed)
    np.testing.assert_allclose(o, attention_over(q, keys, values, n_past, allowed), rtol=0, atol=2e-5)

    # key rows the last query of A-shape head 0 skips (heads 0, 1 read KV head 0): changing them leaves
    # that query's output bit-equal, while the dense head 1 sees the change
    hidden = ~allowed[0, -1]
    assert hidden.any()
    k2, v2 = keys.copy(), values.copy()
    k2[hidden, 0] += 10.0
    v2[hidden, 0] -= 10.0
    o2 = attend_stored(q, filled_cache(k2, v2), n_past, dh, allowed)
    assert np.array_equal(o2[-1, 0], o[-1, 0])
    assert not np.array_equal(o2[-1, 1], o[-1, 1])


@pytest.mark.parametrize("n_past", [0, 9])
def test_full_budget_is_bit_identical_to_dense(n_past):
    t, s, h, hkv, dh, block = 30, 30 + n_past, 4, 2, 16, 8
    keys = RNG.normal(size=(s, hkv, dh)).astype(np.float32)
    values = RNG.normal(size=(s, hkv, dh)).astype(np.float32)
    q = RNG.normal(size=(t, h, dh)).astype(np.float32)
    n_kb = (s - 1) // block + 1
    patterns = [Pattern("a_shape", sink=1, window=n_kb), Pattern("block_topk", topk=n_kb),
                Pattern("vertical_slash", vertical=n_kb, slash=n_kb), DENSE]
    cache = filled_cache(keys, values)
    allowed = head_masks(head_indices(patterns, q, keys, n_past, block), n_past, t, s, block)
    assert np.array_equal(attend_stored(q, cache, n_past, dh, allowed), attend_stored(q, cache, n_past, dh))


def test_pattern_json_round_trip_and_validation():
    for p in (DENSE, Pattern("a_shape", sink=1, window=4), Pattern("vertical_slash", vertical=2, slash=3),
              Pattern("block_topk", topk=5)):
        assert Pattern.from_json(p.to_json()) == p
    with pytest.raises(ValueError):
        Pattern("diagonal")
    with pytest.raises(ValueError):
        Pattern("a_shape", sink=1, window=0)
