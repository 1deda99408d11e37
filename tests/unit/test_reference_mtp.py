"""The MTP drafter head (spec §6.10). transformers has no MTP implementation (it drops `mtp.*`
weights), so there is no external truth: these tests check shapes, the cache discipline (its own KV
cache, never the trunk's), batch/step consistency, and the first row against the formula written
out by hand (with an empty cache, attention over one key returns that key's value)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.reference import ReferenceModel
from engine.reference.activations import sigmoid, silu
from reference_fixtures import (
    SHAPES,
    gguf_weights,
    max_relative_error,
    model_config,
    perturbed_model,
    random_mtp_tensors,
    random_tokens,
)

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def setup():
    model = perturbed_model(SHAPES[1], seed=0)  # untied, H/Hkv = 2
    cfg = model_config(model, n_mtp=1)
    weights = gguf_weights(model, cfg, random_mtp_tensors(model, seed=7))
    return cfg, weights, ReferenceModel(cfg, weights)


def rms(x, w, eps=1e-6):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def test_head_loaded_and_trunk_unchanged(setup):
    cfg, weights, ref = setup
    assert len(ref.mtp) == 1 and ref.mtp[0].block.index == cfg.n_layers
    trunk_only = {k: v for k, v in weights.items() if not k.startswith(f"blk.{cfg.n_layers}.")}
    no_mtp = ReferenceModel(cfg, trunk_only)
    assert no_mtp.mtp == []
    tokens = random_tokens(20, cfg.vocab_size, seed=1)
    np.testing.assert_array_equal(ref.forward(tokens, ref.new_state()), no_mtp.forward(tokens, no_mtp.new_state()))


def test_shapes_and_own_cache(setup):
    cfg, _, ref = setup
    tokens = random_tokens(41, cfg.vocab_size, seed=2)
    state = ref.new_state()
    hidden = ref.forward_hidden(tokens[:40], state)
    trunk = state.snapshot()
    logits, out = ref.mtp[0].forward(hidden, tokens[1:41], state)
    assert logits.shape == (40, cfg.vocab_size) and out.shape == (40, cfg.d_model)
    assert state.mtp[0].kv.length == 40 and state.mtp[0].next_position == 40
    after = state.snapshot()
    for (k0, v0), (k1, v1) in zip(trunk.kv, after.kv):
        np.testing.assert_array_equal(k0, k1)
        np.testing.assert_array_equal(v0, v1)
    assert after.n_tokens == trunk.n_tokens == 40
    drafted, _ = ref.mtp[0].forward(out[-1:], [int(np.argmax(logits[-1]))], state)  # chained draft step
    assert drafted.shape == (1, cfg.vocab_size) and state.mtp[0].kv.length == 41


def test_batch_equals_steps_and_cache_matters(setup):
    cfg, _, ref = setup
    tokens = random_tokens(31, cfg.vocab_size, seed=3)
    hidden = ref.forward_hidden(tokens[:30], ref.new_state())
    batch_state, step_state = ref.new_state(), ref.new_state()
    batch, _ = ref.mtp[0].forward(hidden, tokens[1:31], batch_state)
    steps = np.concatenate([ref.mtp[0].forward(hidden[i : i + 1], tokens[i + 1 : i + 2], step_state)[0] for i in range(30)])
    assert max_relative_error(steps, batch) < 1e-4
    alone, _ = ref.mtp[0].forward(hidden[-1:], tokens[30:31], ref.new_state(), positions=[29])
    assert max_relative_error(alone, batch[-1:]) > 1e-2  # the last row really attends to the cached rows


def test_first_row_matches_formula(setup):
    cfg, w, ref = setup
    L, h, hkv, dh = cfg.n_layers, cfg.n_head, cfg.n_head_kv, cfg.head_dim
    p = f"blk.{L}."
    tokens = random_tokens(2, cfg.vocab_size, seed=4)
    hidden = ref.forward_hidden(tokens[:1], ref.new_state())
    logits, _ = ref.mtp[0].forward(hidden, tokens[1:2], ref.new_state())

    e = rms(w["token_embd.weight"][tokens[1]], w[p + "nextn.enorm.weight"])
    hh = rms(hidden[0], w[p + "nextn.hnorm.weight"])
    z = w[p + "nextn.eh_proj.weight"] @ np.concatenate([e, hh])
    a = rms(z, w[p + "attn_norm.weight"])
    gate = (w[p + "attn_q.weight"] @ a).reshape(h, 2, dh)[:, 1].reshape(-1)
    v = (w[p + "attn_v.weight"] @ a).reshape(hkv, dh)
    attn = np.repeat(v, h // hkv, axis=0).reshape(-1)  # softmax over a single key = 1
    z = z + w[p + "attn_output.weight"] @ (attn * sigmoid(gate))
    f = rms(z, w[p + "post_attention_norm.weight"])
    z = z + w[p + "ffn_down.weight"] @ (silu(w[p + "ffn_gate.weight"] @ f) * (w[p + "ffn_up.weight"] @ f))
    expected = w["output.weight"] @ rms(z, w[p + "nextn.shared_head_norm.weight"])
    assert max_relative_error(logits, expected[None]) < 1e-5
