"""Sequence state: chunked prefill vs token-by-token decode, uneven batch splits, snapshot/restore.

The token-by-token run uses only the recurrent delta rule and single-row attention; a prefill uses
the chunked form and multi-token causal attention starting from whatever the state holds. They
must agree to fp32 noise: tolerance 1e-4 in `max_relative_error` (measured ≤ 1.2e-5, the size of
transformers' own fp32-vs-fp64 gap on this random 7-layer model). A wrong
initial state or conv carry-over shows up as O(1) errors. The delta-rule algebra itself is checked
more tightly in test_reference_delta_rule.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from reference_fixtures import SHAPES, max_relative_error, perturbed_model, random_tokens, reference_for

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOLERANCE = 1e-4
SEQ_LEN = 205
N_DECODE = 3


@pytest.fixture(scope="module")
def ref():
    return reference_for(perturbed_model(SHAPES[1], seed=0))  # v-heads per k-head 2, untied, 7 layers


@pytest.fixture(scope="module")
def tokens(ref):
    return random_tokens(SEQ_LEN, ref.cfg.vocab_size, seed=5)


@pytest.fixture(scope="module")
def stepwise(ref, tokens):
    """Logits of the whole sequence fed one token at a time (recurrent path only)."""
    state = ref.new_state()
    return np.concatenate([ref.forward(tokens[i : i + 1], state) for i in range(SEQ_LEN)])


def run_batches(ref, tokens, sizes):
    state = ref.new_state()
    out, start = [], 0
    for size in sizes:
        out.append(ref.forward(tokens[start : start + size], state))
        start += size
    return np.concatenate(out), state


@pytest.mark.parametrize("prompt_len", [1, 63, 64, 65, 200])
def test_prefill_then_decode_equals_token_by_token(ref, tokens, stepwise, prompt_len):
    logits, state = run_batches(ref, tokens, [prompt_len] + [1] * N_DECODE)
    n = prompt_len + N_DECODE
    assert max_relative_error(logits, stepwise[:n]) < TOLERANCE
    assert state.n_tokens == n and state.next_position == n


@pytest.mark.parametrize("sizes", [(37, 100, 63), (1, 2, 1, 60, 2, 130)], ids=str)
def test_uneven_batches_equal_one_batch(ref, tokens, sizes):
    """Later batches continue the cached GDN state (chunked form from S₀ ≠ 0) and a conv state that
    batches shorter than Kc−1 only partly replace."""
    n = sum(sizes)
    split, split_state = run_batches(ref, tokens, sizes)
    whole, whole_state = run_batches(ref, tokens, [n])
    assert max_relative_error(split, whole) < TOLERANCE
    for i, layer in whole_state.gdn.items():
        np.testing.assert_allclose(split_state.gdn[i].recurrent, layer.recurrent, atol=1e-4)
        np.testing.assert_allclose(split_state.gdn[i].conv, layer.conv, atol=1e-4)
    for i, cache in whole_state.kv.items():
        np.testing.assert_allclose(split_state.kv[i].keys, cache.keys, atol=1e-4)


def test_fresh_state_is_zero(ref):
    state = ref.new_state()
    assert state.n_tokens == 0 and state.next_position == 0
    assert sorted(state.kv) == ref.cfg.attention_layers and sorted(state.gdn) == ref.cfg.gdn_layers
    assert all(c.length == 0 for c in state.kv.values())
    assert all(not s.conv.any() and not s.recurrent.any() for s in state.gdn.values())


def test_snapshot_restore_replays_identically(ref, tokens):
    state = ref.new_state()
    ref.forward(tokens[:70], state)
    snap = state.snapshot()

    def decode(seq):
        return np.concatenate([ref.forward([t], state) for t in seq])

    first = decode(tokens[70:75])
    state.restore(snap)
    decode(tokens[100:110])  # a different continuation in between must not leak into the snapshot
    state.restore(snap)
    second = decode(tokens[70:75])
    np.testing.assert_array_equal(first, second)
    assert snap.n_tokens == 70 and snap.next_position == 70


def test_snapshot_is_read_only_and_detached(ref, tokens):
    state = ref.new_state()
    ref.forward(tokens[:10], state)
    snap = state.snapshot()
    conv_before = snap.gdn[0][0].copy()
    ref.forward(tokens[10:20], state)
    np.testing.assert_array_equal(snap.gdn[0][0], conv_before)
    with pytest.raises(ValueError):
        snap.gdn[0][1][...] = 0.0
    with pytest.raises(ValueError):
        snap.kv[0][0][...] = 0.0


def test_restore_refuses_other_model_snapshot(ref):
    other = reference_for(perturbed_model(SHAPES[0], seed=0))
    with pytest.raises(ValueError):
        ref.new_state().restore(other.new_state().snapshot())


def test_forward_rejects_bad_input(ref):
    state = ref.new_state()
    with pytest.raises(ValueError):
        ref.forward([], state)
    with pytest.raises(ValueError):
        ref.forward([ref.cfg.vocab_size], state)
    with pytest.raises(ValueError):
        ref.forward([1, 2], state, positions=np.zeros((3, 3), np.int64))
    assert state.n_tokens == 0
