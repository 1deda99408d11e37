"""The DP4A prefill GEMM (gemm_q8_0_q8_1) against numpy on the same quantized activations.

Weights and activations are exact Q8 data, so numpy in float64 gives the exact answer and the kernel
may differ only by fp32 summation order: the bound is 1e-5 of sum_k |W x| per output
(`gemv_error_bound`). Token counts cover a single token and 7 (the 16-token tile), 30 (the 32-token
tile), partial 64-token tiles (100, 300) and whole ones (64, 256); row counts cover less than one tile
(32, 48), a partial last tile (4096 + 32) and the 9B FFN width (12288); K covers a single block (32, a
partial 128-value stage), a short last chunk of the blocked weight payload (1,056 = 33 blocks) and the 9B
widths (4096, 12288).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from engine.cuda.gemm import GEMM_STAGINGS, GEMM_TILE_TOKENS, GEMM_TOKEN_TILES, gemm_q8
from engine.cuda.gemv import upload_q8_weight
from tests.gpu.gpu_fixtures import (
    assert_within,
    check_residual_epilogue,
    check_same_bits,
    check_stacked_segments,
    gemv_error_bound,
    random_activations,
    random_q8_weight,
    upload_activations,
)

TOKENS = [1, 7, 30, 64, 100, 256, 300]
SHAPES = [(32, 32), (48, 4096), (48, 1056), (4128, 32), (4128, 12288), (12288, 4096)]


@functools.lru_cache(maxsize=2)
def cached_weight(rows: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random Q8_0 weights per shape, generated once per session (the large ones take seconds)."""
    return random_q8_weight(np.random.default_rng(rows * 100003 + k), rows, k)



@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("rows,k", SHAPES)  # innermost, so it varies slowest and each weight is made once
def test_gemm_matches_numpy(card, rng, rows, k, tokens):
    qs, d, w = cached_weight(rows, k)
    weight = upload_q8_weight(card, [(qs, d)], "test.w")
    act, x = upload_activations(card, random_activations(rng, tokens, k))
    y = card.alloc(4 * rows * tokens, "test.y")
    y.upload(np.full(rows * tokens, np.nan, np.float32))  # an unwritten output shows as NaN
    gemm_q8(card, weight, act, y, tokens)
    got = y.download(np.float32, (tokens, rows))
    assert_within(got, x.astype(np.float64) @ w.T, gemv_error_bound(w, x), f"gemm T={tokens} [{rows}x{k}]")


@pytest.mark.parametrize("tile", GEMM_TOKEN_TILES)
@pytest.mark.parametrize("tokens", [5, 70, 129])
def test_stacked_matrices_write_separate_segments(card, rng, tokens, tile):
    """Four matrices with one input (as GDN qkv, z, b, a), segment boundaries inside 64-row tiles, in every token
    tile."""
    check_stacked_segments(card, rng, functools.partial(gemm_q8, tile_tokens=tile), tokens, k=256,
                           row_counts=(100, 37, 16, 16))


@pytest.mark.parametrize("tokens", [3, 64, 200])
def test_residual_epilogue_separate_and_in_place(card, rng, tokens):
    check_residual_epilogue(card, rng, gemm_q8, tokens, rows=200, k=4096)


def test_fewer_tokens_than_the_buffer_holds(card, rng):
    """n_tokens below the activation buffer's capacity: rows past n_tokens are neither read nor written."""
    rows, k, capacity, tokens = 96, 512, 256, 77
    qs, d, w = random_q8_weight(rng, rows, k)
    weight = upload_q8_weight(card, [(qs, d)], "test.w")
    x_all = random_activations(rng, capacity, k)
    act, x = upload_activations(card, x_all)
    sentinel = np.full(rows * capacity, 12345.0, np.float32)
    y = card.upload(sentinel, "test.y")
    gemm_q8(card, weight, act, y, tokens)
    got = y.download(np.float32, rows * capacity)
    expected = x[:tokens].astype(np.float64) @ w.T
    assert_within(got[: rows * tokens].reshape(tokens, rows), expected, gemv_error_bound(w, x[:tokens]), "first tokens")
    np.testing.assert_array_equal(got[rows * tokens :], sentinel[rows * tokens :])


@pytest.mark.parametrize("rows,k,tokens", [(4128, 4096, 300), (48, 12288, 7), (200, 32, 64), (100, 4096 + 96, 129)])
def test_both_stagings_give_the_same_bits(card, rng, rows, k, tokens):
    """The two stagings share the tile and each output's order of blocks (gemm_q8.cu), so the same bits, with a
    residual too; K = 4192 ends in a partial 128-value stage."""
    weight, act = random_case(card, rng, rows, k, tokens)
    check_same_bits(card, rng, gemm_q8, weight, act, tokens,
                    {f"staging {s!r}": {"staging": s, "tile_tokens": GEMM_TILE_TOKENS} for s in GEMM_STAGINGS})


@pytest.mark.parametrize("rows,k,tokens", [(4128, 4096, 54), (48, 12288, 9), (200, 32, 16), (100, 4096 + 96, 33),
                                          (12288, 4096, 129)])
def test_every_token_tile_gives_the_64_token_tiles_bits(card, rng, rows, k, tokens):
    """The 16- and 32-token tiles (gemm_q8.cu's TJ) sum each output's blocks in the 64-token tile's order with its
    fold, so the same bits, with a residual; token counts end inside a tile of each width."""
    weight, act = random_case(card, rng, rows, k, tokens)
    check_same_bits(card, rng, gemm_q8, weight, act, tokens,
                    {f"{t}-token tile": {"tile_tokens": t} for t in sorted(GEMM_TOKEN_TILES, reverse=True)})


def random_case(card, rng, rows: int, k: int, tokens: int):
    """A random Q8_0 weight [rows][k] and `tokens` rows of activations, on the card."""
    qs, d, _ = random_q8_weight(rng, rows, k)
    act, _ = upload_activations(card, random_activations(rng, tokens, k))
    return upload_q8_weight(card, [(qs, d)], "test.w"), act
