"""quantize_q8_1 on the GPU is bit-identical to the numpy oracle (itself tied to the reference's rounding)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cuda.gemv import alloc_q8_activations, quantize_q8_1
from engine.cuda.q8_layout import quantize_q8_1 as quantize_numpy
from tests.gpu.gpu_fixtures import assert_equal, random_activations


@pytest.mark.parametrize("tokens,k", [(1, 32), (1, 4096), (3, 96), (8, 12288), (257, 4096)])
def test_quantize_is_bit_exact(card, rng, tokens, k):
    x = random_activations(rng, tokens, k)
    x[0, :32] = (np.arange(32) - 15.5).astype(np.float32)  # x / d near .5 ties
    x[-1, -32:] = 1e-9 * (np.arange(32) - 16)  # fp16(d) underflows to 0 while q does not
    act = alloc_q8_activations(card, k, tokens, "test.q")
    quantize_q8_1(card, card.upload(x, "test.x"), act, tokens)
    xq, xd = quantize_numpy(x)
    assert_equal(act.xq.download(np.int8, (tokens, k)), xq, f"xq T={tokens} K={k}")
    assert_equal(act.xd.download(np.float32, (tokens, k // 32)), xd, f"xd T={tokens} K={k}")


def test_quantize_a_column_range_of_wider_rows(card, rng):
    """ld_x > K: quantize columns [64, 64 + 96) of [5, 300] rows, as for one part of a fused projection."""
    wide = random_activations(rng, 5, 320)[:, :300].copy()
    x = card.upload(wide, "test.wide")
    act = alloc_q8_activations(card, 96, 5, "test.q")
    quantize_q8_1(card, x.view(4 * 64, x.nbytes - 4 * 64), act, 5, ld_x=300)
    xq, xd = quantize_numpy(wide[:, 64:160])
    assert_equal(act.xq.download(np.int8, (5, 96)), xq, "xq of a column range")
    assert_equal(act.xd.download(np.float32, (5, 3)), xd, "xd of a column range")
