"""Lloyd-Max codebooks of the rotated KV formats: the committed values are what the derivation gives.

The derivation (engine/reference/kv_quant_codebook.py) runs Lloyd's iterations on the marginal density
of one coordinate of a unit vector in R^128; re-running it must reproduce the committed 9-decimal
values (tolerance 2e-9: the rounding plus the integration's ~1e-10 grid error). The resulting mean
squared errors, in units of the coordinate variance 1/128, sit just under the Gaussian Lloyd-Max
distortions (0.03454 for 8 levels, 0.009497 for 16) because the sphere's marginal has lighter tails.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.reference.kv_quant import SIGNS, device_tables
from engine.reference.kv_quant_codebook import (
    BLOCK_DIM,
    CODEBOOK_3BIT,
    CODEBOOK_4BIT,
    derive_codebook,
    mse_per_coordinate,
)


@pytest.mark.parametrize("levels, committed", [(8, CODEBOOK_3BIT), (16, CODEBOOK_4BIT)])
def test_committed_codebook_is_rederived(levels, committed):
    derived = derive_codebook(levels)
    np.testing.assert_allclose(derived, committed, rtol=0, atol=2e-9)
    assert np.all(np.diff(committed) > 0) and np.allclose(committed, -committed[::-1])


@pytest.mark.parametrize("codebook, gaussian", [(CODEBOOK_3BIT, 0.03454), (CODEBOOK_4BIT, 0.009497)])
def test_distortion_is_lloyd_max_for_unit_vector_coordinates(codebook, gaussian):
    mse = mse_per_coordinate(codebook) * BLOCK_DIM
    assert 0.95 * gaussian < mse < gaussian * 1.01
    # unit-variance centroids (the anchor's first bug) would be ~11x too wide and much worse
    assert mse_per_coordinate(codebook * np.sqrt(BLOCK_DIM)) * BLOCK_DIM > 0.5


def test_device_tables_layout():
    t = device_tables()
    assert t.dtype == np.float32 and t.shape == (128 + 16 + 15 + 8 + 7,)
    np.testing.assert_array_equal(t[:128], SIGNS)
    np.testing.assert_array_equal(t[128:144], CODEBOOK_4BIT.astype(np.float32))
    np.testing.assert_array_equal(t[159:167], CODEBOOK_3BIT.astype(np.float32))
    for c, b in ((t[128:144], t[144:159]), (t[159:167], t[167:174])):
        assert np.all((c[:-1] < b) & (b < c[1:]))
