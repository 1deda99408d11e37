"""The reference on K-quant files written by llama.cpp's own quantizer, against llama.cpp's logits on them.

A tiny random qwen35 model is written in F32 (`kquant_tiny_config`: every matmul input a multiple of 256
wide) and quantized by llama-cpp-python 0.3.36's `llama_model_quantize` to Q4_K_M, Q5_K_M and Q6_K. Then:

1. every tensor has the type rigllm's plan gives it (engine.gguf.tensor_plan), so synthetic files and
   memory plans match downloaded ones;
2. the reference (exact fp32 on gguf-py's dequantized weights) tracks llama.cpp's CPU logits on the same
   file. They are not equal: llama.cpp rounds every matmul input to Q8_K (8-bit activations), and this
   random model amplifies that. Measured over 40 tokens (2 threads, this machine): RMS error / logit std
   0.079 / 0.067 / 0.075 (Q4_K_M / Q5_K_M / Q6_K), max error / max |logit| 0.20 / 0.09 / 0.10, top-1
   agreement 0.75 / 0.90 / 0.85. The same files read with the 4-bit payload's nibbles swapped (a wrong
   block layout) give RMS 1.40 / 1.37 / 1.28, max 1.46 / 1.42 / 1.43 and top-1 0.0. The bounds, RMS < 0.25
   and top-1 >= 0.5, sit between the two, and the test checks that the wrong layout fails them.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf.quants import dequantize

from engine.gguf.kquant_blocks import BLOCK_BYTES, KQUANT_TYPES
from engine.gguf.loader import load_model
from engine.fixtures.synthetic import write_random_model
from engine.gguf.tensor_plan import planned_types
from engine.reference.model import ReferenceModel
from tests.kquant_data import KQ_FILE_TYPES, Q, kquant_tiny_config

pytestmark = pytest.mark.peer
llama_cpp = pytest.importorskip("llama_cpp")

RMS_BOUND = 0.25
TOP1_BOUND = 0.5
FTYPES = {"q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M", "q5_k_m": "LLAMA_FTYPE_MOSTLY_Q5_K_M", "q6_k": "LLAMA_FTYPE_MOSTLY_Q6_K"}
TOKENS = [int(t) for t in np.random.default_rng(7).integers(0, 5000, 40)]
PAYLOAD = {Q.Q4_K: slice(16, 144), Q.Q5_K: slice(48, 176), Q.Q6_K: slice(0, 128)}  # the 4-bit quants of a block


@pytest.fixture(scope="module")
def f32_model(tmp_path_factory):
    return write_random_model(tmp_path_factory.mktemp("kq") / "tiny-f32.gguf", kquant_tiny_config(), "f32", seed=11)


def quantize_with_llama_cpp(src, dst, weight_type: str):
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, FTYPES[weight_type])
    params.nthread = 2
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params) == 0
    return dst


def llama_logits(path) -> np.ndarray:
    llm = llama_cpp.Llama(model_path=str(path), logits_all=True, n_ctx=128, n_batch=128, n_threads=2,
                          verbose=False, seed=0)
    llm.reset()
    llm.eval(TOKENS)
    return np.array(llm.scores[: llm.n_tokens])


def agreement(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """(RMS error / logit std, top-1 agreement) over every token."""
    return float(np.sqrt(((got - want) ** 2).mean()) / want.std()), float((got.argmax(1) == want.argmax(1)).mean())


def nibbles_swapped(raw: np.ndarray, qtype) -> np.ndarray:
    blocks = raw.reshape(-1, BLOCK_BYTES[qtype]).copy()
    q = blocks[:, PAYLOAD[qtype]]
    blocks[:, PAYLOAD[qtype]] = (q >> 4) | (q << 4)
    return dequantize(blocks.reshape(raw.shape), qtype)


@pytest.mark.parametrize("weight_type", KQ_FILE_TYPES)
def test_reference_tracks_llama_cpp_on_its_own_kquant_files(f32_model, tmp_path, weight_type):
    path = quantize_with_llama_cpp(f32_model, tmp_path / f"tiny-{weight_type}.gguf", weight_type)
    model = load_model(path)
    mf = model.file
    planned = {n: t.name for n, _, t in planned_types(model.config, weight_type)}
    assert {n: i.ggml_type.name for n, i in mf.tensors.items()} == planned

    want = llama_logits(path)
    ref = ReferenceModel.from_model_file(mf)
    rms, top1 = agreement(ref.forward(TOKENS, ref.new_state()), want)
    print(f"{weight_type}: reference vs llama.cpp RMS/std {rms:.3f}, top-1 {top1:.2f}")
    assert rms < RMS_BOUND and top1 >= TOP1_BOUND

    wrong = {n: nibbles_swapped(np.asarray(mf.raw(n)), i.ggml_type).reshape(i.numpy_shape)
             if i.ggml_type in KQUANT_TYPES else mf.tensor(n) for n, i in mf.tensors.items()}
    bad = ReferenceModel(ref.cfg, wrong)
    bad_rms, bad_top1 = agreement(bad.forward(TOKENS, bad.new_state()), want)
    print(f"{weight_type}: wrong layout RMS/std {bad_rms:.3f}, top-1 {bad_top1:.2f}")
    assert bad_rms > RMS_BOUND and bad_top1 < TOP1_BOUND, "the bounds must reject a wrong block layout"
