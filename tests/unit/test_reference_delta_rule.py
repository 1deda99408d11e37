"""The delta-rule kernels of the reference on random inputs (no model, no torch).

The recurrent step is checked against the closed form of spec §6.7 computed in float64,
S_t = e^{g_t}(I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ and o_t = S_tᵀ q_t; the chunked form against
the recurrent one, across chunk boundaries, with a non-zero initial state and with decays strong
enough to underflow exp(γ) inside a chunk.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.reference.delta_rule import chunked_delta_rule, recurrent_delta_rule, solve_unit_lower

HV, DK, DV = 3, 8, 5


def inputs(n_tok: int, seed: int, decay_scale: float = 1.0):
    rng = np.random.default_rng(seed)

    def unit(shape):
        x = rng.standard_normal(shape)
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    q = unit((n_tok, HV, DK)) * DK**-0.5
    k = unit((n_tok, HV, DK))
    v = rng.standard_normal((n_tok, HV, DV))
    g = -rng.uniform(0.0, 1.0, (n_tok, HV)) * decay_scale
    beta = rng.uniform(0.0, 1.0, (n_tok, HV))
    state = rng.standard_normal((HV, DK, DV))
    return [x.astype(np.float32) for x in (q, k, v, g, beta, state)]


def closed_form(q, k, v, g, beta, state):
    s = state.astype(np.float64)
    out = np.empty(v.shape)
    eye = np.eye(DK)
    for t in range(q.shape[0]):
        for n in range(HV):
            kt = k[t, n].astype(np.float64)
            s[n] = np.exp(g[t, n]) * (eye - beta[t, n] * np.outer(kt, kt)) @ s[n] + beta[t, n] * np.outer(kt, v[t, n])
            out[t, n] = s[n].T @ q[t, n]
    return out, s


@pytest.mark.parametrize("n_tok", [1, 7])
def test_recurrent_matches_closed_form(n_tok):
    args = inputs(n_tok, seed=n_tok)
    out, state = recurrent_delta_rule(*args)
    ref_out, ref_state = closed_form(*args)
    np.testing.assert_allclose(out, ref_out, atol=1e-5)
    np.testing.assert_allclose(state, ref_state, atol=1e-5)
    assert out.dtype == state.dtype == np.float32


@pytest.mark.parametrize("n_tok", [2, 63, 64, 65, 150])
def test_chunked_matches_recurrent(n_tok):
    args = inputs(n_tok, seed=100 + n_tok, decay_scale=0.1)  # mild decay: the initial state matters throughout
    out, state = chunked_delta_rule(*args)
    ref_out, ref_state = recurrent_delta_rule(*args)
    np.testing.assert_allclose(out, ref_out, atol=2e-5)
    np.testing.assert_allclose(state, ref_state, atol=2e-5)


def test_chunk_size_does_not_matter():
    args = inputs(100, seed=3, decay_scale=0.1)
    out64, s64 = chunked_delta_rule(*args)
    out16, s16 = chunked_delta_rule(*args, chunk=16)
    np.testing.assert_allclose(out16, out64, atol=2e-5)
    np.testing.assert_allclose(s16, s64, atol=2e-5)


def test_strong_decay_stays_finite():
    """γ reaches ≈ −320 inside a chunk: exp(γ) underflows to 0 and the masked pairs must not make NaN.

    The looser tolerance is the chunked form's own: Γ_ij = exp(γ_i − γ_j) is formed from fp32
    cumulative sums, so its exponent carries an absolute error of about |γ|·2⁻²⁴ ≈ 2e-5.
    """
    args = inputs(130, seed=4, decay_scale=10.0)
    out, state = chunked_delta_rule(*args)
    ref_out, ref_state = recurrent_delta_rule(*args)
    assert np.isfinite(out).all() and np.isfinite(state).all()
    np.testing.assert_allclose(out, ref_out, atol=1e-4)
    np.testing.assert_allclose(state, ref_state, atol=1e-4)


def test_solve_unit_lower():
    rng = np.random.default_rng(5)
    a = np.tril(rng.standard_normal((2, 3, 16, 16)) * 0.3, -1)
    b = rng.standard_normal((2, 3, 16, 4))
    x = solve_unit_lower(a, b)
    np.testing.assert_allclose((np.eye(16) + a) @ x, b, atol=1e-10)
