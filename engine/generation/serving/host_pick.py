"""Picking a constrained job's tokens on the host: the slot's logits row, masked by the grammar's
bitset for this step, then sampled.

The slot backend samples on its own (on the GPU for CUDA) and cannot apply a grammar yet, so a
constrained job asks for its logits rows (`SlotRequest.host_logits`) and the scheduler re-picks the
token here, then feeds that token at the next step. The job keeps one `Sampler` (its seed replays)
whose penalty history is the prompt plus every generated token, as the slot's own sampler sees it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.generation.grammar.constraint import GrammarConstraint
from engine.generation.sampler import Sampler, SamplingParams


class HostPicker:
    def __init__(self, constraint: GrammarConstraint, params: SamplingParams, prompt_ids: Sequence[int]):
        self.constraint = constraint
        self._sampler = Sampler(params)
        self._history = list(prompt_ids)

    def choose(self, logits: np.ndarray | None, picked: int, remaining: int, constrained: bool) -> int:
        """The job's next token. `picked`: the slot's own choice, kept while `constrained` is off (the
        reasoning before the structured part); `remaining`: tokens left in the budget, this one included."""
        if constrained:
            if logits is None:
                raise RuntimeError("a constrained job needs its logits rows (SlotRequest.host_logits)")
            allowed = self.constraint.allowed(remaining)
            masked = np.where(allowed, logits[: allowed.size], -np.inf)
            picked = self._sampler.sample(masked, self._history)
            self.constraint.accept(picked)
        self._history.append(picked)
        return picked

    def accept_forced(self, token: int) -> None:
        """A token the job was made to take (the thinking budget's `</think>`): into the penalty history."""
        self._history.append(token)
