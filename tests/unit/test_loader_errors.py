"""Well-formed GGUFs that are not usable qwen35 models: identity, keys, vocabulary, tensors, values.

Each broken file is a rewrite of a valid tiny model with one thing changed, and each must be refused
with a one-line ModelFileError that names the file and the problem.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from engine.errors import ModelFileError
from engine.gguf.loader import load_model
from tests.unit.loader_fixtures import f32, read_gguf, rewrite_gguf, write_gguf, write_tiny_model


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("errors") / "tiny.gguf")


def refused(path: Path, *fragments: str) -> None:
    with pytest.raises(ModelFileError) as err:
        load_model(path)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{path.name}: "), message
    for fragment in fragments:
        assert fragment in message, message


def broken(valid: Path, tmp_path: Path, **changes) -> Path:
    return rewrite_gguf(valid, tmp_path / "broken.gguf", **changes)


# ---- identity -----------------------------------------------------------------------------------


def test_moe_architecture(valid, tmp_path):
    refused(broken(valid, tmp_path, set_fields={"general.architecture": "qwen35moe"}), "MoE models are not supported")


def test_other_architecture(valid, tmp_path):
    refused(
        broken(valid, tmp_path, set_fields={"general.architecture": "llama"}),
        "not a Qwen3.5/3.6 dense hybrid (architecture 'llama')",
    )


def test_vision_projector_file(valid, tmp_path):
    refused(broken(valid, tmp_path, set_fields={"general.architecture": "clip"}), "vision projector (mmproj) file")


def test_no_architecture(valid, tmp_path):
    refused(broken(valid, tmp_path, drop_fields=("general.architecture",)), "no general.architecture")


def test_vocabulary_only_file_is_not_a_model(valid, tmp_path):
    fields, _ = read_gguf(valid)
    refused(write_gguf(tmp_path / "vocab.gguf", fields, {}), "contains no tensors", "vocabulary-only")


# ---- keys ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "qwen35.block_count",
        "qwen35.embedding_length",
        "qwen35.ssm.inner_size",
        "qwen35.rope.freq_base",
        "qwen35.attention.key_length",
    ],
)
def test_missing_required_key(valid, tmp_path, key):
    refused(broken(valid, tmp_path, drop_fields=(key,)), f"missing GGUF key '{key}'")


@pytest.mark.parametrize(
    "key, value, fragment",
    [
        ("qwen35.block_count", "five", "should be an integer"),
        ("qwen35.feed_forward_length", [256, 256, 256, 256, 256], "should be an integer"),
        ("qwen35.attention.layer_norm_rms_epsilon", -1.0, "should be a positive number"),
        ("qwen35.block_count", 100000, "implausible"),
        ("qwen35.nextn_predict_layers", 5, "leaves no trunk layers"),
        ("qwen35.ssm.inner_size", 66, "not a multiple of ssm.time_step_rank"),
        ("qwen35.ssm.time_step_rank", 3, "not a multiple"),
        ("qwen35.attention.head_count_kv", 3, "not a multiple of head_count_kv 3"),
        ("qwen35.attention.value_length", 16, "!= key_length"),
        ("qwen35.rope.dimension_count", 7, "must be even"),
        ("qwen35.rope.dimension_sections", [1, 1], "3 or 4 non-negative integers"),
        ("qwen35.attention.recurrent_layers", [True, True, True, False], "has 4 entries, block_count is 5"),
        ("qwen35.attention.recurrent_layers", [True, True, True, False, True], "marks an MTP block as recurrent"),
    ],
)
def test_bad_key_value(valid, tmp_path, key, value, fragment):
    refused(broken(valid, tmp_path, set_fields={key: value}), fragment)


# ---- vocabulary ---------------------------------------------------------------------------------


def test_tokenizer_model_not_bpe(valid, tmp_path):
    refused(
        broken(valid, tmp_path, set_fields={"tokenizer.ggml.model": "llama"}),
        "tokenizer model 'llama' is not supported",
    )


def test_token_types_length_mismatch(valid, tmp_path):
    fields, _ = read_gguf(valid)
    types = fields["tokenizer.ggml.token_type"][:-1]
    refused(
        broken(valid, tmp_path, set_fields={"tokenizer.ggml.token_type": types}), "vocabulary mismatch", "token types"
    )


def test_embedding_rows_mismatch(valid, tmp_path):
    fields, _ = read_gguf(valid)
    tokens = fields["tokenizer.ggml.tokens"] + ["extra"]
    types = fields["tokenizer.ggml.token_type"] + [1]
    changed = broken(valid, tmp_path, set_fields={"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types})
    refused(changed, "vocabulary mismatch", "token_embd.weight has 288 rows", "289 tokens")


def test_gpt2_without_merges(valid, tmp_path):
    refused(broken(valid, tmp_path, drop_fields=("tokenizer.ggml.merges",)), "no 'tokenizer.ggml.merges'")


def test_special_id_out_of_range(valid, tmp_path):
    refused(
        broken(valid, tmp_path, set_fields={"tokenizer.ggml.eos_token_id": 248046}),
        "eos_token_id = 248046 is not a token id",
    )


# ---- tensors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, kind",
    [
        ("blk.0.ssm_a", " (GDN layer)"),
        ("blk.1.attn_qkv.weight", " (GDN layer)"),
        ("blk.3.attn_q.weight", " (attention layer)"),
        ("blk.3.attn_k_norm.weight", " (attention layer)"),
        ("blk.4.nextn.eh_proj.weight", " (MTP block)"),
        ("token_embd.weight", ""),
        ("output_norm.weight", ""),
    ],
)
def test_missing_tensor(valid, tmp_path, name, kind):
    refused(broken(valid, tmp_path, drop_tensors=(name,)), f"missing tensor '{name}'{kind}")


def test_missing_trunk_but_mtp_present_is_an_mtp_only_file(valid, tmp_path):
    _, tensors = read_gguf(valid)
    trunk = tuple(n for n in tensors if n.startswith(("blk.0.", "blk.1.", "blk.2.", "blk.3.")))
    refused(broken(valid, tmp_path, drop_tensors=trunk), "MTP-only GGUF")


def test_wrong_shape(valid, tmp_path):
    bad = f32(np.zeros((200, 64)))  # rows should be Cc = 2*Hk*dk + Hv*dv = 128
    refused(
        broken(valid, tmp_path, set_tensors={"blk.0.attn_qkv.weight": bad}),
        "'blk.0.attn_qkv.weight' has shape [64, 200], expected [64, 128]",
    )


def test_wrong_conv_shape(valid, tmp_path):
    bad = f32(np.zeros((128, 3)))
    refused(
        broken(valid, tmp_path, set_tensors={"blk.1.ssm_conv1d.weight": bad}),
        "'blk.1.ssm_conv1d.weight' has shape [3, 128], expected [4, 128]",
    )


def test_k_quant_is_accepted(valid, tmp_path):
    # ffn_down is [F=256 in, D=64 out]: 64 rows of one 256-value Q4_K block (144 bytes)
    q4k = (np.zeros((64, 144), dtype=np.uint8), GGMLQuantizationType.Q4_K)
    changed = broken(valid, tmp_path, set_tensors={"blk.2.ffn_down.weight": q4k})
    assert load_model(changed).type_counts["Q4_K"] == 1



def test_other_quant_refused(valid, tmp_path):
    q4_0 = (np.zeros((256, 2 * 18), dtype=np.uint8), GGMLQuantizationType.Q4_0)  # ffn_up [64 in, 256 out]
    refused(
        broken(valid, tmp_path, set_tensors={"blk.0.ffn_up.weight": q4_0}),
        "'blk.0.ffn_up.weight' has type Q4_0",
        "1 Q4_0 tensors",
        "supported: Q8_0, Q6_K, Q5_K, Q4_K, F16, BF16, F32",
        "use a Q8_0, Q6_K, Q5_K_M or Q4_K_M GGUF",
    )


# ---- values -------------------------------------------------------------------------------------


def test_positive_ssm_a(valid, tmp_path):
    refused(
        broken(valid, tmp_path, set_tensors={"blk.1.ssm_a": f32(np.full(4, 0.5))}),
        "'blk.1.ssm_a' has values >= 0",
        "-exp(A_log)",
    )


def test_nan_in_norm(valid, tmp_path):
    values = np.ones(64)
    values[5] = np.nan
    refused(
        broken(valid, tmp_path, set_tensors={"blk.2.attn_norm.weight": f32(values)}),
        "'blk.2.attn_norm.weight' contains NaN",
    )
