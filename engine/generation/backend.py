"""The interface the generation layer drives: `Backend`, its optional image capability, and `CardSpec`.

A backend owns the model's weights and runs forward passes on opaque per-sequence state objects;
the generation layer above it (prompting, sampling, streaming, serving) never sees how. There are
two: the numpy reference (engine.reference.backend) and the CUDA backend on one or several cards
(engine.cuda.backend, each card a stage of one pipeline), which also decodes several sequences natively
(engine.generation.slots.SlotBackend). engine.backends opens them; nothing in this package knows
which one it drives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, Sequence

import numpy as np

from engine.gguf.config import ModelConfig

if TYPE_CHECKING:
    from engine.vision.multimodal_prompt import PromptSegment


class Backend(Protocol):
    """Runs the model: a sequence object carries the KV cache and GDN state between calls."""

    name: str
    config: ModelConfig

    def new_sequence(self) -> Any:
        """Fresh per-sequence state (empty caches, position 0)."""

    def forward_last(self, token_ids: Sequence[int], sequence: Any) -> np.ndarray:
        """Process `token_ids` continuing `sequence`; return the logits [V] of the last token only."""

    def close(self) -> None:
        """Release devices and memory; the backend is unusable afterwards."""


class EmbeddingBackend(Backend, Protocol):
    """A `Backend` that also prefills image rows (see `takes_embeddings` before calling)."""

    def forward_embedded(self, segment: PromptSegment, sequence: Any) -> np.ndarray:
        """`forward_last` of a multimodal prompt segment: its image rows take their embeddings, at the
        segment's (t, h, w) positions; later calls continue at the largest position + 1."""


def takes_embeddings(backend: Backend) -> bool:
    """Does this backend have `EmbeddingBackend.forward_embedded`?"""
    return callable(getattr(backend, "forward_embedded", None))


@dataclass(frozen=True)
class CardSpec:
    """One card a backend places layers on (engine.backends.open_backend's `cards`)."""

    device: int = 0  # physical GPU index (several logical cards may share one)
    capacity_bytes: int | None = None  # cap this card's memory (a "logical card"); None: the GPU's own
