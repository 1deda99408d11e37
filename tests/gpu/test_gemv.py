"""The DP4A GEMV (gemv_q8_t1..t8 and their variants) against numpy on the same quantized activations.

Weights and activations are exactly representable Q8 data, so numpy in float64 gives the exact answer
and the kernel may differ only by fp32 summation order: the bound is 1e-5 of sum_k |W x| per output
(`gemv_error_bound`). Shapes are odd on purpose: rows that are not multiples of the rows per block,
K = 32 (a single block), 96 and 1,056 (a short last chunk of the blocked payload), 4096 and 12288.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.cuda.gemv import (
    DEFAULT_GEMV,
    GEMV_ROWS_PER_WARP,
    GEMV_VARIANTS,
    gemv_q8,
    upload_q8_weight,
)
from engine.cuda.q8_layout import block_q8_payload
from tests.gpu.gpu_fixtures import (
    assert_within,
    check_residual_epilogue,
    check_stacked_segments,
    gemv_error_bound,
    random_activations,
    random_q8_weight,
    upload_activations,
)

SHAPES = [(1, 32), (13, 96), (37, 1056), (37, 4096), (77, 12288), (1000, 4096)]


@pytest.mark.parametrize("rows,k", [(1, 32), (13, 96), (5, 1024), (37, 1056), (300, 12288)])
def test_upload_leaves_the_blocked_payload(card, rng, rows, k):
    """The card's in-place permutation gives q8_layout.block_q8_payload's bytes (a short last chunk at K = 32,
    96 and 1,056); then again with a one-block grid, which strides over every (row, chunk) pair."""
    qs, d, _ = random_q8_weight(rng, rows, k)
    weight = upload_q8_weight(card, [(qs, d)], "test.w")
    np.testing.assert_array_equal(weight.qs.download(np.int8, (rows, k)), block_q8_payload(qs))
    np.testing.assert_array_equal(weight.d.download(np.float16, (rows, k // 32)), d)
    buf = card.upload(qs, "test.qs")
    card.kernel("q8_block_payload").launch(1, 256, buf, np.int32(rows), np.int32(k))
    np.testing.assert_array_equal(buf.download(np.int8, (rows, k)), block_q8_payload(qs))



@pytest.mark.parametrize("tokens", sorted(GEMV_ROWS_PER_WARP))
@pytest.mark.parametrize("rows,k", SHAPES)
def test_gemv_matches_numpy(card, rng, rows, k, tokens):
    qs, d, w = random_q8_weight(rng, rows, k)
    weight = upload_q8_weight(card, [(qs, d)], "test.w")
    act, x = upload_activations(card, random_activations(rng, tokens, k))
    y = card.alloc(4 * rows * tokens, "test.y")
    gemv_q8(card, weight, act, y, tokens)
    got = y.download(np.float32, (tokens, rows))
    assert_within(got, x.astype(np.float64) @ w.T, gemv_error_bound(w, x), f"gemv T={tokens} [{rows}x{k}]")


@pytest.mark.parametrize("tokens", [1, 3, 8])
def test_many_blocks_and_a_single_block_grid(card, rng, tokens):
    """20001 rows: thousands of blocks; then the same with one block striding over every row group."""
    rows, k = 20001, 256
    qs, d, w = random_q8_weight(rng, rows, k)
    weight = upload_q8_weight(card, [(qs, d)], "test.w")
    act, x = upload_activations(card, random_activations(rng, tokens, k))
    expected = x.astype(np.float64) @ w.T
    bound = gemv_error_bound(w, x)
    for max_blocks in (None, 1):
        y = card.alloc(4 * rows * tokens, "test.y")
        gemv_q8(card, weight, act, y, tokens, max_blocks=max_blocks)
        assert_within(y.download(np.float32, (tokens, rows)), expected, bound, f"gemv T={tokens} max_blocks={max_blocks}")


@pytest.mark.parametrize("tokens", [1, 2, 5, 8])
def test_stacked_matrices_write_separate_segments(card, rng, tokens):
    """Four matrices with one input (as GDN qkv, z, b, a): segment i is its own [T][rows_i] matrix."""
    check_stacked_segments(card, rng, gemv_q8, tokens, k=128, row_counts=(10, 21, 3, 2))


@pytest.mark.parametrize("tokens", [1, 4, 8])
def test_residual_epilogue_separate_and_in_place(card, rng, tokens):
    check_residual_epilogue(card, rng, gemv_q8, tokens, rows=45, k=4096)


@pytest.mark.parametrize("tokens, variant", [(t, v) for t, vs in GEMV_VARIANTS.items() for v in sorted(vs)])
def test_every_variant_matches_the_default_kernel(card, rng, tokens, variant):
    """Each T-token variant against numpy and against DEFAULT_GEMV[T]: odd shapes, a 3-block grid striding over
    20001 rows, and four stacked matrices with a residual (the epilogue's segment split depends on rows per warp)."""
    default = DEFAULT_GEMV[tokens]
    cases = [(rows, k, None) for rows, k in SHAPES] + [(20001, 256, 3)]
    for rows, k, max_blocks in cases:
        qs, d, w = random_q8_weight(rng, rows, k)
        weight = upload_q8_weight(card, [(qs, d)], "test.w")
        act, x = upload_activations(card, random_activations(rng, tokens, k))
        bound = gemv_error_bound(w, x)
        y_default, y = card.alloc(4 * tokens * rows, "test.y_default"), card.alloc(4 * tokens * rows, "test.y")
        gemv_q8(card, weight, act, y_default, tokens, variant=default)
        gemv_q8(card, weight, act, y, tokens, max_blocks=max_blocks, variant=variant)
        got = y.download(np.float32, (tokens, rows))
        what = f"{variant} [{rows}x{k}] max_blocks={max_blocks}"
        assert_within(got, x.astype(np.float64) @ w.T, bound, what + " vs numpy")
        assert_within(got, y_default.download(np.float32, (tokens, rows)), 2 * bound, what + f" vs {default}")

    k = 128
    parts = [random_q8_weight(rng, rows, k) for rows in (10, 21, 3, 2)]
    weight = upload_q8_weight(card, [(qs, d) for qs, d, _ in parts], "test.stacked")
    act, x = upload_activations(card, random_activations(rng, tokens, k))
    residual = rng.standard_normal(tokens * weight.rows).astype(np.float32)
    y = card.upload(residual, "test.y")
    gemv_q8(card, weight, act, y, tokens, residual=y, variant=variant)
    offset = 0
    for i, (_, _, w) in enumerate(parts):
        rows = w.shape[0]
        before = residual[tokens * offset : tokens * (offset + rows)].reshape(tokens, rows)
        expected = before.astype(np.float64) + x.astype(np.float64) @ w.T
        bound = gemv_error_bound(w, x) + 1e-6 * np.abs(before)
        got = weight.segment_view(y, i, tokens).download(np.float32, (tokens, rows))
        assert_within(got, expected, bound, f"{variant} stacked segment {i}, r += Wx in place")
        offset += rows


def test_variants_are_for_their_own_token_count(card, rng):
    qs, d, _ = random_q8_weight(rng, 8, 32)
    weight = upload_q8_weight(card, [(qs, d)], "test.w")
    act, _ = upload_activations(card, random_activations(rng, 9, 32))
    y = card.alloc(4 * 8 * 9, "test.y")
    with pytest.raises(ValueError, match="takes 1..8 tokens"):
        gemv_q8(card, weight, act, y, 9, variant="gemv_q8_t1_r1_u8")
    with pytest.raises(ValueError, match="unknown T=3 GEMV variant"):
        gemv_q8(card, weight, act, y, 3, variant="gemv_q8_t2")
    with pytest.raises(ValueError, match="unknown T=2 GEMV variant"):
        gemv_q8(card, weight, act, y, 2, variant="gemv_q8_t1_r1_u8")
    with pytest.raises(ValueError, match="unknown T=1 GEMV variant"):
        gemv_q8(card, weight, act, y, 1, variant="gemv_q8_t2")
