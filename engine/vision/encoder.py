"""`ImageEncoder`: what the server, the app and `rigllm generate` hold to turn images into prompt rows.

It pairs a validated mmproj with the text model (same width), prepares images under the mmproj's
pixel bounds and runs the vision tower: the numpy one (built on first use, so a model whose images
run on its GPU backend never holds an fp32 copy in host memory) or any given `Tower` (the CUDA
backend's fp16 one, engine.cuda.vision, which the backend builds and passes in; the server's: the
backend's tower, run on the backend's thread). A GPU tower, like every use of a card, must be driven
from the card's own thread.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from PIL import Image

from engine.vision.mmproj import LoadedMmproj, check_pairing, load_mmproj
from engine.vision.config import VisionConfig
from engine.vision.multimodal_prompt import EncodedImage
from engine.vision.preprocess import PreparedImage, image_token_count, prepare_image
from engine.vision.tower import VisionTower


class Tower(Protocol):
    def encode(self, image: PreparedImage) -> np.ndarray:
        """Embeddings [tokens, D] of one prepared image."""


class ImageEncoder:
    """Images → `EncodedImage`s (merged grid + text-width embeddings) for one text model."""

    def __init__(self, mmproj: LoadedMmproj, tower: Tower | None = None):
        """`tower`: run this one (e.g. a GPU tower); None: the numpy fp32 tower, loaded at the first image."""
        self.mmproj = mmproj
        self._tower: Any = tower
        self._lock = threading.Lock()

    @property
    def tower(self) -> Tower:
        with self._lock:  # two request threads may ask for the numpy tower at once; build it once
            if self._tower is None:
                self._tower = VisionTower.from_mmproj(self.mmproj)
            return self._tower

    @classmethod
    def open(cls, mmproj_path: str | Path, text_width: int, model_label: str) -> "ImageEncoder":
        """Load and validate `mmproj_path`, refusing one made for a model of another width."""
        mmproj = load_mmproj(mmproj_path)
        check_pairing(mmproj, text_width, model_label)
        return cls(mmproj)

    @property
    def config(self) -> VisionConfig:
        return self.mmproj.config

    def token_count(self, img: Image.Image) -> int:
        """LLM positions the image will take (for context checks before running the tower)."""
        return image_token_count(img.width, img.height, self.config)

    def prepare(self, img: Image.Image) -> PreparedImage:
        return prepare_image(img, self.config)

    def encode(self, img: Image.Image | PreparedImage) -> EncodedImage:
        """Run the tower on an RGB image (decoded by engine.vision.image_io) or an already prepared one."""
        prepared = img if isinstance(img, PreparedImage) else self.prepare(img)
        return EncodedImage(prepared.merged_grid, self.tower.encode(prepared))


def loaded_tower(encoder: ImageEncoder | None) -> Tower:
    """A backend's tower; a user error when the backend was loaded without an mmproj (the backends'
    `encode_image` share it)."""
    if encoder is None:
        from engine.errors import RigllmError

        raise RigllmError("this model was loaded without an mmproj (vision tower); it takes no images")
    return encoder.tower
