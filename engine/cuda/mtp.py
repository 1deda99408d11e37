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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.cuda.driver import CudaCard, DeviceBuffer
from engine.cuda.forward import ForwardPass
from engine.cuda.norm import NORM_THREADS_BATCH, NORM_THREADS_DECODE, rmsnorm_q8_1
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
    with its input and output buffers. Each of the `slots` slots has its own K draft logits rows and its own owed
    rows' token ids, so that several slots' drafts can be made one after another and verified together (a sampled
    slot's rule reads its draft rows after the verify)."""

    def __init__(self, fwd: ForwardPass, weights: MtpWeights, draft_tokens: int, slots: int = 1):
        if fwd.w.lm_head is None:
            raise ValueError("the MTP head runs on the card holding the LM head")
        card, cfg = fwd.card, fwd.cfg
        self.fwd, self.w, self.card, self.cfg = fwd, weights, card, cfg
        d = cfg.d_model
        self.max_rows, self.draft_tokens = fwd.max_tokens, draft_tokens
        # head input rows (normed trunk rows) and the tokens after them; prefill stages up to owed + chunk rows, a
        # round a slot's owed rows' tokens at `round_ids(slot)`
        self.rows_in = card.alloc(F32 * (fwd.max_tokens + OWED_ROWS) * d, "mtp.rows_in")
        self.ids = card.alloc(4 * max(fwd.max_tokens + OWED_ROWS, slots * OWED_ROWS), "mtp.ids")
        self.x2 = alloc_q8_activations(card, 2 * d, fwd.max_tokens, "mtp.x2")
        self.out = card.alloc(F32 * d, "mtp.out")  # the last row's normed output: a chained draft's hidden input
        self.logits = card.alloc(F32 * slots * draft_tokens * cfg.vocab_size, "mtp.logits")  # [slot][draft][V]

    def logits_row(self, row: int) -> DeviceBuffer:
        v = self.cfg.vocab_size
        return self.logits.view(F32 * row * v, F32 * v)

    def draft_row(self, slot: int, draft: int) -> int:
        """The `logits` row of the slot's draft `draft` (0-based)."""
        return slot * self.draft_tokens + draft

    def round_ids(self, slot: int, rows: int) -> DeviceBuffer:
        """Where a round's head call reads the tokens after the slot's `rows` owed rows."""
        return self.ids.view(4 * slot * OWED_ROWS, 4 * rows)

    def _norm_into(self, x: DeviceBuffer, weight: DeviceBuffer, n: int, half: int) -> None:
        """RMSNorm of n rows of width D into half `half` (0: embedding, 1: hidden) of the [n][2D] Q8_1 input."""
        d = self.cfg.d_model
        xq = self.x2.xq.view(half * d, self.x2.xq.nbytes - half * d)
        xd = self.x2.xd.view(F32 * half * (d // 32), self.x2.xd.nbytes - F32 * half * (d // 32))
        threads = NORM_THREADS_DECODE if n == 1 else NORM_THREADS_BATCH
        rmsnorm_q8_1(self.card, x, d, weight, n, d, self.cfg.rms_eps, xq, xd, 2 * d, (n, 1), threads)

    def forward(self, n: int, rows: HeadRows, hidden: DeviceBuffer, ids: DeviceBuffer, logits_row: int | None) -> None:
        """n head rows: normed trunk rows `hidden` [n][D] paired with the tokens `ids` [n] (device int32), cached
        at the call's step position. With `logits_row`, the last row's normed output → `out` and its logits →
        that row of `logits`; without (prefill rows nobody drafts from), the head only fills its cache."""
        if not 1 <= n <= self.max_rows:
            raise ValueError(f"a head call runs 1..{self.max_rows} rows, not {n}")
        fwd, d = self.fwd, self.cfg.d_model
        embed(self.card, self.w.embedding, ids, fwd.h, n)
        self._norm_into(fwd.h, self.w.enorm, n, 0)
        self._norm_into(hidden, self.w.hnorm, n, 1)
        fwd._matmul(self.w.eh_proj, self.x2, fwd.h, n)
        fwd.run_block(self.w.index, self.w.block, n, rows)  # type: ignore[arg-type]  # HeadRows quacks like a sequence
        if logits_row is None:
            return
        x = fwd.q8[d]
        fwd._norm(fwd.h.view(F32 * (n - 1) * d, F32 * d), self.w.head_norm, x, 1, fwd.w.lm_head, y=self.out)
        matmul(self.card, fwd.w.lm_head, x, self.logits_row(logits_row), 1)

    def norm_trunk_rows(self, first: int, n: int) -> None:
        """The trunk's final norm of the n rows in the forward pass's `h` → `rows_in` rows [first, first + n)
        (fp32): a prefill chunk's or a plain step's rows for the head (those passes keep only the Q8_1 form)."""
        d = self.cfg.d_model
        self.fwd._norm(self.fwd.h, self.fwd.w.output_norm, self.fwd.q8[d], n, None,
                       y=self.rows_in.view(F32 * first * d, F32 * n * d))
