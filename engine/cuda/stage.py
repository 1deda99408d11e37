"""One stage of the CUDA backend: a card and its share of the model, and how the layers are shared out.

A stage is one card (its own context, on its own executor: engine.cuda.card_thread) holding a contiguous
range of trunk layers with their weights, and their KV caches and GDN states for every slot, in a
`SlotDecoder`. The first stage embeds tokens (and holds the vision tower, given an mmproj: image rows
enter the model there), the last holds the final norm, the LM head and the samplers; a single card is
both. A stage without the LM head also has the bridge buffers its hidden rows leave through.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from engine.cuda.driver import CudaCard
from engine.cuda.slot_decoder import SlotDecoder
from engine.errors import RigllmError
from engine.generation.backend import CardSpec
from engine.model.memory_plan import CardProfile, MemoryPlan, layer_cuts
from engine.vision.encoder import ImageEncoder


class Stage:
    """One card's share of the model; built and used only on its card's executor."""

    def __init__(self, index: int, spec: CardSpec, card_factory: Callable[..., CudaCard] = CudaCard,
                 name: str | None = None):
        """`card_factory(device, capacity_bytes=, name=)` makes the context (tests without a GPU pass a
        stand-in); `name` labels the card in plans and errors (the driver's "cuda:N" when None)."""
        self.index = index
        self.card = card_factory(spec.device, capacity_bytes=spec.capacity_bytes, name=name)
        self.images: ImageEncoder | None = None  # the vision tower (first stage, given an mmproj)

    def profile(self) -> CardProfile:
        """The card as the memory planner sees it: a logical card's cap, else the GPU less what others use."""
        total = self.card.capacity_bytes or self.card.total_bytes
        other = 0 if self.card.capacity_bytes else max(0, total - self.card.free_bytes())
        return CardProfile(self.card.name, total, other_used_bytes=other)

    def load(self, decoder: SlotDecoder) -> None:
        """Take the card's decoder; a card without the LM head also gets two bridge buffers, so chunk c+1 is
        copied out while the next card still reads chunk c."""
        self.decoder = decoder
        if not decoder.fwd.heads:
            shape = (decoder.prefill_chunk, decoder.config.d_model)
            self.out = [self.card.pinned(shape, np.float32, portable=True) for _ in range(2)]

    def close(self) -> None:
        self.card.close()


def split_layers(n_layers: int, counts: Sequence[int]) -> list[range]:
    """Contiguous ranges from per-card layer counts (a user override like 22,22,20)."""
    cuts = layer_cuts(n_layers, counts)
    return [range(a, b) for a, b in zip(cuts[:-1], cuts[1:])]


def layer_spans(n_layers: int, n_cards: int, split: Sequence[int] | None, plan: MemoryPlan | None) -> list[range]:
    """Each card's trunk layers: the user's `split`, else the memory plan's (by free memory and per-layer
    cost), else (synthetic weights, no plan) as even as the count allows."""
    if split is not None:
        spans = split_layers(n_layers, split)
    elif plan is not None:
        spans = [c.layers for c in plan.cards]
    else:
        base, extra = divmod(n_layers, n_cards)
        spans = split_layers(n_layers, [base + (i < extra) for i in range(n_cards)])
    if len(spans) != n_cards:
        raise RigllmError(f"the split gives {len(spans)} cards, {n_cards} were given")
    return spans
