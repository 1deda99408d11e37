"""The numpy device layouts agree with gguf's Q8_0 and with the reference's Q8_1 rounding, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from engine.cuda.q8_layout import dequantize_q8_0, dequantize_q8_1, quantize_q8_1, split_q8_0
from engine.reference.activation_rounding import round_q8_1


def test_split_q8_0_matches_gguf_dequantization():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((7, 96)).astype(np.float32)
    raw = quantize(w, GGMLQuantizationType.Q8_0)
    qs, d = split_q8_0(raw, 7, 96)
    assert qs.dtype == np.int8 and qs.shape == (7, 96) and d.dtype == np.float16 and d.shape == (7, 3)
    np.testing.assert_array_equal(dequantize_q8_0(qs, d), dequantize(raw, GGMLQuantizationType.Q8_0))


def activation_cases() -> np.ndarray:
    """Rows that hit every branch: zero blocks, exact .5 ties, fp16-subnormal scales, wide magnitudes."""
    rng = np.random.default_rng(1)
    rows = [rng.standard_normal(128) * 10.0 ** rng.integers(-3, 4, size=128)]
    tie = np.zeros(128)
    tie[:32] = np.arange(32) - 15.5  # amax 16.5 → d 16.5/127: many x/d land near .5
    tie[32:64] = 127.0 * np.linspace(-1, 1, 32) / 2  # x/d = k + 0.5 multiples
    tie[64:96] = 0.0  # all-zero block
    tie[96:128] = 1e-9 * (np.arange(32) - 16)  # fp16(d) underflows to 0
    rows.append(tie)
    return np.asarray(rows, dtype=np.float32)


def test_quantize_q8_1_times_scale_is_exactly_the_reference_rounding():
    x = activation_cases()
    xq, xd = quantize_q8_1(x)
    assert xq.dtype == np.int8 and xq.shape == x.shape and xd.dtype == np.float32 and xd.shape == (2, 4)
    assert np.all(np.abs(xq.astype(np.int32)) <= 127)
    np.testing.assert_array_equal(dequantize_q8_1(xq, xd), round_q8_1(x))
    assert np.all(xq[1, 64:96] == 0) and xd[1, 2] == 0.0
    assert np.any(xq[1, 96:] != 0) and xd[1, 3] == 0.0  # q from the fp32 scale, product from fp16(d) = 0


def test_widths_must_be_whole_blocks():
    with pytest.raises(ValueError):
        quantize_q8_1(np.zeros((2, 40), np.float32))
    with pytest.raises(ValueError):
        split_q8_0(np.zeros((1, 34), np.uint8), 1, 40)
