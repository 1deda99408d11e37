"""Partial NEOX rotary embedding with interleaved multimodal sections (IMROPE, spec §6.6).

Only the first `R` dims of each head rotate, in NEOX pairs (j, j + R/2). Each token has a 3-component
position (t, h, w); pair j takes its angle from component
    h  if j % 3 == 1 and j < 3·s_h
    w  if j % 3 == 2 and j < 3·s_w
    t  otherwise
(transformers' `recomposition_frequencies`; llama.cpp agrees for every released config, where the
sections [11, 11, 10] exactly cover the 32 pairs — it would use a 4th, zero, component for pairs
beyond 3·s_t, which no released model has). For plain text t = h = w = the token position.
"""

from __future__ import annotations

import numpy as np

from engine.gguf.config import ModelConfig

POSITION_COMPONENTS = 3  # (t, h, w)


class Rope:
    """Angle tables for one model: inverse frequencies and the position component of each pair."""

    def __init__(self, cfg: ModelConfig):
        self.rope_dims = cfg.rope_dims
        half = cfg.rope_dims // 2
        exponent = np.arange(0, cfg.rope_dims, 2, dtype=np.float64) / cfg.rope_dims
        self.inv_freq = (1.0 / cfg.rope_theta**exponent).astype(np.float32)
        s_t, s_h, s_w = cfg.rope_sections[:3]
        j = np.arange(half)
        component = np.zeros(half, dtype=np.intp)  # 0 = t
        component[(j % 3 == 1) & (j < 3 * s_h)] = 1
        component[(j % 3 == 2) & (j < 3 * s_w)] = 2
        self.component = component

    def apply(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Rotate x [T, heads, Dh] for positions [T, 3]; dims R..Dh pass through unchanged."""
        half = self.rope_dims // 2
        theta = positions[:, self.component].astype(np.float32) * self.inv_freq  # [T, R/2], fp32 like HF
        cos = np.cos(theta)[:, None, :]
        sin = np.sin(theta)[:, None, :]
        x1 = x[..., :half]
        x2 = x[..., half:self.rope_dims]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., self.rope_dims:]], axis=-1)


def text_positions(start: int, count: int) -> np.ndarray:
    """Positions [count, 3] of consecutive text tokens starting at `start` (t = h = w)."""
    p = np.arange(start, start + count, dtype=np.int64)
    return np.repeat(p[:, None], POSITION_COMPONENTS, axis=1)


def as_positions(positions: np.ndarray | list, count: int) -> np.ndarray:
    """Normalise caller positions to int64 [count, 3]: a 1-D array means text positions (t = h = w)."""
    p = np.asarray(positions, dtype=np.int64)
    if p.ndim == 1:
        p = np.repeat(p[:, None], POSITION_COMPONENTS, axis=1)
    if p.shape != (count, POSITION_COMPONENTS):
        raise ValueError(f"positions must have shape ({count},) or ({count}, 3), got {p.shape}")
    return p
