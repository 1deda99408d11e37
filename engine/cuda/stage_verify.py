"""One card's share of MTP speculative verifies (engine.cuda.speculative): each slot's GDN rings over the
card's layers, the rollback after a rejected draft, and, on a card of several, its part of a verify.

A verify runs the K+1 tokens [x_n, d_1, .., d_K] of one slot through the trunk, and each GDN layer keeps
its state after every token but the last in the slot's ring; after acceptance of j drafts, a layer whose
state ran past d_j copies ring slot j back (no re-run) and the sequence moves j+1 rows on. Over several
cards (engine.cuda.pipeline_speculation) each card runs its layers' part of the verify, from the token ids
(first card) or the previous card's hidden rows, and hands its hidden rows on; the card with the LM head
finishes it (`CudaSpeculator.decide`), and the accepted count comes back to every card's `commit`. Several
slots' verifies go through a card in one pass (`ForwardPass.run_verifies`), each slot's K+1 rows in slot order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from engine.cuda.forward import ForwardPass, SequenceRows
from engine.cuda.gdn import GdnRing, alloc_gdn_ring
from engine.cuda.gemv import MAX_GEMV_TOKENS
from engine.cuda.graph_runs import GraphRuns
from engine.cuda.sequence import DeviceSequence


class StageVerifier:
    """The verify rings of every slot on one card, and the card's part of a verify round."""

    def __init__(self, fwd: ForwardPass, seqs: Sequence[DeviceSequence], draft_tokens: int):
        self.fwd, self.card, self.seqs, self.k = fwd, fwd.card, seqs, draft_tokens
        self.rings: list[dict[int, GdnRing]] = [
            {i: alloc_gdn_ring(self.card, state, draft_tokens, f"slot{s}.ring{i}") for i, state in seq.gdn.items()}
            for s, seq in enumerate(seqs)
        ]
        self.graphs = GraphRuns(self.card, "speculation")  # the card's CudaSpeculator replays its pieces here too
        # [slot]: [pos, n], then the tokens (first card)
        self._host = self.card.pinned((len(seqs), 2 + draft_tokens + 1), np.int32)

    def verify_part(self, tokens: Mapping[int, Sequence[int]], hidden: np.ndarray | None, out: np.ndarray) -> np.ndarray:
        """This card's layers of the verifies of `tokens` (slot → x_n then its drafts), all slots in one pass, on a
        card without the LM head: from the token ids (first card) or the previous card's `hidden` rows (each slot's
        in slot order); its own hidden rows → `out` (pinned host rows), copied and fenced before the next card reads
        them. The sequences do not move until `commit`."""
        fwd, width, slots = self.fwd, self.k + 1, sorted(tokens)
        if fwd.heads or not slots or any(len(tokens[slot]) != width for slot in slots):
            raise ValueError(f"a verify part takes {width} tokens a slot on a card without the LM head")
        if len(slots) * width > MAX_GEMV_TOKENS:
            raise ValueError(f"{len(slots)} slots' verify rows exceed the {MAX_GEMV_TOKENS} of one pass")
        for j, slot in enumerate(slots):
            host, seq = self._host[slot], self.seqs[slot]
            host[:2] = seq.next_position, width
            seq.step.upload_async(host[:2])
            if fwd.embeds:
                host[2:] = tokens[slot]
                fwd.ids.view(4 * j * width, 4 * width).upload_async(host[2:])
        if not fwd.embeds:
            fwd.h.view(0, hidden.nbytes).upload_async(hidden)  # type: ignore[union-attr]
        if len(slots) == 1:
            slot = slots[0]
            self.graphs.run(("part", slot), lambda: fwd.run_verify(width, self.seqs[slot], self.rings[slot], None))
        else:
            runs = [SequenceRows(self.seqs[slot], j * width, width, self.rings[slot]) for j, slot in enumerate(slots)]
            self.graphs.run(("part", tuple(slots)), lambda: fwd.run_verifies(runs, [None] * len(runs)))
        rows = out[: len(slots) * width]
        fwd.h.download_async(rows)
        self.card.stream.synchronize()
        return rows

    def commit(self, slot: int, accepted: int) -> None:
        """Keep the slot's state after x_n, d_1..d_accepted: its GDN layers back to ring slot `accepted` when a
        draft was rejected (one graph of two copies per layer), its position `accepted` + 1 rows on."""
        if not 0 <= accepted <= self.k:
            raise ValueError(f"{accepted} accepted drafts of {self.k}")
        if accepted < self.k:
            self.graphs.run(("commit", slot, accepted), lambda: self._restore_states(slot, accepted))
        self.seqs[slot].next_position += accepted + 1

    def _restore_states(self, slot: int, row: int) -> None:
        """Every GDN layer of the slot on this card back to its state after verify row `row`."""
        seq = self.seqs[slot]
        for i, ring in self.rings[slot].items():
            ring.commit(seq.gdn[i], row)
