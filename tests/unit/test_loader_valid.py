"""Valid files load, with the right config, type summary and warnings; vocabulary-only files open."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from engine.errors import ModelFileError
from engine.gguf.loader import load_model, load_vocab_only
from tests.unit.loader_fixtures import TINY, f32, read_gguf, rewrite_gguf, write_gguf, write_tiny_model


@pytest.fixture(scope="module")
def valid(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("valid") / "tiny.gguf")


def test_q8_0_model(valid):
    model = load_model(valid)
    eps = model.config.rms_eps  # stored as f32
    assert model.config == dataclasses.replace(TINY, rms_eps=eps)
    assert eps == pytest.approx(1e-6)
    assert model.config.is_recurrent == (True, True, True, False, False)
    # 2-D weights Q8_0; 1-D tensors and ssm_conv1d F32 (3 GDN layers x 6, 2 attention blocks x 4, 3 nextn norms, output_norm)
    assert model.type_counts == {"Q8_0": 41, "F32": 3 * 6 + 2 * 4 + 3 + 1}
    assert model.warnings == ()
    assert model.path == valid


@pytest.mark.parametrize("weight_type, stored", [("f16", "F16"), ("bf16", "BF16"), ("f32", "F32")])
def test_float_files(tmp_path, weight_type, stored):
    model = load_model(write_tiny_model(tmp_path / f"{weight_type}.gguf", weight_type=weight_type))
    assert model.type_counts.get(stored, 0) >= 41
    assert set(model.type_counts) <= {stored, "F32"}


def test_tied_embeddings_without_mtp(tmp_path):
    model = load_model(write_tiny_model(tmp_path / "tied.gguf", tied_embeddings=True, n_mtp=0))
    assert model.config.tied_embeddings and not model.file.has("output.weight")
    assert model.config.n_mtp == 0 and model.config.n_blocks == 4


def test_unused_tensor_is_a_warning(valid, tmp_path):
    extra = rewrite_gguf(valid, tmp_path / "extra.gguf", set_tensors={"v.patch_embd.weight": f32(np.zeros((4, 8)))})
    assert load_model(extra).warnings == ("1 tensor(s) not used by rigllm are ignored (first: 'v.patch_embd.weight')",)


def test_zero_centred_norms_are_a_warning(valid, tmp_path):
    _, tensors = read_gguf(valid)
    zeroed = {
        n: f32(np.full(64, 0.01))
        for n in tensors
        if n.endswith(("attn_norm.weight", "post_attention_norm.weight")) or n == "output_norm.weight"
    }
    (warning,) = load_model(rewrite_gguf(valid, tmp_path / "hf_norms.gguf", set_tensors=zeroed)).warnings
    assert "RMSNorm weights average 0.010" in warning and "+1 norm offset" in warning


def test_short_rope_sections_are_a_warning(valid, tmp_path):
    short = rewrite_gguf(valid, tmp_path / "rope.gguf", set_fields={"qwen35.rope.dimension_sections": [1, 1, 1]})
    assert load_model(short).warnings == ("IMROPE sections [1, 1, 1] cover fewer than the 4 rotary pairs",)


def test_vocab_only_file(valid, tmp_path):
    fields, _ = read_gguf(valid)
    vocab_fields = {"general.architecture": "qwen2", **{k: v for k, v in fields.items() if k.startswith("tokenizer.")}}
    path = write_gguf(tmp_path / "vocab.gguf", vocab_fields, {})
    mf = load_vocab_only(path)
    assert mf.tensors == {} and mf.fields["tokenizer.ggml.tokens"] == fields["tokenizer.ggml.tokens"]
    assert load_vocab_only(valid).fields["tokenizer.ggml.merges"] == fields["tokenizer.ggml.merges"]


def test_vocab_only_needs_a_vocabulary(tmp_path):
    path = write_gguf(tmp_path / "empty.gguf", {"general.architecture": "qwen2"}, {})
    with pytest.raises(ModelFileError, match="empty.gguf: no tokenizer"):
        load_vocab_only(path)
