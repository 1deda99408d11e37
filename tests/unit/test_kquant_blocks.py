"""K-quant bytes written by rigllm read back by gguf-py's dequantize, and the device layouts equal to it bit for bit.

gguf-py's `dequantize` is what the reference backend multiplies, so it is the oracle: the Q6_K repack of
engine/cuda/kq_layout.py (the Q4_K/Q5_K layouts are the file's bytes) must give the same fp32 values,
bit for bit, on blocks whose every byte is random (every scale-packing case occurs). The quantizer
must give the nearest grid value within its own scales; the random-block writer must stay in range.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf.quants import Q4_K, dequantize

from engine.cuda.kq_layout import device_bytes, device_layout, dequantize_device
from engine.gguf.kquant_blocks import BLOCK_BYTES, pack_scale_min, quantize_kquant, random_kquant_rows
from tests.kquant_data import KQ_TYPES, Q, random_kquant_bytes

SHAPES = [(1, 256), (7, 512), (33, 1280)]


@pytest.mark.parametrize("rows,k", SHAPES)
@pytest.mark.parametrize("qtype", KQ_TYPES, ids=lambda q: q.name)
def test_device_layout_dequantizes_bit_for_bit_like_gguf(qtype, rows, k):
    raw = random_kquant_bytes(np.random.default_rng(rows * k), qtype, rows, k)
    buf = device_layout(raw, qtype, rows, k)
    assert buf.nbytes == raw.nbytes == device_bytes(qtype, rows, k)
    want = dequantize(raw, qtype).reshape(rows, k)
    got = dequantize_device(buf, qtype, rows, k)
    bad = got.view(np.uint32) != want.view(np.uint32)
    assert not bad.any(), f"{qtype.name}: {int(bad.sum())} values differ, first at {np.argwhere(bad)[0]}"


def test_scale_packing_is_what_gguf_unpacks():
    rng = np.random.default_rng(0)
    sc, m = rng.integers(0, 64, (50, 8)), rng.integers(0, 64, (50, 8))
    got_sc, got_m = Q4_K.get_scale_min(pack_scale_min(sc, m))
    assert np.array_equal(got_sc, sc) and np.array_equal(got_m, m)


def _steps(raw: np.ndarray, qtype) -> np.ndarray:
    """Per value, the grid step d·sc of its sub-block (as the format defines it), from the bytes."""
    blocks = raw.reshape(-1, BLOCK_BYTES[qtype])
    if qtype == Q.Q6_K:
        d = blocks[:, 208:210].copy().view(np.float16).astype(np.float64)
        sc = blocks[:, 192:208].view(np.int8).astype(np.float64)
        return np.repeat(np.abs(d * sc), 16, axis=1).reshape(-1)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float64)
    sc, _ = Q4_K.get_scale_min(blocks[:, 4:16].copy())
    return np.repeat(d * sc, 32, axis=1).reshape(-1)


@pytest.mark.parametrize("qtype", KQ_TYPES, ids=lambda q: q.name)
def test_quantizer_rounds_to_the_nearest_grid_value(qtype):
    """Values inside the block's range come back within half a step (plus the 6/8-bit rounding of the
    scales, which moves the grid ends by at most half a scale unit per level)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((9, 768)).astype(np.float32) * rng.uniform(0.01, 10, (9, 1)).astype(np.float32)
    raw = quantize_kquant(x, qtype)
    y = dequantize(raw, qtype).reshape(x.shape).astype(np.float64)
    steps = _steps(raw, qtype).reshape(x.shape)
    blocks = raw.reshape(-1, BLOCK_BYTES[qtype])
    d_pos = 208 if qtype == Q.Q6_K else 0
    d = np.repeat(blocks[:, d_pos:d_pos + 2].copy().view(np.float16).astype(np.float64), 256, axis=1).reshape(x.shape)
    levels = {Q.Q4_K: 15, Q.Q5_K: 31, Q.Q6_K: 32}[qtype]
    slack = 0.5 * d * levels + (0 if qtype == Q.Q6_K else 0.5 * d * levels)  # scale and min rounding
    bound = 0.5 * steps + slack + 1e-6 * np.abs(x)
    err = np.abs(y - x)
    assert (err <= bound).all(), f"{qtype.name}: worst error {err.max():.3g} vs bound {bound.flat[err.argmax()]:.3g}"
    rms = np.sqrt(np.mean((y - x) ** 2)) / np.sqrt(np.mean(x.astype(np.float64) ** 2))
    assert rms < {Q.Q4_K: 0.12, Q.Q5_K: 0.06, Q.Q6_K: 0.03}[qtype], f"{qtype.name}: relative rms error {rms:.3f}"


@pytest.mark.parametrize("qtype", KQ_TYPES, ids=lambda q: q.name)
def test_random_rows_stay_in_range_and_centred(qtype):
    values = dequantize(random_kquant_rows(64, 1024, 0.05, qtype, np.random.default_rng(2)), qtype)
    assert np.abs(values).max() <= 0.05 * 1.01
    assert abs(values.mean()) < 0.05 * 0.02 and values.std() > 0.05 * 0.2


def test_rows_that_are_not_whole_super_blocks_are_refused():
    with pytest.raises(ValueError, match="multiple of 256"):
        quantize_kquant(np.zeros((2, 320), np.float32), Q.Q4_K)
    with pytest.raises(ValueError, match="multiple of 256"):
        device_layout(np.zeros((2, 180), np.uint8), Q.Q4_K, 2, 320)


def test_q6_k_repack_in_row_chunks_equals_one_pass(monkeypatch):
    """Large matrices are repacked a chunk of blocks at a time; chunk edges must not move a byte."""
    import engine.cuda.kq_layout as layout

    raw = random_kquant_bytes(np.random.default_rng(4), Q.Q6_K, 7, 768)
    whole = layout.device_layout(raw, Q.Q6_K, 7, 768)
    monkeypatch.setattr(layout, "ROW_CHUNK_BLOCKS", 5)  # 21 blocks: chunks of 5, 5, 5, 5, 1
    assert np.array_equal(layout.device_layout(raw, Q.Q6_K, 7, 768), whole)
