"""What the GPU vision tower (engine.cuda.vision) costs in card memory, before any allocation.

The memory planner adds it to the first card (the one that embeds tokens, where the image rows enter
the model): fp16 weight matrices (the two temporal patch kernels summed into one), fp32 biases,
LayerNorm parameters and position table, plus the per-image buffers `encode_on_device` allocates for
the largest image the pixel bounds let through. Kept next to the tower's own allocations by
tests/unit/test_vision_backend_host.py, which counts them on a stand-in card.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod

from engine.model.model_footprint import Footprint
from engine.vision.mmproj import mmproj_tensors
from engine.vision.config import VisionConfig

F16, F32 = 2, 4
_FP32_MATRICES = ("v.position_embd.weight",)
_SECOND_PATCH_KERNEL = "v.patch_embd.weight.1"  # summed into the first at load


@dataclass(frozen=True)
class TowerFootprint:
    weight_bytes: int
    scratch_bytes: int  # one image's buffers at `max_tokens`
    max_tokens: int  # LLM tokens of the largest image the pixel bounds allow


def tower_weight_bytes(cfg: VisionConfig) -> int:
    total = 0
    for name, shape in mmproj_tensors(cfg):
        if name == _SECOND_PATCH_KERNEL:
            continue
        total += prod(shape) * (F32 if len(shape) == 1 or name in _FP32_MATRICES else F16)
    return total


def tower_scratch_bytes(cfg: VisionConfig, tokens: int) -> int:
    """The buffers of one image of `tokens` LLM tokens (its patches are `tokens · merge²`)."""
    n = tokens * cfg.merge_size**2
    e, f, patch = cfg.n_embd, cfg.n_ff, 3 * cfg.patch_size**2
    per_patch = 2 * patch * F16 + e * F32 + e * F16 + f * F16 + 3 * e * F32 + 4 * e * F16
    return n * per_patch + tokens * (cfg.merged_width * F16 + cfg.projection_dim * F32)


def tower_footprint(cfg: VisionConfig) -> TowerFootprint:
    max_tokens = cfg.pixel_bounds()[1] // cfg.factor**2
    return TowerFootprint(tower_weight_bytes(cfg), tower_scratch_bytes(cfg, max_tokens), max_tokens)


def with_tower(fp: Footprint, cfg: VisionConfig | None) -> Footprint:
    """`fp` with the vision tower of `cfg` added (the planner puts it on the first card); None: unchanged."""
    if cfg is None:
        return fp
    tower = tower_footprint(cfg)
    return replace(fp, vision_bytes=(tower.weight_bytes, tower.scratch_bytes))
