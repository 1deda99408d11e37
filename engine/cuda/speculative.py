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

Acceptance, two ways:
- plain-greedy requests (temperature 0, no penalties) decide on the card: drafts and targets are arg-maxes
  written side by side, and one download of 2K+1 ids gives the host "accept while the draft equals the
  target" (`greedy_accept`, the exact rule for point masses). Each round (head + verify + arg-maxes) is one
  CUDA graph per (slot, owed rows).
- every other request brings the K draft rows and K+1 target rows of logits to the host and applies
  engine.generation.speculative_rule with the host `Sampler`: the exact min(1, p/q) rule with residual
  resampling needs p(d), q(d) and max(p - q, 0) under the request's whole filter chain (penalties, top-k,
  top-p, min-p), which the GPU sampler only ever forms implicitly; the host rule is the tested one and
  the simplest correct choice. Its cost is (2K+1) x V fp32 per round, about 3 MB at K=1 for the real
  vocabulary (~1 ms on the H200's PCIe, ~12 ms on the CMP's Gen1 x1), plus the host's distribution,
  7-56 ms per row for 248K tokens on the 2-core dev machine (the sort behind top-p): far more than a
  decode step. So it is opt-in (`speculate_sampled`); by default only plain-greedy requests speculate,
  until the rule moves to the card.

Only a step that feeds one slot alone speculates; a plain step (several slots batched, or a request that
does not speculate) keeps every in-step head fed: its normed rows become owed rows, and a head owing
OWED_ROWS rows runs them (`stepped`). A restored snapshot holds no head cache, so that slot leaves
speculation until it is reset.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from engine.cuda.driver import DeviceBuffer
from engine.cuda.forward import ForwardPass
from engine.cuda.gdn import GdnRing, alloc_gdn_ring
from engine.cuda.mtp import OWED_ROWS, MtpCache, MtpHead
from engine.cuda.sampling import GpuSampler
from engine.cuda.sequence import DeviceSequence
from engine.cuda.weights import MtpWeights
from engine.generation.sampler import Sampler
from engine.generation.slots import SlotRequest
from engine.generation.speculative import DRAFT_TOKENS, SpeculationStats, speculation_rng
from engine.generation.speculative_rule import dense_distribution, sample_dense, speculative_sampling

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


@dataclass
class _Request:
    """A speculating request on one slot: greedy on the card, or the host rule with its sampler and draws."""

    greedy: bool
    history: list[int]  # what the penalties see; ends with the token fed at the current round
    sampler: Sampler | None = None
    rng: np.random.Generator | None = None


class CudaSpeculator:
    """The MTP head, its per-slot state and the verify rounds for the slots of one `SlotDecoder`."""

    def __init__(self, fwd: ForwardPass, seqs: Sequence[DeviceSequence], samplers: Sequence[GpuSampler],
                 weights: MtpWeights, draft_tokens: int = 1, speculate_sampled: bool = False):
        """`speculate_sampled`: also speculate requests that need the host rule (all but plain greedy)."""
        if draft_tokens not in DRAFT_TOKENS:
            raise ValueError(f"draft_tokens must be one of {DRAFT_TOKENS}, got {draft_tokens}")
        if not samplers:
            raise ValueError("speculation needs the card with the LM head and the samplers")
        self.fwd, self.card, self.seqs, self.samplers, self.k = fwd, fwd.card, seqs, samplers, draft_tokens
        self.speculate_sampled = speculate_sampled
        cfg = fwd.cfg
        self.head = MtpHead(fwd, weights, draft_tokens)
        self.caches = [MtpCache(self.card, cfg.d_model, cfg.n_head_kv, cfg.head_dim, weights.index, seq.capacity,
                                fwd.kv, draft_tokens, f"slot{s}.mtp") for s, seq in enumerate(seqs)]
        self.rings: list[dict[int, GdnRing]] = [
            {i: alloc_gdn_ring(self.card, state, draft_tokens, f"slot{s}.ring{i}") for i, state in seq.gdn.items()}
            for s, seq in enumerate(seqs)
        ]
        self.picks = self.card.alloc(4 * (2 * draft_tokens + 1), "mtp.picks")  # drafts d_1..d_K, then targets t_0..t_K
        self._host_picks = self.card.pinned(2 * draft_tokens + 1, np.int32)
        # a round's per-step values, copied asynchronously: trunk [pos, n] | head [call][pos, n] | head ids | trunk id
        self._host_round = self.card.pinned(2 + 2 * draft_tokens + OWED_ROWS + 1, np.int32)
        self.stats = SpeculationStats()
        self._requests: dict[int, _Request] = {}
        self._graphs: dict[tuple[object, ...], object] = {}
        self._seen: set[tuple[object, ...]] = set()

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
        if not request.speculative or request.host_logits or not self.caches[slot].in_step:
            return
        params = request.params
        if params.plain_greedy:
            self._requests[slot] = _Request(True, list(request.history))
        elif self.speculate_sampled:
            self._requests[slot] = _Request(False, list(request.history), Sampler(params), speculation_rng(params.seed))

    def speculating(self, slot: int) -> bool:
        return slot in self._requests

    def prefilled(self, slot: int, ids: np.ndarray) -> None:
        """After the trunk's pass over a prefill chunk `ids` (its rows still in the forward pass's `h`): run every
        head row that is now complete (the owed rows and the chunk's rows but its last, which becomes owed)."""
        c, head = self.caches[slot], self.head
        if not c.in_step:
            return
        n, r, d = len(ids), c.owed_rows, self.fwd.cfg.d_model
        if r:
            head.rows_in.copy_from(c.owed, F32 * r * d)
        head.norm_trunk_rows(r, n)
        tokens = c.owed_tokens + [int(t) for t in ids] if r else [int(t) for t in ids[1:]]
        total = len(tokens)  # = r + n - 1 rows, each paired with its following token
        if total:
            head.ids.view(0, 4 * total).upload(np.asarray(tokens, np.int32))
        for start in range(0, total, head.max_rows):
            m = min(head.max_rows, total - start)
            c.steps.view(0, 8).upload(np.asarray([c.position, m], np.int32))
            head.forward(m, c.rows(0), head.rows_in.view(F32 * start * d, F32 * m * d), head.ids.view(4 * start, 4 * m),
                         None)
            c.position += m
        c.owed.copy_from(head.rows_in.view(F32 * total * d, F32 * d))
        c.owed_rows, c.owed_tokens = 1, []

    def stepped(self, feeds: Mapping[int, int]) -> None:
        """After a plain step over `feeds` (hidden row b of the forward pass's `h` continues the b-th slot in
        order): every in-step head is owed that row, and the fed token completes its previous owed rows."""
        for slot, token in feeds.items():  # the penalties of the host rule see plainly fed tokens too
            if slot in self._requests:
                self._requests[slot].history.append(token)
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
                head.ids.view(4 * len(order), 4 * len(tokens)).upload(np.asarray(tokens, np.int32))
                c.steps.view(0, 8).upload(np.asarray([c.position, len(tokens)], np.int32))
                head.forward(len(tokens), c.rows(0), c.owed, head.ids.view(4 * len(order), 4 * len(tokens)), None)
                c.position += len(tokens)
                c.owed_rows, c.owed_tokens = 0, []
            else:
                c.owed_tokens.append(feeds[slot])
            row = order.index(slot)
            c.owed.view(F32 * c.owed_rows * d, F32 * d).copy_from(head.rows_in.view(F32 * row * d, F32 * d))
            c.owed_rows += 1

    # ---- a round --------------------------------------------------------------------------------
    def round(self, slot: int, token: int) -> list[int] | None:
        """Feed `token` and return the tokens it yields (accepted drafts + one), all but the last consumed by the
        slot's trunk; None when this slot does not speculate now (the caller takes a plain step)."""
        req, c, seq = self._requests.get(slot), self.caches[slot], self.seqs[slot]
        width = self.k + 1
        if req is None or not c.in_step or not c.owed_rows:
            return None
        if seq.next_position + width > seq.capacity or not c.room(c.owed_rows):
            return None
        r = c.owed_rows
        req.history.append(token)
        self._upload_round(slot, r, token)
        if req.greedy:
            self._run(("greedy", slot, r), lambda: self._greedy_work(slot, r))
            self.picks.download_async(self._host_picks)
            self.card.stream.synchronize()
            drafts = [int(t) for t in self._host_picks[: self.k]]
            emitted = greedy_accept(drafts, self._host_picks[self.k :])
        else:
            drafts, emitted = self._sampled(slot, r, token, req)
        accepted = len(emitted) - 1
        self._commit(slot, r, accepted, drafts)
        req.history += drafts[:accepted]
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

    def _commit(self, slot: int, r: int, accepted: int, drafts: list[int]) -> None:
        """Keep the trunk's state after x_n, d_1..d_accepted; the head keeps its r true rows and is owed the
        verify's rows 0..accepted (already in its `owed` buffer)."""
        seq, c = self.seqs[slot], self.caches[slot]
        if accepted < self.k:  # two copies per GDN layer: one graph launch instead of dozens of Python calls
            self._run(("commit", slot, accepted), lambda: self._restore_states(slot, accepted))
        seq.next_position += accepted + 1
        c.position += r
        c.owed_rows, c.owed_tokens = accepted + 1, drafts[:accepted]

    def _restore_states(self, slot: int, row: int) -> None:
        """Every GDN layer of the slot back to its state after verify row `row`."""
        seq = self.seqs[slot]
        for i, ring in self.rings[slot].items():
            ring.commit(seq.gdn[i], row)

    def _pick(self, i: int) -> DeviceBuffer:
        return self.picks.view(4 * i, 4)

    def _greedy_work(self, slot: int, r: int) -> None:
        """The device work of a greedy round (captured as one graph): drafts, verify, arg-maxes into `picks`."""
        c, head, sampler, k = self.caches[slot], self.head, self.samplers[slot], self.k
        head.forward(r, c.rows(0), c.owed, head.ids, 0)
        sampler.argmax(head.logits_row(0), token=self._pick(0))
        for i in range(1, k):
            head.forward(1, c.rows(i), head.out, self._pick(i - 1), i)
            sampler.argmax(head.logits_row(i), token=self._pick(i))
        self.fwd.ids.view(4, 4 * k).copy_from(self.picks.view(0, 4 * k))
        self.fwd.run_verify(k + 1, self.seqs[slot], self.rings[slot], c.owed)
        for t in range(k + 1):
            sampler.argmax(self.fwd.logits_row(t), token=self._pick(k + t))

    def _sampled(self, slot: int, r: int, token: int, req: _Request) -> tuple[list[int], list[int]]:
        """A round under the host rule: (drafts, emitted). Non-finite rows shorten the round (a failed draft row
        ends the drafts; a failed target row ends what can be verified; a failed row 0 emits -1)."""
        assert req.sampler is not None and req.rng is not None
        c, head, k, v = self.caches[slot], self.head, self.k, self.fwd.cfg.vocab_size
        drafts: list[int] = []
        probs: list[np.ndarray] = []
        self._run(("draft", slot, r), lambda: head.forward(r, c.rows(0), c.owed, head.ids, 0))
        for i in range(k):
            if i:
                self._pick(i - 1).upload(np.asarray([drafts[-1]], np.int32))
                self._run(("chain", slot, i), lambda i=i: head.forward(1, c.rows(i), head.out, self._pick(i - 1), i))
            logits = head.logits_row(i).download(np.float32, v)
            if not np.isfinite(logits).all():
                break
            q = dense_distribution(req.sampler, logits, req.history + drafts)
            drafts.append(sample_dense(q, req.rng))
            probs.append(q)
        fed = [token] + drafts + [token] * (k - len(drafts))  # rows past the drafts are never accepted
        self.fwd.ids.view(0, 4 * (k + 1)).upload(np.asarray(fed, np.int32))
        self._run(("verify", slot), lambda: self.fwd.run_verify(k + 1, self.seqs[slot], self.rings[slot], c.owed))
        rows = self.fwd.logits.download(np.float32, (k + 1, v))
        finite = 0
        while finite <= len(drafts) and np.isfinite(rows[finite]).all():
            finite += 1
        if finite == 0:
            return drafts, [-1]
        m = finite - 1  # drafts that can be verified
        targets = [dense_distribution(req.sampler, rows[i], req.history + drafts[:i]) for i in range(m + 1)]
        emitted = speculative_sampling(targets, drafts[:m], probs[:m], req.rng)
        self.picks.view(0, 4 * len(emitted)).upload(np.asarray(emitted, np.int32))
        self.samplers[slot].count_tokens(self.picks, len(emitted))  # the card's sampler sees the picks too
        return drafts, emitted

    def _run(self, key: tuple[object, ...], work: Callable[[], None]) -> None:
        """Run `work` eagerly the first time (that loads its kernels), capture it the second, replay it after."""
        graph = self._graphs.get(key)
        if graph is None:
            if key not in self._seen:
                self._seen.add(key)
                work()
                return
            with self.card.capture(f"mtp {key}") as graph:
                work()
            self._graphs[key] = graph
        self.card.replay(graph)  # type: ignore[arg-type]
