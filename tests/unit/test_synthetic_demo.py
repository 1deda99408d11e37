"""`engine.fixtures.demo_model`: the cached demo model is built once, rebuilt when stale, and is a working model."""

from __future__ import annotations

import pytest

from engine.fixtures import demo_model
from engine.fixtures.demo_model import DEMO_CONFIG, DEMO_NAME, ensure_demo_model, write_demo_model
from engine.gguf.model_file import ModelFile
from engine.gguf.config import ModelConfig


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("RIGLLM_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def test_built_once_then_reused(data_dir):
    path = ensure_demo_model()
    assert path.parent == data_dir / "demo" and path.is_file()
    stamp = path.stat().st_mtime_ns
    assert ensure_demo_model() == path and path.stat().st_mtime_ns == stamp
    assert [p.name for p in (data_dir / "demo").iterdir() if p.name.startswith(".")] == []


def test_rebuilt_when_missing_or_version_differs(data_dir, monkeypatch):
    path = ensure_demo_model()
    original = path.read_bytes()
    (data_dir / "demo" / "version.txt").write_text("0-old\n")
    path.write_bytes(b"stale")
    assert ensure_demo_model().read_bytes() == original
    path.unlink()
    assert ensure_demo_model().read_bytes() == original
    monkeypatch.setattr(demo_model, "DEMO_RECIPE_VERSION", demo_model.DEMO_RECIPE_VERSION + 1)
    path.write_bytes(b"stale")
    assert ensure_demo_model().read_bytes() == original


def test_contents(tmp_path):
    mf = ModelFile(write_demo_model(tmp_path / "demo.gguf"))
    f = mf.fields
    assert f["general.name"] == DEMO_NAME and "random weights" in DEMO_NAME
    tokens = f["tokenizer.ggml.tokens"]
    cfg = ModelConfig.from_gguf_fields(f, len(tokens), "output.weight" not in mf.tensors)
    assert (cfg.n_layers, cfg.d_model, cfg.vocab_size, cfg.tied_embeddings) == (8, 256, 1024, True)
    assert cfg.attention_layers == DEMO_CONFIG.attention_layers == [3, 7]
    assert tokens[f["tokenizer.ggml.eos_token_id"]] == "<|im_end|>"
    assert tokens[f["tokenizer.ggml.padding_token_id"]] == "<|endoftext|>"
    assert "<think>" in tokens and len(f["tokenizer.ggml.merges"]) > 500
    assert "<|im_start|>" in f["tokenizer.chat_template"]
    assert mf.tensors["blk.0.attn_qkv.weight"].ggml_type.name == "Q8_0"
    assert (write_demo_model(tmp_path / "again.gguf").read_bytes() == (tmp_path / "demo.gguf").read_bytes())
