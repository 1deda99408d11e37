"""MTP speculative decoding for the slots of one card (issue 13; the reference's is engine.generation.speculative).

A round, for a slot whose trunk is fed token x_n and owes the head r rows (engine.cuda.mtp):

1. draft: one head call over the r owed rows (the last paired with x_n) drafts d_1; for K=2 a chained
   call on the head's own output and d_1 drafts d_2 (its cache row is dropped again after the round).
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
On a single card each round (head + verify + the rule) is one CUDA graph per (slot, kind, owed rows).
Over several cards (engine.cuda.pipeline_speculation) the speculator sits on the last card, which has the
LM head: `draft` runs the head and returns the K drafts, every card runs its layers of the verify
(engine.cuda.stage_verify), and `decide` finishes it and applies the rule; the accepted count goes back
to the other cards, whose rings roll their own layers back.

Only a step that feeds one slot alone speculates; a plain step (several slots batched, or a request that
does not speculate) keeps every in-step head fed: its normed rows become owed rows, and a head owing
OWED_ROWS rows runs them (`stepped`). A restored snapshot holds no head cache, so that slot leaves
speculation until it is reset.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from engine.cuda.driver import DeviceBuffer
from engine.cuda.forward import ForwardPass
from engine.cuda.gdn import GdnRing
from engine.cuda.mtp import OWED_ROWS, MtpCache, MtpHead
from engine.cuda.sampling import GpuSampler
from engine.cuda.sequence import DeviceSequence
from engine.cuda.speculative_sampling import GpuSpeculativeRule
from engine.cuda.stage_verify import StageVerifier
from engine.cuda.weights import MtpWeights
from engine.generation.slots import SlotRequest
from engine.generation.speculative import DRAFT_TOKENS, SpeculationStats

F32 = 4


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
        cfg = fwd.cfg
        self.head = MtpHead(fwd, weights, draft_tokens)
        self.caches = [MtpCache(self.card, cfg.d_model, cfg.n_head_kv, cfg.head_dim, weights.index, seq.capacity,
                                fwd.kv, draft_tokens, f"slot{s}.mtp") for s, seq in enumerate(seqs)]
        self.picks = self.card.alloc(4 * (2 * draft_tokens + 1), "mtp.picks")  # drafts d_1..d_K, then targets t_0..t_K
        self.rule = GpuSpeculativeRule(self.card, cfg.vocab_size, samplers[0].parts, draft_tokens)
        self._host_picks = self.card.pinned(2 * draft_tokens + 1, np.int32)
        # a round's per-step values, copied asynchronously: trunk [pos, n] | head [call][pos, n] | head ids | trunk id
        self._host_round = self.card.pinned(2 + 2 * draft_tokens + OWED_ROWS + 1, np.int32)
        # per slot, a plain step's head call: [pos, n] then its tokens, copied asynchronously (`stepped` queues its
        # work behind a launched step without waiting for it); a slot's row is rewritten only after that step ended
        self._host_owed = self.card.pinned((len(seqs), 2 + OWED_ROWS + 1), np.int32)
        self.stats = SpeculationStats()
        self._requests: dict[int, bool] = {}  # slot → greedy (the arg-max rounds) or sampled (the card's rule)
        self._drafted: tuple[int, int] | None = None  # (slot, owed rows) of a pipeline round between draft and decide
        self.graphs = verifier.graphs  # one bounded set of speculation graphs per card (engine.cuda.graph_runs)

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
                         head.ids.view(4 * offset, 4 * m), None)
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
                staged = self._host_owed[slot]
                staged[:2] = c.position, len(tokens)
                staged[2 : 2 + len(tokens)] = tokens
                head.ids.view(4 * len(order), 4 * len(tokens)).upload_async(staged[2 : 2 + len(tokens)])
                c.steps.view(0, 8).upload_async(staged[:2])
                head.forward(len(tokens), c.rows(0), c.owed, head.ids.view(4 * len(order), 4 * len(tokens)), None)
                c.position += len(tokens)
                c.owed_rows, c.owed_tokens = 0, []
            else:
                c.owed_tokens.append(feeds[slot])
            row = order.index(slot)
            c.owed.view(F32 * c.owed_rows * d, F32 * d).copy_from(head.rows_in.view(F32 * row * d, F32 * d))
            c.owed_rows += 1

    # ---- a round --------------------------------------------------------------------------------
    def _owed_rows(self, slot: int) -> int | None:
        """The head rows a round for this slot would run now; None when it does not speculate now (not asked,
        behind, nothing owed, or no room for the verify rows or the head's)."""
        c, seq = self.caches[slot], self.seqs[slot]
        if slot not in self._requests or not c.in_step or not c.owed_rows:
            return None
        if seq.next_position + self.k + 1 > seq.capacity or not c.room(c.owed_rows):
            return None
        return c.owed_rows

    def round(self, slot: int, token: int) -> list[int] | None:
        """Feed `token` and return the tokens it yields (accepted drafts + one), all but the last consumed by the
        slot's trunk; None when this slot does not speculate now (the caller takes a plain step). The whole
        model is on this card: the round is one graph."""
        r = self._owed_rows(slot)
        if r is None:
            return None
        greedy = self._requests[slot]
        self._upload_round(slot, r, token)
        self.graphs.run(("round", greedy, slot, r), lambda: self._round_work(slot, r, greedy))
        return self._finish(slot, r, greedy)

    def draft(self, slot: int, token: int) -> list[int] | None:
        """A round over several cards, part 1 (this card has the LM head, not the whole trunk): the head drafts
        the K tokens after `token`, returned (-1 for a draft the request's filters left no token for); None when
        the slot does not speculate now. The cards then verify [token, drafts] and `decide` ends the round."""
        r = self._owed_rows(slot)
        if r is None:
            return None
        greedy = self._requests[slot]
        self._upload_round(slot, r, token)
        self.graphs.run(("draft", greedy, slot, r), lambda: self._draft_work(slot, r, greedy))
        drafts = self.picks.view(0, 4 * self.k) if greedy else self.rule.drafts
        drafts.download_async(self._host_picks[: self.k])
        self.card.stream.synchronize()
        self._drafted = (slot, r)
        return [int(d) for d in self._host_picks[: self.k]]

    def decide(self, hidden: np.ndarray) -> list[int]:
        """A round over several cards, part 2: the drafted slot's verify through this card's layers from the
        previous card's `hidden` rows, the targets and the acceptance rule; the emitted tokens (accepted drafts
        + one). This card's state is committed; the other cards commit the accepted count (len - 1)."""
        if self._drafted is None:
            raise RuntimeError("decide follows a draft")
        (slot, r), self._drafted = self._drafted, None
        greedy = self._requests[slot]
        self.fwd.h.view(0, hidden.nbytes).upload_async(hidden)
        self.graphs.run(("decide", greedy, slot), lambda: self._decide_work(slot, greedy))
        return self._finish(slot, r, greedy)

    def _finish(self, slot: int, r: int, greedy: bool) -> list[int]:
        """Read the round's outcome (waits for it), commit this card's state and count it."""
        if greedy:
            self.picks.download_async(self._host_picks)
            self.card.stream.synchronize()
            drafts = [int(t) for t in self._host_picks[: self.k]]
            emitted = greedy_accept(drafts, self._host_picks[self.k :])
        else:
            drafts, emitted = self.rule.read()
        accepted = len(emitted) - 1
        self.verifier.commit(slot, accepted)
        c = self.caches[slot]
        c.position += r
        c.owed_rows, c.owed_tokens = accepted + 1, drafts[:accepted]
        self.stats.add(self.k, accepted, len(emitted))
        return emitted

    def _upload_round(self, slot: int, r: int, token: int) -> None:
        """Stream-ordered copies of the round's per-step values from pinned memory (the round ends in a
        synchronize, so the host array is free again before the next round writes it)."""
        vals, c, k = self._host_round, self.caches[slot], self.k
        vals[0:2] = (self.seqs[slot].next_position, k + 1)
        vals[2 : 2 + 2 * k] = c.step_values(r)
        ids = vals[2 + 2 * k : 2 + 2 * k + r + 1]
        ids[:r] = c.owed_tokens + [token]
        ids[r] = token
        self.seqs[slot].step.upload_async(vals[0:2])
        c.steps.upload_async(vals[2 : 2 + 2 * k])
        self.head.ids.view(0, 4 * r).upload_async(ids[:r])
        self.fwd.ids.view(0, 4).upload_async(ids[r:])

    def _pick(self, i: int) -> DeviceBuffer:
        return self.picks.view(4 * i, 4)

    def _round_work(self, slot: int, r: int, greedy: bool) -> None:
        """The device work of a round on the card with the whole model (captured as one graph): the drafts, fed
        to the verify on the card, the verify, the targets and the rule."""
        self._draft_work(slot, r, greedy)
        # a failed sampled draft (-1) embeds as NaN past its row: no accepted token reads it
        self.fwd.ids.view(4, 4 * self.k).copy_from(self.picks.view(0, 4 * self.k) if greedy else self.rule.drafts)
        self._decide_work(slot, greedy)

    def _draft_work(self, slot: int, r: int, greedy: bool) -> None:
        """The head's call over the r owed rows and its chained calls: greedy drafts are arg-maxes into `picks`,
        sampled ones are drawn from the head's rows by the rule (into `rule.drafts`)."""
        c, head, sampler, k, rule = self.caches[slot], self.head, self.samplers[slot], self.k, self.rule
        head.forward(r, c.rows(0), c.owed, head.ids, 0)
        for i in range(k):
            if i:
                head.forward(1, c.rows(i), head.out, self._pick(i - 1) if greedy else rule.draft_id(i - 1), i)
            if greedy:
                sampler.argmax(head.logits_row(i), token=self._pick(i))
            else:
                rule.draft(sampler, i, head.logits_row(i))

    def _decide_work(self, slot: int, greedy: bool) -> None:
        """The verify through this card's layers (the head is owed its rows) and the targets: arg-maxes into
        `picks` after the drafts, or the rule over the head's rows and the verify's."""
        c, sampler, k = self.caches[slot], self.samplers[slot], self.k
        self.fwd.run_verify(k + 1, self.seqs[slot], self.rings[slot], c.owed)
        targets = [self.fwd.logits_row(t) for t in range(k + 1)]
        if greedy:
            for t, row in enumerate(targets):
                sampler.argmax(row, token=self._pick(k + t))
        else:
            self.rule.decide(sampler, [self.head.logits_row(i) for i in range(k)], targets)
