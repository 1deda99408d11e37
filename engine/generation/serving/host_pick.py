"""Picking a constrained job's tokens on the host: the slot's logits row, biased by the request's
`logit_bias` and masked by the grammar's bitset for this step, then sampled.

The slot backend samples on its own (on the GPU for CUDA) and cannot apply a grammar yet, so a
constrained job asks for its logits rows (`SlotRequest.host_logits`) and the scheduler re-picks the
token here, then feeds that token at the next step. The job keeps one `Sampler` (its seed replays)
whose penalty history is the prompt plus every generated token, as the slot's own sampler sees it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from engine.generation.grammar.constraint import GrammarConstraint
from engine.generation.sampler import Sampler, SamplingParams


class HostPicker:
    def __init__(self, constraint: GrammarConstraint | None, params: SamplingParams, prompt_ids: Sequence[int],
                 logit_bias: Mapping[int, float] | None = None):
        self.constraint = constraint
        self._sampler = Sampler(params)
        self._history = list(prompt_ids)
        self._bias_ids = np.array(list(logit_bias or {}), dtype=np.int64)
        self._bias = np.array(list((logit_bias or {}).values()), dtype=np.float32)

    def choose(self, logits: np.ndarray | None, picked: int, remaining: int, constrained: bool) -> int:
        """The job's next token. `picked`: the slot's own choice, kept while `constrained` is off (the
        reasoning before the structured part); `remaining`: tokens left in the budget, this one included."""
        grammar = self.constraint if constrained else None
        if grammar is not None or self._bias.size:
            if logits is None:
                raise RuntimeError("a constrained or biased job needs its logits rows (SlotRequest.host_logits)")
            row = logits.astype(np.float32, copy=True)
            row[self._bias_ids] += self._bias
            if grammar is not None:
                allowed = grammar.allowed(remaining)
                row = np.where(allowed, row[: allowed.size], -np.inf)
            picked = self._sampler.sample(row, self._history)
            if grammar is not None:
                grammar.accept(picked)
        self._history.append(picked)
        return picked

    def accept_forced(self, token: int) -> None:
        """A token the job was made to take (the thinking budget's `</think>`): into the penalty history."""
        self._history.append(token)
