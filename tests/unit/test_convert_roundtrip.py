"""`engine.gguf.convert`: tiny HF checkpoints in, GGUF out, read back with ModelFile and checked value by value."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from converter_fixtures import copy_hf, gguf_fields, gguf_tensors, tiny_hf  # noqa: F401 (fixture)
from gguf import GGMLQuantizationType as QT
from gguf import TokenType

from engine.errors import ModelFileError
from engine.gguf.config import ModelConfig
from engine.gguf.convert import convert
from engine.gguf.hf_tensors import hf_to_gguf_tensors
from engine.gguf.model_file import ModelFile

TYPE_OF = {"f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0}


def hf_reference(hf_dir: Path, n_mtp: int) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """The expected GGUF tensors, computed from the checkpoint with the safetensors package (an independent reader)."""
    from safetensors.numpy import load_file

    config = json.loads((hf_dir / "config.json").read_text())
    cfg = ModelConfig.from_hf_config(config, n_mtp=n_mtp)
    state = load_file(str(hf_dir / "model.safetensors"))
    return cfg, dict(hf_to_gguf_tensors(cfg, iter(sorted(state.items()))))


def expected_type(name: str, array: np.ndarray, out_type: str) -> QT:
    if array.ndim == 1 or name.endswith("_norm.weight") or name.endswith("ssm_conv1d.weight"):
        return QT.F32
    return TYPE_OF[out_type]


@pytest.mark.parametrize("variant", ["gqa2-hv2", "gqa4-hv3-l6", "gqa4-hv2-l5-tied"])
@pytest.mark.parametrize("out_type", ["f32", "f16", "bf16", "q8_0"])
def test_tensors_round_trip(tiny_hf, tmp_path, variant, out_type):
    hf_dir = tiny_hf(variant)
    out = convert(hf_dir, tmp_path / "m.gguf", out_type)
    cfg, expected = hf_reference(hf_dir, n_mtp=0)
    mf = ModelFile(out)

    assert list(mf.tensors) == list(expected), "tensor names and order (HF names sorted, as llama.cpp reads them)"
    assert ("output.weight" in mf.tensors) is not cfg.tied_embeddings
    for name, ref in expected.items():
        info = mf.tensors[name]
        assert info.numpy_shape == ref.shape, name
        assert info.ggml_type == expected_type(name, ref, out_type), name
        got = mf.tensor(name)
        if info.ggml_type == QT.F32:
            np.testing.assert_array_equal(got, ref.astype(np.float32), err_msg=name)
        elif info.ggml_type == QT.F16:
            np.testing.assert_array_equal(got, ref.astype(np.float16).astype(np.float32), err_msg=name)
        elif info.ggml_type == QT.BF16:
            np.testing.assert_allclose(got, ref, rtol=2**-8, atol=0, err_msg=name)
        else:  # Q8_0: per 32-value block, error at most half a step (max|block| / 127 / 2) plus the f16 scale's rounding
            blocks = ref.reshape(-1, 32)
            step = np.abs(blocks).max(axis=1, keepdims=True) / 127
            err = np.abs(got.reshape(-1, 32) - blocks)
            assert (err <= step * 0.5 + step * 127 * 2**-10 + 1e-12).all(), name


def test_transforms_are_visible_in_the_file(tiny_hf, tmp_path):
    """Spot checks that do not reuse hf_tensors: +1 on RMSNorm gains, -exp(A_log), squeezed conv, renamed dt_bias."""
    from safetensors.numpy import load_file

    hf_dir = tiny_hf("gqa2-hv2")
    state = load_file(str(hf_dir / "model.safetensors"))
    mf = ModelFile(convert(hf_dir, tmp_path / "m.gguf", "f32"))
    np.testing.assert_array_equal(mf.tensor("blk.0.attn_norm.weight"), state["model.layers.0.input_layernorm.weight"] + 1)
    np.testing.assert_array_equal(mf.tensor("blk.0.ssm_norm.weight"), state["model.layers.0.linear_attn.norm.weight"])
    np.testing.assert_array_equal(mf.tensor("blk.3.attn_q_norm.weight"), state["model.layers.3.self_attn.q_norm.weight"] + 1)
    a_log = state["model.layers.0.linear_attn.A_log"]  # Hv=4, Hk=2: tiled order is [0, 2, 1, 3]
    np.testing.assert_allclose(mf.tensor("blk.0.ssm_a"), -np.exp(a_log[[0, 2, 1, 3]]), rtol=1e-6)
    np.testing.assert_array_equal(mf.tensor("blk.0.ssm_dt.bias"), state["model.layers.0.linear_attn.dt_bias"][[0, 2, 1, 3]])
    assert mf.tensors["blk.0.ssm_conv1d.weight"].ne == (4, 128)
    assert (mf.tensor("blk.1.ssm_a") < 0).all()


def test_keys_and_vocabulary(tiny_hf, tmp_path):
    hf_dir = tiny_hf("gqa2-hv2")
    mf = ModelFile(convert(hf_dir, tmp_path / "m.gguf", "q8_0"))
    f = mf.fields
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    added = {a["content"]: a["id"] for a in tok["added_tokens"]}
    assert f["general.architecture"] == "qwen35" and f["general.type"] == "model"
    assert f["general.file_type"] == 7 and f["general.quantization_version"] == 2
    assert f["general.sampling.top_k"] == 20  # from generation_config.json, as llama.cpp's converter does
    assert f["general.sampling.penalty_repeat"] == pytest.approx(1.05)
    assert f["qwen35.block_count"] == 4 and "qwen35.nextn_predict_layers" not in f
    assert f["qwen35.attention.recurrent_layers"] == [True, True, True, False]
    assert f["qwen35.rope.dimension_sections"] == [2, 1, 1, 0]
    assert f["tokenizer.ggml.model"] == "gpt2" and f["tokenizer.ggml.pre"] == "qwen35"
    assert f["tokenizer.ggml.eos_token_id"] == added["<|im_end|>"]
    assert f["tokenizer.ggml.padding_token_id"] == added["<|endoftext|>"]
    assert f["tokenizer.ggml.bos_token_id"] == added["<|endoftext|>"]  # from config.json's bos_token_id
    assert f["tokenizer.ggml.add_bos_token"] is False
    assert f["tokenizer.chat_template"] == (hf_dir / "chat_template.jinja").read_text()
    tokens, types = f["tokenizer.ggml.tokens"], f["tokenizer.ggml.token_type"]
    assert len(tokens) == len(types) == 512
    assert tokens[added["<|im_start|>"]] == "<|im_start|>" and types[added["<|im_start|>"]] == TokenType.CONTROL
    assert types[added["<think>"]] == TokenType.USER_DEFINED
    assert tokens[: len(tok["model"]["vocab"])] == sorted(tok["model"]["vocab"], key=tok["model"]["vocab"].get)
    merges = tok["model"]["merges"]
    assert f["tokenizer.ggml.merges"] == [m if isinstance(m, str) else " ".join(m) for m in merges]


def test_mtp_block_included_and_dropped(tiny_hf, tmp_path):
    hf_dir = tiny_hf("mtp")
    with_mtp = ModelFile(convert(hf_dir, tmp_path / "mtp.gguf", "f32"))
    assert with_mtp.fields["qwen35.block_count"] == 5 and with_mtp.fields["qwen35.nextn_predict_layers"] == 1
    assert with_mtp.fields["qwen35.attention.recurrent_layers"] == [True, True, True, False, False]
    _, expected = hf_reference(hf_dir, n_mtp=1)
    assert list(with_mtp.tensors) == list(expected)
    for name in ("blk.4.nextn.eh_proj.weight", "blk.4.nextn.enorm.weight", "blk.4.nextn.hnorm.weight",
                 "blk.4.nextn.shared_head_norm.weight", "blk.4.attn_q.weight", "blk.4.ffn_down.weight"):
        np.testing.assert_array_equal(with_mtp.tensor(name), expected[name], err_msg=name)
    assert with_mtp.tensors["blk.4.nextn.eh_proj.weight"].ne == (128, 64)

    without = ModelFile(convert(hf_dir, tmp_path / "nomtp.gguf", "f32", include_mtp=False))
    assert without.fields["qwen35.block_count"] == 4 and "qwen35.nextn_predict_layers" not in without.fields
    assert not any(n.startswith("blk.4.") for n in without.tensors)


def test_multimodal_layout_and_shards_give_the_same_file(tiny_hf, tmp_path):
    """A Qwen3_5ForConditionalGeneration checkpoint split over two shards converts to the same tensors and keys."""
    import torch
    from safetensors.torch import load_file, save_file

    src = tiny_hf("gqa2-hv2")
    plain = convert(src, tmp_path / "plain.gguf", "q8_0")

    mm = copy_hf(src, tmp_path / "mm")
    (mm / "model.safetensors").unlink()
    state = load_file(str(src / "model.safetensors"))
    renamed = {k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k: v for k, v in state.items()}
    renamed["model.visual.blocks.0.attn.qkv.weight"] = torch.zeros(12, 4)  # must be ignored
    names = sorted(renamed)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2], "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for file, keys in shards.items():
        save_file({k: renamed[k] for k in keys}, str(mm / file), metadata={"format": "pt"})
    weight_map = {k: file for file, keys in shards.items() for k in keys}
    (mm / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    text_config = json.loads((src / "config.json").read_text())
    config = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
              "text_config": text_config, "tie_word_embeddings": text_config["tie_word_embeddings"]}
    (mm / "config.json").write_text(json.dumps(config))
    converted = convert(mm, tmp_path / "mm.gguf", "q8_0")

    for (n1, t1, ne1, d1), (n2, t2, ne2, d2) in zip(gguf_tensors(plain), gguf_tensors(converted), strict=True):
        assert (n1, t1, ne1) == (n2, t2, ne2)
        np.testing.assert_array_equal(d1, d2, err_msg=n1)
    a, b = gguf_fields(plain), gguf_fields(converted)
    a.pop("general.name"), b.pop("general.name")  # taken from the folder name
    assert a == b


def test_bf16_checkpoint_is_copied_bit_exactly(tiny_hf, tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    hf_dir = copy_hf(tiny_hf("mha-hv1-tied"), tmp_path / "bf16")
    state = load_file(str(hf_dir / "model.safetensors"))
    save_file({k: v.to(torch.bfloat16) for k, v in state.items()}, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})
    mf = ModelFile(convert(hf_dir, tmp_path / "m.gguf", "bf16"))
    src = state["model.layers.0.mlp.up_proj.weight"].to(torch.bfloat16).view(torch.int16).numpy()
    assert mf.tensors["blk.0.ffn_up.weight"].ggml_type == QT.BF16
    np.testing.assert_array_equal(np.asarray(mf.raw("blk.0.ffn_up.weight")).view(np.int16).reshape(src.shape), src)
    embd = state["model.embed_tokens.weight"].to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(mf.tensor("token_embd.weight"), embd)


def test_q8_0_falls_back_to_f16_for_rows_not_a_multiple_of_32(tiny_hf, tmp_path):
    from safetensors.torch import load_file, save_file

    hf_dir = copy_hf(tiny_hf("gqa2-hv2"), tmp_path / "odd")
    state = load_file(str(hf_dir / "model.safetensors"))
    state["model.layers.0.mlp.down_proj.weight"] = state["model.layers.0.mlp.down_proj.weight"][:, :100].contiguous()
    save_file(state, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})
    mf = ModelFile(convert(hf_dir, tmp_path / "m.gguf", "q8_0"))
    assert mf.tensors["blk.0.ffn_down.weight"].ggml_type == QT.F16
    assert mf.tensors["blk.0.ffn_up.weight"].ggml_type == QT.Q8_0


def test_not_a_qwen35_folder(tmp_path):
    with pytest.raises(ModelFileError, match="no config.json"):
        convert(tmp_path, tmp_path / "x.gguf")
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ModelFileError, match="not a Qwen3.5/3.6 dense model"):
        convert(tmp_path, tmp_path / "x.gguf")
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3_5ForCausalLM"]}))
    with pytest.raises(ModelFileError, match="no model\\*.safetensors"):
        convert(tmp_path, tmp_path / "x.gguf", "f32")
    with pytest.raises(ModelFileError, match="output type"):
        convert(tmp_path, tmp_path / "x.gguf", "q4_k")
