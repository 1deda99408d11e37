"""`rigllm debug compare` and the hidden-row capture behind it, on the CPU: the reference's two modes side by
side, and planted one-layer bugs that the report must name by layer and sub-step."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

from engine.commands.debug import ReferenceSide, compare
from engine.reference.hidden_trace import HiddenTrace, tracing
from engine.gguf.loader import load_model
from engine.reference.activation_rounding import ActivationRounding
from engine.reference.layer_replay import replay_layers
from engine.reference.model import ReferenceModel
from tests.teeth import FIXTURE_Q8

KERNEL = ActivationRounding.KERNEL


@pytest.fixture(scope="module")
def loaded():
    return load_model(FIXTURE_Q8)


@pytest.fixture(scope="module")
def prompt(loaded):
    return np.random.default_rng(3).integers(0, loaded.config.vocab_size, 150).tolist()


class _QueryShift:
    """A rope that rotates every other call (the queries: attention rotates q, then k) one position late."""

    def __init__(self, rope):
        self.rope, self.calls = rope, 0

    def apply(self, x, positions):
        self.calls += 1
        return self.rope.apply(x, positions + 1 if self.calls % 2 else positions)


def _with_wrong_query_rope(model: ReferenceModel, layer: int) -> None:
    model.blocks[layer].rope = _QueryShift(model.rope)


def _with_flipped_decay(model: ReferenceModel, layer: int) -> None:
    mixer = model.blocks[layer].mixer
    model.blocks[layer].mixer = dataclasses.replace(mixer, a=-mixer.a)


def _with_scaled_ffn_norm(model: ReferenceModel, layer: int) -> None:
    model.blocks[layer].ffn_norm = model.blocks[layer].ffn_norm * np.float32(1.25)


@pytest.mark.parametrize("plant, layer, step", [(_with_wrong_query_rope, 3, "mixer"), (_with_flipped_decay, 1, "mixer"),
                                                (_with_scaled_ffn_norm, 2, "ffn")])
def test_a_planted_one_layer_bug_is_named_by_layer_and_sub_step(loaded, prompt, plant, layer, step):
    """The same kernel-mode reference on both sides except one planted bug: everything before the bug's place
    agrees exactly, and the report names that place first."""
    buggy = ReferenceSide(loaded, KERNEL)
    with np.errstate(all="ignore"):  # a flipped decay grows the state without bound
        plant(buggy.model, layer)
        report = compare(ReferenceSide(loaded, KERNEL), buggy, prompt, 6, threshold=1e-6)
    first = report.first_over
    print(report.render())
    assert first is not None and (first.layer, first.step) == (layer, step), report.render()
    at = [(p.layer, p.step) for p in report.places].index((layer, step))
    assert all(p.worst == 0.0 for p in report.places[:at])


def test_layer_local_replay_isolates_the_bug_in_its_own_layer(loaded, prompt):
    """Replaying every block on the buggy run's own inputs: only the buggy block differs, the later ones agree
    (whole-model differences spread to every later layer; these do not)."""
    buggy = ReferenceSide(loaded, KERNEL)
    _with_scaled_ffn_norm(buggy.model, 1)
    feeds = [prompt[:100], prompt[100:103]] + [[t] for t in prompt[103:120]]
    for chunk in feeds:
        buggy.feed(chunk)
    clean = ReferenceModel.from_model_file(loaded.file, rounding=KERNEL)
    replay = replay_layers(clean, buggy.trace, feeds)
    for layer, step in buggy.trace.places():
        diff = np.abs(buggy.trace.rows(layer, step) - replay.rows(layer, step)).max()
        assert (diff > 1e-3) == ((layer, step) == (1, "ffn")), f"layer {layer} {step}: {diff:.3e}"


def test_the_trace_holds_every_feed_in_order(loaded, prompt):
    model = ReferenceModel.from_model_file(loaded.file, rounding=KERNEL)
    trace, state = HiddenTrace(), model.new_state()
    with tracing(trace):
        model.forward(prompt[:40], state)
        model.forward(prompt[40:41], state)
    model.forward(prompt[41:42], state)  # no trace active: nothing recorded
    assert trace.places() == [(i, s) for i in range(loaded.config.n_layers) for s in ("norm", "mixer", "ffn")]
    assert all(trace.rows(*p).shape == (41, loaded.config.d_model) for p in trace.places())


def test_cli_compares_the_reference_modes_as_json(loaded):
    result = subprocess.run(
        [sys.executable, "-m", "engine.cli", "debug", "compare", str(FIXTURE_Q8), "--backend", "reference",
         "--steps", "3", "--json", "--threshold", "1.0"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert len(report["places"]) == 3 * loaded.config.n_layers
    assert report["places"][0] == {"layer": 0, "step": "norm", "worst": 0.0, "worst_token": 0, "median": 0.0}
    # exact fp32 against Q8_1-rounded matmul inputs: about 1/254 of a block's largest value per rounding
    assert all(0 < p["worst"] < 0.5 for p in report["places"][1:])
    assert report["logits"]["feeds"] == 4 and report["first_over"] is None


def test_cli_refuses_an_unknown_kv_format():
    result = subprocess.run([sys.executable, "-m", "engine.cli", "debug", "compare", str(FIXTURE_Q8), "--backend",
                             "reference", "--kv", "k9v9"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "k9v9" in result.stderr
