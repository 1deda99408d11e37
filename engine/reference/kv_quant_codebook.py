"""Lloyd-Max codebooks for the rotated coordinates of a unit-norm 128-value block (KV formats wht4/wht3).

Why this distribution: after the fixed random-sign Walsh-Hadamard rotation, a block divided by its
norm is (to a very good approximation, and exactly for a uniformly random direction) a point on the
unit sphere S^127, so each coordinate has the sphere's marginal density

    f(t) ∝ (1 - t²)^((d - 3) / 2)  on [-1, 1],  d = 128      (variance 1/d, i.e. σ = 1/√128)

(anchor-qengine.md lesson 13: centroids must be scaled for a *unit* vector's coordinates; unit-variance
centroids put every coordinate into the two middle bins). The quantiser minimising the mean squared
error of one coordinate under f is found by Lloyd's iterations: boundaries are midpoints of adjacent
centroids, centroids are the conditional means of their cells. f is symmetric, so only the positive
half is iterated with 0 as the middle boundary.

The committed values (`CODEBOOK_4BIT`, `CODEBOOK_3BIT`) are the output of `derive_codebook` rounded to
9 decimals; tests/unit/test_kv_codebook.py re-derives them. They are part of the KV format contract
(kv_formats.KV_FORMATS_VERSION): changing them changes what stored caches mean.
"""

from __future__ import annotations

import numpy as np

BLOCK_DIM = 128  # values per rotated block (kv_formats.WHT4/WHT3 block)

# Positive halves; the full codebook is (-reversed, +), codes 0..L-1 in increasing order.
_CODEBOOK_4BIT_HALF = (0.011302497, 0.034151571, 0.057772299, 0.082828457,
                       0.110288369, 0.141805197, 0.180835964, 0.237663827)
_CODEBOOK_3BIT_HALF = (0.021604311, 0.066585608, 0.118139767, 0.188397186)


def _symmetric(half: tuple[float, ...]) -> np.ndarray:
    h = np.asarray(half, np.float64)
    return np.concatenate([-h[::-1], h])


CODEBOOK_4BIT = _symmetric(_CODEBOOK_4BIT_HALF)
CODEBOOK_3BIT = _symmetric(_CODEBOOK_3BIT_HALF)


def derive_codebook(levels: int, dim: int = BLOCK_DIM, cells: int = 300_000, limit: float = 0.75,
                    tol: float = 1e-15, max_iter: int = 100_000) -> np.ndarray:
    """The `levels`-entry Lloyd-Max codebook (float64, increasing) for one coordinate of a unit vector in R^dim.

    The density is integrated with the midpoint rule on `cells` cells of [0, limit] (the mass beyond
    0.75 is below 1e-17 for dim 128); a cell boundary falling inside a cell is handled by linear
    interpolation of the cumulative sums, so the iteration converges smoothly.
    """
    if levels % 2 or levels < 2:
        raise ValueError("a symmetric codebook needs an even number of levels")
    edges = np.linspace(0.0, limit, cells + 1)
    t = 0.5 * (edges[:-1] + edges[1:])
    w = np.exp(0.5 * (dim - 3) * np.log1p(-t * t))
    w /= w.sum()
    cum_w = np.concatenate([[0.0], np.cumsum(w)])
    cum_m = np.concatenate([[0.0], np.cumsum(w * t)])

    def cumulative(table: np.ndarray, x: np.ndarray) -> np.ndarray:
        p = x / limit * cells
        i = np.minimum(np.floor(p).astype(np.int64), cells - 1)
        return table[i] + (p - i) * (table[i + 1] - table[i])

    half = levels // 2
    c = (np.arange(half) + 0.5) / half * 2.5 / np.sqrt(dim)  # spread over ±2.5σ to start
    for _ in range(max_iter):
        bounds = np.concatenate([[0.0], 0.5 * (c[:-1] + c[1:]), [limit]])
        mass, moment = cumulative(cum_w, bounds), cumulative(cum_m, bounds)
        new_c = np.diff(moment) / np.diff(mass)
        if np.max(np.abs(new_c - c)) < tol:
            c = new_c
            break
        c = new_c
    else:
        raise RuntimeError(f"Lloyd iterations for {levels} levels did not converge")
    return np.concatenate([-c[::-1], c])


def mse_per_coordinate(codebook: np.ndarray, dim: int = BLOCK_DIM, samples: int = 200_000, seed: int = 0) -> float:
    """Monte-Carlo mean squared error of one unit-vector coordinate under `codebook` (for docs and tests)."""
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((samples // dim + 1, dim))
    u = (g / np.linalg.norm(g, axis=1, keepdims=True)).reshape(-1)
    bounds = 0.5 * (codebook[:-1] + codebook[1:])
    return float(np.mean((u - codebook[np.searchsorted(bounds, u)]) ** 2))
