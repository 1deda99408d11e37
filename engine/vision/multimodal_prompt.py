"""A chat prompt with images → what a backend runs: token ids, image embedding rows, M-RoPE positions (spec §9.5-9.6).

The chat template renders each image as `<|vision_start|><|image_pad|><|vision_end|>` with ONE pad
token. Here each image's pad becomes `mh·mw` pads (one per merged 2×2 block, row-major); those rows
take the image's embeddings instead of the pad embedding. Positions are 3-component (t, h, w):
text tokens (p, p, p) with p counting up; the tokens of an image whose first pad would be at p get
(p, p + y, p + x) for merged-grid row y and column x, and the text after it continues at
p + max(mh, mw) (transformers' `get_rope_index`, llama.cpp's `set_position_mrope_2d`). Decoding then
continues at `next_position` (largest position + 1), not at the token count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from engine.errors import RigllmError

if TYPE_CHECKING:  # vision sits below generation: the tokenizer is only a parameter here
    from engine.generation.tokenizer import Tokenizer

IMAGE_PAD = "<|image_pad|>"
IMAGE_MARKER = "<|vision_start|><|image_pad|><|vision_end|>"  # what the template writes per image


@dataclass(frozen=True)
class EncodedImage:
    """One image through the tower: its merged grid (rows, cols) and embeddings [rows·cols, D], row-major."""

    merged_grid: tuple[int, int]
    embeddings: np.ndarray

    def __post_init__(self) -> None:
        mh, mw = self.merged_grid
        if self.embeddings.ndim != 2 or self.embeddings.shape[0] != mh * mw:
            raise ValueError(f"an {mh}×{mw} image needs {mh * mw} embedding rows, got {self.embeddings.shape}")


@dataclass(frozen=True)
class PromptSegment:
    """A slice of a multimodal prompt for one forward call: rows are relative to the slice."""

    token_ids: list[int]
    positions: np.ndarray  # [T, 3] int64
    embedding_rows: np.ndarray  # [K] int64, indices into token_ids
    embeddings: np.ndarray  # [K, D] float32

    def part(self, start: int, stop: int) -> "PromptSegment":
        """Tokens [start, stop) with their positions and the image rows that fall inside (relative to `start`)."""
        inside = (self.embedding_rows >= start) & (self.embedding_rows < stop)
        return PromptSegment(
            self.token_ids[start:stop],
            self.positions[start:stop],
            self.embedding_rows[inside] - start,
            self.embeddings[inside],
        )

    def chunks(self, size: int) -> list["PromptSegment"]:
        """The segment cut into parts of `size` tokens (the last may be shorter), as a prefill takes them."""
        return [self.part(start, start + size) for start in range(0, len(self.token_ids), size)]


@dataclass(frozen=True)
class MultimodalPrompt:
    """The whole prompt: ids (pads expanded), positions [T, 3], image rows [K] and their embeddings [K, D]."""

    token_ids: list[int]
    positions: np.ndarray
    embedding_rows: np.ndarray
    embeddings: np.ndarray

    @property
    def next_position(self) -> int:
        """Where decoding continues: the largest position used + 1."""
        return int(self.positions.max()) + 1

    def segment(self, start: int, stop: int) -> PromptSegment:
        """Tokens [start, stop) with their positions and the image rows that fall inside (for chunked prefill)."""
        return PromptSegment(self.token_ids, self.positions, self.embedding_rows, self.embeddings).part(start, stop)


def expand_image_pads(token_ids: Sequence[int], images: Sequence[EncodedImage], image_pad_id: int) -> MultimodalPrompt:
    """Replace the k-th single `<|image_pad|>` in `token_ids` by image k's rows; compute M-RoPE positions."""
    n_markers = sum(1 for t in token_ids if t == image_pad_id)
    if n_markers != len(images):
        raise RigllmError(f"the prompt has {n_markers} image markers but {len(images)} images were given")
    ids: list[int] = []
    positions: list[np.ndarray] = []
    rows: list[np.ndarray] = []
    next_image = 0
    p = 0
    for token in token_ids:
        if token != image_pad_id:
            ids.append(token)
            positions.append(np.array([[p, p, p]], dtype=np.int64))
            p += 1
            continue
        mh, mw = images[next_image].merged_grid
        y, x = np.meshgrid(np.arange(mh), np.arange(mw), indexing="ij")
        grid = np.stack([np.zeros(mh * mw, np.int64), y.ravel(), x.ravel()], axis=1) + p
        rows.append(np.arange(len(ids), len(ids) + mh * mw, dtype=np.int64))
        ids.extend([image_pad_id] * (mh * mw))
        positions.append(grid)
        p += max(mh, mw)
        next_image += 1
    width = images[0].embeddings.shape[1] if images else 0
    return MultimodalPrompt(
        token_ids=ids,
        positions=np.concatenate(positions, axis=0) if positions else np.zeros((0, 3), np.int64),
        embedding_rows=np.concatenate(rows) if rows else np.zeros(0, np.int64),
        embeddings=(np.concatenate([im.embeddings for im in images]).astype(np.float32) if images
                    else np.zeros((0, width), np.float32)),
    )


def build_multimodal_prompt(tokenizer: Tokenizer, text: str, images: Sequence[EncodedImage]) -> MultimodalPrompt:
    """Tokenize rendered chat text (one `<|image_pad|>` per image, in order) and splice in the images."""
    pad = tokenizer.token_to_id(IMAGE_PAD)
    if pad is None:
        raise RigllmError(f"the model's vocabulary has no {IMAGE_PAD} token; it cannot take images")
    return expand_image_pads(tokenizer.encode(text, parse_special=True), images, pad)
