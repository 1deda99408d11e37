"""Reference attention over quantised KV caches (engine/reference/{attention,state}.py).

* Storage-domain attention (q rotated once, scores against stored centroids x norms, values summed
  in the rotated domain, output un-rotated once) equals plain float64 attention over the decoded
  cache: the rotation is orthogonal, so only fp32 rounding separates them (tolerance 1e-5 of max|o|).
* The demo model (random weights, engine/fixtures/demo_model.py) runs with every format; its logits stay
  near the exact cache's. Bounds are ~2x the measured values over 200 tokens (max relative logit
  error k8v8 0.007, 4-bit 0.072, 3-bit 0.13; KL ≤ 1.3e-3 nats) — random weights say nothing about
  quality (contracts.md), these only catch a broken codec path. A key/value swap or a missing
  un-rotation gives errors of order 1.
* Snapshots keep the stored codes, so restore is bit-exact (no re-encoding).
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.model.kv_formats import KV_FORMATS
from engine.fixtures.demo_model import ensure_demo_model
from engine.gguf.loader import load_model
from engine.reference import ReferenceModel
from engine.reference.attention import attend_stored
from engine.reference.state import KVCache, SequenceState

QUANTISED = [name for name in KV_FORMATS if name != "f16"] + ["k16v3", "k3v8"]
LOGIT_BOUND = {"k8v8": 0.015, "k16v3": 0.25, "k3v8": 0.25}  # others: by V (or K) bits below


def plain_attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, n_past: int) -> np.ndarray:
    """float64 softmax attention of q [T, H, Dh] over decoded keys/values [S, Hkv, Dh] (causal from n_past)."""
    t, h, dh = q.shape
    group = h // keys.shape[1]
    kv_of = np.arange(h) // group
    s = np.einsum("thd,shd->ths", q.astype(np.float64), keys[:, kv_of].astype(np.float64)) / np.sqrt(dh)
    visible = np.arange(keys.shape[0])[None, None, :] <= (n_past + np.arange(t))[:, None, None]
    s = np.where(visible, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("ths,shd->thd", p, values[:, kv_of].astype(np.float64))


@pytest.mark.parametrize("fmt", ["f16"] + QUANTISED)
@pytest.mark.parametrize("head_dim, n_head, n_head_kv", [(256, 6, 1), (64, 4, 2), (32, 8, 2)])
def test_storage_domain_attention_equals_decode_then_attend(fmt, head_dim, n_head, n_head_kv):
    rng = np.random.default_rng(head_dim)
    cache = KVCache(n_head_kv, head_dim, fmt)
    cache.append(rng.standard_normal((40, n_head_kv, head_dim)).astype(np.float32),
                 (3 * rng.standard_normal((40, n_head_kv, head_dim))).astype(np.float32))
    n_past = cache.length
    cache.append(rng.standard_normal((5, n_head_kv, head_dim)).astype(np.float32),
                 rng.standard_normal((5, n_head_kv, head_dim)).astype(np.float32))
    q = (2 * rng.standard_normal((5, n_head, head_dim))).astype(np.float32)
    got = attend_stored(q, cache, n_past, head_dim)
    want = plain_attention(q, cache.keys, cache.values, n_past)
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))


def test_exact_cache_keeps_fp32_rows():
    rng = np.random.default_rng(0)
    k, v = rng.standard_normal((2, 3, 2, 64)).astype(np.float32)
    cache = KVCache(2, 64)
    cache.append(k, v)
    assert cache.format.name == "f16" and cache.keys.dtype == np.float32
    np.testing.assert_array_equal(cache.keys, k)
    np.testing.assert_array_equal(cache.values, v)
    assert len(cache.stored()) == 2


@pytest.fixture(scope="module")
def demo():
    ref = ReferenceModel.from_model_file(load_model(ensure_demo_model()).file)
    tokens = np.random.default_rng(7).integers(0, ref.cfg.vocab_size, 200)
    return ref, tokens, ref.forward(tokens, SequenceState(ref.cfg))


def _bound(fmt: str) -> float:
    if fmt in LOGIT_BOUND:
        return LOGIT_BOUND[fmt]
    return 0.15 if "4" in fmt else 0.25


@pytest.mark.parametrize("fmt", QUANTISED)
def test_demo_model_runs_close_to_the_exact_cache(demo, fmt):
    ref, tokens, exact = demo
    state = SequenceState(ref.cfg, kv_format=fmt)
    logits = np.concatenate([ref.forward(tokens[:150], state), ref.forward(tokens[150:], state)])
    rel = np.max(np.abs(logits - exact)) / np.max(np.abs(exact))
    assert 1e-4 < rel < _bound(fmt)  # quantisation must change something, and not much
    assert state.kv_format.name == fmt and all(c.format.name == fmt for c in state.kv.values())


def test_snapshot_restores_stored_codes_exactly(demo):
    ref, tokens, _ = demo
    state = SequenceState(ref.cfg, kv_format="k8v3")
    ref.forward(tokens[:60], state)
    snap = state.snapshot()
    after = ref.forward(tokens[60:64], state)
    state.restore(snap)
    again = ref.forward(tokens[60:64], state)
    np.testing.assert_array_equal(again, after)
    assert len(snap.kv[0]) == 4 and snap.kv[0][0].dtype == np.int8 and snap.kv[0][2].dtype == np.uint8
    with pytest.raises(ValueError, match="k8v3 KV cache"):
        SequenceState(ref.cfg, kv_format="k3v3").restore(snap)
