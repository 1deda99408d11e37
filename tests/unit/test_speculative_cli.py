"""`rigllm generate --mtp on|off`: the same text either way (greedy), acceptance in the stats line when on."""

from __future__ import annotations

import pytest

from engine.cli import main
from tests.draft_friendly import write_demo_draft_friendly


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    return str(write_demo_draft_friendly(tmp_path_factory.mktemp("mtp") / "m.gguf"))


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
