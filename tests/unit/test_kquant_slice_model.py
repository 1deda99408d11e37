"""A word-for-word numpy model of cuda_src/kquant.cuh's slice loads and decodes, checked against gguf-py.

The GPU tests run on the lead's machine only; this model lets the addressing (which 16-byte words a slice
reads, from which of Q6_K's four arrays), the bit extraction (nibbles, Q5_K's fifth bit at 2c / 2c + 1,
Q6_K's 2-bit highs and the bytewise -32, get_scale_min_k4) and the slice's activation positions be checked
here: summing every slice's contribution the way gemv_kq.cu does must give W·x for gguf's W. Each function
mirrors the CUDA function of the same name; keep them in step when the kernels change.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf.quants import dequantize

from engine.cuda.kq_layout import device_layout
from engine.cuda.q8_layout import dequantize_q8_1, quantize_q8_1
from tests.kquant_data import KQ_TYPES, Q, random_kquant_bytes

BLOCK = {Q.Q4_K: 144, Q.Q5_K: 176}
QS_WORD = {Q.Q4_K: 1, Q.Q5_K: 3}  # first int4 of qs inside a block


def int4_at(buf: np.ndarray, byte_offset: int) -> np.ndarray:
    assert byte_offset % 16 == 0, f"unaligned 16-byte load at {byte_offset}"
    return buf[byte_offset:byte_offset + 16].view(np.uint32).copy()


def scale_min_k4(j: int, s0: int, s1: int, s2: int) -> tuple[int, int]:
    if j < 4:
        return (s0 >> (8 * j)) & 63, (s1 >> (8 * j)) & 63
    b = 8 * (j - 4)
    return ((s2 >> b) & 0xF) | (((s0 >> (b + 6)) & 3) << 4), ((s2 >> (b + 4)) & 0xF) | (((s1 >> (b + 6)) & 3) << 4)


def f16(bits: int) -> float:
    return float(np.array([bits], np.uint16).view(np.float16)[0])


def load_decode(buf: np.ndarray, qtype, rows: int, k: int, row: int, g: int):
    """(lo lanes int8[16], hi lanes int8[16], s_lo, s_hi, d, m_lo, m_hi) of slice g of `row`, as the kernel decodes it."""
    if qtype in BLOCK:
        base = row * (k // 256) * BLOCK[qtype] + (g >> 3) * BLOCK[qtype]
        q = int4_at(buf, base + 16 * (QS_WORD[qtype] + (g & 7)))
        h = int4_at(buf, base)
        lo = q & 0x0F0F0F0F
        hi = (q >> 4) & 0x0F0F0F0F
        c = (g & 7) >> 1
        if qtype == Q.Q5_K:
            qh = int4_at(buf, base + 16 * (1 + (g & 1)))
            lo = lo | (((qh >> (2 * c)) & 0x01010101) << 4)
            hi = hi | (((qh >> (2 * c + 1)) & 0x01010101) << 4)
        d, dmin = f16(int(h[0]) & 0xFFFF), f16(int(h[0]) >> 16)
        s_lo, m_lo = scale_min_k4(2 * c, int(h[1]), int(h[2]), int(h[3]))
        s_hi, m_hi = scale_min_k4(2 * c + 1, int(h[1]), int(h[2]), int(h[3]))
        lanes = lambda w: w.astype("<u4").view(np.uint8).astype(np.int8).astype(np.int64)
        return lanes(lo), lanes(hi), s_lo, s_hi, d, dmin * m_lo, dmin * m_hi
    n = rows * k
    unit = row * (k // 64) + (g >> 1)
    q = int4_at(buf, 16 * (row * (k // 32) + g))
    h = int4_at(buf, n // 2 + 16 * unit)
    sc = buf[n // 2 + n // 4 + 4 * unit: n // 2 + n // 4 + 4 * unit + 4].view(np.int8)
    dbits = buf[n // 2 + n // 4 + n // 16 + 2 * (row * (k // 256) + (g >> 3)):][:2].view(np.uint16)[0]
    half = g & 1
    lo = (q & 0x0F0F0F0F) | (((h >> (2 * half)) & 0x03030303) << 4)
    hi = ((q >> 4) & 0x0F0F0F0F) | (((h >> (4 + 2 * half)) & 0x03030303) << 4)
    lanes = lambda w: w.astype("<u4").view(np.uint8).astype(np.int64) - 32  # __vsub4(v, 0x20202020)
    return lanes(lo), lanes(hi), int(sc[half]), int(sc[2 + half]), f16(int(dbits)), 0.0, 0.0


def gemv_model(buf, qtype, rows: int, k: int, xq: np.ndarray, xd: np.ndarray) -> np.ndarray:
    """One token: y[row] = Σ over slices of the kernel's slice contribution (float64)."""
    y = np.zeros(rows)
    for row in range(rows):
        for g in range(k // 32):
            lo, hi, s_lo, s_hi, d, m_lo, m_hi = load_decode(buf, qtype, rows, k, row, g)
            b_lo = (g >> 1) << 1
            pos = 16 * (g & 1)
            x_lo = xq[32 * b_lo + pos: 32 * b_lo + pos + 16].astype(np.int64)
            x_hi = xq[32 * (b_lo + 1) + pos: 32 * (b_lo + 1) + pos + 16].astype(np.int64)
            v_lo = d * s_lo * int(lo @ x_lo) - m_lo * int(x_lo.sum())
            v_hi = d * s_hi * int(hi @ x_hi) - m_hi * int(x_hi.sum())
            y[row] += xd[b_lo] * v_lo + xd[b_lo + 1] * v_hi
    return y


@pytest.mark.parametrize("rows,k", [(3, 256), (2, 768)])
@pytest.mark.parametrize("qtype", KQ_TYPES, ids=lambda q: q.name)
def test_slice_model_sums_to_w_times_x(qtype, rows, k):
    rng = np.random.default_rng(rows + k)
    raw = random_kquant_bytes(rng, qtype, rows, k)
    w = dequantize(raw, qtype).astype(np.float64).reshape(rows, k)
    xq, xd = quantize_q8_1(rng.standard_normal((1, k)).astype(np.float32))
    x = dequantize_q8_1(xq, xd)[0].astype(np.float64)
    got = gemv_model(device_layout(raw, qtype, rows, k), qtype, rows, k, xq[0], xd[0].astype(np.float64))
    want = w @ x
    scale = np.abs(w) @ np.abs(x) + 1e-30
    assert np.allclose(got / scale, want / scale, atol=1e-9), (got, want)
