"""The MTP ("nextn") head on the card (spec §6.10, issue 13): one slot's head state, and the head's pass.

    e   = rmsnorm(embed[x_{t+1}], enorm);  hh = rmsnorm(h_t, hnorm)    # h_t: trunk hidden after output_norm
    z   = eh_proj · [e ; hh]  →  decoder block L (attention with its own KV cache)  →  rmsnorm(head_norm)
    logits = LM head (the trunk's)

Head row t pairs the trunk's normed hidden row h_t with the token after it, so a row can run only once
that token is known: each slot owes the head its last trunk rows (`MtpCache.owed`: K+1 of them after a
verify, one after a prefill, one more after each plain step, up to OWED_ROWS), and the next round's head
call runs them together with the row that drafts. The head's KV position of row t is t, the trunk row's
position (engine.reference.mtp).

The pass reuses the forward pass's scratch (`h`, `proj`, the Q8_1 buffers) and its block code
(`ForwardPass.run_block`), so it runs between trunk passes on the same stream, never during one.
Everything a graph must not bake (the head's position and row count) lives in the cache's `steps`.

A round's drafts take one pass per draft over all its slots (`draft_pass`: the head's weights and the ~1 GB LM head
read once for all of them, not once per slot). Each slot's owed rows are padded to a fixed count (K+1) there, so
that one captured graph serves every mix of owed-row counts: its step record counts the real rows; the padding rows
(the slot's token, stale or zero hidden rows) are computed past them and never read, their cache rows lie past the
head's position and are written again before any row attends to them; the last real row is picked on the card
(`copy_last_step_row`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.cuda.driver import CudaCard, DeviceBuffer
from engine.cuda.forward import ForwardPass, SequenceRows, matrix_rows
from engine.cuda.norm import norm_shape, rmsnorm_q8_1
from engine.cuda.gemv import MAX_GEMV_TOKENS, alloc_q8_activations
from engine.cuda.matmul import embed, matmul
from engine.cuda.kv_cache import KVLayerCache, alloc_kv_layer
from engine.cuda.weights import MtpWeights
from engine.model.kv_formats import KVFormat

F32 = 4
OWED_ROWS = MAX_GEMV_TOKENS  # trunk rows a slot's head may owe: a round's head call runs them all as GEMV rows


@dataclass
class HeadRows:
    """What the forward pass's attention reads of a sequence, for one head call: the head's cache (under
    its block index), the [pos, n] step buffer of that call, the capacity."""

    kv: dict[int, KVLayerCache]
    step: DeviceBuffer
    capacity: int


@dataclass(frozen=True)
class HeadCall:
    """One slot's part of a head pass over several slots (`MtpHead.draft_pass`): its cache view, its normed hidden
    rows and the device ids of the tokens after them."""

    rows: HeadRows
    hidden: DeviceBuffer
    ids: DeviceBuffer


class MtpCache:
    """One slot's head state: its KV cache, how many rows it holds (= its next position), the trunk rows
    it is owed (`owed` fp32 [owed_rows][D], normed) with the tokens after all but the last, and whether it
    is in step with the trunk (a trunk step the head did not see leaves it behind until the slot resets)."""

    def __init__(self, card: CudaCard, d_model: int, n_head_kv: int, head_dim: int, block: int, capacity: int,
                 kv: KVFormat, draft_tokens: int, label: str):
        if draft_tokens + 1 > OWED_ROWS:
            raise ValueError(f"a verify of {draft_tokens + 1} rows exceeds the {OWED_ROWS} rows a head may owe")
        self.block, self.capacity, self.draft_tokens = block, capacity, draft_tokens
        self.cache = alloc_kv_layer(card, kv, n_head_kv, head_dim, capacity, f"{label}.kv")
        self.steps = card.alloc(8 * draft_tokens, f"{label}.steps")  # [call][pos, n]: the draft call, then chained
        self.owed = card.alloc(F32 * OWED_ROWS * d_model, f"{label}.owed")
        self.owed.fill_zero()  # a draft's padding rows read rows past the owed ones: finite from the start
        self.reset()

    def reset(self) -> None:
        """An empty slot: nothing cached, nothing owed, in step."""
        self.position, self.owed_rows, self.owed_tokens, self.in_step = 0, 0, [], True

    def rows(self, call: int) -> HeadRows:
        """The sequence view of head call `call` of a round (0: the owed rows + draft row, i: chained draft i)."""
        return HeadRows({self.block: self.cache}, self.steps.view(8 * call, 8), self.capacity)

    def step_values(self, rows: int) -> np.ndarray:
        """Per-step values of a round ([call][pos, n] int32): call 0 runs `rows` rows at the head's position,
        chained call i one row after them."""
        pos = self.position
        values = [(pos, rows)] + [(pos + rows + i - 1, 1) for i in range(1, self.draft_tokens)]
        return np.asarray(values, np.int32).reshape(-1)

    def set_steps(self, rows: int) -> None:
        """Write `step_values(rows)` (synchronously)."""
        self.steps.upload(self.step_values(rows))

    def room(self, rows: int) -> bool:
        return self.position + rows + self.draft_tokens - 1 <= self.capacity


class MtpHead:
    """The head's pass on the card with the LM head (the whole model on one card, the last stage on several),
    with its input and output buffers. Each slot has its own owed rows' token ids; each place in a round of up to
    `slots` slots has its own K draft logits rows and output row, so that several slots' drafts are made together and
    verified together (a sampled slot's rule reads its draft rows after the verify)."""

    def __init__(self, fwd: ForwardPass, weights: MtpWeights, draft_tokens: int, slots: int = 1):
        if fwd.w.lm_head is None:
            raise ValueError("the MTP head runs on the card holding the LM head")
        card, cfg = fwd.card, fwd.cfg
        self.fwd, self.w, self.card, self.cfg = fwd, weights, card, cfg
        d = cfg.d_model
        self.max_rows, self.draft_tokens, self.slots = fwd.max_tokens, draft_tokens, slots
        # head input rows (normed trunk rows) and the tokens after them; prefill stages up to owed + chunk rows, a
        # round a slot's owed rows' tokens at `round_ids(slot)`
        self.rows_in = card.alloc(F32 * (fwd.max_tokens + OWED_ROWS) * d, "mtp.rows_in")
        self.ids = card.alloc(4 * max(fwd.max_tokens + OWED_ROWS, slots * OWED_ROWS), "mtp.ids")
        self.ids.fill_zero()  # a padding row may embed an id its slot never wrote: a valid one
        self.x2 = alloc_q8_activations(card, 2 * d, fwd.max_tokens, "mtp.x2")
        # [place] the last row's normed output (a chained draft's hidden input); the last real rows picked from `h`
        self.out = card.alloc(F32 * slots * d, "mtp.out")
        self.last = card.alloc(F32 * slots * d, "mtp.last")
        self.logits = card.alloc(F32 * slots * draft_tokens * cfg.vocab_size, "mtp.logits")  # [draft][place][V]

    def logits_row(self, row: int) -> DeviceBuffer:
        v = self.cfg.vocab_size
        return self.logits.view(F32 * row * v, F32 * v)

    def draft_row(self, place: int, draft: int) -> int:
        """The `logits` row of draft `draft` (0-based) of the slot at `place` in its round (0 for a slot alone): a
        draft's rows of all the places are consecutive, one LM-head GEMV's output."""
        return draft * self.slots + place

    def out_row(self, place: int) -> DeviceBuffer:
        """The normed output row of the slot at `place` in its round's last head call."""
        return matrix_rows(self.out, self.cfg.d_model, place, 1)

    def round_ids(self, slot: int, rows: int) -> DeviceBuffer:
        """Where a round's head call reads the tokens after the slot's `rows` owed rows."""
        return self.ids.view(4 * slot * OWED_ROWS, 4 * rows)

    def _norm_into(self, x: DeviceBuffer, weight: DeviceBuffer, n: int, half: int, first: int = 0) -> None:
        """RMSNorm of n rows of width D into half `half` (0: embedding, 1: hidden) of rows [first, first + n) of the
        [T][2D] Q8_1 input, in the trunk's norm shape (a row's bits are the same at any count up to MAX_GEMV_TOKENS)."""
        d = self.cfg.d_model
        q_at = first * 2 * d + half * d  # the first value's byte in xq; its block's scale is value q_at // 32 of xd
        d_at = F32 * (q_at // 32)
        xq = self.x2.xq.view(q_at, self.x2.xq.nbytes - q_at)
        xd = self.x2.xd.view(d_at, self.x2.xd.nbytes - d_at)
        grid, threads = norm_shape(n)
        rmsnorm_q8_1(self.card, x, d, weight, n, d, self.cfg.rms_eps, xq, xd, 2 * d, grid, threads)

    def forward(self, n: int, rows: HeadRows, hidden: DeviceBuffer, ids: DeviceBuffer) -> None:
        """n head rows nobody drafts from (prefill rows, a plain step's owed rows): normed trunk rows `hidden` [n][D]
        paired with the tokens `ids` [n] (device int32), cached at the call's step position."""
        if not 1 <= n <= self.max_rows:
            raise ValueError(f"a head call runs 1..{self.max_rows} rows, not {n}")
        self._pass([HeadCall(rows, hidden, ids)], n)

    def draft_pass(self, calls: Sequence[HeadCall], each: int, draft: int) -> None:
        """Draft `draft` (0-based) of each slot of a round in one pass: slot j's `each` rows (its step record counts
        its real rows, the first; the rest pad it to `each`) from its hidden rows and ids, cached at its step position;
        its last real row's normed output → `out_row(j)`, its logits → row `draft_row(j, draft)`. A slot's real rows
        come out as they would in a pass of their own: the GEMVs and the decode-shaped norms give a row the same bits
        at any count up to MAX_GEMV_TOKENS (but a K-quant GEMV's single row: gemv_kq.cu's pair variants), and
        attention launches on each slot's rows as its own pass would."""
        slots, n = len(calls), len(calls) * each
        if not 1 <= slots <= self.slots or n > MAX_GEMV_TOKENS:
            raise ValueError(f"a draft pass runs 1..{self.slots} slots of at most {MAX_GEMV_TOKENS} rows in all, not "
                             f"{slots} of {each}")
        self._pass(calls, each)
        fwd, d = self.fwd, self.cfg.d_model
        if each == 1:  # each slot's one row is its last
            self._logits(fwd.h, slots, self.draft_row(0, draft))
            return
        for j, call in enumerate(calls):
            copy_last_step_row(self.card, matrix_rows(fwd.h, d, j * each, each), d, each, call.rows.step,
                               matrix_rows(self.last, d, j, 1))
        self._logits(self.last, slots, self.draft_row(0, draft))

    def _pass(self, calls: Sequence[HeadCall], each: int) -> None:
        """The head's block over `each` rows of every call, one after another in `h` (weights read once for all)."""
        fwd, d, n = self.fwd, self.cfg.d_model, len(calls) * each
        for j, call in enumerate(calls):
            embed(self.card, self.w.embedding, call.ids, matrix_rows(fwd.h, d, j * each, each), each)
        self._norm_into(fwd.h, self.w.enorm, n, 0)
        for j, call in enumerate(calls):
            self._norm_into(call.hidden, self.w.hnorm, each, 1, first=j * each)
        fwd._matmul(self.w.eh_proj, self.x2, fwd.h, n)
        runs = tuple(SequenceRows(call.rows, j * each, each) for j, call in enumerate(calls))  # type: ignore[arg-type]
        fwd.run_block(self.w.index, self.w.block, n, runs)  # HeadRows quack like sequences

    def _logits(self, rows: DeviceBuffer, n: int, first: int) -> None:
        """The head's final norm of n rows of width D → `out` rows 0..n-1, their logits → `logits` rows first.."""
        fwd, v = self.fwd, self.cfg.vocab_size
        x = fwd.q8[self.cfg.d_model]
        fwd._norm(rows, self.w.head_norm, x, n, fwd.w.lm_head, y=self.out)
        matmul(self.card, fwd.w.lm_head, x, self.logits.view(F32 * first * v, F32 * n * v), n)

    def norm_trunk_rows(self, first: int, n: int) -> None:
        """The trunk's final norm of the n rows in the forward pass's `h` → `rows_in` rows [first, first + n)
        (fp32): a prefill chunk's or a plain step's rows for the head (those passes keep only the Q8_1 form)."""
        d = self.cfg.d_model
        self.fwd._norm(self.fwd.h, self.fwd.w.output_norm, self.fwd.q8[d], n, None,
                       y=self.rows_in.view(F32 * first * d, F32 * n * d))


def copy_last_step_row(card: CudaCard, rows: DeviceBuffer, width: int, count: int, step: DeviceBuffer,
                       out: DeviceBuffer) -> None:
    """out = row n - 1 of the [count][width] fp32 `rows`, n read from the [pos, n] record `step` on the card."""
    card.kernel("copy_last_step_row").launch(-(-width // 256), 256, rows, np.int32(width), np.int32(count), step, out)
