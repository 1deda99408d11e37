"""The decode RMSNorm's launch shapes (engine/cuda/norm.py, engine/cuda/bench/norm_shapes.py) on a stand-in card."""

from __future__ import annotations

import pytest

from engine.cuda.bench.norm_shapes import LAUNCHES, ROWS, SHAPES, norm_shapes, render_norm_shapes, shape_name
from engine.cuda.gemv import MAX_GEMV_TOKENS
from engine.cuda.norm import NORM_SLICES_DECODE, NORM_THREADS_BATCH, NORM_THREADS_DECODE, norm_shape, rmsnorm_q8_1
from tests.unit.test_sparse_bench import TimedFakeCard


def test_gemv_sized_batches_split_rows_and_longer_ones_take_a_block_per_row():
    assert norm_shape(3) == ((3, NORM_SLICES_DECODE), NORM_THREADS_DECODE)
    assert norm_shape(MAX_GEMV_TOKENS) == ((MAX_GEMV_TOKENS, NORM_SLICES_DECODE), NORM_THREADS_DECODE)
    assert norm_shape(MAX_GEMV_TOKENS + 1) == ((MAX_GEMV_TOKENS + 1, 1), NORM_THREADS_BATCH)


def test_a_grid_must_have_a_row_of_blocks_per_row():
    with pytest.raises(ValueError, match="a row of blocks per row"):
        rmsnorm_q8_1(TimedFakeCard(), None, 8, None, 2, 8, 1e-6, None, None, 8, (1, 8), 256)


def test_every_shape_is_timed_for_every_row_count_and_the_one_in_use_is_among_them():
    card = TimedFakeCard()
    r = norm_shapes(card, d_model=256, eps=1e-6, reps=2)
    in_use = shape_name(NORM_THREADS_DECODE, NORM_SLICES_DECODE)
    assert r["in_use"] == in_use and set(r["us_per_launch"]) == {str(n) for n in ROWS}
    for us in r["us_per_launch"].values():
        assert set(us) == {shape_name(*s) for s in SHAPES} and in_use in us
        assert us[in_use] == pytest.approx(1e3 * (1.0 / 2) / LAUNCHES)  # the stand-in's 1 ms a graph of 2 reps
    launched = [(grid, block) for name, grid, block, _ in card.launches if name == "rmsnorm_q8_1"]
    assert {((rows, slices), threads) for rows in ROWS for threads, slices in SHAPES} == set(launched)
    assert "RMSNorm of 8 row(s) x 256" in render_norm_shapes(r)
