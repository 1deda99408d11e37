"""MTP speculative decoding for the slots of one card (issue 13; the reference's is engine.generation.speculative).

A round, for a slot whose trunk is fed token x_n and owes the head r rows (engine.cuda.mtp):

1. draft: one head call over the r owed rows (the last paired with x_n) drafts d_1; for K=2 a chained
   call on the head's own output and d_1 drafts d_2 (its cache row is dropped again after the round). The
   first call pads the owed rows to K+1 (`MtpHead.draft_pass`: the real count is data, so one graph serves
   every r); a slot owing more (after plain steps) first runs the rest through its head, drafting nothing.
2. verify: one trunk pass over [x_n, d_1, .., d_K] (`ForwardPass.run_verify`: the GEMV path, weights read
   once for the K+1 rows) gives target logits rows 0..K, the normed hidden rows the head will be owed,
   and each GDN layer's state after every row (the slot's `GdnRing`s).
3. accept j drafts and emit j+1 tokens.
4. roll back: on j < K each GDN layer copies ring slot j back (no re-run), the trunk's position moves to
   just after x_n, d_1..d_j (KV rows past it are overwritten later), and rows 0..j are owed to the head.

Acceptance, on the card either way (only token ids cross PCIe):
- plain-greedy requests (temperature 0, no penalties): drafts and targets are arg-maxes written side by
  side, and one download of 2K+1 ids gives the host "accept while the draft equals the target"
  (`greedy_accept`, the exact rule for point masses).
- sampled requests (temperature > 0): the drafts are drawn from the head's rows and the exact min(1, p/q)
  rule with residual resampling runs on the card (`GpuSpeculativeRule`, cuda_src/speculative_sampling.cu)
  under the request's whole filter chain (penalties, top-k, top-p, min-p).
Greedy requests with penalties decode plainly: the GPU sampler turns them into an arg-max of the penalised
scores, a point mass the rule's kernels do not take.
On a single card a round for one slot (head + verify + the rule) is one CUDA graph per (slot, mode).
A step that feeds several slots which all speculate now, at most SLOTS_TOGETHER of them (2 by default, below) and
with K+1 verify rows each fitting one GEMV (at most MAX_GEMV_TOKENS rows in all: 4 slots at K=1, 2 at K=2), is one
round for all of them (`rounds`): the heads draft
together, one head pass per draft over every slot's rows, then one verify pass runs every slot's rows
(`ForwardPass.run_verifies`) and each slot's own rule, greedy or sampled, over its own rows. The weights and the
LM head are read once per head call and once for the verify, whatever the slot count; a set of slots and modes has
one draft graph and one verify graph; each slot's rows come out bit for bit as in a round of its own (Q8_0
weights; see `MtpHead.draft_pass`).
Over several cards (engine.cuda.pipeline_speculation) the speculator sits on the last card, which has the
LM head: `draft` runs the head and returns the K drafts, every card runs its layers of the verify
(engine.cuda.stage_verify), and `decide` finishes it and applies the rule; the accepted count goes back
to the other cards, whose rings roll their own layers back.

A step whose slots cannot all take a round now (one does not speculate, or is masked, or their rows exceed one
GEMV) is plain, for all of them; a plain step keeps every in-step head fed: its normed rows become owed rows, and a head owing
OWED_ROWS rows runs them (`stepped`). A restored snapshot holds no head cache, so that slot leaves
speculation until it is reset.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np

from engine.cuda.driver import DeviceBuffer
from engine.cuda.forward import ForwardPass, SequenceRows
from engine.cuda.gdn import GdnRing
from engine.cuda.gemv import MAX_GEMV_TOKENS
from engine.cuda.mtp import OWED_ROWS, HeadCall, MtpCache, MtpHead
from engine.cuda.sampling import GpuSampler
from engine.cuda.sequence import DeviceSequence
from engine.cuda.speculative_sampling import GpuSpeculativeRule
from engine.cuda.stage_verify import StageVerifier
from engine.cuda.weights import MtpWeights
from engine.generation.slots import SlotRequest
from engine.generation.speculative import DRAFT_TOKENS, SpeculationStats

F32 = 4

SLOTS_TOGETHER = 2
"""The most slots one shared round takes unless `CudaSpeculator.slots_together` says otherwise (the GPU tests and
`rigllm bench --mtp` take every count that fits one GEMV). More slots step plainly, as a batch. Measured on the H200
(2026-12-05, 9B Q8_0 at depth 512, two runs: `tests/gpu/results/2026-12-05-h200-s28{,b}-mtp-9b.json`): a round of
2 / 3 / 4 slots at K=1 costs 1.32-1.36x / 1.60-1.64x / 1.73x a plain step over the same slots (one slot alone: 1.24x),
so it gains only where a draft is accepted more often than 32-36% / 60-64% / 73% (2 slots at K=2: 1.57-1.61x,
41-43%). A real head's acceptance is about 80% (qengine's v2 head), where 3 and 4 slots would gain at most 12% and
4%, and below 60% they lose: each slot's verify still launches its own GDN and attention kernels, which a plain
batch runs once for all its rows."""


def greedy_accept(drafts: Sequence[int], targets: Sequence[int]) -> list[int]:
    """Arg-max verification: the drafts up to the first that differs from the target's arg-max (a failed
    draft, -1, never matches), then the target's token there (K+1 targets for K drafts)."""
    if len(targets) != len(drafts) + 1:
        raise ValueError("need K+1 target tokens for K drafts")
    j = 0
    while j < len(drafts) and drafts[j] >= 0 and drafts[j] == targets[j]:
        j += 1
    return [int(t) for t in drafts[:j]] + [int(targets[j])]


class CudaSpeculator:
    """The MTP head, its per-slot state and the verify rounds for the slots of one `SlotDecoder` (on the card
    with the LM head); `verifier` is that card's share of the verifies (its rings and rollback)."""

    def __init__(self, fwd: ForwardPass, seqs: Sequence[DeviceSequence], samplers: Sequence[GpuSampler],
                 weights: MtpWeights, verifier: StageVerifier):
        draft_tokens = verifier.k
        if draft_tokens not in DRAFT_TOKENS:
            raise ValueError(f"draft_tokens must be one of {DRAFT_TOKENS}, got {draft_tokens}")
        if not samplers:
            raise ValueError("speculation needs the card with the LM head and the samplers")
        self.fwd, self.card, self.seqs, self.samplers, self.k = fwd, fwd.card, seqs, samplers, draft_tokens
        self.verifier = verifier
        cfg, slots = fwd.cfg, len(seqs)
        self.head = MtpHead(fwd, weights, draft_tokens, slots)
        self.caches = [MtpCache(self.card, cfg.d_model, cfg.n_head_kv, cfg.head_dim, weights.index, seq.capacity,
                                fwd.kv, draft_tokens, f"slot{s}.mtp") for s, seq in enumerate(seqs)]
        width = 2 * draft_tokens + 1
        self.picks = self.card.alloc(4 * slots * width, "mtp.picks")  # [slot]: drafts d_1..d_K, then targets t_0..t_K
        sink = self.card.alloc(4 * cfg.vocab_size, "mtp.rule.draft_counts")  # the sampled drafts' draws; never read
        self.rules = [GpuSpeculativeRule(self.card, cfg.vocab_size, samplers[0].parts, draft_tokens, f"slot{s}.mtp.rule",
                                         sink) for s in range(slots)]
        self._host_picks = self.card.pinned((slots, width), np.int32)
        # [slot] a round's per-step values, copied asynchronously: trunk [pos, n] | head [call][pos, n] | head ids |
        # trunk id
        self._host_round = self.card.pinned((slots, 2 + 2 * draft_tokens + OWED_ROWS + 1), np.int32)
        # per slot, a plain step's head call: [pos, n] then its tokens, copied asynchronously (`stepped` queues its
        # work behind a launched step without waiting for it); a slot's row is rewritten only after that step ended
        self._host_owed = self.card.pinned((len(seqs), 2 + OWED_ROWS + 1), np.int32)
        self.stats = SpeculationStats()
        self._requests: dict[int, bool] = {}  # slot → greedy (the arg-max rounds) or sampled (the card's rule)
        self._drafted: dict[int, int] | None = None  # slot → owed rows of pipeline rounds between draft and decide
        self.graphs = verifier.graphs  # one bounded set of speculation graphs per card (engine.cuda.graph_runs)
        self.slots_together = SLOTS_TOGETHER  # the most slots one round takes

    @property
    def rings(self) -> list[dict[int, GdnRing]]:
        """Each slot's GDN rings on this card (the verifier's)."""
        return self.verifier.rings

    # ---- slot life ------------------------------------------------------------------------------
    def reset(self, slot: int) -> None:
        self.caches[slot].reset()
        self._requests.pop(slot, None)

    def leave_behind(self, slot: int) -> None:
        """The trunk jumped without the head (a restored snapshot): stop until the slot resets."""
        self.caches[slot].in_step = False
        self._requests.pop(slot, None)

    def begin(self, slot: int, request: SlotRequest) -> None:
        """Speculate for this request when it allows it and the slot's head is in step."""
        self._requests.pop(slot, None)
        params = request.params
        if (not request.speculative or request.host_logits or request.logprobs is not None or request.constrained
                or not self.caches[slot].in_step):
            return
        if params.greedy and not params.plain_greedy:
            return  # greedy with penalties: the card's rule takes distributions, not a penalised arg-max
        self._requests[slot] = params.plain_greedy

    def speculating(self, slot: int) -> bool:
        return slot in self._requests

    def together(self, slots: Collection[int]) -> bool:
        """May these slots take one round together: no more than `slots_together`, each one's request speculates,
        and their K+1 verify rows each fit one GEMV? (A slot may still find no room for its round now: `rounds` then
        runs none.)"""
        return 0 < len(slots) <= self.slots_together and len(slots) * (self.k + 1) <= MAX_GEMV_TOKENS and all(
            slot in self._requests for slot in slots)

    def prefilled(self, runs: Sequence[tuple[int, np.ndarray]]) -> None:
        """After the trunk's pass over prefill chunks (one sequence's, or several one after another: run j's `ids`
        continue slot `runs[j][0]`, their rows still in the forward pass's `h`): for each slot whose head is in step,
        run every head row that is now complete (the owed rows and its chunk's rows but the last, which becomes
        owed). All the rows are normed first, into `rows_in` past room for the owed rows: the head's own passes
        use `h`."""
        if not any(self.caches[slot].in_step for slot, _ in runs):
            return
        self.head.norm_trunk_rows(OWED_ROWS, sum(len(ids) for _, ids in runs))
        first = OWED_ROWS
        for slot, ids in runs:
            if self.caches[slot].in_step:
                self._run_prefilled_rows(self.caches[slot], ids, first)
            first += len(ids)

    def _run_prefilled_rows(self, c: MtpCache, ids: np.ndarray, at: int) -> None:
        """`prefilled` for one slot whose chunk's normed rows start at `rows_in` row `at`: its owed rows go just
        before them (over rows of an earlier run, whose head calls are already queued)."""
        head, d = self.head, self.fwd.cfg.d_model
        n, r = len(ids), c.owed_rows
        start = at - r
        if r:
            head.rows_in.view(F32 * start * d, F32 * r * d).copy_from(c.owed, F32 * r * d)
        tokens = c.owed_tokens + [int(t) for t in ids] if r else [int(t) for t in ids[1:]]
        total = len(tokens)  # = r + n - 1 rows, each paired with its following token
        if total:
            head.ids.view(0, 4 * total).upload(np.asarray(tokens, np.int32))
        for offset in range(0, total, head.max_rows):
            m = min(head.max_rows, total - offset)
            c.steps.view(0, 8).upload(np.asarray([c.position, m], np.int32))
            head.forward(m, c.rows(0), head.rows_in.view(F32 * (start + offset) * d, F32 * m * d),
                         head.ids.view(4 * offset, 4 * m))
            c.position += m
        c.owed.copy_from(head.rows_in.view(F32 * (start + total) * d, F32 * d))
        c.owed_rows, c.owed_tokens = 1, []

    def stepped(self, feeds: Mapping[int, int]) -> None:
        """After a plain step over `feeds` (hidden row b of the forward pass's `h` continues the b-th slot in
        order): every in-step head is owed that row, and the fed token completes its previous owed rows."""
        order = sorted(feeds)
        kept = [slot for slot in order if self.caches[slot].in_step and self.caches[slot].owed_rows]
        if not kept:
            return
        head, d = self.head, self.fwd.cfg.d_model
        head.norm_trunk_rows(0, len(order))
        for slot in kept:
            c = self.caches[slot]
            if c.owed_rows == OWED_ROWS:  # full: run them all (the fed token follows the last), before the copy
                tokens = c.owed_tokens + [feeds[slot]]
                self._run_owed(slot, tokens, head.ids.view(4 * len(order), 4 * len(tokens)))
                c.owed_rows, c.owed_tokens = 0, []
            else:
                c.owed_tokens.append(feeds[slot])
            row = order.index(slot)
            c.owed.view(F32 * c.owed_rows * d, F32 * d).copy_from(head.rows_in.view(F32 * row * d, F32 * d))
            c.owed_rows += 1

    def _run_owed(self, slot: int, tokens: list[int], ids: DeviceBuffer) -> None:
        """The slot's first len(tokens) owed rows through its head, drafting nothing, each paired with the token after
        it: stream-ordered copies of the head's position and row count and of the tokens (into `ids`), staged in the
        slot's pinned row, then the head's call; the head's position moves past them."""
        c, staged, n = self.caches[slot], self._host_owed[slot], len(tokens)
        staged[:2] = c.position, n
        staged[2 : 2 + n] = tokens
        ids.upload_async(staged[2 : 2 + n])
        c.steps.view(0, 8).upload_async(staged[:2])
        self.head.forward(n, c.rows(0), c.owed, ids)
        c.position += n

    # ---- a round --------------------------------------------------------------------------------
    def _owed_rows(self, slot: int) -> int | None:
        """The head rows a round for this slot would run now; None when it does not speculate now (not asked,
        behind, nothing owed, or no room for the verify rows or the head's, padded to K+1)."""
        c, seq = self.caches[slot], self.seqs[slot]
        if slot not in self._requests or not c.in_step or not c.owed_rows:
            return None
        if seq.next_position + self.k + 1 > seq.capacity or not c.room(max(c.owed_rows, self.k + 1)):
            return None
        return c.owed_rows

    def rounds(self, feeds: Mapping[int, int]) -> dict[int, list[int]] | None:
        """Feed each slot its token and return, per slot, the tokens its round yields (accepted drafts + one), all but
        the last consumed by the slot's trunk; None, with nothing run, when any of them does not speculate now or
        `together` refuses them (the caller takes a plain step). The whole model is on this card: one
        slot's round is one graph; several slots' are their draft graph, then one graph of the shared verify and
        every slot's rule."""
        owed = self._start_rounds(feeds)
        if owed is None:
            return None
        slots = sorted(owed)
        modes = tuple(self._requests[slot] for slot in slots)
        if len(slots) == 1:
            slot, greedy = slots[0], modes[0]
            self.graphs.run(("round", greedy, slot), lambda: self._round_work(slot, greedy))
        else:
            self._draft_slots(slots, modes)
            self.graphs.run(("verify", tuple(slots), modes), lambda: self._verify_work(slots, modes))
        return self._finish(owed)

    def draft(self, feeds: Mapping[int, int]) -> dict[int, list[int]] | None:
        """Rounds over several cards, part 1 (this card has the LM head, not the whole trunk): each slot's head drafts
        the K tokens after its token, returned per slot (-1 for a draft the request's filters left no token for);
        None, with nothing run, where `rounds` would be. The cards then verify each slot's [token, drafts], all
        slots in one pass, and `decide` ends the rounds."""
        owed = self._start_rounds(feeds)
        if owed is None:
            return None
        slots = sorted(owed)
        self._draft_slots(slots, tuple(self._requests[slot] for slot in slots))
        for slot in slots:
            self._drafts(slot, self._requests[slot]).download_async(self._host_picks[slot, : self.k])
        self.card.stream.synchronize()
        self._drafted = owed
        return {slot: [int(d) for d in self._host_picks[slot, : self.k]] for slot in owed}

    def decide(self, hidden: np.ndarray) -> dict[int, list[int]]:
        """Rounds over several cards, part 2: the drafted slots' verify through this card's layers from the previous
        card's `hidden` rows (each slot's K+1 rows in slot order), the targets and the acceptance rule; per slot the
        emitted tokens (accepted drafts + one). This card's state is committed; the other cards commit the accepted
        counts (len - 1)."""
        if self._drafted is None:
            raise RuntimeError("decide follows a draft")
        owed, self._drafted = self._drafted, None
        slots = sorted(owed)
        modes = tuple(self._requests[slot] for slot in slots)
        self.fwd.h.view(0, hidden.nbytes).upload_async(hidden)
        if len(slots) == 1:
            self.graphs.run(("decide", modes[0], slots[0]), lambda: self._decide_work(slots[0], modes[0]))
        else:
            self.graphs.run(("verify", tuple(slots), modes), lambda: self._verify_work(slots, modes))
        return self._finish(owed)

    def _start_rounds(self, feeds: Mapping[int, int]) -> dict[int, int] | None:
        """Each fed slot's owed rows, with its round's values uploaded (its token to verify rows of its place in slot
        order); None, with nothing run or uploaded, when a slot does not speculate now or `together` refuses the
        slots. A round's draft owes at most K+1 rows per slot (`_catch_up`), padded to K+1."""
        if not self.together(feeds):
            return None
        slots = sorted(feeds)
        owed: dict[int, int] = {}
        for slot in slots:
            r = self._owed_rows(slot)
            if r is None:
                return None
            owed[slot] = r
        for row, slot in enumerate(slots):
            if owed[slot] > self.k + 1:
                owed[slot] = self._catch_up(slot)
            self._upload_round(slot, owed[slot], feeds[slot], row)
        return owed

    def _catch_up(self, slot: int) -> int:
        """Run all but the last K+1 of the slot's owed rows through its head now, drafting nothing (as `stepped` runs a
        full set), and move those K+1 to the front of its owed rows: a round's draft pads each slot's rows to K+1.
        Rare: only a slot that owes rows from plain steps gets here. Returns the rows it owes now."""
        c, head, d, keep = self.caches[slot], self.head, self.fwd.cfg.d_model, self.k + 1
        m = c.owed_rows - keep  # the rows run now; their tokens are all owed tokens (the fed one follows the last row)
        self.card.stream.synchronize()  # the slot's staging row may still feed a queued copy of a plain step's
        self._run_owed(slot, c.owed_tokens[:m], head.round_ids(slot, m))
        kept = head.rows_in.view(0, F32 * keep * d)  # free between passes: prefill and plain steps stage rows there
        kept.copy_from(c.owed.view(F32 * m * d, F32 * keep * d))
        c.owed.copy_from(kept)
        c.owed_rows, c.owed_tokens = keep, c.owed_tokens[m:]
        return keep

    def _finish(self, owed: Mapping[int, int]) -> dict[int, list[int]]:
        """Read the outcome of the round of each slot in `owed` (→ its owed rows; waits for them all), commit this
        card's state and count them."""
        greedy = {slot: self._requests[slot] for slot in owed}
        if any(greedy.values()):
            self.picks.download_async(self._host_picks)
        for slot in owed:
            if not greedy[slot]:
                self.rules[slot].queue_read()
        self.card.stream.synchronize()
        emitted_by_slot = {}
        for slot, r in owed.items():
            if greedy[slot]:
                picks = self._host_picks[slot]
                drafts = [int(t) for t in picks[: self.k]]
                emitted = greedy_accept(drafts, picks[self.k :])
            else:
                drafts, emitted = self.rules[slot].result()
            accepted = len(emitted) - 1
            self.verifier.commit(slot, accepted)
            c = self.caches[slot]
            c.position += r
            c.owed_rows, c.owed_tokens = accepted + 1, drafts[:accepted]
            self.stats.add(self.k, accepted, len(emitted))
            emitted_by_slot[slot] = emitted
        return emitted_by_slot

    def _upload_round(self, slot: int, r: int, token: int, row: int) -> None:
        """Stream-ordered copies of the slot's per-step values for a round from pinned memory (the round ends in a
        synchronize, so the host array is free again before the next round writes it): its r owed rows' tokens,
        padded to K+1 rows with its token (rows the draft runs and never reads); its token also goes to trunk row
        `row` * (K+1), the first of its verify rows."""
        vals, c, k = self._host_round[slot], self.caches[slot], self.k
        vals[0:2] = (self.seqs[slot].next_position, k + 1)
        vals[2 : 2 + 2 * k] = c.step_values(r)
        ids = vals[2 + 2 * k :]
        ids[:r] = c.owed_tokens + [token]
        ids[r:] = token
        self.seqs[slot].step.upload_async(vals[0:2])
        c.steps.upload_async(vals[2 : 2 + 2 * k])
        rows = max(r, k + 1)
        self.head.round_ids(slot, rows).upload_async(ids[:rows])
        self.fwd.ids.view(4 * row * (k + 1), 4).upload_async(ids[r : r + 1])

    def picks_of(self, slot: int) -> DeviceBuffer:
        """The slot's greedy round's ids on the card: drafts d_1..d_K, then targets t_0..t_K."""
        width = 2 * self.k + 1
        return self.picks.view(4 * slot * width, 4 * width)

    def _pick(self, slot: int, i: int) -> DeviceBuffer:
        return self.picks_of(slot).view(4 * i, 4)

    def _drafts(self, slot: int, greedy: bool) -> DeviceBuffer:
        """Where the slot's round left its K drafts: the arg-maxes of a greedy round, the rule's draws of a sampled one."""
        return self.picks_of(slot).view(0, 4 * self.k) if greedy else self.rules[slot].drafts

    def _draft_slots(self, slots: Sequence[int], modes: Sequence[bool]) -> None:
        """The drafts of a round's slots, from their draft graph (per set of slots and modes: the owed rows are data)."""
        self.graphs.run(("drafts", tuple(slots), tuple(modes)), lambda: self._drafts_work(slots, modes))

    def _round_work(self, slot: int, greedy: bool) -> None:
        """The device work of a lone slot's round on the card with the whole model (captured as one graph): the
        drafts, fed to the verify on the card, the verify, the targets and the rule."""
        self._drafts_work([slot], [greedy])
        # a failed sampled draft (-1) embeds as NaN past its row: no accepted token reads it
        self.fwd.ids.view(4, 4 * self.k).copy_from(self._drafts(slot, greedy))
        self._decide_work(slot, greedy)

    def _drafts_work(self, slots: Sequence[int], modes: Sequence[bool]) -> None:
        """A round's drafts (captured as one graph per set of slots and modes): one head pass per draft, each slot's
        owed rows padded to K+1 in the first (its step record counts the real ones), one row each after, chained on
        its own output and previous draft; greedy drafts are arg-maxes into the slot's `picks`, sampled ones drawn
        from its head rows by its rule."""
        head, width = self.head, self.k + 1
        for i in range(self.k):
            if i == 0:
                calls = [HeadCall(self.caches[slot].rows(0), self.caches[slot].owed, head.round_ids(slot, width))
                         for slot in slots]
            else:
                calls = [HeadCall(self.caches[slot].rows(i), head.out_row(j),
                                  self._drafts(slot, modes[j]).view(4 * (i - 1), 4)) for j, slot in enumerate(slots)]
            head.draft_pass(calls, width if i == 0 else 1, i)
            for j, slot in enumerate(slots):
                self._pick_draft(slot, modes[j], j, i)

    def _pick_draft(self, slot: int, greedy: bool, place: int, i: int) -> None:
        """The slot's draft i from its head logits row (the slot at `place` in its round): the arg-max into its
        `picks`, or a draw by its rule."""
        row = self.head.logits_row(self.head.draft_row(place, i))
        if greedy:
            self.samplers[slot].argmax(row, token=self._pick(slot, i))
        else:
            self.rules[slot].draft(self.samplers[slot], i, row)

    def _decide_work(self, slot: int, greedy: bool) -> None:
        """The slot's verify through this card's layers (the head is owed its rows), then its targets."""
        c, k = self.caches[slot], self.k
        self.fwd.run_verify(k + 1, self.seqs[slot], self.rings[slot], c.owed)
        self._targets(slot, greedy, 0)

    def _verify_work(self, slots: Sequence[int], modes: Sequence[bool]) -> None:
        """Several slots' verifies in one pass through this card's layers (captured as one graph per set of slots and
        modes): with the whole model here, each slot's drafts after its token in its K+1 trunk rows first (a later
        card of several starts from the hidden rows in `h`); the pass; each slot's targets."""
        width, runs = self.k + 1, []
        for j, slot in enumerate(slots):
            if self.fwd.embeds:  # a failed sampled draft (-1) embeds as NaN past its row: no accepted token reads it
                self.fwd.ids.view(4 * (j * width + 1), 4 * self.k).copy_from(self._drafts(slot, modes[j]))
            runs.append(SequenceRows(self.seqs[slot], j * width, width, self.rings[slot]))
        self.fwd.run_verifies(runs, [self.caches[slot].owed for slot in slots])
        for j, slot in enumerate(slots):
            self._targets(slot, modes[j], j)

    def _targets(self, slot: int, greedy: bool, place: int) -> None:
        """The targets of the slot at `place` in its round from its verify's logits rows (K+1 from row place * (K+1)):
        arg-maxes into its `picks` after the drafts, or its rule over its draft rows and those."""
        k, sampler, head = self.k, self.samplers[slot], self.head
        targets = [self.fwd.logits_row(place * (k + 1) + t) for t in range(k + 1)]
        if greedy:
            for t, row in enumerate(targets):
                sampler.argmax(row, token=self._pick(slot, k + t))
        else:
            self.rules[slot].decide(sampler, [head.logits_row(head.draft_row(place, i)) for i in range(k)], targets)
