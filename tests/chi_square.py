"""Chi-square checks (by default at α ≈ 1e-3) for the sampling tests (critical values from the Wilson–Hilferty
approximation, no scipy): one sample against known probabilities, or two samples against each other."""

from __future__ import annotations

from collections.abc import Hashable, Mapping

import numpy as np

Z_999 = 3.0902  # the standard normal's 0.999 quantile
Z_1E6 = 4.75  # its 1 - 1e-6 quantile, for files that run many checks


def critical_value(df: int, z: float = Z_999) -> float:
    """The chi-square distribution's upper quantile with `df` degrees of freedom at the standard normal
    quantile `z` (default 0.999), by the Wilson–Hilferty approximation."""
    return df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3


def chi_square_fits(counts: Mapping, expected: Mapping, n: int, z: float = Z_999) -> bool:
    """Goodness of fit of `counts` (n samples) to the probabilities `expected` at the normal quantile `z` (a
    file running many such checks takes a stricter one); cells expecting < 5 are pooled."""
    big = [c for c, p in expected.items() if p * n >= 5]
    small_p = 1.0 - sum(expected[c] for c in big)
    observed = [counts.get(c, 0) for c in big] + [n - sum(counts.get(c, 0) for c in big)]
    want = [expected[c] * n for c in big] + [small_p * n]
    if small_p * n < 5:  # nothing worth a cell: the pooled rest must then be (almost) empty
        observed, want = observed[:-1], want[:-1]
        if n - sum(observed) > 5:
            return False
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, want))
    return stat < critical_value(len(want) - 1, z)


def same_distribution(a: Mapping[Hashable, int], b: Mapping[Hashable, int]) -> bool:
    """Two samples of equal size from one distribution? Cells with fewer than 10 draws in both together are pooled."""
    if sum(a.values()) != sum(b.values()):
        raise ValueError("the two-sample statistic here needs samples of equal size")
    cells = set(a) | set(b)
    big = [c for c in cells if a.get(c, 0) + b.get(c, 0) >= 10]
    rest = [sum(s.get(c, 0) for c in cells - set(big)) for s in (a, b)]
    pairs = [(a.get(c, 0), b.get(c, 0)) for c in big] + ([tuple(rest)] if sum(rest) else [])
    if len(pairs) < 2:
        return True  # one cell holds everything in both samples
    stat = sum((x - y) ** 2 / (x + y) for x, y in pairs)
    return stat < critical_value(len(pairs) - 1)
