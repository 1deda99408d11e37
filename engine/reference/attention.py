"""Gated full attention (spec §6.5): per-head [query | gate] rows, q/k RMSNorm, IMROPE, GQA, sigmoid gate.

Handles any batch length against the layer's KV cache: the T new tokens are appended after the
cached ones and each new token attends to every cached token and to the new tokens up to itself
(causal by cache order, not by position value, because image tokens share positions).

Attention reads the cache in its stored form (contracts.md "KV cache formats"): the new K/V rows are
encoded first, then q is moved into the K codec's domain once (rotated for wht formats), scored
against the stored keys, the probabilities weight the stored values in the V codec's domain, and the
output comes back from that domain once per head. For the exact f16 cache both domains are the
identity and this is plain softmax attention.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np

from engine.gguf.config import ModelConfig
from engine.reference.activations import sigmoid
from engine.reference.linear import Linear, WeightTable
from engine.reference.norms import rmsnorm
from engine.reference.rope import Rope
from engine.reference.state import KVCache


@dataclass(frozen=True)
class AttentionWeights:
    q: Linear  # [2·H·Dh, D]: head h owns rows [2h·Dh, 2h·Dh+Dh) query, then Dh gate rows
    k: Linear
    v: Linear
    out: Linear
    q_norm: np.ndarray  # [Dh], shared by all heads, +1 already applied
    k_norm: np.ndarray

    @classmethod
    def load(cls, table: WeightTable, cfg: ModelConfig, block: int) -> "AttentionWeights":
        p = f"blk.{block}."
        return cls(
            q=table.linear(p + "attn_q.weight", 2 * cfg.q_dim, cfg.d_model),
            k=table.linear(p + "attn_k.weight", cfg.kv_dim, cfg.d_model),
            v=table.linear(p + "attn_v.weight", cfg.kv_dim, cfg.d_model),
            out=table.linear(p + "attn_output.weight", cfg.d_model, cfg.q_dim),
            q_norm=table.tensor(p + "attn_q_norm.weight", (cfg.head_dim,)),
            k_norm=table.tensor(p + "attn_k_norm.weight", (cfg.head_dim,)),
        )


def gated_attention(
    w: AttentionWeights, cfg: ModelConfig, rope: Rope, a: np.ndarray, positions: np.ndarray, cache: KVCache
) -> np.ndarray:
    """Mixer output [T, D] for normalised input a [T, D] at positions [T, 3]; appends K/V to `cache`."""
    t_new = a.shape[0]
    h, hkv, dh = cfg.n_head, cfg.n_head_kv, cfg.head_dim
    qg = w.q(a).reshape(t_new, h, 2, dh)
    q = rmsnorm(qg[:, :, 0], w.q_norm, cfg.rms_eps)
    gate = qg[:, :, 1].reshape(t_new, h * dh)
    k = rmsnorm(w.k(a).reshape(t_new, hkv, dh), w.k_norm, cfg.rms_eps)
    v = w.v(a).reshape(t_new, hkv, dh)
    q = rope.apply(q, positions)
    k = rope.apply(k, positions)

    n_past = cache.length
    cache.append(k, v)
    hook = _mask_hook.get()
    o = attend_stored(q, cache, n_past, dh, None if hook is None else hook(w, q, cache, n_past))
    return w.out(o.reshape(t_new, h * dh) * sigmoid(gate))


# Per-head attention masks (sparse prefill, engine.sparse): called with the layer's weights, the new
# queries, the cache (already holding the new rows) and n_past; returns bool [H, T, S] or None (dense).
MaskHook = Callable[[AttentionWeights, np.ndarray, KVCache, int], np.ndarray | None]
_mask_hook: ContextVar[MaskHook | None] = ContextVar("attention_mask_hook", default=None)


@contextmanager
def attention_masks(hook: MaskHook) -> Iterator[None]:
    """Within the block, every gated attention asks `hook` for extra masks (default: none, dense)."""
    token = _mask_hook.set(hook)
    try:
        yield
    finally:
        _mask_hook.reset(token)


def attend_stored(
    q: np.ndarray, cache: KVCache, n_past: int, head_dim: int, allowed: np.ndarray | None = None,
    key_parts: int = 1,
) -> np.ndarray:
    """softmax(q·Kᵀ/√Dh, causal)·V over the cache's stored rows, in the codecs' domains: o [T, H, Dh].

    q [T, H, Dh] are the new tokens' queries (rows n_past.. of the cache are theirs); query head h
    reads KV head h // G (HF repeat_kv). `allowed` [H, T, S] further masks each head (sparse
    attention); every row must keep at least one visible key. None (or all True) is exact dense.
    `key_parts` > 1 sums the softmax denominator and the value rows over that many key ranges, then adds
    the parts (the same math in another fp32 order, as the card's context splits: tests/teeth.py's floor).
    """
    t_new, h = q.shape[:2]
    keys, values = cache.key_domain(), cache.value_domain()  # [S, Hkv, domain width]
    hkv = keys.shape[1]
    group = h // hkv
    qd = cache.k_codec.to_domain(q)
    qh = qd.reshape(t_new, hkv, group, -1).transpose(1, 2, 0, 3)  # [Hkv, G, T, Wk]
    scores = (qh @ keys.transpose(1, 2, 0)[:, None]) * np.float32(head_dim**-0.5)  # [Hkv, G, T, S]
    visible = np.arange(cache.length)[None, :] <= (n_past + np.arange(t_new))[:, None]  # [T, S]
    if allowed is not None:
        visible = visible & allowed.reshape(hkv, group, t_new, cache.length)
    scores = np.where(visible, scores, -np.inf)
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    cuts = np.linspace(0, cache.length, key_parts + 1).astype(int)
    parts = list(zip(cuts[:-1], cuts[1:]))
    probs /= sum(probs[..., a:b].sum(axis=-1, keepdims=True) for a, b in parts)
    vt = values.transpose(1, 0, 2)[:, None]
    o = sum(probs[..., a:b] @ vt[..., a:b, :] for a, b in parts)  # [Hkv, G, T, Wv]
    return cache.v_codec.from_domain(o.transpose(2, 0, 1, 3).reshape(t_new, h, -1))
