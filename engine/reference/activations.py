"""Elementwise nonlinearities of the model (spec §1), written once so every layer uses the same form.

All take and return float32 arrays. The forms are chosen to be overflow-free for any finite input
(no RuntimeWarnings), and softplus follows PyTorch's default threshold so the reference agrees with
transformers bit-for-bit where it matters (large `alpha + dt_bias`).
"""

from __future__ import annotations

import numpy as np

SOFTPLUS_THRESHOLD = 20.0  # torch.nn.functional.softplus(beta=1, threshold=20): identity above it


def sigmoid(x: np.ndarray) -> np.ndarray:
    """σ(x) = 1/(1+e^−x), from e^−|x| so that nothing overflows and small σ keep full relative precision."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(np.float32, copy=False)


def silu(x: np.ndarray) -> np.ndarray:
    """x·σ(x) (conv activation, FFN gate, GDN output gate)."""
    return x * sigmoid(x)


def softplus(x: np.ndarray) -> np.ndarray:
    """ln(1+e^x), returning x itself above the threshold exactly as PyTorch does."""
    safe = np.minimum(x, SOFTPLUS_THRESHOLD)
    return np.where(x > SOFTPLUS_THRESHOLD, x, np.log1p(np.exp(safe))).astype(np.float32, copy=False)
