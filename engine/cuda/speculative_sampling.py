"""The speculative-sampling rule on the card (cuda_src/speculative_sampling.cu; the truth is
engine.generation.speculative_rule): a sampled request's drafts are drawn, tested against the verify's
target rows and replaced or extended without any logits crossing PCIe.

Each draft row and target row runs the request's own sampler selection (`GpuSampler.select`: penalties
over its history, top-k, temperature, top-p, min-p) into its own `Support`, so p(d), q(d) and
max(p - q, 0) are those of the exact distributions plain sampling would draw from. Penalties see the
drafts before a row: the sampler's counts get d_1..d_i added for row i and taken back after it (a
draft's own draw counts into a scratch buffer, since it may be rejected); the round's emitted tokens
are counted at its end. The launch sequence is static, so a round is captured as one CUDA graph and
the host reads back 2K+1 token ids and the round's count.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.cuda.driver import CudaCard, CudaError, DeviceBuffer
from engine.cuda.sampling import (
    PARTIAL_BYTES,
    SAMPLE_THREADS,
    GpuSampler,
    Support,
    alloc_support,
)

ROW_DIST_BYTES = 16  # struct RowDist: total u64, tie_cut i32, ok i32
ROUND_INTS = 4  # struct SpecRound: state, row, n_emitted, reserved


class GpuSpeculativeRule:
    """The buffers and launches of one slot's sampled speculative rounds with K drafts (the request's parameters,
    counter and counts are the slot sampler's). `sink`, where draft draws count and nothing reads, may be shared
    by the slots of a card (their rounds run on the card's stream)."""

    def __init__(self, card: CudaCard, vocab: int, parts: int, k: int, label: str = "mtp.rule",
                 sink: DeviceBuffer | None = None):
        self.card, self.vocab, self.parts, self.k = card, vocab, parts, k
        self.draft_rows = [alloc_support(card, parts, f"{label}.draft{i}") for i in range(k)]
        self.target_rows = [alloc_support(card, parts, f"{label}.target{t}") for t in range(k + 1)]
        self.dists = card.alloc(ROW_DIST_BYTES * (2 * k + 1), f"{label}.dists")  # drafts, then targets
        self.residual = card.alloc(PARTIAL_BYTES * parts, f"{label}.residual")
        self.sink = card.alloc(4 * vocab, f"{label}.draft_counts") if sink is None else sink  # never read
        self.failed = card.alloc(4 * (k + 1), f"{label}.failed")  # where a failed target row's -1 goes
        # drafts d_1..d_K | emitted [K+1] (-1 past the round's count) | SpecRound
        self.out = card.alloc(4 * (k + k + 1 + ROUND_INTS), f"{label}.out")
        self._host = card.pinned(k + k + 1 + ROUND_INTS, np.int32)

    # ---- views ------------------------------------------------------------------------------------
    def draft_id(self, i: int) -> DeviceBuffer:
        return self.out.view(4 * i, 4)

    @property
    def drafts(self) -> DeviceBuffer:
        return self.out.view(0, 4 * self.k)

    @property
    def emitted(self) -> DeviceBuffer:
        return self.out.view(4 * self.k, 4 * (self.k + 1))

    @property
    def round_state(self) -> DeviceBuffer:
        return self.out.view(4 * (2 * self.k + 1), 4 * ROUND_INTS)

    def _dist(self, row: int) -> DeviceBuffer:
        return self.dists.view(ROW_DIST_BYTES * row, ROW_DIST_BYTES)

    # ---- launches ---------------------------------------------------------------------------------
    def draft(self, sampler: GpuSampler, i: int, logits: DeviceBuffer) -> None:
        """Draw draft i from the head's logits row (penalised in place) under the request's parameters, with
        the penalties of the history plus d_1..d_i."""
        self._with_drafts(sampler, i, lambda: self._draw_draft(sampler, i, logits))

    def decide(self, sampler: GpuSampler, drafts: Sequence[DeviceBuffer], targets: Sequence[DeviceBuffer]) -> None:
        """The rule over the K rows `draft` drew from (as it left them) and the verify's K+1 target logits rows
        (penalised in place here): the emitted tokens into `emitted`, their count into the round state, the
        tokens into the sampler's counts."""
        if len(drafts) != self.k or len(targets) != self.k + 1:
            raise ValueError(f"{self.k} drafts need {self.k} draft rows and {self.k + 1} target rows, "
                             f"not {len(drafts)} and {len(targets)}")
        k, kern = self.k, self.card.kernel
        kern("spec_round_begin").launch(1, 32, self.round_state, self.emitted, np.int32(k))
        for t, logits in enumerate(targets):
            self._with_drafts(sampler, t, lambda t=t, logits=logits: self._select_target(sampler, t, logits))
        v = np.int32(self.vocab)
        for i in range(k):
            p, q = self._target_args(targets, i), self._draft_args(drafts, i)
            kern("spec_accept").launch(1, 32, *p, *q, self.drafts, sampler.params, self.round_state, self.emitted,
                                       np.int32(i), np.int32(k))
            kern("spec_residual_partial").launch(self.parts, SAMPLE_THREADS, *p, *q, v, self.round_state, np.int32(i),
                                                 self.residual)
            self._final(sampler, i, drafts, targets)
        self._final(sampler, k, drafts, targets)
        sampler.count_tokens(self.emitted, k + 1)  # -1 padding is skipped

    def read(self) -> tuple[list[int], list[int]]:
        """(drafts, emitted) of the last round, after the work queued before (waits for it)."""
        self.queue_read()
        self.card.stream.synchronize()
        return self.result()

    def queue_read(self) -> None:
        """Queue the copy of the last round's outcome (`result` reads it once the stream is synchronized)."""
        self.out.download_async(self._host)

    def result(self) -> tuple[list[int], list[int]]:
        """(drafts, emitted) of the round whose outcome `queue_read` copied, after a synchronize."""
        k = self.k
        n = int(self._host[2 * k + 1 + 2])
        if not 1 <= n <= k + 1:
            raise CudaError(f"a speculative round reported {n} tokens (1..{k + 1} expected): its kernels did not run")
        return [int(d) for d in self._host[:k]], [int(t) for t in self._host[k : k + n]]

    # ---- parts ------------------------------------------------------------------------------------
    def _with_drafts(self, sampler: GpuSampler, n: int, work) -> None:
        """`work` with d_1..d_n counted in the sampler's history (the penalties of row n)."""
        if n:
            sampler.count_tokens(self.drafts, n)
        work()
        if n:
            sampler.count_tokens(self.drafts, n, delta=-1)

    def _draw_draft(self, sampler: GpuSampler, i: int, logits: DeviceBuffer) -> None:
        row = self.draft_rows[i]
        sampler.select(logits, logits, row, self.draft_id(i))  # a failed row writes -1 there
        sampler.draw(logits, row, self.sink, self.draft_id(i))
        self._row_dist(logits, row, i)

    def _select_target(self, sampler: GpuSampler, t: int, logits: DeviceBuffer) -> None:
        sampler.select(logits, logits, self.target_rows[t], self.failed.view(4 * t, 4))
        self._row_dist(logits, self.target_rows[t], self.k + t)

    def _row_dist(self, scores: DeviceBuffer, row: Support, index: int) -> None:
        self.card.kernel("spec_row_dist").launch(1, SAMPLE_THREADS, scores, np.int32(self.vocab), row.state,
                                                 row.draw_partials, np.int32(self.parts), self._dist(index))

    def _draft_args(self, drafts: Sequence[DeviceBuffer], i: int) -> tuple[DeviceBuffer, DeviceBuffer, DeviceBuffer]:
        """(scores, state, dist) of draft row i; its dist is record i."""
        return drafts[i], self.draft_rows[i].state, self._dist(i)

    def _target_args(self, targets: Sequence[DeviceBuffer], t: int) -> tuple[DeviceBuffer, DeviceBuffer, DeviceBuffer]:
        """(scores, state, dist) of target row t; its dist is record K + t."""
        return targets[t], self.target_rows[t].state, self._dist(self.k + t)

    def _final(self, sampler: GpuSampler, i: int, drafts: Sequence[DeviceBuffer],
               targets: Sequence[DeviceBuffer]) -> None:
        """The last token at row i (exits unless the round ends there). Row K has no draft: a round reaching it
        always ends from p_K, so its residual arguments name draft K-1's row and are never read."""
        p = self._target_args(targets, i)
        q = self._draft_args(drafts, min(i, self.k - 1))
        self.card.kernel("spec_final").launch(
            1, SAMPLE_THREADS, *p, self.target_rows[i].draw_partials, *q, self.residual, np.int32(self.vocab),
            np.int32(self.parts), sampler.params, self.round_state, self.emitted, np.int32(i),
        )
