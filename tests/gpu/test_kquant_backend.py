"""The whole CUDA forward pass on K-quant files (Q4_K_M, Q5_K_M, Q6_K) against the reference, teacher-forced.

Same method as test_cuda_backend.compare_with_reference: the reference runs in kernel-rounding mode (matmul
inputs rounded to Q8_1 as the kernels round them; the K-quant weights are used exactly as stored, which is
what the kernels multiply: they are never requantised), the tolerance is twice the measured noise floor of
the reference against itself with perturbed embeddings plus fp32 agreement, and greedy tokens must agree
wherever the reference's top-2 margin exceeds twice that tolerance. The files are synthetic with
llama.cpp's per-tensor types, so stacks mix kinds (Q6_K attn_v or attn_qkv beside Q4_K matrices) and the
embedding and LM head run the K-quant gather and GEMV.
"""

from __future__ import annotations

import pytest

from engine.gguf.loader import load_model
from engine.gguf.shapes import shape_config
from engine.fixtures.synthetic import write_random_model
from tests.gpu.test_cuda_backend import compare_with_reference
from tests.kquant_data import KQ_FILE_TYPES, kquant_tiny_config


@pytest.fixture(scope="module")
def kq_models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kq")
    out = {}
    for weight_type in KQ_FILE_TYPES:
        for tied in (False, True):
            name = f"tiny{'-tied' if tied else ''} {weight_type}"
            out[name] = load_model(write_random_model(folder / f"{name.replace(' ', '-')}.gguf",
                                                      kquant_tiny_config(tied), weight_type, seed=5))
    out["0.8b q4_k_m"] = load_model(write_random_model(folder / "r08-q4km.gguf", shape_config("0.8b"), "q4_k_m", seed=3))
    return out


@pytest.mark.parametrize("name", [f"tiny{t} {w}" for w in KQ_FILE_TYPES for t in ("", "-tied")] + ["0.8b q4_k_m"])
def test_kquant_logits_match_reference_with_teacher_forcing(kq_models, name):
    """Prompt 70 tokens (one 64-token GEMM chunk and a 6-token GEMV tail), then 48 decode steps."""
    compare_with_reference(kq_models[name], name, 70, 48)
