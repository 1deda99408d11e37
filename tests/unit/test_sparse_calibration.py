"""Sparse calibration and the profile applied to the reference forward (engine/sparse, calibrate-sparse).

Runs on the trained fixture (tests/fixtures/trained: one attention layer of 4 heads; its attention is
trained, so some heads are local enough for A-shape / vertical-slash at a loose tolerance) over 512
tokens of the demo corpus in blocks of 32 (16 blocks). At tolerance 0.1 two heads go sparse (measured
errors 0.06) and two stay dense, at 0.3 all four go sparse (measured errors 0.24–0.29).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np
import pytest

from engine.commands import calibrate_sparse
from engine.generation.demo_corpus import DEMO_CORPUS
from engine.generation.tokenizer import Tokenizer
from engine.gguf.loader import load_model
from engine.reference.model import ReferenceModel
from engine.reference.sparse_attention import DENSE, Pattern
from engine.sparse.calibrate import calibrate, measure
from engine.sparse.profile import (
    HeadChoice,
    SparseProfile,
    load_profile,
    model_identity,
    profile_path,
)
from engine.reference.sparse_prefill import sparse_prefill

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "trained" / "fixture-f32.gguf"
BLOCK, N_TOKENS = 32, 512


@pytest.fixture(scope="module")
def fixture_model():
    loaded = load_model(str(FIXTURE))
    ids = Tokenizer.from_model_file(loaded.file).encode("".join(DEMO_CORPUS), parse_special=False)
    return ReferenceModel.from_model_file(loaded.file), ids[:N_TOKENS], model_identity(loaded.file)


def test_tolerance_zero_keeps_every_head_dense(fixture_model):
    model, tokens, _ = fixture_model
    chosen = calibrate(model, tokens, BLOCK, 0.0)
    assert set(chosen) == {3}
    assert all(c.pattern == DENSE and c.error == 0.0 and c.density == 1.0 for c in chosen[3])


def test_loose_tolerance_picks_sparse_patterns_whose_error_stays_within_it(fixture_model):
    model, tokens, _ = fixture_model
    tol = 0.3
    chosen = calibrate(model, tokens, BLOCK, tol)
    heads = chosen[3]
    assert sum(c.pattern != DENSE for c in heads) >= 2
    assert all(c.error <= tol and c.density < 1.0 for c in heads if c.pattern != DENSE)
    # re-measure the chosen profile as one set: the same per-head errors, all within the tolerance
    again = measure(model, tokens, BLOCK, lambda _layer, _heads: [[c.pattern for c in heads]])[3]
    np.testing.assert_allclose(again.errors[0], [c.error for c in heads], rtol=1e-6, atol=1e-7)
    assert (again.errors[0] <= tol).all()
    np.testing.assert_allclose(again.densities[0], [c.density for c in heads])


def test_a_looser_tolerance_never_costs_more(fixture_model):
    model, tokens, _ = fixture_model
    cost = [sum(c.density for c in calibrate(model, tokens, BLOCK, tol)[3]) for tol in (0.1, 0.3, 10.0)]
    assert cost[0] >= cost[1] >= cost[2]
    assert cost[2] < cost[0]


def test_kinds_restrict_the_choice_to_a_shape(fixture_model):
    """What the GPU with a quantised KV cache needs (its sparse kernel serves A-shape and dense heads)."""
    model, tokens, _ = fixture_model
    heads = calibrate(model, tokens, BLOCK, 10.0, kinds={"a_shape"})[3]
    assert all(c.pattern.kind == "a_shape" for c in heads)  # at tolerance 10 every head goes sparse


def profile_of(identity: str, patterns: list[Pattern], min_length: int) -> SparseProfile:
    return SparseProfile(identity, BLOCK, min_length, 0.3, N_TOKENS, {3: [HeadChoice(p, 0.0, 1.0) for p in patterns]})


def logits(model: ReferenceModel, tokens, profile: SparseProfile | None) -> np.ndarray:
    state = model.new_state()
    if profile is None:
        return model.forward(tokens, state)
    with sparse_prefill(model, profile):
        return model.forward(tokens, state)


def test_profile_applies_to_prefill_from_its_minimum_length_and_full_budget_is_dense(fixture_model):
    model, tokens, identity = fixture_model
    dense = logits(model, tokens, None)
    sparse = [Pattern("a_shape", sink=1, window=2)] * 4
    assert not np.array_equal(logits(model, tokens, profile_of(identity, sparse, 0)), dense)
    assert np.array_equal(logits(model, tokens, profile_of(identity, sparse, N_TOKENS + 1)), dense)
    n_blocks = N_TOKENS // BLOCK
    full = [Pattern("a_shape", sink=0, window=n_blocks), Pattern("block_topk", topk=n_blocks),
            Pattern("vertical_slash", vertical=n_blocks, slash=0), DENSE]
    assert np.array_equal(logits(model, tokens, profile_of(identity, full, 0)), dense)


def test_decode_steps_stay_dense_under_a_profile(fixture_model):
    model, tokens, identity = fixture_model
    state = model.new_state()
    model.forward(tokens[:200], state)
    snap = state.snapshot()
    plain = model.forward(tokens[200:201], state)
    state.restore(snap)
    with sparse_prefill(model, profile_of(identity, [Pattern("a_shape", sink=1, window=1)] * 4, 0)):
        hooked = model.forward(tokens[200:201], state)
    assert np.array_equal(hooked, plain)


def run_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    calibrate_sparse.register(parser.add_subparsers())
    args = parser.parse_args(["calibrate-sparse", *argv])
    return args.func(args)


def test_command_writes_a_profile_beside_the_model_keyed_to_it(tmp_path, capsys):
    model_path = tmp_path / "fixture.gguf"
    shutil.copy(FIXTURE, model_path)
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("".join(DEMO_CORPUS), encoding="utf-8")
    argv = [str(model_path), "--prompt-file", str(prompt), "--tokens", str(N_TOKENS), "--block", str(BLOCK),
            "--tolerance", "0.3", "--min-length", "1024"]
    assert run_command(argv) == 0
    out = capsys.readouterr().out
    assert "heads sparse at tolerance 0.3" in out and "layer   3 head   0" in out
    profile = load_profile(profile_path(model_path), model_identity(load_model(str(model_path)).file))
    assert profile is not None
    assert (profile.block, profile.min_length, profile.calibration_tokens) == (BLOCK, 1024, N_TOKENS)
    assert len(profile.layers[3]) == 4 and any(c.pattern != DENSE for c in profile.layers[3])
