"""Shared fixtures of the vision tests (imported by them; this module holds no tests of its own).

`tiny_vlm` builds one tiny random `Qwen3_5ForConditionalGeneration` folder per session (needs torch
and transformers; tests skip without them) and converts it with rigllm: the text GGUF (f32) and the
mmproj (f32). `hf_vlm` loads the transformers model from that folder, fp32 eval mode. Each module that
imports a session fixture gets its own copy of it, so the built objects are cached here, once per run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image


@dataclass(frozen=True)
class TinyVlm:
    hf_dir: Path
    text_gguf: Path
    mmproj: Path


_CACHE: dict[str, Any] = {}


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory: pytest.TempPathFactory) -> TinyVlm:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from engine.gguf.convert import convert
    from engine.vision.convert_mmproj import convert_mmproj
    from engine.fixtures.tiny_vision import make_tiny_vlm

    if "tiny" not in _CACHE:
        root = tmp_path_factory.mktemp("tiny-vlm")
        hf_dir = make_tiny_vlm(root / "hf", "gqa2-hv2", seed=0)
        text = convert(hf_dir, root / "model.gguf", "f32")
        mmproj = convert_mmproj(hf_dir, root / "mmproj-model.gguf", "f32")
        _CACHE["tiny"] = TinyVlm(hf_dir, text, mmproj)
    return _CACHE["tiny"]


@pytest.fixture(scope="session")
def hf_vlm(tiny_vlm: TinyVlm):
    import torch
    from transformers import Qwen3_5ForConditionalGeneration

    if "hf" not in _CACHE:
        _CACHE["hf"] = Qwen3_5ForConditionalGeneration.from_pretrained(tiny_vlm.hf_dir, dtype=torch.float32).eval()
    return _CACHE["hf"]


def random_image(height: int, width: int, seed: int) -> Image.Image:
    """An RGB noise image (every pixel matters, so an ordering mistake cannot hide)."""
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


def hf_pixel_values(patches: np.ndarray) -> np.ndarray:
    """Our merge-ordered patches [n, 3, p, p] in transformers' layout: both frames, [n, 3·2·p·p]."""
    return np.repeat(patches[:, :, None], 2, axis=2).reshape(patches.shape[0], -1)
