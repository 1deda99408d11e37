"""The fixture training script on a toy shape: a few steps run, and the export matches the reference.

Training to convergence takes ~23 minutes (tests/fixtures/trained/README.md); here only the plumbing
is checked: the joint trunk + MTP loss trains, and the torch model's trunk and MTP logits equal the
numpy reference's on the GGUF our converter writes from it (the MTP block's names, concat order and
positions, the V-head reorder of a model with 2 value heads per key head).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOY = {"hidden": 32, "ffn": 64, "n_head": 2, "n_head_kv": 1, "n_k_heads": 1, "n_v_heads": 2, "ssm_head_dim": 16}


def test_train_cli_writes_fixture(tmp_path: Path) -> None:
    from engine.fixtures.train import main
    from engine.gguf.loader import load_model

    argv = ["--out", str(tmp_path), "--steps", "3", "--lengths", "128", "--batch-tokens", "256",
            "--shape", json.dumps(TOY), "--name", "toy", "--seed", "3", "--schedule", "cosine", "--curriculum", "0.5",
            "--repeat-prose", "0.5", "--warmup", "2"]
    assert main(argv) == 0
    record = json.loads((tmp_path / "toy-train.json").read_text())
    assert record["settings"]["steps"] == 3 and record["settings"]["seed"] == 3
    assert (record["settings"]["schedule"], record["settings"]["curriculum"], record["settings"]["repeat_prose"]) == ("cosine", 0.5, 0.5)
    assert record["curve"][-1]["step"] == 3 and np.isfinite(record["curve"][-1]["trunk"])
    assert record["command"].endswith(" ".join(argv))
    for kind in ("f32", "q8_0"):
        loaded = load_model(tmp_path / f"toy-{kind}.gguf")
        assert loaded.config.n_mtp == 1 and loaded.config.ssm_n_v_heads == 2 * loaded.config.ssm_n_k_heads
        assert record["files"][f"toy-{kind}.gguf"] == (tmp_path / f"toy-{kind}.gguf").stat().st_size


def test_schedule_and_curriculum() -> None:
    from engine.fixtures.tasks import Difficulty
    from engine.fixtures.train import TrainSettings, difficulty_at, lr_at

    constant = TrainSettings(steps=100, lr=1e-2, warmup=10)
    assert lr_at(4, constant) == pytest.approx(5e-3) and lr_at(9, constant) == lr_at(99, constant) == 1e-2
    cosine = TrainSettings(steps=100, lr=1e-2, warmup=10, schedule="cosine")
    lrs = [lr_at(i, cosine) for i in range(100)]
    assert lrs[50] == pytest.approx(5e-3) and lrs[99] < 1e-5 and all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    ramp = TrainSettings(steps=100, curriculum=0.4)
    assert difficulty_at(0, ramp) == Difficulty(max_pairs=1, copy_lengths=(8, 8))
    assert difficulty_at(40, ramp) == difficulty_at(99, ramp) == Difficulty() == difficulty_at(0, constant)


def test_trained_weights_change_and_export_matches_reference(tmp_path: Path) -> None:
    import torch

    from engine.fixtures.export import FIXTURE_NAME, export_gguf, write_hf_folder
    from engine.fixtures.train import TrainSettings, train
    from engine.gguf.loader import load_model
    from engine.reference.model import ReferenceModel

    settings = TrainSettings(steps=4, lengths=(128,), length_weights=(1.0,), batch_tokens=256, shape=TOY, lr=1e-2)
    model, record = train(settings, log=lambda line: None)
    assert record["curve"][-1]["step"] == 4
    norms = [p for n, p in model.named_parameters() if n.endswith("norm.weight") and "linear_attn" not in n]
    assert any(float(p.detach().abs().max()) > 0 for p in norms), "training moved no zero-initialised norm gain"

    path = export_gguf(write_hf_folder(model, tmp_path / "hf"), tmp_path, "toy", ("f32",))[0]
    assert load_model(path).file.fields["general.name"] == FIXTURE_NAME  # named by its model card, not "Hf"
    ref = ReferenceModel.from_model_file(load_model(path).file)
    ids = torch.randint(0, 280, (1, 70), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        trunk, mtp = model.eval()(ids)
    state = ref.new_state()
    hidden = ref.forward_hidden(ids[0].numpy(), state)
    np.testing.assert_allclose(ref.logits(hidden), trunk[0].numpy(), atol=2e-4, rtol=0)
    mtp_logits, _ = ref.mtp[0].forward(hidden[:-1], ids[0, 1:].numpy(), state)
    np.testing.assert_allclose(mtp_logits, mtp[0].numpy(), atol=2e-4, rtol=0)
