"""The reference against llama.cpp (llama-cpp-python 0.3.36) on the same GGUF: the GGUF-order semantics
(tiled value heads, offset norms, `ssm_a`) as llama.cpp reads them, and the KERNEL rounding mode
against llama.cpp's int8 (Q8_0 × Q8_0 activations) CPU path.

Only the shape with dk == dv is used: llama.cpp's qwen35 loader sizes the GDN tensors with
head_v_dim = ssm.state_size (src/models/qwen35.cpp), so it cannot load dk ≠ dv (released models all
have dk = dv = 128). llama.cpp runs with an F32 KV cache (its default F16 cache alone costs ≈1.5e-4).
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.gguf.model_file import ModelFile
from engine.reference import ActivationRounding, ReferenceModel
from reference_fixtures import SHAPES, gguf_weights, max_relative_error, model_config, perturbed_model, q8_0_names, random_tokens, write_gguf

pytestmark = pytest.mark.peer
GGML_TYPE_F32 = 0


@pytest.fixture(scope="module")
def setup():
    pytest.importorskip("llama_cpp")
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = perturbed_model(SHAPES[2], seed=0)  # dk = dv = 16, 3 value heads per key head, H/Hkv = 4
    cfg = model_config(model)
    return cfg, gguf_weights(model, cfg), random_tokens(150, cfg.vocab_size, seed=1)


def llama_logits(path, tokens: np.ndarray) -> np.ndarray:
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), logits_all=True, n_ctx=256, n_batch=256, n_ubatch=256, n_threads=2,
                verbose=False, type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32)
    llm.reset()
    llm.eval(tokens.tolist())
    return np.array(llm.scores[: llm.n_tokens], dtype=np.float32)


def reference_logits(path, tokens: np.ndarray, rounding: ActivationRounding) -> np.ndarray:
    model = ReferenceModel.from_model_file(ModelFile(path), rounding)
    return model.forward(tokens, model.new_state())


def test_f32_file_matches_llama_cpp(setup, tmp_path):
    """Measured 7.7e-6 (max relative error, as in test_reference_vs_transformers)."""
    cfg, weights, tokens = setup
    path = write_gguf(tmp_path / "f32.gguf", cfg, weights, set())
    assert max_relative_error(reference_logits(path, tokens, ActivationRounding.EXACT), llama_logits(path, tokens)) < 1e-4


def test_kernel_rounding_tracks_llama_cpp_int8_path(setup, tmp_path):
    """On a Q8_0 file llama.cpp rounds activations to Q8_0 blocks of 32 before each int8 dot product.
    Measured: KERNEL mode 2.2e-2 from llama.cpp (top-1 99%), EXACT mode 1.9e-1 (top-1 93%); the rest is
    llama.cpp's own rounding (x·127/amax, round-half-even in its AVX2 path) amplified by the random model."""
    cfg, weights, tokens = setup
    path = write_gguf(tmp_path / "q8.gguf", cfg, weights, q8_0_names(weights))
    theirs = llama_logits(path, tokens)
    kernel = reference_logits(path, tokens, ActivationRounding.KERNEL)
    exact = reference_logits(path, tokens, ActivationRounding.EXACT)
    assert max_relative_error(kernel, theirs) < 0.05
    assert max_relative_error(kernel, theirs) * 4 < max_relative_error(exact, theirs)
    assert np.mean(np.argmax(kernel, -1) == np.argmax(theirs, -1)) >= 0.95
