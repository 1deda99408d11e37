"""The three normalisations of the model (spec §6.2, §6.7 steps 4 and 8), all computed in fp32.

GGUF norm weights already include the +1 of HF's zero-centred RMSNorm (spec §5.1), so `rmsnorm` is a
plain `x̂·w`; the GDN gated norm weight (`ssm_norm`) was never offset and is used the same way.
"""

from __future__ import annotations

import numpy as np

from engine.reference.activations import silu

# transformers' `l2norm` hard-codes eps=1e-6 inside sqrt(Σx² + eps) (FLA's form); llama.cpp uses
# 1/max(‖x‖, rms_eps) instead. The two agree to ~1e-12 for any non-degenerate head (spec pitfall 22).
L2_NORM_EPS = 1e-6


def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x²) + eps) · weight over the last axis."""
    x = x.astype(np.float32, copy=False)
    inv = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps))
    return (x * inv.astype(np.float32)) * weight


def l2norm(x: np.ndarray) -> np.ndarray:
    """x / sqrt(Σx² + 1e-6) over the last axis (GDN q and k, per head)."""
    inv = 1.0 / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + np.float32(L2_NORM_EPS))
    return x * inv.astype(np.float32)


def gated_rmsnorm(x: np.ndarray, weight: np.ndarray, gate: np.ndarray, eps: float) -> np.ndarray:
    """rmsnorm(x, weight) ⊙ silu(gate): the GDN output norm, per value head over dv."""
    return rmsnorm(x, weight, eps) * silu(gate)
