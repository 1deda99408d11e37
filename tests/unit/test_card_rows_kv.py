"""Layer-local replays over a run's own stored K/V rows (engine.reference.staged_kv.CardRowsKV), on the CPU with the
reference standing in for the card: a replay of a run over that run's rows gives its rows back exactly and finds no
stored value different, and a run whose keys are rotated one position late in one attention layer is caught by the
stored values alone (tests/teeth.py check_layer_local)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.commands.debug import ReferenceSide, compare
from engine.fixtures.demo_model import ensure_demo_model
from engine.generation.hidden_compare import row_differences
from engine.gguf.loader import load_model
from engine.reference.activation_rounding import ActivationRounding
from engine.reference.hidden_trace import HiddenTrace
from engine.reference.layer_replay import replay_layers
from engine.reference.staged_kv import STORED_KV_DIFFERING_BOUND, CardRowsKV, card_rows_caches
from tests.teeth import LocalDiffs, check_layer_local, feeds, kernel_reference, reference_local_floor

KV = "k8v4"
PREFILL = 40


class _LateKeys:
    """A rope that rotates keys (attention's second call of each pass) one position late."""

    def __init__(self, rope):
        self.rope, self.calls = rope, 0

    def apply(self, x, positions):
        self.calls += 1
        return self.rope.apply(x, positions + 1 if self.calls % 2 == 0 else positions)


@pytest.fixture(scope="module")
def demo():
    loaded = load_model(ensure_demo_model())
    tokens = np.random.default_rng(3).integers(0, loaded.config.vocab_size, 70).tolist()
    return loaded, kernel_reference(loaded), tokens


def traced_run(loaded, model, tokens) -> tuple[HiddenTrace, dict]:
    """The model's trace over the feeds of `tokens` and its attention layers' stored rows."""
    side = ReferenceSide(loaded, ActivationRounding.KERNEL, KV, model=model)
    for chunk in feeds(tokens, PREFILL, (1, 3, 9)):
        side.feed(chunk)
    return side.trace, side.stored_kv()


def test_a_replay_over_the_runs_own_rows_gives_its_rows_back(demo):
    loaded, model, tokens = demo
    trace, stored = traced_run(loaded, model, tokens)
    cfg = model.cfg
    caches = card_rows_caches(cfg, KV, stored)
    assert caches, "the demo model has attention layers"
    replay = replay_layers(model, trace, feeds(tokens, PREFILL, (1, 3, 9)), KV, caches)
    for place in trace.places():
        assert not row_differences(trace.rows(*place), replay.rows(*place)).any(), place
    assert all(c.differing == 0 and c.compared == 2 * len(tokens) * cfg.n_head_kv * cfg.head_dim
               for c in caches.values())


def test_keys_rotated_late_in_one_layer_fail_on_the_stored_values(demo):
    loaded, model, tokens = demo
    layer = next(i for i, block in enumerate(model.blocks) if not block.is_gdn)
    buggy = kernel_reference(loaded)
    buggy.blocks[layer].rope = _LateKeys(buggy.rope)
    trace, stored = traced_run(loaded, buggy, tokens)
    diffs = LocalDiffs.empty()
    diffs.add(model, trace, feeds(tokens, PREFILL, (1, 3, 9)), KV, stored)
    assert diffs.kv_differing_share(layer) > 3 * STORED_KV_DIFFERING_BOUND  # keys only, and only the rotated dims
    floor = reference_local_floor(loaded, model, [tokens], KV, PREFILL, over_stored_kv=True)
    with pytest.raises(AssertionError, match=f"layer {layer}'s stored K/V differ"):
        check_layer_local("late keys", diffs, floor)


def test_the_card_must_have_stored_every_replayed_row(demo):
    loaded, model, tokens = demo
    _, stored = traced_run(loaded, model, tokens[:PREFILL])
    k, v = next(iter(stored.values()))
    cache = CardRowsKV(model.cfg.n_head_kv, model.cfg.head_dim, KV, k, v)
    rows = np.zeros((PREFILL + 1, model.cfg.n_head_kv, model.cfg.head_dim), np.float32)
    with pytest.raises(ValueError, match=f"the card stored {PREFILL} rows, the replay reached {PREFILL + 1}"):
        cache.append(rows, rows)


def test_debug_compare_layer_local_names_the_layer_whose_stored_keys_differ(demo):
    """`rigllm debug compare --layer-local` replays over the other side's K/V rows: keys rotated late in one layer
    leave every row the same (the replay attends over the same keys) and show in that layer's stored share alone."""
    loaded, _, tokens = demo
    baseline, other = (ReferenceSide(loaded, ActivationRounding.KERNEL, KV) for _ in range(2))
    layer = next(i for i, block in enumerate(other.model.blocks) if not block.is_gdn)
    other.model.blocks[layer].rope = _LateKeys(other.model.rope)
    report = compare(baseline, other, tokens[:PREFILL], 6, threshold=1e-2, layer_local=True, kv=KV)
    print(report.render())
    assert report.first_over is None and report.stored_kv_over == [layer]
    assert report.as_dict()["stored_kv"]["over"] == [layer] and f"layers over 0.03: {layer}" in report.render()
