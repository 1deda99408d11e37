"""Gated DeltaNet mixer (spec §6.7): projections, causal conv + SiLU, L2 norm, gates, delta rule, gated norm.

All head indices are GGUF order: value head n pairs with key head n mod Hk (the converter re-ordered
HF's grouped value heads into this tiled order, spec §5.5). A single-token batch uses the recurrent
step; a longer batch uses the chunked form; both start from the layer's cached state, so a
multi-token continuation (second prompt chunk, draft verification) is correct (spec pitfall 8).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.gguf.config import ModelConfig
from engine.reference.activations import sigmoid, silu, softplus
from engine.reference.delta_rule import chunked_delta_rule, recurrent_delta_rule
from engine.reference.linear import Linear, WeightTable
from engine.reference.norms import gated_rmsnorm, l2norm
from engine.reference.state import GdnLayerState


@dataclass(frozen=True)
class GdnWeights:
    qkv: Linear  # [Cc, D]: q rows [0, Ck), k rows [Ck, 2Ck), v rows [2Ck, Cc)
    gate: Linear  # z, [Cv, D]
    beta: Linear  # [Hv, D]
    alpha: Linear  # [Hv, D]
    out: Linear  # [D, Cv]
    conv: np.ndarray  # [Cc, Kc]; tap Kc−1 multiplies the current token
    dt_bias: np.ndarray  # [Hv]
    a: np.ndarray  # [Hv] = −exp(A_log), already negative
    norm: np.ndarray  # [dv], not offset

    @classmethod
    def load(cls, table: WeightTable, cfg: ModelConfig, block: int) -> "GdnWeights":
        p = f"blk.{block}."
        d, hv = cfg.d_model, cfg.ssm_n_v_heads
        return cls(
            qkv=table.linear(p + "attn_qkv.weight", cfg.ssm_conv_dim, d),
            gate=table.linear(p + "attn_gate.weight", cfg.ssm_d_inner, d),
            beta=table.linear(p + "ssm_beta.weight", hv, d),
            alpha=table.linear(p + "ssm_alpha.weight", hv, d),
            out=table.linear(p + "ssm_out.weight", d, cfg.ssm_d_inner),
            conv=table.tensor(p + "ssm_conv1d.weight", (cfg.ssm_conv_dim, cfg.ssm_conv_kernel)),
            dt_bias=table.tensor(p + "ssm_dt.bias", (hv,)),
            a=table.tensor(p + "ssm_a", (hv,)),
            norm=table.tensor(p + "ssm_norm.weight", (cfg.ssm_d_head_v,)),
        )


def causal_conv(mix: np.ndarray, conv_state: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Depthwise causal conv of raw rows mix [T, Cc] after the cached Kc−1 rows; returns (conv [T, Cc], new state).

    The new state is the last Kc−1 rows of [old state; mix], so a batch shorter than Kc−1 keeps
    part of the old state (spec pitfall 7).
    """
    n_tok = mix.shape[0]
    kc = weight.shape[1]
    window = np.concatenate([conv_state, mix], axis=0)  # [Kc−1+T, Cc]
    out = np.zeros_like(mix)
    for j in range(kc):
        out += window[j : j + n_tok] * weight[:, j]
    return out, window[window.shape[0] - (kc - 1) :].copy()


def gated_deltanet(w: GdnWeights, cfg: ModelConfig, a: np.ndarray, state: GdnLayerState) -> np.ndarray:
    """Mixer output [T, D] for normalised input a [T, D]; updates `state` (conv and recurrent) in place."""
    n_tok = a.shape[0]
    hk, hv, dk, dv, ck = cfg.ssm_n_k_heads, cfg.ssm_n_v_heads, cfg.ssm_d_state, cfg.ssm_d_head_v, cfg.ssm_key_dim

    conv, state.conv = causal_conv(w.qkv(a), state.conv, w.conv)
    c = silu(conv)
    q = l2norm(c[:, :ck].reshape(n_tok, hk, dk)) * np.float32(dk**-0.5)
    k = l2norm(c[:, ck : 2 * ck].reshape(n_tok, hk, dk))
    v = c[:, 2 * ck :].reshape(n_tok, hv, dv)
    key_head = np.arange(hv) % hk  # tiled pairing in GGUF order
    q, k = q[:, key_head], k[:, key_head]

    beta = sigmoid(w.beta(a))
    g = w.a * softplus(w.alpha(a) + w.dt_bias)  # log decay, ≤ 0
    rule = recurrent_delta_rule if n_tok == 1 else chunked_delta_rule
    o, state.recurrent = rule(q, k, v, g, beta, state.recurrent)

    z = w.gate(a).reshape(n_tok, hv, dv)
    y = gated_rmsnorm(o, w.norm, z, cfg.rms_eps)
    return w.out(y.reshape(n_tok, hv * dv))
