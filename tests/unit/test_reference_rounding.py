"""ActivationRounding.KERNEL: Q8_1 rounding of matmul inputs (contracts.md "Numerics and comparisons")."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from engine.reference import ActivationRounding, ReferenceModel
from engine.reference.activation_rounding import round_q8_1
from reference_fixtures import SHAPES, gguf_weights, model_config, perturbed_model, random_tokens


def test_block_rounding_by_hand():
    """amax 127 → d = 1 exactly (fp16-representable): q = roundf(x), halves away from zero."""
    x = np.zeros(32, np.float32)
    x[:6] = [127.0, -63.5, 0.5, 2.5, -2.5, 1.49]
    np.testing.assert_array_equal(round_q8_1(x)[:6], [127.0, -64.0, 1.0, 3.0, -3.0, 1.0])
    assert not round_q8_1(x)[6:].any()


def test_scale_is_stored_as_fp16():
    x = np.full(32, 1.0, np.float32)
    d16 = np.float32(np.float16(np.float32(1.0) / np.float32(127.0)))
    assert d16 != np.float32(1.0 / 127.0)
    np.testing.assert_array_equal(round_q8_1(x), np.full(32, 127 * d16, np.float32))


def test_blocks_are_independent_and_tail_is_padded():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 40)).astype(np.float32)
    x[:, 32:] *= 0.01  # a small tail block gets its own fine scale
    r = round_q8_1(x)
    assert r.shape == x.shape and r.dtype == np.float32
    np.testing.assert_array_equal(r[:, :32], round_q8_1(x[:, :32]))
    np.testing.assert_array_equal(r[:, 32:], round_q8_1(np.pad(x[:, 32:], ((0, 0), (0, 24))))[:, :8])
    assert not round_q8_1(np.zeros((2, 32), np.float32)).any()


def test_error_bound():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((64, 256)) * rng.uniform(0.01, 100, (64, 1))).astype(np.float32)
    blocks = np.abs(x.reshape(64, 8, 32))
    d = blocks.max(-1, keepdims=True) / np.float32(127)
    d16 = d.astype(np.float16).astype(np.float32)
    bound = d16 / 2 + 127 * np.abs(d16 - d) + 1e-6 * blocks.max(-1, keepdims=True)
    assert (np.abs(round_q8_1(x) - x).reshape(64, 8, 32) <= bound).all()


@pytest.fixture(scope="module")
def setup():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = perturbed_model(SHAPES[0], seed=0)
    cfg = model_config(model)
    return cfg, gguf_weights(model, cfg), random_tokens(100, cfg.vocab_size, seed=6)


def per_position_error(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.max(np.abs(a - b), axis=-1) / np.max(np.abs(b), axis=-1)


def logits_pair(cfg, weights, tokens, n_layers: int):
    """(KERNEL, EXACT) logits of the model truncated to its first `n_layers` blocks."""
    cfg = dataclasses.replace(cfg, n_layers=n_layers, is_recurrent=cfg.is_recurrent[:n_layers])
    kernel = ReferenceModel(cfg, weights, ActivationRounding.KERNEL)
    exact = ReferenceModel(cfg, weights)
    return kernel.forward(tokens, kernel.new_state()), exact.forward(tokens, exact.new_state())


def test_one_block_changes_logits_a_little(setup):
    """First block only (a GDN layer) plus the LM head: max relative logit change ≈ 0.03 (bound 0.05)."""
    kernel, exact = logits_pair(*setup, n_layers=1)
    err = per_position_error(kernel, exact)
    assert 1e-3 < err.max() < 0.05
    assert (np.argmax(kernel, -1) == np.argmax(exact, -1)).all()


def test_whole_model_changes_are_bounded_and_deterministic(setup):
    """All 6 layers: median relative logit change per position ≈ 0.075 (bound 0.15), worst ≈ 0.4, top-1
    equal at 93% (bound 85%). Random tiny GDN models amplify small input changes (the delta rule
    writes the difference v − Sᵀk): a 0.5% random change of the embeddings alone moves the exact
    logits by up to 70%, so the depth-wise growth here is the model's, not the rounding's."""
    cfg, weights, tokens = setup
    kernel, exact = logits_pair(cfg, weights, tokens, n_layers=cfg.n_layers)
    model = ReferenceModel(cfg, weights, ActivationRounding.KERNEL)
    np.testing.assert_array_equal(model.forward(tokens, model.new_state()), kernel)
    assert np.median(per_position_error(kernel, exact)) < 0.15
    assert np.mean(np.argmax(kernel, -1) == np.argmax(exact, -1)) >= 0.85


def test_fp32_weights_are_not_rounded(setup):
    cfg, weights, tokens = setup
    every_matmul = [name for name, w in weights.items() if w.ndim == 2 and "conv1d" not in name]
    model = ReferenceModel(cfg, weights, ActivationRounding.KERNEL, fp32_weights=every_matmul)
    exact = ReferenceModel(cfg, weights)
    np.testing.assert_array_equal(model.forward(tokens, model.new_state()), exact.forward(tokens, exact.new_state()))
