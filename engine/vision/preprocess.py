"""RGB image → normalised pixels on the patch grid (spec §9.3), as transformers' Qwen2-VL image processor does.

Steps: "smart resize" so both sides are multiples of 32 (patch 16 × merge 2) and the pixel count lies
within the bounds, bicubic on 8-bit RGB; scale to [0, 1]; normalise per channel with the mmproj's
mean/std. The two-frame duplication of a still image is folded into the tower (the two temporal patch
kernels are summed), so the pixels are kept once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

from engine.vision.config import VisionConfig
from engine.vision.image_io import ImageError

MAX_ASPECT = 200  # transformers refuses more elongated images; so do we, with a message


@dataclass(frozen=True)
class PreparedImage:
    """Normalised pixels [3, H, W] (float32, H and W multiples of 32) and the patch grid they form."""

    pixels: np.ndarray
    patch_size: int
    merge_size: int

    @property
    def grid(self) -> tuple[int, int]:
        """(rows, cols) of patches."""
        return self.pixels.shape[1] // self.patch_size, self.pixels.shape[2] // self.patch_size

    @property
    def merged_grid(self) -> tuple[int, int]:
        """(rows, cols) of LLM tokens: one per 2×2 block of patches."""
        gh, gw = self.grid
        return gh // self.merge_size, gw // self.merge_size

    @property
    def n_tokens(self) -> int:
        mh, mw = self.merged_grid
        return mh * mw

    def patches(self) -> np.ndarray:
        """Patches [gh·gw, 3, p, p] in merge order: 2×2 blocks row-major, each block TL, TR, BL, BR (spec §9.4)."""
        p, m = self.patch_size, self.merge_size
        gh, gw = self.grid
        x = self.pixels.reshape(3, gh // m, m, p, gw // m, m, p)
        x = x.transpose(1, 4, 2, 5, 0, 3, 6)  # block row, block col, in-row, in-col, C, py, px
        return np.ascontiguousarray(x.reshape(gh * gw, 3, p, p))


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Target (height, width): multiples of `factor`, aspect kept, pixel count within [min_pixels, max_pixels].

    transformers' `smart_resize` (Python's round-half-to-even included), with a RigllmError for the
    aspect ratios it refuses. A side that rounds to 0 makes the area fall below `min_pixels`, so the
    upscaling branch gives it at least one `factor`.
    """
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise ImageError(f"image: {width}×{height} is too elongated (aspect ratio above {MAX_ASPECT}:1)")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def target_size(width: int, height: int, cfg: VisionConfig) -> tuple[int, int]:
    """(height, width) an image of this size is resized to under `cfg`'s pixel bounds."""
    low, high = cfg.pixel_bounds()
    return smart_resize(height, width, cfg.factor, low, high)


def image_token_count(width: int, height: int, cfg: VisionConfig) -> int:
    """How many `<|image_pad|>` tokens (LLM positions) an image of this size takes, before running anything."""
    h, w = target_size(width, height, cfg)
    return (h // cfg.factor) * (w // cfg.factor)


def prepare_image(img: Image.Image, cfg: VisionConfig) -> PreparedImage:
    """Resize, rescale and normalise an RGB image (from engine.vision.image_io) for `cfg`'s tower."""
    if img.mode != "RGB":
        raise ValueError(f"prepare_image needs an RGB image, got mode {img.mode} (decode with image_io first)")
    h, w = target_size(img.width, img.height, cfg)
    if (w, h) != img.size:
        img = img.resize((w, h), resample=Image.Resampling.BICUBIC)
    x = np.asarray(img, dtype=np.float32).transpose(2, 0, 1) * np.float32(1 / 255)
    mean = np.asarray(cfg.image_mean, np.float32)[:, None, None]
    std = np.asarray(cfg.image_std, np.float32)[:, None, None]
    return PreparedImage(np.ascontiguousarray((x - mean) / std), cfg.patch_size, cfg.merge_size)
