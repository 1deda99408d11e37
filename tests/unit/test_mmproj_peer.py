"""Our mmproj converter against llama.cpp's (`convert_hf_to_gguf.py --mmproj`, llama-cpp-python 0.3.36 sdist).

Same tiny multimodal checkpoint through both: the files must have the same key/value set (values and
value types, in order) and the same tensors (names, order, shapes, types, bytes). Marker `peer` (run
with `pytest -m peer`); skips when the sdist cannot be had or without torch/transformers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from converter_fixtures import gguf_fields, gguf_tensors
from test_vision_fixtures import tiny_vlm  # noqa: F401 (fixture)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "peer"))
from test_converter_peer import RUN_CONVERTER, llama_converter_root  # noqa: E402

from engine.vision.convert_mmproj import convert_mmproj  # noqa: E402

pytestmark = pytest.mark.peer


@pytest.mark.parametrize("out_type", ["f32", "f16", "bf16", "q8_0"])
def test_same_mmproj_as_llama_cpp_converter(tiny_vlm, tmp_path, out_type):
    ref = tmp_path / "llama.gguf"
    args = [sys.executable, "-c", RUN_CONVERTER, str(llama_converter_root()), str(tiny_vlm.hf_dir), "--mmproj",
            "--outtype", out_type, "--outfile", str(ref)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": ""})
    assert result.returncode == 0, result.stderr[-3000:]
    ours = convert_mmproj(tiny_vlm.hf_dir, tmp_path / "ours.gguf", out_type)

    ref_fields, our_fields = gguf_fields(ref), gguf_fields(ours)
    assert list(our_fields) == list(ref_fields)
    for key, value in ref_fields.items():
        assert our_fields[key] == value, key
    ref_tensors, our_tensors = gguf_tensors(ref), gguf_tensors(ours)
    assert [t[:3] for t in our_tensors] == [t[:3] for t in ref_tensors]
    for (name, qtype, _, want), (_, _, _, got) in zip(ref_tensors, our_tensors):
        np.testing.assert_array_equal(got, want, err_msg=f"{name} ({qtype})")
