"""MTP speculative rounds over several cards (issue 28 item 6; the single-card round: engine.cuda.speculative).

The last card holds the LM head, so the MTP head, its caches and the acceptance rule live there. A round
for a slot fed token x_n:

1. the last card's head drafts d_1..d_K (`CudaSpeculator.draft`) and the K ids come back to the host;
2. every other card, in order, runs its layers of the verify over [x_n, d_1..d_K] (`SlotDecoder.verify_part`:
   token ids on the first card, the previous card's hidden rows after it), its GDN layers keeping their
   ring of states, and hands its K+1 hidden rows on (one hop per boundary, as a decode step's one row);
3. the last card finishes the verify, picks the targets and applies the rule, the same greedy arg-max
   comparison or sampled min(1, p/q) rule as on one card (`CudaSpeculator.decide`), so the output is what
   one card would give;
4. the accepted count j goes to every other card (`SlotDecoder.commit_verify`): a card whose GDN states ran
   past d_j restores ring slot j, and every card moves the slot j+1 rows on.

Only ids and hidden rows cross PCIe. The commits run on the other cards at once, and the round returns
when all are done, so every card's host view of the slot (its position) agrees when the round returns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from engine.cuda.card_thread import CardExecutor
from engine.cuda.stage import Stage
from engine.generation.slots import Pick
from engine.generation.token_mask import StepMasks


class PipelineRounds:
    """Speculative rounds of a backend's slots over its stages (more than one; the last with the MTP head)."""

    def __init__(self, stages: Sequence[Stage], executors: Sequence[CardExecutor],
                 hop: Callable[[np.ndarray], np.ndarray]):
        if len(stages) < 2 or stages[-1].decoder.speculator is None:
            raise ValueError("pipeline rounds need several cards, the last with the MTP head")
        self.stages, self.executors, self.hop = stages, executors, hop
        self.last = stages[-1].decoder

    def step(self, feeds: Mapping[int, int], masks: StepMasks | None) -> dict[int, Pick] | None:
        """A decode step over `feeds` as a speculative round, when it feeds one slot alone that speculates now;
        None otherwise (the caller takes a plain step)."""
        slot = self.last.lone_slot(feeds, masks)
        if slot is None:
            return None
        speculator = self.last.speculator
        pick = Pick.of_round(speculator.stats, lambda: self.round(slot, feeds[slot]))  # type: ignore[union-attr]
        return None if pick is None else {slot: pick}

    def round(self, slot: int, token: int) -> list[int] | None:
        """Feed `token` to `slot` and return the tokens the round yields (accepted drafts + one); None when the
        slot does not speculate now (nothing ran)."""
        speculator = self.last.speculator
        assert speculator is not None
        last = self.executors[-1]
        drafts = last.call(speculator.draft, slot, token)
        if drafts is None:
            return None
        tokens = [token, *drafts]
        hidden = None
        for ex, st in zip(self.executors[:-1], self.stages[:-1]):
            hidden = self.hop(ex.call(st.decoder.verify_part, slot, tokens, hidden))
        emitted = last.call(speculator.decide, hidden)
        accepted = len(emitted) - 1
        commits = [ex.submit(st.decoder.commit_verify, slot, accepted)
                   for ex, st in zip(self.executors[:-1], self.stages[:-1])]
        for f in commits:
            f.result()
        return emitted
