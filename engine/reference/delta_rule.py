"""The gated delta rule (spec §6.7 step 7, §6.8): token-by-token recurrence and the chunked form.

Both functions take value-head-aligned inputs (q and k already L2-normalised, q scaled by dk^−½, and
already gathered so that row n belongs to value head n) and an initial state, and return the outputs
and the final state. They are mathematically identical; the chunked form is what prefill uses and
the recurrent one what a single decode step uses. Everything is fp32 (spec pitfall 9).

Shapes: q, k [T, Hv, dk]; v [T, Hv, dv]; g (log decay, ≤ 0), beta [T, Hv]; state [Hv, dk, dv]
(rows indexed by key dim, as in transformers).
"""

from __future__ import annotations

import numpy as np

CHUNK_SIZE = 64  # transformers and llama.cpp both use 64; any size gives the same result


def recurrent_delta_rule(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray, state: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Step 7 per token: decay, delta-rule write of β(v − Sᵀk), read Sᵀq with the updated state."""
    s = state.astype(np.float32, copy=True)
    out = np.empty(v.shape, np.float32)
    for t in range(q.shape[0]):
        s *= np.exp(g[t])[:, None, None]
        predicted = np.einsum("hkv,hk->hv", s, k[t])
        u = beta[t][:, None] * (v[t] - predicted)
        s += k[t][:, :, None] * u[:, None, :]
        out[t] = np.einsum("hkv,hk->hv", s, q[t])
    return out, s


def chunked_delta_rule(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    state: np.ndarray,
    chunk: int = CHUNK_SIZE,
) -> tuple[np.ndarray, np.ndarray]:
    """§6.8: within each chunk solve the UT system by forward substitution, then scan chunk by chunk.

    The tail is padded with q = k = v = 0, g = 0, β = 0, which changes neither the state nor the
    real outputs. Pairwise decays exp(γ_i − γ_j) are only formed for j ≤ i (the rest is masked to −∞
    before the exp), so no inf·0 can appear.
    """
    n_tok = q.shape[0]
    pad = (-n_tok) % chunk

    def chunked(x: np.ndarray) -> np.ndarray:  # [T, Hv, ...] → [Hv, N, C, ...]
        x = np.concatenate([x, np.zeros((pad,) + x.shape[1:], np.float32)]) if pad else x
        x = x.reshape((-1, chunk) + x.shape[1:])
        return np.moveaxis(x, 2, 0).astype(np.float32, copy=False)

    qc, kc, vc, gc, bc = (chunked(x) for x in (q, k, v, g, beta))
    gamma = np.cumsum(gc, axis=-1)  # [Hv, N, C] cumulative log decay inside each chunk
    lower = np.tril(np.ones((chunk, chunk), dtype=bool))
    pair_decay = np.exp(np.where(lower, gamma[..., :, None] - gamma[..., None, :], -np.inf))  # Γ_ij, 0 for j > i
    strictly_lower = np.tril(np.ones((chunk, chunk), dtype=np.float32), -1)

    a = bc[..., :, None] * (kc @ np.swapaxes(kc, -1, -2)) * pair_decay * strictly_lower
    rhs = np.concatenate([bc[..., None] * vc, (bc * np.exp(gamma))[..., None] * kc], axis=-1)
    solved = solve_unit_lower(a, rhs)  # (I + A)^−1 · [diag(β)V | diag(βe^γ)K]
    dv = v.shape[-1]
    new_values, decayed_keys = solved[..., :dv], solved[..., dv:]

    intra = (qc @ np.swapaxes(kc, -1, -2)) * pair_decay  # [Hv, N, C, C], incl. diagonal
    q_decayed = qc * np.exp(gamma)[..., None]
    k_to_end = kc * np.exp(gamma[..., -1:] - gamma)[..., None]
    chunk_decay = np.exp(gamma[..., -1])  # [Hv, N]

    s = state.astype(np.float32, copy=True)
    out = np.empty(vc.shape, np.float32)  # [Hv, N, C, dv]
    for c in range(qc.shape[1]):
        u = new_values[:, c] - decayed_keys[:, c] @ s  # true per-token updates
        out[:, c] = q_decayed[:, c] @ s + intra[:, c] @ u
        s = s * chunk_decay[:, c, None, None] + np.swapaxes(k_to_end[:, c], -1, -2) @ u
    out = np.moveaxis(out.reshape(out.shape[0], -1, dv), 0, 1)[:n_tok]
    return out, s


def solve_unit_lower(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """X with (I + A)·X = B for strictly lower-triangular A [..., C, C], by forward substitution."""
    x = b.copy()
    for i in range(1, a.shape[-1]):
        x[..., i, :] -= (a[..., i : i + 1, :i] @ x[..., :i, :])[..., 0, :]
    return x
