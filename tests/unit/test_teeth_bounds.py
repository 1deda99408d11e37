"""The issue-25 GPU tests' checks, run on the CPU with the reference standing in for the card: a numerically
equivalent run passes them, a planted one-layer bug fails them with a message naming the place.

The stand-in (`ReferenceSlots`) has the slot API the GPU tests drive (reset_slot, prefill_slot, begin, step)
and a `fwd.trace` like the CUDA ForwardPass, so tests/gpu/test_teeth_fixture.py's own helpers run here.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from engine.reference.hidden_trace import tracing
from engine.generation.slots import Pick
from engine.gguf.loader import load_model
from tests.gpu.test_teeth_fixture import slot_logits, traced_run
from tests.teeth import (
    FIXTURE_Q8,
    LocalDiffs,
    check_layer_local,
    check_whole_model,
    feeds,
    fixture_samples,
    kernel_reference,
    positions_of,
    reference_floor_logits,
    reference_local_floor,
    reference_logits,
    reference_state,
)

KV = "f16"


class ReferenceSlots:
    """One slot of the reference with the CUDA backend's slot API (logits on every pick)."""

    def __init__(self, model):
        self.model, self.fwd = model, SimpleNamespace(trace=None)

    def reset_slot(self, slot: int) -> None:
        self.state = reference_state(self.model, KV)

    def _forward(self, tokens) -> np.ndarray:
        if self.fwd.trace is None:
            return self.model.forward(tokens, self.state)[-1]
        with tracing(self.fwd.trace):
            return self.model.forward(tokens, self.state)[-1]

    def prefill_slot(self, slot: int, tokens) -> None:
        self.last = self._forward(tokens)

    def begin(self, slot: int, request, mask=None) -> Pick:
        return Pick(int(np.argmax(self.last)), self.last)

    def step(self, feeds: dict[int, int], masks=None) -> dict[int, Pick]:
        self.last = self._forward([feeds[0]])
        return {0: self.begin(0, None)}


class _DecodeQueryShift:
    """A rope that rotates one-token passes' queries (attention rotates q, then k) one position late."""

    def __init__(self, rope):
        self.rope, self.calls = rope, 0

    def apply(self, x, positions):
        self.calls += 1
        late = self.calls % 2 == 1 and len(positions) == 1
        return self.rope.apply(x, positions + 1 if late else positions)


@pytest.fixture(scope="module")
def setup():
    loaded = load_model(FIXTURE_Q8)
    samples = fixture_samples(loaded, length=420, tasks=("recall", "copy"))
    model = kernel_reference(loaded)
    want = reference_logits(model, samples, KV)
    return loaded, model, samples, want, reference_floor_logits(model, samples, KV), \
        reference_local_floor(loaded, model, samples, KV)


def run_checks(setup, stand_in) -> None:
    loaded, model, samples, want, floor, local_floor = setup
    got = slot_logits(stand_in, samples)
    check_whole_model("stand-in", got, want, floor, 0.99, positions_of(samples))
    diffs = LocalDiffs.empty()
    for tokens, trace in zip(samples, traced_run(stand_in, [stand_in.fwd], samples)):
        diffs.add(model, trace, feeds(tokens), KV)
    check_layer_local("stand-in", diffs, local_floor)


def test_a_numerically_equivalent_run_passes(setup):
    """The reference with its embeddings moved by 1e-7 relative (about one ulp): inside every bound (at this
    size the move flips few or no Q8_1 roundings, so this checks the plumbing more than the margin)."""
    loaded = setup[0]
    run_checks(setup, ReferenceSlots(kernel_reference(loaded, perturb=1e-7)))


def test_a_rope_offset_on_decode_steps_in_one_layer_fails_layer_local(setup):
    """The weakest bug measured (whole-model 1.9e-2 on the full fixture schedule): caught layer-locally at layer 3."""
    buggy = kernel_reference(setup[0])
    buggy.blocks[3].rope = _DecodeQueryShift(buggy.rope)
    with pytest.raises(AssertionError, match="layer 3 mixer|logits off"):
        run_checks(setup, ReferenceSlots(buggy))


def test_a_flipped_decay_fails(setup):
    import dataclasses

    buggy = kernel_reference(setup[0])
    mixer = buggy.blocks[1].mixer
    buggy.blocks[1].mixer = dataclasses.replace(mixer, a=-mixer.a)
    with np.errstate(all="ignore"), pytest.raises(AssertionError):
        run_checks(setup, ReferenceSlots(buggy))


def _one_place(rows: np.ndarray) -> LocalDiffs:
    return LocalDiffs({(0, "ffn"): [rows]})


def test_isolated_rounding_flips_pass_and_anything_more_fails():
    """The rule from the H200 run of 2026-12-02: correct code had single FFN rows up to 3.47e-3 over a floor
    whose own flips were smaller. Up to LOCAL_FLIP_ROWS such rows under LOCAL_FLIP_CAP pass; one more row,
    one row over the cap, a NaN, or a moved p90 fail, naming the place and the count."""
    from tests.teeth import LOCAL_FLIP_CAP, LOCAL_FLIP_ROWS

    base = np.full(160, 1e-7)
    flips = base.copy()
    flips[[24, 95, 129][:LOCAL_FLIP_ROWS]] = 3.5e-3
    assert _one_place(flips).first_over(3.2e-4, 1e-4) == "none"
    many = flips.copy()
    many[LOCAL_FLIP_ROWS + 30] = 3.5e-3
    assert f"{LOCAL_FLIP_ROWS + 1} of 160 rows over the max bound, the first: 24" in _one_place(many).first_over(3.2e-4, 1e-4)
    big = base.copy()
    big[7] = 2 * LOCAL_FLIP_CAP
    assert "layer 0 ffn" in _one_place(big).first_over(3.2e-4, 1e-4)
    nan = base.copy()
    nan[3] = np.nan
    assert "1 of 160 rows" in _one_place(nan).first_over(3.2e-4, 1e-4)
    moved = np.full(160, 2e-4)
    assert "p90 2.000e-04" in _one_place(moved).first_over(3.2e-4, 1e-4)
