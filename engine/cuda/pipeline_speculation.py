"""MTP speculative rounds over several cards (issue 28 item 6; the single-card round: engine.cuda.speculative).

The last card holds the LM head, so the MTP head, its caches and the acceptance rule live there. Rounds for the
slots of a step, each fed token x_n (one slot, or several that all speculate now and whose K+1 verify rows each fit
one GEMV, as on one card):

1. the last card's head drafts each slot's d_1..d_K (`CudaSpeculator.draft`) and the ids come back to the host;
2. every other card, in order, runs its layers of the verifies over each slot's [x_n, d_1..d_K], all slots in one
   pass (`SlotDecoder.verify_part`: token ids on the first card, the previous card's hidden rows after it), its GDN
   layers keeping each slot's ring of states, and hands its hidden rows on (one hop per boundary, as a decode
   step's rows);
3. the last card finishes the verifies, picks each slot's targets and applies its rule, the same greedy arg-max
   comparison or sampled min(1, p/q) rule as on one card (`CudaSpeculator.decide`), so the output is what one
   card would give;
4. each slot's accepted count j goes to every other card (`SlotDecoder.commit_verify`): a card whose GDN states ran
   past d_j restores ring slot j, and every card moves the slot j+1 rows on.

Only ids and hidden rows cross PCIe. The commits run on the other cards at once, and the rounds return
when all are done, so every card's host view of the slots (their positions) agrees when they return.
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
        """A decode step over `feeds` as speculative rounds of all its slots, when they may take one now; None
        otherwise (the caller takes a plain step)."""
        if not self.last.speculates_together(feeds, masks):
            return None
        emitted = self.rounds(feeds)
        k = self.last.speculator.k  # type: ignore[union-attr]
        return None if emitted is None else {slot: Pick.of_round(tokens, k) for slot, tokens in emitted.items()}

    def rounds(self, feeds: Mapping[int, int]) -> dict[int, list[int]] | None:
        """Feed each slot its token and return per slot the tokens its round yields (accepted drafts + one); None
        when the slots cannot take rounds now (nothing ran)."""
        speculator = self.last.speculator
        assert speculator is not None
        last = self.executors[-1]
        drafts = last.call(speculator.draft, feeds)
        if drafts is None:
            return None
        tokens = {slot: [feeds[slot], *d] for slot, d in drafts.items()}
        hidden = None
        for ex, st in zip(self.executors[:-1], self.stages[:-1]):
            hidden = self.hop(ex.call(st.decoder.verify_part, tokens, hidden))
        emitted = last.call(speculator.decide, hidden)
        accepted = {slot: len(run) - 1 for slot, run in emitted.items()}
        commits = [ex.submit(st.decoder.commit_verify, accepted) for ex, st in zip(self.executors[:-1], self.stages[:-1])]
        for f in commits:
            f.result()
        return emitted
