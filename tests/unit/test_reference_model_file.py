"""`ReferenceModel.from_model_file`: a GGUF written in a tmp dir loads into the same model as the
in-memory weights, and the fp32-kernel exemptions of the rounding mode come from the tensor types."""

from __future__ import annotations

import numpy as np
import pytest

from engine.gguf.model_file import ModelFile
from engine.reference import ActivationRounding, ReferenceModel
from engine.model.model_footprint import FP32_KERNEL_SUFFIXES
from reference_fixtures import SHAPES, gguf_weights, model_config, perturbed_model, q8_0_names, random_tokens, write_gguf

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def setup():
    model = perturbed_model(SHAPES[1], seed=0)  # untied: output.weight present
    cfg = model_config(model)
    return cfg, gguf_weights(model, cfg)


def test_f32_file_loads_the_same_model(setup, tmp_path):
    cfg, weights = setup
    loaded = ReferenceModel.from_model_file(ModelFile(write_gguf(tmp_path / "m.gguf", cfg, weights, set())))
    assert loaded.cfg.is_recurrent == cfg.is_recurrent and loaded.cfg.vocab_size == cfg.vocab_size
    assert not loaded.cfg.tied_embeddings
    in_memory = ReferenceModel(cfg, weights)
    tokens = random_tokens(70, cfg.vocab_size, seed=8)
    np.testing.assert_allclose(
        loaded.forward(tokens, loaded.new_state()), in_memory.forward(tokens, in_memory.new_state()), rtol=0, atol=1e-5
    )


@pytest.mark.parametrize("alpha_beta_q8", [False, True])
def test_fp32_kernel_exemptions_follow_tensor_types(setup, tmp_path, alpha_beta_q8):
    """contracts.md: `ssm_alpha`/`ssm_beta` stored F32 run in fp32 kernels, so KERNEL mode leaves their input."""
    cfg, weights = setup
    q8 = q8_0_names(weights, keep_f32=() if alpha_beta_q8 else FP32_KERNEL_SUFFIXES)
    path = write_gguf(tmp_path / "q8.gguf", cfg, weights, q8)
    model = ReferenceModel.from_model_file(ModelFile(path), ActivationRounding.KERNEL)
    gdn = model.blocks[0].mixer
    assert gdn.alpha.round_input is alpha_beta_q8 and gdn.beta.round_input is alpha_beta_q8
    assert gdn.qkv.round_input and gdn.out.round_input and model.lm_head.round_input
    assert np.isfinite(model.forward(random_tokens(5, cfg.vocab_size, seed=9), model.new_state())).all()
