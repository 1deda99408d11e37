"""A random-weight mmproj GGUF for a `VisionConfig`, written with numpy alone (no torch, no checkpoint).

GPU machines run the multimodal backend tests without transformers, so they need a vision tower file
made from a seed. Weights are drawn so activations stay O(1) through the tower: LayerNorm gains near 1,
matrices with std 1/sqrt(fan_in), position table std 0.5. Keys are the converter's (convert_mmproj).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter, LlamaFileType

from engine.gguf.gguf_stream import PlannedTensor, TensorStream
from engine.vision.convert_mmproj import write_mmproj_keys
from engine.gguf.metadata import named_metadata
from engine.vision.mmproj import CLIP_ARCH, mmproj_tensors
from engine.gguf.tensor_types import tensor_type
from engine.vision.config import VisionConfig

_NORM_GAINS = ("ln1.weight", "ln2.weight", "v.post_ln.weight")


def random_tower_weights(cfg: VisionConfig, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Every tower tensor (numpy shapes of `mmproj_tensors`), fp32."""
    out = {}
    for name, shape in mmproj_tensors(cfg):
        if len(shape) == 1:
            mean = 1.0 if name.endswith(_NORM_GAINS) else 0.0
            out[name] = (mean + rng.standard_normal(shape) * 0.2).astype(np.float32)
        elif name == "v.position_embd.weight":
            out[name] = (rng.standard_normal(shape) * 0.5).astype(np.float32)
        else:
            fan_in = int(np.prod(shape[1:]))
            out[name] = (rng.standard_normal(shape) * fan_in**-0.5).astype(np.float32)
    return out


def write_random_mmproj(path: str | Path, cfg: VisionConfig, seed: int = 0) -> Path:
    """Write an F32 mmproj of `cfg` with `random_tower_weights` from `seed`; returns the path."""
    weights = random_tower_weights(cfg, np.random.default_rng(seed))
    file_type = LlamaFileType.ALL_F32
    planned = [PlannedTensor(name, shape, tensor_type(name, shape, file_type)) for name, shape in mmproj_tensors(cfg)]
    writer = GGUFWriter(path, CLIP_ARCH)
    stream = TensorStream(writer, planned)
    write_mmproj_keys(writer, cfg, file_type, named_metadata("rigllm random vision tower", sum(w.size for w in weights.values())))
    stream.write_metadata()
    for t in planned:
        stream.write_tensor(t.name, [weights[t.name]])
    stream.close()
    return Path(path)
