"""`rigllm generate --mtp on|off`: the same text either way (greedy), acceptance in the stats line when on."""

from __future__ import annotations

import dataclasses

import pytest

from engine.cli import main
from engine.generation.chat_template import FALLBACK_TEMPLATE_PATH
from engine.fixtures.speculative_fixture import write_draft_friendly_model
from engine.fixtures.demo_model import DEMO_CONFIG, demo_vocab


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    cfg = dataclasses.replace(DEMO_CONFIG, n_mtp=1, tied_embeddings=False, is_recurrent=())
    vocab = demo_vocab(FALLBACK_TEMPLATE_PATH.read_text(encoding="utf-8"))
    return str(write_draft_friendly_model(tmp_path_factory.mktemp("mtp") / "m.gguf", cfg, vocab, seed=3, mix=0.15))


def generate(capsys, model_path: str, *flags: str) -> tuple[str, str]:
    code = main(["generate", model_path, "--prompt", "Hello", "--no-think", "--backend", "reference",
                 "--max-tokens", "24", *flags])
    assert code == 0
    out = capsys.readouterr()
    return out.out, out.err


def test_mtp_on_and_off_print_the_same_reply(capsys, model_path):
    on, on_err = generate(capsys, model_path)  # on is the default
    k2, k2_err = generate(capsys, model_path, "--mtp", "on", "--mtp-draft", "2")
    off, off_err = generate(capsys, model_path, "--mtp", "off")
    assert on == k2 == off and on.strip()
    assert "MTP acceptance" in on_err and "(K=1)" in on_err and "(K=2)" in k2_err
    assert "MTP" not in off_err
