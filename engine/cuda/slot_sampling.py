"""Sampling and logprobs of a decoder's slots, for one slot at a time or all rows of a batched step at once.

Each slot keeps its request state side by side with the other slots' (sampling parameters with the draw
counter, token counts, the logprobs flag: [slots] arrays), and the passes write row-major scratch for as many
rows as there are slots. A batched step samples all its rows in one launch per stage, row r with slot
row_slot[r]'s state (the same row → slot array the slot-indexed mixers read: engine.cuda.slot_batch), so
the step's graph does not depend on which slots are stepped: one graph per batch width. Picks and logprob
records come back in row order, one copy each.

Constrained requests (grammar masks, logit_bias) sample here too (engine.cuda.token_masks): each slot's
bias record and its mask entry for the step sit beside its parameters, the masks in a pool of recent ones.
The pool (2 MB at the 248,320-token vocabulary) is part of the memory plan's fixed sampler scratch.

The per-slot `GpuSampler`/`GpuLogprobs` objects (prefill picks, speculative rounds) view their slot's state
and share row 0 of the scratch: every pass runs on the card's one stream, one after another, so no two are
ever in flight at once.
"""

from __future__ import annotations

from collections.abc import Mapping

from engine.cuda.driver import CudaCard, DeviceBuffer
from engine.cuda.logprobs import LOGPROB_DTYPE, GpuLogprobs, alloc_logprob_scratch, launch_logprobs, logprob_parts
from engine.cuda.sampling import PARAMS_DTYPE, GpuSampler, alloc_scratch, default_parts, launch_draw, launch_select
from engine.cuda.token_masks import BIAS_DTYPE, Constraints, MaskPool, pack_bias


class SlotSampling:
    """The sampling state of `slots` slots over a `vocab`-sized logits row, and scratch for `slots` rows.
    `mask_entry`: int32 [slots] on the card, each slot's mask pool entry for the step (the decoder's step
    buffer, uploaded with every step)."""

    def __init__(self, card: CudaCard, vocab: int, slots: int, mask_entry: DeviceBuffer, label: str = "sampling"):
        self.card, self.vocab = card, vocab
        parts = default_parts(card, vocab)
        self.params = card.alloc(PARAMS_DTYPE.itemsize * slots, f"{label}.params")
        self.counts = card.alloc(4 * vocab * slots, f"{label}.counts")
        self.counts.fill_zero()
        self.wanted = card.alloc(4 * slots, f"{label}.wanted")
        self.scratch = alloc_scratch(card, vocab, parts, slots, label)
        self.masks = MaskPool(card, vocab, label=f"{label}.masks")
        self.constraints = Constraints(mask_entry, self.masks.buffer, self.masks.words,
                                       card.alloc(BIAS_DTYPE.itemsize * slots, f"{label}.logit_bias"))
        self.constraints.bias.fill_zero()
        self.lp_scratch = alloc_logprob_scratch(card, logprob_parts(card, vocab), slots, f"{label}.logprobs")
        size = LOGPROB_DTYPE.itemsize
        self.records = card.alloc(size * slots, f"{label}.logprob_records")  # row r's record, read back at once
        self.samplers = [GpuSampler(card, vocab, f"{label}{i}", params=self.params.view(PARAMS_DTYPE.itemsize * i,
                                                                                         PARAMS_DTYPE.itemsize),
                                    counts=self.counts.view(4 * vocab * i, 4 * vocab), scratch=self.scratch.row(0),
                                    constraints=self.constraints.view(i))
                         for i in range(slots)]
        self.logprobs = [GpuLogprobs(card, vocab, self.records.view(0, size), f"{label}{i}.logprobs",
                                     wanted=self.wanted.view(4 * i, 4), scratch=self.lp_scratch.row(0))
                         for i in range(slots)]

    @property
    def tokens(self) -> DeviceBuffer:
        """The picks, int32 [rows] (row 0 is also every single-slot pass's)."""
        return self.scratch.token

    def set_bias(self, slot: int, bias: Mapping[int, float] | None) -> None:
        """The slot's logit_bias for its new request (None: none)."""
        self.constraints.view(slot).bias.upload(pack_bias(bias, self.vocab))

    def sample_rows(self, logits: DeviceBuffer, rows: int, row_slot: DeviceBuffer) -> None:
        """Each row's full sampling pass (penalties, filters, draw; greedy exits after the arg-max) from logits
        [rows][V] with its slot's parameters and counts; the picks → `tokens`, and each slot's counts."""
        s, v, p = self.scratch, self.vocab, self.scratch.parts
        launch_select(self.card, logits, self.params, self.counts, s.scores, s.partials, s.support, s.hist, s.token,
                      v, p, rows, row_slot, constraints=self.constraints)
        launch_draw(self.card, s.scores, self.params, s.support, self.counts, s.token, v, p, rows, row_slot)

    def logprob_rows(self, logits: DeviceBuffer, rows: int, row_slot: DeviceBuffer) -> None:
        """Each row's logprob record (after `sample_rows`: it reads the picks) → `records` [rows]; rows whose
        slot did not ask return at once."""
        launch_logprobs(self.card, logits, self.vocab, self.wanted, self.lp_scratch, self.tokens, self.records, rows,
                        row_slot)
