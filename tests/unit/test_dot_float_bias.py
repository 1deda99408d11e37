"""The DP4A matmuls read an integer sum as a float without a conversion instruction (common.cuh
DOT_FLOAT_BIAS): the chain starts from the bits of 1.5 * 2^23, and the bits it ends with, read as a float, minus
12582912 must be exactly the sum. Checked here for every sum a caller can produce and then some: all of
(-2^22, 2^22), which holds 32 products of int8 values (at most 32 * 128 * 128 = 524,288 in magnitude) eight
times over; and the bias must stop working just outside, so a changed constant or range is noticed."""

from __future__ import annotations

import re

import numpy as np

from engine.cuda.kernel_build import CUDA_SRC_DIR

SOURCE = (CUDA_SRC_DIR / "common.cuh").read_text()


def _bias() -> tuple[int, float]:
    bias = int(re.search(r"constexpr int DOT_FLOAT_BIAS = (0x[0-9A-Fa-f]+);", SOURCE).group(1), 16)
    offset = float(re.search(r"__int_as_float\(biased\) - ([0-9.]+)f;", SOURCE).group(1))
    return bias, offset


def _read_back(sums: np.ndarray) -> np.ndarray:
    """What biased_dot_to_float returns for these sums, in fp32 as on the card (int32 wrap-around as DP4A's)."""
    bias, offset = _bias()
    bits = (sums.astype(np.int64) + bias).astype(np.uint32)
    return bits.view(np.float32) - np.float32(offset)


def test_every_sum_below_2_to_the_22_reads_back_exactly():
    sums = np.arange(-(1 << 22) + 1, 1 << 22, dtype=np.int32)
    got = _read_back(sums)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, sums.astype(np.float32))


def test_the_largest_matmul_sum_is_well_inside_the_range():
    most = 32 * 128 * 128  # a 32-value block of int8 weights and activations, every product at its extreme
    assert 8 * most <= 1 << 22
    extremes = np.array([-most, most], np.int32)
    np.testing.assert_array_equal(_read_back(extremes), extremes.astype(np.float32))


def test_sums_past_the_range_no_longer_read_back():
    outside = np.array([-(1 << 22) - 1, (1 << 22) + 1], np.int32)
    assert not np.array_equal(_read_back(outside), outside.astype(np.float32))
