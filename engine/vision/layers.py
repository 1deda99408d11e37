"""The ViT's elementwise pieces (spec §9.4): LayerNorm, the two GELUs, and the 2D rotary embedding.

The tower blocks use the tanh GELU (`gelu_pytorch_tanh`) and the merger the exact erf GELU (`nn.GELU()`),
as transformers does. numpy has no erf, so `gelu_erf` uses Abramowitz & Stegun 7.1.26 in float64
(absolute error ≤ 1.5e-7 on erf, below float32 resolution of the result for the values that matter).
"""

from __future__ import annotations

import numpy as np

ROPE_THETA = 10000.0  # transformers' axial default; llama.cpp hard-codes it for qwen3vl


def layernorm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """(x − mean) / sqrt(var + eps) · weight + bias over the last axis, in fp32."""
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = np.mean(centred * centred, axis=-1, keepdims=True)
    return centred / np.sqrt(var + np.float32(eps)) * weight + bias


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))."""
    c = np.float32(np.sqrt(2.0 / np.pi))
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))


def _erf(z: np.ndarray) -> np.ndarray:
    a1, a2, a3, a4, a5, p = 0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429, 0.3275911
    s = np.sign(z)
    z = np.abs(z)
    t = 1.0 / (1.0 + p * z)
    y = 1.0 - (((((a5 * t + a4) * t) + a3) * t + a2) * t + a1) * t * np.exp(-z * z)
    return s * y


def gelu_erf(x: np.ndarray) -> np.ndarray:
    """0.5·x·(1 + erf(x/√2)), computed in float64 and returned as float32."""
    x64 = x.astype(np.float64)
    return (0.5 * x64 * (1.0 + _erf(x64 / np.sqrt(2.0)))).astype(np.float32)


def rotary_2d_tables(rows: np.ndarray, cols: np.ndarray, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [n, head_dim] for patches at (rows, cols): the first quarter of the pairs turn with the row,
    the second with the column, each at frequencies θ^(−2j/(head_dim/2)); rotate-half pairs (j, j + head_dim/2)."""
    spatial = head_dim // 2
    inv_freq = (1.0 / ROPE_THETA ** (np.arange(0, spatial, 2, dtype=np.float32) / spatial)).astype(np.float32)
    freqs = np.concatenate([rows[:, None] * inv_freq, cols[:, None] * inv_freq], axis=1).astype(np.float32)
    angles = np.concatenate([freqs, freqs], axis=1)
    return np.cos(angles), np.sin(angles)


def apply_rotary(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [n, heads, head_dim] rotated by per-patch tables [n, head_dim] (rotate-half form)."""
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]
