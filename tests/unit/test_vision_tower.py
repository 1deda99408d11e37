"""The numpy vision tower against transformers' `Qwen3_5VisionModel` on the tiny random configuration.

Tolerance: max |ours − transformers| ≤ 1e-5 · max |transformers| per image (both fp32; measured
≈ 1e-6 relative). Image shapes cover a wide grid, a tall one and two squares upscaled into the
minimum pixel budget; all of them resample the 4×4 learned position grid (the last one below its size
on one axis), so merge order, position interpolation and the 2D rotary are each exercised.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_vision_fixtures import hf_pixel_values, hf_vlm, random_image, tiny_vlm  # noqa: F401 (fixtures)

from engine.vision.mmproj import load_mmproj
from engine.vision.preprocess import prepare_image
from engine.vision.tower import VisionTower, interpolated_positions, merge_order_coords

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def tower(tiny_vlm):
    return VisionTower.from_mmproj(load_mmproj(tiny_vlm.mmproj))


@pytest.mark.parametrize("height, width, seed", [(70, 130, 0), (200, 90, 1), (20, 20, 2), (64, 64, 3), (40, 300, 4)])
def test_tower_equals_transformers(tower, hf_vlm, height, width, seed):
    import torch

    prepared = prepare_image(random_image(height, width, seed), tower.cfg)
    gh, gw = prepared.grid
    with torch.no_grad():
        want = hf_vlm.model.visual(
            torch.from_numpy(hf_pixel_values(prepared.patches())), grid_thw=torch.tensor([[1, gh, gw]])
        ).pooler_output.numpy()
    got = tower.encode(prepared)
    assert got.shape == (prepared.n_tokens, tower.cfg.projection_dim) == want.shape
    assert np.max(np.abs(got - want)) <= TOLERANCE * np.max(np.abs(want))


def test_merge_order_lists_2x2_blocks_row_major():
    rows, cols = merge_order_coords(4, 6, 2)
    assert list(zip(rows[:8], cols[:8])) == [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (1, 2), (1, 3)]
    assert (rows[12], cols[12]) == (2, 0)


def test_position_grid_at_its_own_size_is_used_as_is():
    side = 4
    table = np.random.default_rng(0).standard_normal((side * side, 8)).astype(np.float32)
    rows, cols = merge_order_coords(side, side, 2)
    got = interpolated_positions(table, side, rows, cols, side, side)
    np.testing.assert_array_equal(got, table[rows * side + cols])
