"""A single-sequence `Backend` that decodes speculatively, for `TokenStream` (`rigllm generate`).

`TokenStream` hands decoding to a backend's `decode_on_device` when it has one (the CUDA backend's
fast path); this view of slot 0 of a speculating `HostSlots` uses the same hook, so the CLI keeps its
one loop, stop rules and timing while each step may yield several tokens.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence

import numpy as np

from engine.generation.backend import Backend
from engine.generation.sampler import SamplingParams
from engine.generation.slots import HostSlots, decode_tokens
from engine.generation.speculative import SpeculationStats


class SpeculativeStream:
    """Slot 0 of `HostSlots` over a backend whose `speculative_model` has an MTP head (the reference's)."""

    def __init__(self, backend: Backend, draft_tokens: int = 1):
        self.slots = HostSlots(backend, 1, speculative=True, draft_tokens=draft_tokens)
        if self.slots.speculator is None:
            raise ValueError("the model has no MTP head to speculate with")
        self.name = f"{backend.name} + MTP (K={draft_tokens})"
        self.config = backend.config

    @property
    def stats(self) -> SpeculationStats:
        assert self.slots.speculator is not None
        return self.slots.speculator.stats

    def new_sequence(self) -> int:
        self.slots.reset_slot(0)
        return 0

    def forward_last(self, token_ids: Sequence[int], sequence: int) -> np.ndarray:
        self.slots.prefill_slot(sequence, token_ids)
        logits = self.slots.last_logits(sequence)
        assert logits is not None
        return logits

    def decode_on_device(self, sequence: int, params: SamplingParams, history: Sequence[int], max_tokens: int,
                         stop_ids: Collection[int] = ()) -> Iterator[int]:
        return decode_tokens(self.slots, sequence, params, history, max_tokens, stop_ids, lambda: False)

    def close(self) -> None:
        self.slots.close()
