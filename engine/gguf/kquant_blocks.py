"""Write ggml Q4_K, Q5_K and Q6_K blocks from numpy (PyPI gguf 0.19 dequantizes them but cannot quantize).

Two writers per type, both giving bytes that `gguf.quants.dequantize` reads (the unit tests check the
layouts against it):

* `quantize_kquant(values, qtype)`: round-to-nearest with a per-sub-block min/max fit. This is not
  llama.cpp's search (`make_qkx2_quants`), so the error is somewhat larger than a llama.cpp file's;
  the bytes follow the format exactly, which is what tiny test models need. Files quantized by
  llama.cpp itself are what the peer test compares against.
* `random_kquant_rows(n_rows, n_cols, half_width, qtype, rng)`: random blocks made directly (uniform
  quants, random 6-bit scales, minimums centring each sub-block), values within ±half_width. For
  full-size synthetic files: several times faster than making floats and quantizing them.

Block layouts (ggml-common.h; QK_K = 256 values per super-block):
  Q4_K (144 B): d f16, dmin f16, scales[12], qs[128]; value = d·sc_j·q − dmin·m_j, q 0..15, j = value/32
  Q5_K (176 B): d, dmin, scales[12], qh[32], qs[128]; q 0..31, bit 4 of q in qh
  Q6_K (210 B): ql[128], qh[64], scales[16] int8, d f16; value = d·sc_i·(q − 32), q 0..63, i = value/16
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

Q = GGMLQuantizationType
QK_K = 256
BLOCK_BYTES = {Q.Q4_K: 144, Q.Q5_K: 176, Q.Q6_K: 210}
KQUANT_TYPES = frozenset(BLOCK_BYTES)


def pack_scale_min(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """uint8 [n, 12]: eight 6-bit scales and mins per super-block, as ggml's get_scale_min_k4 unpacks them."""
    sc, m = sc.astype(np.uint8), m.astype(np.uint8)
    out = np.empty(sc.shape[:-1] + (12,), np.uint8)
    out[..., 0:4] = (sc[..., 0:4] & 63) | ((sc[..., 4:8] >> 4) << 6)
    out[..., 4:8] = (m[..., 0:4] & 63) | ((m[..., 4:8] >> 4) << 6)
    out[..., 8:12] = (sc[..., 4:8] & 0xF) | ((m[..., 4:8] & 0xF) << 4)
    return out


def pack_nibbles(q: np.ndarray) -> np.ndarray:
    """uint8 [n, 128] from 256 4-bit values per block: byte 32c + l holds values 64c + l (low) and 64c + 32 + l."""
    q = q.astype(np.uint8).reshape(q.shape[0], 4, 2, 32)
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(q.shape[0], 128)


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _assemble_q45(qtype: Q, d: np.ndarray, dmin: np.ndarray, sc: np.ndarray, m: np.ndarray, q: np.ndarray) -> np.ndarray:
    n = q.shape[0]
    parts = [_f16_bytes(d), _f16_bytes(dmin), pack_scale_min(sc, m)]
    if qtype == Q.Q5_K:
        high = (q >> 4).astype(np.uint8).reshape(n, 8, 32)  # bit b of qh[l]: value 32b + l
        qh = np.zeros((n, 32), np.uint8)
        for b in range(8):
            qh |= high[:, b] << b
        parts.append(qh)
    parts.append(pack_nibbles(q & 15))
    return np.concatenate(parts, axis=1)


def _assemble_q6(d: np.ndarray, sc: np.ndarray, q: np.ndarray) -> np.ndarray:
    n = q.shape[0]
    q = q.astype(np.uint8).reshape(n, 2, 4, 32)  # [half][group g][l]: value 128 half + 32 g + l
    low, high = q & 15, q >> 4
    ql = np.concatenate([low[:, :, 0] | (low[:, :, 2] << 4), low[:, :, 1] | (low[:, :, 3] << 4)], axis=2)
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    return np.concatenate([ql.reshape(n, 128), qh.reshape(n, 64), sc.astype(np.int8).view(np.uint8), _f16_bytes(d)], axis=1)


def _rows_to_blocks(values: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
    values = np.asarray(values, dtype=np.float32)
    if values.shape[-1] % QK_K:
        raise ValueError(f"K-quant rows must hold a multiple of {QK_K} values, not {values.shape[-1]}")
    return values.reshape(-1, QK_K), values.shape


def _out_shape(shape: tuple[int, ...], qtype: Q) -> tuple[int, ...]:
    return shape[:-1] + (shape[-1] // QK_K * BLOCK_BYTES[qtype],)


def _safe_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b > 0, a / np.where(b > 0, b, 1), 0.0)


def quantize_kquant(values: np.ndarray, qtype: Q) -> np.ndarray:
    """values fp32 [..., K] (K % 256 == 0) → uint8 [..., K/256 · block bytes] of `qtype` blocks."""
    blocks, shape = _rows_to_blocks(values)
    if qtype == Q.Q6_K:
        groups = blocks.reshape(-1, 16, 16).astype(np.float64)
        scale = np.abs(groups).max(axis=2) / 31.0
        d = (scale.max(axis=1) / 127.0).astype(np.float16)
        sc = np.clip(np.rint(_safe_div(scale, d.astype(np.float64)[:, None])), 0, 127)
        step = d.astype(np.float64)[:, None] * sc
        q = np.clip(np.rint(_safe_div(groups, step[:, :, None])), -32, 31) + 32
        return _assemble_q6(d, sc, q.reshape(-1, QK_K)).reshape(_out_shape(shape, qtype))
    if qtype not in (Q.Q4_K, Q.Q5_K):
        raise ValueError(f"not a K-quant type: {qtype.name}")
    top = 15 if qtype == Q.Q4_K else 31
    subs = blocks.reshape(-1, 8, 32).astype(np.float64)
    low = np.minimum(subs.min(axis=2), 0.0)
    scale = (subs.max(axis=2) - low) / top
    d = (scale.max(axis=1) / 63.0).astype(np.float16)
    dmin = ((-low).max(axis=1) / 63.0).astype(np.float16)
    sc = np.clip(np.rint(_safe_div(scale, d.astype(np.float64)[:, None])), 0, 63)
    m = np.clip(np.rint(_safe_div(-low, dmin.astype(np.float64)[:, None])), 0, 63)
    step = d.astype(np.float64)[:, None] * sc
    offset = dmin.astype(np.float64)[:, None] * m
    q = np.clip(np.rint(_safe_div(subs + offset[:, :, None], step[:, :, None])), 0, top)
    return _assemble_q45(qtype, d, dmin, sc, m, q.reshape(-1, QK_K).astype(np.uint8)).reshape(_out_shape(shape, qtype))


def random_kquant_rows(n_rows: int, n_cols: int, half_width: float, qtype: Q, rng: np.random.Generator) -> np.ndarray:
    """`n_rows` rows of random `qtype` blocks with values in [-half_width, half_width] (see module docstring)."""
    if n_cols % QK_K:
        raise ValueError(f"K-quant rows must hold a multiple of {QK_K} values, not {n_cols}")
    n = n_rows * (n_cols // QK_K)
    if qtype == Q.Q6_K:
        q = rng.integers(0, 64, size=(n, QK_K), dtype=np.uint8)
        sc = rng.integers(1, 128, size=(n, 16), dtype=np.int8)
        d = np.full(n, half_width / (32 * 127), np.float32)
        raw = _assemble_q6(d, sc, q)
    else:
        top = 15 if qtype == Q.Q4_K else 31
        q = rng.integers(0, top + 1, size=(n, QK_K), dtype=np.uint8)
        sc = rng.integers(1, 64, size=(n, 8), dtype=np.uint8)
        d = np.full(n, half_width / (63 * (top / 2)), np.float32)
        # m = sc and dmin = d·top/2 centre each sub-block: value = d·sc·(q − top/2)
        raw = _assemble_q45(qtype, d, d * (top / 2), sc, sc, q)
    return raw.reshape(n_rows, n_cols // QK_K * BLOCK_BYTES[qtype])
