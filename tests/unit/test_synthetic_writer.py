"""`engine.fixtures.synthetic`: random-weight qwen35 GGUFs, written streaming and read back with ModelFile."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import TokenType

from engine.gguf.config import ModelConfig
from engine.gguf.model_file import ModelFile
from engine.gguf.shapes import SHAPES, shape_config
from engine.fixtures.synthetic import write_random_model
from engine.fixtures.synthetic_vocab import QWEN35_VOCAB_SIZE
from engine.gguf.tensor_layout import model_tensors
from engine.gguf.vocab import Vocab

SMALL = ModelConfig(
    d_model=64, d_ff=96, n_layers=5, n_mtp=1, n_head=4, n_head_kv=2, head_dim=32, rope_dims=8,
    rope_sections=(2, 1, 1, 0), rope_theta=1e7, rms_eps=1e-6, context_length=512, ssm_conv_kernel=4,
    ssm_d_state=16, ssm_n_k_heads=2, ssm_n_v_heads=6, ssm_d_inner=6 * 16, vocab_size=QWEN35_VOCAB_SIZE,
    tied_embeddings=False,
)
TINY_VOCAB = Vocab(tokens=[chr(0x100 + i) for i in range(300)], token_types=[1] * 300, merges=[], special_ids={"eos": 7})


def read_config(mf: ModelFile) -> ModelConfig:
    return ModelConfig.from_gguf_fields(mf.fields, len(mf.fields["tokenizer.ggml.tokens"]), "output.weight" not in mf.tensors)


@pytest.fixture(scope="module")
def small_q8(tmp_path_factory):
    return write_random_model(tmp_path_factory.mktemp("syn") / "small.gguf", SMALL, "q8_0", seed=3, chat_template="{{ x }}")


def test_config_tensors_and_types_read_back(small_q8):
    mf = ModelFile(small_q8)
    assert read_config(mf) == dataclasses.replace(SMALL, rms_eps=float(np.float32(SMALL.rms_eps)))
    assert [(n, s) for n, s in model_tensors(SMALL)] == [(n, t.numpy_shape) for n, t in mf.tensors.items()]
    for name, info in mf.tensors.items():
        one_d = len(info.ne) == 1
        f32 = one_d or name.endswith("_norm.weight") or name.endswith("ssm_conv1d.weight")
        assert info.ggml_type == (QT.F32 if f32 else QT.Q8_0), name
        # ssm_out's input width is 96: a multiple of 32, so Q8_0 like the rest
    f = mf.fields
    assert f["general.architecture"] == "qwen35" and f["general.type"] == "model"
    assert "random weights" in f["general.name"] and f["general.file_type"] == 7
    assert f["qwen35.nextn_predict_layers"] == 1 and f["qwen35.block_count"] == 6
    assert f["qwen35.attention.recurrent_layers"] == [True, True, True, False, True, False]
    assert f["tokenizer.chat_template"] == "{{ x }}"
    assert {n for n in mf.tensors if n.startswith("blk.5.nextn.")} == {
        "blk.5.nextn.eh_proj.weight", "blk.5.nextn.enorm.weight", "blk.5.nextn.hnorm.weight",
        "blk.5.nextn.shared_head_norm.weight"}


def test_values_have_sensible_scale(small_q8):
    mf = ModelFile(small_q8)
    for i in SMALL.gdn_layers:
        a = mf.tensor(f"blk.{i}.ssm_a")
        assert (a < -0.99).all() and (a > -16.01).all()
        dt = np.log1p(np.exp(mf.tensor(f"blk.{i}.ssm_dt.bias")))  # softplus
        assert (dt > 0.9e-3).all() and (dt < 0.11).all()
        assert np.abs(mf.tensor(f"blk.{i}.ssm_conv1d.weight")).max() <= 0.5
    for name in mf.tensors:
        if name.endswith("norm.weight"):
            gains = mf.tensor(name)
            assert (np.abs(gains - 1) <= 0.1 + 1e-6).all(), name
    for name in ("blk.0.attn_qkv.weight", "blk.3.attn_output.weight", "token_embd.weight", "output.weight"):
        w = mf.tensor(name)
        assert w.std() == pytest.approx(1 / np.sqrt(w.shape[1]), rel=0.1), name


def test_generated_vocabulary_has_the_real_layout(small_q8):
    f = ModelFile(small_q8).fields
    tokens, types = f["tokenizer.ggml.tokens"], f["tokenizer.ggml.token_type"]
    assert len(tokens) == len(types) == 248_320
    assert tokens[248044:248047] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert tokens[248068:248070] == ["<think>", "</think>"]
    assert types[248045] == TokenType.CONTROL and types[248068] == TokenType.USER_DEFINED
    assert f["tokenizer.ggml.eos_token_id"] == 248046 and f["tokenizer.ggml.padding_token_id"] == 248044
    assert f["tokenizer.ggml.add_bos_token"] is False
    assert tokens[248077] == "[PAD248077]" and set(types[248077:]) == {TokenType.UNUSED}
    assert len(f["tokenizer.ggml.merges"]) == 248044 - 256


@pytest.mark.parametrize("weight_type, qtype", [("f32", QT.F32), ("f16", QT.F16), ("bf16", QT.BF16)])
def test_float_weight_types(tmp_path, weight_type, qtype):
    cfg = dataclasses.replace(SMALL, vocab_size=300, n_mtp=0, tied_embeddings=True,
                              is_recurrent=())
    mf = ModelFile(write_random_model(tmp_path / "m.gguf", cfg, weight_type, vocab=TINY_VOCAB))
    assert mf.tensors["blk.0.attn_qkv.weight"].ggml_type == qtype
    assert mf.tensors["blk.0.ssm_conv1d.weight"].ggml_type == QT.F32
    assert "output.weight" not in mf.tensors
    assert mf.fields["tokenizer.ggml.eos_token_id"] == 7 and "tokenizer.chat_template" not in mf.fields
    assert np.isfinite(mf.tensor("token_embd.weight")).all()


def test_deterministic_per_seed(tmp_path):
    cfg = dataclasses.replace(SMALL, vocab_size=300, n_mtp=0, is_recurrent=())
    a = write_random_model(tmp_path / "a.gguf", cfg, vocab=TINY_VOCAB, seed=5).read_bytes()
    b = write_random_model(tmp_path / "b.gguf", cfg, vocab=TINY_VOCAB, seed=5).read_bytes()
    c = write_random_model(tmp_path / "c.gguf", cfg, vocab=TINY_VOCAB, seed=6).read_bytes()
    assert a == b and a != c and len(a) == len(c)


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="weight_type"):
        write_random_model(tmp_path / "x.gguf", SMALL, "q4_k")
    with pytest.raises(ValueError, match="pass a vocab"):
        write_random_model(tmp_path / "x.gguf", dataclasses.replace(SMALL, vocab_size=300, is_recurrent=()))
    with pytest.raises(ValueError, match="vocab has 300 tokens"):
        write_random_model(tmp_path / "x.gguf", SMALL, vocab=TINY_VOCAB)


def test_released_shapes():
    assert set(SHAPES) == {"0.8b", "9b", "27b"}
    nine = shape_config("9B")
    assert (nine.d_model, nine.n_layers, nine.n_mtp, nine.ssm_n_v_heads, nine.tied_embeddings) == (4096, 32, 1, 32, False)
    assert nine.attention_layers == [3, 7, 11, 15, 19, 23, 27, 31] and nine.ssm_conv_dim == 8192
    assert shape_config("27b").is_recurrent[64] is False and shape_config("0.8b").tied_embeddings
    # parameter counts (spec §7.1: 27B text + MTP is 27.32 B in llama.cpp's count)
    count = lambda cfg: sum(int(np.prod(s)) for _, s in model_tensors(cfg))  # noqa: E731
    assert count(shape_config("27b")) / 1e9 == pytest.approx(27.32, abs=0.01)
    assert count(shape_config("9b")) / 1e9 == pytest.approx(9.2, abs=0.1)
