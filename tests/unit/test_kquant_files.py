"""K-quant model files: accepted wherever Q8_0 is (validation, `rigllm info`, the planner), read by the
reference, and other quantized types refused with a message that names them.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from engine.cuda.kq_layout import device_layout, dequantize_device
from engine.errors import ModelFileError
from engine.model.model_footprint import footprint_of
from engine.gguf.kquant_blocks import KQUANT_TYPES
from engine.gguf.loader import load_model
from engine.fixtures.synthetic import write_random_model
from engine.gguf.tensor_plan import planned_types
from engine.reference.activation_rounding import ActivationRounding
from engine.reference.model import ReferenceModel
from tests.kquant_data import KQ_FILE_TYPES, kquant_tiny_config
from tests.unit.loader_fixtures import tiny_vocab


def tiny_kq_config(**changes):
    return dataclasses.replace(kquant_tiny_config(), vocab_size=len(tiny_vocab().tokens), **changes)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kq")
    return {t: write_random_model(folder / f"tiny-{t}.gguf", tiny_kq_config(), t, seed=1, vocab=tiny_vocab())
            for t in KQ_FILE_TYPES}


@pytest.mark.parametrize("weight_type", KQ_FILE_TYPES)
def test_kquant_files_validate_with_the_planned_types(files, weight_type):
    model = load_model(files[weight_type])
    cfg = model.config
    planned = {n: t for n, _, t in planned_types(cfg, weight_type)}
    assert {n: info.ggml_type for n, info in model.file.tensors.items()} == planned
    assert sum(model.type_counts.values()) == len(planned)
    fp = footprint_of(model)
    assert fp.file_bytes == sum(model.file.tensors[n].n_bytes for n in planned) and fp.requantised == 0


def test_info_reports_the_types_and_real_bytes(files):
    out = subprocess.run([sys.executable, "-m", "engine.cli", "info", "--json", str(files["q4_k_m"])],
                         capture_output=True, text=True, check=True)
    info = json.loads(out.stdout)
    model = load_model(files["q4_k_m"])
    assert info["tensor_types"] == model.type_counts and set(info["tensor_types"]) == {"Q4_K", "Q6_K", "F32"}
    assert info["weight_bytes"]["file"] == sum(t.n_bytes for t in model.file.tensors.values())
    assert info["plans"][0]["fits"]


@pytest.mark.parametrize("weight_type", KQ_FILE_TYPES)
def test_reference_reads_kquant_weights_as_the_device_layout_means_them(files, weight_type):
    """The reference on the file (gguf-py's dequantize) and on weights rebuilt from the kernels' device
    layout give bit-identical logits in both rounding modes."""
    model = load_model(files[weight_type])
    mf = model.file
    tokens = np.random.default_rng(0).integers(0, model.config.vocab_size, 12).tolist()
    for rounding in ActivationRounding:
        ref = ReferenceModel.from_model_file(mf, rounding)
        weights = {}
        for name, info in mf.tensors.items():
            if info.ggml_type in KQUANT_TYPES:
                rows, k = info.numpy_shape
                weights[name] = dequantize_device(device_layout(np.asarray(mf.raw(name)), info.ggml_type, rows, k),
                                                  info.ggml_type, rows, k)
            else:
                weights[name] = mf.tensor(name)
        rebuilt = ReferenceModel(ref.cfg, weights, rounding)
        want = ref.forward(tokens, ref.new_state())
        got = rebuilt.forward(tokens, rebuilt.new_state())
        assert np.isfinite(want).all() and np.array_equal(got, want), rounding


def test_a_q5_0_fallback_tensor_is_refused_naming_its_type(tmp_path):
    """A row of 320 values is not a whole Q4_K super-block: llama.cpp falls back to Q5_0, which rigllm
    does not run; the message names the type, the tensor and what to use instead."""
    path = write_random_model(tmp_path / "odd.gguf", tiny_kq_config(d_ff=320), "q4_k_m", seed=1, vocab=tiny_vocab())
    with pytest.raises(ModelFileError, match=r"has type Q5_0 .*Q4_K.*Q4_K_M"):
        load_model(path)


def test_kquant_types_are_counted_in_the_q4_k_m_footprint_plan(files):
    model = load_model(files["q4_k_m"])
    counts = Counter(info.ggml_type for info in model.file.tensors.values())
    assert counts[Q.Q6_K] > 0 and counts[Q.Q4_K] > counts[Q.Q6_K]
