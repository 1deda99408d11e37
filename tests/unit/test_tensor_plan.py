"""Per-tensor types of the K-quant file types follow llama.cpp's quantizer (llama-quant.cpp of 0.3.36).

The peer test (tests/peer/test_kquant_peer.py) checks the same plan against files llama.cpp's own
quantizer wrote; here the rules are checked one by one on the released shapes, and the planner's sizes
are checked to be the sums of those types' bytes.
"""

from __future__ import annotations

from collections import Counter

import pytest
from gguf import GGMLQuantizationType as Q

from engine.commands.make_test_model import SHAPE_TYPES
from engine.model.model_footprint import footprint_for
from engine.gguf.shapes import shape_config
from engine.gguf.tensor_plan import WEIGHT_TYPES, kquant_tensor_type, planned_types, use_more_bits
from engine.gguf.tensor_types import tensor_nbytes
from tests.kquant_data import kquant_tiny_config


def by_name(shape: str, weight_type: str) -> dict[str, Q]:
    return {n: t for n, _, t in planned_types(shape_config(shape), weight_type)}


def test_use_more_bits_matches_llama_cpp_for_33_blocks():
    # i < 33/8 = 4, i >= 7*33/8 = 28, or (i - 4) % 3 == 2
    assert [i for i in range(33) if use_more_bits(i, 33)] == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31, 32]


def test_q4_k_m_of_the_9b_shape():
    types = by_name("9b", "q4_k_m")
    n = shape_config("9b").n_blocks
    assert types["output.weight"] == Q.Q6_K and types["token_embd.weight"] == Q.Q4_K
    for i in range(n):
        wanted = Q.Q6_K if use_more_bits(i, n) else Q.Q4_K
        v = f"blk.{i}.attn_v.weight" if f"blk.{i}.attn_v.weight" in types else f"blk.{i}.attn_qkv.weight"
        assert types[v] == wanted and types[f"blk.{i}.ffn_down.weight"] == wanted, i
        assert types[f"blk.{i}.ffn_up.weight"] == Q.Q4_K
    assert types["blk.0.ssm_alpha.weight"] == Q.Q4_K and types["blk.0.ssm_conv1d.weight"] == Q.F32
    assert types["blk.0.attn_norm.weight"] == Q.F32 and types["blk.0.ssm_a"] == Q.F32
    assert types["blk.32.nextn.eh_proj.weight"] == Q.Q4_K


def test_tied_embeddings_take_the_output_type_and_q6_k_is_uniform():
    assert by_name("0.8b", "q4_k_m")["token_embd.weight"] == Q.Q6_K
    counts = Counter(by_name("27b", "q6_k").values())
    assert set(counts) == {Q.Q6_K, Q.F32}
    assert by_name("27b", "q5_k_m")["blk.5.attn_gate.weight"] == Q.Q5_K


def test_rows_that_are_not_whole_super_blocks_fall_back_as_llama_cpp_does():
    cfg = kquant_tiny_config()
    assert kquant_tensor_type("blk.1.ffn_up.weight", (512, 320), "q4_k_m", cfg) == Q.Q5_0
    assert kquant_tensor_type("blk.1.ffn_up.weight", (512, 320), "q5_k_m", cfg) == Q.Q5_1
    assert kquant_tensor_type("blk.1.ffn_up.weight", (512, 320), "q6_k", cfg) == Q.Q8_0
    assert kquant_tensor_type("blk.1.ffn_up.weight", (512, 336), "q6_k", cfg) == Q.F16
    assert kquant_tensor_type("output.weight", (1000, 320), "q4_k_m", cfg) == Q.Q8_0


@pytest.mark.parametrize("weight_type", ["q4_k_m", "q5_k_m", "q6_k"])
def test_planned_footprint_is_the_sum_of_the_planned_types(weight_type):
    cfg = shape_config("27b")
    fp = footprint_for(cfg, weight_type)
    assert fp.file_bytes == sum(tensor_nbytes(s, t) for _, s, t in planned_types(cfg, weight_type))
    assert fp.requantised == 0
    small = sum(tensor_nbytes(s, t) for n, s, t in planned_types(cfg, weight_type) if t == Q.F32)
    assert fp.weight_bytes == fp.file_bytes  # K-quant tensors stay as stored; F32 ones are fp32 on the card too
    assert small > 0


def test_make_test_model_offers_every_weight_type():
    assert set(SHAPE_TYPES) == set(WEIGHT_TYPES)
