"""`rigllm convert` and `rigllm make-test-model`: arguments, outputs and one-line errors."""

from __future__ import annotations

import argparse

import pytest
from converter_fixtures import tiny_hf  # noqa: F401 (fixture)

from engine.commands import convert as convert_cmd
from engine.commands import make_test_model as make_cmd
from engine.errors import RigllmError
from engine.gguf.model_file import ModelFile


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="rigllm")
    sub = parser.add_subparsers(dest="command", required=True)
    convert_cmd.register(sub)
    make_cmd.register(sub)
    args = parser.parse_args(list(argv))
    return args.func(args)


def test_convert_command(tiny_hf, tmp_path):
    out = tmp_path / "m.gguf"
    assert run("convert", str(tiny_hf("mtp")), str(out), "--type", "q8_0", "--no-mtp") == 0
    mf = ModelFile(out)
    assert mf.fields["general.file_type"] == 7 and "qwen35.nextn_predict_layers" not in mf.fields
    assert run("convert", str(tiny_hf("mtp")), str(out)) == 0
    assert ModelFile(out).fields["general.file_type"] == 32  # bf16 by default
    with pytest.raises(RigllmError, match="folder"):
        run("convert", str(tiny_hf("mtp")), str(tmp_path))
    with pytest.raises(RigllmError, match="config.json"):
        run("convert", str(tmp_path), str(out))


def test_make_test_model_variant_and_demo(tmp_path):
    pytest.importorskip("transformers")
    assert run("make-test-model", str(tmp_path / "tiny"), "--variant", "gqa4-hv3-l6", "--type", "q8_0", "--seed", "2") == 0
    assert {p.name for p in (tmp_path / "tiny").iterdir()} >= {
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
        "chat_template.jinja", "model-q8_0.gguf"}
    assert ModelFile(tmp_path / "tiny" / "model-q8_0.gguf").fields["qwen35.block_count"] == 6
    assert run("make-test-model", str(tmp_path / "demo.gguf"), "--demo") == 0
    assert "random weights" in ModelFile(tmp_path / "demo.gguf").fields["general.name"]
    with pytest.raises(RigllmError, match="unknown variant"):
        run("make-test-model", str(tmp_path / "x"), "--variant", "nope")
    with pytest.raises(RigllmError, match="fixed recipe"):
        run("make-test-model", str(tmp_path / "d.gguf"), "--demo", "--seed", "3")
    with pytest.raises(SystemExit):
        run("make-test-model", str(tmp_path / "x"), "--demo", "--shape", "9b")
