"""The committed trained fixtures load, round-trip their vocabulary and still solve their tasks.

This is the check that fails when a fixture (or the converter, loader, tokenizer or reference forward
it goes through) breaks: a small deterministic sample per task, scored with the numpy reference.
The full numbers per context length are in tests/fixtures/trained/README.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from engine.errors import RigllmError
from engine.fixtures.evaluate import evaluate
from engine.fixtures.tasks import TASKS
from engine.backends import open_backend
from engine.generation.tokenizer import Tokenizer
from engine.gguf.loader import load_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "trained"
KINDS = ("f32", "q8_0")
# The committed fixture solves all three tasks: here recall 8/8, copy 7/8, arith 8/8 (F32 and Q8_0 alike),
# MTP acceptance 0.97-1.0 (README "Results").
LEARNED_TASKS = TASKS
MIN_ACCURACY = 0.85  # 8 samples at 256 tokens, seed 1: at most one wrong answer per task
MIN_MTP_ACCEPTANCE = 0.9


def fixture_path(kind: str) -> Path:
    return FIXTURES / f"fixture-{kind}.gguf"


@pytest.fixture(scope="module", params=KINDS)
def loaded_fixture(request):
    loaded = load_model(fixture_path(request.param))
    return loaded, Tokenizer.from_model_file(loaded.file), open_backend("reference", loaded)


def test_fixture_files_are_small_and_valid() -> None:
    total = 0
    for kind in KINDS:
        loaded = load_model(fixture_path(kind))
        cfg = loaded.config
        assert loaded.warnings == ()
        assert cfg.n_mtp == 1 and cfg.gdn_layers and cfg.attention_layers
        assert cfg.n_head > cfg.n_head_kv and cfg.ssm_n_v_heads > cfg.ssm_n_k_heads and cfg.rope_dims < cfg.head_dim
        total += fixture_path(kind).stat().st_size
    assert total < 8 * 2**20
    record = json.loads((FIXTURES / "fixture-train.json").read_text())
    assert record["files"] == {f"fixture-{k}.gguf": fixture_path(k).stat().st_size for k in KINDS}


def test_fixture_solves_its_tasks(loaded_fixture) -> None:
    _, tokenizer, backend = loaded_fixture
    for score in evaluate(backend, tokenizer, LEARNED_TASKS, [256], samples=8, seed=1):
        s = score.summary()
        assert s["accuracy"] >= MIN_ACCURACY, s
        assert s["mtp"]["acceptance"] >= MIN_MTP_ACCEPTANCE, s


def test_exact_kv_format_matches_default(loaded_fixture) -> None:
    _, tokenizer, backend = loaded_fixture
    default = evaluate(backend, tokenizer, TASKS, [192], samples=2, seed=2)
    f16 = evaluate(backend, tokenizer, TASKS, [192], samples=2, seed=2, kv_format="f16")
    assert [s.summary() for s in default] == [s.summary() for s in f16]


def _command(argv: list[str]) -> argparse.Namespace:
    from engine.commands import eval_fixture

    parser = argparse.ArgumentParser()
    eval_fixture.register(parser.add_subparsers())
    return parser.parse_args(["eval-fixture", *argv])


def test_eval_fixture_command(tmp_path: Path, capsys) -> None:
    out = tmp_path / "r.json"
    args = _command([str(fixture_path("q8_0")), "--lengths", "128,160", "--samples", "2", "--json", str(out)])
    assert args.func(args) == 0
    result = json.loads(out.read_text())
    assert result["setting"] == {"model": "fixture-q8_0.gguf", "backend": "reference", "kv_format": "f16", "sparse": False}
    assert [(c["task"], c["length"]) for c in result["cells"]] == [(t, n) for t in TASKS for n in (128, 160)]
    assert all(c["samples"] == 2 and 0 <= c["accuracy"] <= 1 and "mtp" in c for c in result["cells"])
    table = capsys.readouterr().out
    assert "tok/verify" in table and table.count("\n") == 2 + len(result["cells"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--task", "sort"], "unknown task"),
        (["--lengths", "64"], "below 128"),
        (["--lengths", "1k"], "comma-separated integers"),
        (["--kv-format", "k9v9"], "unknown KV format"),
    ],
)
def test_eval_fixture_errors(argv: list[str], message: str) -> None:
    args = _command([str(fixture_path("q8_0")), *argv])
    with pytest.raises(RigllmError, match=message):
        args.func(args)


def test_a_card_backend_gets_the_kv_format_and_the_evaluator_none(monkeypatch) -> None:
    """On the GPU the backend's own sequences hold the format; the reference evaluator keeps its own state."""
    import engine.fixtures.evaluate as evaluate_module
    import engine.backends as backend_module

    seen = {}

    class CardBackend:
        name = "cuda"

        def close(self) -> None:
            pass

    def fake_open(name, loaded, **options):
        seen["kv"] = options["kv"]
        return CardBackend()

    def fake_evaluate(backend, tokenizer, tasks, lengths, samples, seed, kv_format, progress):
        seen["runner_kv"] = kv_format
        return []

    monkeypatch.setattr(backend_module, "open_backend", fake_open)
    monkeypatch.setattr(evaluate_module, "evaluate", fake_evaluate)
    args = _command([str(fixture_path("q8_0")), "--kv-format", "k8v3", "--backend", "cuda"])
    assert args.func(args) == 0
    assert seen == {"kv": "k8v3", "runner_kv": None}


@pytest.mark.parametrize("min_length, changes", [(0, True), (10_000, False)])
def test_sparse_backend_profile_applies_to_the_evaluated_prefill(tmp_path: Path, min_length: int, changes: bool) -> None:
    """`eval-fixture --sparse` runs the reference model through `_Runner` (it needs hidden rows), not the
    backend's own forward, so the runner must apply the backend's profile itself: a coarse A-shape
    profile changes the prefill logits from its minimum length on, and leaves them alone below it."""
    import shutil

    import numpy as np

    from engine.fixtures.evaluate import _Runner
    from engine.reference.sparse_attention import Pattern
    from engine.sparse.profile import HeadChoice, SparseProfile, model_identity, profile_path, save_profile

    model = tmp_path / "fixture.gguf"
    shutil.copy(fixture_path("q8_0"), model)
    loaded = load_model(model)
    heads = [HeadChoice(Pattern("a_shape", sink=1, window=1), 0.0, 0.1)] * loaded.config.n_head
    layers = {i: heads for i in loaded.config.attention_layers}
    save_profile(SparseProfile(model_identity(loaded.file), 32, min_length, 0.3, 256, layers), profile_path(model))
    prompt = Tokenizer.from_model_file(loaded.file).encode("[ABC=1234]" + " pa" * 120 + "\n?ABC=", parse_special=False)
    dense = _Runner(open_backend("reference", loaded), None).feed(prompt)
    sparse = _Runner(open_backend("reference", loaded, sparse=True), None).feed(prompt)
    assert len(prompt) > 64 and (not np.array_equal(dense, sparse)) == changes
