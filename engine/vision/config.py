"""`VisionConfig`: the hyperparameters of a Qwen3.5 vision tower (spec §9.1), from an mmproj GGUF or an HF config.

One description serves the converter (HF config → keys), the loader (keys → validated config), the
preprocessor (patch size, merge size, normalisation, pixel bounds) and the towers (widths, heads).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

PROJECTOR_TYPE = "qwen3vl_merger"

# Image pixel bounds when the mmproj carries none: llama.cpp's defaults (8 … 4096 merged tokens of
# 32×32 pixels). HF's processor allows 64 … 16384 tokens; 4096 tokens keeps one image's prefill and the
# ViT's quadratic attention affordable on a 16 GiB card while keeping ≥ 1024 tokens for typical photos.
DEFAULT_MIN_TOKENS = 8
DEFAULT_MAX_TOKENS = 4096


@dataclass(frozen=True)
class VisionConfig:
    n_embd: int  # ViT width (1152 for 9B/27B)
    n_ff: int  # ViT MLP width
    n_layers: int
    n_head: int
    patch_size: int  # 16
    merge_size: int  # 2: a 2×2 block of patches becomes one LLM token
    image_size: int  # learned position grid side × patch size (768 → a 48×48 grid)
    eps: float  # LayerNorm epsilon
    projection_dim: int  # text model width D
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    min_pixels: int | None = None  # per-file bounds (clip.vision.image_min/max_pixels); None: our defaults
    max_pixels: int | None = None

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def pos_side(self) -> int:
        """Side of the learned square position-embedding grid."""
        return self.image_size // self.patch_size

    @property
    def factor(self) -> int:
        """Image sides are resized to multiples of this (patch × merge = 32 pixels)."""
        return self.patch_size * self.merge_size

    @property
    def merged_width(self) -> int:
        """Input width of the merger MLP: the 2×2 patches of one token, concatenated."""
        return self.n_embd * self.merge_size**2

    def pixel_bounds(self) -> tuple[int, int]:
        """(min, max) pixels an image is resized into: the file's bounds, else llama.cpp's token defaults."""
        unit = self.factor * self.factor
        low = self.min_pixels if self.min_pixels is not None else DEFAULT_MIN_TOKENS * unit
        high = self.max_pixels if self.max_pixels is not None else DEFAULT_MAX_TOKENS * unit
        return low, high

    @classmethod
    def from_hf(cls, hf_config: Mapping[str, Any], preprocessor: Mapping[str, Any]) -> "VisionConfig":
        """From an HF multimodal config.json (its `vision_config`, the text width and eps) and preprocessor config.

        Defaults follow llama.cpp's converter: image size from the position-embedding count, the text
        `rms_norm_eps` as the LayerNorm epsilon (the ViT's own LayerNorms use 1e-6 too).
        """
        vision = hf_config["vision_config"]
        text = {**hf_config, **hf_config.get("text_config", {})}
        patch = int(vision.get("patch_size", 16))
        image_size = int(vision.get("image_size") or int(int(vision.get("num_position_embeddings", 2304)) ** 0.5 * patch))
        return cls(
            n_embd=int(vision["hidden_size"]),
            n_ff=int(vision["intermediate_size"]),
            n_layers=int(vision["depth"]),
            n_head=int(vision["num_heads"]),
            patch_size=patch,
            merge_size=int(vision.get("spatial_merge_size", 2)),
            image_size=image_size,
            eps=float(text.get("rms_norm_eps", 1e-6)),
            projection_dim=int(text["hidden_size"]),
            image_mean=tuple(float(x) for x in preprocessor.get("image_mean", (0.5, 0.5, 0.5))),  # type: ignore[arg-type]
            image_std=tuple(float(x) for x in preprocessor.get("image_std", (0.5, 0.5, 0.5))),  # type: ignore[arg-type]
        )
